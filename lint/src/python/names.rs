//! The Python name table: what PyTorch, Lightning and friends call the things the rules look for
//! (the Rust table lives in `analysis::patterns` and the rules themselves).

use super::ValueKind;

/// Tensor constructors that take `device=`.
pub const CONSTRUCTORS: &[&str] = &[
    "tensor",
    "as_tensor",
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "randint",
    "randperm",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
];

/// Constructors PK202 reports when they allocate on the device in a step loop.
pub const ALLOCATORS: &[&str] = &["zeros", "ones", "empty", "full"];

/// Methods that read a tensor back to the host (PK101).
pub const READBACK_METHODS: &[&str] = &["item", "cpu", "numpy", "tolist"];

/// Methods that return a tensor without its graph.
pub const DETACHING_METHODS: &[&str] = &["detach", "detach_"];

/// Methods whose result is a host value, not a tensor.
pub const HOST_VALUE_METHODS: &[&str] = &[
    "item",
    "tolist",
    "numpy",
    "size",
    "dim",
    "numel",
    "ndimension",
    "element_size",
    "get_device",
    "is_cuda",
    "data_ptr",
];

/// Methods that only a tensor has (no NumPy array, list, string or dict has them): whatever
/// their receiver, their value is a tensor (`z = z.permute(0, 2, 3, 1).contiguous()`).
pub const TENSOR_ONLY_METHODS: &[&str] = &[
    "permute",
    "contiguous",
    "unsqueeze",
    "unsqueeze_",
    "masked_fill",
    "masked_fill_",
    "type_as",
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
    "new_tensor",
    "narrow",
    "unflatten",
    "log_softmax",
    "repeat_interleave",
];

/// Whether a dotted callee is a `torch` function (`torch.zeros`, `torch.nn.functional.mse_loss`,
/// `F.relu`).
pub fn is_torch_function(path: &str) -> bool {
    path.starts_with("torch.") || path.starts_with("F.")
}

/// What a `torch` function returns.
pub fn torch_function_kind(path: &str) -> ValueKind {
    let last = path.rsplit('.').next().unwrap_or(path);
    // `torch.nn.utils.clip_grad_norm_` returns the total norm: a tensor on the parameters' device.
    if is_grad_norm_callee(last) {
        return ValueKind::Tensor;
    }
    // `torch.is_floating_point(t)`, `torch.is_grad_enabled()`, `torch.equal(a, b)`: Python
    // booleans (`torch.isnan(t)` and `torch.isfinite(t)`, without the underscore, are tensors).
    if is_predicate_name(last) || matches!(last, "equal" | "allclose") {
        return ValueKind::Host;
    }
    if path.starts_with("torch.cuda.")
        || path.starts_with("torch.backends.")
        || path.starts_with("torch.distributed.")
        || matches!(
            last,
            "device"
                | "no_grad"
                | "inference_mode"
                | "autocast"
                | "is_tensor"
                | "numel"
                | "manual_seed"
                | "set_grad_enabled"
                | "load"
                | "save"
                | "compile"
                | "get_default_dtype"
        )
        || path.starts_with("torch.optim.")
        || path.starts_with("torch.utils.")
        || (path.starts_with("torch.nn.") && !path.starts_with("torch.nn.functional."))
    {
        return ValueKind::Unknown;
    }
    if is_loss_callee(last) || path.starts_with("F.") || path.starts_with("torch.nn.functional.") {
        return if is_loss_callee(last) {
            ValueKind::Graph
        } else {
            ValueKind::Tensor
        };
    }
    ValueKind::Tensor
}

/// The functions that clip or measure the gradients' norm and return it as a tensor on the
/// device: `torch.nn.utils.clip_grad_norm_`, `get_total_norm`, Accelerate's
/// `accelerator.clip_grad_norm_`, Fabric's `fabric.clip_gradients`.
pub fn is_grad_norm_callee(last: &str) -> bool {
    matches!(
        last,
        "clip_grad_norm_" | "clip_grad_norm" | "get_total_norm" | "clip_gradients"
    )
}

/// A loss function or criterion by name (`loss_fn`, `criterion`, `cross_entropy`, `mse_loss`).
pub fn is_loss_callee(path: &str) -> bool {
    let last = path.rsplit('.').next().unwrap_or(path).to_ascii_lowercase();
    last == "criterion"
        || last.contains("loss")
        || matches!(
            last.as_str(),
            "cross_entropy" | "nll_loss" | "binary_cross_entropy"
        )
}

