//! perfkit-kernels: the reference training workload of perfkit.
//!
//! - CUDA C kernels for a multi-layer perceptron (`cuda/mlp.cu`: bias + ReLU forward
//!   and backward, softmax cross-entropy forward and backward with the loss reduced on
//!   the device, SGD with momentum, parameter initialisation and synthetic batch
//!   generation on the device), compiled at run time with NVRTC ([`nvrtc`]) and
//!   launched through perfkit's CUDA recorder ([`gpu`]); matrix products via cuBLAS.
//! - A CPU twin of every kernel ([`cpu`]), the reference in tests and the engine of
//!   the CPU trainer ([`cpu_model`]).
//! - The training loop ([`train`]) behind the `train` binary: an MLP (784 -> 1024 ->
//!   10 by default) on a synthetic but learnable task ([`task`]), with host data
//!   workers ([`data`]) and switches that turn on the anti-patterns of perfkit's rule
//!   catalog one by one ([`antipatterns`]).

#![warn(missing_docs)]

pub mod antipatterns;
pub mod cpu;
pub mod cpu_model;
pub mod data;
pub mod gpu;
pub mod nvrtc;
pub mod rng;
pub mod sources;
pub mod task;
pub mod train;
