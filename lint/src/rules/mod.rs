//! The rule catalog: the [`Rule`] trait, rule metadata, the [`declare_rule!`](crate::declare_rule) macro and the registry.
//!
//! Each rule lives in its own file. Its doc comment is its user documentation (`## What it does`,
//! `## Why is this bad?`, `## Example`, `Use instead:`), captured at compile time by [`declare_rule!`](crate::declare_rule).

use std::sync::LazyLock;

use crate::analysis::{CrateContext, FileId};
use crate::diagnostic::{Fix, Region, Severity};
use crate::python::{PyContext, PyHit};

mod pk101;
mod pk102;
mod pk104;
mod pk105;
mod pk201;
mod pk202;
mod pk203;
mod pk301;
mod pk302;
mod pk303;
mod pk401;
mod pk402;
mod pk403;
mod pk501;
mod pk502;
mod pk503;

/// Static description of a rule: what `perfkit rules` lists and what SARIF describes.
#[derive(Debug)]
pub struct RuleMeta {
    /// The rule code, e.g. `PK101`. Codes never change meaning once published.
    pub code: &'static str,
    /// The kebab-case rule name, e.g. `host-readback-in-step-loop`.
    pub name: &'static str,
    /// Severity used unless the configuration overrides it.
    pub default_severity: Severity,
    /// One line: the first sentence of the "What it does" section.
    pub summary: &'static str,
    /// The full Markdown documentation (the rule's doc comment).
    pub doc: &'static str,
    /// Whether the rule offers machine-applicable fixes.
    pub fixable: bool,
}

impl RuleMeta {
    /// Builds the metadata from the raw doc comment lines, as [`declare_rule!`] captures them.
    /// The doc text is computed once and lives for the whole program.
    #[doc(hidden)]
    pub fn from_raw(
        code: &'static str,
        name: &'static str,
        default_severity: Severity,
        fixable: bool,
        raw_doc: &'static str,
    ) -> RuleMeta {
        let doc = dedent_doc(raw_doc);
        let summary = first_sentence_of_what_it_does(&doc);
        RuleMeta {
            code,
            name,
            default_severity,
            summary: Box::leak(summary.into_boxed_str()),
            doc: Box::leak(doc.into_boxed_str()),
            fixable,
        }
    }
}

/// Removes the single leading space that `///` comments carry and trims surrounding blank lines.
fn dedent_doc(raw: &str) -> String {
    let lines: Vec<&str> = raw
        .lines()
        .map(|line| line.strip_prefix(' ').unwrap_or(line))
        .collect();
    let text = lines.join("\n");
    text.trim_matches('\n').to_string()
}

/// The first sentence of the `## What it does` section (or of the whole doc if it has no such section).
fn first_sentence_of_what_it_does(doc: &str) -> String {
    let body = match doc.find("## What it does") {
        Some(at) => &doc[at + "## What it does".len()..],
        None => doc,
    };
    let paragraph: Vec<&str> = body
        .lines()
        .map(str::trim)
        .skip_while(|line| line.is_empty())
        .take_while(|line| !line.is_empty() && !line.starts_with('#'))
        .collect();
    let paragraph = paragraph.join(" ");
    // A sentence ends at ". " or at the end of the paragraph; dots inside `code` do not count.
    let mut in_code = false;
    let bytes = paragraph.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'`' => in_code = !in_code,
            b'.' if !in_code && (i + 1 == bytes.len() || bytes[i + 1] == b' ') => {
                return paragraph[..=i].to_string();
            }
            _ => {}
        }
    }
    paragraph
}

/// A lint rule. Rules are stateless: `check` looks at one crate and pushes [`Finding`]s.
pub trait Rule: Send + Sync {
    /// The rule's static description.
    fn meta(&self) -> &'static RuleMeta;
    /// Looks at one crate and pushes what it finds.
    fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>);
    /// Looks at one Python package and pushes what it finds (the rule's Python form). Default: the
    /// rule has no Python form.
    fn check_python(&self, cx: &PyContext<'_>, out: &mut Vec<Finding>) {
        let _ = (cx, out);
    }
}

