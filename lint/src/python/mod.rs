//! The Python front end: parses `.py` files with Ruff's parser (`ruff_python_parser`), lowers each
//! module into facts (functions, loops, calls, bindings) and analyses a package's step loops, so
//! that every rule can check Python code under the same code and documentation as Rust code.
//!
//! A Python package is the set of `.py` files under the nearest directory above them that holds a
//! `pyproject.toml`, `setup.py` or `setup.cfg`; without one, the files of one directory.
//!
//! What the analysis knows, per call: its dotted callee (`torch.cuda.synchronize`, `loss.item`),
//! its function, the loops around it, whether it runs under an `if step % N == 0` guard, under
//! `torch.no_grad()`, or in test code. Per package: which loops are step loops (their body, or a
//! function of the package they call, calls `backward()`, an optimizer's `step()`/`zero_grad()`,
//! `scaler.step(..)`, ...), which of them enclose another (epoch loops), which functions are step
//! bodies (Lightning's `training_step`, `on_train_batch_*`) or are called from one.

pub(crate) mod facts;
pub mod names;
pub mod notebook;
pub(crate) mod suppress;

use std::collections::HashMap;
use std::sync::OnceLock;

use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};

use ruff_python_ast::{CmpOp, Expr, ModModule};
use ruff_python_parser::{ParseOptions, Parsed};
use ruff_text_size::{Ranged, TextRange};

use crate::config::Config;
use crate::diagnostic::{FileError, Region};

pub use facts::{PyAssign, PyCall, PyFacts, PyFn, PyLoop};

/// One parsed Python file.
pub struct PyFile {
    /// The path as walked.
    pub path: PathBuf,
    /// The source text.
    pub source: String,
    /// The syntax tree (the tokens are dropped right after parsing, all but the comments that
    /// may hold suppressions).
    module: ModModule,
    /// The ranges of the comments, when the source mentions `perfkit:` or `noqa` (else empty).
    pub(crate) comments: Vec<TextRange>,
    /// Byte offset of the start of each line (computed when first needed).
    line_starts: OnceLock<Vec<usize>>,
    /// Whether the text is ASCII: a column is then a byte count, found without counting the
    /// characters before it (a generated line with thousands of findings made that quadratic).
    ascii: OnceLock<bool>,
    /// Test code as a whole: `test_*.py`, `*_test.py`, `conftest.py`, or under a `tests/` directory.
    pub test_file: bool,
    /// For a notebook (`.ipynb`): where its code cells lie in `source`.
    pub notebook: Option<notebook::CellIndex>,
}

/// The parser options: the newest Python the parser knows, so that new syntax is never rejected.
pub(crate) fn parse_options() -> ParseOptions {
    ParseOptions::from(ruff_python_ast::PySourceType::Python)
        .with_target_version(ruff_python_ast::PythonVersion::PY314)
}

/// Parses Python source; `Err((message, offset))` for the first syntax error.
pub(crate) fn parse_source(source: &str) -> Result<Parsed<ModModule>, (String, usize)> {
    parse_with(source, parse_options())
}

/// Parses the code cells of a notebook in IPython mode (magics and `!` shell escapes are escape
/// commands); `Err((message, offset))` for the first syntax error.
pub(crate) fn parse_notebook_source(source: &str) -> Result<Parsed<ModModule>, (String, usize)> {
    parse_with(
        source,
        ParseOptions::from(ruff_python_ast::PySourceType::Ipynb)
            .with_target_version(ruff_python_ast::PythonVersion::PY314),
    )
}

/// Syntax that `fixed` uses and `original` nowhere does, which Python 3.8 rejects: a fix must not
/// make a file need a newer Python than it did (`device="cuda"` inserted into a double-quoted
/// f-string reuses its quote, valid from 3.12 only). A file that already uses that syntax needs
/// that Python anyway. The first such use, as (message, byte offset in `fixed`); `None` when the
/// fix adds none.
pub(crate) fn newer_syntax(original: &str, fixed: &str) -> Option<(String, usize)> {
    let options = || {
        ParseOptions::from(ruff_python_ast::PySourceType::Python)
            .with_target_version(ruff_python_ast::PythonVersion::PY38)
    };
    let after = ruff_python_parser::parse_unchecked(fixed, options());
    if after.unsupported_syntax_errors().is_empty() {
        return None;
    }
    let before = ruff_python_parser::parse_unchecked(original, options());
    let known = before.unsupported_syntax_errors();
    after
        .unsupported_syntax_errors()
        .iter()
        .find(|error| !known.iter().any(|k| k.kind == error.kind))
        .map(|error| (error.to_string(), error.range.start().to_usize()))
}

fn parse_with(source: &str, options: ParseOptions) -> Result<Parsed<ModModule>, (String, usize)> {
    let parsed = ruff_python_parser::parse_unchecked(source, options);
    if let Some(error) = parsed.errors().first() {
        return Err((error.error.to_string(), error.location.start().to_usize()));
    }
    match parsed.try_into_module() {
        Some(module) => Ok(module),
        None => Err(("not a module".to_string(), 0)),
    }
}

impl PyFile {
    /// Parses `source` read from `path`; a syntax error is a [`FileError`] with its line.
    pub fn parse(path: PathBuf, source: String) -> Result<PyFile, FileError> {
        let parsed = match parse_source(&source) {
            Ok(parsed) => parsed,
            Err((message, offset)) => {
                return Err(FileError {
                    path,
                    message: format!("syntax error: {message}"),
                    line: Some(line_at(&line_starts(&source), offset)),
                });
            }
        };
        Ok(Self::from_parsed(path, source, parsed, None))
    }

    /// A parsed file: the tree kept, the tokens dropped (only comment ranges are kept, and only
    /// where a suppression may be written).
    fn from_parsed(
        path: PathBuf,
        source: String,
        parsed: Parsed<ModModule>,
        notebook: Option<notebook::CellIndex>,
    ) -> PyFile {
        let test_file = is_test_path(&path);
        let comments = if suppress::may_suppress(&source) {
            parsed
                .tokens()
                .iter()
                .filter(|token| token.kind() == ruff_python_ast::token::TokenKind::Comment)
                .map(Ranged::range)
                .collect()
        } else {
            Vec::new()
        };
        PyFile {
            path,
            source,
            module: parsed.into_syntax(),
            comments,
            line_starts: OnceLock::new(),
            ascii: OnceLock::new(),
            test_file,
            notebook,
        }
    }

    /// Reads a notebook's JSON text (see [`notebook`]): its Python code cells as one module. A
    /// malformed notebook is a [`FileError`] with the JSON line; a syntax error names its cell.
    pub fn parse_notebook(path: PathBuf, text: &str) -> Result<PyFile, FileError> {
        let nb = notebook::read(text).map_err(|err| FileError {
            path: path.clone(),
            message: err.message,
            line: err.line,
        })?;
        let source = nb.source;
        let parsed = match parse_notebook_source(&source) {
            Ok(parsed) => parsed,
            Err((message, offset)) => {
                // Jupyter compiles each cell alone: the error is that of the first cell that does
                // not parse by itself (an unclosed bracket at the end of a cell is its own
                // error, not the next cell's). Else, as the whole module reads it.
                let starts = line_starts(&source);
                let (message, place) = first_cell_error(&source, &starts, &nb.index)
                    .unwrap_or_else(|| (message, nb.index.locate(line_at(&starts, offset))));
                let place = match place {
                    Some((cell, line)) => format!("cell {cell}, line {line}: "),
                    None => String::new(),
                };
                return Err(FileError {
                    path,
                    message: format!("syntax error in {place}{message}"),
                    line: None,
                });
            }
        };
        Ok(Self::from_parsed(path, source, parsed, Some(nb.index)))
    }

    /// How a message names the line of byte `offset`: `line 12`, or `cell 3, line 2` in a notebook.
    pub fn line_name(&self, offset: usize) -> String {
        let line = self.line_of(offset);
        match self.notebook.as_ref().and_then(|index| index.locate(line)) {
            Some((cell, line)) => format!("cell {cell}, line {line}"),
            None => format!("line {line}"),
        }
    }

    /// `PATH:LINE` of a line of this file, as notes name places: `nb.ipynb:cell 3:2` in a notebook.
    pub fn place(&self, line: usize) -> String {
        match self.notebook.as_ref().and_then(|index| index.locate(line)) {
            Some((cell, line)) => format!("{}:cell {cell}:{line}", self.path.display()),
            None => format!("{}:{line}", self.path.display()),
        }
    }

    /// The module's statements.
    pub fn module(&self) -> &ModModule {
        &self.module
    }

    /// 1-based line of a byte offset.
    pub fn line_of(&self, offset: usize) -> usize {
        line_at(self.line_starts(), offset)
    }

    fn line_starts(&self) -> &[usize] {
        self.line_starts.get_or_init(|| line_starts(&self.source))
    }

    /// The region of a byte range (1-based lines, columns in characters, end exclusive).
    pub fn region(&self, range: TextRange) -> Region {
        let (line, column) = self.line_col(range.start().to_usize());
        let (end_line, end_column) = self.line_col(range.end().to_usize());
        Region {
            line,
            column,
            end_line,
            end_column,
        }
    }

    fn line_col(&self, offset: usize) -> (usize, usize) {
        let line = self.line_of(offset);
        let start = self.line_starts()[line - 1];
        if *self.ascii.get_or_init(|| self.source.is_ascii()) && offset <= self.source.len() {
            return (line, offset.saturating_sub(start) + 1);
        }
        let column = self
            .source
            .get(start..offset)
            // A byte-order mark starts the file, not its first line: editors do not count it.
            .map(|s| match start {
                0 => s.strip_prefix('\u{feff}').unwrap_or(s),
                _ => s,
            })
            .map_or(1, |s| s.chars().count() + 1);
        (line, column)
    }

    /// The source text of a range.
    pub fn text(&self, range: TextRange) -> &str {
        self.source
            .get(range.start().to_usize()..range.end().to_usize())
            .unwrap_or("")
    }
}

/// The 1-based line of byte `offset`, given each line's start.
fn line_at(starts: &[usize], offset: usize) -> usize {
    starts.partition_point(|&s| s <= offset).max(1)
}

/// The syntax error of the first code cell that does not parse alone, with its cell and the line
/// in it.
fn first_cell_error(
    source: &str,
    starts: &[usize],
    index: &notebook::CellIndex,
) -> Option<(String, Option<(usize, usize)>)> {
    let cells = index.starts();
    let byte_of_line = |line: usize| starts.get(line - 1).copied().unwrap_or(source.len());
    cells.iter().enumerate().find_map(|(i, &(cell, first))| {
        let start = byte_of_line(first);
        let end = cells
            .get(i + 1)
            .map_or(source.len(), |&(_, next)| byte_of_line(next));
        let text = source.get(start..end)?;
        let (message, offset) = parse_notebook_source(text).err()?;
        // Past the cell's own lines (a `\` at its end): its last line, not the blank line the
        // module puts after each cell.
        let text_starts = line_starts(text);
        let own_lines = text_starts.len().saturating_sub(2).max(1);
        let line = line_at(&text_starts, offset).min(own_lines);
        Some((message, Some((cell, line))))
    })
}

/// The byte offset of each line: lines end at `\n`, `\r\n` or a lone `\r`, as Python reads them.
pub(crate) fn line_starts(source: &str) -> Vec<usize> {
    let bytes = source.as_bytes();
    // Room for lines of about 32 bytes, so that the table is rarely copied as it grows.
    let mut starts = Vec::with_capacity(bytes.len() / 32 + 1);
    starts.push(0);
    if memchr::memchr(b'\r', bytes).is_none() {
        // No `\r` anywhere (most files): every line ends at a `\n`.
        starts.extend(memchr::memchr_iter(b'\n', bytes).map(|i| i + 1));
        return starts;
    }
    starts.extend(
        memchr::memchr2_iter(b'\n', b'\r', bytes)
            .filter(|&i| bytes[i] == b'\n' || bytes.get(i + 1) != Some(&b'\n'))
            .map(|i| i + 1),
    );
    starts
}

/// Whether a path is Python test code by its name or directory.
fn is_test_path(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with("test_") || name.ends_with("_test.py") || name == "conftest.py" {
        return true;
    }
    path.components()
        .any(|c| matches!(c, std::path::Component::Normal(dir) if dir == "tests" || dir == "test"))
}

