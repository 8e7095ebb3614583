//! The single visitor pass over a file that collects every fact the rules and the step-loop analysis
//! need: imports, functions, loops, calls with their context, guards, test code and device mentions.

use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, Token};

use super::device::{DeviceKind, device_of_path, device_of_path_named};
use super::frameworks::{Framework, Frameworks};
use super::patterns::binding_name;
use super::values::{
    Binding, Dev, DevSym, TypeHint, generic_bounds, is_optimizer_builder, is_passthrough_method,
    is_transfer, merge_devs, type_name,
};
use super::{
    CallFact, CallRef, FileFacts, FnFact, GuardKind, LoopFact, SetterCall, SetterDerive,
    SetterRoot, SourceFile, StructFact, with_ident_str,
};

/// Deepest expression, type or pattern nesting the analysis follows. Deeper files are reported as
/// errors ("nesting too deep") instead of risking the stack.
pub(crate) const MAX_NESTING: usize = 2000;

/// The hasher of the collector's maps: byte offsets and names, not attacker-chosen keys.
type FastHash = std::hash::BuildHasherDefault<super::steps::NameHasher>;

/// Deepest expression the type and device inference looks into.
const MAX_INFER_DEPTH: usize = 48;

/// Collects the facts of one parsed file. `test_file`: the file belongs to a test or benchmark
/// target, so all of it is test code.
pub(crate) fn collect_facts(file: &SourceFile, test_file: bool) -> FileFacts<'_> {
    collect_facts_with(file, test_file, true)
}

/// [`collect_facts`], keeping each call's device once worked out (`memo`) or working every one
/// out again each time it is asked for (the reference the memo must agree with).
fn collect_facts_with(file: &SourceFile, test_file: bool, memo: bool) -> FileFacts<'_> {
    let source = file.source.get(file.prefix_len..).unwrap_or("");
    // Every call has its own `(` in the text (calls in macro arguments too, parsed from it): room
    // for that many calls up front, so that the table of calls is never copied as it grows.
    let parens = memchr::memchr_iter(b'(', source.as_bytes()).count();
    let mut collector = Collector {
        source,
        line_starts: None,
        arena: &file.macro_exprs,
        names: &file.names,
        facts: FileFacts {
            test_file,
            calls: Vec::with_capacity(parens),
            ..FileFacts::default()
        },
        fn_stack: Vec::new(),
        loop_stack: Vec::new(),
        guard_stack: Vec::new(),
        self_ty: Vec::new(),
        self_ty_interned: Vec::new(),
        interned: Default::default(),
        call_at: Default::default(),
        dev_memo: std::cell::RefCell::new(Vec::with_capacity(parens)),
        infer_depth: Default::default(),
        infer_peak: Default::default(),
        memo_off: std::cell::Cell::new(!memo),
        failure_depth: 0,
        trait_of_impl: Vec::new(),
        generics: Vec::new(),
        scopes: Scopes::default(),
        test_depth: usize::from(test_file),
        depth: 0,
        macro_depth: 0,
        device_arg_depth: 0,
        in_expr_path: false,
    };
    collector.visit_file(&file.ast);
    // Devices are filled in after the calls inside them: restore call order.
    collector.facts.arg_devs.sort_by_key(|(call, _)| *call);
    collector.facts
}

struct Collector<'a> {
    /// The file's text as the parser saw it (after a BOM or shebang line): spans' byte offsets
    /// index it.
    source: &'a str,
    /// The byte offset of each line of `source`, once a macro needs them.
    line_starts: Option<Vec<usize>>,
    arena: &'a typed_arena::Arena<Expr>,
    names: &'a typed_arena::Arena<u8>,
    facts: FileFacts<'a>,
    fn_stack: Vec<usize>,
    loop_stack: Vec<usize>,
    /// Guards around the code being visited: the innermost loop around each guard, and its kind.
    guard_stack: Vec<(Option<usize>, GuardKind)>,
    self_ty: Vec<Option<String>>,
    /// The innermost impl type, interned once per impl.
    self_ty_interned: Vec<Option<&'a str>>,
    /// Inside code that runs only when something failed (`if let Err(..)`, an `Err(..)` arm, a
    /// `map_err`/`or_else`/`unwrap_or_else` closure): not per-step code.
    failure_depth: usize,
    /// How deep the type and device inference currently is.
    infer_depth: std::cell::Cell<usize>,
    /// The deepest [`Self::infer_depth`] the inference under way has checked (see [`DevMemo`]).
    infer_peak: std::cell::Cell<usize>,
    /// The device of each recorded call's value, by call number, once worked out: an outer call
    /// of a chain (`a.b().c().d()`) reads its receiver's device here instead of walking the inner
    /// chain again.
    dev_memo: std::cell::RefCell<Vec<Option<DevMemo<'a>>>>,
    /// Set to work every device out afresh: while a memo hit is checked against a fresh
    /// working-out (debug builds), or to compare with the memo (tests).
    memo_off: std::cell::Cell<bool>,
    /// Calls recorded so far, by their name's identifier (see [`ident_key`]): to refer to a
    /// call's value.
    call_at: std::collections::HashMap<usize, usize, FastHash>,
    /// Interned strings by text, so that a name seen again is not copied again.
    interned: std::cell::RefCell<std::collections::HashMap<Box<str>, &'a str, FastHash>>,
    /// The trait of each enclosing `impl Trait for Type` (None for inherent impls).
    trait_of_impl: Vec<Option<String>>,
    /// Generic parameters in scope with their first bound, innermost last.
    generics: Vec<(String, String)>,
    /// Local bindings in scope, one frame per block, function or closure.
    scopes: Scopes<'a>,
    test_depth: usize,
    depth: usize,
    macro_depth: usize,
    device_arg_depth: usize,
    /// Set while visiting the path of a path expression (not its generic arguments' types).
    in_expr_path: bool,
}

/// A call's device as [`Collector::infer_dev`] worked it out, and what that depended on besides
/// the call's own syntax (and the calls inside it, recorded before it is asked for): the local
/// bindings in scope, the frameworks seen so far, and how deep the working-out went.
#[derive(Debug, Clone, Copy)]
struct DevMemo<'a> {
    dev: Dev<'a>,
    /// Levels of inference below the call that the working-out checked: asked again from `d`
    /// levels down, the same working-out would go to `d + height`, and gives the same device
    /// when that is within [`MAX_INFER_DEPTH`].
    height: usize,
    /// [`Scopes::version`] when it was worked out.
    scope: u64,
    frameworks: Frameworks,
}

/// The local bindings in scope, one frame per block, function or closure, with a version that
/// names the set of bindings visible: two moments with the same version see the same bindings.
/// Every change takes a fresh number; leaving a frame gives back the number from before it was
/// entered (whatever was added since went into it or into frames inside it, left with it).
#[derive(Default)]
struct Scopes<'a> {
    frames: Vec<Vec<Binding<'a>>>,
    version: u64,
    /// The last number given out.
    last: u64,
    /// The version before each frame was entered.
    saved: Vec<u64>,
}

impl<'a> Scopes<'a> {
    fn renumber(&mut self) {
        self.last += 1;
        self.version = self.last;
    }

    fn push(&mut self, frame: Vec<Binding<'a>>) {
        self.saved.push(self.version);
        // An empty frame hides nothing and shows nothing new.
        if !frame.is_empty() {
            self.renumber();
        }
        self.frames.push(frame);
    }

    fn pop(&mut self) {
        self.frames.pop();
        if let Some(version) = self.saved.pop() {
            self.version = version;
        }
    }

    /// Adds bindings to the innermost frame (none when there is no frame).
    fn extend(&mut self, bindings: impl IntoIterator<Item = Binding<'a>>) {
        let Some(frame) = self.frames.last_mut() else {
            return;
        };
        let before = frame.len();
        frame.extend(bindings);
        if frame.len() != before {
            self.renumber();
        }
    }

    /// Swaps in the frames of a function body (a nested fn does not see the enclosing function's
    /// locals); [`Self::restore`] puts back what this returns.
    fn replace(&mut self, frames: Vec<Vec<Binding<'a>>>) -> (Vec<Vec<Binding<'a>>>, u64) {
        let outer = std::mem::replace(&mut self.frames, frames);
        let version = self.version;
        self.renumber();
        (outer, version)
    }

    fn restore(&mut self, (frames, version): (Vec<Vec<Binding<'a>>>, u64)) {
        self.frames = frames;
        self.version = version;
    }

    /// The innermost binding whose name `is_named` accepts.
    fn lookup_by(&self, is_named: impl Fn(&str) -> bool) -> Option<Binding<'a>> {
        self.frames
            .iter()
            .rev()
            .flat_map(|frame| frame.iter().rev())
            .find(|b| is_named(b.name))
            .copied()
    }

    fn lookup_str(&self, name: &str) -> Option<Binding<'a>> {
        self.lookup_by(|b| b == name)
    }

    fn lookup(&self, name: &syn::Ident) -> Option<Binding<'a>> {
        // Compared in place (an identifier compares with a `&str` without being formatted).
        self.lookup_by(|b| name == b)
    }
}

/// What a method's name says of the device of its value.
enum MethodDev {
    /// A transfer: where its argument is.
    Transfer,
    /// `.cuda()`, `.cpu()`.
    Known(DeviceKind),
    /// What the call returns.
    Returned,
}

/// What a method's name says of the type of its value.
enum MethodTy {
    /// The receiver's type (`clone`, `unwrap`, `with_..`, `set_..`).
    Receiver,
    /// An optimizer when the receiver is an optimizer builder (`init`, `build`).
    Builder,
    Unknown,
}

/// Iterator methods whose closure argument runs once per element.
fn is_iteration_method(name: &str) -> IterationMethod {
    match name {
        "for_each" | "try_for_each" | "for_each_init" | "try_for_each_init" | "for_each_with"
        | "try_for_each_with" | "fold" | "try_fold" => IterationMethod::Always,
        "map" | "filter_map" | "flat_map" | "filter" | "inspect" | "scan" | "take_while"
        | "map_while" | "skip_while" | "partition" | "any" | "all" | "position" | "find_map" => {
            IterationMethod::IfIterator
        }
        _ => IterationMethod::No,
    }
}

#[derive(PartialEq)]
enum IterationMethod {
    Always,
    IfIterator,
    No,
}

