//! rustc-style diagnostics for people: the finding, the source line with carets under the offending
//! span, the notes, the help, the suggested fix and a pointer to the rule's documentation, then a closing
//! line that counts the findings.
//!
//! ```text
//! warning[PK101]: `to_scalar` reads a value back to the host on every step
//!   --> src/train.rs:42:29
//!    |
//! 42 |         let loss_value = loss.to_scalar::<f32>()?;
//!    |                               ^^^^^^^^^^^^^^^^^^
//!    |
//!    = help: keep the running loss on the device and read it once per epoch
//!    = note: rule host-readback-in-step-loop; see `perfkit rule PK101`
//! ```
//!
//! The source is read from the finding's path when the report is rendered; a file that cannot be read
//! any more is shown by its location alone.

use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use annotate_snippets::{AnnotationKind, Element, Group, Level, Origin, Patch, Renderer, Snippet};
use anstyle::{AnsiColor, Effects, Style};

use super::{Counts, RenderOptions, display_note, display_path};
use crate::{Diagnostic, FileError, Fix, LintReport, Severity};

const ERROR_STYLE: Style = AnsiColor::BrightRed.on_default().effects(Effects::BOLD);
const BOLD: Style = Style::new().effects(Effects::BOLD);

/// Writes every finding, every file error and the closing summary line of `report` to `out`.
pub fn render(
    out: &mut impl Write,
    report: &LintReport,
    options: &RenderOptions,
) -> io::Result<()> {
    let renderer = if options.color {
        Renderer::styled()
    } else {
        Renderer::plain()
    };
    let mut sources = SourceCache::default();
    for diagnostic in &report.diagnostics {
        let source = sources.get(&diagnostic.path, diagnostic.cell);
        let rendered = render_diagnostic(&renderer, diagnostic, source);
        writeln!(out, "{rendered}")?;
        writeln!(out)?;
    }
    for error in &report.errors {
        write_file_error(out, error, options.color)?;
    }
    if !report.errors.is_empty() {
        writeln!(out)?;
    }
    write_summary(out, report, options.color)
}

/// Renders one finding (without a trailing newline).
pub fn render_diagnostic(
    renderer: &Renderer,
    diagnostic: &Diagnostic,
    source: Option<&SourceText>,
) -> String {
    // In a notebook the excerpt is the cell's text, and the place reads `nb.ipynb:cell 3:2:9`.
    let path = match diagnostic.cell {
        Some(cell) => format!("{}:cell {cell}", terminal_path(&diagnostic.path)),
        None => terminal_path(&diagnostic.path),
    };
    let level = level_of(diagnostic.severity);
    let region = diagnostic.region;
    let title = level
        .primary_title(diagnostic.message.as_str())
        .id(diagnostic.code);
    // The window shown of a very long line (see below); declared first, as the elements borrow it.
    let shown_window: String;
    let mut elements: Vec<Element<'_>> = Vec::with_capacity(diagnostic.notes.len() + 3);
    match source.and_then(|source| {
        source
            .excerpt(region.line, region.end_line)
            .map(|excerpt| (source, excerpt))
    }) {
        Some((source, excerpt)) => {
            let span = source.span_in_excerpt(
                &excerpt,
                region.line,
                region.column,
                region.end_line,
                region.end_column,
            );
            let text = &source.text[excerpt.bytes.clone()];
            let long = if region.line == region.end_line {
                text.len() > MAX_SNIPPET_LINE
            } else {
                has_line_longer_than(text, MAX_SNIPPET_LINE)
            };
            if !long {
                elements.push(
                    Snippet::source(text)
                        .line_start(excerpt.first_line)
                        .path(path.clone())
                        .annotation(AnnotationKind::Primary.span(span))
                        .into(),
                );
            } else {
                // A line of generated or minified code: a window around the finding, marked
                // with `…`, so that rendering does not go over the whole line for every finding
                // on it; the place is written out, since the window's columns are not the line's.
                let window = window_around(text, span.clone());
                let span = window.place(span);
                elements.push(
                    Origin::path(path.clone())
                        .line(region.line)
                        .char_column(region.column)
                        .into(),
                );
                let first_line = source.line_of(excerpt.bytes.start + window.from);
                shown_window = window.text;
                elements.push(
                    Snippet::source(shown_window.as_str())
                        .line_start(first_line)
                        .annotation(AnnotationKind::Primary.span(span))
                        .into(),
                );
            }
        }
        None => {
            elements.push(
                Origin::path(path.clone())
                    .line(region.line)
                    .char_column(region.column)
                    .into(),
            );
        }
    }
    for note in &diagnostic.notes {
        elements.push(Level::NOTE.message(display_note(note)).into());
    }
    if !diagnostic.help.is_empty() {
        elements.push(Level::HELP.message(diagnostic.help.as_str()).into());
    }
    let pointer = format!(
        "rule {}; see `perfkit rule {}`",
        diagnostic.name, diagnostic.code
    );
    elements.push(Level::NOTE.message(pointer).into());
    let group = title.elements(elements);

    let mut groups: Vec<Group<'_>> = vec![group];
    let shown = match (&diagnostic.fix, source) {
        (Some(fix), Some(source)) => fix_excerpt(fix, source),
        _ => None,
    };
    if let (Some(fix), Some(shown)) = (&diagnostic.fix, &shown)
        && let Some(suggestion) = fix_group(fix, shown, &path)
    {
        groups.push(suggestion);
    }
    renderer.render(&groups)
}

