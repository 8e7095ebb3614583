//! Suppression comments: `// perfkit: allow(PK101)` at the end of the offending line or on the line
//! above, `// perfkit: allow-file(PK101)` anywhere in the file. Several codes: `allow(PK101, PK202)`.

/// One suppression comment.
#[derive(Debug, Clone)]
pub(crate) struct Suppression {
    /// 1-based line of the comment.
    pub line: usize,
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
        let line_matches =
            self.file_wide || line == self.line || (self.own_line && line == self.line + 1);
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
    for (index, line) in source.lines().enumerate() {
        let Some(comment_at) = line.find("//") else {
            continue;
        };
        let comment = &line[comment_at + 2..];
        let comment = comment.trim_start_matches(['/', '!']).trim_start();
        let Some(rest) = comment.strip_prefix("perfkit:") else {
            continue;
        };
        let rest = rest.trim_start();
        let (file_wide, rest) = if let Some(r) = rest.strip_prefix("allow-file") {
            (true, r)
        } else if let Some(r) = rest.strip_prefix("allow") {
            (false, r)
        } else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix('(') else {
            continue;
        };
        let Some(close) = rest.find(')') else {
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

#[cfg(test)]
mod tests {
    use super::parse;

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