/// Whether a method receiver is an iterator over many items (so `map` on it is a loop, not
/// `Option::map`): an iterator-producing call in the chain, a range, or a name like `batches`.
fn is_iterator_like(expr: &Expr) -> bool {
    match expr {
        Expr::MethodCall(m) => {
            with_ident_str(&m.method, |name| {
                matches!(
                    name,
                    "iter"
                        | "into_iter"
                        | "iter_mut"
                        | "par_iter"
                        | "into_par_iter"
                        | "par_iter_mut"
                        | "par_bridge"
                        | "enumerate"
                        | "zip"
                        | "chunks"
                        | "chunks_exact"
                        | "windows"
                        | "skip"
                        | "take"
                        | "step_by"
                        | "rev"
                        | "filter"
                        | "map"
                        | "batches"
                        | "iter_batches"
                        | "drain"
                        | "lines"
                        | "chain"
                        | "cycle"
                )
            }) || is_iterator_like(&m.receiver)
        }
        Expr::Range(_) => true,
        Expr::Paren(p) => is_iterator_like(&p.expr),
        Expr::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| names_a_collection(&s.ident)),
        Expr::Field(f) => match &f.member {
            syn::Member::Named(ident) => names_a_collection(ident),
            syn::Member::Unnamed(_) => false,
        },
        Expr::Reference(r) => is_iterator_like(&r.expr),
        _ => false,
    }
}

fn names_a_collection(ident: &syn::Ident) -> bool {
    with_ident_str(ident, |name| {
        let lower = name.to_ascii_lowercase();
        [
            "batch", "loader", "items", "samples", "dataset", "examples", "epochs", "steps",
        ]
        .iter()
        .any(|word| lower.contains(word))
    })
}

/// `if step % N == 0` (also `(i + 1) % n == 0`, `n == step % k`, `step.is_multiple_of(N)`, possibly
/// combined with `&&`/`||`).
fn is_modulo_guard(cond: &Expr) -> bool {
    match cond {
        Expr::Binary(b) => match b.op {
            syn::BinOp::Eq(_) => is_rem(&b.left) || is_rem(&b.right),
            syn::BinOp::And(_) | syn::BinOp::Or(_) => {
                is_modulo_guard(&b.left) || is_modulo_guard(&b.right)
            }
            _ => false,
        },
        Expr::Paren(p) => is_modulo_guard(&p.expr),
        Expr::MethodCall(m) => m.method == "is_multiple_of",
        _ => false,
    }
}

/// `if let Err(..) = x`, `if x.is_err()`: the branch runs only when something failed.
fn is_failure_test(cond: &Expr) -> bool {
    match cond {
        Expr::Let(l) => is_err_pattern(&l.pat),
        Expr::MethodCall(m) => m.method == "is_err",
        Expr::Paren(p) => is_failure_test(&p.expr),
        Expr::Binary(b) if matches!(b.op, syn::BinOp::And(_)) => {
            is_failure_test(&b.left) || is_failure_test(&b.right)
        }
        _ => false,
    }
}

/// `Err(..)` (also `Err(_) | ..`).
fn is_err_pattern(pat: &syn::Pat) -> bool {
    match pat {
        syn::Pat::TupleStruct(t) => t.path.segments.last().is_some_and(|s| s.ident == "Err"),
        syn::Pat::Or(o) => o.cases.iter().all(is_err_pattern),
        _ => false,
    }
}

/// `x as usize` -> `x`.
fn strip_cast(expr: &Expr) -> &Expr {
    match expr {
        Expr::Cast(c) => strip_cast(&c.expr),
        Expr::Paren(p) => strip_cast(&p.expr),
        _ => expr,
    }
}

/// A block that ends by leaving: `return ..`, `continue`, `break`.
fn exits_early(block: &syn::Block) -> bool {
    match block.stmts.last() {
        Some(syn::Stmt::Expr(e, _)) => {
            matches!(e, Expr::Return(_) | Expr::Continue(_) | Expr::Break(_))
        }
        _ => false,
    }
}

/// A condition that is an opt-in output option: a boolean field or variable named for debug or
/// output (`settings.save_train_mask`, `args.debug`, `verbose`, `self.dump_images`).
fn is_output_flag(cond: &Expr) -> bool {
    let ident = match cond {
        Expr::Path(p) if p.path.segments.len() == 1 => &p.path.segments[0].ident,
        Expr::Field(f) => match &f.member {
            syn::Member::Named(ident) => ident,
            syn::Member::Unnamed(_) => return false,
        },
        Expr::Paren(p) => return is_output_flag(&p.expr),
        // A verbosity level above a threshold (`self.verbose_level >= 2`, `args.debug > 0`,
        // `1 < verbosity`, `log_level == 3`): opt-in output, as the flag alone. Below a
        // threshold or equal to 0 it is the default, not an opt-in.
        Expr::Binary(b) => {
            let literal = |e: &Expr| matches!(e, Expr::Lit(_));
            let nonzero = |e: &Expr| matches!(e, Expr::Lit(l) if matches!(&l.lit, syn::Lit::Int(i) if i.base10_digits() != "0"));
            return match b.op {
                syn::BinOp::Ge(_) | syn::BinOp::Gt(_) => {
                    literal(&b.right) && is_output_flag(&b.left)
                }
                syn::BinOp::Le(_) | syn::BinOp::Lt(_) => {
                    literal(&b.left) && is_output_flag(&b.right)
                }
                syn::BinOp::Eq(_) => {
                    (nonzero(&b.right) && is_output_flag(&b.left))
                        || (nonzero(&b.left) && is_output_flag(&b.right))
                }
                _ => false,
            };
        }
        _ => return false,
    };
    with_ident_str(ident, |name| {
        let lower = name.to_ascii_lowercase();
        [
            "debug", "verbose", "dump", "save", "visual", "plot", "trace", "show", "print",
        ]
        .iter()
        .any(|w| lower.contains(w))
    })
}

fn is_rem(expr: &Expr) -> bool {
    match expr {
        Expr::Binary(b) => matches!(b.op, syn::BinOp::Rem(_)),
        Expr::Paren(p) => is_rem(&p.expr),
        _ => false,
    }
}

/// `#[test]`, `#[bench]`, `#[tokio::test]`, `#[rstest]`, ... or `#[cfg(test)]`.
fn is_test_attr(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        let Some(last) = path.segments.last() else {
            return false;
        };
        if last.ident == "test" || last.ident == "bench" || last.ident == "rstest" {
            return true;
        }
        is_cfg_test(attr)
    })
}

fn is_cfg_test(attr: &syn::Attribute) -> bool {
    if !attr.path().is_ident("cfg") {
        return false;
    }
    let syn::Meta::List(list) = &attr.meta else {
        return false;
    };
    let text = list.tokens.to_string();
    // `cfg(test)`, `cfg(all(test, ..))`; not `cfg(not(test))`.
    text.split(|c: char| !c.is_alphanumeric() && c != '_')
        .any(|word| word == "test")
        && !text.contains("not")
}

fn has_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(is_cfg_test)
}

/// Macros whose arguments are ordinary comma-separated expressions.
fn is_expression_macro(path: &syn::Path) -> bool {
    let Some(last) = path.segments.last() else {
        return false;
    };
    with_ident_str(&last.ident, |name| {
        matches!(
            name,
            "println"
                | "print"
                | "eprintln"
                | "eprint"
                | "format"
                | "write"
                | "writeln"
                | "format_args"
                | "panic"
                | "assert"
                | "assert_eq"
                | "assert_ne"
                | "debug_assert"
                | "debug_assert_eq"
                | "debug_assert_ne"
                | "vec"
                | "dbg"
                | "info"
                | "warn"
                | "debug"
                | "trace"
                | "error"
                | "log"
                | "bail"
                | "anyhow"
                | "ensure"
        )
    })
}

/// Whether the text of macro arguments holds only tokens that cannot form anything the visitor
/// records: string literals, numbers, identifiers that are not keywords, and operator
/// punctuation. Every call and every struct literal, closure, block, macro call, qualified path,
/// field access, cast or `let` needs a bracket, a `.`, a `:`, a `|` or a keyword, none of which is
/// accepted here; what is left (single names, literals, arithmetic and comparisons over them,
/// references) records no fact when visited. Anything unusual (comments, characters, lifetimes,
/// raw strings, non-ASCII text outside strings) answers `false`, and the arguments are parsed.
fn cannot_hold_facts(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'"' => {
                // A string literal: skip to its closing quote (escapes skip the next byte).
                i += 1;
                loop {
                    match bytes.get(i) {
                        None => return false,
                        Some(b'\\') => i += 2,
                        Some(b'"') => break,
                        Some(_) => i += 1,
                    }
                }
                i += 1;
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                if is_keyword(&text[start..i]) {
                    return false;
                }
            }
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            // `//` and `/*` start comments: not accepted.
            b'/' if matches!(bytes.get(i + 1), Some(b'/' | b'*')) => return false,
            b',' | b'&' | b'*' | b'+' | b'-' | b'/' | b'%' | b'=' | b'!' | b'<' | b'>' | b'^' => {
                i += 1
            }
            _ => return false,
        }
    }
    true
}

/// Rust's keywords, strict and reserved (`self` and `Self` name values and are not included).
fn is_keyword(name: &str) -> bool {
    matches!(
        name,
        "as" | "async"
            | "await"
            | "break"
            | "const"
            | "continue"
            | "crate"
            | "dyn"
            | "else"
            | "enum"
            | "extern"
            | "fn"
            | "for"
            | "gen"
            | "if"
            | "impl"
            | "in"
            | "let"
            | "loop"
            | "match"
            | "mod"
            | "move"
            | "mut"
            | "pub"
            | "ref"
            | "return"
            | "static"
            | "struct"
            | "super"
            | "trait"
            | "try"
            | "type"
            | "union"
            | "unsafe"
            | "use"
            | "where"
            | "while"
            | "yield"
            | "abstract"
            | "become"
            | "box"
            | "do"
            | "final"
            | "macro"
            | "override"
            | "priv"
            | "typeof"
            | "unsized"
            | "virtual"
    )
}

/// Methods whose device arguments are a destination, not evidence of the code's device: the
/// transfers, and `copy_` (whose argument is the source tensor).
fn is_transfer_method(name: &str) -> bool {
    is_transfer(name) || name == "copy_"
}

/// A type that is, refers to or holds cudarc's `PinnedHostSlice` (a reference, an array, a slice,
/// a `Vec` or `Box` of them).
fn names_pinned_type(ty: &syn::Type) -> bool {
    match ty {
        syn::Type::Reference(r) => names_pinned_type(&r.elem),
        syn::Type::Array(a) => names_pinned_type(&a.elem),
        syn::Type::Slice(s) => names_pinned_type(&s.elem),
        syn::Type::Paren(p) => names_pinned_type(&p.elem),
        syn::Type::Path(p) => p.path.segments.last().is_some_and(|s| {
            s.ident == "PinnedHostSlice"
                || ((s.ident == "Vec" || s.ident == "Box")
                    && matches!(&s.arguments, syn::PathArguments::AngleBracketed(a)
                        if a.args.iter().any(|g| matches!(g, syn::GenericArgument::Type(t) if names_pinned_type(t)))))
        }),
        _ => false,
    }
}

