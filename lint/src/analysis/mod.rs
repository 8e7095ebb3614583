//! The crate model the rules look at: parsed files, the facts one visitor pass collects from each
//! (imports, functions, loops, calls, device evidence, test code), and the crate-wide step-loop
//! analysis built from those facts.

mod collect;
pub mod device;
mod flow;
pub(crate) mod format;
pub mod frameworks;
pub mod patterns;
mod steps;
pub mod values;

use std::ops::Range;
use std::path::{Path, PathBuf};

use proc_macro2::Span;
use syn::spanned::Spanned;

use crate::config::Config;
use crate::diagnostic::Region;

pub(crate) use collect::{MAX_NESTING, collect_facts};
pub use device::{DeviceEvidence, DeviceKind};
pub use frameworks::{Framework, Frameworks};
pub(crate) use steps::{CrateAnalysis, ExternalFacts};
pub use values::TypeHint;

/// Index of a file in [`CrateContext::files`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileId(pub usize);

/// A parsed source file.
pub struct SourceFile {
    /// The path as the walk found it (joined with the path given on the command line).
    pub path: PathBuf,
    /// The file's text.
    pub source: String,
    /// The syntax tree.
    pub ast: syn::File,
    /// Bytes that `syn::parse_file` skipped before the tokens (BOM, shebang line).
    prefix_len: usize,
    /// Expressions parsed out of macro arguments (`println!("{}", t.to_scalar::<f32>()?)`).
    pub(crate) macro_exprs: typed_arena::Arena<syn::Expr>,
    /// Text of the called names, so each identifier is turned into a string once.
    pub(crate) names: typed_arena::Arena<u8>,
}

impl SourceFile {
    /// Parses `source`. The caller has already checked size, encoding and nesting depth.
    pub(crate) fn parse(path: PathBuf, source: String) -> Result<SourceFile, syn::Error> {
        let ast = syn::parse_file(&source)?;
        let prefix_len = skipped_prefix_len(&source);
        Ok(SourceFile {
            path,
            source,
            ast,
            prefix_len,
            macro_exprs: typed_arena::Arena::new(),
            names: typed_arena::Arena::new(),
        })
    }
}

/// What `syn::parse_file` strips before tokenizing: a BOM, then a shebang line (not `#![attr]`).
pub(crate) fn skipped_prefix_len(source: &str) -> usize {
    let mut skipped = 0;
    let mut rest = source;
    if let Some(stripped) = rest.strip_prefix('\u{feff}') {
        skipped += '\u{feff}'.len_utf8();
        rest = stripped;
    }
    if rest.starts_with("#!") && !rest[2..].trim_start().starts_with('[') {
        skipped += rest.find('\n').unwrap_or(rest.len());
    }
    skipped
}

/// A function or method (free fn, impl method, trait default method, nested fn).
#[derive(Debug)]
pub struct FnFact<'a> {
    /// The function's name.
    pub name: &'a syn::Ident,
    /// The last segment of the `impl` type, for methods.
    pub self_ty: Option<String>,
    /// The trait of the `impl Trait for Type` block the method is in (`TryFrom`, `Metric`).
    pub trait_name: Option<String>,
    /// Declared `pub` (or a trait's method): API that code outside the crate may call.
    pub is_pub: bool,
    /// The signature.
    pub sig: &'a syn::Signature,
    /// The body.
    pub block: &'a syn::Block,
    /// `#[test]`, `#[bench]`, or inside `#[cfg(test)]`.
    pub is_test: bool,
    /// The innermost enclosing function, for nested fns.
    pub parent: Option<usize>,
    /// CPU/GPU device mentions in the body (not counting arguments of `to_device`-like calls).
    pub device: DeviceEvidence,
    /// Names bound by `let` to a pinned host buffer (`alloc_pinned`, `pin_memory`).
    pub pinned_bindings: Vec<String>,
}

