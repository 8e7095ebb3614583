//! The GPU sampler: one thread, one NVML query per GPU per interval, written to a trace file.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use perfkit_profiler::TraceWriter;
use perfkit_profiler::model::{
    DeviceInfo, DeviceMemory, EndReason, GpuSample, Header, Nanos, Record, TraceEnd,
};

use crate::NvmlUnavailable;

/// `Header::program` of a sampler trace.
pub const SAMPLER_PROGRAM: &str = "perfkit-gpu-sampler";
/// Value of the header's `perfkit.role` entry in a sampler trace.
pub const SAMPLER_ROLE: &str = "gpu-sampler";

/// Sampler settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SamplerOptions {
    /// Time between samples. Default: 100 ms.
    pub interval: Duration,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            interval: Duration::from_millis(100),
        }
    }
}

/// Why sampling could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// NVML is not usable here.
    #[error(transparent)]
    Unavailable(#[from] NvmlUnavailable),
    /// NVML works but sees no GPU.
    #[error("NVML sees no GPU")]
    NoGpu,
    /// The trace file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The trace file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The sampling thread died.
    #[error("the GPU sampler thread panicked")]
    Panicked,
}

/// What a sampler recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SamplerStats {
    /// Sampling rounds (one sample per GPU each).
    pub rounds: u64,
    /// Samples written.
    pub samples: u64,
    /// GPUs sampled.
    pub gpus: u32,
    /// Whether the device numbers recorded are CUDA ordinals (matched by PCI address, GPUs that
    /// CUDA does not see left out); `false` when no CUDA driver answered and they are NVML indices.
    pub cuda_ordinals: bool,
}

/// Writes a sampler trace: a header marked with [`SAMPLER_ROLE`], a `Device` record per GPU,
/// then `GpuSample` and `DeviceMemory` records, one chunk per round (so a killed run keeps
/// everything up to its last round), and an `End` record.
pub struct SampleWriter {
    w: TraceWriter<File>,
    path: PathBuf,
    origin: Instant,
    records: u64,
}

/// Creates `<dir>/<base>.pktrace`, else `<base>-2.pktrace`, ... : never a file that exists.
fn create_new_in(dir: &Path, base: &str) -> Result<(File, PathBuf), (PathBuf, std::io::Error)> {
    let ext = perfkit_profiler::format::TRACE_EXTENSION;
    for n in 1u32..=10_000 {
        let path = if n == 1 {
            dir.join(format!("{base}.{ext}"))
        } else {
            dir.join(format!("{base}-{n}.{ext}"))
        };
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err((path, e)),
        }
    }
    Err((
        dir.to_path_buf(),
        std::io::Error::other("no free sampler trace file name"),
    ))
}