/// A file of the package with its facts.
pub struct PyUnit<'a> {
    pub file: &'a PyFile,
    pub facts: PyFacts<'a>,
}

/// Where a piece of code runs per step: the step loop (or step body) it is in or called from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyHit {
    /// File and line of the step loop (or of the `training_step` definition).
    pub loop_file: usize,
    pub loop_line: usize,
    /// The step loop is Lightning's `training_step` (or an `on_train_batch_*` hook).
    pub step_body: Option<String>,
    /// Functions called on the way from the step loop, outermost first.
    pub via: Vec<String>,
    /// The code runs in a loop that encloses the per-batch step loop (once per epoch).
    pub outer: bool,
    /// The code runs under an `if step % N == 0` guard.
    pub guarded: bool,
    /// The step loop is an optimizer-step loop around an accumulation loop (see
    /// `PyContext::optimizer_loop`).
    pub optimizer_loop: bool,
}

impl PyHit {
    /// Whether the code runs on every step (not lowered to a note).
    pub fn is_per_step(&self) -> bool {
        !self.outer && !self.guarded
    }
}

/// A package's facts and analysis, what Python rules read.
pub struct PyContext<'a> {
    pub units: &'a [PyUnit<'a>],
    pub config: &'a Config,
    /// Per file, per loop: is it a step loop.
    step_loop: Vec<Vec<bool>>,
    /// Per file, per loop: does it enclose a step loop (directly or through a call).
    outer_loop: Vec<Vec<bool>>,
    /// Per file, per loop: a loop that steps the optimizer around inner loops that only run
    /// `backward()` (gradient accumulation over micro-batches): it runs once per optimizer step,
    /// so it is a step loop, not an epoch loop.
    optimizer_loop: Vec<Vec<bool>>,
    /// Per file, per function: the step loop it is called from (or it is a step body).
    fn_hit: Vec<Vec<Option<PyHit>>>,
    /// Per file, per function: does it contain a step loop (directly or through its calls).
    has_step_loop: Vec<Vec<bool>>,
    /// Functions by name: (file, fn index), module-level functions and methods apart.
    by_name: FxHashMap<&'a str, NamedFns>,
    /// The calls that link functions of the package or mark steps, in package order: every call
    /// with a step marker or with targets (see [`PyContext::targets`]). Most calls have neither
    /// (`torch.zeros(..)`, `x.view(..)`), so the analysis's passes read this list, not every call.
    linked: Vec<LinkedCall>,
    /// Per file, the range of [`PyContext::linked`] that holds its calls.
    linked_by_file: Vec<std::ops::Range<usize>>,
    /// Per file: one of its calls asks for the devices (`torch.cuda.is_available()`,
    /// `device_count()`), which lets it choose a GPU index.
    checks_devices: Vec<bool>,
    /// Calls outside tests with a number or string literal among their arguments
    /// (`.cuda(0)`, `batch_size=8`, `strategy="dp"`): (file, call index), in package order.
    literal_calls: Vec<(u32, u32)>,
    /// Calls that format values into text (see [`PyCall::formats`]): (file, call index).
    formatting_calls: Vec<(u32, u32)>,
    /// The first call outside tests, in package order, that builds an optimizer (see
    /// [`PyContext::first_optimizer`]).
    first_optimizer: Option<(u32, u32)>,
    /// The calls of each name of [`INDEXED_NAMES`], then of each suffix of [`INDEXED_SUFFIXES`]
    /// (see [`PyContext::calls_named`]): (file, call index), in package order.
    calls_by_name: Vec<Vec<(u32, u32)>>,
    mixed_precision: OnceLock<bool>,
    /// See [`PyContext::cpu_only_program`].
    cpu_only_program: OnceLock<bool>,
    grad_accumulation: OnceLock<bool>,
    /// The calls of each function of the package: (file, function) -> (file, call index).
    callers: OnceLock<Callers>,
    /// The classes defined at the top level of the package's modules, with their bases.
    classes: OnceLock<FxHashMap<&'a str, Vec<String>>>,
}

/// The calls of each function: (file, function) -> (file, call index).
type Callers = FxHashMap<(usize, usize), Vec<(usize, usize)>>;

/// The callee names the rules look up through [`PyContext::calls_named`]: each package indexes
/// its calls of these names once (see [`indexed_slot`]).
const INDEXED_NAMES: &[&str] = &[
    "add",
    "add_scalar",
    "append",
    "bool",
    "cat",
    "concat",
    "concatenate",
    "cpu",
    "cuda",
    "empty",
    "empty_cache",
    "extend",
    "float",
    "full",
    "int",
    "item",
    "load",
    "log",
    "numpy",
    "ones",
    "print",
    "putenv",
    "setdefault",
    "stack",
    "synchronize",
    "to",
    "tolist",
    "type_as",
    "zeros",
];

/// The position of `name` in [`INDEXED_NAMES`]. Asked once per call of the package: a `match`
/// (a jump on the length, then a compare or two) costs a fraction of a search over the list.
fn indexed_slot(name: &str) -> Option<usize> {
    Some(match name {
        "add" => 0,
        "add_scalar" => 1,
        "append" => 2,
        "bool" => 3,
        "cat" => 4,
        "concat" => 5,
        "concatenate" => 6,
        "cpu" => 7,
        "cuda" => 8,
        "empty" => 9,
        "empty_cache" => 10,
        "extend" => 11,
        "float" => 12,
        "full" => 13,
        "int" => 14,
        "item" => 15,
        "load" => 16,
        "log" => 17,
        "numpy" => 18,
        "ones" => 19,
        "print" => 20,
        "putenv" => 21,
        "setdefault" => 22,
        "stack" => 23,
        "synchronize" => 24,
        "to" => 25,
        "tolist" => 26,
        "type_as" => 27,
        "zeros" => 28,
        _ => return None,
    })
}

/// The callee-name suffixes the rules look up through [`PyContext::calls_named_ending`].
const INDEXED_SUFFIXES: &[&str] = &["DataLoader", "Trainer", "Fabric", "DataParallel"];

/// Whether a call builds an optimizer: a constructor of `torch.optim` (or a known optimizer
/// class) called by its plain name or through a path that names `optim`, not a trainer.
fn builds_optimizer(call: &PyCall<'_>) -> bool {
    let Some(path) = call.path.as_deref() else {
        return false;
    };
    // Asked of every call of the package: most are passed over on their first byte (a plain
    // name is a constructor only as a class name, with a capital) or on a search for `optim`.
    let plain = call.func_name.is_some();
    if plain && !path.starts_with(|c: char| c.is_ascii_uppercase()) {
        return false;
    }
    if !plain && !path.as_bytes().windows(5).any(|w| w == b"optim") {
        return false;
    }
    let trainer = path.ends_with("Trainer") || path.ends_with("Fabric");
    !trainer && names::is_optimizer_constructor(path)
}

/// The last name of a call's callee: `item` of `loss.item()`, `float` of `float(t)`.
fn call_name<'a>(call: &PyCall<'a>) -> Option<&'a str> {
    call.method.or(call.func_name)
}

/// Per file, per function: what [`PyContext::optimizer_stepping`] found.
struct OptimizerStepping {
    /// Steps the optimizer, directly or through the package's functions.
    steps: Vec<Vec<bool>>,
    /// Has a step loop that steps the optimizer, directly or through the package's functions.
    in_step_loop: Vec<Vec<bool>>,
}

/// Sets every function that calls (along `edges`, transitively) a function already set.
#[allow(clippy::needless_range_loop)]
fn propagate(table: &mut [Vec<bool>], edges: &[Vec<Vec<(usize, usize)>>]) {
    let mut changed = true;
    while changed {
        changed = false;
        for f in 0..table.len() {
            for fi in 0..table[f].len() {
                if !table[f][fi] && edges[f][fi].iter().any(|&(g, gi)| table[g][gi]) {
                    table[f][fi] = true;
                    changed = true;
                }
            }
        }
    }
}

/// The most functions of one name a call is followed into (more: the name is too common to tell).
const MAX_TARGETS: usize = 3;
/// How deep calls are followed from a step loop.
const MAX_CALL_DEPTH: usize = 6;

/// The package's functions of one name.
#[derive(Default)]
struct NamedFns {
    /// Module-level functions: (file, fn index).
    functions: Vec<(usize, usize)>,
    /// Methods of classes: (file, fn index).
    methods: Vec<(usize, usize)>,
}

/// The functions a call may run: at most [`MAX_TARGETS`], held inline (most calls have none,
/// and none allocates).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Targets {
    found: [(usize, usize); MAX_TARGETS],
    len: usize,
}