/// `alloc_pinned(..)` / `.pin_memory(..)` anywhere in a `let` initializer's call chain.
fn makes_pinned_buffer(expr: &Expr) -> bool {
    match expr {
        Expr::MethodCall(m) => {
            m.method == "alloc_pinned"
                || m.method == "pin_memory"
                || makes_pinned_buffer(&m.receiver)
        }
        Expr::Call(c) => match &*c.func {
            Expr::Path(p) => p
                .path
                .segments
                .last()
                .is_some_and(|s| s.ident == "alloc_pinned"),
            _ => false,
        },
        Expr::Try(t) => makes_pinned_buffer(&t.expr),
        Expr::Unsafe(u) => u.block.stmts.iter().any(|stmt| match stmt {
            syn::Stmt::Expr(e, _) => makes_pinned_buffer(e),
            _ => false,
        }),
        Expr::Paren(p) => makes_pinned_buffer(&p.expr),
        _ => false,
    }
}

/// A key for an identifier of the tree: its address. The trees (and the expressions parsed out of
/// macros) stay in place while their facts are collected, so each identifier has one address,
/// and looking it up costs no conversion of its span to a byte offset.
fn ident_key(ident: &syn::Ident) -> usize {
    std::ptr::from_ref(ident) as usize
}

fn join(a: Span, b: Span) -> Span {
    a.join(b).unwrap_or(a)
}

impl<'a> Collector<'a> {
    fn current_fn(&self) -> Option<usize> {
        self.fn_stack.last().copied()
    }

