use std::path::Path;

use super::*;

fn lint(code: &str, location: &str) -> Finding {
    Finding {
        code: code.to_owned(),
        name: "n".to_owned(),
        severity: Severity::Warning,
        message: "m".to_owned(),
        help: "h".to_owned(),
        location: Some(location.to_owned()),
        origin: "lint".to_owned(),
        confirmed: false,
        cost_per_step_ns: None,
        share_of_step_percent: None,
        bytes: None,
        count: None,
    }
}

fn runtime(code: &str, location: &str, cost: u64) -> Finding {
    Finding {
        origin: "runtime".to_owned(),
        cost_per_step_ns: Some(cost),
        share_of_step_percent: Some(12.5),
        bytes: Some(4096),
        count: Some(200),
        ..lint(code, location)
    }
}

#[test]
fn same_line_matches_path_suffixes_on_component_boundaries() {
    assert!(same_line(
        "kernels/src/antipatterns.rs:29:17",
        "kernels/src/antipatterns.rs:29"
    ));
    assert!(same_line(
        "./src/antipatterns.rs:29",
        "kernels/src/antipatterns.rs:29"
    ));
    assert!(same_line("kernels\\src\\a.rs:3", "kernels/src/a.rs:3:1"));
    assert!(!same_line(
        "kernels/src/antipatterns.rs:29",
        "kernels/src/antipatterns.rs:30"
    ));
    assert!(!same_line(
        "src/xantipatterns.rs:29",
        "src/antipatterns.rs:29"
    ));
    assert!(!same_line("unknown", "unknown"));
    assert!(!same_line("span `data`", "span `data`"));
}

#[test]
fn confirm_marks_lint_findings_seen_at_run_time_with_their_cost() {
    let merged = confirm(
        vec![
            lint("PK102", "kernels/src/antipatterns.rs:38:5"),
            lint("PK101", "kernels/src/antipatterns.rs:29:17"),
            lint("PK101", "kernels/src/other.rs:29:17"),
        ],
        vec![
            runtime("PK101", "kernels/src/antipatterns.rs:29", 5_000),
            // Same line, other rule: does not confirm PK102.
            runtime("PK303", "kernels/src/antipatterns.rs:38", 9_000),
        ],
    );
    assert_eq!(merged.len(), 5);
    let first = &merged[0];
    assert_eq!((first.code.as_str(), first.confirmed), ("PK101", true));
    assert_eq!(first.cost_per_step_ns, Some(5_000));
    assert_eq!(first.count, Some(200));
    assert!(
        merged[1..3]
            .iter()
            .all(|f| !f.confirmed && f.origin == "lint")
    );
    assert!(merged[3..].iter().all(|f| f.origin == "runtime"));
    let table = terminal_findings(&merged);
    let confirmed = table
        .lines()
        .find(|l| l.contains("lint+run"))
        .unwrap_or_else(|| panic!("no confirmed row in {table}"));
    assert!(confirmed.contains("PK101"), "{table}");
    assert!(confirmed.contains("5.00 us"), "{table}");
}

#[test]
fn profile_table_overrides_defaults_and_rejects_unknown_keys() {
    let p = Path::new("perfkit.toml");
    let c = ProfileConfig::from_toml(
        "select = [\"PK1\"]\n[profile]\nidle-share = 0.3\nloader-spans = [\"fetch\"]\n",
        false,
        p,
    )
    .expect("valid");
    assert_eq!(c.idle_share, 0.3);
    assert_eq!(c.loader_spans, vec!["fetch".to_owned()]);
    assert_eq!(c.gap_ns, ProfileConfig::default().gap_ns);

    let err = ProfileConfig::from_toml("[profile]\nidle-shar = 0.3\n", false, p).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("perfkit.toml:2: "), "{msg}");
    assert!(msg.contains("idle-shar"), "{msg}");

    let err = ProfileConfig::from_toml("[profile]\nmemory-share = 1.5\n", false, p).unwrap_err();
    assert!(
        err.to_string()
            .contains("`memory-share` must be between 0 and 1"),
        "{err}"
    );

    let err = ProfileConfig::from_toml("[profile]\ngap-ns = \"soon\"\n", false, p).unwrap_err();
    assert!(
        err.to_string().contains("gap-ns") || err.to_string().contains("invalid type"),
        "{err}"
    );

    let c = ProfileConfig::from_toml(
        "[package]\nname = \"x\"\n[package.metadata.perfkit.profile]\nutilization = 0.7\n",
        true,
        Path::new("Cargo.toml"),
    )
    .expect("valid");
    assert_eq!(c.utilization, 0.7);
    assert_eq!(
        ProfileConfig::from_toml("", false, p).expect("empty"),
        ProfileConfig::default()
    );
}

