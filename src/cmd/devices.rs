//! `perfkit devices`: the GPUs of this machine and which to use first.

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use anyhow::Context as _;
use perfkit_sampler::NvmlUnavailable;
use perfkit_sampler::devices::{self, DeviceReport, GpuInfo};
use serde::Serialize;

/// Arguments of `perfkit devices`.
#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Print JSON (schema version 1) instead of a table.
    #[arg(long)]
    json: bool,
}

/// `perfkit devices --json` output.
#[derive(Serialize)]
struct DevicesJson<'a> {
    version: u32,
    /// Whether NVML could be used.
    available: bool,
    /// Why not, when it could not.
    reason: Option<String>,
    driver_version: Option<&'a str>,
    cuda_version: Option<&'a str>,
    gpus: &'a [GpuInfo],
    /// Suggested `CUDA_VISIBLE_DEVICES` (most free memory first, PCI bus order indices).
    cuda_visible_devices: Option<String>,
    /// Set with `cuda_visible_devices`: the ordering the indices assume.
    cuda_device_order: Option<&'static str>,
    errors: &'a [String],
}

/// Runs `perfkit devices`. A machine without an NVIDIA driver is a normal outcome (exit 0).
pub fn run(args: DevicesArgs) -> anyhow::Result<ExitCode> {
    let report = match devices::query() {
        Ok(r) => Ok(r),
        Err(e @ NvmlUnavailable::NoDriver { .. }) => Err(e.to_string()),
        Err(e @ NvmlUnavailable::Nvml(_)) => {
            return Err(anyhow::Error::new(e).context("reading the GPUs through NVML"));
        }
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if args.json {
        let empty = DeviceReport {
            driver_version: None,
            cuda_version: None,
            gpus: Vec::new(),
            errors: Vec::new(),
        };
        let r = report.as_ref().unwrap_or(&empty);
        let order = (!r.gpus.is_empty()).then(|| {
            devices::visible_devices_order(&r.gpus)
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        });
        let json = DevicesJson {
            version: 1,
            available: report.is_ok(),
            reason: report.as_ref().err().cloned(),
            driver_version: r.driver_version.as_deref(),
            cuda_version: r.cuda_version.as_deref(),
            gpus: &r.gpus,
            cuda_device_order: order.as_ref().map(|_| "PCI_BUS_ID"),
            cuda_visible_devices: order,
            errors: &r.errors,
        };
        serde_json::to_writer_pretty(&mut out, &json).context("writing JSON")?;
        writeln!(out)?;
    } else {
        match &report {
            Ok(r) => {
                devices::write_text(r, &mut out)?;
                if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
                    writeln!(
                        out,
                        "note: CUDA_VISIBLE_DEVICES is set in this shell; the list above shows every GPU"
                    )?;
                }
            }
            Err(reason) => writeln!(out, "no NVIDIA GPU available: {reason}")?,
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
