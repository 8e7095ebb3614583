//! Jupyter notebooks (`.ipynb`): the code cells of a notebook linted as one Python module.
//!
//! The notebook's JSON is read with `serde_json` into the cells' types and sources and the
//! notebook's metadata; the rest (outputs, embedded images, execution counts) is skipped without
//! being built or copied. The source of every code cell (a string or a list of strings) is copied
//! verbatim, in order, into one module, each cell followed by a blank line, so that a `DataLoader` built in one cell and iterated by a training loop in a later cell is seen
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

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
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

/// A notebook's JSON as far as the linter reads it: the cells' types and sources and the
/// metadata; everything else (outputs, images, execution counts) is skipped without being built.
enum RawNotebook {
    /// The JSON is an array, a string, a number, ...
    NotObject,
    Object {
        /// `None`: no `cells` key; `Some(None)`: a `cells` that is not a list.
        cells: Option<Option<Vec<RawCell>>>,
        worksheets: bool,
        metadata: Option<Value>,
    },
}

/// One cell: its `cell_type` when it is a string, and its source when it is text.
#[derive(Default)]
struct RawCell {
    code: bool,
    source: Option<String>,
}

/// Skips the rest of a list.
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Skips the rest of an object.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Answers `default` for any JSON value but the ones a visitor reads, consuming it.
macro_rules! other_values {
    ($value:ty, $default:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_unit<E: de::Error>(self) -> Result<$value, E> {
            Ok($default)
        }
    };
}