/// A model call by name (`model(x)`, `self.model(x)`, `net(x)`, `self(x)`).
pub fn is_model_callee(path: &str) -> bool {
    let last = path.rsplit('.').next().unwrap_or(path);
    matches!(
        last,
        "model"
            | "net"
            | "network"
            | "module"
            | "self"
            | "encoder"
            | "decoder"
            | "generator"
            | "discriminator"
            | "policy"
            | "unet"
    ) || (last.ends_with("_model") && !is_predicate_name(last))
}

/// `is_peft_model`, `_is_compiled_module`, `has_model`: a name that asks a question and returns
/// a Python `bool`.
fn is_predicate_name(name: &str) -> bool {
    let name = name.trim_start_matches('_');
    name.starts_with("is_") || name.starts_with("has_")
}

/// Names that hold a loss (when nothing else tells what they are bound to).
pub fn is_loss_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "loss" || lower.ends_with("_loss") || lower.starts_with("loss_")
}

/// Names that hold a device (`device`, `dev`, `self.device`, `args.device`, `local_rank`).
pub fn is_device_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "dev"
        || lower.contains("device")
        || matches!(
            lower.as_str(),
            "rank" | "local_rank" | "gpu" | "gpu_id" | "cuda"
        )
}

/// An optimizer by name: `opt`, `optim`, `optimizer`, `g_optimizer`, `opt_d`.
pub fn is_optimizer_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "opt"
        || lower.contains("optim")
        || lower.starts_with("opt_")
        || lower.ends_with("_opt")
}

/// An optimizer constructor: `torch.optim.SGD`, `optim.AdamW`, `AdamW`, `bnb.optim.Adam8bit`.
pub fn is_optimizer_constructor(path: &str) -> bool {
    // Called for every call of a package: one pass over the (short) path's bytes, no searcher
    // set-up. A segment ending in `optim` before the last (`torch.optim.X`, `zero_optim.X`) is an
    // optimizer's module.
    let bytes = path.as_bytes();
    let mut optim_module = false;
    let mut last_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'.' {
            optim_module |= bytes[..i].ends_with(b"optim");
            last_start = i + 1;
        }
    }
    if optim_module && !path.contains("lr_scheduler") {
        return true;
    }
    let last = &path[last_start..];
    // Every known optimizer class starts with a capital letter.
    if !last.starts_with(|c: char| c.is_ascii_uppercase()) {
        return false;
    }
    matches!(
        last,
        "SGD"
            | "Adam"
            | "AdamW"
            | "Adagrad"
            | "Adadelta"
            | "Adamax"
            | "RMSprop"
            | "Rprop"
            | "LBFGS"
            | "NAdam"
            | "RAdam"
            | "SparseAdam"
            | "Lion"
            | "Adafactor"
            | "LAMB"
            | "Lamb"
            | "FusedAdam"
            | "DeepSpeedCPUAdam"
    )
}

/// Byte strings searched for in a text (comments and strings count), all of them in one pass over
/// the text (Teddy, the SIMD multi-substring searcher of `aho-corasick`, built once): a text that
/// holds none of them, the common case, is read once instead of once per needle.
pub(crate) struct Needles {
    needles: &'static [&'static str],
    searcher: std::sync::OnceLock<Searcher>,
}

/// How a set of needles is searched for.
enum Searcher {
    /// All needles in one pass.
    Packed(aho_corasick::packed::Searcher),
    /// One pass per needle, each searcher built once: where Teddy is not available for the set
    /// on this CPU.
    EachNeedle(Vec<memchr::memmem::Finder<'static>>),
}

impl Needles {
    pub(crate) const fn new(needles: &'static [&'static str]) -> Needles {
        Needles {
            needles,
            searcher: std::sync::OnceLock::new(),
        }
    }

    /// Whether `text` contains any of the needles.
    pub(crate) fn in_text(&self, text: &str) -> bool {
        let searcher = self.searcher.get_or_init(|| {
            match aho_corasick::packed::Searcher::new(self.needles.iter()) {
                Some(packed) => Searcher::Packed(packed),
                None => Searcher::EachNeedle(
                    self.needles
                        .iter()
                        .map(|n| memchr::memmem::Finder::new(n.as_bytes()))
                        .collect(),
                ),
            }
        });
        match searcher {
            Searcher::Packed(packed) => packed.find(text).is_some(),
            Searcher::EachNeedle(finders) => finders
                .iter()
                .any(|finder| finder.find(text.as_bytes()).is_some()),
        }
    }
}