impl SampleWriter {
    /// Creates `<dir>/perfkit-gpu-sampler-<pid>.pktrace` (the directory is created if needed).
    /// An existing file is never overwritten: the trace then goes beside it, under the first
    /// free name of `perfkit-gpu-sampler-<pid>-2.pktrace`, `-3`, ...
    pub fn create_in(dir: &Path) -> Result<SampleWriter, SamplerError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SamplerError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let (file, path) = create_new_in(dir, &format!("{SAMPLER_PROGRAM}-{}", std::process::id()))
            .map_err(|(path, source)| SamplerError::Io { path, source })?;
        let origin = Instant::now();
        let mut h = Header::new(SAMPLER_PROGRAM, std::process::id());
        h.start_unix_ns = unix_ns();
        h.clock = "monotonic".into();
        h.extra.push(("perfkit.role".into(), SAMPLER_ROLE.into()));
        let w = TraceWriter::new(file, &h).map_err(io(&path))?;
        Ok(SampleWriter {
            w,
            path,
            origin,
            records: 0,
        })
    }

    /// The trace file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Now on this trace's clock.
    pub fn now(&self) -> Nanos {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn write(&mut self, r: &Record) -> Result<(), SamplerError> {
        self.records += 1;
        self.w.write(r).map_err(|source| SamplerError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Describes a GPU.
    pub fn device(&mut self, info: DeviceInfo) -> Result<(), SamplerError> {
        self.write(&Record::Device(info))
    }

    /// Writes one sample (and a memory sample when memory is known).
    pub fn sample(&mut self, s: GpuSample) -> Result<(), SamplerError> {
        self.write(&Record::GpuSample(s))?;
        if let (Some(used), Some(total)) = (s.memory_used, s.memory_total) {
            self.write(&Record::DeviceMemory(DeviceMemory {
                ts: s.ts,
                device: s.device,
                used,
                total,
            }))?;
        }
        Ok(())
    }

    /// Ends the current chunk so it is on disk.
    pub fn flush(&mut self) -> Result<(), SamplerError> {
        self.w.flush_chunk().map_err(|source| SamplerError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Writes the `End` record and closes the file.
    pub fn finish(mut self) -> Result<PathBuf, SamplerError> {
        let end = Record::End(TraceEnd {
            ts: self.now(),
            end_unix_ns: unix_ns(),
            reason: EndReason::GuardDropped,
            records: self.records + 1,
            dropped: 0,
        });
        self.write(&end)?;
        let path = self.path.clone();
        self.w
            .finish()
            .map_err(|source| SamplerError::Io {
                path: path.clone(),
                source,
            })
            .map(|_| path)
    }
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A running sampler; [`Sampler::stop`] ends it and closes its trace.
#[must_use = "a sampler runs until stopped; dropping it stops it without reporting errors"]
pub struct Sampler {
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<Result<SamplerStats, SamplerError>>>,
    path: PathBuf,
}

impl Sampler {
    /// Starts sampling every GPU into `<trace_dir>/perfkit-gpu-sampler-<pid>.pktrace`.
    /// Fails at once (writing nothing) when NVML is unavailable or sees no GPU.
    pub fn start(trace_dir: &Path, opts: SamplerOptions) -> Result<Sampler, SamplerError> {
        let nvml = crate::init_nvml()?;
        let count = nvml
            .device_count()
            .map_err(|e| NvmlUnavailable::Nvml(e.to_string()))?;
        if count == 0 {
            return Err(SamplerError::NoGpu);
        }
        let devices = numbering(&nvml, count);
        if devices.gpus.is_empty() {
            return Err(SamplerError::NoGpu);
        }
        let mut writer = SampleWriter::create_in(trace_dir)?;
        let path = writer.path().to_path_buf();
        for &(i, device) in &devices.gpus {
            let Ok(d) = nvml.device_by_index(i) else {
                continue;
            };
            let cc = d.cuda_compute_capability().ok();
            writer.device(DeviceInfo {
                device,
                name: d.name().unwrap_or_default(),
                total_memory: d.memory_info().map_or(0, |m| m.total),
                compute_capability: cc.map_or((0, 0), |c| {
                    (
                        u32::try_from(c.major).unwrap_or(0),
                        u32::try_from(c.minor).unwrap_or(0),
                    )
                }),
            })?;
        }
        writer.flush()?;
        let (tx, rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("perfkit-gpu-sampler".into())
            .spawn(move || run(nvml, devices, writer, rx, opts.interval))
            .map_err(|source| SamplerError::Io {
                path: path.clone(),
                source,
            })?;
        Ok(Sampler {
            stop: Some(tx),
            handle: Some(handle),
            path,
        })
    }

    /// The trace file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops sampling (after at most one interval), finishes the trace and reports.
    pub fn stop(mut self) -> Result<SamplerStats, SamplerError> {
        self.stop.take();
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(SamplerError::Panicked),
            None => Ok(SamplerStats::default()),
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The GPUs to sample: (NVML index, device number to record).
struct Numbering {
    gpus: Vec<(u32, u32)>,
    cuda_ordinals: bool,
}

/// Numbers the NVML devices as the recorder does, by CUDA ordinal, matching PCI addresses; the
/// GPUs CUDA does not see (`CUDA_VISIBLE_DEVICES`) are left out. Without a CUDA driver that
/// answers, or when no address matches, every GPU keeps its NVML index.
fn numbering(nvml: &nvml_wrapper::Nvml, count: u32) -> Numbering {
    use crate::ordinals::{cuda_pci_addresses, nvml_to_cuda, parse_bus_id};
    let by_index = || Numbering {
        gpus: (0..count).map(|i| (i, i)).collect(),
        cuda_ordinals: false,
    };
    let Some(cuda) = cuda_pci_addresses() else {
        return by_index();
    };
    let addrs: Vec<_> = (0..count)
        .map(|i| {
            let d = nvml.device_by_index(i).ok()?;
            parse_bus_id(&d.pci_info().ok()?.bus_id)
        })
        .collect();
    let ordinals = nvml_to_cuda(&addrs, &cuda);
    let gpus: Vec<_> = (0..count)
        .zip(ordinals)
        .filter_map(|(i, k)| Some((i, k?)))
        .collect();
    if gpus.is_empty() {
        return by_index();
    }
    Numbering {
        gpus,
        cuda_ordinals: true,
    }
}

fn run(
    nvml: nvml_wrapper::Nvml,
    numbering: Numbering,
    mut writer: SampleWriter,
    stop: mpsc::Receiver<()>,
    interval: Duration,
) -> Result<SamplerStats, SamplerError> {
    use nvml_wrapper::enum_wrappers::device::Clock;
    let mut stats = SamplerStats {
        gpus: u32::try_from(numbering.gpus.len()).unwrap_or(u32::MAX),
        cuda_ordinals: numbering.cuda_ordinals,
        ..SamplerStats::default()
    };
    let devices: Vec<_> = numbering
        .gpus
        .iter()
        .filter_map(|&(i, device)| nvml.device_by_index(i).ok().map(|d| (device, d)))
        .collect();
    let mut next = Instant::now();
    loop {
        for (i, d) in &devices {
            let ts = writer.now();
            let mem = d.memory_info().ok();
            let util = d.utilization_rates().ok();
            writer.sample(GpuSample {
                ts,
                device: *i,
                gpu_util_pct: util.as_ref().map(|u| u.gpu),
                mem_util_pct: util.as_ref().map(|u| u.memory),
                memory_used: mem.as_ref().map(|m| m.used),
                memory_total: mem.as_ref().map(|m| m.total),
                sm_clock_mhz: d.clock_info(Clock::SM).ok(),
                power_mw: d.power_usage().ok(),
            })?;
            stats.samples += 1;
        }
        stats.rounds += 1;
        writer.flush()?;
        next += interval;
        let wait = next.saturating_duration_since(Instant::now());
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    writer.finish()?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use perfkit_profiler::{TraceReader, TraceStatus};

    fn sample(ts: Nanos, device: u32, used: Option<u64>) -> GpuSample {
        GpuSample {
            ts,
            device,
            gpu_util_pct: Some(87),
            mem_util_pct: Some(30),
            memory_used: used,
            memory_total: used.map(|_| 80 << 30),
            sm_clock_mhz: Some(1755),
            power_mw: None,
        }
    }

    #[test]
    fn an_existing_file_is_never_overwritten() {
        let t = tempfile::tempdir().unwrap();
        let taken = t.path().join(format!(
            "perfkit-gpu-sampler-{}.pktrace",
            std::process::id()
        ));
        std::fs::write(&taken, "not perfkit's").unwrap();
        let first = SampleWriter::create_in(t.path()).unwrap().finish().unwrap();
        let second = SampleWriter::create_in(t.path()).unwrap().finish().unwrap();
        assert_eq!(std::fs::read_to_string(&taken).unwrap(), "not perfkit's");
        assert_ne!(first, taken);
        assert_ne!(second, first);
        for path in [first, second] {
            let mut r = TraceReader::open(&path).unwrap();
            while r.next_record().unwrap().is_some() {}
            assert!(r.status().is_complete(), "{}", path.display());
        }
    }

    #[test]
    fn sampler_trace_reads_back() {
        let t = tempfile::tempdir().unwrap();
        let mut w = SampleWriter::create_in(&t.path().join("run")).unwrap();
        w.device(DeviceInfo {
            device: 0,
            name: "test device".into(),
            total_memory: 80 << 30,
            compute_capability: (9, 0),
        })
        .unwrap();
        w.sample(sample(100, 0, Some(5 << 30))).unwrap();
        w.flush().unwrap();
        w.sample(sample(200, 0, None)).unwrap();
        let path = w.finish().unwrap();
        assert!(path.ends_with(format!(
            "perfkit-gpu-sampler-{}.pktrace",
            std::process::id()
        )));

        let mut r = TraceReader::open(&path).unwrap();
        assert_eq!(r.header().program, SAMPLER_PROGRAM);
        assert!(
            r.header()
                .extra
                .contains(&("perfkit.role".to_string(), SAMPLER_ROLE.to_string()))
        );
        let recs: Vec<Record> = r.by_ref().map(|x| x.unwrap()).collect();
        assert!(matches!(r.status(), TraceStatus::Complete(_)));
        let samples: Vec<&GpuSample> = recs
            .iter()
            .filter_map(|x| match x {
                Record::GpuSample(s) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(samples.len(), 2);
        assert_eq!(*samples[0], sample(100, 0, Some(5 << 30)));
        assert_eq!(samples[1].memory_used, None);
        let mems: Vec<_> = recs
            .iter()
            .filter(|x| matches!(x, Record::DeviceMemory(_)))
            .collect();
        assert_eq!(mems.len(), 1, "memory only when known");
        assert!(
            recs.iter()
                .any(|x| matches!(x, Record::Device(d) if d.name == "test device"))
        );
    }

    #[test]
    fn a_killed_sampler_keeps_its_flushed_rounds() {
        let t = tempfile::tempdir().unwrap();
        let mut w = SampleWriter::create_in(t.path()).unwrap();
        w.sample(sample(1, 0, Some(1))).unwrap();
        w.flush().unwrap();
        let path = w.path().to_path_buf();
        std::mem::forget(w); // as if the process died: no End record
        let mut r = TraceReader::open(&path).unwrap();
        let n = r
            .by_ref()
            .filter(|x| matches!(x, Ok(Record::GpuSample(_))))
            .count();
        assert_eq!(n, 1);
        assert!(!matches!(r.status(), TraceStatus::Complete(_)));
    }

    #[test]
    fn without_nvml_start_fails_cleanly_and_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("trace");
        match Sampler::start(&dir, SamplerOptions::default()) {
            Err(SamplerError::Unavailable(NvmlUnavailable::NoDriver { .. })) => {
                assert!(!dir.exists());
            }
            Err(SamplerError::NoGpu) => assert!(!dir.exists()),
            Err(e) => panic!("{e}"),
            Ok(s) => {
                // A machine with the driver: it samples.
                std::thread::sleep(Duration::from_millis(250));
                let stats = s.stop().unwrap();
                assert!(stats.rounds >= 1 && stats.samples >= u64::from(stats.gpus));
            }
        }
    }
}