/// Longest line a finding's excerpt is shown with whole (the renderer cuts what it prints to the
/// terminal's width, but reads the whole line for every finding on it).
const MAX_SNIPPET_LINE: usize = 1024;

/// Whether a line of `text` is longer than `max` bytes.
fn has_line_longer_than(text: &str, max: usize) -> bool {
    // A text no longer than `max` has no longer line: most excerpts end here, without a scan.
    text.len() > max && text.split('\n').any(|line| line.len() > max)
}

/// A window cut out of a text around a span (see [`window_around`]).
struct Window {
    /// The window's text, with its `…` marks.
    text: String,
    /// Where the window starts in the text it was cut from.
    from: usize,
    /// Length of the `…` mark at the start of `text` (0 when the window starts a line).
    mark: usize,
}

impl Window {
    /// A range of the text the window was cut from, as a range of the window's text.
    fn place(&self, range: Range<usize>) -> Range<usize> {
        (range.start - self.from + self.mark)..(range.end - self.from + self.mark)
    }
}

/// A window of `text` around `span`, within the span's lines, [`FIX_CONTEXT`] bytes on each side,
/// marked with `…` where it cuts a line.
fn window_around(text: &str, span: Range<usize>) -> Window {
    // The line breaks are looked for within the window's reach only: a generated line of a
    // megabyte is not searched end to end for each of its findings.
    let bytes = text.as_bytes();
    let reach_back = span.start.saturating_sub(FIX_CONTEXT + 1);
    let line_start =
        memchr::memrchr(b'\n', &bytes[reach_back..span.start]).map_or(0, |at| reach_back + at + 1);
    let reach_on = (span.end + FIX_CONTEXT + 1).min(text.len());
    let line_end = memchr::memchr(b'\n', &bytes[span.end.min(reach_on)..reach_on])
        .map_or(text.len(), |at| span.end + at);
    let mut from = span.start.saturating_sub(FIX_CONTEXT).max(line_start);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let mut to = (span.end + FIX_CONTEXT).min(line_end);
    while !text.is_char_boundary(to) {
        to += 1;
    }
    let lead = if from > line_start { "…" } else { "" };
    let tail = if to < line_end { "…" } else { "" };
    Window {
        text: format!("{lead}{}{tail}", &text[from..to]),
        from,
        mark: lead.len(),
    }
}

/// Longest line a fix is shown with whole: an excerpt with a longer line (generated or minified
/// code) is cut to [`FIX_CONTEXT`] bytes on each side of the edits, so that a long line is not
/// printed twice for every fix on it.
const MAX_FIX_EXCERPT: usize = 240;
const FIX_CONTEXT: usize = 60;

/// The text a fix is shown on: the lines its edits touch, or a window of them marked with `…`.
struct FixExcerpt<'a> {
    text: std::borrow::Cow<'a, str>,
    first_line: usize,
    /// Offset in the file of the first byte of `text` after the `…` mark (if any).
    base: usize,
    /// Length of the `…` mark at the start of `text` (0 when the excerpt starts a line).
    mark: usize,
}

