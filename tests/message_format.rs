//! `perfkit lint --message-format=json` read as the tools that read `cargo check`'s output read
//! it: through `cargo_metadata::Message`, the parser rust-analyzer and cargo's own tools use.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use cargo_metadata::diagnostic::{Applicability, DiagnosticLevel};
use cargo_metadata::{Message, TargetKind};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn perfkit(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::cargo_bin("perfkit")
        .expect("the perfkit binary is built")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run perfkit")
}

const FIXTURES: [&str; 2] = [
    "fixtures/lint/pk101-host-readback-in-step-loop",
    "fixtures/lint/pk201-cpu-tensor-then-copy",
];

#[test]
fn findings_are_cargo_compiler_messages_with_rustc_spans() {
    let mut args = vec!["lint", "--message-format=json"];
    args.extend(FIXTURES);
    let out = perfkit(&root(), &args);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let messages: Vec<Message> = Message::parse_stream(&out.stdout[..])
        .collect::<Result<_, _>>()
        .expect("every line is a cargo message");

    // The same findings as the JSON schema gives, in the same order.
    let mut args = vec!["lint", "--format", "json"];
    args.extend(FIXTURES);
    let json: Value = serde_json::from_slice(&perfkit(&root(), &args).stdout).unwrap();
    let findings = json["findings"].as_array().unwrap();
    assert!(findings.len() > 4, "{findings:?}");

    let (last, diagnostics) = messages.split_last().unwrap();
    let Message::BuildFinished(finished) = last else {
        panic!("the last message is build-finished: {last:?}");
    };
    assert!(!finished.success);
    assert_eq!(diagnostics.len(), findings.len());
    // cargo's `manifest_path` (which cargo_metadata does not keep on compiler messages).
    let first: Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(
        first["manifest_path"],
        root()
            .join(FIXTURES[0])
            .join("Cargo.toml")
            .display()
            .to_string()
    );
    let mut suggestions = 0;
    for (message, finding) in diagnostics.iter().zip(findings) {
        let Message::CompilerMessage(message) = message else {
            panic!("a compiler message: {message:?}");
        };
        let fixture = FIXTURES
            .iter()
            .find(|f| finding["path"].as_str().unwrap().starts_with(*f))
            .unwrap();
        assert!(
            message.target.src_path.starts_with(root().join(fixture)),
            "{:?}",
            message.target
        );
        assert!(message.package_id.repr.starts_with("path+file://"));
        assert!(
            message.target.is_kind(TargetKind::Lib),
            "{:?}",
            message.target
        );
        let d = &message.message;
        assert_eq!(d.code.as_ref().unwrap().code, finding["code"]);
        assert!(
            d.code
                .as_ref()
                .unwrap()
                .explanation
                .as_ref()
                .unwrap()
                .contains("## What it does")
        );
        let level = match finding["severity"].as_str().unwrap() {
            "warning" => DiagnosticLevel::Warning,
            "note" => DiagnosticLevel::Note,
            "error" => DiagnosticLevel::Error,
            other => panic!("severity {other}"),
        };
        assert_eq!(d.level, level);
        assert_eq!(d.message, finding["message"]);
        assert!(
            d.rendered
                .as_ref()
                .unwrap()
                .contains(&format!("[{}]", finding["code"].as_str().unwrap()))
        );
        let [span] = &d.spans[..] else {
            panic!("one primary span: {:?}", d.spans);
        };
        assert!(span.is_primary);
        assert_eq!(span.file_name, finding["path"]);
        assert_eq!(span.line_start as u64, finding["line"].as_u64().unwrap());
        assert_eq!(
            span.column_start as u64,
            finding["column"].as_u64().unwrap()
        );
        assert_eq!(span.line_end as u64, finding["end_line"].as_u64().unwrap());
        assert_eq!(
            span.column_end as u64,
            finding["end_column"].as_u64().unwrap()
        );
        // The byte offsets cut out of the file what the lines and columns point at.
        let source = std::fs::read_to_string(root().join(&span.file_name)).unwrap();
        let cut = &source[span.byte_start as usize..span.byte_end as usize];
        let first = &span.text[0];
        let line_text: String = first
            .text
            .chars()
            .skip(first.highlight_start - 1)
            .take(first.highlight_end.saturating_sub(first.highlight_start))
            .collect();
        assert!(!cut.is_empty());
        if span.line_start == span.line_end {
            assert_eq!(cut, line_text);
        } else {
            assert!(cut.starts_with(&line_text), "{cut:?} / {line_text:?}");
        }
        let helps: Vec<_> = d
            .children
            .iter()
            .filter(|c| c.level == DiagnosticLevel::Help)
            .collect();
        assert!(
            helps.iter().any(|h| h.message == finding["help"]),
            "{helps:?}"
        );
        for help in helps {
            for s in &help.spans {
                assert_eq!(
                    s.suggestion_applicability,
                    Some(Applicability::MachineApplicable)
                );
                assert!(s.suggested_replacement.is_some());
                suggestions += 1;
            }
        }
    }
    assert!(suggestions > 0, "PK201's fixes are offered as suggestions");
}

#[test]
fn a_clean_run_finishes_with_success_and_a_broken_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.rs"), "fn main() {}\n").unwrap();
    let out = perfkit(dir.path(), &["lint", "--message-format=json", "ok.rs"]);
    assert_eq!(out.status.code(), Some(0));
    let messages: Vec<Message> = Message::parse_stream(&out.stdout[..])
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        matches!(&messages[..], [Message::BuildFinished(f)] if f.success),
        "{messages:?}"
    );

    std::fs::write(
        dir.path().join("broken.rs"),
        "fn main() {\n    let x = ;\n}\n",
    )
    .unwrap();
    let out = perfkit(dir.path(), &["lint", "--message-format=json", "broken.rs"]);
    assert_eq!(out.status.code(), Some(2));
    let messages: Vec<Message> = Message::parse_stream(&out.stdout[..])
        .collect::<Result<_, _>>()
        .unwrap();
    let Message::CompilerMessage(m) = &messages[0] else {
        panic!("{messages:?}");
    };
    assert_eq!(m.message.level, DiagnosticLevel::Error);
    assert_eq!(m.message.spans[0].file_name, "broken.rs");
    assert_eq!(m.message.spans[0].line_start, 2);
    assert!(matches!(&messages[1], Message::BuildFinished(f) if !f.success));
}

#[test]
fn message_format_and_format_exclude_each_other() {
    let out = perfkit(
        &root(),
        &["lint", "--message-format=json", "--format", "json", "src"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--format"));
}