impl FnFact<'_> {
    /// `fn step` of an `impl TrainStep for ..`: burn's learner runs the step loop and calls it
    /// once per batch, so its body is a step loop's body.
    pub fn is_learner_step(&self) -> bool {
        self.name == "step" && self.trait_name.as_deref() == Some("TrainStep")
    }
}

/// A loop (or an iterator closure acting as one).
#[derive(Debug)]
pub struct LoopFact {
    /// The `for`/`while`/`loop` keyword, or the iterator method's name for closures.
    pub span: Span,
    /// The function containing the loop.
    pub fn_idx: Option<usize>,
    /// The enclosing loop in the same function.
    pub parent: Option<usize>,
}

/// A call expression the visitor saw: `recv.method(..)` or `path::to::func(..)`.
#[derive(Debug, Clone, Copy)]
pub enum CallRef<'a> {
    /// `receiver.method(args)`.
    Method(&'a syn::ExprMethodCall),
    /// `path(args)`; the path is the callee.
    Path(&'a syn::ExprCall, &'a syn::Path),
}

impl<'a> CallRef<'a> {
    /// The called name: the method, or the last segment of the path.
    pub fn name(&self) -> &'a syn::Ident {
        match self {
            CallRef::Method(m) => &m.method,
            CallRef::Path(_, path) => &path.segments[path.segments.len() - 1].ident,
        }
    }
    /// The arguments.
    pub fn args(&self) -> &'a syn::punctuated::Punctuated<syn::Expr, syn::Token![,]> {
        match self {
            CallRef::Method(m) => &m.args,
            CallRef::Path(c, _) => &c.args,
        }
    }
    /// The receiver of a method call.
    pub fn receiver(&self) -> Option<&'a syn::Expr> {
        match self {
            CallRef::Method(m) => Some(&m.receiver),
            CallRef::Path(..) => None,
        }
    }
    /// The callee path of a path call.
    pub fn path(&self) -> Option<&'a syn::Path> {
        match self {
            CallRef::Method(_) => None,
            CallRef::Path(_, p) => Some(p),
        }
    }
    /// The path segment before the name (`Tensor` in `Tensor::zeros`), for path calls.
    pub fn qualifier(&self) -> Option<&'a syn::Ident> {
        let path = self.path()?;
        let n = path.segments.len();
        (n >= 2).then(|| &path.segments[n - 2].ident)
    }
    /// The span of the name (method ident or last path segment): where findings point.
    pub fn name_span(&self) -> Span {
        self.name().span()
    }
    /// The span of the whole call expression.
    pub fn span(&self) -> Span {
        match self {
            CallRef::Method(m) => m.span(),
            CallRef::Path(c, _) => c.span(),
        }
    }
    /// The whole call as an expression, when it is one in the tree.
    pub fn is_method(&self) -> bool {
        matches!(self, CallRef::Method(_))
    }
}

/// What kind of guard makes code run less often than every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardKind {
    /// `if step % N == 0 { .. }`, or a condition computed with `%`.
    Modulo,
    /// `if step % N != 0 { return; }` (or `continue`): the rest of the block is guarded.
    EarlyReturn,
    /// An opt-in output option: `if settings.save_images { .. }`, `if args.debug { .. }`.
    Flag,
    /// `if counter == every { counter = 0; .. }`.
    Counter,
}