/// Whether a module's text mentions an accelerator anywhere: CUDA, a device, a GPU, MPS, XPU,
/// XLA, or a framework object that places tensors on one (Lightning, Accelerate, Fabric). A
/// package that mentions none keeps every tensor on the CPU, where a readback copies nothing.
pub fn mentions_accelerator(source: &str) -> bool {
    static NEEDLES: Needles = Needles::new(&[
        "cuda",
        "CUDA",
        "device",
        "gpu",
        "GPU",
        "torch.mps",
        "backends.mps",
        "\"mps",
        "'mps",
        "xpu",
        "torch_xla",
        "ccelerat",
        "abric",
        "ightning",
        "Trainer",
    ]);
    NEEDLES.in_text(source)
}

/// Whether a module's text mentions 16-bit precision or autocast anywhere (PK501's "in reach").
pub fn mentions_mixed_precision(source: &str) -> bool {
    static NEEDLES: Needles = Needles::new(&[
        "autocast",
        "bfloat16",
        "float16",
        ".half()",
        "bf16",
        "fp16",
        "16-mixed",
        "GradScaler",
        "amp.",
    ]);
    NEEDLES.in_text(source)
}

/// Whether a module's text shows gradient accumulation (PK502).
pub fn mentions_grad_accumulation(source: &str) -> bool {
    static NEEDLES: Needles = Needles::new(&[
        "accumulate_grad_batches",
        "gradient_accumulation",
        "accumulation_steps",
        "accum_iter",
        "grad_accum",
        "accumulate(",
    ]);
    NEEDLES.in_text(source)
}

/// `train_loader`, `self.train_dataloader`, `trainloader`, `train_dl`: a name of training data.
pub fn is_training_data_name(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name).to_ascii_lowercase();
    last.starts_with("train")
        && !last.starts_with("trainer")
        && last
            .split(|c: char| c == '_' || c.is_ascii_digit())
            .any(|part| {
                matches!(
                    part,
                    "train" | "trainloader" | "traindl" | "trainset" | "training"
                )
            })
}

/// `test_loader`, `self.val_dl`, `valid_dataloader`, `testloader`, `eval_split`, `validate`,
/// `predict_dataloader`: a name of evaluation or inference data or code.
pub fn is_evaluation_name(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name).to_ascii_lowercase();
    const WORDS: [&str; 12] = [
        "test",
        "val",
        "valid",
        "validation",
        "validate",
        "eval",
        "evaluate",
        "evaluation",
        "dev",
        "predict",
        "prediction",
        "inference",
    ];
    const PREFIXES: [&str; 5] = ["test", "valid", "valloader", "valset", "eval"];
    last.split(|c: char| c == '_' || c.is_ascii_digit())
        .any(|part| WORDS.contains(&part))
        || PREFIXES.iter().any(|w| last.starts_with(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optimizer_constructors() {
        for path in [
            "torch.optim.SGD",
            "optim.AdamW",
            "AdamW",
            "bnb.optim.Adam8bit",
            "zero_optim.Make",
            "torch.optim.custom.Make",
            "Lion",
        ] {
            assert!(is_optimizer_constructor(path), "{path}");
        }
        for path in [
            "torch.optim.lr_scheduler.StepLR",
            "optim",
            "torch.nn.Linear",
            "model.optimizer_step",
            "optimizer.step",
            "torch.optimize.Thing",
        ] {
            assert!(!is_optimizer_constructor(path), "{path}");
        }
    }

    #[test]
    fn training_data_names() {
        for name in [
            "train_loader",
            "self.train_dataloader",
            "trainloader",
            "train_dl",
            "training_data",
            "train2",
        ] {
            assert!(is_training_data_name(name), "{name}");
        }
        for name in [
            "trainer",
            "trainer_loader",
            "loader",
            "test_loader",
            "retrain",
            "trained",
        ] {
            assert!(!is_training_data_name(name), "{name}");
        }
    }

    #[test]
    fn evaluation_names() {
        for name in [
            "test_loader",
            "self.val_dl",
            "valid_dataloader",
            "testloader",
            "eval_split",
            "predict_dataloader",
            "inference_loader",
        ] {
            assert!(is_evaluation_name(name), "{name}");
        }
        for name in ["train_loader", "loader", "latest", "devices", "predictor"] {
            assert!(!is_evaluation_name(name), "{name}");
        }
    }
}