/// The excerpt of `fix`, when its edits fit the file.
fn fix_excerpt<'a>(fix: &Fix, source: &'a SourceText) -> Option<FixExcerpt<'a>> {
    let start = fix.edits.iter().map(|edit| edit.start).min()?;
    let end = fix.edits.iter().map(|edit| edit.end).max()?;
    if end > source.text.len() || fix.edits.iter().any(|edit| edit.start > edit.end) {
        return None;
    }
    let first_line = source.line_of(start);
    let excerpt = source.excerpt(first_line, source.line_of(end))?;
    let base = excerpt.bytes.start;
    let text = &source.text[excerpt.bytes];
    if !has_line_longer_than(text, MAX_FIX_EXCERPT) {
        return Some(FixExcerpt {
            text: std::borrow::Cow::Borrowed(text),
            first_line,
            base,
            mark: 0,
        });
    }
    let window = window_around(text, (start - base)..(end - base));
    let from = base + window.from;
    Some(FixExcerpt {
        text: std::borrow::Cow::Owned(window.text),
        // A window that starts on a later line than the excerpt shows that line's number.
        first_line: source.line_of(from),
        base: from,
        mark: window.mark,
    })
}

/// The suggested fix as a rustc-style `help:` with the changed lines.
fn fix_group<'a>(fix: &'a Fix, shown: &'a FixExcerpt<'_>, path: &str) -> Option<Group<'a>> {
    let text: &str = &shown.text;
    let mut patches = Vec::with_capacity(fix.edits.len());
    for edit in &fix.edits {
        let range = (edit.start - shown.base + shown.mark)..(edit.end - shown.base + shown.mark);
        // Edits must fall on character boundaries of the excerpt; anything else is not shown.
        if range.end > text.len()
            || !text.is_char_boundary(range.start)
            || !text.is_char_boundary(range.end)
        {
            return None;
        }
        patches.push(Patch::new(range, edit.replacement.as_str()));
    }
    Some(
        Level::HELP.secondary_title(fix.title.as_str()).element(
            Snippet::source(text)
                .line_start(shown.first_line)
                .path(path.to_string())
                .patches(patches),
        ),
    )
}

fn level_of(severity: Severity) -> Level<'static> {
    match severity {
        Severity::Error => Level::ERROR,
        Severity::Warning => Level::WARNING,
        Severity::Note => Level::NOTE,
    }
}

/// `error: path:line: message` for a file that could not be linted.
fn write_file_error(out: &mut impl Write, error: &FileError, color: bool) -> io::Result<()> {
    let path = terminal_path(&error.path);
    let location = match error.line {
        Some(line) => format!("{path}:{line}"),
        None => path,
    };
    if color {
        writeln!(
            out,
            "{ERROR_STYLE}error{ERROR_STYLE:#}{BOLD}: {location}: {}{BOLD:#}",
            error.message
        )
    } else {
        writeln!(out, "error: {location}: {}", error.message)
    }
}

/// The closing line, e.g. `12 files scanned: 3 warnings, 1 note (2 fixable with --fix)`.
fn write_summary(out: &mut impl Write, report: &LintReport, color: bool) -> io::Result<()> {
    writeln!(out, "{}", summary_line(report, color))
}

/// The closing summary line of a report (without a newline).
pub fn summary_line(report: &LintReport, color: bool) -> String {
    let counts = Counts::of(report);
    let mut parts = Vec::new();
    for (count, word) in [
        (counts.errors, "error"),
        (counts.warnings, "warning"),
        (counts.notes, "note"),
    ] {
        if count > 0 {
            parts.push(plural(count, word));
        }
    }
    let mut line = format!("{} scanned: ", plural(report.files_scanned, "file"));
    if parts.is_empty() {
        line.push_str("no findings");
    } else {
        line.push_str(&parts.join(", "));
    }
    if counts.fixable > 0 {
        line.push_str(&format!(" ({} fixable with --fix)", counts.fixable));
    }
    if !report.errors.is_empty() {
        let failed = plural(report.errors.len(), "file");
        line.push_str(&format!("; {failed} could not be linted"));
    }
    if color {
        format!("{BOLD}{line}{BOLD:#}")
    } else {
        line
    }
}