/// A call with where it sits.
#[derive(Debug, Clone, Copy)]
pub struct CallFact<'a> {
    /// The call.
    pub call: CallRef<'a>,
    /// The called name as text (method name, or last segment of the path; no `r#`). Compare this
    /// rather than formatting the identifier again.
    pub name: &'a str,
    /// The function containing it (None at item level, e.g. in a `const` initializer).
    pub fn_idx: Option<usize>,
    /// The innermost loop around it in the same function.
    pub loop_idx: Option<usize>,
    /// `Some(l)` when inside the `then` block of an `if x % N == 0` guard; `l` is the innermost loop
    /// that was around the guard (None: the guard is outside any loop of the function).
    pub guard: Option<Option<usize>>,
    /// The kind of the innermost guard (meaningful when `guard` is set).
    pub guard_kind: GuardKind,
    /// Inside test code.
    pub in_test: bool,
    /// Inside the arguments of a macro (`println!`, `format!`, ...).
    pub in_macro: bool,
    /// Inside code that runs only when something failed (`if let Err(..)`, an `Err(..)` match
    /// arm, an `is_err()` test, a `map_err`/`or_else`/`unwrap_or_else` closure).
    pub on_failure: bool,
    /// The receiver's type, for method calls, as far as the crate declares it.
    pub recv_ty: TypeHint<'a>,
    /// The device of the value the call works on (the receiver of a method call, the arguments of
    /// a path call), followed through bindings, chains, transfers and arithmetic in the function;
    /// symbolic where a parameter, a struct field or a returned value decides (resolved across
    /// the crate by [`CrateContext::operand_device`]).
    pub operand: values::Dev<'a>,
    /// For a transfer (`to_device(d)`, `to(d)`): the device of its destination, likewise.
    pub dest: values::Dev<'a>,
}

/// A local value formatted by a formatting macro (`println!("{loss}")`, `format!("{:?}", t)`), with
/// where the macro sits: formatting a tensor reads it back to the host.
#[derive(Debug, Clone, Copy)]
pub struct FormatFact<'a> {
    /// The formatted name.
    pub name: &'a str,
    /// Where the name is written (in the arguments, or in the format string when captured).
    pub region: Region,
    /// `Display` or `Debug`.
    pub how: format::Trait,
    /// The `let` binding the name refers to there, by the address of its initializer: compared
    /// with [`FileFacts::losses`].
    pub binding: usize,
    /// The device of the bound value.
    pub dev: values::Dev<'a>,
    /// The function containing the macro.
    pub fn_idx: Option<usize>,
    /// The innermost loop around it in the same function.
    pub loop_idx: Option<usize>,
    /// As [`CallFact::guard`].
    pub guard: Option<Option<usize>>,
    /// As [`CallFact::guard_kind`].
    pub guard_kind: GuardKind,
    /// Inside test code.
    pub in_test: bool,
    /// Inside code that runs only when something failed.
    pub on_failure: bool,
}

/// A struct literal's field value: `Trainer { device: dev, .. }`.
#[derive(Debug, Clone, Copy)]
pub struct FieldInit<'a> {
    /// The struct (for `Self { .. }`, the impl type).
    pub owner: &'a str,
    /// The field.
    pub field: &'a str,
    /// The device of the value stored.
    pub dev: values::Dev<'a>,
    /// The function the literal is in.
    pub fn_idx: Option<usize>,
}

impl<'a> CallFact<'a> {
    /// Whether the called name is `name`.
    pub fn is(&self, name: &str) -> bool {
        self.name == name
    }

    /// The call as findings name it: `Type::name` for a qualified path call, else the name.
    pub fn shown(&self) -> String {
        match self.call.qualifier() {
            Some(q) if !self.call.is_method() => format!("{q}::{}", self.name),
            _ => self.name.to_string(),
        }
    }
}

/// A struct declared in the crate: its named fields and their type names.
#[derive(Debug)]
pub struct StructFact<'a> {
    /// The struct's name.
    pub name: &'a str,
    /// `(field, type name)`; a generic field's type is its first trait bound.
    pub fields: Vec<(&'a str, &'a str)>,
    /// Set when a derive macro writes setters for the struct's fields (see [`SetterDerive`]).
    pub setters: Option<SetterDerive<'a>>,
}