    fn intern(&self, ident: &syn::Ident) -> &'a str {
        with_ident_str(ident, |text| self.intern_str(text))
    }

    /// Records a call before its receiver and arguments are visited (calls are kept in source
    /// order); its devices are filled in by [`Self::fill_devices`] once they have been.
    fn record_call(&mut self, call: CallRef<'a>, name: &'a str) -> usize {
        let recv_ty = match call {
            CallRef::Method(m) => self.infer_ty(&m.receiver),
            CallRef::Path(..) => TypeHint::Unknown,
        };
        let index = self.facts.calls.len();
        self.call_at.insert(ident_key(call.name()), index);
        self.dev_memo.get_mut().push(None);
        self.facts.calls.push(CallFact {
            call,
            name,
            recv_ty,
            operand: Dev::UNKNOWN,
            dest: Dev::UNKNOWN,
            fn_idx: self.current_fn(),
            loop_idx: self.loop_stack.last().copied(),
            guard: self.guard_stack.last().map(|g| g.0),
            guard_kind: self.guard_stack.last().map_or(GuardKind::Modulo, |g| g.1),
            in_test: self.test_depth > 0,
            in_macro: self.macro_depth > 0,
            on_failure: self.failure_depth > 0,
        });
        index
    }

    /// Fills in the devices of call `index` (its receiver and arguments have been visited, so the
    /// calls inside them are recorded and can be referred to).
    fn fill_devices(&mut self, index: usize) {
        let call = self.facts.calls[index].call;
        let name = self.facts.calls[index].name;
        // The devices of the arguments, each inferred once: kept for the crate-wide parameter
        // analysis, and what a path call's operand and a transfer's destination are made of.
        let args = call.args();
        let start = self.facts.arg_dev_pool.len();
        for arg in args {
            let dev = self.infer_dev(arg);
            self.facts.arg_dev_pool.push(dev);
        }
        let arg_devs = &self.facts.arg_dev_pool[start..];
        let (operand, dest) = match call {
            CallRef::Method(m) => (
                self.infer_dev(&m.receiver),
                if is_transfer(name) && m.args.len() == 1 {
                    arg_devs[0]
                } else {
                    Dev::UNKNOWN
                },
            ),
            CallRef::Path(..) => (merge_devs(arg_devs.iter().copied()), Dev::UNKNOWN),
        };
        // Kept only when one of them says something (a call with none stands for "unknown" in
        // every position).
        let informative = arg_devs.iter().any(Dev::is_informative);
        let fact = &mut self.facts.calls[index];
        fact.operand = operand;
        fact.dest = dest;
        if informative {
            self.facts
                .arg_devs
                .push((index, start..self.facts.arg_dev_pool.len()));
        } else {
            self.facts.arg_dev_pool.truncate(start);
        }
    }

    fn push_loop(&mut self, span: Span) {
        let idx = self.facts.loops.len();
        self.facts.loops.push(LoopFact {
            span,
            fn_idx: self.current_fn(),
            parent: self.loop_stack.last().copied(),
        });
        self.loop_stack.push(idx);
    }

    /// Enters a function body: a fresh loop and guard context, test code when marked so.
    fn visit_fn(
        &mut self,
        attrs: &'a [syn::Attribute],
        is_pub: bool,
        sig: &'a syn::Signature,
        block: &'a syn::Block,
        start: Span,
    ) {
        let is_test = is_test_attr(attrs);
        if is_test {
            self.facts
                .test_spans
                .push(join(start, block.brace_token.span.close()));
        }
        let idx = self.facts.fns.len();
        // Parameters typed as pinned buffers (`&PinnedHostSlice<T>`, `&mut [PinnedHostSlice<T>; 2]`).
        let pinned_bindings = sig
            .inputs
            .iter()
            .filter_map(|input| match input {
                syn::FnArg::Typed(t) if names_pinned_type(&t.ty) => binding_name(&t.pat),
                _ => None,
            })
            .collect();
        self.facts.fns.push(FnFact {
            name: &sig.ident,
            self_ty: self.self_ty.last().cloned().flatten(),
            trait_name: self.trait_of_impl.last().cloned().flatten(),
            is_pub,
            sig,
            block,
            is_test: is_test || self.test_depth > 0,
            parent: self.current_fn(),
            device: Default::default(),
            pinned_bindings,
        });
        self.test_depth += usize::from(is_test);
        let loops = std::mem::take(&mut self.loop_stack);
        let guards = std::mem::take(&mut self.guard_stack);
        let generics_len = self.generics.len();
        self.generics.extend(generic_bounds(&sig.generics));
        // Parameters: their declared types (a generic's bound, `impl Trait`'s trait).
        let mut params = Vec::new();
        let mut position = 0;
        for input in &sig.inputs {
            match input {
                syn::FnArg::Receiver(_) => {}
                syn::FnArg::Typed(t) => {
                    let ty = type_name(&t.ty, &self.generics)
                        .map(|name| TypeHint::Named(self.intern_str(&name)))
                        .unwrap_or_default();
                    match binding_name(&t.pat) {
                        // Its device is what the crate's callers pass.
                        Some(name) => params.push(Binding {
                            name: self.intern_str(&name),
                            ty,
                            dev: Dev::symbolic(DevSym::Param(position)),
                            init: None,
                        }),
                        None => {
                            let from = params.len();
                            self.bind_pattern_names(&t.pat, &mut params);
                            // `Options { device, .. }: Options`: each binding holds that field.
                            if let (Some(syn::Pat::Struct(pat)), TypeHint::Named(owner)) =
                                (strip_pat(&t.pat), ty)
                            {
                                for field in &pat.fields {
                                    let (syn::Member::Named(member), Some(syn::Pat::Ident(ident))) =
                                        (&field.member, strip_pat(&field.pat))
                                    else {
                                        continue;
                                    };
                                    let member = self.intern(member);
                                    for binding in
                                        params[from..].iter_mut().filter(|b| ident.ident == b.name)
                                    {
                                        binding.dev = Dev::symbolic(DevSym::Field(owner, member));
                                        binding.ty = TypeHint::Field(owner, member);
                                    }
                                }
                            }
                        }
                    }
                    position += 1;
                }
            }
        }
        // A nested fn does not see the enclosing function's locals.
        let outer_scopes = self.scopes.replace(vec![params]);
        self.fn_stack.push(idx);
        // The body of burn's `TrainStep::step` is a step loop's body (as a Lightning
        // `training_step` is in Python): a loop of its own, marked by its `backward()`.
        if !is_test && self.test_depth == 0 && self.facts.fns[idx].is_learner_step() {
            self.push_loop(sig.ident.span());
        }
        self.visit_signature(sig);
        self.visit_block(block);
        self.fn_stack.pop();
        self.scopes.restore(outer_scopes);
        self.generics.truncate(generics_len);
        self.loop_stack = loops;
        self.guard_stack = guards;
        self.test_depth -= usize::from(is_test);
    }

    /// What kind of guard an `if` condition is: `step % N == 0` (or a binding computed with `%`),
    /// or an opt-in output flag (`if settings.save_images`, `if args.debug`).
    fn guard_kind(&self, cond: &Expr) -> Option<GuardKind> {
        if is_modulo_guard(cond) || self.mentions_modulo(cond) {
            return Some(GuardKind::Modulo);
        }
        is_output_flag(cond).then_some(GuardKind::Flag)
    }

    /// `if counter == every { counter = 0; .. }`: a counter reset in the branch it guards makes the
    /// branch periodic, like `% every == 0`.
    fn is_counter_guard(cond: &Expr, then_branch: &syn::Block) -> bool {
        let Expr::Binary(b) = cond else {
            return false;
        };
        if !matches!(b.op, syn::BinOp::Eq(_) | syn::BinOp::Ge(_)) {
            return false;
        }
        let counters: Vec<String> = [&*b.left, &*b.right]
            .into_iter()
            .filter_map(|side| super::patterns::root_name(strip_cast(side)))
            .collect();
        then_branch.stmts.iter().any(|stmt| {
            let syn::Stmt::Expr(Expr::Assign(a), _) = stmt else {
                return false;
            };
            let zero = match &*a.right {
                Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(i),
                    ..
                }) => i.base10_digits().trim_start_matches('0').is_empty(),
                Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Float(f),
                    ..
                }) => f.base10_digits().parse::<f64>().is_ok_and(|v| v == 0.0),
                _ => false,
            };
            zero && super::patterns::root_name(&a.left).is_some_and(|n| counters.contains(&n))
        })
    }

    /// Whether an expression computes with `%` / `is_multiple_of`, directly or through a local
    /// bound to such a computation (followed a few bindings deep).
    fn mentions_modulo(&self, expr: &Expr) -> bool {
        self.mentions_modulo_at(expr, 0)
    }

    fn mentions_modulo_at(&self, expr: &Expr, depth: usize) -> bool {
        struct Finder<'c, 'a> {
            collector: &'c Collector<'a>,
            depth: usize,
            found: bool,
        }
        impl<'ast> Visit<'ast> for Finder<'_, '_> {
            fn visit_bin_op(&mut self, op: &'ast syn::BinOp) {
                self.found |= matches!(op, syn::BinOp::Rem(_));
            }
            fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
                self.found |= m.method == "is_multiple_of" || m.method == "rem_euclid";
                visit::visit_expr_method_call(self, m);
            }
            fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
                if !self.found
                    && self.depth < 3
                    && p.path.segments.len() == 1
                    && let Some(b) = self.collector.lookup(&p.path.segments[0].ident)
                    && let Some(init) = b.init
                {
                    self.found |= self.collector.mentions_modulo_at(init, self.depth + 1);
                }
            }
        }
        let mut finder = Finder {
            collector: self,
            depth,
            found: false,
        };
        finder.visit_expr(expr);
        finder.found
    }

    fn intern_str(&self, text: &str) -> &'a str {
        let mut cache = self.interned.borrow_mut();
        if let Some(&found) = cache.get(text) {
            return found;
        }
        let stored: &'a str = self.names.alloc_str(text);
        cache.insert(text.into(), stored);
        stored
    }

    /// Binds every identifier of a pattern with nothing known about it (it shadows outer names).
    fn bind_pattern_names(&self, pat: &syn::Pat, out: &mut Vec<Binding<'a>>) {
        match pat {
            syn::Pat::Ident(p) => {
                out.push(Binding {
                    name: self.intern(&p.ident),
                    ty: TypeHint::Unknown,
                    dev: Dev::UNKNOWN,
                    init: None,
                });
                if let Some((_, sub)) = &p.subpat {
                    self.bind_pattern_names(sub, out);
                }
            }
            syn::Pat::Type(t) => self.bind_pattern_names(&t.pat, out),
            syn::Pat::Reference(r) => self.bind_pattern_names(&r.pat, out),
            syn::Pat::Paren(p) => self.bind_pattern_names(&p.pat, out),
            syn::Pat::Tuple(t) => t.elems.iter().for_each(|p| self.bind_pattern_names(p, out)),
            syn::Pat::TupleStruct(t) => {
                t.elems.iter().for_each(|p| self.bind_pattern_names(p, out))
            }
            syn::Pat::Slice(s) => s.elems.iter().for_each(|p| self.bind_pattern_names(p, out)),
            syn::Pat::Or(o) => o.cases.iter().for_each(|p| self.bind_pattern_names(p, out)),
            syn::Pat::Struct(s) => s
                .fields
                .iter()
                .for_each(|f| self.bind_pattern_names(&f.pat, out)),
            _ => {}
        }
    }

    /// Pushes the names a pattern binds into the innermost scope, nothing known about them.
    fn shadow(&mut self, pat: &syn::Pat) {
        let mut names = Vec::new();
        self.bind_pattern_names(pat, &mut names);
        self.scopes.extend(names);
    }

    fn lookup(&self, name: &syn::Ident) -> Option<Binding<'a>> {
        self.scopes.lookup(name)
    }

    fn self_type(&self) -> TypeHint<'a> {
        match self.self_ty_interned.last() {
            Some(Some(ty)) => TypeHint::Named(ty),
            _ => TypeHint::Unknown,
        }
    }

    /// The type of an expression, as far as the crate's declarations tell.
    fn infer_ty(&self, expr: &Expr) -> TypeHint<'a> {
        let depth = self.infer_depth.get();
        self.reach(depth);
        if depth > MAX_INFER_DEPTH {
            return TypeHint::Unknown;
        }
        self.infer_depth.set(depth + 1);
        let ty = self.infer_ty_inner(expr);
        self.infer_depth.set(depth);
        ty
    }

    /// Notes that the inference under way checked depth `depth` (see [`DevMemo::height`]).
    fn reach(&self, depth: usize) {
        if depth > self.infer_peak.get() {
            self.infer_peak.set(depth);
        }
    }

    fn infer_ty_inner(&self, expr: &Expr) -> TypeHint<'a> {
        match expr {
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
                let ident = &p.path.segments[0].ident;
                if ident == "self" {
                    return self.self_type();
                }
                self.lookup(ident).map(|b| b.ty).unwrap_or_default()
            }
            Expr::Field(f) => {
                let syn::Member::Named(field) = &f.member else {
                    return TypeHint::Unknown;
                };
                match self.infer_ty(&f.base) {
                    TypeHint::Named(owner) => TypeHint::Field(owner, self.intern(field)),
                    _ => TypeHint::Unknown,
                }
            }
            Expr::Reference(r) => self.infer_ty(&r.expr),
            Expr::Paren(p) => self.infer_ty(&p.expr),
            Expr::Group(g) => self.infer_ty(&g.expr),
            Expr::Try(t) => self.infer_ty(&t.expr),
            Expr::Cast(c) => type_name(&c.ty, &self.generics)
                .map(|n| TypeHint::Named(self.intern_str(&n)))
                .unwrap_or_default(),
            // The name is read first, and the receiver's type worked out after (not inside
            // `with_ident_str`, whose buffer a nested call could not use).
            Expr::MethodCall(m) => match with_ident_str(&m.method, |name| {
                if is_passthrough_method(name)
                    || name.starts_with("with_")
                    || name.starts_with("set_")
                {
                    MethodTy::Receiver
                } else if matches!(name, "init" | "build" | "init_with" | "build_with") {
                    MethodTy::Builder
                } else {
                    MethodTy::Unknown
                }
            }) {
                MethodTy::Receiver => self.infer_ty(&m.receiver),
                MethodTy::Builder => {
                    // `AdamConfig::new().init()`, tch `nn::Adam::default().build(&vs, lr)`,
                    // `config.optimizer.init()`.
                    let builder = match self.infer_ty(&m.receiver) {
                        TypeHint::Named(ty) => is_optimizer_builder(ty),
                        TypeHint::Field(_, field) => is_optimizer_builder(field),
                        TypeHint::Unknown => super::patterns::root_name(&m.receiver)
                            .is_some_and(|n| n.to_ascii_lowercase().contains("optim")),
                    };
                    if builder {
                        TypeHint::Named("Optimizer")
                    } else {
                        TypeHint::Unknown
                    }
                }
                MethodTy::Unknown => TypeHint::Unknown,
            },
            Expr::Call(c) => {
                let Expr::Path(p) = &*c.func else {
                    return TypeHint::Unknown;
                };
                let segs = &p.path.segments;
                let n = segs.len();
                let type_segment = if n >= 2 {
                    &segs[n - 2].ident
                } else {
                    // A tuple struct: `Wrapper(x)`.
                    &segs[0].ident
                };
                if type_segment == "Self" {
                    return self.self_type();
                }
                with_ident_str(type_segment, |text| {
                    if text.starts_with(|c: char| c.is_ascii_uppercase()) {
                        TypeHint::Named(self.intern_str(text))
                    } else {
                        TypeHint::Unknown
                    }
                })
            }
            Expr::Struct(s) => match s.path.segments.last() {
                Some(last) if last.ident == "Self" => self.self_type(),
                Some(last) => TypeHint::Named(self.intern(&last.ident)),
                None => TypeHint::Unknown,
            },
            _ => TypeHint::Unknown,
        }
    }

    /// The device an expression's value lives on, followed through bindings, method chains,
    /// transfers and arithmetic; symbolic where a parameter or a struct field decides.
    ///
    /// A recorded call's device is worked out once and kept (see [`DevMemo`]): asked again (the
    /// receiver of the next call of a chain, a `let` initializer) it is read back when nothing it
    /// depended on has changed, with the same result as working it out again.
    fn infer_dev(&self, expr: &Expr) -> Dev<'a> {
        let depth = self.infer_depth.get();
        self.reach(depth);
        // Deeper than a few dozen operators and calls, nothing is known (and nothing recurses far).
        if depth > MAX_INFER_DEPTH {
            return Dev::UNKNOWN;
        }
        let call = self.recorded_call(expr);
        if let Some(index) = call
            && let Some(memo) = self.memo_hit(index, depth)
        {
            self.reach(depth + memo.height);
            #[cfg(debug_assertions)]
            self.check_memo(expr, memo.dev);
            return memo.dev;
        }
        let outer_peak = self.infer_peak.replace(depth);
        self.infer_depth.set(depth + 1);
        let dev = self.infer_dev_inner(expr, call);
        self.infer_depth.set(depth);
        let peak = self.infer_peak.get();
        // Kept unless the depth limit cut the working-out short somewhere below.
        if let Some(index) = call
            && peak <= MAX_INFER_DEPTH
            && self.memo_on()
        {
            self.dev_memo.borrow_mut()[index] = Some(DevMemo {
                dev,
                height: peak - depth,
                scope: self.scopes.version,
                frameworks: self.facts.frameworks,
            });
        }
        self.infer_peak.set(peak.max(outer_peak));
        dev
    }

    /// Runs `f` on the text of a call's name: from the record of call `call` when it is recorded
    /// (the same text, kept when it was), else from the identifier.
    fn with_call_name<R>(
        &self,
        call: Option<usize>,
        ident: &syn::Ident,
        f: impl FnOnce(&str) -> R,
    ) -> R {
        match call {
            Some(index) => f(self.facts.calls[index].name),
            None => with_ident_str(ident, f),
        }
    }

    /// The number of the recorded call that `expr` is, if it is one.
    fn recorded_call(&self, expr: &Expr) -> Option<usize> {
        let name = match expr {
            Expr::MethodCall(m) => &m.method,
            Expr::Call(c) => match &*c.func {
                Expr::Path(p) => &p.path.segments.last()?.ident,
                _ => return None,
            },
            _ => return None,
        };
        self.call_at.get(&ident_key(name)).copied()
    }

    /// The kept device of call `index`, when it holds for a working-out starting at `depth` now.
    fn memo_hit(&self, index: usize, depth: usize) -> Option<DevMemo<'a>> {
        if !self.memo_on() {
            return None;
        }
        let memo = (*self.dev_memo.borrow().get(index)?)?;
        (memo.scope == self.scopes.version
            && memo.frameworks == self.facts.frameworks
            && depth + memo.height <= MAX_INFER_DEPTH)
            .then_some(memo)
    }

    fn memo_on(&self) -> bool {
        !self.memo_off.get()
    }

    /// Debug builds check every memo hit against a working-out without the memo.
    #[cfg(debug_assertions)]
    fn check_memo(&self, expr: &Expr, kept: Dev<'a>) {
        if self.memo_off.replace(true) {
            return;
        }
        let peak = self.infer_peak.get();
        let fresh = self.infer_dev(expr);
        self.infer_peak.set(peak);
        self.memo_off.set(false);
        assert_eq!(
            kept, fresh,
            "kept device of a call differs from a fresh working-out"
        );
    }

    /// `call`: the number of the recorded call that `expr` is, if it is one.
    fn infer_dev_inner(&self, expr: &Expr, call: Option<usize>) -> Dev<'a> {
        match expr {
            // A local, else an imported constant (`FLOAT_CPU`).
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => self
                .lookup(&p.path.segments[0].ident)
                .map(|b| b.dev)
                .unwrap_or_else(|| Dev::known(device_of_path(&p.path))),
            Expr::Path(p) => Dev::known(device_of_path(&p.path)),
            // `self.device`, `config.device`: the crate's struct literals decide.
            Expr::Field(f) => match (&f.member, self.infer_ty(&f.base)) {
                (syn::Member::Named(field), TypeHint::Named(owner)) => {
                    Dev::symbolic(DevSym::Field(owner, self.intern(field)))
                }
                (syn::Member::Unnamed(index), TypeHint::Named(owner)) => Dev::symbolic(
                    DevSym::Field(owner, self.intern_str(&index.index.to_string())),
                ),
                // `step.is_done` where `let step = env.step(a)?;`: what the called function
                // stores in that field of the value it returns.
                (member, _) => match self.producing_call(&f.base, 0) {
                    Some(call) => {
                        let field = match member {
                            syn::Member::Named(name) => self.intern(name),
                            syn::Member::Unnamed(index) => {
                                self.intern_str(&index.index.to_string())
                            }
                        };
                        Dev::symbolic(DevSym::RetField(call, field))
                    }
                    None => Dev::UNKNOWN,
                },
            },
            // `tch::no_grad(|| model(&xs))`: the closure's value.
            Expr::Closure(c) => self.infer_dev(&c.body),
            Expr::Block(b) => match b.block.stmts.last() {
                Some(syn::Stmt::Expr(e, None)) => self.infer_dev(e),
                _ => Dev::UNKNOWN,
            },
            Expr::Reference(r) => self.infer_dev(&r.expr),
            Expr::Paren(p) => self.infer_dev(&p.expr),
            Expr::Group(g) => self.infer_dev(&g.expr),
            Expr::Try(t) => self.infer_dev(&t.expr),
            Expr::Unary(u) => self.infer_dev(&u.expr),
            Expr::Index(i) => self.infer_dev(&i.expr),
            Expr::Binary(b) => merge_devs([self.infer_dev(&b.left), self.infer_dev(&b.right)]),
            Expr::Tuple(t) => merge_devs(t.elems.iter().map(|e| self.infer_dev(e))),
            // The name is read first, and the operands worked out after (not inside
            // `with_ident_str`, whose buffer a nested call could not use).
            // A recorded call's name is read from its record, not formatted again.
            Expr::MethodCall(m) => match self.with_call_name(call, &m.method, |name| {
                if is_transfer(name) && m.args.len() == 1 {
                    return MethodDev::Transfer;
                }
                match name {
                    "cuda" if m.args.is_empty() => MethodDev::Known(DeviceKind::Gpu),
                    "cpu" if m.args.is_empty() => MethodDev::Known(DeviceKind::Cpu),
                    _ => MethodDev::Returned,
                }
            }) {
                MethodDev::Transfer => self.infer_dev(&m.args[0]),
                MethodDev::Known(kind) => Dev::known(kind),
                // What the call returns: a crate function's return value, or (a call outside
                // the crate) where its receiver and arguments live.
                MethodDev::Returned => self.returned(call, || {
                    merge_devs(
                        std::iter::once(self.infer_dev(&m.receiver))
                            .chain(m.args.iter().map(|a| self.infer_dev(a))),
                    )
                }),
            },
            Expr::Call(c) => {
                let Expr::Path(p) = &*c.func else {
                    return Dev::UNKNOWN;
                };
                let n = p.path.segments.len();
                let named = self.with_call_name(call, &p.path.segments[n - 1].ident, |name| {
                    device_of_path_named(&p.path, name)
                });
                if named != DeviceKind::Unknown {
                    return Dev::known(named);
                }
                // `empty()` where `let empty = || Tensor::zeros(.., device);`: the closure's value.
                if p.qself.is_none()
                    && p.path.segments.len() == 1
                    && let Some(binding) = self.lookup(&p.path.segments[0].ident)
                    && matches!(binding.init, Some(Expr::Closure(_)))
                {
                    return binding.dev;
                }
                // tch builds `Tensor::from_slice(..)` (and friends) on the CPU.
                if n >= 2
                    && p.path.segments[n - 2].ident == "Tensor"
                    && self.facts.frameworks.contains(Framework::Tch)
                    && with_ident_str(&p.path.segments[n - 1].ident, |name| {
                        matches!(
                            name,
                            "from_slice"
                                | "of_slice"
                                | "from_slice2"
                                | "of_slice2"
                                | "f_from_slice"
                        )
                    })
                {
                    return Dev::known(DeviceKind::Cpu);
                }
                self.returned(call, || {
                    merge_devs(c.args.iter().map(|a| self.infer_dev(a)))
                })
            }
            _ => Dev::UNKNOWN,
        }
    }

    /// The recorded call whose value an expression is: the call itself (through `?`, `unwrap`,
    /// `expect`, references), or the initializer of the local binding it names.
    fn producing_call(&self, expr: &Expr, hops: usize) -> Option<usize> {
        let name = match expr {
            Expr::Try(t) => return self.producing_call(&t.expr, hops),
            Expr::Paren(p) => return self.producing_call(&p.expr, hops),
            Expr::Reference(r) => return self.producing_call(&r.expr, hops),
            Expr::MethodCall(m) if m.method == "unwrap" || m.method == "expect" => {
                return self.producing_call(&m.receiver, hops);
            }
            Expr::MethodCall(m) => &m.method,
            Expr::Call(c) => match &*c.func {
                Expr::Path(p) => &p.path.segments.last()?.ident,
                _ => return None,
            },
            // A binding's initializer, a few bindings deep (`let x = x.f()` shadows `x`).
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 && hops < 3 => {
                let init = self.lookup(&p.path.segments[0].ident)?.init?;
                return self.producing_call(init, hops + 1);
            }
            _ => return None,
        };
        self.call_at.get(&ident_key(name)).copied()
    }

    /// The device of a call's value: known from its operands, else what the recorded call `call`
    /// returns (settled across the crate), else the operands' symbolic sources.
    fn returned(&self, call: Option<usize>, operands: impl FnOnce() -> Dev<'a>) -> Dev<'a> {
        let dev = operands();
        if dev.kind != DeviceKind::Unknown {
            return dev;
        }
        match call {
            // The return value first; the operands' own source as the second opinion.
            Some(index) => Dev {
                kind: DeviceKind::Unknown,
                syms: [Some(DevSym::Ret(index)), dev.syms[0]],
            },
            None => dev,
        }
    }

    /// Records call `index`, a one-argument method call on `receiver`, as a possible derived
    /// setter when the start of its chain is known: `Type::f(..)` or a value of a known type.
    fn setter_call(&mut self, index: usize, receiver: &Expr) {
        let mut root = receiver;
        loop {
            root = match root {
                Expr::MethodCall(m) => &m.receiver,
                Expr::Paren(p) => &p.expr,
                Expr::Reference(r) => &r.expr,
                Expr::Try(t) => &t.expr,
                _ => break,
            };
        }
        let root = match root {
            Expr::Call(c) => {
                let Expr::Path(p) = &*c.func else { return };
                let n = p.path.segments.len();
                if n < 2 {
                    return;
                }
                let last = &p.path.segments[n - 1].ident;
                let Some(&at) = self.call_at.get(&ident_key(last)) else {
                    return;
                };
                let qualifier = &p.path.segments[n - 2].ident;
                let qualifier = if qualifier == "Self" {
                    match self.self_type().name() {
                        Some(ty) => ty,
                        None => return,
                    }
                } else {
                    self.intern(qualifier)
                };
                SetterRoot::Call(at, qualifier)
            }
            other => match self.infer_ty(other) {
                TypeHint::Unknown => return,
                hint => SetterRoot::Value(hint),
            },
        };
        self.facts
            .setter_calls
            .push(SetterCall { call: index, root });
    }

    /// `Wrapper(x, y)` / `Self(x)`: a tuple struct's fields `0`, `1`, ... hold these values.
    fn tuple_struct_init(&mut self, e: &'a syn::ExprCall) {
        let Expr::Path(p) = &*e.func else {
            return;
        };
        let Some(last) = p.path.segments.last() else {
            return;
        };
        let owner = if last.ident == "Self" {
            self.self_type().name()
        } else if p.path.segments.len() == 1
            && with_ident_str(&last.ident, |t| {
                t.starts_with(|c: char| c.is_ascii_uppercase())
                    && !matches!(t, "Ok" | "Err" | "Some" | "Box" | "Arc" | "Rc")
            })
        {
            Some(self.intern(&last.ident))
        } else {
            None
        };
        let Some(owner) = owner else {
            return;
        };
        for (i, arg) in e.args.iter().enumerate() {
            let dev = self.infer_dev(arg);
            self.facts.field_inits.push(super::FieldInit {
                owner,
                field: self.intern_str(&i.to_string()),
                dev,
                fn_idx: self.current_fn(),
            });
        }
    }

    /// Records the local values a formatting macro formats (see [`super::format`]); `args` is
    /// the byte range of its arguments. Only in functions, and only names bound by a `let` with
    /// an initializer: what a rule can compare with the values it knows (the losses).
    fn record_formats(&mut self, mac: &syn::Macro, args: std::ops::Range<usize>) {
        let Some(fn_idx) = self.current_fn() else {
            return;
        };
        let Some(leading) = mac
            .path
            .segments
            .last()
            .and_then(|last| with_ident_str(&last.ident, super::format::format_macro))
        else {
            return;
        };
        let source = self.source;
        let Some(text) = source.get(args.clone()) else {
            return;
        };
        for formatted in super::format::formatted_names(text, leading) {
            let Some(binding) = self.scopes.lookup_str(formatted.name) else {
                continue;
            };
            let Some(init) = binding.init else {
                continue;
            };
            let at = args.start + formatted.offset;
            let (line, column) = self.line_column(at);
            let width = formatted.name.chars().count();
            self.facts.formats.push(super::FormatFact {
                name: binding.name,
                region: crate::diagnostic::Region {
                    line,
                    column,
                    end_line: line,
                    end_column: column + width,
                },
                how: formatted.how,
                binding: std::ptr::from_ref(init) as usize,
                dev: binding.dev,
                fn_idx: Some(fn_idx),
                loop_idx: self.loop_stack.last().copied(),
                guard: self.guard_stack.last().map(|g| g.0),
                guard_kind: self.guard_stack.last().map_or(GuardKind::Modulo, |g| g.1),
                in_test: self.test_depth > 0,
                on_failure: self.failure_depth > 0,
            });
        }
    }

    /// Records the names a `use` tree brings into scope, with the module each comes from.
    fn record_use_paths(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.record_use_paths(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.record_use_paths(item, prefix);
                }
            }
            syn::UseTree::Name(n) if !prefix.is_empty() && n.ident != "self" => {
                let module = self.intern_str(&prefix.join("::"));
                let name = self.intern(&n.ident);
                self.facts.use_paths.push((name, module));
            }
            syn::UseTree::Rename(r) if !prefix.is_empty() => {
                prefix.push(r.ident.to_string());
                let module = prefix[..prefix.len() - 1].join("::");
                prefix.pop();
                let module = self.intern_str(&module);
                let name = self.intern(&r.rename);
                self.facts.use_paths.push((name, module));
            }
            _ => {}
        }
    }

    /// Records call `index` as differentiating a `let` binding (`loss.backward()`,
    /// `opt.backward_step(&loss)`): that binding holds a loss.
    fn record_loss(&mut self, index: usize, e: &syn::ExprMethodCall, name: &str) {
        let value = match name {
            "backward" if e.args.is_empty() => &*e.receiver,
            "backward_step" | "backward_step_clip" | "backward_step_clip_norm" => {
                match e.args.first() {
                    Some(arg) => arg,
                    None => return,
                }
            }
            _ => return,
        };
        let mut value = value;
        while let Expr::Reference(r) = value {
            value = &r.expr;
        }
        if let Expr::Path(p) = value
            && p.qself.is_none()
            && p.path.segments.len() == 1
            && let Some(binding) = self.lookup(&p.path.segments[0].ident)
            && let Some(init) = binding.init
        {
            self.facts
                .losses
                .push((std::ptr::from_ref(init) as usize, index));
        }
    }

    /// The byte offset of each line of the source, worked out once.
    fn line_starts(&mut self) -> &[usize] {
        let source = self.source;
        self.line_starts.get_or_insert_with(|| {
            std::iter::once(0)
                .chain(memchr::memchr_iter(b'\n', source.as_bytes()).map(|i| i + 1))
                .collect()
        })
    }

    /// The 1-based line and column (in characters) of a byte offset of the source.
    fn line_column(&mut self, offset: usize) -> (usize, usize) {
        let source = self.source;
        let starts = self.line_starts();
        let line = starts.partition_point(|&s| s <= offset).max(1);
        let start = starts[line - 1];
        let column = source
            .get(start..offset)
            .map_or(0, |before| before.chars().count());
        (line, column + 1)
    }

    /// The bytes of the file that `span` covers: [`Span::byte_range`], worked out from the span's
    /// lines and columns where the lines are ASCII up to there (a column counts characters, so
    /// on such a line it is a byte offset too) instead of by counting characters, which the
    /// span table does from the last offset it converted.
    fn byte_range(&mut self, span: Span) -> std::ops::Range<usize> {
        let range = match (self.byte_offset(span.start()), self.byte_offset(span.end())) {
            (Some(start), Some(end)) => start..end,
            _ => span.byte_range(),
        };
        debug_assert_eq!(range, span.byte_range());
        range
    }

    /// The byte offset of a line and column, when the line is ASCII up to the column.
    fn byte_offset(&mut self, at: proc_macro2::LineColumn) -> Option<usize> {
        let source = self.source;
        let starts = self.line_starts();
        let start = *starts.get(at.line.checked_sub(1)?)?;
        let before = source.as_bytes().get(start..start + at.column)?;
        before.is_ascii().then_some(start + at.column)
    }

    fn deeper(&mut self, span: impl FnOnce() -> Span) -> bool {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            if self.facts.too_deep.is_none() {
                self.facts.too_deep = Some(span());
            }
            return false;
        }
        true
    }
}

