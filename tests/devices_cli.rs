//! `perfkit devices` through the built binary. On a machine without the NVIDIA driver it must
//! say so and exit 0; on one with the driver it lists the GPUs (checked against NVML directly).

use assert_cmd::Command;
use perfkit_sampler::NvmlUnavailable;

fn nvml_present() -> bool {
    match perfkit_sampler::devices::query() {
        Ok(_) => true,
        Err(NvmlUnavailable::NoDriver { .. }) => false,
        Err(e) => panic!("NVML present but failing: {e}"),
    }
}

#[test]
fn devices_text() {
    let out = Command::cargo_bin("perfkit")
        .unwrap()
        .arg("devices")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    if nvml_present() {
        assert!(stdout.starts_with("driver "), "{stdout}");
        assert!(stdout.contains("CUDA_VISIBLE_DEVICES="), "{stdout}");
    } else {
        assert!(
            stdout.starts_with("no NVIDIA GPU available: no NVIDIA driver found"),
            "{stdout}"
        );
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
    }
}

#[test]
fn devices_json() {
    let out = Command::cargo_bin("perfkit")
        .unwrap()
        .args(["devices", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], 1);
    let gpus = v["gpus"].as_array().unwrap();
    if nvml_present() {
        assert_eq!(v["available"], true);
        assert!(v["reason"].is_null());
        if !gpus.is_empty() {
            assert_eq!(v["cuda_device_order"], "PCI_BUS_ID");
            let order = v["cuda_visible_devices"].as_str().unwrap();
            assert_eq!(order.split(',').count(), gpus.len());
            for g in gpus {
                let total = g["memory_total"].as_u64().unwrap();
                assert!(g["memory_free"].as_u64().unwrap() <= total);
            }
        }
    } else {
        assert_eq!(v["available"], false);
        assert!(
            v["reason"]
                .as_str()
                .unwrap()
                .contains("no NVIDIA driver found (libnvidia-ml.so.1"),
            "{v}"
        );
        assert!(gpus.is_empty());
        assert!(v["cuda_visible_devices"].is_null());
    }
}