/// Setters that a derive macro writes for a struct: `typed_builder`'s and `bon`'s
/// `Type::builder().field(x).build()`, `derive_builder`'s `TypeBuilder::default().field(x)`,
/// `derive_setters`' `value.field(x)`. A setter call stores its argument in the field, as a struct
/// literal would.
#[derive(Debug)]
pub struct SetterDerive<'a> {
    /// The derive: `TypedBuilder`, `Builder` or `Setters`.
    pub derive: &'a str,
    /// What the setters' names start with before the field's name (`#[setters(prefix = "with_")]`,
    /// `#[builder(setter(prefix = "with"))]`); empty when nothing.
    pub prefix: &'a str,
    /// Every named field.
    pub fields: Vec<&'a str>,
}

/// Where a chain of one-argument method calls starts, for setter calls (see [`SetterDerive`]).
#[derive(Debug, Clone, Copy)]
pub enum SetterRoot<'a> {
    /// A path call `Type::f(..)` (call number `.0` of the file, qualified by `.1`): the crate
    /// function's declared return type, or (a function the crate does not define, such as a
    /// derive's `builder()`) the type itself.
    Call(usize, &'a str),
    /// A value of a known type (`self.sampler.fill_x(..)`).
    Value(TypeHint<'a>),
}

/// A one-argument method call at the end of a chain whose start is known: a setter when the type
/// the chain starts from has derived setters of that name.
#[derive(Debug, Clone, Copy)]
pub struct SetterCall<'a> {
    /// The call's index in the file's calls.
    pub call: usize,
    /// Where its chain starts.
    pub root: SetterRoot<'a>,
}

/// Everything the single visitor pass collects from one file.
#[derive(Debug, Default)]
pub struct FileFacts<'a> {
    /// Frameworks the file's `use` items (and fully qualified paths) name.
    pub frameworks: Frameworks,
    /// Functions and methods, in source order.
    pub fns: Vec<FnFact<'a>>,
    /// Loops, in source order.
    pub loops: Vec<LoopFact>,
    /// Calls, in source order.
    pub calls: Vec<CallFact<'a>>,
    /// Device mentions at item level, outside functions (type aliases, consts, statics), outside
    /// test code. Mentions inside a function count for that function only.
    pub device: DeviceEvidence,
    /// Structs declared in the file.
    pub structs: Vec<StructFact<'a>>,
    /// Struct literals' field values, with their devices.
    pub field_inits: Vec<FieldInit<'a>>,
    /// One-argument method calls that may be derived setters, in call order.
    pub setter_calls: Vec<SetterCall<'a>>,
    /// Per call whose arguments' devices say something (index in `calls`): where in
    /// `arg_dev_pool` each argument's device is. A call with arguments and no entry passes only
    /// values of unknown device.
    pub arg_devs: Vec<(usize, Range<usize>)>,
    /// What each function returns (its tail expression, its `return`s): (function, device).
    pub returns: Vec<(usize, values::Dev<'a>)>,
    /// The argument devices `arg_devs` points into.
    pub arg_dev_pool: Vec<values::Dev<'a>>,
    /// Spans of test items (`#[test]` fns, `#[cfg(test)]` modules and impls).
    pub test_spans: Vec<Span>,
    /// The whole file is test code: it belongs to an integration-test or benchmark target (under
    /// the `tests/` or `benches/` directory of its package), helpers without `#[test]` included.
    pub test_file: bool,
    /// Set when the tree nests deeper than the analysis follows; the file is reported as an error.
    pub too_deep: Option<Span>,
    /// Names the file's `use` items bring into scope with the module they come from, as written
    /// (`("CTCLoss", "crate::burn_ext::ctc")` for `use crate::burn_ext::ctc::CTCLoss;`).
    pub use_paths: Vec<(&'a str, &'a str)>,
    /// Local values formatted by formatting macros, in source order.
    pub formats: Vec<FormatFact<'a>>,
    /// The `let` bindings differentiated (`loss.backward()`, `opt.backward_step(&loss)`), by the
    /// address of their initializer, with the index of that call: the values that are losses.
    pub losses: Vec<(usize, usize)>,
}

