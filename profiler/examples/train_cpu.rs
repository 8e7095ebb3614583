//! A small CPU training loop instrumented with perfkit-profiler: linear regression trained with
//! SGD, each step split into `data`, `forward`, `backward` and `optimizer` spans.
//!
//! ```text
//! cargo build -p perfkit-profiler --example train_cpu
//! perfkit profile -- target/debug/examples/train_cpu --steps 200
//! ```
//!
//! Flags (all optional):
//!   --steps N        training steps (default 200)
//!   --batch N        samples per step (default 128)
//!   --features N     model width (default 256)
//!   --print-every N  print the loss every N steps, 0 for never (default 50)
//!   --exit-code N    exit with this code after training (default 0)
//!   --panic-at N     panic inside step N
//!   --max-seconds N  stop after N seconds even if steps remain (default: no limit)

use std::process::ExitCode;

use tracing::info_span;

/// Command-line options.
#[derive(Debug)]
struct Options {
    steps: u64,
    batch: usize,
    features: usize,
    print_every: u64,
    exit_code: u8,
    panic_at: Option<u64>,
    max_seconds: Option<u64>,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        steps: 200,
        batch: 128,
        features: 256,
        print_every: 50,
        exit_code: 0,
        panic_at: None,
        max_seconds: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("invalid value `{value}` for {flag}: {e}");
        match flag.as_str() {
            "--steps" => o.steps = value.parse().map_err(bad)?,
            "--batch" => o.batch = value.parse().map_err(bad)?,
            "--features" => o.features = value.parse().map_err(bad)?,
            "--print-every" => o.print_every = value.parse().map_err(bad)?,
            "--exit-code" => o.exit_code = value.parse().map_err(bad)?,
            "--panic-at" => o.panic_at = Some(value.parse().map_err(bad)?),
            "--max-seconds" => o.max_seconds = Some(value.parse().map_err(bad)?),
            _ => return Err(format!("unknown flag `{flag}`")),
        }
    }
    if o.batch == 0 || o.features == 0 {
        return Err("--batch and --features must be at least 1".into());
    }
    Ok(o)
}

/// xorshift64*: a tiny deterministic generator, good enough for synthetic data.
struct Rng(u64);

impl Rng {
    /// Uniform in [-1, 1).
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
        bits as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The model: a weight vector, trained to match `target`.
struct Model {
    weights: Vec<f32>,
    grad: Vec<f32>,
}

/// One batch: inputs (row-major, batch x features) and labels.
struct Batch {
    x: Vec<f32>,
    y: Vec<f32>,
}

fn load_batch(rng: &mut Rng, target: &[f32], batch: usize) -> Batch {
    let features = target.len();
    let x: Vec<f32> = (0..batch * features).map(|_| rng.next()).collect();
    let y = x
        .chunks_exact(features)
        .map(|row| dot(row, target) + 0.01 * rng.next())
        .collect();
    Batch { x, y }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(p, q)| p * q).sum()
}

/// Predictions and the mean squared error.
fn forward(model: &Model, batch: &Batch) -> (Vec<f32>, f32) {
    let features = model.weights.len();
    let pred: Vec<f32> = batch
        .x
        .chunks_exact(features)
        .map(|row| dot(row, &model.weights))
        .collect();
    let loss = pred
        .iter()
        .zip(&batch.y)
        .map(|(p, y)| (p - y) * (p - y))
        .sum::<f32>()
        / pred.len() as f32;
    (pred, loss)
}

/// Gradient of the mean squared error with respect to the weights.
fn backward(model: &mut Model, batch: &Batch, pred: &[f32]) {
    let features = model.weights.len();
    let scale = 2.0 / pred.len() as f32;
    model.grad.iter_mut().for_each(|g| *g = 0.0);
    for (row, (p, y)) in batch
        .x
        .chunks_exact(features)
        .zip(pred.iter().zip(&batch.y))
    {
        let err = scale * (p - y);
        for (g, x) in model.grad.iter_mut().zip(row) {
            *g += err * x;
        }
    }
}

fn sgd_step(model: &mut Model, lr: f32) {
    for (w, g) in model.weights.iter_mut().zip(&model.grad) {
        *w -= lr * g;
    }
}

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(opts) => opts,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("train_cpu: {msg}");
            }
            eprintln!(
                "usage: train_cpu [--steps N] [--batch N] [--features N] [--print-every N] \
                 [--exit-code N] [--panic-at STEP] [--max-seconds N]"
            );
            return ExitCode::from(if msg.is_empty() { 0 } else { 2 });
        }
    };
    let perfkit = perfkit_profiler::init();

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let target: Vec<f32> = (0..opts.features).map(|_| rng.next()).collect();
    let mut model = Model {
        weights: vec![0.0; opts.features],
        grad: vec![0.0; opts.features],
    };
    let deadline = opts
        .max_seconds
        .map(|s| std::time::Instant::now() + std::time::Duration::from_secs(s));
    let mut loss = f32::NAN;
    let mut done = 0;
    for step in 0..opts.steps {
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        let _step = info_span!("step", step).entered();
        let batch = {
            let _s = info_span!("data").entered();
            load_batch(&mut rng, &target, opts.batch)
        };
        let pred = {
            let _s = info_span!("forward").entered();
            let (pred, l) = forward(&model, &batch);
            loss = l;
            pred
        };
        if opts.panic_at == Some(step) {
            panic!("injected panic at step {step}");
        }
        {
            let _s = info_span!("backward").entered();
            backward(&mut model, &batch, &pred);
        }
        {
            let _s = info_span!("optimizer").entered();
            sgd_step(&mut model, 0.05);
        }
        if opts.print_every > 0 && (step + 1) % opts.print_every == 0 {
            println!("step {:>6}  loss {loss:.6}", step + 1);
        }
        done = step + 1;
    }
    println!("trained {done} steps, final loss {loss:.6}");
    drop(perfkit);
    ExitCode::from(opts.exit_code)
}