/// What a rule reports. The engine turns it into a [`crate::Diagnostic`]: it adds the code, name, path
/// and severity (from the configuration, or `note` when the finding is [`Finding::lowered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The file of the crate the finding is in.
    pub file: FileId,
    /// Where: usually the method name or path of the offending call (see [`CrateContext::region`]).
    pub region: Region,
    /// What is wrong: lowercase, no final period.
    pub message: String,
    /// What to do instead.
    pub help: String,
    /// Extra context, e.g. "called from the step loop at src/train.rs:42".
    pub notes: Vec<String>,
    /// A machine-applicable fix, if the rule has one.
    pub fix: Option<Fix>,
    /// True when the finding runs less often than once per step (outer loop, `% N == 0` guard):
    /// the engine reports it as a note whatever the configured severity.
    pub lowered: bool,
}

impl Finding {
    /// A finding at `region` of `file`.
    pub fn new(
        file: FileId,
        region: Region,
        message: impl Into<String>,
        help: impl Into<String>,
    ) -> Finding {
        Finding {
            file,
            region,
            message: message.into(),
            help: help.into(),
            notes: Vec::new(),
            fix: None,
            lowered: false,
        }
    }

    /// Adds a note.
    #[must_use]
    pub fn with_note(mut self, note: impl Into<String>) -> Finding {
        self.notes.push(note.into());
        self
    }

    /// Attaches a fix.
    #[must_use]
    pub fn with_fix(mut self, fix: Fix) -> Finding {
        self.fix = Some(fix);
        self
    }

    /// Adds what a Python [`PyHit`] says: the notes naming the loop, and the lowering to note.
    #[must_use]
    pub fn in_py_step_loop(mut self, cx: &PyContext<'_>, hit: &PyHit) -> Finding {
        self.notes.extend(cx.notes(hit));
        if !hit.is_per_step() {
            self.lowered = true;
        }
        self
    }

    /// Adds what a [`crate::analysis::StepHit`] says: the notes naming the loop (and call chain), and
    /// the lowering to note when the code does not run on every step.
    #[must_use]
    pub fn in_step_loop(
        mut self,
        cx: &CrateContext<'_>,
        hit: &crate::analysis::StepHit,
    ) -> Finding {
        self.notes.extend(hit.notes(cx));
        if !hit.is_per_step() {
            self.lowered = true;
        }
        self
    }
}

/// Declares a rule struct whose doc comment becomes its documentation.
///
/// ```ignore
/// declare_rule! {
///     /// ## What it does
///     /// ...
///     pub HostReadbackInStepLoop {
///         code: "PK101",
///         name: "host-readback-in-step-loop",
///         severity: Warning,
///         fixable: false,
///     }
/// }
/// impl Rule for HostReadbackInStepLoop {
///     fn meta(&self) -> &'static RuleMeta { Self::meta_static() }
///     fn check(&self, cx: &CrateContext<'_>, out: &mut Vec<Finding>) { ... }
/// }
/// ```
#[macro_export]
macro_rules! declare_rule {
    (
        $(#[doc = $doc:literal])*
        $vis:vis $name:ident {
            code: $code:literal,
            name: $rule_name:literal,
            severity: $severity:ident,
            fixable: $fixable:literal $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, Default)]
        $vis struct $name;

        impl $name {
            /// The rule's metadata, built once from its doc comment.
            pub fn meta_static() -> &'static $crate::rules::RuleMeta {
                static META: ::std::sync::LazyLock<$crate::rules::RuleMeta> =
                    ::std::sync::LazyLock::new(|| {
                        $crate::rules::RuleMeta::from_raw(
                            $code,
                            $rule_name,
                            $crate::diagnostic::Severity::$severity,
                            $fixable,
                            concat!($($doc, "\n"),*),
                        )
                    });
                &META
            }
        }
    };
}