impl<'a> FileFacts<'a> {
    /// The devices of call `call`'s arguments, when one of them says something (`None`: every
    /// argument is of unknown device).
    pub fn arg_devs_of(&self, call: usize) -> Option<&[values::Dev<'a>]> {
        let at = self
            .arg_devs
            .binary_search_by_key(&call, |(c, _)| *c)
            .ok()?;
        Some(&self.arg_dev_pool[self.arg_devs[at].1.clone()])
    }

    /// The index of the innermost function whose body contains byte offset `at`.
    pub fn innermost_fn(&self, at: usize) -> Option<usize> {
        self.fns
            .iter()
            .enumerate()
            .filter(|(_, f)| f.block.span().byte_range().contains(&at))
            .min_by_key(|(_, f)| f.block.span().byte_range().len())
            .map(|(i, _)| i)
    }
}

/// A parsed file with its facts.
pub struct CrateFile<'a> {
    /// The file's id in the crate.
    pub id: FileId,
    /// The parsed file.
    pub file: &'a SourceFile,
    /// What the visitor collected.
    pub facts: FileFacts<'a>,
}

impl<'a> CrateFile<'a> {
    /// The file's path.
    pub fn path(&self) -> &'a Path {
        &self.file.path
    }
    /// The file's text.
    pub fn source(&self) -> &'a str {
        &self.file.source
    }
    /// The syntax tree.
    pub fn ast(&self) -> &'a syn::File {
        &self.file.ast
    }
}

/// Where a call reached from a step loop sits, as [`CrateContext::step_loop`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepHit {
    /// File of the step loop.
    pub loop_file: FileId,
    /// Region of the step loop's keyword (or iterator method).
    pub loop_region: Region,
    /// The loop encloses another step loop (a per-epoch loop): the code runs once per epoch.
    pub outer: bool,
    /// The code sits under an `if step % N == 0` guard inside the loop (or in the called function).
    pub guarded: bool,
    /// What kind of guard, when `guarded`.
    pub guard_kind: GuardKind,
    /// The functions called from the loop to reach the code, outermost first (empty: directly in
    /// the loop body).
    pub via: Vec<String>,
}

impl StepHit {
    /// True when the code runs on every step: innermost step loop, no `% N == 0` guard.
    pub fn is_per_step(&self) -> bool {
        !self.outer && !self.guarded
    }

    /// The notes a finding should carry: which loop, through which calls, and why it was lowered.
    pub fn notes(&self, cx: &CrateContext<'_>) -> Vec<String> {
        let mut notes = Vec::new();
        let at = format!(
            "{}:{}",
            cx.file(self.loop_file).path().display(),
            self.loop_region.line
        );
        let place = if self.outer {
            format!("the epoch loop at {at}")
        } else {
            format!("the step loop at {at}")
        };
        if self.via.is_empty() {
            notes.push(format!("inside {place}"));
        } else {
            let chain = self
                .via
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(" -> ");
            notes.push(format!("called from {place} through {chain}"));
        }
        if self.outer {
            notes.push(
                "it encloses the per-batch step loop, so this runs once per epoch and is \
                 reported as a note"
                    .to_string(),
            );
        }
        if self.guarded {
            notes.push(
                match self.guard_kind {
                    GuardKind::Modulo => {
                        "this runs only under an `if ... % N == 0` guard (once every N \
                         iterations), so it is reported as a note"
                    }
                    GuardKind::EarlyReturn => {
                        "this runs only past an early `return`/`continue` on a `% N` condition \
                         (every N steps), so it is reported as a note"
                    }
                    GuardKind::Counter => {
                        "this runs only when a counter reaches its period (it is reset in the same \
                         branch), so it is reported as a note"
                    }
                    GuardKind::Flag => {
                        "this runs only when an output option is on (an `if` on a debug/save \
                         flag), so it is reported as a note"
                    }
                }
                .to_string(),
            );
        }
        notes
    }
}