/// A pattern without its type annotation, reference or parentheses.
fn strip_pat(pat: &syn::Pat) -> Option<&syn::Pat> {
    match pat {
        syn::Pat::Type(t) => strip_pat(&t.pat),
        syn::Pat::Reference(r) => strip_pat(&r.pat),
        syn::Pat::Paren(p) => strip_pat(&p.pat),
        other => Some(other),
    }
}

/// Whether an expression is the literal `None`.
fn is_none(expr: &Expr) -> bool {
    matches!(expr, Expr::Path(p) if p.qself.is_none() && p.path.is_ident("None"))
}

/// The setter-writing derive among a struct's attributes (`#[derive(TypedBuilder)]`,
/// `#[derive(Builder)]`, `#[derive(Setters)]`), with the prefix its setters' names carry.
fn derived_setters(attrs: &[syn::Attribute]) -> Option<(&'static str, String)> {
    let mut derive = None;
    let mut prefix = String::new();
    for attr in attrs {
        if attr.path().is_ident("derive") {
            let Ok(paths) =
                attr.parse_args_with(Punctuated::<syn::Path, Token![,]>::parse_terminated)
            else {
                continue;
            };
            for path in paths {
                let Some(last) = path.segments.last() else {
                    continue;
                };
                derive = derive.or_else(|| {
                    with_ident_str(&last.ident, |name| match name {
                        "TypedBuilder" => Some("TypedBuilder"),
                        "Builder" => Some("Builder"),
                        "Setters" => Some("Setters"),
                        _ => None,
                    })
                });
            }
        } else if attr.path().is_ident("setters") || attr.path().is_ident("builder") {
            // `prefix = "fill_"` anywhere in the attribute's arguments.
            let text = match &attr.meta {
                syn::Meta::List(list) => list.tokens.to_string(),
                _ => continue,
            };
            if let Some(at) = text.find("prefix")
                && let Some(open) = text[at..].find('"')
                && let Some(len) = text[at + open + 1..].find('"')
            {
                prefix = text[at + open + 1..at + open + 1 + len].to_string();
            }
        }
    }
    derive.map(|d| (d, prefix))
}

