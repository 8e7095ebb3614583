//! A linear pre-check of how deep syn would recurse on a Rust file, before it is parsed.
//!
//! syn parses by recursive descent: besides brackets (counted by the bracket pre-check), it goes
//! one level deeper for each generic argument (`Vec<Vec<..>>`), pointer or reference type, closure,
//! `return`, assignment or unary operator, none of which has a bracket to count. A generated file of
//! 60,000 `Vec<` overflows even the workers' large stacks, and a stack overflow aborts the whole
//! process, losing every other file's findings.
//!
//! The bound used: the tokens since the last `,` `;` `{` or `}` of the same bracket group, plus
//! those before each enclosing group was opened (a group's content is nested inside what came
//! before it). A recursive-descent parser cannot be deeper than that count at any token. Comments,
//! string, character and raw string literals are skipped (a long base64 string is one token);
//! attributes do not add to what follows them. Real code stays far below the limit: a statement or
//! a list element of thousands of tokens with no separator is generated code.

/// Most tokens of one nest (see the module documentation); about half the depth at which syn's
/// deepest frames (generic types) overflow a worker's stack in an unoptimised build.
pub(crate) const MAX_NEST_TOKENS: usize = 8192;

/// The line (1-based) of the first token past [`MAX_NEST_TOKENS`], if any.
pub(crate) fn too_deep_line(source: &str) -> Option<usize> {
    let bytes = source.as_bytes();
    let at = too_deep_offset(bytes)?;
    Some(crate::diagnostic::line_at_offset(bytes, at))
}

/// Byte classes: a byte of a word (identifier, keyword or number; any non-ASCII byte too, as it
/// lies in an identifier, a literal or a comment), a blank, or anything else.
const WORD: u8 = 1;
const BLANK: u8 = 2;
static CLASS: [u8; 256] = {
    let mut class = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80 {
            class[b] = WORD;
        } else if matches!(c, b' ' | b'\t' | b'\r' | b'\n') {
            class[b] = BLANK;
        }
        b += 1;
    }
    class
};

fn is_word(b: u8) -> bool {
    CLASS[b as usize] == WORD
}

/// The byte offset of the first token past [`MAX_NEST_TOKENS`]. Runs over every byte of every
/// file: words and blanks are skipped in tight loops, comments and strings with `memchr`.
fn too_deep_offset(bytes: &[u8]) -> Option<usize> {
    // Per open group: the count outside it when it was opened, and whether it is an attribute's
    // brackets (after which the count goes back to what it was before the `#`).
    let mut stack: Vec<(usize, usize, bool)> = Vec::new();
    let mut base = 0usize;
    let mut run = 0usize;
    let mut before_attr: Option<usize> = None;
    let len = bytes.len();
    let mut i = 0usize;
    while i < len {
        let b = bytes[i];
        let start = i;
        i += 1;
        match CLASS[b as usize] {
            BLANK => {
                while i < len && CLASS[bytes[i] as usize] == BLANK {
                    i += 1;
                }
                continue;
            }
            WORD => {
                while i < len && is_word(bytes[i]) {
                    i += 1;
                }
                before_attr = None;
                run += 1;
                if base + run > MAX_NEST_TOKENS {
                    return Some(start);
                }
                continue;
            }
            _ => {}
        }
        match b {
            b'/' if bytes.get(i) == Some(&b'/') => {
                i = memchr::memchr(b'\n', &bytes[i..]).map_or(len, |n| i + n);
                continue;
            }
            b'/' if bytes.get(i) == Some(&b'*') => {
                i = skip_block_comment(bytes, start);
                continue;
            }
            b'"' => {
                i = skip_string(bytes, i, raw_hashes(bytes, start));
                run += 1;
            }
            b'\'' => match char_literal_end(bytes, start) {
                Some(end) => {
                    i = end;
                    run += 1;
                }
                // A lifetime or label: its name follows as a word.
                None => continue,
            },
            b'#' => {
                before_attr.get_or_insert(run);
                continue;
            }
            b'!' if before_attr.is_some() => continue,
            b'(' | b'[' | b'{' => {
                let attr = b == b'[' && before_attr.is_some();
                let outside = if attr {
                    before_attr.take().unwrap_or(run)
                } else {
                    before_attr = None;
                    run
                };
                stack.push((base, outside, attr));
                base += outside + 1;
                run = 0;
            }
            b')' | b']' | b'}' => {
                before_attr = None;
                if let Some((outer_base, outside, attr)) = stack.pop() {
                    base = outer_base;
                    run = match (b, attr) {
                        // A block ends what came before it (`fn f() {}`, `if c {} else {}`).
                        (b'}', _) => 0,
                        // An attribute adds nothing to what follows it.
                        (_, true) => outside,
                        _ => outside + 1,
                    };
                }
            }
            b',' | b';' => {
                before_attr = None;
                run = 0;
            }
            _ => {
                before_attr = None;
                run += 1;
            }
        }
        if base + run > MAX_NEST_TOKENS {
            return Some(start);
        }
    }
    None
}

