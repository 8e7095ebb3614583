//! The values a formatting macro formats (`println!("{loss}")`, `format!("{} {:?}", a, b)`,
//! `write!(f, "{x}")`), read from the macro's argument text without parsing it: which plain
//! names are formatted, where they are written, and with which trait (`Display` or `Debug`).
//!
//! Only plain names (`loss`, `&loss`, a name captured in the format string) are returned: any
//! other argument is an expression the visitor parses and records on its own (`loss.to_scalar()`
//! is a call, reported as one).

/// How a value is formatted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trait {
    /// `{}`, `{x}`, `{:>8.4}`.
    Display,
    /// `{:?}`, `{:#?}`, `{x:?}`.
    Debug,
}

/// A plain name a formatting macro formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formatted<'t> {
    /// The name.
    pub name: &'t str,
    /// Its byte offset in the argument text (the argument, or the format string for a captured
    /// name).
    pub offset: usize,
    /// The trait it is formatted with.
    pub how: Trait,
}

/// The macros that format their arguments, and how many arguments come before the format string
/// (`write!(f, ..)`: one).
pub fn format_macro(name: &str) -> Option<usize> {
    match name {
        "println" | "print" | "eprintln" | "eprint" | "format" | "format_args" | "panic"
        | "info" | "warn" | "debug" | "trace" | "error" | "bail" | "anyhow" => Some(0),
        "write" | "writeln" | "log" => Some(1),
        _ => None,
    }
}

/// The plain names the macro arguments `text` format, `leading` arguments coming before the
/// format string. Nothing when the arguments are not a format string and values (tracing's
/// `loss = %loss` fields, a format string that is a constant).
pub fn formatted_names(text: &str, leading: usize) -> Vec<Formatted<'_>> {
    let args = split_args(text);
    let mut at = leading;
    // `info!(target: "train", "..")`, log's `log!(target: "x", Level::Info, "..")`.
    if args
        .get(at)
        .is_some_and(|&(s, e)| text[s..e].trim_start().starts_with("target:"))
    {
        at += 1;
    }
    let Some(&(start, end)) = args.get(at) else {
        return Vec::new();
    };
    let raw = &text[start..end];
    let lit = raw.trim_start();
    let lit_start = start + (raw.len() - lit.len());
    let Some(inner) = lit
        .trim_end()
        .strip_prefix('"')
        .and_then(|l| l.strip_suffix('"'))
    else {
        return Vec::new();
    };
    let (positional, named) = values(text, &args[at + 1..]);
    let mut out = Vec::new();
    let mut next = 0;
    for p in placeholders(inner) {
        let (name, offset) = match p.arg {
            Arg::Next | Arg::Index(_) => {
                let i = match p.arg {
                    Arg::Index(i) => i,
                    _ => {
                        next += 1;
                        next - 1
                    }
                };
                match positional.get(i) {
                    Some(&Some(value)) => value,
                    _ => continue,
                }
            }
            Arg::Name(name, at_in_lit) => match named.iter().find(|(n, _)| *n == name) {
                Some(&(_, Some(value))) => value,
                Some((_, None)) => continue,
                // Captured from the scope: written in the format string itself.
                None => (name, lit_start + 1 + at_in_lit),
            },
        };
        if let Some(how) = p.how {
            out.push(Formatted { name, offset, how });
        }
    }
    out
}

enum Arg<'t> {
    Next,
    Index(usize),
    /// A name, and its offset in the format string's contents.
    Name(&'t str, usize),
}

struct Placeholder<'t> {
    arg: Arg<'t>,
    /// `None` for a trait other than `Display` and `Debug` (`{:x}`, `{:e}`, `{:p}`), and for
    /// the precision a `{:.*}` takes.
    how: Option<Trait>,
}

/// The `{..}` placeholders of a format string's contents (`{{` and `}}` are text).
fn placeholders(lit: &str) -> Vec<Placeholder<'_>> {
    let bytes = lit.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'{' if bytes.get(i + 1) == Some(&b'{') => i += 2,
            b'{' => {
                let Some(close) = lit[i + 1..].find('}') else {
                    break;
                };
                let body = &lit[i + 1..i + 1 + close];
                let (arg, spec) = body.split_once(':').unwrap_or((body, ""));
                let arg_text = arg.trim();
                let arg = if arg_text.is_empty() {
                    Arg::Next
                } else if let Ok(n) = arg_text.parse() {
                    Arg::Index(n)
                } else if is_ident(arg_text) {
                    let lead = arg.len() - arg.trim_start().len();
                    Arg::Name(arg_text, i + 1 + lead)
                } else {
                    i += close + 2;
                    continue;
                };
                // `.*` takes the precision from the next positional argument, before the value.
                let precision_first = spec.contains(".*");
                let how = match spec.trim_end().chars().last() {
                    Some('?') => Some(Trait::Debug),
                    Some(c) if c.is_ascii_alphabetic() => None,
                    _ => Some(Trait::Display),
                };
                if precision_first {
                    // The precision is the next positional argument, taken before the value.
                    out.push(Placeholder {
                        arg: Arg::Next,
                        how: None,
                    });
                }
                out.push(Placeholder { arg, how });
                i += close + 2;
            }
            _ => i += 1,
        }
    }
    out
}

type Value<'t> = Option<(&'t str, usize)>;