impl<'de> Deserialize<'de> for RawNotebook {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawNotebook;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a notebook")
            }
            other_values!(RawNotebook, RawNotebook::NotObject);
            fn visit_str<E: de::Error>(self, _: &str) -> Result<RawNotebook, E> {
                Ok(RawNotebook::NotObject)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RawNotebook, A::Error> {
                skip_seq(seq)?;
                Ok(RawNotebook::NotObject)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawNotebook, A::Error> {
                let (mut cells, mut worksheets, mut metadata) = (None, false, None);
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match &*key {
                        "cells" => cells = Some(map.next_value::<CellList>()?.0),
                        "metadata" => metadata = Some(map.next_value::<Value>()?),
                        "worksheets" => {
                            worksheets = true;
                            map.next_value::<IgnoredAny>()?;
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(RawNotebook::Object {
                    cells,
                    worksheets,
                    metadata,
                })
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// The `cells` value: the cells when it is a list.
struct CellList(Option<Vec<RawCell>>);

impl<'de> Deserialize<'de> for CellList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CellList;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of cells")
            }
            other_values!(CellList, CellList(None));
            fn visit_str<E: de::Error>(self, _: &str) -> Result<CellList, E> {
                Ok(CellList(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<CellList, A::Error> {
                skip_map(map)?;
                Ok(CellList(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CellList, A::Error> {
                let mut cells = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(cell) = seq.next_element::<RawCell>()? {
                    cells.push(cell);
                }
                Ok(CellList(Some(cells)))
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for RawCell {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawCell;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a cell")
            }
            other_values!(RawCell, RawCell::default());
            fn visit_str<E: de::Error>(self, _: &str) -> Result<RawCell, E> {
                Ok(RawCell::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RawCell, A::Error> {
                skip_seq(seq)?;
                Ok(RawCell::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawCell, A::Error> {
                let mut cell = RawCell::default();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match &*key {
                        "cell_type" => {
                            cell.code = map.next_value::<Text>()?.0.as_deref() == Some("code");
                        }
                        "source" => cell.source = map.next_value::<Text>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(cell)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A string, or a list of strings joined as they are (nbformat's "multiline string"); `None` for
/// anything else.
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("text")
            }
            other_values!(Text, Text(None));
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text, E> {
                Ok(Text(Some(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text, E> {
                Ok(Text(Some(s)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Text, A::Error> {
                skip_map(map)?;
                Ok(Text(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
                let mut text = String::new();
                let mut all_text = true;
                while let Some(part) = seq.next_element_seed(Append(&mut text))? {
                    all_text &= part;
                }
                Ok(Text(all_text.then_some(text)))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// One part of a multiline string, appended to the text; `false` when it is not a string.
struct Append<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Append<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string")
    }
    other_values!(bool, false);
    fn visit_str<E: de::Error>(self, s: &str) -> Result<bool, E> {
        self.0.push_str(s);
        Ok(true)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        skip_map(map)?;
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        skip_seq(seq)?;
        Ok(false)
    }
}

/// The cells of a notebook's JSON text, and whether its kernel is Python, or why it is not a
/// notebook.
fn cells(text: &str) -> Result<(Vec<RawCell>, bool), NotebookError> {
    let notebook: RawNotebook = serde_json::from_str(text).map_err(|err| {
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
    let RawNotebook::Object {
        cells,
        worksheets,
        metadata,
    } = notebook
    else {
        return Err(not_notebook("the JSON is not an object"));
    };
    if worksheets && cells.is_none() {
        return Err(not_notebook(
            "nbformat 3 (`worksheets`) is not read; convert it with `jupyter nbconvert --to notebook`",
        ));
    }
    let Some(Some(cells)) = cells else {
        return Err(not_notebook("no `cells` list"));
    };
    Ok((cells, is_python_kernel(metadata.as_ref())))
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
    let (cells, python) = cells(text)?;
    let mut out = NotebookSource::default();
    if !python {
        return Ok(out);
    }
    let mut line = 1;
    for (i, cell) in cells.into_iter().enumerate() {
        if !cell.code {
            continue;
        }
        // A code cell whose source is missing or not text is no notebook's: said, not read as
        // an empty cell (its code would go unlinted without a word).
        let Some(text) = cell.source else {
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
    cells(text)
        .ok()?
        .0
        .into_iter()
        .nth(number.checked_sub(1)?)?
        .source
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
        for cells in ["5", "\"x\"", "{\"a\": [1]}", "null"] {
            assert_eq!(
                read(&format!(r#"{{"cells": {cells}}}"#))
                    .unwrap_err()
                    .message,
                "not a valid notebook: no `cells` list",
                "{cells}"
            );
        }
        assert!(
            read(r#"{"worksheets": []}"#)
                .unwrap_err()
                .message
                .contains("nbformat 3")
        );
    }

    #[test]
    fn outputs_and_other_keys_are_skipped_and_the_last_of_a_repeated_key_wins() {
        // Outputs of every JSON type, cells that are not objects, keys given twice (the last one
        // counts, as in a JSON object read whole), escapes in the source.
        let text = r#"{"metadata": {"kernelspec": {"language": "python"}}, "cells": [
            7, "text", [1, {"a": null}], null,
            {"outputs": [{"data": {"image/png": "iVBORw0KGgo\u0041=="}, "n": [1.5, -2, true, null]}],
             "cell_type": "markdown", "source": "x = 1", "cell_type": "code",
             "execution_count": 3, "metadata": {"tags": ["a", {"b": []}]}},
            {"cell_type": "code", "source": ["a = \"\u00e9\"\n", "b = 2"], "source": "c = 3"}
        ], "nbformat": 4, "nbformat_minor": 5}"#;
        let nb = read(text).unwrap();
        assert_eq!(nb.source, "x = 1\n\nc = 3\n\n");
        assert_eq!(nb.index.starts(), &[(5, 1), (6, 3)]);
        assert_eq!(cell_source(text, 6).as_deref(), Some("c = 3"));
        assert_eq!(cell_source(text, 1), None);
        let escaped =
            r#"{"cells": [{"cell_type": "code", "source": ["a = \"\u00e9\"\n", "b = 2"]}]}"#;
        assert_eq!(read(escaped).unwrap().source, "a = \"\u{e9}\"\nb = 2\n\n");
        // Outputs nested deeper than a JSON tree may be built are skipped all the same.
        let deep = format!(
            r#"{{"cells": [{{"cell_type": "code", "outputs": {}{}, "source": "x = 1"}}]}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert_eq!(read(&deep).unwrap().source, "x = 1\n\n");
        // Trailing text after the notebook is malformed JSON, as before.
        assert!(read(r#"{"cells": []} x"#).unwrap_err().line.is_some());
    }
}
