//! Suppression comments: `// perfkit: allow(PK101)` at the end of the offending line or on the line
//! above, `// perfkit: allow-file(PK101)` anywhere in the file. Several codes: `allow(PK101, PK202)`.
//!
//! Only comments count: text inside a string, byte string, raw string or character literal
//! never suppresses anything. The literals are found by the tokenizer (`proc_macro2`), not by
//! searching the text.

use std::ops::Range;

/// One suppression comment.
#[derive(Debug, Clone)]
pub(crate) struct Suppression {
    /// 1-based line of the comment.
    pub line: usize,
    /// The first line of the logical line the comment ends (a Python statement continued with
    /// `\` over several lines, which ruff's `# noqa` covers whole); `line` elsewhere.
    pub first_line: usize,
    /// 1-based column where `perfkit:` starts.
    pub column: usize,
    /// Column just after the comment's closing parenthesis.
    pub end_column: usize,
    /// Whole file (`allow-file`) or a line.
    pub file_wide: bool,
    /// The codes, upper case.
    pub codes: Vec<String>,
    /// Whether the comment stands alone on its line (then it covers the next line).
    pub own_line: bool,
    /// Per code: did it suppress anything.
    pub used: Vec<bool>,
}

impl Suppression {
    /// Whether this suppression covers a finding of `code` on `line`; marks it used.
    pub(crate) fn covers(&mut self, code: &str, line: usize) -> bool {
        let line_matches = self.file_wide
            || (self.first_line..=self.line).contains(&line)
            || (self.own_line && line == self.line + 1);
        if !line_matches {
            return false;
        }
        let mut hit = false;
        for (i, c) in self.codes.iter().enumerate() {
            if c == code {
                self.used[i] = true;
                hit = true;
            }
        }
        hit
    }
}

/// Finds the suppression comments of a file. Cheap when there are none.
pub(crate) fn parse(source: &str) -> Vec<Suppression> {
    let mut out = Vec::new();
    // Most files have none: one vectorized substring search decides.
    if memchr::memmem::find(source.as_bytes(), b"perfkit:").is_none() {
        return out;
    }
    let Some(literals) = literal_ranges(source) else {
        // A file that does not tokenize is not linted: nothing to suppress.
        return out;
    };
    let mut line_start = 0;
    for (index, raw_line) in source.split_inclusive('\n').enumerate() {
        let offset = line_start;
        line_start += raw_line.len();
        let line = raw_line.trim_end_matches('\n').trim_end_matches('\r');
        // The first `//` outside every literal starts the comment.
        let Some(comment_at) = line
            .match_indices("//")
            .map(|(at, _)| at)
            .find(|at| !inside(&literals, offset + at))
        else {
            continue;
        };
        let comment = &line[comment_at + 2..];
        let comment = comment.trim_start_matches(['/', '!']).trim_start();
        let Some(rest) = comment.strip_prefix("perfkit:") else {
            continue;
        };
        let Some((file_wide, rest, close)) = allow_list(rest) else {
            continue;
        };
        let codes: Vec<String> = rest[..close]
            .split(',')
            .map(|c| c.trim().to_ascii_uppercase())
            .filter(|c| !c.is_empty())
            .collect();
        if codes.is_empty() {
            continue;
        }
        let start = line[..comment_at].chars().count() + 1;
        let consumed = line.len() - rest.len() + close + 1;
        let end_column = line[..consumed.min(line.len())].chars().count() + 1;
        out.push(Suppression {
            line: index + 1,
            first_line: index + 1,
            column: start,
            end_column,
            file_wide,
            used: vec![false; codes.len()],
            codes,
            own_line: line[..comment_at].trim().is_empty(),
        });
    }
    out
}

