//! Host data loading: batches of the synthetic task produced inline or by worker
//! threads with bounded prefetch (the `DataLoader(num_workers=N, prefetch_factor=K)`
//! pattern).

use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::JoinHandle;

use crate::cpu;
use crate::task::TaskSpec;

/// One batch of samples on the host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// Index of the batch in the run (0, 1, 2, ...).
    pub index: u64,
    /// Features, `rows x dim`, row-major.
    pub x: Vec<f32>,
    /// Class labels, `rows`.
    pub labels: Vec<i32>,
}

impl Batch {
    /// Number of samples.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.labels.len()
    }
}

/// How the loader gets each sample's features.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecordFormat {
    /// Generated straight into the batch (a few µs a sample).
    #[default]
    Raw,
    /// Each sample goes through a CSV record: its features are written as one line of
    /// comma-separated fields (each `f32`'s bits in hexadecimal), then parsed back, the work of
    /// a loader that decodes text records (tens of µs a sample, comparable to decoding a small
    /// image). The bits round-trip, so the values are exactly those of [`Raw`](Self::Raw).
    Csv,
}

/// Produces batch `index` of size `rows` into `batch`, reusing its allocations.
pub fn fill_batch(batch: &mut Batch, spec: &TaskSpec, rows: usize, index: u64) {
    fill_batch_as(batch, spec, rows, index, RecordFormat::Raw);
}

/// [`fill_batch`], with each sample decoded from a record of `format`.
pub fn fill_batch_as(
    batch: &mut Batch,
    spec: &TaskSpec,
    rows: usize,
    index: u64,
    format: RecordFormat,
) {
    batch.index = index;
    batch.x.resize(rows * spec.dim, 0.0);
    batch.labels.resize(rows, 0);
    cpu::synth_batch(&mut batch.x, &mut batch.labels, spec, index * rows as u64);
    if format == RecordFormat::Csv && spec.dim > 0 {
        let mut line = String::new();
        for row in batch.x.chunks_mut(spec.dim) {
            csv_round_trip(row, &mut line);
        }
    }
}

/// Writes `row` as one CSV line into `line`, then parses it back into `row`.
fn csv_round_trip(row: &mut [f32], line: &mut String) {
    use std::fmt::Write as _;
    line.clear();
    for (i, v) in row.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        // Writing into a String cannot fail.
        let _ = write!(line, "{sep}{:08x}", v.to_bits());
    }
    for (out, field) in row.iter_mut().zip(line.split(',')) {
        // The text was printed from an f32 just above, so it always parses.
        if let Ok(bits) = u32::from_str_radix(field, 16) {
            *out = f32::from_bits(bits);
        }
    }
}

struct Worker {
    batches: Receiver<Batch>,
    recycle: Sender<Batch>,
    handle: Option<JoinHandle<()>>,
}

/// A host data loader over the synthetic task.
///
/// With `workers == 0` each batch is generated on the calling thread when asked for.
/// With `workers == N` worker `w` produces batches `w, w + N, w + 2N, ...` ahead of
/// time, at most `prefetch` batches each, and batches are handed out in order, so
/// the sequence is the same whatever `N` is.
pub struct HostLoader {
    spec: TaskSpec,
    rows: usize,
    next: u64,
    end: u64,
    workers: Vec<Worker>,
    inline_spare: Option<Batch>,
    format: RecordFormat,
}