impl Targets {
    pub fn as_slice(&self) -> &[(usize, usize)] {
        &self.found[..self.len]
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl IntoIterator for Targets {
    type Item = (usize, usize);
    type IntoIter = std::iter::Take<std::array::IntoIter<(usize, usize), MAX_TARGETS>>;

    fn into_iter(self) -> Self::IntoIter {
        self.found.into_iter().take(self.len)
    }
}

/// The targets, unless there are more than [`MAX_TARGETS`] (the name is too common to tell).
fn capped(targets: impl Iterator<Item = (usize, usize)>) -> Targets {
    let mut found = Targets::default();
    for target in targets {
        if found.len == MAX_TARGETS {
            return Targets::default();
        }
        found.found[found.len] = target;
        found.len += 1;
    }
    found
}

/// A call that links functions of the package or marks a step (see [`PyContext::linked`]).
struct LinkedCall {
    file: usize,
    /// Its index in its file's calls.
    call: usize,
    /// A step marker (see [`PyContext::is_marker`]); only asked of calls in a function or a loop.
    marker: bool,
    targets: Targets,
}

impl<'a> PyContext<'a> {
    /// Analyses a package.
    pub fn build(units: &'a [PyUnit<'a>], config: &'a Config) -> PyContext<'a> {
        let mut by_name: FxHashMap<&'a str, NamedFns> = FxHashMap::default();
        for (f, unit) in units.iter().enumerate() {
            for (i, func) in unit.facts.fns.iter().enumerate() {
                let named = by_name.entry(func.name).or_default();
                match func.class {
                    None => named.functions.push((f, i)),
                    Some(_) => named.methods.push((f, i)),
                }
            }
        }
        let mut cx = PyContext {
            units,
            config,
            step_loop: units
                .iter()
                .map(|u| vec![false; u.facts.loops.len()])
                .collect(),
            outer_loop: units
                .iter()
                .map(|u| vec![false; u.facts.loops.len()])
                .collect(),
            optimizer_loop: units
                .iter()
                .map(|u| vec![false; u.facts.loops.len()])
                .collect(),
            fn_hit: units
                .iter()
                .map(|u| vec![None; u.facts.fns.len()])
                .collect(),
            has_step_loop: units
                .iter()
                .map(|u| vec![false; u.facts.fns.len()])
                .collect(),
            by_name,
            linked: Vec::new(),
            linked_by_file: Vec::with_capacity(units.len()),
            checks_devices: vec![false; units.len()],
            literal_calls: Vec::new(),
            formatting_calls: Vec::new(),
            first_optimizer: None,
            calls_by_name: vec![Vec::new(); INDEXED_NAMES.len() + INDEXED_SUFFIXES.len()],
            mixed_precision: OnceLock::new(),
            cpu_only_program: OnceLock::new(),
            grad_accumulation: OnceLock::new(),
            callers: OnceLock::new(),
            classes: OnceLock::new(),
        };
        // One pass over every call of the package, while each is read anyway: the calls the
        // analysis follows (markers and calls into the package's functions), and, for the rules,
        // the calls of a few names (so that each rule reads those only, not every call), the
        // calls with literal arguments and the first optimizer.
        for (f, unit) in units.iter().enumerate() {
            let first = cx.linked.len();
            for (i, call) in unit.facts.calls.iter().enumerate() {
                let at = (f as u32, i as u32);
                if let Some(name) = call_name(call) {
                    if let Some(slot) = indexed_slot(name) {
                        cx.calls_by_name[slot].push(at);
                    }
                    // The suffixes end in `r`, `c` or `l`: most names are passed over on their
                    // last byte.
                    if matches!(name.as_bytes().last(), Some(b'r' | b'c' | b'l')) {
                        for (k, suffix) in INDEXED_SUFFIXES.iter().enumerate() {
                            if name.ends_with(suffix) {
                                cx.calls_by_name[INDEXED_NAMES.len() + k].push(at);
                            }
                        }
                    }
                    if matches!(name, "is_available" | "device_count") && call.method.is_some() {
                        cx.checks_devices[f] = true;
                    }
                }
                if call.formats {
                    cx.formatting_calls.push(at);
                }
                if !call.in_test {
                    if call.number_arg || call.string_arg {
                        cx.literal_calls.push(at);
                    }
                    if cx.first_optimizer.is_none() && builds_optimizer(call) {
                        cx.first_optimizer = Some(at);
                    }
                }
                let targets = cx.targets(f, call);
                let marker =
                    (call.fn_idx.is_some() || !call.loops.is_empty()) && cx.is_marker(f, call);
                if marker || !targets.is_empty() {
                    cx.linked.push(LinkedCall {
                        file: f,
                        call: i,
                        marker,
                        targets,
                    });
                }
            }
            cx.linked_by_file.push(first..cx.linked.len());
        }
        cx.analyse();
        cx
    }

    /// Whether any file of the package mentions 16-bit precision (autocast, bfloat16, half, ...).
    pub fn mixed_precision(&self) -> bool {
        *self.mixed_precision.get_or_init(|| {
            self.units
                .iter()
                .any(|u| names::mentions_mixed_precision(&u.file.source))
        })
    }

    /// Whether a call named like a loader (`DataLoader(..)`, `DistributedDataLoader(..)`) builds
    /// PyTorch's `DataLoader`, with its `num_workers` and its positional batch size. A class of the
    /// package's own (`class DistributedDataLoader:` reading shards of a token file) is not one
    /// unless it derives from a `DataLoader`; a name from outside the package is taken for one (a
    /// subclass such as `MultiEpochsDataLoader` takes the same arguments).
    pub fn builds_torch_data_loader(&self, call: &PyCall<'_>) -> bool {
        let Some(path) = call.path.as_deref() else {
            return false;
        };
        let name = path.rsplit('.').next().unwrap_or(path);
        if !name.ends_with("DataLoader") {
            return false;
        }
        match self.package_class_bases(name) {
            None => true,
            Some(bases) => bases.iter().any(|b| b.ends_with("DataLoader")),
        }
    }

    /// The base classes (as written, dotted) of a class named `name` defined at the top level of a
    /// module of this package, if there is one.
    pub fn package_class_bases(&self, name: &str) -> Option<&[String]> {
        let classes = self.classes.get_or_init(|| {
            let mut classes = FxHashMap::default();
            for unit in self.units {
                for stmt in &unit.file.module().body {
                    if let ruff_python_ast::Stmt::ClassDef(class) = stmt {
                        let bases = class
                            .arguments
                            .as_ref()
                            .map(|a| a.args.iter().filter_map(facts::dotted).collect())
                            .unwrap_or_default();
                        classes.entry(class.name.as_str()).or_insert(bases);
                    }
                }
            }
            classes
        });
        classes.get(name).map(Vec::as_slice)
    }

    /// Whether the package is a program that runs on the CPU only: it starts itself (a
    /// `__main__` guard, or a step loop at module level) and no file of it mentions an
    /// accelerator (CUDA, a device, a GPU, ...). A library function that receives its model and
    /// batches as arguments is not one: its caller may have put them on a GPU.
    pub fn cpu_only_program(&self) -> bool {
        *self.cpu_only_program.get_or_init(|| {
            let program = self.units.iter().enumerate().any(|(f, u)| {
                memchr::memmem::find(u.file.source.as_bytes(), b"__main__").is_some()
                    || u.facts
                        .loops
                        .iter()
                        .enumerate()
                        .any(|(l, lp)| lp.fn_idx.is_none() && self.step_loop[f][l])
            });
            program
                && !self
                    .units
                    .iter()
                    .any(|u| names::mentions_accelerator(&u.file.source))
        })
    }

    /// Whether any file of the package shows gradient accumulation.
    pub fn grad_accumulation(&self) -> bool {
        *self.grad_accumulation.get_or_init(|| {
            self.units
                .iter()
                .any(|u| names::mentions_grad_accumulation(&u.file.source))
        })
    }

    /// The functions a call may run: same-package functions of its name (`foo(..)`, `self.foo(..)`,
    /// `module.foo(..)`), methods of the caller's class first.
    pub fn targets(&self, file: usize, call: &PyCall<'a>) -> Targets {
        // `next(batches)` where `batches = get_batch(..)`, a generator of the package: each
        // `next` runs its body up to the next `yield`.
        if call.func_name == Some("next") && !self.by_name.contains_key("next") {
            return self.generator_targets(file, call);
        }
        let (name, is_self) = match (call.func_name, call.method, call.receiver) {
            (Some(name), _, _) => (name, false),
            (None, Some(method), Some(Expr::Name(recv))) => {
                (method, matches!(recv.id.as_str(), "self" | "cls"))
            }
            _ => return Targets::default(),
        };
        let Some(found) = self.by_name.get(name) else {
            return Targets::default();
        };
        if !is_self {
            if let (None, Some(receiver @ Expr::Name(recv))) = (call.func_name, call.receiver) {
                // `metric_logger.update(..)` where `metric_logger = utils.MetricLogger(..)`, a
                // class of the package: that class's method.
                if !found.methods.is_empty()
                    && let Some(class) = self.bound_package_class(file, call, receiver)
                {
                    return capped(found.methods.iter().copied().filter(|&(f, i)| {
                        self.units[f].facts.fns[i].class == Some(class.as_str())
                    }));
                }
                // `x.foo(..)` runs a module-level function only when `x` is an imported module
                // (`utils.foo(..)`): `model.train()` is a method of the model, not the script's
                // `def train(..)`.
                if !found.functions.is_empty()
                    && !self.units[file].facts.imports.contains(&recv.id.as_str())
                {
                    return Targets::default();
                }
            }
            // A plain call (a module-level function, or a class: its `__init__` is not a step), or
            // `module.foo(..)`.
            return self.module_functions(file, call, &found.functions);
        }
        let caller_class = call
            .fn_idx
            .and_then(|i| self.units[file].facts.fns[i].class);
        let class_of = |f: usize, i: usize| self.units[f].facts.fns[i].class;
        if caller_class.is_some() {
            // Methods of the caller's own class first.
            let mut same = found
                .methods
                .iter()
                .copied()
                .filter(|&(f, i)| f == file && class_of(f, i) == caller_class)
                .peekable();
            if same.peek().is_some() {
                return capped(same);
            }
        }
        capped(found.methods.iter().copied().filter(|&(f, i)| {
            caller_class.is_none() || class_of(f, i) == caller_class || f != file
        }))
    }

    /// What a call of one function of the package returns: a tensor when every `return` of it
    /// gives one (by binding, in the function's own scope), else nothing known. A generator
    /// returns a generator, and a name several functions define says nothing.
    fn returned_kind(
        &self,
        file: usize,
        call: &ruff_python_ast::ExprCall,
        depth: usize,
    ) -> ValueKind {
        // Followed two functions deep at most: each level asks every `return` of the function,
        // and functions returning each other's values would multiply the questions.
        if depth > 2 {
            return ValueKind::Unknown;
        }
        let Some(recorded) = self.call_of(file, call) else {
            return ValueKind::Unknown;
        };
        let targets = self.targets(file, recorded);
        let [(g, gi)] = targets.as_slice() else {
            return ValueKind::Unknown;
        };
        let function = &self.units[*g].facts.fns[*gi];
        if function.generator {
            return ValueKind::Unknown;
        }
        let returns = function.returns();
        if !returns.is_empty()
            && returns.iter().all(|r| {
                self.value_kind_depth(*g, Some(*gi), r, r.start().to_usize(), depth + 1, false)
                    .is_tensor()
            })
        {
            ValueKind::Tensor
        } else {
            ValueKind::Unknown
        }
    }

    /// The generators of the package that `next(it)` runs: `it` bound to a call of one.
    fn generator_targets(&self, file: usize, call: &PyCall<'a>) -> Targets {
        let Some(arg @ Expr::Name(_)) = call.call.arguments.args.first() else {
            return Targets::default();
        };
        let Some(assign) = self.binding(file, call.fn_idx, arg, call.start) else {
            return Targets::default();
        };
        let Expr::Call(made) = assign.value else {
            return Targets::default();
        };
        if assign.loop_target {
            return Targets::default();
        }
        let Some(made) = self.call_of(file, made) else {
            return Targets::default();
        };
        self.generators_called(file, made)
    }

    /// Of the functions a call runs, the generators (see [`PyFn::generator`]).
    pub fn generators_called(&self, file: usize, call: &PyCall<'a>) -> Targets {
        capped(
            self.targets(file, call)
                .into_iter()
                .filter(|&(f, i)| self.units[f].facts.fns[i].generator),
        )
    }

    /// The recorded call of `file` that is the call expression `expr`. Calls are listed in
    /// visiting order, nearly by offset, so the search looks around `expr`'s offset only.
    pub fn call_of(&self, file: usize, expr: &ruff_python_ast::ExprCall) -> Option<&'a PyCall<'a>> {
        let calls = &self.units[file].facts.calls;
        let start = expr.start().to_usize();
        let at = calls.partition_point(|c| c.start < start);
        let window = &calls[at.saturating_sub(64)..(at + 64).min(calls.len())];
        window.iter().find(|c| std::ptr::eq(c.call, expr))
    }

    /// The class of the package a name was bound to an instance of (`logger = MetricLogger(..)`,
    /// `utils.MetricLogger(..)`), named as its `class` statement names it.
    fn bound_package_class(
        &self,
        file: usize,
        call: &PyCall<'a>,
        receiver: &Expr,
    ) -> Option<String> {
        let callee = self.bound_call(file, call.fn_idx, receiver, call.start)?;
        let class = callee.rsplit('.').next().unwrap_or(&callee);
        // Classes are named in CamelCase: a lowercase callee is a function, whose result says
        // nothing of its type here.
        if !class.starts_with(|c: char| c.is_ascii_uppercase()) {
            return None;
        }
        self.package_class_bases(class)?;
        Some(class.to_string())
    }

    /// Of the package's module-level functions of a call's name, those the call runs when the
    /// code says which module's: the caller's own `def` for a plain call, else the module it
    /// imported the name from (`from utils_simmim import get_grad_norm`), or the module named
    /// by `utils.foo(..)`. Otherwise, or when that module is not one of the package's files,
    /// every one of them.
    fn module_functions(
        &self,
        file: usize,
        call: &PyCall<'a>,
        functions: &[(usize, usize)],
    ) -> Targets {
        let module = match (call.func_name, call.receiver) {
            (Some(_), _) if functions.iter().any(|&(f, _)| f == file) => {
                return capped(functions.iter().copied().filter(|&(f, _)| f == file));
            }
            (Some(name), _) => self.units[file]
                .facts
                .from_imports
                .iter()
                .rev()
                .find(|(bound, _)| *bound == name)
                .map(|&(_, module)| module),
            (None, Some(Expr::Name(recv))) => Some(recv.id.as_str()),
            _ => None,
        };
        // A module is a file (`utils_simmim.py`) or a package directory (`utils/__init__.py`).
        let is_module = |f: usize, module: &str| {
            let path = &self.units[f].file.path;
            match path.file_stem().and_then(|s| s.to_str()) {
                Some("__init__") => path
                    .parent()
                    .and_then(|d| d.file_name())
                    .is_some_and(|d| d == module),
                stem => stem == Some(module),
            }
        };
        match module {
            Some(module) if functions.iter().any(|&(f, _)| is_module(f, module)) => capped(
                functions
                    .iter()
                    .copied()
                    .filter(|&(f, _)| is_module(f, module)),
            ),
            _ => capped(functions.iter().copied()),
        }
    }

    // The fixpoints index several per-function tables with the same (file, function) pair.
    #[allow(clippy::needless_range_loop)]
    fn analyse(&mut self) {
        let units = self.units;
        // 1. Which functions reach a step marker (directly or through the package's functions).
        let mut reaches: Vec<Vec<bool>> = units
            .iter()
            .map(|u| vec![false; u.facts.fns.len()])
            .collect();
        let mut edges: Vec<Vec<Vec<(usize, usize)>>> = units
            .iter()
            .map(|u| vec![Vec::new(); u.facts.fns.len()])
            .collect();
        for linked in &self.linked {
            let (f, call) = (linked.file, &units[linked.file].facts.calls[linked.call]);
            let Some(fi) = call.fn_idx else { continue };
            if linked.marker {
                reaches[f][fi] = true;
            }
            edges[f][fi].extend_from_slice(linked.targets.as_slice());
        }
        propagate(&mut reaches, &edges);
        // 2. Step loops: a marker, or a call into a reaching function, in the loop body.
        for linked in &self.linked {
            let (f, call) = (linked.file, &units[linked.file].facts.calls[linked.call]);
            if call.in_test || call.loops.is_empty() {
                continue;
            }
            let step = linked.marker
                || linked
                    .targets
                    .as_slice()
                    .iter()
                    .any(|&(g, gi)| reaches[g][gi]);
            if step {
                for &l in call.loops.iter() {
                    self.step_loop[f][l] = true;
                }
            }
        }
        // 3. Functions containing a step loop (directly or through calls), then outer loops.
        for (f, unit) in units.iter().enumerate() {
            for (l, lp) in unit.facts.loops.iter().enumerate() {
                if self.step_loop[f][l]
                    && let Some(fi) = lp.fn_idx
                {
                    self.has_step_loop[f][fi] = true;
                }
            }
        }
        propagate(&mut self.has_step_loop, &edges);
        for (f, unit) in units.iter().enumerate() {
            for (l, lp) in unit.facts.loops.iter().enumerate() {
                if let Some(parent) = lp.parent
                    && self.step_loop[f][l]
                {
                    // Every step loop around a step loop is an epoch loop.
                    let mut p = Some(parent);
                    while let Some(q) = p {
                        if self.step_loop[f][q] {
                            self.outer_loop[f][q] = true;
                        }
                        p = unit.facts.loops[q].parent;
                    }
                }
            }
        }
        for linked in &self.linked {
            let (f, call) = (linked.file, &units[linked.file].facts.calls[linked.call]);
            if call.loops.is_empty() {
                continue;
            }
            if linked
                .targets
                .as_slice()
                .iter()
                .any(|&(g, gi)| self.has_step_loop[g][gi])
            {
                for &l in call.loops.iter() {
                    if self.step_loop[f][l] {
                        self.outer_loop[f][l] = true;
                    }
                }
            }
        }
        // An optimizer-step loop around accumulation loops is the step loop (once per optimizer
        // step), not an epoch loop: the accumulation loop may be in the loop's body or in a
        // function it calls (`run_step()` calling `forward_backward()`, whose loop runs
        // `backward()` per micro-batch, then `optimize()`, which steps the optimizer).
        let stepping = self
            .outer_loop
            .iter()
            .flatten()
            .any(|&outer| outer)
            .then(|| self.optimizer_stepping(&edges));
        if let Some(stepping) = &stepping {
            for (f, unit) in units.iter().enumerate() {
                for l in 0..unit.facts.loops.len() {
                    if self.outer_loop[f][l]
                        && self.steps_optimizer_around_accumulation(f, l, stepping)
                    {
                        self.outer_loop[f][l] = false;
                        self.optimizer_loop[f][l] = true;
                    }
                }
                // A loop between the optimizer-step loop and the accumulation loop
                // (`for step: for example: for micro: loss.backward()`, then `opt.step()`) runs at
                // least once per optimizer step: it is no epoch loop. Parents come first.
                for l in 0..unit.facts.loops.len() {
                    if self.outer_loop[f][l]
                        && unit.facts.loops[l]
                            .parent
                            .is_some_and(|p| self.optimizer_loop[f][p])
                    {
                        self.outer_loop[f][l] = false;
                        self.optimizer_loop[f][l] = true;
                    }
                }
            }
        }
        // 4. Step bodies and functions called from step loops.
        let mut queue: Vec<(usize, usize)> = Vec::new();
        for (f, unit) in units.iter().enumerate() {
            for (fi, func) in unit.facts.fns.iter().enumerate() {
                if func.step_body && !func.in_test {
                    self.fn_hit[f][fi] = Some(PyHit {
                        loop_file: f,
                        loop_line: unit.file.line_of(func.range.start().to_usize()),
                        step_body: Some(func.name.to_string()),
                        via: Vec::new(),
                        outer: false,
                        guarded: false,
                        optimizer_loop: false,
                    });
                    queue.push((f, fi));
                }
            }
        }
        // Calls made directly in step loops.
        let mut seeds = Vec::new();
        for linked in &self.linked {
            if linked.targets.is_empty() {
                continue;
            }
            let (f, call) = (linked.file, &units[linked.file].facts.calls[linked.call]);
            if let Some(hit) = self.loop_hit(f, call) {
                for target in linked.targets {
                    seeds.push((target, hit.clone(), call.display_name()));
                }
            }
        }
        // A step loop over a generator of the package (`for x, y in batches(data):`) runs the
        // generator's body up to its next `yield` once per iteration, as if it were called there.
        for (f, unit) in units.iter().enumerate() {
            for (l, lp) in unit.facts.loops.iter().enumerate() {
                let Some(Expr::Call(iter)) = lp.iter else {
                    continue;
                };
                if !self.step_loop[f][l] {
                    continue;
                }
                let Some(call) = self.call_of(f, iter).filter(|c| !c.in_test) else {
                    continue;
                };
                let generators = self.generators_called(f, call);
                if generators.is_empty() {
                    continue;
                }
                let hit = PyHit {
                    loop_file: f,
                    loop_line: unit.file.line_of(lp.range.start().to_usize()),
                    step_body: None,
                    via: Vec::new(),
                    outer: self.outer_loop[f][l],
                    guarded: false,
                    optimizer_loop: self.optimizer_loop[f][l],
                };
                for target in generators {
                    seeds.push((target, hit.clone(), call.display_name()));
                }
            }
        }
        // A function with a step loop of its own, called from a step loop, runs once per
        // iteration of an epoch loop; called from an optimizer-step loop, a function whose step
        // loops only accumulate gradients (`forward_backward()`, or `run_step()` that calls it and
        // then steps the optimizer) runs once per optimizer step.
        let accumulates_only = |g: usize, gi: usize| {
            stepping
                .as_ref()
                .is_some_and(|stepping| !stepping.in_step_loop[g][gi])
        };
        let runs_per_epoch = |hit: &PyHit, g: usize, gi: usize| {
            self.has_step_loop[g][gi] && !(hit.optimizer_loop && accumulates_only(g, gi))
        };
        for ((g, gi), mut hit, name) in seeds {
            hit.via.push(name);
            if runs_per_epoch(&hit, g, gi) {
                hit.outer = true;
            }
            if self.fn_hit[g][gi]
                .as_ref()
                .is_none_or(|old| !old.is_per_step() && hit.is_per_step())
            {
                self.fn_hit[g][gi] = Some(hit);
                queue.push((g, gi));
            }
        }
        // Follow calls out of functions that run per step.
        let mut rounds = 0;
        while !queue.is_empty() && rounds < MAX_CALL_DEPTH {
            rounds += 1;
            let mut next = Vec::new();
            for (f, fi) in std::mem::take(&mut queue) {
                let Some(hit) = self.fn_hit[f][fi].clone() else {
                    continue;
                };
                for linked in &self.linked[self.linked_by_file[f].clone()] {
                    let call = &units[f].facts.calls[linked.call];
                    if call.fn_idx != Some(fi) || call.in_test || linked.targets.is_empty() {
                        continue;
                    }
                    // Calls in the function's own step loops are seeded from there.
                    if call.loops.iter().any(|&l| self.step_loop[f][l]) {
                        continue;
                    }
                    for (g, gi) in linked.targets {
                        if (g, gi) == (f, fi) {
                            continue;
                        }
                        let mut inner = hit.clone();
                        inner.via.push(call.display_name());
                        inner.guarded |= call.guard.is_some();
                        inner.outer |= runs_per_epoch(&inner, g, gi);
                        if self.fn_hit[g][gi].is_none() {
                            self.fn_hit[g][gi] = Some(inner);
                            next.push((g, gi));
                        }
                    }
                }
            }
            queue = next;
        }
    }

    /// The functions call `call` of `file` may run, as found when the package was analysed.
    fn call_targets(&self, file: usize, call: usize) -> &[(usize, usize)] {
        let linked = &self.linked[self.linked_by_file[file].clone()];
        match linked.binary_search_by_key(&call, |l| l.call) {
            Ok(at) => linked[at].targets.as_slice(),
            Err(_) => &[],
        }
    }

    /// The step loop a call sits in directly (not through its function's callers).
    fn loop_hit(&self, file: usize, call: &PyCall<'a>) -> Option<PyHit> {
        if call.in_test {
            return None;
        }
        let loops = &call.loops;
        let pos = (0..loops.len())
            .rev()
            .find(|&p| self.step_loop[file][loops[p]])?;
        let l = loops[pos];
        // A loop with no step in it inside a per-epoch loop (`for x in val_loader:` after the
        // training loop) is an evaluation loop: not a step loop, nothing per step in it.
        if (self.outer_loop[file][l] || self.optimizer_loop[file][l])
            && pos + 1 < loops.len()
            && self.is_evaluation(file, call, &loops[pos + 1..])
        {
            return None;
        }
        let unit = &self.units[file];
        Some(PyHit {
            loop_file: file,
            loop_line: unit
                .file
                .line_of(unit.facts.loops[l].range.start().to_usize()),
            step_body: None,
            via: Vec::new(),
            outer: self.outer_loop[file][l],
            guarded: call.guard.is_some_and(|depth| depth as usize > pos),
            optimizer_loop: self.optimizer_loop[file][l],
        })
    }

    /// Whether loop `l` of `file` steps the optimizer (`optimizer.step()`,
    /// `optimizer.zero_grad()`, `scaler.step(..)`, or a call of a function that does, in its body
    /// and not in an inner loop) around step loops that only run `backward()`: inner loops of its
    /// own, or those of the functions it calls, none of whose step loops steps the optimizer. The
    /// accumulation pattern `for step ..: for micro in ..: loss.backward()` then
    /// `optimizer.step()`, or `run_step()` calling `forward_backward()` then `optimize()`. Its
    /// body outside the inner loops runs once per optimizer step.
    fn steps_optimizer_around_accumulation(
        &self,
        file: usize,
        l: usize,
        stepping: &OptimizerStepping,
    ) -> bool {
        let facts = &self.units[file].facts;
        let mut steps_here = false;
        let mut inner = false;
        for (c, call) in facts.calls.iter().enumerate() {
            let Some(pos) = call.loops.iter().position(|&q| q == l) else {
                continue;
            };
            let targets = self.call_targets(file, c);
            let in_inner_step_loop = call
                .loops
                .get(pos + 1)
                .is_some_and(|&q| self.step_loop[file][q]);
            let steps = self.steps_optimizer(file, call)
                || targets.iter().any(|&(g, gi)| stepping.steps[g][gi]);
            if in_inner_step_loop {
                inner = true;
                // An inner step loop that steps the optimizer itself is the per-batch loop.
                if steps {
                    return false;
                }
            } else if pos + 1 == call.loops.len() && steps {
                steps_here = true;
            }
            for &(g, gi) in targets {
                if self.has_step_loop[g][gi] {
                    // A function whose step loop steps the optimizer runs whole epochs (or at
                    // least per-batch steps); one whose step loops only accumulate is the
                    // accumulation.
                    if stepping.in_step_loop[g][gi] {
                        return false;
                    }
                    inner = true;
                }
            }
        }
        steps_here && inner
    }

    /// Which functions step the optimizer (`optimizer.step()`, `zero_grad()`, `scaler.step(..)`),
    /// and which have a step loop that does, each directly or through the package's functions.
    fn optimizer_stepping(&self, edges: &[Vec<Vec<(usize, usize)>>]) -> OptimizerStepping {
        let units = self.units;
        let mut steps: Vec<Vec<bool>> = units
            .iter()
            .map(|u| vec![false; u.facts.fns.len()])
            .collect();
        for linked in &self.linked {
            let call = &units[linked.file].facts.calls[linked.call];
            if let Some(fi) = call.fn_idx
                && linked.marker
                && self.steps_optimizer(linked.file, call)
            {
                steps[linked.file][fi] = true;
            }
        }
        propagate(&mut steps, edges);
        let mut in_step_loop: Vec<Vec<bool>> = units
            .iter()
            .map(|u| vec![false; u.facts.fns.len()])
            .collect();
        for linked in &self.linked {
            let (f, call) = (linked.file, &units[linked.file].facts.calls[linked.call]);
            let Some(fi) = call.fn_idx else { continue };
            if call.loops.iter().any(|&l| self.step_loop[f][l])
                && ((linked.marker && self.steps_optimizer(f, call))
                    || linked
                        .targets
                        .as_slice()
                        .iter()
                        .any(|&(g, gi)| steps[g][gi]))
            {
                in_step_loop[f][fi] = true;
            }
        }
        propagate(&mut in_step_loop, edges);
        OptimizerStepping {
            steps,
            in_step_loop,
        }
    }

    /// `optimizer.step()`, `optimizer.zero_grad()` or `scaler.step(..)`: a step marker that is
    /// not a `backward()`.
    fn steps_optimizer(&self, file: usize, call: &PyCall<'a>) -> bool {
        matches!(call.method, Some("step" | "zero_grad")) && self.is_marker(file, call)
    }

    /// Whether code under a branch that only the first iterations of `loops[bounded]` take (see
    /// [`PyCall::bounded`]) runs a bounded number of times: that loop is the per-step loop.
    pub fn bounded_in_step_loop(
        &self,
        file: usize,
        loops: &[usize],
        bounded: Option<usize>,
    ) -> bool {
        bounded
            .and_then(|pos| loops.get(pos))
            .is_some_and(|&l| self.step_loop[file][l] && !self.outer_loop[file][l])
    }

    /// Whether `call`, inside `loops` (loops without a step in them), is evaluation code: under
    /// `torch.no_grad()`, in a function named like `evaluate`/`validate`/`test`, or in a loop over
    /// something named like `val_loader`/`test_data`. (Inside an epoch loop, a loop without a step
    /// that is none of these, such as a loop over the parameters between accumulated steps, still
    /// runs once per optimizer step.)
    fn is_evaluation(&self, file: usize, call: &PyCall<'a>, loops: &[usize]) -> bool {
        let facts = &self.units[file].facts;
        // A loop over the weights (`for p in self.master_params:` summing norms, an EMA update)
        // is work of the step on the model, under `no_grad` or not: it evaluates nothing.
        if loops
            .iter()
            .any(|&l| facts.loops[l].iter.is_some_and(iterates_parameters))
        {
            return false;
        }
        call.no_grad
            || call
                .fn_idx
                .is_some_and(|f| names::is_evaluation_name(facts.fns[f].name))
            || loops.iter().any(|&l| {
                facts.loops[l]
                    .iter
                    .and_then(iterated_name)
                    .is_some_and(|name| names::is_evaluation_name(&name))
            })
    }

    /// Whether the code at `call` runs per step (or less often, then the hit is lowered): inside
    /// a step loop, a step body or a function called from one. `None` outside any, and in tests.
    pub fn step_hit(&self, file: usize, call: &PyCall<'a>) -> Option<PyHit> {
        let hit = self.step_hit_unfiltered(file, call)?;
        if call.branch().is_some() && self.in_branch_not_taken(file, call) {
            return None;
        }
        Some(hit)
    }

    /// [`PyContext::step_hit`] before the branches that no call takes are set aside.
    fn step_hit_unfiltered(&self, file: usize, call: &PyCall<'a>) -> Option<PyHit> {
        if call.in_test {
            return None;
        }
        // A branch that leaves the program, or breaks out of the step loop, runs once.
        match call.leaves {
            Some(0) => return None,
            Some(depth)
                if call
                    .loops
                    .get(depth as usize - 1)
                    .is_some_and(|&l| self.step_loop[file][l]) =>
            {
                return None;
            }
            _ => {}
        }
        // A branch only the first steps take (`if step == 0:`, `if i < 3:`) runs a bounded number
        // of times, not per step. Bounding an epoch loop's counter (`if epoch == 0:`) still
        // leaves every step of that epoch.
        if self.bounded_in_step_loop(file, &call.loops, call.bounded.map(|pos| pos as usize)) {
            return None;
        }
        if let Some(hit) = self.loop_hit(file, call) {
            return Some(hit);
        }
        if call.loops.iter().any(|&l| self.step_loop[file][l]) {
            // An evaluation loop inside an epoch loop (see `loop_hit`).
            return None;
        }
        let fi = call.fn_idx?;
        let mut hit = self.fn_hit[file][fi].clone()?;
        hit.guarded |= call.guard.is_some();
        // Code reached from an epoch loop through an evaluation function (`validate(..)` after
        // the epoch's training, and what it calls) evaluates: it is not training, once per
        // epoch or otherwise.
        if hit.outer && hit.via.iter().any(|name| names::is_evaluation_name(name)) {
            return None;
        }
        // A loop of a function called once per epoch (`test(model, test_loader)` in the epoch
        // loop) is an evaluation loop, not a step loop.
        if (hit.outer || hit.optimizer_loop)
            && !call.loops.is_empty()
            && self.is_evaluation(file, call, &call.loops)
        {
            return None;
        }
        // Inside a non-step loop of a function called per step: still per step (or more).
        Some(hit)
    }

    /// Whether `call` sits in a branch `if p == literal:` of its function, `p` a parameter, that
    /// no call of the function in the package takes: each passes `p` (by keyword or position), or
    /// leaves it to its default, as another literal (`compute_top_k(.., reduction="none")` never
    /// runs the `reduction == "mean"` branch with its `.item()`).
    fn in_branch_not_taken(&self, file: usize, call: &PyCall<'a>) -> bool {
        let (Some((param, literal)), Some(fi)) = (call.branch(), call.fn_idx) else {
            return false;
        };
        let function = &self.units[file].facts.fns[fi];
        let params = function.params();
        let Some(pos) = params.iter().position(|p| p.0 == param) else {
            return false;
        };
        let (_, default, positional) = params[pos];
        let bound_first = function.class.is_some()
            && params
                .first()
                .is_some_and(|p| matches!(p.0, "self" | "cls"));
        let Some(callers) = self.callers().get(&(file, fi)) else {
            return false;
        };
        for &(g, ci) in callers {
            let caller = &self.units[g].facts.calls[ci];
            let args = &caller.call.arguments;
            if caller.has_double_star() || args.args.iter().any(Expr::is_starred_expr) {
                return false;
            }
            // `obj.method(a)` passes `a` as the parameter after `self`.
            let index = if bound_first && caller.method.is_some() {
                pos.checked_sub(1)
            } else {
                Some(pos)
            };
            let value = caller
                .keyword(param)
                .or_else(|| index.filter(|_| positional).and_then(|i| args.args.get(i)))
                .or(default);
            match value {
                Some(v) if facts::is_plain_literal(v) && !same_literal(v, literal) => {}
                _ => return false,
            }
        }
        !callers.is_empty()
    }

    /// The calls of each function of the package, as (file, call index), worked out once.
    fn callers(&self) -> &Callers {
        self.callers.get_or_init(|| {
            let mut callers = Callers::default();
            for linked in &self.linked {
                for target in linked.targets {
                    callers
                        .entry(target)
                        .or_default()
                        .push((linked.file, linked.call));
                }
            }
            callers
        })
    }

    /// The step hit of code at `offset` in function `fn_idx` inside `loops` (for statements that
    /// are not calls, such as `total += loss`).
    pub fn step_hit_at(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        loops: &[usize],
        guard: Option<usize>,
        in_test: bool,
    ) -> Option<PyHit> {
        if in_test {
            return None;
        }
        if let Some(pos) = (0..loops.len())
            .rev()
            .find(|&p| self.step_loop[file][loops[p]])
        {
            let l = loops[pos];
            let unit = &self.units[file];
            return Some(PyHit {
                loop_file: file,
                loop_line: unit
                    .file
                    .line_of(unit.facts.loops[l].range.start().to_usize()),
                step_body: None,
                via: Vec::new(),
                outer: self.outer_loop[file][l],
                guarded: guard.is_some_and(|depth| depth > pos),
                optimizer_loop: self.optimizer_loop[file][l],
            });
        }
        let mut hit = self.fn_hit[file][fn_idx?].clone()?;
        hit.guarded |= guard.is_some();
        Some(hit)
    }

    /// Whether a call of `file` asks for the devices (`torch.cuda.is_available()`,
    /// `torch.cuda.device_count()`), which lets the file choose a GPU index.
    pub fn checks_devices(&self, file: usize) -> bool {
        self.checks_devices[file]
    }

    /// The calls outside tests with a number or string literal among their arguments (a
    /// positional argument or a keyword's value), with their file index, in package order.
    pub fn literal_calls(&self) -> impl Iterator<Item = (usize, &'a PyCall<'a>)> + '_ {
        let units = self.units;
        self.literal_calls.iter().map(move |&(f, i)| {
            let f = f as usize;
            (f, &units[f].facts.calls[i as usize])
        })
    }

    /// The calls that format values into text (an f-string or `%`-formatting among their
    /// arguments, or `"..".format(..)`), with their file index, in package order.
    pub fn formatting_calls(&self) -> impl Iterator<Item = (usize, &'a PyCall<'a>)> + '_ {
        let units = self.units;
        self.formatting_calls.iter().map(move |&(f, i)| {
            let f = f as usize;
            (f, &units[f].facts.calls[i as usize])
        })
    }