/// Reads what follows `perfkit:` in a comment: `allow(..)` or `allow-file(..)`. Returns whether
/// it is file-wide, the text after the opening parenthesis and the offset of the closing one in
/// that text; None when the comment is not an allow list.
pub(crate) fn allow_list(after_prefix: &str) -> Option<(bool, &str, usize)> {
    let rest = after_prefix.trim_start();
    let (file_wide, rest) = if let Some(r) = rest.strip_prefix("allow-file") {
        (true, r)
    } else {
        (false, rest.strip_prefix("allow")?)
    };
    let rest = rest.trim_start().strip_prefix('(')?;
    let close = rest.find(')')?;
    Some((file_wide, rest, close))
}

/// The byte ranges of the file's string, byte string and character literals, in order; `None`
/// when the file does not tokenize. Doc comments, which the tokenizer hands over as `doc`
/// attributes whose literal spans the comment, are comments and not listed.
fn literal_ranges(source: &str) -> Option<Vec<Range<usize>>> {
    let prefix = crate::analysis::skipped_prefix_len(source);
    let tokens: proc_macro2::TokenStream = source[prefix..].parse().ok()?;
    let mut out = Vec::new();
    collect_literals(tokens, source, prefix, &mut out);
    out.sort_by_key(|r| r.start);
    Some(out)
}

fn collect_literals(
    tokens: proc_macro2::TokenStream,
    source: &str,
    prefix: usize,
    out: &mut Vec<Range<usize>>,
) {
    for token in tokens {
        match token {
            proc_macro2::TokenTree::Group(group) => {
                collect_literals(group.stream(), source, prefix, out);
            }
            proc_macro2::TokenTree::Literal(literal) => {
                let range = literal.span().byte_range();
                let range = range.start + prefix..range.end + prefix;
                let is_comment = source
                    .get(range.clone())
                    .is_some_and(|t| t.starts_with('/'));
                if !is_comment {
                    out.push(range);
                }
            }
            proc_macro2::TokenTree::Ident(_) | proc_macro2::TokenTree::Punct(_) => {}
        }
    }
}

/// Whether byte `at` lies inside one of the sorted, disjoint `ranges`.
fn inside(ranges: &[Range<usize>], at: usize) -> bool {
    let i = ranges.partition_point(|r| r.end <= at);
    ranges.get(i).is_some_and(|r| r.start <= at)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn text_inside_literals_is_not_a_comment() {
        let source = concat!(
            "const A: &str = \"x // perfkit: allow-file(PK101) y\";\n",
            "const B: &str = r#\"\n// perfkit: allow(PK102)\n\"#;\n",
            "const C: &[u8] = b\"// perfkit: allow(PK201)\";\n",
            "let s = \"//\"; // perfkit: allow(PK303)\n",
            "/// perfkit: allow(PK401)\n",
            "fn f() {}\n",
        );
        let found = parse(source);
        let codes: Vec<&str> = found.iter().map(|s| s.codes[0].as_str()).collect();
        assert_eq!(codes, ["PK303", "PK401"]);
        assert_eq!((found[0].line, found[0].column), (6, 15));
    }

    #[test]
    fn finds_line_and_file_suppressions() {
        let source = "let a = 1; // perfkit: allow(PK101, pk202)\n// perfkit: allow-file(PK303)\n  // perfkit: allow(PK102)\nlet b = 2; // perfkit allow(PK101)\n";
        let found = parse(source);
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].codes, vec!["PK101", "PK202"]);
        assert_eq!(
            (found[0].line, found[0].column, found[0].own_line),
            (1, 12, false)
        );
        assert_eq!(found[0].end_column, 43);
        assert!(found[1].file_wide);
        assert!(found[2].own_line);
    }

    #[test]
    fn a_comment_covers_its_line_and_an_own_line_comment_the_next() {
        let mut found = parse("x(); // perfkit: allow(PK101)\n// perfkit: allow(PK102)\ny();\n");
        assert!(found[0].covers("PK101", 1));
        assert!(!found[0].covers("PK101", 2));
        assert!(!found[0].covers("PK102", 1));
        assert!(found[1].covers("PK102", 3));
        assert!(found[0].used[0] && found[1].used[0]);
    }
}