#[test]
fn discover_finds_the_nearest_perfkit_toml() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("a/b");
    std::fs::create_dir_all(&sub).expect("mkdir");
    std::fs::write(
        dir.path().join("perfkit.toml"),
        "[profile]\nmin-share = 0.2\n",
    )
    .expect("write");
    assert_eq!(ProfileConfig::discover(&sub).expect("found").min_share, 0.2);
    std::fs::write(
        dir.path().join("a/perfkit.toml"),
        "[profile]\nmin-share = [\n",
    )
    .expect("write");
    let err = ProfileConfig::discover(&sub).unwrap_err();
    assert!(
        err.to_string().contains("a/perfkit.toml") || err.to_string().contains("a\\perfkit.toml"),
        "{err}"
    );
}

/// A bad value in `[profile]` or `[check]` is named by the file and line it is on, in a
/// `perfkit.toml` as in a `Cargo.toml`.
#[test]
fn a_bad_value_is_named_by_its_line() {
    let p = Path::new("perfkit.toml");
    let err = ProfileConfig::from_toml(
        "# thresholds\n[profile]\nidle-share = 0.3\nsmall-copy-bytes = \"x\"\n",
        false,
        p,
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("perfkit.toml:4: "), "{err}");
    let err = ProfileConfig::from_toml("[profile]\n\nutilization = 5.0\n", false, p)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("perfkit.toml:3: "), "{err}");
    assert!(err.contains("`utilization`"), "{err}");
    let err = crate::gate::CheckConfig::from_toml(
        "[package]\nname = \"x\"\n[package.metadata.perfkit.check]\nmin-effect = \"5%\"\n",
        true,
        Path::new("Cargo.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("Cargo.toml:4: "), "{err}");
    let err = crate::gate::CheckConfig::from_toml("[check]\nbogus = 1\n", false, p)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("perfkit.toml:2: "), "{err}");
    // Syntax errors already say where they are.
    let err = ProfileConfig::from_toml("[profile]\nidle-share = [\n", false, p)
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2"), "{err}");
}

/// `perfkit report ../run` from a directory with its own perfkit.toml: `..` is a step up from
/// the current directory, not from the run, so that file is not above the run and not used.
#[test]
fn discover_walks_up_the_real_path_not_through_dot_dot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let here = dir.path().join("here");
    let run = dir.path().join("run");
    std::fs::create_dir_all(&here).expect("mkdir");
    std::fs::create_dir_all(&run).expect("mkdir");
    std::fs::write(here.join("perfkit.toml"), "[profile]\nmin-share = 0.3\n").expect("write");
    let found = ProfileConfig::discover(&here.join("..").join("run")).expect("discover");
    assert_eq!(found, ProfileConfig::default());
}

#[test]
fn every_runtime_rule_is_listed_once_with_help() {
    let mut codes: Vec<&str> = RULES.iter().map(|r| r.code).collect();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes.len(), RULES.len());
    for r in &RULES {
        assert!(r.code.starts_with("PK") && r.code.len() == 5, "{}", r.code);
        assert!(!r.help.is_empty() && !r.help.ends_with('.'), "{}", r.code);
        assert_eq!(r.name, r.name.to_ascii_lowercase());
        let doc = r.doc();
        for heading in [
            "## What it does",
            "## Why is this bad?",
            "## Compared with nsys and HTA",
        ] {
            assert!(
                doc.contains(heading),
                "{}: {heading} missing in {doc}",
                r.code
            );
        }
        assert!(!doc.contains("//!"), "{doc}");
        let summary = r.summary();
        assert!(
            summary.ends_with('.') && summary.len() > 20,
            "{}: {summary}",
            r.code
        );
    }
}