    /// The first call outside tests, in package order, that builds an optimizer
    /// (`torch.optim.AdamW(..)`, `optim.SGD(..)`, `AdamW(..)`; a `Trainer` or `Fabric` is not one).
    pub fn first_optimizer(&self) -> Option<(usize, &'a PyCall<'a>)> {
        self.first_optimizer
            .map(|(f, i)| (f as usize, &self.units[f as usize].facts.calls[i as usize]))
    }

    /// Every call of the package, with its file index.
    pub fn calls(&self) -> impl Iterator<Item = (usize, &'a PyCall<'a>)> + '_ {
        let units = self.units;
        units
            .iter()
            .enumerate()
            .flat_map(|(f, unit)| unit.facts.calls.iter().map(move |call| (f, call)))
    }

    /// The calls of the package whose callee's last name is one of `names` (`item` of
    /// `loss.item()`, `load` of `torch.load(..)`, `float` of `float(t)`), with their file index,
    /// in package order (as [`PyContext::calls`] lists them). Names of [`INDEXED_NAMES`] are looked
    /// up; any other name costs a pass over every call.
    pub fn calls_named(
        &self,
        names: &[&str],
    ) -> impl Iterator<Item = (usize, &'a PyCall<'a>)> + '_ {
        self.calls_indexed(names, INDEXED_NAMES, 0, |name, wanted| name == wanted)
    }

    /// The calls of the package whose callee's last name ends with one of `suffixes`
    /// (`DataLoader` of `StatefulDataLoader(..)`), in package order. Suffixes of
    /// [`INDEXED_SUFFIXES`] are looked up; any other costs a pass over every call.
    pub fn calls_named_ending(
        &self,
        suffixes: &[&str],
    ) -> impl Iterator<Item = (usize, &'a PyCall<'a>)> + '_ {
        self.calls_indexed(
            suffixes,
            INDEXED_SUFFIXES,
            INDEXED_NAMES.len(),
            |name, suffix| name.ends_with(suffix),
        )
    }

    fn calls_indexed(
        &self,
        keys: &[&str],
        indexed: &[&str],
        offset: usize,
        matches: impl Fn(&str, &str) -> bool,
    ) -> impl Iterator<Item = (usize, &'a PyCall<'a>)> + '_ {
        let mut at: Vec<(u32, u32)> = Vec::new();
        let mut scan: Vec<&str> = Vec::new();
        for &key in keys {
            match indexed.iter().position(|&k| k == key) {
                Some(slot) => at.extend_from_slice(&self.calls_by_name[offset + slot]),
                None => scan.push(key),
            }
        }
        if !scan.is_empty() {
            for (f, unit) in self.units.iter().enumerate() {
                for (i, call) in unit.facts.calls.iter().enumerate() {
                    if call_name(call).is_some_and(|name| scan.iter().any(|k| matches(name, k))) {
                        at.push((f as u32, i as u32));
                    }
                }
            }
        }
        if keys.len() > 1 {
            at.sort_unstable();
            at.dedup();
        }
        self.calls_at(at)
    }

    fn calls_at(&self, at: Vec<(u32, u32)>) -> impl Iterator<Item = (usize, &'a PyCall<'a>)> + '_ {
        let units = self.units;
        at.into_iter().map(move |(f, i)| {
            let f = f as usize;
            (f, &units[f].facts.calls[i as usize])
        })
    }

    /// The file at index `file`.
    pub fn file(&self, file: usize) -> &'a PyFile {
        self.units[file].file
    }

    /// A finding at `range` of `file`.
    pub fn finding(
        &self,
        file: usize,
        range: TextRange,
        message: impl Into<String>,
        help: impl Into<String>,
    ) -> crate::rules::Finding {
        crate::rules::Finding::new(
            crate::analysis::FileId(file),
            self.units[file].file.region(range),
            message,
            help,
        )
    }

    /// The range of a call's callee name: `item` of `loss.item()`, `torch.cuda.synchronize` of
    /// `torch.cuda.synchronize()`.
    pub fn callee_range(call: &PyCall<'_>) -> TextRange {
        match &*call.call.func {
            Expr::Attribute(attr)
                if call.path.is_none() || call.method.is_some_and(|_| !is_module_path(call)) =>
            {
                attr.attr.range()
            }
            func => func.range(),
        }
    }

    /// Whether a file holds or reaches a step loop: one of its loops is a step loop, or one of its
    /// functions contains one directly or through the package functions it calls.
    pub fn file_reaches_step_loop(&self, file: usize) -> bool {
        self.step_loop[file].iter().any(|&s| s) || self.has_step_loop[file].iter().any(|&s| s)
    }

    /// Whether a loop is a step loop.
    pub fn is_step_loop(&self, file: usize, l: usize) -> bool {
        self.step_loop[file][l]
    }

    /// Whether a loop encloses a step loop (an epoch loop), directly or through a call.
    pub fn is_outer_loop(&self, file: usize, l: usize) -> bool {
        self.outer_loop[file][l]
    }

    /// The notes a finding in a step loop carries (mirrors the Rust notes).
    pub fn notes(&self, hit: &PyHit) -> Vec<String> {
        let mut notes = Vec::new();
        let at = self.units[hit.loop_file].file.place(hit.loop_line);
        let place = match &hit.step_body {
            Some(name) => format!("the step body `{name}` at {at}"),
            None if hit.outer => format!("the epoch loop at {at}"),
            None => format!("the step loop at {at}"),
        };
        if hit.via.is_empty() {
            notes.push(format!("inside {place}"));
        } else {
            let chain = hit
                .via
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(" -> ");
            notes.push(format!("called from {place} through {chain}"));
        }
        if hit.outer {
            notes.push(
                "it encloses the per-batch step loop, so this runs once per epoch and is \
                 reported as a note"
                    .to_string(),
            );
        }
        if hit.guarded {
            notes.push(
                "this runs only under an `if ... % N == 0` guard (once every N iterations), so it \
                 is reported as a note"
                    .to_string(),
            );
        }
        notes
    }

    /// Whether a call is a step marker: `backward()`, an optimizer's `step()`/`zero_grad()`,
    /// `scaler.step(..)`, `accelerator.backward(..)`, or a configured marker name.
    pub fn is_marker(&self, file: usize, call: &PyCall<'a>) -> bool {
        if let Some(name) = call.func_name {
            return self.config.step_markers.iter().any(|m| m == name);
        }
        let Some(method) = call.method else {
            return false;
        };
        if self.config.step_markers.iter().any(|m| m == method) {
            return true;
        }
        match method {
            "backward" | "manual_backward" => true,
            "step" | "zero_grad" => call.receiver.is_some_and(|recv| {
                self.is_optimizer(file, call, recv)
                    || (method == "step" && self.is_scaler(file, call, recv))
            }),
            _ => false,
        }
    }

    /// Whether `recv` is an optimizer: bound from a `torch.optim` constructor (or a known optimizer
    /// class), or named like one (`opt`, `optimizer`, `self.optim`).
    pub fn is_optimizer(&self, file: usize, call: &PyCall<'a>, recv: &Expr) -> bool {
        let name = facts::last_segment(recv);
        if name.is_some_and(names::is_optimizer_name) {
            return true;
        }
        self.bound_call(file, call.fn_idx, recv, call.start)
            .is_some_and(|path| names::is_optimizer_constructor(&path))
    }

    fn is_scaler(&self, file: usize, call: &PyCall<'a>, recv: &Expr) -> bool {
        if facts::last_segment(recv).is_some_and(|n| n.to_ascii_lowercase().contains("scaler")) {
            return true;
        }
        self.bound_call(file, call.fn_idx, recv, call.start)
            .is_some_and(|path| path.ends_with("GradScaler"))
    }

    /// The value last assigned to `target` (a name or `self.attr`) before `offset`, in the same
    /// function or, failing that, anywhere in the file (module level, `__init__`).
    pub fn binding(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        target: &Expr,
        offset: usize,
    ) -> Option<&'a PyAssign<'a>> {
        let key = facts::dotted(target)?;
        let facts = &self.units[file].facts;
        // One walk of the name's assignments, newest first: the newest earlier one in the same
        // function wins; failing that, the newest one of another scope (`self.x` set in another
        // method, or a module-level name).
        let is_attr = key.starts_with("self.");
        let mut other_scope = None;
        // A name the function binds (a parameter, or an assignment anywhere in it) is local to
        // it: a module-level name of the same spelling is another variable.
        let mut local = !key.contains('.') && fn_idx.is_some_and(|f| facts.fns[f].has_param(&key));
        for a in facts
            .assigns_by_name()
            .newest_first(&key)
            .map(|i| &facts.assigns[i])
        {
            if a.fn_idx == fn_idx && a.at < offset {
                return Some(a);
            }
            local |= fn_idx.is_some() && a.fn_idx == fn_idx;
            if other_scope.is_none() && (a.fn_idx.is_none() || (is_attr && a.fn_idx != fn_idx)) {
                other_scope = Some(a);
            }
        }
        if local && !is_attr {
            return None;
        }
        other_scope
    }

    /// The bindings of `target` in the same scope as `assign` (one of them), in source order,
    /// `assign` included; loop targets left out.
    fn alternatives(
        &self,
        file: usize,
        assign: &'a PyAssign<'a>,
        target: &Expr,
    ) -> impl Iterator<Item = &'a PyAssign<'a>> + use<'a, '_> {
        let facts = &self.units[file].facts;
        // Newest first: the caller's answer does not depend on the order.
        let index = facts.assigns_by_name();
        facts::dotted(target)
            .into_iter()
            .flat_map(move |key| index.newest_first(&key))
            .map(|i| &facts.assigns[i])
            .filter(move |a| a.fn_idx == assign.fn_idx && !a.loop_target)
    }

    /// The dotted callee of the call a name was bound from (`x = torch.optim.SGD(..)` ->
    /// `torch.optim.SGD`).
    pub fn bound_call(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        target: &Expr,
        offset: usize,
    ) -> Option<String> {
        let assign = self.binding(file, fn_idx, target, offset)?;
        match assign.value {
            Expr::Call(call) => facts::dotted(&call.func),
            _ => None,
        }
    }

    /// What an expression is, as far as the package tells: a tensor, a tensor that carries an
    /// autograd graph, a device, ...
    pub fn value_kind(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        expr: &Expr,
        offset: usize,
    ) -> ValueKind {
        self.value_kind_depth(file, fn_idx, expr, offset, 0, true)
    }

    /// [`PyContext::value_kind`] from what values are bound to only, never from what a name or
    /// an attribute is called: `batch_loss = run_batch(..)` is not taken for a loss tensor because
    /// of its name (the function may return `loss.item()`). For checks that would otherwise
    /// report every number named like a loss.
    pub fn value_kind_bound(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        expr: &Expr,
        offset: usize,
    ) -> ValueKind {
        self.value_kind_depth(file, fn_idx, expr, offset, 0, false)
    }

    fn value_kind_depth(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        expr: &Expr,
        offset: usize,
        depth: usize,
        by_name: bool,
    ) -> ValueKind {
        if depth > 8 {
            return ValueKind::Unknown;
        }
        match expr {
            Expr::Call(call) => {
                let path = facts::dotted(&call.func).unwrap_or_default();
                if let Expr::Attribute(attr) = &*call.func {
                    let method = attr.attr.as_str();
                    let receiver = || {
                        self.value_kind_depth(file, fn_idx, &attr.value, offset, depth + 1, by_name)
                    };
                    if names::DETACHING_METHODS.contains(&method) {
                        return match receiver() {
                            ValueKind::Graph | ValueKind::Tensor => ValueKind::Tensor,
                            other => other,
                        };
                    }
                    if names::HOST_VALUE_METHODS.contains(&method) {
                        return ValueKind::Host;
                    }
                    if names::TENSOR_ONLY_METHODS.contains(&method) {
                        // A model's output keeps its graph through them.
                        return match receiver() {
                            ValueKind::Graph => ValueKind::Graph,
                            _ => ValueKind::Tensor,
                        };
                    }
                    if names::is_grad_norm_callee(method) {
                        return ValueKind::Tensor;
                    }
                    if names::is_torch_function(&path) {
                        return names::torch_function_kind(&path);
                    }
                    let recv = receiver();
                    if recv.is_tensor() {
                        return recv;
                    }
                    if names::is_loss_callee(method) || names::is_model_callee(&path) {
                        return ValueKind::Graph;
                    }
                    return ValueKind::Unknown;
                }
                if names::is_torch_function(&path) {
                    return names::torch_function_kind(&path);
                }
                if names::is_loss_callee(&path) || names::is_model_callee(&path) {
                    return ValueKind::Graph;
                }
                // A name bound to a module or loss (`criterion = nn.CrossEntropyLoss()`).
                if let Expr::Name(_) = &*call.func
                    && let Some(bound) = self.bound_call(file, fn_idx, &call.func, offset)
                    && (bound.starts_with("nn.")
                        || bound.starts_with("torch.nn.")
                        || bound.ends_with("Loss"))
                {
                    return ValueKind::Graph;
                }
                // A function of the package whose every `return` gives a tensor
                // (`def sample(logits): return torch.multinomial(..)`).
                if let Expr::Name(_) = &*call.func {
                    return self.returned_kind(file, call, depth);
                }
                ValueKind::Unknown
            }
            Expr::Attribute(attr) => {
                // By name, `x.loss` and `x.grad` are tensors; by binding, only of a tensor.
                let of_tensor = || {
                    by_name
                        || self
                            .value_kind_depth(file, fn_idx, &attr.value, offset, depth + 1, by_name)
                            .is_tensor()
                };
                match attr.attr.as_str() {
                    // `outputs.loss` of a model's outputs.
                    "loss" | "logits" if of_tensor() => ValueKind::Graph,
                    // `p.grad`, `t.data` of a tensor.
                    "grad" | "data" if of_tensor() => ValueKind::Tensor,
                    "shape" => ValueKind::Host,
                    _ => {
                        if let Some(assign) = self.binding(file, fn_idx, expr, offset) {
                            return self.value_kind_depth(
                                file,
                                assign.fn_idx,
                                assign.value,
                                assign.at,
                                depth + 1,
                                by_name,
                            );
                        }
                        ValueKind::Unknown
                    }
                }
            }
            Expr::Name(name) => {
                if let Some(assign) = self.binding(file, fn_idx, expr, offset) {
                    if std::ptr::eq(assign.value, expr) {
                        // A loop counter bound to itself.
                        return ValueKind::Host;
                    }
                    if assign.loop_target {
                        return self.iterated_kind(file, assign);
                    }
                    let kind = self.value_kind_depth(
                        file,
                        assign.fn_idx,
                        assign.value,
                        assign.at,
                        depth + 1,
                        by_name,
                    );
                    if kind != ValueKind::Unknown {
                        return kind;
                    }
                }
                if by_name && names::is_loss_name(name.id.as_str()) {
                    return ValueKind::Graph;
                }
                ValueKind::Unknown
            }
            Expr::BinOp(bin) => {
                let left =
                    self.value_kind_depth(file, fn_idx, &bin.left, offset, depth + 1, by_name);
                let right =
                    self.value_kind_depth(file, fn_idx, &bin.right, offset, depth + 1, by_name);
                match (left, right) {
                    (ValueKind::Graph, _) | (_, ValueKind::Graph) => ValueKind::Graph,
                    (ValueKind::Tensor, _) | (_, ValueKind::Tensor) => ValueKind::Tensor,
                    _ => ValueKind::Unknown,
                }
            }
            // `output.argmax(-1) == y`: comparing a tensor gives a tensor of booleans (no graph);
            // identity and membership (`x is None`, `k in d`) give Python booleans.
            Expr::Compare(cmp)
                if cmp.ops.iter().all(|op| {
                    !matches!(op, CmpOp::Is | CmpOp::IsNot | CmpOp::In | CmpOp::NotIn)
                }) && std::iter::once(&*cmp.left)
                    .chain(cmp.comparators.iter())
                    .any(|operand| {
                        self.value_kind_depth(file, fn_idx, operand, offset, depth + 1, by_name)
                            .is_tensor()
                    }) =>
            {
                ValueKind::Tensor
            }
            Expr::Subscript(sub) => {
                match self.value_kind_depth(file, fn_idx, &sub.value, offset, depth + 1, by_name) {
                    kind @ (ValueKind::Tensor | ValueKind::Graph) => kind,
                    _ => ValueKind::Unknown,
                }
            }
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::BooleanLiteral(_) => {
                ValueKind::Host
            }
            _ => ValueKind::Unknown,
        }
    }

    /// What the elements of a `for` loop's iterable are: batches of a loader are tensors, numbers
    /// of a `range` are not.
    fn iterated_kind(&self, file: usize, assign: &PyAssign<'a>) -> ValueKind {
        if self
            .loader_of(file, assign.fn_idx, assign.value, assign.at)
            .is_some()
        {
            return ValueKind::Tensor;
        }
        // `for p in model.parameters():` runs over the model's parameter tensors (the second of
        // each pair of `named_parameters()`, bound alone by the fact collector).
        if let Expr::Call(call) = assign.value
            && let Expr::Attribute(attr) = &*call.func
            && matches!(attr.attr.as_str(), "parameters" | "named_parameters")
        {
            return ValueKind::Tensor;
        }
        let name = match assign.value {
            Expr::Call(call) => facts::dotted(&call.func).unwrap_or_default(),
            other => facts::dotted(other).unwrap_or_default(),
        };
        let lower = name.to_ascii_lowercase();
        if lower.contains("loader") || lower.contains("batches") {
            ValueKind::Tensor
        } else {
            ValueKind::Unknown
        }
    }

    /// The `DataLoader(..)` call an iterable comes from: `loader`, `enumerate(loader)`,
    /// `tqdm(loader)`, `self.train_loader`, bound in the package.
    pub fn loader_of(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        iter: &Expr,
        offset: usize,
    ) -> Option<&'a ruff_python_ast::ExprCall> {
        let mut expr = iter;
        for _ in 0..4 {
            match expr {
                Expr::Call(call) => {
                    let path = facts::dotted(&call.func).unwrap_or_default();
                    if path.ends_with("DataLoader") {
                        // Only calls inside this package's files live long enough to be returned.
                        return None;
                    }
                    expr = call.arguments.args.first()?;
                }
                Expr::Name(_) | Expr::Attribute(_) => {
                    let assign = self.binding(file, fn_idx, expr, offset)?;
                    if let Expr::Call(call) = assign.value
                        && facts::dotted(&call.func).is_some_and(|p| p.ends_with("DataLoader"))
                    {
                        return Some(call);
                    }
                    return None;
                }
                _ => return None,
            }
        }
        None
    }

    /// Whether an expression names a device other than the CPU: `device`, `"cuda"`, `"cuda:0"`,
    /// `torch.device("cuda")`, `args.device`, `self.device`, `rank`, ... (not a dtype, not a tensor).
    pub fn device_of(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        expr: &Expr,
        offset: usize,
    ) -> Device {
        self.device_of_depth(file, fn_idx, expr, offset, 0, &mut Vec::new())
    }

    /// [`PyContext::device_of`], `depth` bindings deep. Every binding of a name in its scope is
    /// an alternative, and bindings may go round (`d = d`, `a = b; b = a`): the alternatives of
    /// each name and scope are read once per question (`expanded` holds the answer, or `None`
    /// while they are being read: met again then, the name adds nothing), and the search stops at
    /// a depth.
    fn device_of_depth(
        &self,
        file: usize,
        fn_idx: Option<usize>,
        expr: &Expr,
        offset: usize,
        depth: usize,
        expanded: &mut Vec<(String, Option<usize>, Option<Device>)>,
    ) -> Device {
        if depth > 8 {
            return Device::Unknown;
        }
        match expr {
            Expr::StringLiteral(s) => {
                let text = s.value.to_str();
                if text == "cpu" || text.starts_with("cpu:") {
                    Device::Cpu
                } else if text.starts_with("cuda") || text == "mps" || text.starts_with("xpu") {
                    Device::Accelerator
                } else {
                    Device::Unknown
                }
            }
            Expr::Call(call) => {
                let path = facts::dotted(&call.func).unwrap_or_default();
                if path == "torch.device" {
                    return match call.arguments.args.first() {
                        Some(first) => {
                            self.device_of_depth(file, fn_idx, first, offset, depth + 1, expanded)
                        }
                        None => Device::Unknown,
                    };
                }
                if path.ends_with("current_accelerator") {
                    return Device::Accelerator;
                }
                Device::Unknown
            }
            // `"cuda" if cond else "cpu"`: an accelerator when either branch is one.
            Expr::If(e) => {
                let a = self.device_of_depth(file, fn_idx, &e.body, offset, depth + 1, expanded);
                let b = self.device_of_depth(file, fn_idx, &e.orelse, offset, depth + 1, expanded);
                match (a, b) {
                    (Device::Accelerator, _) | (_, Device::Accelerator) => Device::Accelerator,
                    (Device::Cpu, Device::Cpu) => Device::Cpu,
                    _ => Device::Unknown,
                }
            }
            Expr::Name(_) | Expr::Attribute(_) => {
                let last = facts::last_segment(expr).unwrap_or("");
                if let Some(assign) = self.binding(file, fn_idx, expr, offset)
                    && !assign.loop_target
                {
                    let key = facts::dotted(expr).unwrap_or_default();
                    if let Some(&(_, _, known)) = expanded
                        .iter()
                        .find(|(k, scope, _)| *k == key && *scope == assign.fn_idx)
                    {
                        return known.unwrap_or(Device::Unknown);
                    }
                    let at = expanded.len();
                    expanded.push((key, assign.fn_idx, None));
                    let device = self.device_of_alternatives(file, assign, expr, depth, expanded);
                    expanded[at].2 = Some(device);
                    return device;
                }
                if names::is_device_name(last) {
                    Device::Accelerator
                } else {
                    Device::Unknown
                }
            }
            Expr::NumberLiteral(_) => Device::Accelerator,
            _ => Device::Unknown,
        }
    }

    /// The device of a name bound by `assign`. Every binding of the name in that scope is an
    /// alternative (`if cuda: device = ..accelerator() else: device = torch.device("cpu")`): the
    /// value is on an accelerator when any alternative is, on the CPU only when every one is;
    /// else the name says what it can (`device`, `rank`).
    fn device_of_alternatives(
        &self,
        file: usize,
        assign: &'a PyAssign<'a>,
        expr: &Expr,
        depth: usize,
        expanded: &mut Vec<(String, Option<usize>, Option<Device>)>,
    ) -> Device {
        let mut all_cpu = true;
        for alt in self.alternatives(file, assign, expr) {
            match self.device_of_depth(file, alt.fn_idx, alt.value, alt.at, depth + 1, expanded) {
                Device::Accelerator => return Device::Accelerator,
                Device::Cpu => {}
                _ => all_cpu = false,
            }
        }
        if all_cpu {
            return Device::Cpu;
        }
        let last = facts::last_segment(expr).unwrap_or("");
        if names::is_device_name(last) {
            Device::Accelerator
        } else {
            Device::Unknown
        }
    }
}