/// The linter's own notes (unused suppressions). Not a real rule: it never runs, but it is documented
/// in the catalog so `perfkit rule PK000` explains it.
pub mod pk000 {
    use super::{CrateContext, Finding, Rule, RuleMeta};

    crate::declare_rule! {
        /// ## What it does
        /// Reports a `// perfkit: allow(CODE)` or `// perfkit: allow-file(CODE)` comment that suppresses
        /// nothing.
        ///
        /// ## Why is this bad?
        /// A suppression that no longer matches a finding hides nothing but still tells readers that the
        /// line is special. It usually stays behind after the code it excused was fixed or moved.
        ///
        /// ## Example
        /// ```rust,ignore
        /// let lr = 1e-3; // perfkit: allow(PK101)
        /// ```
        ///
        /// Use instead:
        /// ```rust,ignore
        /// let lr = 1e-3;
        /// ```
        pub UnusedSuppression {
            code: "PK000",
            name: "unused-suppression",
            severity: Note,
            fixable: false,
        }
    }

    impl Rule for UnusedSuppression {
        fn meta(&self) -> &'static RuleMeta {
            Self::meta_static()
        }

        fn check(&self, _cx: &CrateContext<'_>, _out: &mut Vec<Finding>) {
            // Produced by the engine from the suppression comments, not by looking at code.
        }
    }
}

/// Every rule, in code order (PK000 first).
static RULES: LazyLock<Vec<&'static dyn Rule>> = LazyLock::new(|| {
    let mut rules: Vec<&'static dyn Rule> = vec![
        &pk000::UnusedSuppression,
        &pk101::HostReadbackInStepLoop,
        &pk102::SyncInStepLoop,
        &pk104::EmptyCacheInStepLoop,
        &pk105::GraphKeptAcrossSteps,
        &pk201::CpuTensorThenCopy,
        &pk202::AllocInStepLoop,
        &pk203::PerSampleUpload,
        &pk301::LoaderWithoutWorkers,
        &pk302::LoaderDefaultBatchSize,
        &pk303::PageableUploadInStepLoop,
        &pk401::HardcodedCudaDevice,
        &pk402::VisibleDevicesAfterCudaInit,
        &pk403::CheckpointLoadWithoutDevice,
        &pk501::FullPrecisionTraining,
        &pk502::SmallBatchSize,
        &pk503::MultiDeviceInsteadOfDdp,
    ];
    rules.sort_by_key(|rule| rule.meta().code);
    rules
});

/// The rule catalog, in code order.
pub fn rules() -> &'static [&'static dyn Rule] {
    &RULES
}

/// Looks a rule up by code, case-insensitively.
pub fn rule_by_code(code: &str) -> Option<&'static dyn Rule> {
    rules()
        .iter()
        .copied()
        .find(|rule| rule.meta().code.eq_ignore_ascii_case(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_the_first_sentence_of_what_it_does() {
        let doc = dedent_doc(
            " ## What it does\n Flags `a.b()` calls. More text.\n\n ## Why is this bad?\n x\n",
        );
        assert!(doc.starts_with("## What it does\nFlags"));
        assert_eq!(first_sentence_of_what_it_does(&doc), "Flags `a.b()` calls.");
    }

    #[test]
    fn lookup_is_case_insensitive_and_catalog_sorted() {
        assert_eq!(
            rule_by_code("pk101").map(|r| r.meta().name),
            Some("host-readback-in-step-loop")
        );
        assert!(rule_by_code("PK999").is_none());
        let codes: Vec<&str> = rules().iter().map(|r| r.meta().code).collect();
        let mut sorted = codes.clone();
        sorted.sort();
        assert_eq!(codes, sorted);
    }
}
