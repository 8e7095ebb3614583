//! The MLP trained on the CPU with the CPU twins of the kernels.

use crate::cpu;
use crate::task::{MlpShape, SgdConfig, param_seed, param_tag};

/// Parameters, optimizer state and workspace of the MLP on the host.
#[derive(Clone, Debug)]
pub struct CpuMlp {
    shape: MlpShape,
    sgd: SgdConfig,
    rows: usize,
    threads: usize,
    params: [Vec<f32>; 4],
    velocity: [Vec<f32>; 4],
    grads: [Vec<f32>; 4],
    hidden: Vec<f32>,
    logits: Vec<f32>,
    probs: Vec<f32>,
    dlogits: Vec<f32>,
    dhidden: Vec<f32>,
}

/// The initial parameters `[w1, b1, w2, b2]` for `seed`, identical to what the
/// device's `fill_uniform` produces.
#[must_use]
pub fn init_params(shape: &MlpShape, seed: u32) -> [Vec<f32>; 4] {
    let lens = shape.param_lens();
    let bounds = shape.init_bounds();
    std::array::from_fn(|i| {
        let mut p = vec![0.0f32; lens[i]];
        cpu::fill_uniform(
            &mut p,
            param_seed(seed),
            param_tag(i),
            -bounds[i],
            bounds[i],
        );
        p
    })
}

impl CpuMlp {
    /// A freshly initialised model for batches of `rows` samples.
    #[must_use]
    pub fn new(shape: MlpShape, sgd: SgdConfig, rows: usize, seed: u32) -> Self {
        let lens = shape.param_lens();
        Self {
            shape,
            sgd,
            rows,
            threads: 1,
            params: init_params(&shape, seed),
            velocity: std::array::from_fn(|i| vec![0.0; lens[i]]),
            grads: std::array::from_fn(|i| vec![0.0; lens[i]]),
            hidden: vec![0.0; rows * shape.hidden],
            logits: vec![0.0; rows * shape.classes],
            probs: vec![0.0; rows * shape.classes],
            dlogits: vec![0.0; rows * shape.classes],
            dhidden: vec![0.0; rows * shape.hidden],
        }
    }

    /// Runs the matrix products on `threads` threads (default 1; same results).
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// Drops the activation and gradient buffers and allocates zeroed ones of the same sizes
    /// (what the `--alloc-every-step` anti-pattern does every step; the results are the same,
    /// since every pass overwrites its buffers).
    pub fn reallocate_buffers(&mut self) {
        let lens = self.shape.param_lens();
        let rows = self.rows;
        self.grads = std::array::from_fn(|i| vec![0.0; lens[i]]);
        self.hidden = vec![0.0; rows * self.shape.hidden];
        self.logits = vec![0.0; rows * self.shape.classes];
        self.probs = vec![0.0; rows * self.shape.classes];
        self.dlogits = vec![0.0; rows * self.shape.classes];
        self.dhidden = vec![0.0; rows * self.shape.hidden];
    }

    /// The gradients of the last [`CpuMlp::backward`], `[dw1, db1, dw2, db2]`.
    #[must_use]
    pub fn grads(&self) -> &[Vec<f32>; 4] {
        &self.grads
    }

    /// Forward pass over a batch (`x`: `rows x input`); returns the mean loss.
    pub fn forward(&mut self, x: &[f32], labels: &[i32]) -> f32 {
        let MlpShape {
            input,
            hidden,
            classes,
        } = self.shape;
        let rows = self.rows;
        assert_eq!(
            labels.len(),
            rows,
            "forward: batch size differs from the model's"
        );
        let [w1, b1, w2, b2] = &self.params;
        cpu::gemm_threads(
            self.threads,
            false,
            false,
            rows,
            hidden,
            input,
            1.0,
            x,
            w1,
            0.0,
            &mut self.hidden,
        );
        cpu::bias_act_fwd(&mut self.hidden, b1, rows, hidden, true);
        cpu::gemm_threads(
            self.threads,
            false,
            false,
            rows,
            classes,
            hidden,
            1.0,
            &self.hidden,
            w2,
            0.0,
            &mut self.logits,
        );
        cpu::bias_act_fwd(&mut self.logits, b2, rows, classes, false);
        cpu::softmax_xent_fwd(&self.logits, labels, &mut self.probs, classes)
    }