fn first_span(attrs: &[syn::Attribute], fallback: Span) -> Span {
    attrs
        .first()
        .map(|attr| attr.pound_token.span)
        .unwrap_or(fallback)
}

fn impl_type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        syn::Type::Reference(r) => impl_type_name(&r.elem),
        _ => None,
    }
}

impl<'a> Visit<'a> for Collector<'a> {
    fn visit_item_use(&mut self, item: &'a syn::ItemUse) {
        if let Some(first) = first_use_segment(&item.tree)
            && let Some(framework) = with_ident_str(first, Framework::from_crate_name)
        {
            self.facts.frameworks.insert(framework);
        }
        let mut prefix = Vec::new();
        self.record_use_paths(&item.tree, &mut prefix);
    }

    fn visit_item_extern_crate(&mut self, item: &'a syn::ItemExternCrate) {
        if let Some(framework) = with_ident_str(&item.ident, Framework::from_crate_name) {
            self.facts.frameworks.insert(framework);
        }
    }

    fn visit_item_fn(&mut self, item: &'a syn::ItemFn) {
        let start = first_span(&item.attrs, item.sig.fn_token.span);
        let is_pub = matches!(item.vis, syn::Visibility::Public(_));
        self.visit_fn(&item.attrs, is_pub, &item.sig, &item.block, start);
    }

    fn visit_impl_item_fn(&mut self, item: &'a syn::ImplItemFn) {
        let start = first_span(&item.attrs, item.sig.fn_token.span);
        // A trait's method is reachable wherever the trait is.
        let is_pub = matches!(item.vis, syn::Visibility::Public(_))
            || self.trait_of_impl.last().is_some_and(Option::is_some);
        self.visit_fn(&item.attrs, is_pub, &item.sig, &item.block, start);
    }

    fn visit_trait_item_fn(&mut self, item: &'a syn::TraitItemFn) {
        if let Some(block) = &item.default {
            let start = first_span(&item.attrs, item.sig.fn_token.span);
            self.visit_fn(&item.attrs, true, &item.sig, block, start);
        }
    }

    fn visit_item_impl(&mut self, item: &'a syn::ItemImpl) {
        let is_test = has_cfg_test(&item.attrs);
        if is_test {
            let start = first_span(&item.attrs, item.impl_token.span);
            self.facts
                .test_spans
                .push(join(start, item.brace_token.span.close()));
        }
        self.test_depth += usize::from(is_test);
        let generics_len = self.generics.len();
        self.generics.extend(generic_bounds(&item.generics));
        let self_ty = impl_type_name(&item.self_ty);
        self.self_ty_interned
            .push(self_ty.as_deref().map(|t| self.intern_str(t)));
        self.self_ty.push(self_ty);
        self.trait_of_impl.push(
            item.trait_
                .as_ref()
                .and_then(|(path, _)| path.segments.last())
                .map(|s| s.ident.to_string()),
        );
        visit::visit_item_impl(self, item);
        self.trait_of_impl.pop();
        self.self_ty.pop();
        self.self_ty_interned.pop();
        self.generics.truncate(generics_len);
        self.test_depth -= usize::from(is_test);
    }

    fn visit_expr_struct(&mut self, e: &'a syn::ExprStruct) {
        // `Self { device, .. }`, `Trainer { device: dev.clone(), .. }`: what the crate stores in
        // a struct's fields decides the device of `self.device` wherever it is read.
        let owner = match e.path.segments.last() {
            Some(last) if last.ident == "Self" => self.self_type().name(),
            Some(last) => Some(self.intern(&last.ident)),
            None => None,
        };
        if let Some(owner) = owner {
            for field in &e.fields {
                // `builder: None` holds no value yet: what is stored later decides.
                if is_none(&field.expr) {
                    continue;
                }
                if let syn::Member::Named(name) = &field.member {
                    let dev = self.infer_dev(&field.expr);
                    self.facts.field_inits.push(super::FieldInit {
                        owner,
                        field: self.intern(name),
                        dev,
                        fn_idx: self.current_fn(),
                    });
                }
            }
        }
        visit::visit_expr_struct(self, e);
    }

    fn visit_item_struct(&mut self, item: &'a syn::ItemStruct) {
        let generics = generic_bounds(&item.generics);
        let fields = item
            .fields
            .iter()
            .filter_map(|f| {
                let name = f.ident.as_ref()?;
                let ty = type_name(&f.ty, &generics)?;
                Some((self.intern(name), self.intern_str(&ty)))
            })
            .collect();
        let setters = derived_setters(&item.attrs).map(|(derive, prefix)| SetterDerive {
            derive: self.intern_str(derive),
            prefix: self.intern_str(&prefix),
            fields: item
                .fields
                .iter()
                .filter_map(|f| f.ident.as_ref().map(|name| self.intern(name)))
                .collect(),
        });
        self.facts.structs.push(StructFact {
            name: self.intern(&item.ident),
            fields,
            setters,
        });
        visit::visit_item_struct(self, item);
    }

    fn visit_block(&mut self, block: &'a syn::Block) {
        self.scopes.push(Vec::new());
        // `if step % every != 0 { return Ok(()); }` (or `continue`) guards the rest of the block.
        let mut guards = 0;
        for stmt in &block.stmts {
            self.visit_stmt(stmt);
            if let syn::Stmt::Expr(Expr::If(e), _) = stmt
                && e.else_branch.is_none()
                && exits_early(&e.then_branch)
                && self.mentions_modulo(&e.cond)
            {
                self.guard_stack
                    .push((self.loop_stack.last().copied(), GuardKind::EarlyReturn));
                guards += 1;
            }
        }
        for _ in 0..guards {
            self.guard_stack.pop();
        }
        // A function body's tail expression is what it returns.
        if let Some(f) = self.current_fn()
            && std::ptr::eq(self.facts.fns[f].block, block)
            && let Some(syn::Stmt::Expr(tail, None)) = block.stmts.last()
        {
            let dev = self.infer_dev(tail);
            self.facts.returns.push((f, dev));
        }
        self.scopes.pop();
    }

    fn visit_expr_closure(&mut self, closure: &'a syn::ExprClosure) {
        let mut params = Vec::new();
        for input in &closure.inputs {
            self.bind_pattern_names(input, &mut params);
        }
        self.scopes.push(params);
        visit::visit_expr_closure(self, closure);
        self.scopes.pop();
    }

    fn visit_arm(&mut self, arm: &'a syn::Arm) {
        self.scopes.push(Vec::new());
        self.shadow(&arm.pat);
        let failure = is_err_pattern(&arm.pat);
        self.failure_depth += usize::from(failure);
        visit::visit_arm(self, arm);
        self.failure_depth -= usize::from(failure);
        self.scopes.pop();
    }

    fn visit_expr_let(&mut self, e: &'a syn::ExprLet) {
        self.visit_expr(&e.expr);
        self.visit_pat(&e.pat);
        self.shadow(&e.pat);
    }

    fn visit_item_mod(&mut self, item: &'a syn::ItemMod) {
        let is_test = has_cfg_test(&item.attrs);
        if is_test {
            let start = first_span(&item.attrs, item.mod_token.span);
            let end = item
                .content
                .as_ref()
                .map(|(brace, _)| brace.span.close())
                .unwrap_or(item.ident.span());
            self.facts.test_spans.push(join(start, end));
        }
        self.test_depth += usize::from(is_test);
        visit::visit_item_mod(self, item);
        self.test_depth -= usize::from(is_test);
    }

    fn visit_expr(&mut self, expr: &'a Expr) {
        if self.deeper(|| span_of_expr_start(expr)) {
            visit::visit_expr(self, expr);
        }
        self.depth -= 1;
    }

    fn visit_type(&mut self, ty: &'a syn::Type) {
        if self.deeper(|| ty_span(ty)) {
            visit::visit_type(self, ty);
        }
        self.depth -= 1;
    }

    fn visit_pat(&mut self, pat: &'a syn::Pat) {
        if self.deeper(Span::call_site) {
            visit::visit_pat(self, pat);
        }
        self.depth -= 1;
    }

    fn visit_item(&mut self, item: &'a syn::Item) {
        if self.deeper(Span::call_site) {
            visit::visit_item(self, item);
        }
        self.depth -= 1;
    }

    fn visit_expr_for_loop(&mut self, e: &'a syn::ExprForLoop) {
        for attr in &e.attrs {
            self.visit_attribute(attr);
        }
        self.visit_pat(&e.pat);
        self.visit_expr(&e.expr);
        self.push_loop(e.for_token.span);
        self.scopes.push(Vec::new());
        // The items live where the collection does (`for (x, y) in batches.iter()`).
        let dev = self.infer_dev(&e.expr);
        let mut names = Vec::new();
        self.bind_pattern_names(&e.pat, &mut names);
        for binding in &mut names {
            binding.dev = dev;
        }
        self.scopes.extend(names);
        self.visit_block(&e.body);
        self.scopes.pop();
        self.loop_stack.pop();
    }

    fn visit_expr_while(&mut self, e: &'a syn::ExprWhile) {
        self.push_loop(e.while_token.span);
        self.visit_expr(&e.cond);
        self.visit_block(&e.body);
        self.loop_stack.pop();
    }

    fn visit_expr_loop(&mut self, e: &'a syn::ExprLoop) {
        self.push_loop(e.loop_token.span);
        self.visit_block(&e.body);
        self.loop_stack.pop();
    }

    fn visit_expr_if(&mut self, e: &'a syn::ExprIf) {
        self.visit_expr(&e.cond);
        let kind = self.guard_kind(&e.cond).or_else(|| {
            Self::is_counter_guard(&e.cond, &e.then_branch).then_some(GuardKind::Counter)
        });
        let failure = is_failure_test(&e.cond);
        self.failure_depth += usize::from(failure);
        if let Some(kind) = kind {
            self.guard_stack
                .push((self.loop_stack.last().copied(), kind));
            self.visit_block(&e.then_branch);
            self.guard_stack.pop();
        } else {
            self.visit_block(&e.then_branch);
        }
        self.failure_depth -= usize::from(failure);
        if let Some((_, else_branch)) = &e.else_branch {
            self.visit_expr(else_branch);
        }
    }

    fn visit_expr_method_call(&mut self, e: &'a syn::ExprMethodCall) {
        let name = self.intern(&e.method);
        let index = self.record_call(CallRef::Method(e), name);
        self.record_loss(index, e, name);
        self.visit_expr(&e.receiver);
        let iteration = is_iteration_method(name);
        let is_loop = iteration == IterationMethod::Always
            || (iteration == IterationMethod::IfIterator && is_iterator_like(&e.receiver));
        let transfer = is_transfer_method(name);
        self.device_arg_depth += usize::from(transfer);
        let failure = matches!(
            name,
            "map_err" | "or_else" | "unwrap_or_else" | "inspect_err" | "map_or_else"
        );
        self.failure_depth += usize::from(failure);
        for arg in &e.args {
            match arg {
                Expr::Closure(closure) if is_loop => {
                    self.push_loop(e.method.span());
                    self.visit_expr_closure(closure);
                    self.loop_stack.pop();
                }
                _ => self.visit_expr(arg),
            }
        }
        self.failure_depth -= usize::from(failure);
        self.device_arg_depth -= usize::from(transfer);
        self.fill_devices(index);
        if e.args.len() == 1 && !transfer && !is_passthrough_method(name) {
            self.setter_call(index, &e.receiver);
        }
    }

    fn visit_expr_call(&mut self, e: &'a syn::ExprCall) {
        let mut index = None;
        if let Expr::Path(p) = &*e.func
            && let Some(last) = p.path.segments.last()
        {
            let name = self.intern(&last.ident);
            index = Some(self.record_call(CallRef::Path(e, &p.path), name));
        }
        visit::visit_expr_call(self, e);
        if let Some(index) = index {
            self.fill_devices(index);
            self.tuple_struct_init(e);
        }
    }

    fn visit_expr_return(&mut self, e: &'a syn::ExprReturn) {
        visit::visit_expr_return(self, e);
        if let (Some(value), Some(f)) = (&e.expr, self.current_fn()) {
            let dev = self.infer_dev(value);
            self.facts.returns.push((f, dev));
        }
    }

    fn visit_expr_path(&mut self, e: &'a syn::ExprPath) {
        self.in_expr_path = true;
        self.visit_path(&e.path);
        self.in_expr_path = false;
        if let Some(qself) = &e.qself {
            self.visit_type(&qself.ty);
        }
    }

    fn visit_local(&mut self, local: &'a syn::Local) {
        let typed_pinned = matches!(&local.pat, syn::Pat::Type(t) if names_pinned_type(&t.ty));
        if (typed_pinned
            || local
                .init
                .as_ref()
                .is_some_and(|i| makes_pinned_buffer(&i.expr)))
            && let Some(f) = self.current_fn()
            && let Some(name) = binding_name(&local.pat)
        {
            self.facts.fns[f].pinned_bindings.push(name);
        }
        // The initializer is evaluated before the new names exist (`let x = x.to_device(d)?`).
        visit::visit_local(self, local);
        let declared = match &local.pat {
            syn::Pat::Type(t) => type_name(&t.ty, &self.generics),
            _ => None,
        };
        match binding_name(&local.pat) {
            Some(name) => {
                let init = local.init.as_ref().map(|i| &*i.expr);
                let ty = match declared {
                    Some(ty) => TypeHint::Named(self.intern_str(&ty)),
                    None => init.map(|e| self.infer_ty(e)).unwrap_or_default(),
                };
                let dev = init.map(|e| self.infer_dev(e)).unwrap_or(Dev::UNKNOWN);
                let binding = Binding {
                    name: self.intern_str(&name),
                    ty,
                    dev,
                    init,
                };
                self.scopes.extend([binding]);
            }
            None => {
                // `let (critic, actor) = model(&obs);`: every part lives where the value does.
                let dev = local
                    .init
                    .as_ref()
                    .map(|i| self.infer_dev(&i.expr))
                    .unwrap_or(Dev::UNKNOWN);
                let mut names = Vec::new();
                self.bind_pattern_names(&local.pat, &mut names);
                for binding in &mut names {
                    binding.dev = dev;
                }
                // `let Sample { advantages, .. } = sampler.sample();`: each field's binding holds
                // what the called function stores in that field.
                if dev.kind == DeviceKind::Unknown
                    && let Some(syn::Pat::Struct(pat)) = strip_pat(&local.pat)
                    && let Some(call) = local
                        .init
                        .as_ref()
                        .and_then(|i| self.producing_call(&i.expr, 0))
                {
                    for field in &pat.fields {
                        let (syn::Member::Named(member), Some(syn::Pat::Ident(ident))) =
                            (&field.member, strip_pat(&field.pat))
                        else {
                            continue;
                        };
                        let field_dev = Dev::symbolic(DevSym::RetField(call, self.intern(member)));
                        for binding in names.iter_mut().filter(|b| ident.ident == b.name) {
                            binding.dev = field_dev;
                        }
                    }
                }
                self.scopes.extend(names);
            }
        }
    }

    fn visit_macro(&mut self, mac: &'a syn::Macro) {
        if !matches!(
            mac.delimiter,
            syn::MacroDelimiter::Paren(_) | syn::MacroDelimiter::Bracket(_)
        ) || !is_expression_macro(&mac.path)
        {
            return;
        }
        // Most arguments are a format string and plain names (`println!("{loss}")`,
        // `format!("{} {}", a, b)`): nothing there is a call, a qualified path, a closure or a
        // literal struct, so no fact could come of parsing them. Tokens that cannot make any of
        // those are recognised without a parse.
        let body = self.byte_range(mac.delimiter.span().join());
        self.record_formats(mac, body.start + 1..body.end.saturating_sub(1));
        if let Some(text) = self.source.get(body.start + 1..body.end.saturating_sub(1))
            // Such arguments nest at most one level per byte: none can be too deep to follow.
            && self.depth + text.len() < MAX_NESTING
            && cannot_hold_facts(text)
        {
            return;
        }
        let Ok(args) = mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) else {
            // Not plain expressions (`vec![0; n]`, tracing's `field = %value`): nothing to see.
            return;
        };
        self.macro_depth += 1;
        for arg in args {
            let arg: &'a Expr = self.arena.alloc(arg);
            self.visit_expr(arg);
        }
        self.macro_depth -= 1;
    }

    fn visit_path(&mut self, path: &'a syn::Path) {
        if path.segments.len() >= 2
            && let Some(framework) = framework_of_ident(&path.segments[0].ident)
        {
            self.facts.frameworks.insert(framework);
        }
        // A one-segment path in an expression is almost always a local variable: skip it (devices
        // are named `Device::Cpu`, `kind::FLOAT_CPU`, or as types `NdArray`).
        let local = self.in_expr_path && path.segments.len() == 1;
        if self.device_arg_depth == 0 && self.test_depth == 0 && !local {
            let kind = device_of_path(path);
            if kind != DeviceKind::Unknown {
                match self.current_fn() {
                    Some(f) => self.facts.fns[f].device.add(kind),
                    // Item level: type aliases (`type B = Autodiff<NdArray>;`), consts, statics.
                    None => self.facts.device.add(kind),
                }
            }
        }
        // Generic arguments inside the path are types, not the path expression itself.
        let in_expr_path = std::mem::replace(&mut self.in_expr_path, false);
        visit::visit_path(self, path);
        self.in_expr_path = in_expr_path;
    }
}

