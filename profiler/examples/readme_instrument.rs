use perfkit_profiler::tracing::info_span; // `tracing`, re-exported: no dependency of its own

fn main() {
    let _perfkit = perfkit_profiler::init(); // 2. first line of main()
    let loader = (0..50u32).map(|i| vec![i as f32; 1 << 16]); // your data loader
    let mut batches = loader.into_iter();
    let mut weights = vec![0.0f32; 1 << 16];
    let mut step = 0u64;
    // 3. fetch each batch inside a `data` span, so that data loading shows up (PK301)
    while let Some(batch) = info_span!("data", step).in_scope(|| batches.next()) {
        let _step = info_span!("step", step).entered(); // 4. around each step
        for (w, x) in weights.iter_mut().zip(&batch) {
            *w = 0.9 * *w + 0.1 * x; // ... your training step; `tracing` spans show up inside it
        }
        step += 1;
    }
    println!("trained {step} steps");
}
