//! `diff` of synthetic runs (GPU timings from a simulator): the change shows where it is.

mod synth;

use std::path::Path;

use perfkit_reports::diff::{Run, RunInput, diff, differential_flamegraphs};
use perfkit_reports::render::{Format, RenderOptions, write_all};
use perfkit_reports::{AnalyzeOptions, analyze_path};
use synth::{Workload, trace_bytes};

fn run(dir: &Path, name: &str, wl: &Workload) -> Run {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).expect("dir");
    std::fs::write(
        d.join("train.pktrace"),
        trace_bytes("train", 9, None, 1_700_000_000_000_000_000, wl),
    )
    .expect("write");
    let a = analyze_path(&d, &AnalyzeOptions::default()).expect("analyze");
    write_all(&a, &d, &[Format::Json], &[], &RenderOptions::default()).expect("summary.json");
    Run::of_analysis(&a)
}

#[test]
fn anti_patterns_against_tuned_show_where_time_went() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = run(dir.path(), "tuned", &Workload::tuned());
    let new = run(dir.path(), "anti", &Workload::anti_patterns());
    let d = diff(&base, &new);
    let steps = d.steps.as_ref().expect("both runs have steps");
    assert_eq!(steps.verdict, "slower");
    // One run per side: the noise is the check's noise floor (50 % of the base median), and
    // the verdict says it is weak.
    assert!(
        steps.delta_ns > 0 && steps.delta_ns as u64 > 3 * steps.noise_ns,
        "{steps:?}"
    );
    assert!(steps.evidence.starts_with("weak verdict"), "{steps:?}");
    // The largest span change is data loading (pageable, blocking uploads), then the optimizer
    // (loss readback + synchronize every step).
    assert_eq!(d.spans[0].name, "data");
    assert_eq!(d.spans[1].name, "optimizer");
    assert!(d.spans[0].delta > 1_000_000.0, "{:?}", d.spans[0]);
    // New copy sites and sync sites appear; the pinned upload disappears.
    let copy = |k: &str| {
        d.copies
            .iter()
            .find(|c| c.name == k)
            .unwrap_or_else(|| panic!("{k}"))
    };
    assert_eq!(copy("src/data.rs:31 H2D pinned").new, 0.0);
    assert!(
        copy("src/data.rs:31 H2D pageable").base == 0.0
            && copy("src/data.rs:31 H2D pageable").new > 0.0
    );
    assert!(
        copy("src/train.rs:72 D2H pageable").change.is_none(),
        "new in the anti-pattern run"
    );
    assert!(
        d.syncs
            .iter()
            .any(|s| s.name == "src/train.rs:75" && s.base == 0.0 && s.new > 0.0)
    );
    let op = |k: &str| {
        d.operations
            .iter()
            .find(|o| o.name == k)
            .unwrap_or_else(|| panic!("{k}"))
    };
    assert_eq!(op("synchronizations").delta, 20.0);
    // Kernels did not change much.
    assert!(
        d.kernels
            .iter()
            .all(|k| k.change.is_some_and(|c| c.abs() < 0.05)),
        "{:?}",
        d.kernels
    );
    // Text, JSON and HTML render; a differential flamegraph per kind.
    let text = d.to_text(10);
    assert!(text.contains("slower") && text.contains("data"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&d.to_json()).expect("json");
    assert_eq!(json["schema"], "perfkit-diff");
    let flames = differential_flamegraphs(&base, &new).expect("flamegraphs");
    assert_eq!(flames.len(), 2);
    let svg = String::from_utf8_lossy(&flames[0].1);
    assert!(svg.contains("<svg") && svg.contains("data"));
    let html = d.to_html(&[("host", flames[0].1.as_slice())]);
    assert!(
        html.contains("data:image/svg+xml;base64,") && html.contains("Content-Security-Policy")
    );
}

#[test]
fn same_workload_is_within_noise_and_summaries_diff_like_traces() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = run(dir.path(), "a", &Workload::tuned());
    let mut wl = Workload::tuned();
    wl.seed = 99;
    let new = run(dir.path(), "b", &wl);
    let d = diff(&base, &new);
    assert_eq!(
        d.steps.as_ref().expect("steps").verdict,
        "within noise",
        "{:?}",
        d.steps
    );
    // From summary.json files: the same report as from the traces.
    let opts = AnalyzeOptions::default();
    let from_json = diff(
        &RunInput::classify(&dir.path().join("a/summary.json"))
            .expect("classify")
            .load(&opts)
            .expect("load"),
        &RunInput::classify(&dir.path().join("b/summary.json"))
            .expect("classify")
            .load(&opts)
            .expect("load"),
    );
    assert_eq!(from_json.steps, d.steps);
    assert_eq!(from_json.spans, d.spans);
    // A bad summary gives a clear error naming the file.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"schema\":\"perfkit-summary\",\"version\":99}").expect("write");
    let err = RunInput::classify(&bad)
        .expect("classify")
        .load(&opts)
        .expect_err("version 99");
    assert!(
        err.to_string().contains("bad.json") && err.to_string().contains("version 99"),
        "{err}"
    );
}