/// The positional and named values after the format string: a plain name (`loss`, `&loss`) with
/// its offset, `None` for any other expression.
fn values<'t>(
    text: &'t str,
    args: &[(usize, usize)],
) -> (Vec<Value<'t>>, Vec<(&'t str, Value<'t>)>) {
    let mut positional = Vec::new();
    let mut named = Vec::new();
    for &(start, end) in args {
        let arg = &text[start..end];
        let (name, value, value_start) = match named_arg(arg) {
            Some((name, eq)) => (Some(name), &arg[eq + 1..], start + eq + 1),
            None => (None, arg, start),
        };
        let value = plain_name(value).map(|(name, at)| (name, value_start + at));
        match name {
            Some(name) => named.push((name, value)),
            None => positional.push(value),
        }
    }
    (positional, named)
}

/// The name an argument is, when it is one (`loss`, `&loss`, comments around), with its offset.
fn plain_name(arg: &str) -> Option<(&str, usize)> {
    let mut at = skip_blank(arg, 0);
    if arg[at..].starts_with('&') {
        at = skip_blank(arg, at + 1);
    }
    let len = arg[at..]
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(arg.len() - at);
    let name = &arg[at..at + len];
    (is_ident(name) && !is_keyword(name) && skip_blank(arg, at + len) == arg.len())
        .then_some((name, at))
}

/// The offset of the first byte from `at` on that is not white space or in a comment.
fn skip_blank(text: &str, mut at: usize) -> usize {
    let bytes = text.as_bytes();
    while at < bytes.len() {
        if bytes[at].is_ascii_whitespace() {
            at += 1;
        } else if bytes[at] == b'/'
            && let Some(end) = crate::nesting::skip_text(bytes, at)
        {
            // A comment.
            at = end;
        } else {
            break;
        }
    }
    at
}

/// `name = expr` (not `name == expr`): the name and the offset of `=`.
fn named_arg(arg: &str) -> Option<(&str, usize)> {
    let eq = arg.find('=')?;
    let name = arg[..eq].trim();
    (is_ident(name) && arg.as_bytes().get(eq + 1) != Some(&b'=')).then_some((name, eq))
}

fn is_ident(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
        && text != "_"
}

fn is_keyword(text: &str) -> bool {
    matches!(
        text,
        "self" | "Self" | "true" | "false" | "crate" | "super" | "as" | "in" | "mut" | "ref"
    )
}

/// The top-level comma-separated arguments of a macro's argument text, as byte ranges. Brackets
/// nest; string, raw string and character literals are skipped.
fn split_args(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Comments, string, raw string and character literals hold no argument separator.
        if let Some(end) = crate::nesting::skip_text(bytes, i) {
            i = end;
            continue;
        }
        match bytes[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                out.push((start, i));
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    // A trailing comma, or no arguments at all, leaves nothing after the last comma.
    if !text[start..].trim().is_empty() {
        out.push((start, text.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str, leading: usize) -> Vec<(&str, &str, Trait)> {
        formatted_names(text, leading)
            .into_iter()
            .map(|f| (f.name, &text[f.offset..f.offset + f.name.len()], f.how))
            .collect()
    }

    #[test]
    fn positional_named_and_captured_values_are_found_where_they_are_written() {
        let text = r#""{} {loss:.4} {:?} {n}", step, &acc, n = count"#;
        assert_eq!(
            names(text, 0),
            vec![
                ("step", "step", Trait::Display),
                ("loss", "loss", Trait::Display),
                ("acc", "acc", Trait::Debug),
                ("count", "count", Trait::Display),
            ]
        );
    }

    #[test]
    fn expressions_escapes_and_other_traits_are_left_out() {
        // A call is the visitor's (it is parsed and recorded as a call); `{{}}` is text; `{:x}`
        // is `LowerHex`, which a tensor does not implement.
        let text = r#""{{}} {} {:x} {:e}", loss.to_scalar::<f32>()?, bits, small"#;
        assert!(names(text, 0).is_empty());
        // `{:.*}` takes the precision first.
        assert_eq!(
            names(r#""{:.*}", 3, loss"#, 0),
            vec![("loss", "loss", Trait::Display)]
        );
        assert_eq!(names(r#""{0} {0:?}", loss"#, 0).len(), 2);
    }

    #[test]
    fn leading_arguments_targets_and_literals_with_commas() {
        assert_eq!(
            names(r#"f, "{}", loss"#, 1),
            vec![("loss", "loss", Trait::Display)]
        );
        assert_eq!(
            names(r#"target: "train", "{x}, {}", ','"#, 0),
            vec![("x", "x", Trait::Display)]
        );
        assert_eq!(
            names(r#""{}: {}", "a, b", (x, y)"#, 0),
            Vec::<(&str, &str, Trait)>::new()
        );
        // tracing fields and a format string from a constant: nothing.
        assert!(names("loss = %loss, step", 0).is_empty());
        assert!(names("FMT, loss", 0).is_empty());
        assert!(names("", 0).is_empty());
        assert!(names(r#""{}", "#, 0).is_empty());
        // Comments between the arguments.
        assert_eq!(
            names(
                "\"{}\", // the loss, a tensor\n &loss /* a, b */ // expect\n",
                0
            ),
            vec![("loss", "loss", Trait::Display)]
        );
    }
}