/// One crate (the `.rs` files of one Cargo package) as the rules see it.
pub struct CrateContext<'a> {
    /// The package's root directory (where its `Cargo.toml` is).
    pub(crate) root: &'a Path,
    pub(crate) files: &'a [CrateFile<'a>],
    pub(crate) config: &'a Config,
    pub(crate) analysis: &'a CrateAnalysis,
    pub(crate) crate_frameworks: Frameworks,
}

impl<'a> CrateContext<'a> {
    /// A file's path relative to the package root (the path itself when it lies elsewhere).
    pub fn package_path(&self, file: FileId) -> &'a Path {
        let path = self.file(file).path();
        let abs = crate::walk::absolute_path(path);
        let root = crate::walk::absolute_path(self.root);
        abs.strip_prefix(&root)
            .ok()
            .map(|rel| rel.to_path_buf())
            .map(|rel| -> &'a Path {
                // Interned for the context's lifetime in the file's name arena.
                let text = rel.to_string_lossy();
                Path::new(&*self.file(file).file.names.alloc_str(&text))
            })
            .unwrap_or(path)
    }

    /// The crate functions that call number `index` of `file` reaches, as (file, function index).
    pub fn targets(
        &self,
        file: FileId,
        index: usize,
    ) -> impl Iterator<Item = (FileId, usize)> + 'a {
        self.analysis
            .targets_of(file, index)
            .iter()
            .map(|&(f, i)| (FileId(f), i))
    }

    /// The calls of the crate that reach function `fn_idx` of `file`: (file, call index).
    pub fn call_sites(
        &self,
        file: FileId,
        fn_idx: usize,
    ) -> impl Iterator<Item = (FileId, usize)> + 'a {
        self.analysis
            .call_sites_of(file, fn_idx)
            .iter()
            .map(|&(f, c)| (FileId(f), c))
    }

    /// Whether function `fn_idx` of `file` makes a training step: a step marker in its body or in
    /// the crate functions it calls (the body of a step, called once per step by a loop that may
    /// be outside the crate).
    pub fn trains(&self, file: FileId, fn_idx: usize) -> bool {
        self.analysis.trains(file, fn_idx)
    }

    /// The crate's methods named `name`, as (file, function index): what a call through a trait
    /// object or a generic may reach.
    pub fn methods_named(&self, name: &str) -> impl Iterator<Item = (FileId, usize)> + 'a {
        self.analysis
            .methods_named(name)
            .iter()
            .map(|&(f, i)| (FileId(f), i))
    }

    /// The crate's free functions named `name`, as (file, function index).
    pub fn free_fns_named(&self, name: &str) -> impl Iterator<Item = (FileId, usize)> + 'a {
        self.analysis
            .free_fns_named(name)
            .iter()
            .map(|&(f, i)| (FileId(f), i))
    }

    /// The program (build target) a file belongs to: the library and `src/main.rs` share one,
    /// each example, binary, test and benchmark has its own. An opaque index.
    pub fn program(&self, file: FileId) -> usize {
        self.analysis.program_of(file)
    }

    /// The crate's parsed files, in path order.
    pub fn files(&self) -> &'a [CrateFile<'a>] {
        self.files
    }

    /// One file.
    pub fn file(&self, id: FileId) -> &'a CrateFile<'a> {
        &self.files[id.0]
    }

    /// Every call of the crate with its file, in file order then source order.
    pub fn calls(&self) -> impl Iterator<Item = (FileId, &'a CallFact<'a>)> + 'a {
        self.files
            .iter()
            .flat_map(|f| f.facts.calls.iter().map(move |c| (f.id, c)))
    }

    /// The output helpers of the crate (conversion impls, `save`/`write_*`/`log_*`/`print_*`
    /// functions) that call number `index` of `file` reaches, with their files. Reach does not
    /// continue into them: a rule that cares reports the call itself.
    pub fn helper_targets(
        &self,
        file: FileId,
        index: usize,
    ) -> impl Iterator<Item = (FileId, &'a FnFact<'a>)> + 'a {
        let files = self.files;
        self.analysis
            .helper_targets(file, index)
            .iter()
            .map(move |&(f, idx)| (FileId(f), &files[f].facts.fns[idx]))
    }

    /// The path calls outside test code whose callee is qualified (`Type::name(..)`), with the
    /// callee path and its last two segments (`Type`, `name`) as text, in the order of
    /// [`Self::calls`].
    pub fn qualified_calls(
        &self,
    ) -> impl Iterator<Item = (FileId, &'a syn::Path, String, String)> + 'a {
        self.calls().filter_map(|(file, call)| {
            if call.in_test {
                return None;
            }
            let path = call.call.path()?;
            let ty = call.call.qualifier()?;
            Some((file, path, ty.to_string(), call.call.name().to_string()))
        })
    }

    /// The configuration in force for this crate.
    pub fn config(&self) -> &'a Config {
        self.config
    }

    /// The minimum batch size below which a literal batch size is reported (`min-batch-size`).
    pub fn min_batch_size(&self) -> usize {
        self.config.min_batch_size
    }

    /// Frameworks used anywhere in the crate (`use` items and the package's dependencies).
    pub fn crate_frameworks(&self) -> Frameworks {
        self.crate_frameworks
    }

    /// Whether code in `file` should be read as `framework` code: the file imports it, or the file
    /// imports no framework at all and the crate uses it. Use this to decide what a method name that
    /// several libraries share means (`into_data` is burn only where burn is in scope).
    pub fn uses(&self, file: FileId, framework: Framework) -> bool {
        let own = self.file(file).facts.frameworks;
        if own.contains(framework) {
            return true;
        }
        own.is_empty() && self.crate_frameworks.contains(framework)
    }

    /// The source region of a span (1-based lines and columns, end exclusive).
    pub fn region(&self, span: Span) -> Region {
        region_of(span)
    }

    /// The source region of a syntax node (from its first to its last token).
    pub fn region_of<T: Spanned>(&self, node: &T) -> Region {
        region_of(node.span())
    }

    /// Byte offsets of a span in the file's source (for [`crate::Edit`]s).
    pub fn byte_range(&self, file: FileId, span: Span) -> Range<usize> {
        let range = span.byte_range();
        let base = self.file(file).file.prefix_len;
        range.start + base..range.end + base
    }

    /// The source text of a span.
    pub fn text(&self, file: FileId, span: Span) -> &'a str {
        let range = self.byte_range(file, span);
        self.file(file).source().get(range).unwrap_or("")
    }

    /// Whether a span lies in test code (`#[test]`/`#[bench]` fn, `#[cfg(test)]` module or impl).
    pub fn is_test_code(&self, file: FileId, span: Span) -> bool {
        let facts = &self.file(file).facts;
        if facts.test_file {
            return true;
        }
        let at = span.byte_range().start;
        facts
            .test_spans
            .iter()
            .any(|t| t.byte_range().contains(&at))
    }

    /// Where a call sits relative to the crate's step loops: directly in one, or in a function
    /// (transitively) called from one. None when it is not reached from a step loop, or is test code.
    pub fn step_loop(&self, file: FileId, call: &CallFact<'_>) -> Option<StepHit> {
        self.analysis.step_hit(self, file, call)
    }

    /// Whether the device of code at `call` is statically the CPU: the enclosing function (or the
    /// function of the step loop that calls it, or the file's items, or the crate's items, whichever
    /// first mentions a device) mentions only CPU devices (`Device::Cpu`, `kind::FLOAT_CPU`, burn
    /// `NdArray`/`Flex`). Item level means type aliases, consts and statics outside functions.
    pub fn is_statically_cpu(&self, file: FileId, call: &CallFact<'_>) -> bool {
        self.analysis.is_statically_cpu(self, file, call)
    }

    /// The device of a call's operand (see [`CallFact::operand`]), with parameters and
    /// struct fields settled across the crate; [`DeviceKind::Unknown`] when nothing says.
    pub fn operand_device(&self, file: FileId, call: &CallFact<'_>) -> DeviceKind {
        self.analysis
            .resolve_now(self.files, file, call, call.operand)
    }

    /// The device of a transfer's destination (`d` in `x.to_device(d)`), with parameters and
    /// struct fields settled across the crate; [`DeviceKind::Unknown`] when nothing says.
    pub fn dest_device(&self, file: FileId, call: &CallFact<'_>) -> DeviceKind {
        self.analysis.resolve_now(self.files, file, call, call.dest)
    }

    /// Whether the destination of a transfer call (`x.to_device(d)`) is statically the CPU: the
    /// destination's own device when known, else as [`Self::is_statically_cpu`] falls back.
    pub fn destination_is_cpu(&self, file: FileId, call: &CallFact<'_>) -> bool {
        match self.dest_device(file, call) {
            DeviceKind::Cpu => true,
            DeviceKind::Gpu => false,
            DeviceKind::Unknown => self.analysis.program_is_cpu(file),
        }
    }

    /// [`Self::device_step_loop`] for an upload: a transfer (`t.to_device(d)`) counts by its
    /// destination's device, any other call by its operands'.
    pub fn upload_step_loop(&self, file: FileId, call: &CallFact<'_>) -> Option<StepHit> {
        let hit = self.step_loop(file, call)?;
        let transfer = call.call.is_method() && values::is_transfer(call.name);
        let on_cpu = if transfer {
            self.destination_is_cpu(file, call)
        } else {
            self.is_statically_cpu(file, call)
        };
        (!on_cpu).then_some(hit)
    }

    /// [`Self::step_loop`] for work on an accelerator: also None when the device at `call` is
    /// statically the CPU ([`Self::is_statically_cpu`]).
    pub fn device_step_loop(&self, file: FileId, call: &CallFact<'_>) -> Option<StepHit> {
        let hit = self.step_loop(file, call)?;
        (!self.is_statically_cpu(file, call)).then_some(hit)
    }

    /// What device an expression names: `&Device::Cpu`, `kind::FLOAT_CUDA`, `(Kind::Float, Device::Cpu)`,
    /// `&device` (a binding: [`DeviceKind::Unknown`]).
    pub fn device_of(&self, expr: &syn::Expr) -> DeviceKind {
        device::device_of_expr(expr)
    }

    /// The function a call sits in.
    pub fn fn_of(&self, file: FileId, call: &CallFact<'_>) -> Option<&'a FnFact<'a>> {
        call.fn_idx.map(|i| &self.file(file).facts.fns[i])
    }
}