/// Whether a call's callee is a module function (`torch.cuda.synchronize`), not a method on a value.
fn is_module_path(call: &PyCall<'_>) -> bool {
    call.path.as_deref().is_some_and(|p| {
        ["torch.", "nn.", "F.", "os.", "np.", "optim.", "pl.", "L."]
            .iter()
            .any(|prefix| p.starts_with(prefix))
    })
}

/// What a value is, as far as the analysis tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// A tensor (no autograd graph known).
    Tensor,
    /// A tensor computed by a model or a loss: it carries its autograd graph.
    Graph,
    /// A Python number, string or other host value.
    Host,
    Unknown,
}

impl ValueKind {
    /// A tensor, with or without its autograd graph.
    pub fn is_tensor(self) -> bool {
        matches!(self, ValueKind::Tensor | ValueKind::Graph)
    }
}

/// Where a device expression points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Accelerator,
    Unknown,
}

/// The package root of a Python file: the nearest directory above it with a `pyproject.toml`,
/// `setup.py` or `setup.cfg`, else the file's own directory.
pub(crate) fn package_root(file: &Path, cache: &mut HashMap<PathBuf, Option<PathBuf>>) -> PathBuf {
    let absolute = crate::walk::absolute_path(file);
    let dir = absolute.parent().map(Path::to_path_buf).unwrap_or_default();
    match project_dir(&dir, cache) {
        Some(root) => root,
        None => dir,
    }
}

