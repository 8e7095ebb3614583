//! `perfkit rules` (the catalog) and `perfkit rule CODE` (one rule's documentation).
//!
//! The catalog is one list: the lint rules (static, `perfkit lint`) and the runtime rules (measured by
//! `perfkit profile`). A code that both know (PK101, PK102, ...) is one entry of kind `both`.

use std::io::{BufWriter, Write};
use std::process::ExitCode;

use perfkit_lint::rules::RuleMeta;
use perfkit_reports::rules::RuntimeRule;
use serde::Serialize;

/// Arguments of `perfkit rules`.
#[derive(Debug, clap::Args)]
pub struct RulesArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = RulesFormat::Text)]
    format: RulesFormat,
}

/// `perfkit rules --format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RulesFormat {
    /// an aligned table
    Text,
    /// a JSON array with one object per rule
    Json,
}

/// Arguments of `perfkit rule`.
#[derive(Debug, clap::Args)]
pub struct RuleArgs {
    /// The rule's code, e.g. PK101 (case-insensitive).
    #[arg(value_name = "CODE")]
    code: String,
}

/// Which half of perfkit knows a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    /// `perfkit lint` only.
    Lint,
    /// `perfkit profile` only.
    Profile,
    /// Both: found in the source and measured in a run.
    Both,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Lint => "lint",
            Kind::Profile => "profile",
            Kind::Both => "both",
        }
    }
}

/// One code of the catalog.
struct Entry {
    lint: Option<&'static RuleMeta>,
    runtime: Option<&'static RuntimeRule>,
}

impl Entry {
    fn code(&self) -> &'static str {
        self.lint
            .map(|m| m.code)
            .or(self.runtime.map(|r| r.code))
            .unwrap_or_default()
    }

    fn name(&self) -> &'static str {
        self.lint
            .map(|m| m.name)
            .or(self.runtime.map(|r| r.name))
            .unwrap_or_default()
    }

    fn kind(&self) -> Kind {
        match (self.lint, self.runtime) {
            (Some(_), Some(_)) => Kind::Both,
            (None, Some(_)) => Kind::Profile,
            _ => Kind::Lint,
        }
    }

    /// The lint's default severity where the lint knows the rule, else the runtime one.
    fn default_severity(&self) -> &'static str {
        match (self.lint, self.runtime) {
            (Some(meta), _) => meta.default_severity.as_str(),
            (None, Some(rule)) => rule.severity.as_str(),
            (None, None) => "",
        }
    }

    fn fixable(&self) -> bool {
        self.lint.is_some_and(|meta| meta.fixable)
    }

    fn summary(&self) -> String {
        match (self.lint, self.runtime) {
            (Some(meta), _) => meta.summary.to_string(),
            (None, Some(rule)) => rule.summary(),
            (None, None) => String::new(),
        }
    }

    /// The full documentation: the lint rule's, then what `perfkit profile` measures.
    fn doc(&self) -> String {
        let mut doc = String::new();
        if let Some(meta) = self.lint {
            doc.push_str(meta.doc.trim_end());
        }
        if let Some(rule) = self.runtime {
            let runtime = rule.doc();
            if self.lint.is_some() {
                doc.push_str("\n\n## Measured by `perfkit profile`\n");
                doc.push_str(&demote_headings(runtime.trim()));
            } else {
                doc.push_str(runtime.trim());
            }
        }
        doc
    }
}

/// `## Heading` -> `### Heading`, so that a section fits under another `##` heading.
fn demote_headings(doc: &str) -> String {
    doc.lines()
        .map(|line| {
            if line.starts_with('#') {
                format!("#{line}")
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The whole catalog, by code.
fn catalog() -> Vec<Entry> {
    let mut entries: Vec<Entry> = perfkit_lint::rules()
        .iter()
        .map(|rule| Entry {
            lint: Some(rule.meta()),
            runtime: None,
        })
        .collect();
    for rule in &perfkit_reports::rules::RULES {
        match entries.iter_mut().find(|entry| entry.code() == rule.code) {
            Some(entry) => entry.runtime = Some(rule),
            None => entries.push(Entry {
                lint: None,
                runtime: Some(rule),
            }),
        }
    }
    entries.sort_by_key(|entry| entry.code());
    entries
}

#[derive(Serialize)]
struct RuleJson<'a> {
    code: &'a str,
    name: &'a str,
    kind: Kind,
    default_severity: &'a str,
    fixable: bool,
    summary: String,
    doc: String,
}

/// Runs `perfkit rules`.
pub fn run_rules(args: RulesArgs) -> anyhow::Result<ExitCode> {
    let entries = catalog();
    let mut out = BufWriter::new(std::io::stdout().lock());
    match args.format {
        RulesFormat::Text => write_table(&mut out, &entries)?,
        RulesFormat::Json => {
            let list: Vec<RuleJson<'_>> = entries
                .iter()
                .map(|entry| RuleJson {
                    code: entry.code(),
                    name: entry.name(),
                    kind: entry.kind(),
                    default_severity: entry.default_severity(),
                    fixable: entry.fixable(),
                    summary: entry.summary(),
                    doc: entry.doc(),
                })
                .collect();
            serde_json::to_writer_pretty(&mut out, &list).map_err(std::io::Error::from)?;
            writeln!(out)?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn write_table(out: &mut impl Write, entries: &[Entry]) -> std::io::Result<()> {
    let name_width = entries
        .iter()
        .map(|e| e.name().len())
        .max()
        .unwrap_or(0)
        .max("NAME".len());
    let code_width = entries
        .iter()
        .map(|e| e.code().len())
        .max()
        .unwrap_or(0)
        .max("CODE".len());
    writeln!(
        out,
        "{:code_width$}  {:name_width$}  {:7}  {:8}  {:3}  SUMMARY",
        "CODE", "NAME", "KIND", "DEFAULT", "FIX"
    )?;
    for entry in entries {
        writeln!(
            out,
            "{:code_width$}  {:name_width$}  {:7}  {:8}  {:3}  {}",
            entry.code(),
            entry.name(),
            entry.kind().as_str(),
            entry.default_severity(),
            if entry.fixable() { "yes" } else { "" },
            entry.summary(),
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "KIND: lint = found by `perfkit lint`, profile = measured by `perfkit profile`, both = both.\n\
         `perfkit rule CODE` prints a rule's documentation."
    )
}

/// Runs `perfkit rule CODE`.
pub fn run_rule(args: RuleArgs) -> anyhow::Result<ExitCode> {
    let code = args.code.trim();
    let Some(entry) = catalog()
        .into_iter()
        .find(|entry| entry.code().eq_ignore_ascii_case(code))
    else {
        anyhow::bail!(
            "unknown rule code `{}`; `perfkit rules` lists the catalog",
            args.code
        );
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    let kind = match entry.kind() {
        Kind::Lint => "lint",
        Kind::Profile => "profile only",
        Kind::Both => "lint and profile",
    };
    writeln!(
        out,
        "{} {} ({kind}; default: {}{})\n",
        entry.code(),
        entry.name(),
        entry.default_severity(),
        if entry.fixable() {
            ", fixable with `perfkit lint --fix`"
        } else {
            ""
        }
    )?;
    writeln!(out, "{}", entry.doc())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