/// Converts a span to a [`Region`] (1-based, end exclusive).
pub(crate) fn region_of(span: Span) -> Region {
    let start = span.start();
    let end = span.end();
    Region {
        line: start.line.max(1),
        column: start.column + 1,
        end_line: end.line.max(1),
        end_column: end.column + 1,
    }
}

/// The last two segments of a call path without generics, joined by `::`: `Tensor::zeros`,
/// `Tensor::<1>::from_floats` -> `Tensor::from_floats`, `CudaContext::new`.
pub(crate) fn path_text(path: &syn::Path) -> String {
    let n = path.segments.len();
    path.segments
        .iter()
        .skip(n.saturating_sub(2))
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

thread_local! {
    static IDENT_BUF: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Runs `f` on an identifier's text without allocating (a per-thread buffer).
pub(crate) fn with_ident_str<R>(ident: &syn::Ident, f: impl FnOnce(&str) -> R) -> R {
    use std::fmt::Write;
    IDENT_BUF.with(|buf| match buf.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            let _ = write!(buf, "{ident}");
            let text = buf.strip_prefix("r#").unwrap_or(&buf);
            f(text)
        }
        // Re-entered from inside `f`: fall back to an allocation.
        Err(_) => {
            let text = ident.to_string();
            f(text.strip_prefix("r#").unwrap_or(&text))
        }
    })
}