/// [`Framework::from_crate_name`] for a path's first segment, by comparison (no formatting: this
/// runs for every qualified path).
fn framework_of_ident(ident: &syn::Ident) -> Option<Framework> {
    const CANDLE: &[&str] = &["candle_core", "candle_nn", "candle", "candle_transformers"];
    const BURN: &[&str] = &[
        "burn",
        "burn_tensor",
        "burn_core",
        "burn_train",
        "burn_ndarray",
        "burn_wgpu",
        "burn_cuda",
        "burn_autodiff",
        "burn_dataset",
        "burn_optim",
        "burn_nn",
        "burn_flex",
        "burn_tch",
        "burn_cpu",
        "burn_dispatch",
    ];
    if CANDLE.iter().any(|name| ident == name) {
        Some(Framework::Candle)
    } else if BURN.iter().any(|name| ident == name) {
        Some(Framework::Burn)
    } else if ident == "tch" {
        Some(Framework::Tch)
    } else if ident == "cudarc" {
        Some(Framework::Cudarc)
    } else {
        None
    }
}

fn span_of_expr_start(expr: &Expr) -> Span {
    use syn::spanned::Spanned;
    // Only the first token matters for the error line; spanning the whole (deep) expression would
    // walk it again.
    match expr {
        Expr::Lit(l) => l.lit.span(),
        Expr::Path(p) => p
            .path
            .segments
            .first()
            .map(|s| s.ident.span())
            .unwrap_or_else(Span::call_site),
        Expr::Paren(p) => p.paren_token.span.open(),
        Expr::Unary(u) => u.op.span(),
        Expr::Array(a) => a.bracket_token.span.open(),
        Expr::Block(b) => b.block.brace_token.span.open(),
        Expr::MethodCall(m) => m.method.span(),
        Expr::Call(c) => c.paren_token.span.open(),
        Expr::Binary(b) => b.op.span(),
        _ => Span::call_site(),
    }
}