/// The byte offset of the first bracket deeper than `limit`, counting only brackets of code:
/// those in comments, string, raw string and character literals are text (a `"((((.."` literal,
/// a `// ((((` comment, `'{'`). The exact check behind the bracket counter's fast pass.
pub(crate) fn code_bracket_too_deep(bytes: &[u8], limit: usize) -> Option<usize> {
    let len = bytes.len();
    let mut depth = 0usize;
    let mut i = 0usize;
    while i < len {
        let start = i;
        if let Some(end) = skip_text(bytes, start) {
            i = end;
            continue;
        }
        let b = bytes[i];
        i += 1;
        match b {
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(start);
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// Where a comment, or a string, raw string or character literal, that starts at `at` ends (the
/// index after it); `None` when none starts there (a lifetime is no literal).
pub(crate) fn skip_text(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes[at] {
        b'/' if bytes.get(at + 1) == Some(&b'/') => {
            Some(memchr::memchr(b'\n', &bytes[at..]).map_or(bytes.len(), |n| at + n))
        }
        b'/' if bytes.get(at + 1) == Some(&b'*') => Some(skip_block_comment(bytes, at)),
        b'"' => Some(skip_string(bytes, at + 1, raw_hashes(bytes, at))),
        b'\'' => char_literal_end(bytes, at),
        _ => None,
    }
}

/// The number of `#` of a raw string whose `"` is at `quote` (`r#"..."#`, `br"..."`), or `None`
/// for a plain string.
fn raw_hashes(bytes: &[u8], quote: usize) -> Option<usize> {
    let mut at = quote;
    while at > 0 && bytes[at - 1] == b'#' {
        at -= 1;
    }
    let hashes = quote - at;
    let r = at.checked_sub(1)?;
    if bytes[r] != b'r' {
        return None;
    }
    // `r` starts the token, alone or after `b`/`c` (`br"..."`, `cr"..."`).
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80;
    let starts = match r.checked_sub(1).map(|p| bytes[p]) {
        None => true,
        Some(b'b' | b'c') => r < 2 || !word(bytes[r - 2]),
        Some(p) => !word(p),
    };
    starts.then_some(hashes)
}

/// Skips a string from just after its opening quote: the index after its end.
fn skip_string(bytes: &[u8], mut i: usize, raw: Option<usize>) -> usize {
    let len = bytes.len();
    loop {
        let next = match raw {
            Some(_) => memchr::memchr(b'"', &bytes[i..]),
            None => memchr::memchr2(b'"', b'\\', &bytes[i..]),
        };
        let Some(n) = next else {
            return len;
        };
        i += n;
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        let end = i + 1 + raw.unwrap_or(0);
        if bytes
            .get(i + 1..end)
            .is_some_and(|h| h.iter().all(|&b| b == b'#'))
        {
            return end;
        }
        i += 1;
    }
}

/// Skips a (nested) block comment starting at `i`: the index after it.
fn skip_block_comment(bytes: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'/', Some(b'*')) => {
                depth += 1;
                i += 2;
            }
            (b'*', Some(b'/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The index after a character literal starting at `quote` (`'a'`, `'\n'`, `'\u{1F600}'`, `'日'`),
/// or `None` for a lifetime or label (`'a`, `'outer:`).
fn char_literal_end(bytes: &[u8], quote: usize) -> Option<usize> {
    let next = *bytes.get(quote + 1)?;
    if next == b'\\' {
        // An escape: the literal ends at the next quote after the escaped character.
        let from = quote + 3;
        return memchr::memchr(b'\'', bytes.get(from..)?).map(|n| from + n + 1);
    }
    let len = match next {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    };
    (bytes.get(quote + 1 + len) == Some(&b'\'')).then_some(quote + 2 + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_forms_past_the_limit_are_found_on_their_line() {
        let n = MAX_NEST_TOKENS;
        for deep in [
            format!("type A = {}u8{};", "Vec<".repeat(n), ">".repeat(n)),
            format!("fn f() {{ {}1; }}", "- ".repeat(n + 1)),
            format!("fn f() {{ {}1; }}", "return ".repeat(n + 1)),
            // The content of a group is nested inside what came before it, commas or not.
            format!(
                "fn f() {{ {} }}",
                format!("{}(a, ", "-".repeat(n / 4)).repeat(5)
            ),
        ] {
            assert_eq!(too_deep_line(&format!("// x\n\n{deep}\n")), Some(3));
        }
    }

    #[test]
    fn real_code_of_any_length_stays_below() {
        let n = MAX_NEST_TOKENS;
        let words = "a b c d e f g h ".repeat(n);
        for ok in [
            // Separators end a nest: a long list, many statements, many items.
            format!("const X: [u8; {n}] = [{}];", "1, ".repeat(2 * n)),
            "fn f() { let a = b + c; }\n".repeat(2 * n),
            // Comments, strings and attributes count as nothing or one token.
            format!("// {words}\n/* {words} /* nested */ {words} */ fn f() {{}}"),
            format!("const S: &str = \"{words} \\\" {words}\";"),
            format!("const S: &str = r#\"{words} \" {words}\"#;"),
            format!("const S: &[u8] = br##\"{words} \"# {words}\"##;"),
            format!("{}fn f() {{}}", "#[doc = \"a b c\"]\n".repeat(2 * n)),
            format!("#![doc = \"x\"]\n{}fn f() {{}}", "#[inline] ".repeat(2 * n)),
            // Lifetimes and character literals.
            format!(
                "fn f<'a>(x: &'a str) -> char {{ {}'\\'' }}",
                "'a'; '日'; ".repeat(n)
            ),
        ] {
            assert_eq!(too_deep_line(&ok), None, "{}", &ok[..80.min(ok.len())]);
        }
    }

    #[test]
    fn lines_inside_skipped_text_are_counted() {
        let deep = "-".repeat(MAX_NEST_TOKENS + 1);
        let text = format!("/* a\nb */ \"c\nd\" r\"e\nf\" '\\n'\n{deep}");
        assert_eq!(too_deep_line(&text), Some(5));
    }
}