fn plural(count: usize, word: &str) -> String {
    if count == 1 {
        format!("{count} {word}")
    } else {
        format!("{count} {word}s")
    }
}

/// The text of one source file with the byte offset of each line, for cutting excerpts.
#[derive(Debug)]
pub struct SourceText {
    text: String,
    line_starts: Vec<usize>,
    /// The text is ASCII: a column is a byte count (no walk over the characters before it, which
    /// made thousands of findings on one generated line quadratic).
    ascii: bool,
}

/// A run of whole lines of a [`SourceText`].
#[derive(Debug, Clone)]
struct Excerpt {
    first_line: usize,
    bytes: Range<usize>,
}

impl SourceText {
    /// Indexes `text` by line.
    pub fn new(text: String) -> SourceText {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(at, _)| at + 1));
        let ascii = text.is_ascii();
        SourceText {
            text,
            line_starts,
            ascii,
        }
    }

    /// Indexes Python `text` by line: a lone `\r` ends a line too, as Python reads it.
    pub fn python(text: String) -> SourceText {
        let line_starts = crate::python::line_starts(&text);
        let ascii = text.is_ascii();
        SourceText {
            text,
            line_starts,
            ascii,
        }
    }

    /// Lines `first..=last` (1-based) without the final line break; `None` when `first` is not a line of
    /// the file.
    fn excerpt(&self, first: usize, last: usize) -> Option<Excerpt> {
        let start = *self.line_starts.get(first.checked_sub(1)?)?;
        let last = last.max(first).min(self.line_starts.len());
        let mut end = self
            .line_starts
            .get(last)
            .map_or(self.text.len(), |next| next - 1);
        if end > start && self.text.as_bytes()[end - 1] == b'\r' {
            end -= 1;
        }
        Some(Excerpt {
            first_line: first,
            bytes: start..end.max(start),
        })
    }

    /// The whole text.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// Line `line` (1-based) without its line break; `None` past the end of the file.
    pub(super) fn line_text(&self, line: usize) -> Option<&str> {
        let start = *self.line_starts.get(line.checked_sub(1)?)?;
        let end = self
            .line_starts
            .get(line)
            .map_or(self.text.len(), |next| next - 1);
        let text = &self.text[start..end.max(start)];
        Some(text.strip_suffix('\r').unwrap_or(text))
    }

    /// Byte offset of (`line`, `column`) (1-based, column in characters); a column past the end
    /// of its line is the end of the line, a line past the end of the file is the end of the file.
    pub(super) fn byte_offset(&self, line: usize, column: usize) -> usize {
        let Some(start) = line
            .checked_sub(1)
            .and_then(|index| self.line_starts.get(index))
        else {
            return self.text.len();
        };
        let line_text = self.line_text(line).unwrap_or("");
        start + self.column_offset(line_text, column)
    }

    /// The byte offset in `line_text` of 1-based character `column` (its end when past it).
    fn column_offset(&self, line_text: &str, column: usize) -> usize {
        if self.ascii {
            return column.saturating_sub(1).min(line_text.len());
        }
        line_text
            .char_indices()
            .nth(column.saturating_sub(1))
            .map_or(line_text.len(), |(at, _)| at)
    }

    /// The 1-based (line, column) of byte `offset`, the column in characters.
    pub(super) fn position_of(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_of(offset);
        let start = self.line_starts[line - 1];
        let before = self.text.get(start..offset).unwrap_or("");
        let column = if self.ascii {
            before.len()
        } else {
            before.chars().count()
        };
        (line, column + 1)
    }

    /// The 1-based line that holds byte `offset`.
    fn line_of(&self, offset: usize) -> usize {
        self.line_starts
            .partition_point(|&start| start <= offset)
            .max(1)
    }

    /// Byte range, inside `excerpt`, of the region from (`line`, `column`) to (`end_line`, `end_column`)
    /// (1-based, columns in characters, end exclusive). Never empty where the excerpt has text, so that a
    /// caret is always drawn.
    fn span_in_excerpt(
        &self,
        excerpt: &Excerpt,
        line: usize,
        column: usize,
        end_line: usize,
        end_column: usize,
    ) -> Range<usize> {
        let text = &self.text[excerpt.bytes.clone()];
        let start = self.offset_in_excerpt(excerpt, line, column);
        let end = if (end_line, end_column) > (line, column) {
            self.offset_in_excerpt(excerpt, end_line, end_column)
        } else {
            start
        };
        let end = if end > start {
            end
        } else {
            text[start..]
                .chars()
                .next()
                .map_or(start, |c| start + c.len_utf8())
        };
        start..end
    }

    fn offset_in_excerpt(&self, excerpt: &Excerpt, line: usize, column: usize) -> usize {
        let text = &self.text[excerpt.bytes.clone()];
        let Some(line_start) = line
            .checked_sub(1)
            .and_then(|index| self.line_starts.get(index))
        else {
            return text.len();
        };
        let relative = line_start
            .saturating_sub(excerpt.bytes.start)
            .min(text.len());
        let rest = &text[relative..];
        let line_text = self
            .line_text(line)
            .filter(|line_text| line_text.len() <= rest.len())
            .unwrap_or(rest);
        relative + self.column_offset(line_text, column)
    }
}

