//! GitHub Actions workflow commands: one annotation per finding, shown on the pull request's diff.
//!
//! ```text
//! ::warning file=src/train.rs,line=42,col=29,endLine=42,endColumn=47,title=PK101 host-readback-in-step-loop::`to_scalar` reads ...
//! ```
//!
//! Findings of severity note become `::notice`, errors `::error`; a file that could not be linted is an
//! `::error` on that file. The help follows the message on a second line. Data is escaped as the
//! workflow-command rules ask (`%`, CR, LF; in properties also `:` and `,`).

use std::io::{self, Write};

use super::display_path;
use crate::{LintReport, Severity};

/// Writes one workflow command per finding and per file error.
pub fn render(out: &mut impl Write, report: &LintReport) -> io::Result<()> {
    for d in &report.diagnostics {
        let command = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "notice",
        };
        let region = d.region;
        let mut message = d.message.clone();
        if !d.help.is_empty() {
            message.push_str("\nhelp: ");
            message.push_str(&d.help);
        }
        if let Some(cell) = d.cell {
            // Lines of a notebook's cells are not lines of the `.ipynb` file: the annotation is
            // on the file, and its title names the cell.
            writeln!(
                out,
                "::{command} file={},title={}::{}",
                escape_property(&display_path(&d.path)),
                escape_property(&format!(
                    "{} {} (cell {cell}, line {})",
                    d.code, d.name, region.line
                )),
                escape_data(&message),
            )?;
            continue;
        }
        writeln!(
            out,
            "::{command} file={},line={},col={},endLine={},endColumn={},title={}::{}",
            escape_property(&display_path(&d.path)),
            region.line,
            region.column,
            region.end_line,
            region.end_column,
            escape_property(&format!("{} {}", d.code, d.name)),
            escape_data(&message),
        )?;
    }
    for error in &report.errors {
        let mut properties = format!("file={}", escape_property(&display_path(&error.path)));
        if let Some(line) = error.line {
            properties.push_str(&format!(",line={line}"));
        }
        writeln!(
            out,
            "::error {properties},title=perfkit lint::{}",
            escape_data(&error.message)
        )?;
    }
    Ok(())
}

/// Escapes the message part of a workflow command.
pub fn escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Escapes a property value of a workflow command.
pub fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileError;
    use crate::output::test_support::{diagnostic, report};
    use std::path::PathBuf;

    #[test]
    fn one_command_per_finding_and_error() {
        let mut note = diagnostic("src/train.rs", 9, 5, 12);
        note.severity = Severity::Note;
        note.message = "100% of steps: read, then wait".into();
        let errors = vec![
            FileError {
                path: PathBuf::from("src/a,b.rs"),
                message: "expected `;`\nfound `}`".into(),
                line: Some(3),
            },
            FileError {
                path: PathBuf::from("src/bin.rs"),
                message: "stream did not contain valid UTF-8".into(),
                line: None,
            },
        ];
        let report = report(
            vec![diagnostic("./src/train.rs", 4, 23, 41), note],
            errors,
            3,
        );
        let mut out = Vec::new();
        render(&mut out, &report).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "::warning file=src/train.rs,line=4,col=23,endLine=4,endColumn=41,title=PK101 host-readback-in-step-loop::`to_scalar` reads a value back to the host on every step%0Ahelp: keep the running loss on the device and read it once per epoch",
                "::notice file=src/train.rs,line=9,col=5,endLine=9,endColumn=12,title=PK101 host-readback-in-step-loop::100%25 of steps: read, then wait%0Ahelp: keep the running loss on the device and read it once per epoch",
                "::error file=src/a%2Cb.rs,line=3,title=perfkit lint::expected `;`%0Afound `}`",
                "::error file=src/bin.rs,title=perfkit lint::stream did not contain valid UTF-8",
            ]
        );
    }

    #[test]
    fn properties_escape_colons_and_commas() {
        assert_eq!(escape_property("C:\\a,b%\r\n"), "C%3A\\a%2Cb%25%0D%0A");
        assert_eq!(escape_data("a:b,c"), "a:b,c");
    }
}
