//! Jupyter notebooks (`.ipynb`): the code cells of a notebook linted as one Python module.
//!
//! The notebook's JSON is read with `serde_json`; the source of every code cell (a string or a list
//! of strings) is copied verbatim, in order, into one module, each cell followed by a blank line, so
//! that a `DataLoader` built in one cell and iterated by a training loop in a later cell is seen
//! as in a script. The module is parsed in Ruff's IPython mode, where line magics (`%time`,
//! `%matplotlib inline`), shell escapes (`!pip install ..`, `files = !ls`) and help (`obj?`) are
//! escape-command statements that no rule reads.
//!
//! A cell that starts with a cell magic (`%%bash`, `%%writefile train.py`, `%%html`, ...) is not
//! Python run in this kernel and is skipped as a whole, except the magics that run their cell as
//! Python here: `%%time`, `%%timeit`, `%%capture`, `%%prun` and `%%debug` (their first line is an
//! escape command, the rest is linted). Raw and Markdown cells are skipped, and so is a notebook
//! whose kernel is not Python (its `metadata.kernelspec.language` or `language_info.name`).
//!
//! Every finding is mapped back to its cell: cells are numbered from 1 in the order of the
//! notebook's `cells` list (Markdown cells count, as Ruff counts them), lines and columns are those
//! of the cell's own text.

use serde_json::Value;

/// Cell magics whose cell is still Python run in the notebook's kernel.
const PYTHON_CELL_MAGICS: &[&str] = &["time", "timeit", "capture", "prun", "debug"];

/// Where the code cells of a notebook lie in the module built from them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CellIndex {
    /// Per linted cell: its number (1-based, in the notebook's `cells` list) and the module line
    /// (1-based) where its first line is.
    cells: Vec<(usize, usize)>,
}

impl CellIndex {
    /// The cell number and the line within the cell (both 1-based) of a module line.
    pub fn locate(&self, line: usize) -> Option<(usize, usize)> {
        let at = self.cells.partition_point(|&(_, first)| first <= line);
        let (cell, first) = *self.cells.get(at.checked_sub(1)?)?;
        Some((cell, line - first + 1))
    }

    /// Per linted cell: its number and the module line where it starts.
    pub(crate) fn starts(&self) -> &[(usize, usize)] {
        &self.cells
    }

    /// Cells linted.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether no cell is linted.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }
}

/// A notebook's code as one module.
#[derive(Debug, Clone, Default)]
pub struct NotebookSource {
    /// The code cells, in order, each followed by a blank line.
    pub source: String,
    pub index: CellIndex,
}

/// Why a notebook cannot be read: a message and, for malformed JSON, the line in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotebookError {
    pub message: String,
    pub line: Option<usize>,
}

/// The cells of a notebook's JSON text, or why it is not a notebook.
fn cells(text: &str) -> Result<(Value, bool), NotebookError> {
    let value: Value = serde_json::from_str(text).map_err(|err| {
        let full = err.to_string();
        let suffix = format!(" at line {} column {}", err.line(), err.column());
        let message = full.strip_suffix(&suffix).unwrap_or(&full);
        NotebookError {
            message: format!(
                "not a valid notebook: malformed JSON at column {}: {message}",
                err.column()
            ),
            line: Some(err.line()),
        }
    })?;
    let not_notebook = |what: &str| NotebookError {
        message: format!("not a valid notebook: {what}"),
        line: None,
    };
    let Some(object) = value.as_object() else {
        return Err(not_notebook("the JSON is not an object"));
    };
    if object.contains_key("worksheets") && !object.contains_key("cells") {
        return Err(not_notebook(
            "nbformat 3 (`worksheets`) is not read; convert it with `jupyter nbconvert --to notebook`",
        ));
    }
    if !object.get("cells").is_some_and(Value::is_array) {
        return Err(not_notebook("no `cells` list"));
    }
    let python = is_python_kernel(object.get("metadata"));
    Ok((value, python))
}

/// Whether the notebook's kernel is Python (or says nothing about its language).
fn is_python_kernel(metadata: Option<&Value>) -> bool {
    let language = metadata.and_then(|m| {
        m.pointer("/kernelspec/language")
            .or_else(|| m.pointer("/language_info/name"))
            .and_then(Value::as_str)
    });
    language.is_none_or(|l| l.eq_ignore_ascii_case("python"))
}

/// The source of a cell: a string, or a list of strings joined as they are (nbformat's
/// "multiline string"); `None` for anything else, which is no notebook's.
fn cell_text(cell: &Value) -> Option<String> {
    match cell.get("source")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts.iter().map(Value::as_str).collect(),
        _ => None,
    }
}

/// Whether a code cell is Python run in this kernel: it does not start with a cell magic, or its
/// cell magic runs the cell as Python (`%%time`).
fn is_python_cell(text: &str) -> bool {
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        return match line.strip_prefix("%%") {
            Some(magic) => {
                let name = magic.split_whitespace().next().unwrap_or("");
                PYTHON_CELL_MAGICS.contains(&name)
            }
            None => true,
        };
    }
    true
}