fn project_dir(dir: &Path, cache: &mut HashMap<PathBuf, Option<PathBuf>>) -> Option<PathBuf> {
    if let Some(found) = cache.get(dir) {
        return found.clone();
    }
    let found = if ["pyproject.toml", "setup.py", "setup.cfg"]
        .iter()
        .any(|name| dir.join(name).is_file())
    {
        Some(dir.to_path_buf())
    } else {
        match dir.parent() {
            Some(parent) if parent != dir => project_dir(parent, cache),
            _ => None,
        }
    };
    cache.insert(dir.to_path_buf(), found.clone());
    found
}

/// Whether a loop iterates a model's parameters: `model.parameters()`, `self.master_params`,
/// `optimizer.param_groups`, `zip(ema_params, params)`, `enumerate(model.named_parameters())`.
fn iterates_parameters(iter: &Expr) -> bool {
    let named = |expr: &Expr| {
        let expr = match expr {
            Expr::Call(call) => &*call.func,
            other => other,
        };
        facts::dotted(expr).is_some_and(|path| {
            let last = path.rsplit('.').next().unwrap_or(&path);
            last.to_ascii_lowercase().contains("param")
        })
    };
    match iter {
        Expr::Call(call)
            if facts::dotted(&call.func)
                .is_some_and(|f| matches!(f.as_str(), "enumerate" | "zip")) =>
        {
            call.arguments.args.iter().any(named)
        }
        other => named(other),
    }
}