    /// Backward pass of the last forward pass; fills the gradients.
    pub fn backward(&mut self, x: &[f32], labels: &[i32]) {
        let MlpShape {
            input,
            hidden,
            classes,
        } = self.shape;
        let rows = self.rows;
        let [dw1, db1, dw2, db2] = &mut self.grads;
        let w2 = &self.params[2];
        cpu::softmax_xent_bwd(&self.probs, labels, &mut self.dlogits, classes);
        cpu::gemm_threads(
            self.threads,
            true,
            false,
            hidden,
            classes,
            rows,
            1.0,
            &self.hidden,
            &self.dlogits,
            0.0,
            dw2,
        );
        cpu::bias_act_bwd(&self.logits, &mut self.dlogits, db2, rows, classes, false);
        cpu::gemm_threads(
            self.threads,
            false,
            true,
            rows,
            hidden,
            classes,
            1.0,
            &self.dlogits,
            w2,
            0.0,
            &mut self.dhidden,
        );
        cpu::bias_act_bwd(&self.hidden, &mut self.dhidden, db1, rows, hidden, true);
        cpu::gemm_threads(
            self.threads,
            true,
            false,
            input,
            hidden,
            rows,
            1.0,
            x,
            &self.dhidden,
            0.0,
            dw1,
        );
    }

    /// One SGD-with-momentum update of every parameter.
    pub fn step(&mut self) {
        let SgdConfig {
            lr,
            momentum,
            weight_decay,
        } = self.sgd;
        for ((w, v), g) in self
            .params
            .iter_mut()
            .zip(&mut self.velocity)
            .zip(&self.grads)
        {
            cpu::sgd_momentum(w, v, g, lr, momentum, weight_decay);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Batch, fill_batch};

    fn small() -> MlpShape {
        MlpShape {
            input: 12,
            hidden: 16,
            classes: 3,
        }
    }

    #[test]
    fn parameter_gradients_match_finite_differences() {
        let shape = small();
        let rows = 5;
        let spec = shape.task(4, 0.5);
        let mut batch = Batch::default();
        fill_batch(&mut batch, &spec, rows, 0);
        let sgd = SgdConfig::default();
        let mut model = CpuMlp::new(shape, sgd, rows, 2);
        model.forward(&batch.x, &batch.labels);
        model.backward(&batch.x, &batch.labels);
        let grads = model.grads().clone();
        let eps = 3e-3f32;
        let mask = |m: &CpuMlp| m.hidden.iter().map(|h| *h > 0.0).collect::<Vec<_>>();
        let (mut checked, mut skipped) = (0, 0);
        for (p, grad) in grads.iter().enumerate() {
            for i in (0..grad.len()).step_by(7) {
                let mut plus = model.clone();
                plus.params[p][i] += eps;
                let mut minus = model.clone();
                minus.params[p][i] -= eps;
                let numeric = (plus.forward(&batch.x, &batch.labels)
                    - minus.forward(&batch.x, &batch.labels))
                    / (2.0 * eps);
                if mask(&plus) != mask(&minus) {
                    // The perturbation crosses a ReLU kink: finite differences do not apply.
                    skipped += 1;
                    continue;
                }
                checked += 1;
                assert!(
                    (numeric - grad[i]).abs() < 2e-3 + 2e-2 * grad[i].abs(),
                    "param {p} element {i}: numeric {numeric} analytic {}",
                    grad[i]
                );
            }
        }
        assert!(
            checked >= 3 * skipped && checked >= 25,
            "checked {checked}, skipped {skipped}"
        );
    }

    #[test]
    fn one_step_on_a_fixed_batch_lowers_its_loss() {
        let shape = small();
        let rows = 8;
        let mut batch = Batch::default();
        fill_batch(&mut batch, &shape.task(1, 0.5), rows, 0);
        let mut model = CpuMlp::new(
            shape,
            SgdConfig {
                lr: 0.1,
                momentum: 0.0,
                weight_decay: 0.0,
            },
            rows,
            1,
        );
        let before = model.forward(&batch.x, &batch.labels);
        model.backward(&batch.x, &batch.labels);
        model.step();
        let after = model.forward(&batch.x, &batch.labels);
        assert!(after < before, "loss went from {before} to {after}");
    }
}
