//! Which training frameworks a file or crate uses, from `use` paths and crate names.

/// A framework the rules know about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framework {
    /// `candle-core` / `candle-nn` (imported as `candle_core`, `candle_nn`, or renamed `candle`).
    Candle,
    /// `burn` and its sub-crates (`burn_tensor`, `burn_train`, ...).
    Burn,
    /// `tch` (tch-rs, libtorch bindings).
    Tch,
    /// `cudarc` (raw CUDA driver API).
    Cudarc,
}

impl Framework {
    fn bit(self) -> u8 {
        match self {
            Framework::Candle => 1,
            Framework::Burn => 2,
            Framework::Tch => 4,
            Framework::Cudarc => 8,
        }
    }

    /// Which framework a crate name (first path segment or dependency name) belongs to.
    pub fn from_crate_name(name: &str) -> Option<Framework> {
        let name = name.trim_start_matches("::");
        match name {
            "candle"
            | "candle_core"
            | "candle_nn"
            | "candle_transformers"
            | "candle_datasets"
            | "candle-core"
            | "candle-nn"
            | "candle-transformers"
            | "candle-datasets" => Some(Framework::Candle),
            "tch" => Some(Framework::Tch),
            "cudarc" => Some(Framework::Cudarc),
            _ if name == "burn" || name.starts_with("burn_") || name.starts_with("burn-") => {
                Some(Framework::Burn)
            }
            _ => None,
        }
    }
}

/// A set of frameworks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Frameworks(u8);

impl Frameworks {
    /// The empty set.
    pub const NONE: Frameworks = Frameworks(0);

    /// Whether `framework` is in the set.
    pub fn contains(self, framework: Framework) -> bool {
        self.0 & framework.bit() != 0
    }
    /// Adds a framework.
    pub fn insert(&mut self, framework: Framework) {
        self.0 |= framework.bit();
    }
    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The union of two sets.
    pub fn union(self, other: Frameworks) -> Frameworks {
        Frameworks(self.0 | other.0)
    }
}