/// The name a loop iterates: `val_loader` of `val_loader`, `enumerate(val_loader)`,
/// `tqdm(self.val_loader)`.
fn iterated_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Call(call) => call.arguments.args.first().and_then(iterated_name),
        other => facts::dotted(other),
    }
}

/// The byte range of a node, as `usize`s.
pub fn byte_range<T: Ranged>(node: &T) -> std::ops::Range<usize> {
    node.start().to_usize()..node.end().to_usize()
}

/// What the rule files' Python checks use.
/// Whether two plain literals are the same value (`"mean"` and `'mean'`, `1` and `1`).
fn same_literal(a: &Expr, b: &Expr) -> bool {
    match (a, b) {
        (Expr::StringLiteral(x), Expr::StringLiteral(y)) => x.value.to_str() == y.value.to_str(),
        (Expr::NumberLiteral(x), Expr::NumberLiteral(y)) => x.value == y.value,
        (Expr::BooleanLiteral(x), Expr::BooleanLiteral(y)) => x.value == y.value,
        (Expr::NoneLiteral(_), Expr::NoneLiteral(_)) => true,
        _ => false,
    }
}

pub(crate) mod prelude {
    pub(crate) use super::facts::{self, keyword as python_keyword};
    pub(crate) use super::names as python_names;
    pub(crate) use super::{Device, PyCall, PyContext, ValueKind};
    pub(crate) use ruff_python_ast::{Expr as PyExpr, ExprCall as PyExprCall};
    pub(crate) use ruff_text_size::{Ranged, TextRange};
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned<'a>(cx: &PyContext<'a>, keep: impl Fn(&str) -> bool) -> Vec<(usize, usize)> {
        cx.calls()
            .filter(|(_, call)| call_name(call).is_some_and(&keep))
            .map(|(f, call)| (f, call.start))
            .collect()
    }

    #[test]
    fn indexed_calls_are_the_calls_a_scan_finds_in_package_order() {
        for (slot, name) in INDEXED_NAMES.iter().enumerate() {
            assert_eq!(indexed_slot(name), Some(slot), "{name}");
        }
        assert_eq!(indexed_slot("items"), None);
        let sources = [
            "import torch\nx = torch.zeros(3).to(dev)\nfor b in loader:\n    loss.item()\n    float(loss)\n    t.float()\n",
            "from torch.utils.data import DataLoader\nl = DataLoader(ds)\nm = StatefulDataLoader(ds)\nt = pl.Trainer(precision=32)\nx.to(d).cpu().item()\nf()()\nprint(x)\n",
        ];
        let files = parse_all(&sources);
        let units = package(&files);
        let config = Config::default();
        let cx = PyContext::build(&units, &config);
        let named = |names: &[&str]| -> Vec<(usize, usize)> {
            cx.calls_named(names).map(|(f, c)| (f, c.start)).collect()
        };
        // Indexed names, one and several (merged in package order), and a name that is not
        // indexed (found by a scan).
        for names in [
            &["item"][..],
            &["to", "cpu", "item", "float", "print"],
            &["zeros", "to"],
            &["DataLoader"],
            &["not_indexed", "item"],
        ] {
            let want = scanned(&cx, |n| names.contains(&n));
            assert!(!want.is_empty() || names == ["not_indexed"], "{names:?}");
            assert_eq!(named(names), want, "{names:?}");
        }
        assert_eq!(named(&["to", "cpu", "item"]).len(), 5);
        for suffixes in [&["DataLoader"][..], &["Trainer", "Fabric"], &["Loader"]] {
            let got: Vec<(usize, usize)> = cx
                .calls_named_ending(suffixes)
                .map(|(f, c)| (f, c.start))
                .collect();
            let want = scanned(&cx, |n| suffixes.iter().any(|s| n.ends_with(s)));
            assert_eq!(got, want, "{suffixes:?}");
        }
        assert_eq!(cx.calls_named_ending(&["DataLoader"]).count(), 2);
    }

    fn parse_all(sources: &[&str]) -> Vec<PyFile> {
        sources
            .iter()
            .enumerate()
            .map(|(i, s)| PyFile::parse(PathBuf::from(format!("m{i}.py")), s.to_string()).unwrap())
            .collect()
    }

    fn package<'a>(files: &'a [PyFile]) -> Vec<PyUnit<'a>> {
        files
            .iter()
            .map(|file| PyUnit {
                file,
                facts: facts::collect(file),
            })
            .collect()
    }

    #[test]
    fn the_lists_built_in_one_pass_are_what_a_scan_of_every_call_finds() {
        let sources = [
            "import torch\nm = nn.DataParallel(net)\nd = DistributedDataParallel(net)\nx.cuda(0)\nlog(\"a\")\nopt_step = self.optim.step()\n",
            "import torch\nt = pl.Trainer(strategy=\"dp\", precision=32)\nopt = torch.optim.AdamW(p, lr=1e-3)\nsgd = SGD(p)\nif torch.cuda.is_available():\n    pass\n",
            "def test_x():\n    y.to(\"cuda:0\")\n    Adam(p)\n",
        ];
        let files = parse_all(&sources);
        let units = package(&files);
        let config = Config::default();
        let cx = PyContext::build(&units, &config);
        let literal: Vec<(usize, usize)> = cx.literal_calls().map(|(f, c)| (f, c.start)).collect();
        let want: Vec<(usize, usize)> = cx
            .calls()
            .filter(|(_, c)| !c.in_test && (c.number_arg || c.string_arg))
            .map(|(f, c)| (f, c.start))
            .collect();
        assert_eq!(literal, want);
        assert_eq!(literal.len(), 4, "{literal:?}");
        let optimizer = cx.first_optimizer().map(|(f, c)| (f, c.display_name()));
        let want = cx.calls().find(|(_, call)| {
            let path = call.path.as_deref().unwrap_or("");
            let trainer = path.ends_with("Trainer") || path.ends_with("Fabric");
            !call.in_test
                && !trainer
                && names::is_optimizer_constructor(path)
                && (path.contains("optim") || call.func_name.is_some())
        });
        assert_eq!(optimizer, want.map(|(f, c)| (f, c.display_name())));
        // `self.optim.step()` names an optimizer's module, as the constructor check reads it.
        assert_eq!(optimizer, Some((0, "self.optim.step".to_string())));
        for call in units.iter().flat_map(|u| &u.facts.calls) {
            assert_eq!(builds_optimizer(call), {
                let path = call.path.as_deref().unwrap_or("");
                call.path.is_some()
                    && !(path.ends_with("Trainer") || path.ends_with("Fabric"))
                    && names::is_optimizer_constructor(path)
                    && (path.contains("optim") || call.func_name.is_some())
            });
        }
        assert_eq!(
            (0..3).map(|f| cx.checks_devices(f)).collect::<Vec<_>>(),
            [false, true, false]
        );
        let parallel: Vec<String> = cx
            .calls_named_ending(&["DataParallel"])
            .map(|(_, c)| c.display_name())
            .collect();
        assert_eq!(parallel, ["nn.DataParallel", "DistributedDataParallel"]);
    }

    /// Every call, found by ruff's own visitor, in the order it walks them.
    struct AllCalls(Vec<usize>);

    impl<'a> ruff_python_ast::visitor::Visitor<'a> for AllCalls {
        fn visit_expr(&mut self, expr: &'a Expr) {
            if let Expr::Call(call) = expr {
                self.0.push(call.start().to_usize());
            }
            ruff_python_ast::visitor::walk_expr(self, expr);
        }
    }

    #[test]
    fn a_fix_may_not_make_a_file_need_a_newer_python() {
        let original = "print(f\"{torch.rand(2).cuda()}\")\n";
        let fixed = "print(f\"{torch.rand(2, device=\"cuda\")}\")\n";
        let (message, offset) =
            newer_syntax(original, fixed).expect("a reused quote is 3.12 syntax");
        assert!(message.contains("quote"), "{message}");
        assert_eq!(&fixed[offset..offset + 1], "\"");
        // A file that reuses quotes elsewhere needs 3.12 already; other fixes add nothing.
        let elsewhere = "print(f\"{\"x\"}\")\n";
        assert_eq!(
            newer_syntax(
                &format!("{original}{elsewhere}"),
                &format!("{fixed}{elsewhere}")
            ),
            None
        );
        assert_eq!(
            newer_syntax(
                "x = torch.rand(2).cuda()\n",
                "x = torch.rand(2, device=\"cuda\")\n"
            ),
            None
        );
    }

    #[test]
    fn a_call_on_a_name_runs_a_module_function_only_through_an_imported_module() {
        // `U.helper()`, `tools.helper()` and `a.helper()` name imported modules and may run the
        // package's `def helper`; `model.helper()` is a method of whatever `model` is (yolov5's
        // `model.train()` is not its script's `def train(..)`).
        let sources = [
            "import utils as U\nfrom pkg import tools\nimport a.b\n\ndef helper():\n    pass\n\ndef train(model):\n    U.helper()\n    tools.helper()\n    a.helper()\n    model.helper()\n    helper()\n",
        ];
        let files = parse_all(&sources);
        let units = package(&files);
        let config = Config::default();
        let cx = PyContext::build(&units, &config);
        let resolved = |receiver: Option<&str>| {
            let call = units[0]
                .facts
                .calls
                .iter()
                .find(|c| {
                    c.receiver
                        .map(|r| files[0].source[r.range()].to_string())
                        .as_deref()
                        == receiver
                })
                .unwrap();
            !cx.targets(0, call).is_empty()
        };
        for receiver in [Some("U"), Some("tools"), Some("a"), None] {
            assert!(resolved(receiver), "{receiver:?}");
        }
        assert!(!resolved(Some("model")));
    }

    #[test]
    fn a_module_s_divisibility_helpers_guard_like_a_modulo_test() {
        // `divisible_by(step, N)` of a helper that returns `step % N == 0` guards its branch like
        // `if step % N == 0:`; a helper with another body, a nested helper and a name defined
        // elsewhere do not.
        let source = "def divisible_by(numer, denom):\n    \"\"\"Whether numer is a multiple.\"\"\"\n    return (numer % denom) == 0\n\ndef later(a, b):\n    return a > b\n\ndef train(loader, n):\n    def nested(a, b):\n        return not a % b\n    for step, batch in enumerate(loader):\n        if divisible_by(step, n):\n            guarded()\n        if step != 0 and divisible_by(step, n):\n            joined()\n        if later(step, n):\n            other_body()\n        if nested(step, n):\n            nested_helper()\n        if imported_divisible(step, n):\n            imported()\n        elif divisible_by(step, 2):\n            in_elif()\n";
        let file = PyFile::parse(PathBuf::from("m.py"), source.to_string()).unwrap();
        let facts = facts::collect(&file);
        let guarded = |name: &str| {
            facts
                .calls
                .iter()
                .find(|c| c.func_name == Some(name))
                .unwrap()
                .guard
                .is_some()
        };
        for name in ["guarded", "joined", "in_elif"] {
            assert!(guarded(name), "{name}");
        }
        for name in ["other_body", "nested_helper", "imported"] {
            assert!(!guarded(name), "{name}");
        }
    }

    #[test]
    fn a_function_s_returns_and_parameters_are_its_own() {
        // The returns of nested functions and classes belong to them, not to the function around
        // them; returns under branches, loops, `with`, `try` and `match` belong to it.
        let source = "def outer(a, b=1, *, c=2):\n    def inner():\n        return 'inner'\n    class K:\n        def m(self):\n            return 'm'\n    if a:\n        return 'if'\n    for _ in b:\n        with c:\n            try:\n                return 'try'\n            finally:\n                pass\n    match a:\n        case 1:\n            return 'case'\n    lambda: 'not a return'\n    return\n";
        let file = PyFile::parse(PathBuf::from("m.py"), source.to_string()).unwrap();
        let facts = facts::collect(&file);
        let text = |e: &Expr| file.source[e.range()].to_string();
        let of = |name: &str| facts.fns.iter().find(|f| f.name == name).unwrap();
        let outer: Vec<String> = of("outer").returns().into_iter().map(text).collect();
        assert_eq!(outer, ["'if'", "'try'", "'case'"]);
        let inner: Vec<String> = of("inner").returns().into_iter().map(text).collect();
        assert_eq!(inner, ["'inner'"]);
        let m: Vec<String> = of("m").returns().into_iter().map(text).collect();
        assert_eq!(m, ["'m'"]);
        let params: Vec<(&str, Option<String>, bool)> = of("outer")
            .params()
            .into_iter()
            .map(|(name, default, positional)| (name, default.map(text), positional))
            .collect();
        assert_eq!(
            params,
            [
                ("a", None, true),
                ("b", Some("1".to_string()), true),
                ("c", Some("2".to_string()), false)
            ]
        );
    }

    #[test]
    fn the_fact_walk_records_every_call_in_the_order_the_ast_visitor_finds_them() {
        // Calls under attributes, subscripts, operators, comparisons, tuples, lists, boolean
        // and unary operators, keywords, f-strings, lambdas, comprehensions and decorators.
        let source = "@dec(a())\ndef f(x):\n    y = a.b(c).d.e(f(1))[h()].i + -j(k) * (l(), [m()])\n    if n() < o.p(q()) and not r():\n        s[t()] = u(v=w(), *z())\n    return f\"{aa()}\" or (lambda: bb())() or [cc(i) for i in dd()]\nee.ff.gg().hh\n";
        let file = PyFile::parse(PathBuf::from("m.py"), source.to_string()).unwrap();
        let facts = facts::collect(&file);
        let mut all = AllCalls(Vec::new());
        for stmt in &file.module().body {
            ruff_python_ast::visitor::Visitor::visit_stmt(&mut all, stmt);
        }
        let mut found: Vec<usize> = facts.calls.iter().map(|c| c.start).collect();
        assert_eq!(found.len(), all.0.len());
        assert_eq!(found.len(), source.matches('(').count() - 3, "{found:?}");
        // The same calls (the fact walk visits a loop's iterable before its target, as Python
        // runs them, so the orders may differ: compared sorted).
        found.sort_unstable();
        all.0.sort_unstable();
        assert_eq!(found, all.0);
    }
}