/// Reads a notebook's JSON text into one module of its Python code cells.
pub fn read(text: &str) -> Result<NotebookSource, NotebookError> {
    let (value, python) = cells(text)?;
    let mut out = NotebookSource::default();
    if !python {
        return Ok(out);
    }
    let list = value["cells"].as_array().map_or(&[][..], Vec::as_slice);
    let mut line = 1;
    for (i, cell) in list.iter().enumerate() {
        if cell.get("cell_type").and_then(Value::as_str) != Some("code") {
            continue;
        }
        // A code cell whose source is missing or not text is no notebook's: said, not read as
        // an empty cell (its code would go unlinted without a word).
        let Some(text) = cell_text(cell) else {
            return Err(NotebookError {
                message: format!(
                    "not a valid notebook: cell {}: its `source` is not a string or a list of \
                     strings",
                    i + 1
                ),
                line: None,
            });
        };
        if !is_python_cell(&text) {
            continue;
        }
        out.index.cells.push((i + 1, line));
        let start = out.source.len();
        out.source.push_str(&text);
        if !text.ends_with('\n') {
            out.source.push('\n');
        }
        // A blank line after each cell: a `# perfkit: allow(..)` on a cell's last line never
        // reaches into the next cell.
        out.source.push('\n');
        // A cell's text ends with `\n` here, so no `\r\n` spans two cells: each is counted alone.
        line += super::line_starts(&out.source[start..]).len() - 1;
    }
    Ok(out)
}

/// The text of cell `number` (1-based) of a notebook's JSON text, as the user sees it.
pub fn cell_source(text: &str, number: usize) -> Option<String> {
    let value: Value = serde_json::from_str(text).ok()?;
    cell_text(
        value
            .get("cells")?
            .as_array()?
            .get(number.checked_sub(1)?)?,
    )
}

/// Whether a path is a notebook by its extension.
pub fn is_notebook(path: &std::path::Path) -> bool {
    path.extension().is_some_and(|e| e == "ipynb")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notebook(cells: &[(&str, Value)]) -> String {
        let cells: Vec<Value> = cells
            .iter()
            .map(|(kind, source)| serde_json::json!({"cell_type": kind, "metadata": {}, "source": source}))
            .collect();
        serde_json::json!({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
            .to_string()
    }

    #[test]
    fn code_cells_are_concatenated_and_mapped_back() {
        let text = notebook(&[
            ("markdown", serde_json::json!("# Title")),
            ("code", serde_json::json!(["import torch\n", "x = 1"])),
            ("code", serde_json::json!("%%bash\necho hi\n")),
            (
                "code",
                serde_json::json!("%%time\nfor b in loader:\n    pass\n"),
            ),
            ("raw", serde_json::json!("text")),
            (
                "code",
                serde_json::json!(["%matplotlib inline\n", "y = 2\n"]),
            ),
        ]);
        let nb = read(&text).unwrap();
        assert_eq!(
            nb.source,
            "import torch\nx = 1\n\n%%time\nfor b in loader:\n    pass\n\n%matplotlib inline\ny = 2\n\n"
        );
        assert_eq!(nb.index.len(), 3);
        assert_eq!(nb.index.locate(1), Some((2, 1)));
        assert_eq!(nb.index.locate(2), Some((2, 2)));
        assert_eq!(nb.index.locate(5), Some((4, 2)));
        assert_eq!(nb.index.locate(9), Some((6, 2)));
        assert_eq!(
            cell_source(&text, 4).as_deref(),
            Some("%%time\nfor b in loader:\n    pass\n")
        );
        assert!(crate::python::parse_notebook_source(&nb.source).is_ok());
    }

    #[test]
    fn a_syntax_error_is_named_in_the_cell_that_has_it() {
        // Jupyter compiles each cell alone: an unclosed bracket at the end of cell 2 is cell 2's
        // error, not the next cell's.
        let text = notebook(&[
            ("code", serde_json::json!("import torch\n")),
            ("code", serde_json::json!("x = (\n")),
            ("code", serde_json::json!("for b in loader:\n    pass\n")),
        ]);
        let Err(err) = crate::python::PyFile::parse_notebook("nb.ipynb".into(), &text) else {
            panic!("parses");
        };
        assert!(
            err.message.starts_with("syntax error in cell 2, line "),
            "{}",
            err.message
        );
        let text = notebook(&[
            ("code", serde_json::json!("y = 1 + \\")),
            ("code", serde_json::json!("z = 2\n")),
        ]);
        let Err(err) = crate::python::PyFile::parse_notebook("nb.ipynb".into(), &text) else {
            panic!("parses");
        };
        assert!(
            err.message.starts_with("syntax error in cell 1, line 1: "),
            "{}",
            err.message
        );
    }

    #[test]
    fn malformed_and_foreign_notebooks() {
        let err = read("{\n  \"cells\": [\n    {,}\n  ]\n}").unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(
            err.message
                .starts_with("not a valid notebook: malformed JSON at column 6"),
            "{}",
            err.message
        );
        assert_eq!(
            read("[1, 2]").unwrap_err().message,
            "not a valid notebook: the JSON is not an object"
        );
        assert_eq!(
            read("{\"metadata\": {}}").unwrap_err().message,
            "not a valid notebook: no `cells` list"
        );
        let r = r#"{"cells":[{"cell_type":"code","source":"x <- 1"}],"metadata":{"kernelspec":{"language":"R"}}}"#;
        assert!(read(r).unwrap().index.is_empty());
        // A code cell's source that is no text is said, not read as an empty cell; a markdown
        // cell's is not read at all.
        for source in ["123", "[1, 2]", "null", "[\"a\", 3]"] {
            let nb = format!(
                r#"{{"cells":[{{"cell_type":"markdown","source":5}},{{"cell_type":"code","source":{source}}}]}}"#
            );
            assert_eq!(
                read(&nb).unwrap_err().message,
                "not a valid notebook: cell 2: its `source` is not a string or a list of strings",
                "{source}"
            );
        }
        let missing = r#"{"cells":[{"cell_type":"code"}]}"#;
        assert!(read(missing).unwrap_err().message.contains("cell 1"));
    }
}
