//! The GPUs of this machine, as NVML reports them.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use crate::NvmlUnavailable;

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub name: String,
    /// UUID (`GPU-...`), usable in `CUDA_VISIBLE_DEVICES` regardless of ordering.
    pub uuid: Option<String>,
    /// PCI bus id (`00000000:3B:00.0`).
    pub pci_bus_id: Option<String>,
    /// Total device memory, bytes.
    pub memory_total: u64,
    /// Used device memory, bytes.
    pub memory_used: u64,
    /// Free device memory, bytes.
    pub memory_free: u64,
    /// Percent of the last sample period a kernel was running.
    pub gpu_util_pct: Option<u32>,
    /// Percent of the last sample period device memory was read or written.
    pub mem_util_pct: Option<u32>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Power draw, milliwatts.
    pub power_mw: Option<u32>,
    /// Compute capability (major, minor).
    pub compute_capability: Option<(i32, i32)>,
}

/// All GPUs and the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// NVIDIA driver version (`550.54.15`).
    pub driver_version: Option<String>,
    /// Highest CUDA version the driver supports (`12.4`).
    pub cuda_version: Option<String>,
    /// The GPUs, by NVML index.
    pub gpus: Vec<GpuInfo>,
    /// Problems reading individual GPUs (the others are still listed).
    pub errors: Vec<String>,
}

/// Reads every GPU through NVML.
pub fn query() -> Result<DeviceReport, NvmlUnavailable> {
    use nvml_wrapper::enum_wrappers::device::Clock;
    let nvml = crate::init_nvml()?;
    let count = nvml
        .device_count()
        .map_err(|e| NvmlUnavailable::Nvml(e.to_string()))?;
    let mut gpus = Vec::new();
    let mut errors = Vec::new();
    for index in 0..count {
        let d = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                errors.push(format!("GPU {index}: {e}"));
                continue;
            }
        };
        let mem = match d.memory_info() {
            Ok(m) => m,
            Err(e) => {
                errors.push(format!("GPU {index}: memory: {e}"));
                continue;
            }
        };
        let util = d.utilization_rates().ok();
        gpus.push(GpuInfo {
            index,
            name: d.name().unwrap_or_else(|_| "unknown".into()),
            uuid: d.uuid().ok(),
            pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
            memory_total: mem.total,
            memory_used: mem.used,
            memory_free: mem.free,
            gpu_util_pct: util.as_ref().map(|u| u.gpu),
            mem_util_pct: util.as_ref().map(|u| u.memory),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            power_mw: d.power_usage().ok(),
            compute_capability: d.cuda_compute_capability().ok().map(|c| (c.major, c.minor)),
        });
    }
    Ok(DeviceReport {
        driver_version: nvml.sys_driver_version().ok(),
        cuda_version: nvml
            .sys_cuda_driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        gpus,
        errors,
    })
}

/// Suggested `CUDA_VISIBLE_DEVICES` order: most free memory first (ties: lower index first).
/// The values are CUDA device indices under `CUDA_DEVICE_ORDER=PCI_BUS_ID`, i.e. each GPU's rank
/// by PCI bus id (NVML's own index when bus ids are unknown).
pub fn visible_devices_order(gpus: &[GpuInfo]) -> Vec<u32> {
    let cuda_index = |g: &GpuInfo| -> u32 {
        if gpus.iter().all(|x| x.pci_bus_id.is_some()) {
            let mut ids: Vec<_> = gpus
                .iter()
                .map(|x| {
                    x.pci_bus_id
                        .clone()
                        .unwrap_or_default()
                        .to_ascii_lowercase()
                })
                .collect();
            ids.sort();
            let me = g
                .pci_bus_id
                .clone()
                .unwrap_or_default()
                .to_ascii_lowercase();
            ids.iter().position(|x| *x == me).unwrap_or(0) as u32
        } else {
            g.index
        }
    };
    let mut order: Vec<&GpuInfo> = gpus.iter().collect();
    order.sort_by(|a, b| {
        b.memory_free
            .cmp(&a.memory_free)
            .then(cuda_index(a).cmp(&cuda_index(b)))
    });
    order.into_iter().map(cuda_index).collect()
}

/// The `CUDA_VISIBLE_DEVICES` suggestion as a shell assignment.
pub fn visible_devices_line(gpus: &[GpuInfo]) -> String {
    let order = visible_devices_order(gpus)
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    format!("CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={order}")
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v}{unit}"))
}