impl std::fmt::Debug for HostLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLoader")
            .field("spec", &self.spec)
            .field("rows", &self.rows)
            .field("next", &self.next)
            .field("end", &self.end)
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl HostLoader {
    /// A loader of `batches` batches of `rows` samples, with `workers` threads and
    /// `prefetch` (at least 1) batches buffered per worker.
    #[must_use]
    pub fn new(spec: TaskSpec, rows: usize, batches: u64, workers: usize, prefetch: usize) -> Self {
        Self::with_format(spec, rows, batches, workers, prefetch, RecordFormat::Raw)
    }

    /// [`HostLoader::new`], decoding each sample from a record of `format`.
    #[must_use]
    pub fn with_format(
        spec: TaskSpec,
        rows: usize,
        batches: u64,
        workers: usize,
        prefetch: usize,
        format: RecordFormat,
    ) -> Self {
        let prefetch = prefetch.max(1);
        let workers = (0..workers as u64)
            .map(|w| {
                let (tx, rx): (SyncSender<Batch>, Receiver<Batch>) = mpsc::sync_channel(prefetch);
                let (recycle_tx, recycle_rx) = mpsc::channel::<Batch>();
                let stride = workers as u64;
                let handle = std::thread::Builder::new()
                    .name(format!("data-worker-{w}"))
                    .spawn(move || {
                        let mut index = w;
                        while index < batches {
                            let mut batch = recycle_rx.try_recv().unwrap_or_default();
                            {
                                let _span =
                                    tracing::info_span!("load_batch", batch = index).entered();
                                fill_batch_as(&mut batch, &spec, rows, index, format);
                            }
                            if tx.send(batch).is_err() {
                                // The loader was dropped: stop producing.
                                return;
                            }
                            index += stride;
                        }
                    })
                    .ok();
                Worker {
                    batches: rx,
                    recycle: recycle_tx,
                    handle,
                }
            })
            .collect::<Vec<_>>();
        // A worker thread that could not be spawned leaves its share of batches to the
        // calling thread (see `next_batch`).
        Self {
            spec,
            rows,
            next: 0,
            end: batches,
            workers,
            inline_spare: None,
            format,
        }
    }

    /// The next batch, or `None` after the last one.
    pub fn next_batch(&mut self) -> Option<Batch> {
        if self.next >= self.end {
            return None;
        }
        let index = self.next;
        self.next += 1;
        if !self.workers.is_empty() {
            let worker = &self.workers[(index % self.workers.len() as u64) as usize];
            if worker.handle.is_some()
                && let Ok(batch) = worker.batches.recv()
            {
                return Some(batch);
            }
        }
        let mut batch = self.inline_spare.take().unwrap_or_default();
        fill_batch_as(&mut batch, &self.spec, self.rows, index, self.format);
        Some(batch)
    }

    /// Gives a consumed batch back so its allocations are reused.
    pub fn recycle(&mut self, batch: Batch) {
        if self.workers.is_empty() {
            self.inline_spare = Some(batch);
            return;
        }
        let worker = &self.workers[(batch.index % self.workers.len() as u64) as usize];
        // A worker that already finished no longer needs buffers; dropping is fine.
        let _ = worker.recycle.send(batch);
    }
}

impl Drop for HostLoader {
    fn drop(&mut self) {
        let handles: Vec<_> = self
            .workers
            .iter_mut()
            .filter_map(|w| w.handle.take())
            .collect();
        // Dropping the receivers makes blocked workers' `send` fail so they exit.
        self.workers.clear();
        for handle in handles {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TaskSpec {
        TaskSpec {
            seed: 11,
            dim: 8,
            classes: 3,
            signal: 1.0,
            noise_scale: 0.5,
        }
    }

    fn collect(workers: usize, prefetch: usize) -> Vec<Batch> {
        let mut loader = HostLoader::new(spec(), 4, 7, workers, prefetch);
        let mut out = Vec::new();
        while let Some(b) = loader.next_batch() {
            out.push(b.clone());
            loader.recycle(b);
        }
        out
    }

    #[test]
    fn workers_produce_the_same_batches_in_the_same_order_as_inline() {
        let inline = collect(0, 1);
        assert_eq!(inline.len(), 7);
        assert_eq!(
            inline.iter().map(|b| b.index).collect::<Vec<_>>(),
            (0..7).collect::<Vec<_>>()
        );
        assert_eq!(collect(1, 2), inline);
        assert_eq!(collect(3, 1), inline);
        assert_eq!(collect(8, 4), inline);
    }

    #[test]
    fn csv_records_decode_to_the_same_batches() {
        let spec = TaskSpec { dim: 50, ..spec() };
        let mut raw = Batch::default();
        let mut csv = Batch::default();
        for index in 0..5 {
            fill_batch(&mut raw, &spec, 9, index);
            fill_batch_as(&mut csv, &spec, 9, index, RecordFormat::Csv);
            assert_eq!(raw, csv, "batch {index}");
        }
        let mut loader = HostLoader::with_format(spec, 9, 3, 2, 1, RecordFormat::Csv);
        let first = loader.next_batch().unwrap();
        fill_batch(&mut raw, &spec, 9, 0);
        assert_eq!(first, raw);
    }

    #[test]
    fn batches_are_distinct() {
        let b = collect(2, 2);
        assert_ne!(b[0].x, b[1].x);
        assert_eq!(b[0].rows(), 4);
        assert_eq!(b[0].x.len(), 4 * 8);
    }

    #[test]
    fn dropping_a_loader_mid_run_stops_its_workers() {
        let mut loader = HostLoader::new(spec(), 4, 1_000_000, 4, 2);
        assert!(loader.next_batch().is_some());
        drop(loader); // must not hang
    }
}
