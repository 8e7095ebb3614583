//! What the analysis knows of a value without type checking: the type the crate declares for it (a
//! parameter, a `let` annotation, a constructor, a struct field), and the device it lives on,
//! followed through `let` bindings, method chains and arithmetic in one function.
//!
//! Types are names (the last path segment): enough to tell an optimizer from an RNN cell or a
//! metric, and to resolve `x.method()` to the crate's own `impl` of `x`'s type.

use syn::{GenericParam, Generics, Type, TypeParamBound};

use super::DeviceKind;

/// What the analysis knows of a value's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TypeHint<'a> {
    /// Nothing.
    #[default]
    Unknown,
    /// A named type (the last path segment), or for a generic parameter, `impl Trait` or
    /// `dyn Trait`, the first trait bound.
    Named(&'a str),
    /// Field `.1` of a value of type `.0`: resolved against the crate's struct declarations.
    Field(&'a str, &'a str),
}

impl<'a> TypeHint<'a> {
    /// The type name, when it is known without the crate's struct table.
    pub fn name(self) -> Option<&'a str> {
        match self {
            TypeHint::Named(name) => Some(name),
            _ => None,
        }
    }
}

/// Where a value's device comes from when the function alone does not say: a parameter (the
/// arguments at the crate's call sites decide), a struct field (the crate's struct literals
/// decide), or what a call returns, or a field of it (the crate function it calls decides; a call
/// outside the crate returns where its operands live).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DevSym<'a> {
    /// The function's parameter number `.0` (counting typed parameters, not `self`).
    Param(usize),
    /// Field `.1` of a value of type `.0` (`"0"`, `"1"` for tuple structs).
    Field(&'a str, &'a str),
    /// The value returned by call number `.0` of the file.
    Ret(usize),
    /// Field `.1` of the value returned by call number `.0` of the file (`step.is_done` after
    /// `let step = env.step(action)?`): the struct literals the called function builds decide.
    RetField(usize, &'a str),
}

/// The symbolic sources of a value's device: up to two (a method's receiver and its first
/// argument, the two sides of an operator).
pub type Syms<'a> = [Option<DevSym<'a>>; 2];

/// The device of a value: known, or symbolic (resolved across the crate), or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dev<'a> {
    /// What the function alone says.
    pub kind: DeviceKind,
    /// Where to look when `kind` is unknown.
    pub syms: Syms<'a>,
}

impl<'a> Dev<'a> {
    /// Nothing known.
    pub const UNKNOWN: Dev<'static> = Dev {
        kind: DeviceKind::Unknown,
        syms: [None, None],
    };

    /// A known device.
    pub fn known(kind: DeviceKind) -> Dev<'a> {
        Dev {
            kind,
            syms: [None, None],
        }
    }

    /// A device that `sym` decides.
    pub fn symbolic(sym: DevSym<'a>) -> Dev<'a> {
        Dev {
            kind: DeviceKind::Unknown,
            syms: [Some(sym), None],
        }
    }

    /// Whether anything is known or can be looked up.
    pub fn is_informative(&self) -> bool {
        self.kind != DeviceKind::Unknown || self.syms[0].is_some()
    }
}

/// Merges the devices of several operands: an accelerator wins (the operation runs there); the
/// CPU when every known operand is on the CPU; else the (first two) symbolic sources.
pub(crate) fn merge_devs<'a>(devs: impl IntoIterator<Item = Dev<'a>>) -> Dev<'a> {
    let mut kind = DeviceKind::Unknown;
    let mut syms: Syms<'a> = [None, None];
    for d in devs {
        match d.kind {
            DeviceKind::Gpu => return Dev::known(DeviceKind::Gpu),
            DeviceKind::Cpu => kind = DeviceKind::Cpu,
            DeviceKind::Unknown => {
                for sym in d.syms.into_iter().flatten() {
                    if syms.contains(&Some(sym)) {
                        continue;
                    }
                    if let Some(slot) = syms.iter_mut().find(|s| s.is_none()) {
                        *slot = Some(sym);
                    }
                }
            }
        }
    }
    if kind == DeviceKind::Unknown {
        Dev { kind, syms }
    } else {
        Dev::known(kind)
    }
}

/// A local binding (or parameter) in scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Binding<'a> {
    pub(crate) name: &'a str,
    pub(crate) ty: TypeHint<'a>,
    pub(crate) dev: Dev<'a>,
    /// The `let` initializer, read when the binding is used as a guard
    /// (`let due = step % every == 0; if due { .. }`).
    pub(crate) init: Option<&'a syn::Expr>,
}

/// Optimizers of candle, burn and tch, and the traits they implement: `AdamW`, `SGD`, `Sgd`,
/// `Adam`, `RmsProp`, `Optimizer`, `OptimizerAdaptor`, `SimpleOptimizer`, ... A config type
/// (`AdamConfig`) is an optimizer builder, not an optimizer.
pub fn is_optimizer_type(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    if lower.ends_with("config") || lower.ends_with("params") {
        return false;
    }
    is_optimizer_family(name)
}