/// The terminal table of `perfkit devices`.
pub fn write_text(r: &DeviceReport, w: &mut impl Write) -> io::Result<()> {
    writeln!(
        w,
        "driver {}, CUDA {}",
        r.driver_version.as_deref().unwrap_or("unknown"),
        r.cuda_version.as_deref().unwrap_or("unknown")
    )?;
    if r.gpus.is_empty() {
        writeln!(w, "no GPU found by NVML")?;
    } else {
        writeln!(
            w,
            "{:>3}  {:<28} {:>10} {:>10} {:>10} {:>5} {:>5} {:>9} {:>8}",
            "#", "name", "total", "used", "free", "gpu%", "mem%", "SM clock", "power"
        )?;
        for g in &r.gpus {
            writeln!(
                w,
                "{:>3}  {:<28} {:>10} {:>10} {:>10} {:>5} {:>5} {:>9} {:>8}",
                g.index,
                g.name,
                gib(g.memory_total),
                gib(g.memory_used),
                gib(g.memory_free),
                opt(g.gpu_util_pct, "%"),
                opt(g.mem_util_pct, "%"),
                opt(g.sm_clock_mhz, " MHz"),
                opt(g.power_mw.map(|p| p / 1000), " W"),
            )?;
        }
        writeln!(w)?;
        writeln!(
            w,
            "most free memory first: {}",
            visible_devices_line(&r.gpus)
        )?;
    }
    for e in &r.errors {
        writeln!(w, "warning: {e}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, bus: Option<&str>, free_gib: u64) -> GpuInfo {
        GpuInfo {
            index,
            name: format!("GPU model {index}"),
            uuid: Some(format!("GPU-{index:08x}")),
            pci_bus_id: bus.map(str::to_string),
            memory_total: 80 << 30,
            memory_used: (80 - free_gib) << 30,
            memory_free: free_gib << 30,
            gpu_util_pct: Some(index * 10),
            mem_util_pct: None,
            sm_clock_mhz: Some(1980),
            power_mw: Some(350_000),
            compute_capability: Some((9, 0)),
        }
    }

    #[test]
    fn most_free_memory_first_ties_by_index() {
        let gpus = [
            gpu(0, None, 10),
            gpu(1, None, 70),
            gpu(2, None, 10),
            gpu(3, None, 40),
        ];
        assert_eq!(visible_devices_order(&gpus), vec![1, 3, 0, 2]);
        assert_eq!(
            visible_devices_line(&gpus),
            "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1,3,0,2"
        );
    }

    #[test]
    fn indices_follow_pci_bus_order() {
        // NVML index 0 sits on the higher bus: under PCI_BUS_ID ordering it is CUDA device 1.
        let gpus = [
            gpu(0, Some("00000000:B1:00.0"), 70),
            gpu(1, Some("00000000:3B:00.0"), 5),
        ];
        assert_eq!(visible_devices_order(&gpus), vec![1, 0]);
    }

    #[test]
    fn table_and_json() {
        let r = DeviceReport {
            driver_version: Some("580.65.06".into()),
            cuda_version: Some("13.0".into()),
            gpus: vec![gpu(0, None, 20), gpu(1, None, 60)],
            errors: vec!["GPU 2: Unknown Error".into()],
        };
        let mut out = Vec::new();
        write_text(&r, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("driver 580.65.06, CUDA 13.0\n"), "{text}");
        assert!(text.contains("GPU model 1"), "{text}");
        assert!(text.contains("60.0 GiB"), "{text}");
        assert!(text.contains("350 W"), "{text}");
        assert!(text.contains("CUDA_VISIBLE_DEVICES=1,0"), "{text}");
        assert!(text.contains("warning: GPU 2: Unknown Error"), "{text}");
        let json = serde_json::to_string(&r).unwrap();
        let back: DeviceReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn without_a_driver_the_query_says_so() {
        // This runs everywhere: on a machine with the NVIDIA driver it lists the GPUs instead.
        match query() {
            Err(NvmlUnavailable::NoDriver { detail }) => {
                assert!(!detail.is_empty());
            }
            Err(NvmlUnavailable::Nvml(e)) => panic!("NVML present but failing: {e}"),
            Ok(r) => assert!(r.gpus.iter().all(|g| g.memory_total >= g.memory_used)),
        }
    }
}