/// Reads each finding's file once: findings come sorted by path (and, in a notebook, by cell), so
/// only the last file, and the last cell of it, is kept.
#[derive(Debug, Default)]
pub(super) struct SourceCache {
    path: Option<PathBuf>,
    /// The file's text (for a notebook, its JSON).
    text: Option<String>,
    cell: Option<usize>,
    source: Option<SourceText>,
}

impl SourceCache {
    /// The text of `path`, or of its cell `cell` when it is a notebook.
    pub(super) fn get(&mut self, path: &Path, cell: Option<usize>) -> Option<&SourceText> {
        let new_file = self.path.as_deref() != Some(path);
        if new_file {
            self.path = Some(path.to_path_buf());
            self.text = None;
        }
        if new_file || self.cell != cell {
            self.cell = cell;
            if self.text.is_none() {
                self.text = std::fs::read(path)
                    .ok()
                    .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
            }
            self.source = match cell {
                // The notebook's JSON is kept for its other cells.
                Some(cell) => self
                    .text
                    .as_deref()
                    .and_then(|text| crate::python::notebook::cell_source(text, cell))
                    .map(SourceText::python),
                None if crate::engine::is_python(path) => self.text.take().map(SourceText::python),
                None => self.text.take().map(SourceText::new),
            };
        }
        self.source.as_ref()
    }
}

