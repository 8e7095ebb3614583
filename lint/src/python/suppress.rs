//! Python suppression comments: `# perfkit: allow(PK101)` at the end of a line or on the line above,
//! `# perfkit: allow-file(PK101)` anywhere, and ruff-style `# noqa: PK101` (that line only) and
//! `# ruff: noqa: PK101` (or `# flake8: noqa: PK101`: the whole file, as ruff reads them).
//!
//! Only comment tokens are read, so text inside a string never suppresses anything. A `# noqa`
//! list may name other tools' codes (`# noqa: E501, PK101`): only `PK` codes are perfkit's; a bare
//! `# noqa` names no perfkit code and suppresses nothing of perfkit's.

use super::PyFile;
use crate::suppress::{Suppression, allow_list};

/// The suppression comments of a Python file.
pub(crate) fn parse(file: &PyFile) -> Vec<Suppression> {
    let mut out = Vec::new();
    let source = &file.source;
    for &range in &file.comments {
        let start = range.start().to_usize();
        let text = &source[start..range.end().to_usize()];
        let body = text.trim_start_matches('#').trim_start();
        let line = file.line_of(start);
        let line_start = source[..start].rfind(['\n', '\r']).map_or(0, |i| i + 1);
        let own_line = source[line_start..start].trim().is_empty();
        let column = source[line_start..start].chars().count() + 1;
        let end_column = column + text.chars().count();
        // A comment after a statement continued with `\` covers the whole statement.
        let first_line = if own_line {
            line
        } else {
            continued_from(source, line_start, line)
        };
        if let Some(rest) = body.strip_prefix("perfkit:") {
            let Some((file_wide, rest, close)) = allow_list(rest) else {
                continue;
            };
            let codes = split_codes(&rest[..close], false);
            if codes.is_empty() {
                continue;
            }
            out.push(Suppression {
                line,
                first_line,
                column,
                end_column,
                file_wide,
                used: vec![false; codes.len()],
                codes,
                own_line,
            });
            continue;
        }
        // `# noqa: PK101` may follow other text in the comment (`# type: ignore  # noqa: PK101`
        // is two comments for the tokenizer; `# fine, noqa: PK101` is one).
        let lower = body.to_ascii_lowercase();
        let Some(at) = lower.find("noqa") else {
            continue;
        };
        let rest = body[at + 4..].trim_start();
        let Some(list) = rest.strip_prefix(':') else {
            continue;
        };
        // `# ruff: noqa: PK101` (and flake8's form): ruff's exemption of the whole file.
        let before = lower[..at].trim_end();
        let file_wide = before
            .strip_suffix(':')
            .is_some_and(|tool| matches!(tool.trim(), "ruff" | "flake8"));
        let codes = split_codes(list, true);
        if codes.is_empty() {
            continue;
        }
        out.push(Suppression {
            line,
            first_line,
            column,
            end_column,
            file_wide,
            used: vec![false; codes.len()],
            codes,
            own_line: false,
        });
    }
    out
}

/// The first line of the statement that physical line `line` (starting at byte `line_start`)
/// ends, following `\` continuations back: `x = a \` / `    + b  # noqa: PK101`.
fn continued_from(source: &str, mut line_start: usize, mut line: usize) -> usize {
    while line_start > 0 {
        let before = &source[..line_start];
        let previous = before
            .strip_suffix('\n')
            .or_else(|| before.strip_suffix('\r'))
            .unwrap_or(before);
        let previous = previous.strip_suffix('\r').unwrap_or(previous);
        let start = previous.rfind(['\n', '\r']).map_or(0, |i| i + 1);
        // A backslash that ends a comment is the comment's, not a continuation.
        if !previous.ends_with('\\') || previous[start..].contains('#') {
            break;
        }
        line_start = start;
        line -= 1;
    }
    line
}

/// Whether a source may hold a suppression comment (it mentions `perfkit:`, or `noqa` in any
/// case, as [`parse`] reads it: `# NOQA: PK101`): only then are its comments kept after parsing.
pub(crate) fn may_suppress(source: &str) -> bool {
    let bytes = source.as_bytes();
    // `q` is rare in code: each one is checked for the word around it, in any case, which costs
    // less than searching for `noqa` (and finds `NOQA` too). One pass for `q`, `Q` and the `k` of
    // `perfkit:` instead costs more (54 M instructions over the corpus against 44 M): `k` is four
    // times as common as `q`.
    memchr::memchr2_iter(b'q', b'Q', bytes).any(|i| {
        i >= 2
            && bytes
                .get(i - 2..i + 2)
                .is_some_and(|w| w.eq_ignore_ascii_case(b"noqa"))
    }) || memchr::memmem::find(bytes, b"perfkit:").is_some()
}