/// An optimizer's configuration or builder (`AdamConfig`, `SgdConfig`, tch `nn::Adam` before
/// `.build(..)`): `init`/`build` on it makes an optimizer.
pub fn is_optimizer_builder(name: &str) -> bool {
    is_optimizer_family(name.strip_suffix("Config").unwrap_or(name))
}

/// The name, or one of its words (`CustomAdamW` -> `Custom`, `Adam`, `W`; `SGD`), names an
/// optimizer family, or a word starts with `optim`.
fn is_optimizer_family(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "adam",
        "adamw",
        "sgd",
        "rmsprop",
        "rms",
        "adagrad",
        "adadelta",
        "adamax",
        "nadam",
        "radam",
        "lamb",
        "lion",
        "lbfgs",
        "adafactor",
        "muon",
        "sophia",
        "momentum",
    ];
    let lower = name.to_ascii_lowercase();
    if NAMES.contains(&lower.as_str()) {
        return true;
    }
    words(name).any(|word| {
        let word = word.to_ascii_lowercase();
        NAMES.contains(&word.as_str()) || word.starts_with("optim")
    })
}

/// The words of an identifier: split at `_` and before an uppercase letter that follows a
/// lowercase one (`AdamWConfig` -> `Adam`, `WConfig`; `SGD` stays whole).
pub(crate) fn words(name: &str) -> impl Iterator<Item = &str> {
    let bytes = name.as_bytes();
    let mut starts = vec![0];
    for i in 1..bytes.len() {
        if bytes[i] == b'_' || (bytes[i].is_ascii_uppercase() && bytes[i - 1].is_ascii_lowercase())
        {
            starts.push(i);
        }
    }
    starts.push(bytes.len());
    starts
        .windows(2)
        .map(move |w| name[w[0]..w[1]].trim_matches('_'))
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .into_iter()
}

/// The type name a syntactic type stands for: the last segment of a path (`Box<T>`, `Rc<T>`,
/// `Arc<T>`, `Mutex<T>`, `RefCell<T>`, `Option<T>` look through to `T`), the first trait bound of
/// `impl Trait` / `dyn Trait`, and for a generic parameter of `generics` its first bound.
pub(crate) fn type_name(ty: &Type, generics: &[(String, String)]) -> Option<String> {
    match ty {
        Type::Reference(r) => type_name(&r.elem, generics),
        Type::Paren(p) => type_name(&p.elem, generics),
        Type::Group(g) => type_name(&g.elem, generics),
        Type::Path(p) => {
            let last = p.path.segments.last()?;
            let ident = last.ident.to_string();
            if matches!(
                ident.as_str(),
                "Box" | "Rc" | "Arc" | "Mutex" | "RefCell" | "RwLock" | "Option" | "Cell"
            ) && let syn::PathArguments::AngleBracketed(args) = &last.arguments
                && let Some(syn::GenericArgument::Type(inner)) = args.args.first()
            {
                return type_name(inner, generics);
            }
            if p.path.segments.len() == 1
                && let Some((_, bound)) = generics.iter().rev().find(|(g, _)| *g == ident)
            {
                return Some(bound.clone());
            }
            Some(ident)
        }
        Type::ImplTrait(t) => first_trait(t.bounds.iter()),
        Type::TraitObject(t) => first_trait(t.bounds.iter()),
        _ => None,
    }
}

fn first_trait<'t>(bounds: impl Iterator<Item = &'t TypeParamBound>) -> Option<String> {
    bounds.into_iter().find_map(|b| match b {
        TypeParamBound::Trait(t) => t.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    })
}

/// The generic type parameters of `generics` with their first trait bound (inline or in the
/// `where` clause): `O: Optimizer<M, B>` -> `("O", "Optimizer")`.
pub(crate) fn generic_bounds(generics: &Generics) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for param in &generics.params {
        if let GenericParam::Type(t) = param
            && let Some(bound) = first_trait(t.bounds.iter())
        {
            out.push((t.ident.to_string(), bound));
        }
    }
    if let Some(clause) = &generics.where_clause {
        for pred in &clause.predicates {
            if let syn::WherePredicate::Type(p) = pred
                && let Type::Path(tp) = &p.bounded_ty
                && tp.path.segments.len() == 1
                && let Some(bound) = first_trait(p.bounds.iter())
            {
                let name = tp.path.segments[0].ident.to_string();
                if !out.iter().any(|(g, _)| *g == name) {
                    out.push((name, bound));
                }
            }
        }
    }
    out
}

/// Methods that return (a reference to) their receiver or the value inside it: the type and device
/// of the result are the receiver's.
pub(crate) fn is_passthrough_method(name: &str) -> bool {
    matches!(
        name,
        "clone"
            | "unwrap"
            | "expect"
            | "as_ref"
            | "as_mut"
            | "borrow"
            | "borrow_mut"
            | "lock"
            | "read"
            | "write"
            | "to_owned"
            | "into"
    )
}

/// Methods that move a tensor to the device of their argument: candle and burn `to_device`, tch
/// `to`, `to_device`, `to_device_`, `f_to_device` and `to_kind_device`. The one list of them.
pub fn is_transfer(name: &str) -> bool {
    matches!(
        name,
        "to_device" | "to" | "to_device_" | "f_to_device" | "to_kind_device"
    )
}