/// [`display_path`] for a terminal: control characters in a file name (an escape sequence, a
/// newline) are shown escaped (`\u{1b}`), never sent to the terminal as they are.
fn terminal_path(path: &std::path::Path) -> String {
    let shown = display_path(path);
    if !shown.chars().any(char::is_control) {
        return shown;
    }
    shown
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_in_file_names_are_shown_escaped() {
        let shown = super::terminal_path(std::path::Path::new("a\u{1b}[31mred\nb.py"));
        assert_eq!(shown, "a\\u{1b}[31mred\\nb.py");
        assert_eq!(
            super::terminal_path(std::path::Path::new("plain/é.py")),
            "plain/é.py"
        );
    }

    use super::*;
    use crate::output::test_support::{diagnostic, fix, report};

    fn render_plain(diagnostic: &Diagnostic, source: &str) -> String {
        let source = SourceText::new(source.to_string());
        render_diagnostic(&Renderer::plain(), diagnostic, Some(&source))
    }

    const TRAIN: &str = "fn train() {\n    for batch in batches {\n        let loss = model.forward(&batch)?;\n        total += loss.to_scalar::<f32>()?;\n        opt.backward_step(&loss)?;\n    }\n}\n";

    #[test]
    fn shows_the_source_line_with_carets_under_the_span() {
        let d = diagnostic("src/train.rs", 4, 23, 41);
        let text = render_plain(&d, TRAIN);
        let expected = "\
warning[PK101]: `to_scalar` reads a value back to the host on every step
 --> src/train.rs:4:23
  |
4 |         total += loss.to_scalar::<f32>()?;
  |                       ^^^^^^^^^^^^^^^^^^
  |
  = note: the step loop starts at line 3
  = help: keep the running loss on the device and read it once per epoch
  = note: rule host-readback-in-step-loop; see `perfkit rule PK101`";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_very_long_line_is_shown_as_a_window_around_the_finding_and_its_fix() {
        // 100,000 characters on one line, the finding near the middle: the excerpt and the fix are
        // cut around it (not printed whole for each finding), and the place is the line's.
        let filler = "y = 1;".repeat(8_000);
        let source = format!("{filler}x = t.to_scalar();{filler}\n");
        let column = filler.len() + 5;
        let mut d = diagnostic("gen.py", 1, column, column + 11);
        let at = filler.len() + 4;
        d.fix = Some(fix(at, at + 1, "u"));
        let text = render_plain(&d, &source);
        assert!(text.len() < 2_000, "{} bytes", text.len());
        assert!(text.contains(&format!("--> gen.py:1:{column}")), "{text}");
        let code = text
            .lines()
            .find(|l| l.starts_with("1 |"))
            .expect("the line");
        assert!(code.starts_with("1 | …") && code.ends_with('…'), "{code}");
        assert!(code.contains("y = 1;x = t.to_scalar();y = 1;"), "{code}");
        let caret = text.lines().find(|l| l.contains('^')).expect("carets");
        let code_column = code[..code.find("t.to_scalar").unwrap()].chars().count();
        assert_eq!(caret.find('^'), Some(code_column));
        let fixed = text
            .lines()
            .find(|l| l.starts_with("1 +"))
            .expect("the fix");
        assert!(
            fixed.contains("x = u.to_scalar()") && fixed.len() < 400,
            "{fixed}"
        );
    }

    #[test]
    fn tabs_and_wide_characters_keep_the_carets_aligned() {
        let source = "fn f() {\n\tlet 名前 = t.to_scalar::<f32>()?;\n}\n";
        // `t.to_scalar::<f32>()` starts at character 11 (the tab counts as one character).
        let d = diagnostic("src/wide.rs", 2, 11, 31);
        let text = render_plain(&d, source);
        let lines: Vec<&str> = text.lines().collect();
        let code = lines.iter().find(|line| line.starts_with("2 |")).unwrap();
        let carets = lines.iter().find(|line| line.contains('^')).unwrap();
        // The tab is shown as spaces and the two wide characters take two columns each.
        assert_eq!(*code, "2 |     let 名前 = t.to_scalar::<f32>()?;");
        let caret_column = carets.find('^').unwrap();
        let span_column = unicode_display_width(&code[..code.find("t.to_scalar").unwrap()]);
        assert_eq!(caret_column, span_column);
        assert_eq!(carets.matches('^').count(), "t.to_scalar::<f32>()".len());
    }

    fn unicode_display_width(text: &str) -> usize {
        text.chars()
            .map(|c| if c > '\u{2E80}' { 2 } else { 1 })
            .sum()
    }

    #[test]
    fn multi_line_spans_are_drawn_across_their_lines() {
        let source = "fn f() {\n    let v = loss\n        .to_scalar::<f32>()?;\n}\n";
        let mut d = diagnostic("src/multi.rs", 2, 13, 24);
        d.region.end_line = 3;
        let text = render_plain(&d, source);
        assert!(text.contains("2 |       let v = loss"), "{text}");
        assert!(
            text.contains("3 | |         .to_scalar::<f32>()?;"),
            "{text}"
        );
        assert!(text.contains("|_______________________^"), "{text}");
    }

    #[test]
    fn a_fix_is_shown_as_a_suggestion() {
        let source =
            "let t = Tensor::zeros((2, 2), DType::F32, &Device::Cpu)?.to_device(&device)?;\n";
        let mut d = diagnostic("src/fix.rs", 1, 9, 77);
        let cpu = source.find("&Device::Cpu").unwrap();
        let copy = source.find(".to_device(&device)").unwrap();
        d.fix = Some(crate::Fix {
            title: "create the tensor on the target device".to_string(),
            edits: vec![
                crate::Edit {
                    start: cpu,
                    end: cpu + "&Device::Cpu".len(),
                    replacement: "&device".to_string(),
                },
                crate::Edit {
                    start: copy,
                    end: copy + ".to_device(&device)?".len(),
                    replacement: String::new(),
                },
            ],
            linted: None,
        });
        let text = render_plain(&d, source);
        assert!(
            text.contains("help: create the tensor on the target device"),
            "{text}"
        );
        assert!(
            text.contains("Tensor::zeros((2, 2), DType::F32, &device)?;"),
            "{text}"
        );
        let _ = fix(0, 0, "");
    }

    #[test]
    fn windows_line_endings_do_not_leak_into_the_snippet() {
        let source = TRAIN.replace('\n', "\r\n");
        let d = diagnostic("src/train.rs", 4, 23, 41);
        let text = render_plain(&d, &source);
        assert!(!text.contains('\r'), "{text:?}");
        assert!(
            text.contains("4 |         total += loss.to_scalar::<f32>()?;\n"),
            "{text}"
        );
        let mut multi = diagnostic("src/train.rs", 3, 9, 41);
        multi.region.end_line = 4;
        let text = render_plain(&multi, &source);
        assert!(!text.contains('\r'), "{text:?}");
    }

    #[test]
    fn an_unreadable_file_is_shown_by_its_location() {
        let d = diagnostic("does/not/exist.rs", 7, 3, 9);
        let text = render_diagnostic(&Renderer::plain(), &d, None);
        assert!(
            text.starts_with("warning[PK101]: `to_scalar` reads"),
            "{text}"
        );
        assert!(text.contains("--> does/not/exist.rs:7:3"), "{text}");
        assert!(text.contains("= help: keep the running loss"), "{text}");
    }

    #[test]
    fn a_region_past_the_end_of_the_file_does_not_panic() {
        let d = diagnostic("src/short.rs", 40, 3, 9);
        let text = render_plain(&d, "fn main() {}\n");
        assert!(text.contains("src/short.rs:40:3"), "{text}");
        let mut d = diagnostic("src/short.rs", 1, 300, 400);
        d.region.end_line = 1;
        let text = render_plain(&d, "fn main() {}\n");
        assert!(text.contains("src/short.rs:1:"), "{text}");
    }

    #[test]
    fn the_report_ends_with_a_summary_and_lists_file_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("train.rs");
        std::fs::write(&file, TRAIN).unwrap();
        let mut note = diagnostic(file.to_str().unwrap(), 4, 23, 41);
        note.severity = Severity::Note;
        let warning = diagnostic(file.to_str().unwrap(), 4, 23, 41);
        let errors = vec![FileError {
            path: PathBuf::from("src/broken.rs"),
            message: "expected `;`".to_string(),
            line: Some(3),
        }];
        let report = report(vec![warning, note], errors, 5);
        let mut out = Vec::new();
        render(&mut out, &report, &RenderOptions::default()).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("error: src/broken.rs:3: expected `;`\n"),
            "{text}"
        );
        assert!(
            text.contains("4 |         total += loss.to_scalar::<f32>()?;"),
            "{text}"
        );
        assert!(text.contains("note[PK101]:"), "{text}");
        assert!(!text.contains('\u{1b}'), "no colour was asked for: {text}");
        assert_eq!(
            text.lines().last(),
            Some("5 files scanned: 1 warning, 1 note; 1 file could not be linted")
        );
    }

    #[test]
    fn colour_is_emitted_only_when_asked() {
        let report = report(vec![diagnostic("missing.rs", 1, 1, 2)], Vec::new(), 1);
        let mut out = Vec::new();
        render(&mut out, &report, &RenderOptions::default().color(true)).unwrap();
        assert!(String::from_utf8(out).unwrap().contains('\u{1b}'));
    }

    #[test]
    fn summary_counts_by_severity_and_fixable() {
        let mut error = diagnostic("a.rs", 1, 1, 2);
        error.severity = Severity::Error;
        let mut fixable = diagnostic("a.rs", 2, 1, 2);
        fixable.fix = Some(fix(0, 1, "x"));
        let report = report(
            vec![error, fixable, diagnostic("b.rs", 1, 1, 2)],
            Vec::new(),
            1,
        );
        assert_eq!(
            summary_line(&report, false),
            "1 file scanned: 1 error, 2 warnings (1 fixable with --fix)"
        );
        let empty = crate::output::test_support::report(Vec::new(), Vec::new(), 3);
        assert_eq!(summary_line(&empty, false), "3 files scanned: no findings");
    }
}