fn ty_span(ty: &syn::Type) -> Span {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .first()
            .map(|s| s.ident.span())
            .unwrap_or_else(Span::call_site),
        _ => Span::call_site(),
    }
}

fn first_use_segment(tree: &syn::UseTree) -> Option<&syn::Ident> {
    match tree {
        syn::UseTree::Path(p) => Some(&p.ident),
        syn::UseTree::Name(n) => Some(&n.ident),
        syn::UseTree::Rename(r) => Some(&r.ident),
        syn::UseTree::Glob(_) => None,
        syn::UseTree::Group(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Macro arguments the scan accepts, and arguments it must leave to the parser.
    const ACCEPTED: &[&str] = &[
        "",
        r#""{}", a, b"#,
        r#""{x} {y:.3}""#,
        r#""escaped \" quote (f(x).y)", e"#,
        "a + b * 2, c == d, e % 10 != 0",
        "&x, !y, -1, *z",
        "name = value, 1e-3, 0x1F, 2u8",
        "self, Self, _",
    ];
    const REJECTED: &[&str] = &[
        r#""{}", x.len()"#,
        r#""{}", f(x)"#,
        "a::b",
        "|x| x",
        "x as f32",
        "return x",
        "S { a }",
        "[a, b]",
        "1.5",
        "a // comment",
        "'c'",
        r##"r#"raw"#"##,
        "x?",
        "\"unterminated",
        "déjà",
    ];

    #[test]
    fn the_scan_accepts_plain_arguments_and_leaves_the_rest_to_the_parser() {
        for text in ACCEPTED {
            assert!(cannot_hold_facts(text), "should accept: {text}");
        }
        for text in REJECTED {
            assert!(!cannot_hold_facts(text), "should reject: {text}");
        }
    }

    /// What the scan accepts records nothing when parsed and visited as ordinary expressions (a
    /// tuple in a function body, visited as macro arguments are): skipping it loses no fact.
    #[test]
    fn accepted_arguments_record_no_fact_when_visited() {
        for text in ACCEPTED.iter().filter(|t| !t.is_empty()) {
            let source = format!("fn f() {{ let _ = ({text},); }}");
            let file = SourceFile::parse("t.rs".into(), source).expect("parses");
            let facts = collect_facts(&file, false);
            assert_eq!(facts.fns.len(), 1, "{text}");
            assert!(facts.calls.is_empty(), "calls in {text}");
            assert!(facts.loops.is_empty(), "loops in {text}");
            assert!(facts.returns.is_empty(), "returns in {text}");
            assert!(facts.field_inits.is_empty(), "field inits in {text}");
            assert!(facts.fns[0].device.is_empty(), "devices in {text}");
            assert!(facts.frameworks.is_empty(), "frameworks in {text}");
        }
    }

    /// Every device the collector records: each call's operand and destination, argument devices,
    /// returned values and struct field values.
    fn recorded_devices(facts: &FileFacts<'_>) -> Vec<String> {
        let mut out: Vec<String> = facts
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| format!("call {i} {}: {:?} -> {:?}", c.name, c.operand, c.dest))
            .collect();
        out.extend(facts.arg_devs.iter().map(|(call, range)| {
            format!("args of {call}: {:?}", &facts.arg_dev_pool[range.clone()])
        }));
        out.extend(facts.returns.iter().map(|r| format!("return {r:?}")));
        out.extend(
            facts
                .field_inits
                .iter()
                .map(|f| format!("field {}.{}: {:?}", f.owner, f.field, f.dev)),
        );
        out
    }

    /// Collects `source` with the memo of call devices and without it, asserts that both record
    /// the same devices, and returns the facts collected with the memo.
    fn same_with_and_without_memo(source: &str, check: impl FnOnce(&FileFacts<'_>)) {
        let file = SourceFile::parse("t.rs".into(), source.to_string()).expect("parses");
        let kept = collect_facts_with(&file, false, true);
        let fresh = collect_facts_with(&file, false, false);
        assert_eq!(
            recorded_devices(&kept),
            recorded_devices(&fresh),
            "in {source}"
        );
        check(&kept);
    }

    fn operand_of(facts: &FileFacts<'_>, name: &str) -> DeviceKind {
        let call = facts.calls.iter().find(|c| c.name == name);
        call.unwrap_or_else(|| panic!("no call {name}"))
            .operand
            .kind
    }

    #[test]
    fn a_long_chain_gets_the_devices_it_got_without_the_memo() {
        // 70 calls on a tensor made on the accelerator: the inner ones see where it lives; past
        // the inference's depth limit, the outer ones do not, with the memo as without it.
        let mut chain = String::from("Tensor::zeros(4, &Device::new_cuda(0).unwrap())");
        for i in 0..70 {
            chain.push_str(&format!(".m{i}()"));
        }
        let source = format!("fn f() {{ let t = {chain}; let u = t.relu(); }}");
        same_with_and_without_memo(&source, |facts| {
            assert_eq!(operand_of(facts, "m1"), DeviceKind::Gpu);
            assert_eq!(operand_of(facts, "m40"), DeviceKind::Gpu);
            assert_eq!(operand_of(facts, "m69"), DeviceKind::Unknown);
        });
        // Shorter: every call, and the binding made of the whole chain, is on the accelerator.
        let source = "fn f() { let t = Tensor::zeros(4, &Device::new_cuda(0)?).a().b().c().d(); \
                      let u = t.relu(); }";
        same_with_and_without_memo(source, |facts| {
            for name in ["a", "b", "c", "d", "relu"] {
                assert_eq!(operand_of(facts, name), DeviceKind::Gpu, "{name}");
            }
        });
    }

    #[test]
    fn a_kept_device_is_not_read_where_other_bindings_are_in_scope() {
        // Inside the closure, `x.c()` (the receiver of `e`) reads the closure's `x`, of unknown
        // device; asked again from outside (the value of `map`'s argument), `x` is the CPU tensor.
        let source = "fn f() { let x = Tensor::zeros(1, &Device::Cpu); \
                      let y = v.map(|x| x.c().e()); y.f(); }";
        same_with_and_without_memo(source, |facts| {
            assert_eq!(operand_of(facts, "e"), DeviceKind::Unknown);
            assert_eq!(operand_of(facts, "f"), DeviceKind::Cpu);
        });
        let sources = [
            "fn f() { let x = Tensor::zeros(4, &Device::Cpu); \
             let y = v.iter().map(|x| x.sum()).chain(x.relu()).last(); }",
            "fn f(d: &Device) { let x = Tensor::ones(2, &Device::Cpu); \
             let s = y.map(|x| { let z = x.to_device(d); z.exp() }).sum(); let w = x.exp().sum(); }",
            "fn f() { let t = a.b(if let Some(x) = o { x.c() } else { w.c() }).d(); x.e(); }",
            "struct S { d: Device } \
             fn f() -> S { let d = Device::new_cuda(0); S { d: d.clone().into() } }",
        ];
        for source in sources {
            same_with_and_without_memo(source, |_| {});
        }
    }

    #[test]
    fn a_kept_device_is_worked_out_again_once_the_framework_is_known() {
        // `Tensor::from_slice` is on the CPU only in a tch file: a path naming tch changes what
        // the same expression means. Here it is worked out as `g`'s receiver before
        // `tch::Kind::Float` names the framework, and asked for again (inside `k`'s receiver)
        // after.
        let source = "fn f() { Tensor::from_slice(&v).g().k(tch::Kind::Float); }";
        same_with_and_without_memo(source, |facts| {
            assert_eq!(operand_of(facts, "g"), DeviceKind::Unknown);
            assert_eq!(operand_of(facts, "k"), DeviceKind::Cpu);
        });
    }

    /// A macro's arguments are found from lines and columns on ASCII lines, and through the span
    /// table after a non-ASCII character on the same line (debug builds also compare the two).
    #[test]
    fn macro_arguments_are_found_after_non_ascii_text() {
        let source = "fn f(t: T) {\n    let s = \"déjà\"; println!(\"{}\", t.a());\n    \
                      println!(\"{} é\", t.b());\n    assert!(t.c(), \"ü\");\n}";
        let file = SourceFile::parse("t.rs".into(), source.to_string()).expect("parses");
        let facts = collect_facts(&file, false);
        let names: Vec<&str> = facts.calls.iter().map(|c| c.name).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn macro_arguments_with_calls_are_still_collected() {
        let source = "fn f(t: T) { println!(\"{}\", t.to_scalar()); format!(\"{a}\", a = 1); }";
        let file = SourceFile::parse("t.rs".into(), source.to_string()).expect("parses");
        let facts = collect_facts(&file, false);
        let names: Vec<&str> = facts.calls.iter().map(|c| c.name).collect();
        assert_eq!(names, ["to_scalar"]);
        assert!(facts.calls[0].in_macro);
    }
}