/// Codes of a list: `PK101, PK202`. For `noqa`, codes of other tools are dropped and the list
/// ends at the first word that is not a code.
fn split_codes(list: &str, noqa: bool) -> Vec<String> {
    let mut codes = Vec::new();
    for item in list.split([',', ' ']) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let is_code = item.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && item.chars().any(|c| c.is_ascii_digit())
            && item.chars().all(|c| c.is_ascii_alphanumeric());
        if noqa {
            if !is_code {
                break;
            }
            if !item.to_ascii_uppercase().starts_with("PK") {
                continue;
            }
        }
        codes.push(item.to_ascii_uppercase());
    }
    codes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(source: &str) -> PyFile {
        PyFile::parse("t.py".into(), source.to_string()).expect("parses")
    }

    #[test]
    fn only_comments_count() {
        let f = file(concat!(
            "s = \"# perfkit: allow-file(PK101)\"\n",
            "t = '''\n# noqa: PK102\n'''\n",
            "x = loss.item()  # perfkit: allow(PK101)\n",
            "# perfkit: allow(PK303, pk202)\n",
            "y = 1  # noqa: E501, PK101 trailing words\n",
            "z = 2  # noqa\n",
        ));
        let found = parse(&f);
        let summary: Vec<(usize, Vec<String>, bool)> = found
            .iter()
            .map(|s| (s.line, s.codes.clone(), s.own_line))
            .collect();
        assert_eq!(
            summary,
            vec![
                (5, vec!["PK101".to_string()], false),
                (6, vec!["PK303".to_string(), "PK202".to_string()], true),
                (7, vec!["PK101".to_string()], false),
            ]
        );
        assert_eq!((found[0].column, found[0].end_column), (18, 41));
    }

    #[test]
    fn noqa_is_found_in_any_case() {
        for (source, kept) in [
            ("x = loss.item()  # NOQA: PK101\n", true),
            ("x = loss.item()  # NoQa: PK101\n", true),
            ("x = loss.item()  # noqa: PK101\n", true),
            ("x = 1  # perfkit: allow(PK101)\n", true),
            ("q = 'noq' + 'a'  # unique queries\n", false),
            ("noqa = 1\n", true),
            ("qa = 1\n", false),
            (
                "k = perfkit_version  # perfkit allows nothing here\n",
                false,
            ),
            ("#perfkit: allow(PK101)\n", true),
            ("perfkit: int = 1\n", true),
        ] {
            assert_eq!(may_suppress(source), kept, "{source}");
            let found = parse(&file(source));
            let want = usize::from(kept && source.contains('#'));
            assert_eq!(found.len(), want, "{source}");
        }
    }

    #[test]
    fn ruff_and_flake8_file_exemptions_cover_the_whole_file() {
        // As ruff reads them: `# ruff: noqa: CODE` and `# flake8: noqa: CODE` exempt the file.
        for header in [
            "# ruff: noqa: PK101",
            "# flake8: noqa: PK101",
            "#Ruff:NOQA:PK101",
        ] {
            let f = file(&format!("{header}\na()\n\nb()  # noqa: PK102\n"));
            let mut found = parse(&f);
            assert_eq!(found.len(), 2, "{header}");
            assert!(found[0].covers("PK101", 4), "{header}");
            assert!(!found[1].covers("PK102", 2), "{header}");
        }
    }

    #[test]
    fn noqa_covers_its_line_only_and_allow_the_next() {
        let f = file("# perfkit: allow(PK102)\na()\nb()  # noqa: PK101\nc()\n");
        let mut found = parse(&f);
        assert!(found[0].covers("PK102", 2));
        assert!(found[1].covers("PK101", 3));
        assert!(!found[1].covers("PK101", 4));
    }

    #[test]
    fn a_comment_after_a_backslash_continuation_covers_the_whole_statement() {
        let f = file(concat!(
            "a()\n",
            "x = loss \\\n",
            "    .item() \\\r\n",
            "    + 1  # noqa: PK101\n",
            "y = 2  # a comment ending in a backslash \\\n",
            "z = w.item()  # noqa: PK101\n",
        ));
        let mut found = parse(&f);
        assert_eq!((found[0].first_line, found[0].line), (2, 4));
        assert!(found[0].covers("PK101", 2) && found[0].covers("PK101", 3));
        assert!(!found[0].covers("PK101", 1));
        // The backslash of a comment continues nothing.
        assert_eq!((found[1].first_line, found[1].line), (6, 6));
    }
}
