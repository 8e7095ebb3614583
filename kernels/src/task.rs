//! The synthetic classification task and the model's shapes and hyper-parameters.

use crate::rng;

/// A synthetic but learnable classification task: each class has a random prototype
/// vector in `[-signal, signal)^dim`; a sample is its class prototype plus noise of
/// standard deviation `noise_scale`. Sample `i` is a pure function of `(seed, i)`, so the host
/// loader and the device generator (`synth_batch`) produce identical batches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TaskSpec {
    /// Seed of labels, prototypes and noise.
    pub seed: u32,
    /// Number of input features.
    pub dim: usize,
    /// Number of classes.
    pub classes: usize,
    /// Amplitude of the class prototypes.
    pub signal: f32,
    /// Standard deviation of the per-feature noise.
    pub noise_scale: f32,
}

/// Default amplitude of the class prototypes: with unit noise and 784 features the
/// classes overlap enough that the loss falls over a few hundred steps rather than a
/// handful.
pub const DEFAULT_SIGNAL: f32 = 0.2;

/// Shapes of the multi-layer perceptron `input -> hidden (ReLU) -> classes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpShape {
    /// Input features (784 by default, an MNIST-sized image).
    pub input: usize,
    /// Hidden units (1024 by default).
    pub hidden: usize,
    /// Output classes (10 by default).
    pub classes: usize,
}

impl Default for MlpShape {
    fn default() -> Self {
        Self {
            input: 784,
            hidden: 1024,
            classes: 10,
        }
    }
}

impl MlpShape {
    /// Number of elements of each parameter tensor, in the order `w1, b1, w2, b2`.
    #[must_use]
    pub fn param_lens(&self) -> [usize; 4] {
        [
            self.input * self.hidden,
            self.hidden,
            self.hidden * self.classes,
            self.classes,
        ]
    }

    /// Uniform initialisation bounds of each parameter tensor (PyTorch's default for
    /// `nn.Linear`: `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`), in the order of
    /// [`MlpShape::param_lens`].
    #[must_use]
    pub fn init_bounds(&self) -> [f32; 4] {
        let b1 = 1.0 / (self.input as f32).sqrt();
        let b2 = 1.0 / (self.hidden as f32).sqrt();
        [b1, b1, b2, b2]
    }

    /// The task matching this shape, with prototypes of amplitude [`DEFAULT_SIGNAL`].
    #[must_use]
    pub fn task(&self, seed: u32, noise_scale: f32) -> TaskSpec {
        TaskSpec {
            seed,
            dim: self.input,
            classes: self.classes,
            signal: DEFAULT_SIGNAL,
            noise_scale,
        }
    }
}

/// Optimizer hyper-parameters (SGD with momentum).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f32,
    /// Momentum factor.
    pub momentum: f32,
    /// L2 weight decay.
    pub weight_decay: f32,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
        }
    }
}

/// Seed of the parameter initialisation, derived from the run's seed so that data
/// and parameters use unrelated random streams.
#[must_use]
pub fn param_seed(seed: u32) -> u32 {
    rng::hash(seed ^ 0x5bd1_e995)
}

/// Random-stream tag of parameter tensor `index` (0 = w1, 1 = b1, 2 = w2, 3 = b2).
#[must_use]
pub fn param_tag(index: usize) -> u32 {
    rng::TAG_PARAM_BASE + index as u32
}
