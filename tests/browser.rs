//! The HTML report in a real headless browser (Debian `chromium`): no console messages, the
//! charts and flamegraph rendered, and strings from the traced program shown literally
//! without running. Screenshots are saved under `target/perfkit-browser/` for people to look at.
//!
//! Where the build found no chromium (see `build.rs`) the browser tests are reported as
//! ignored, with the reason; with `CI=true` they always run and fail without it.
//! `PERFKIT_CHROMIUM` names the browser binary when it is not `chromium` on the `PATH`.

#[path = "../reports/tests/synth/mod.rs"]
mod synth;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use perfkit_reports::findings::{Finding, Severity};
use perfkit_reports::render::{Format, RenderOptions, write_all};
use perfkit_reports::{AnalyzeOptions, analyze_path};
use synth::{Synth, Workload, trace_bytes};

const START: u64 = 1_700_000_000_000_000_000;

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PERFKIT_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// The browser; a test that asks for it fails where it is missing.
fn browser() -> PathBuf {
    chromium().expect(
        "chromium not found: install it (apt-get install -y chromium) or set PERFKIT_CHROMIUM",
    )
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("perfkit-browser");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

struct Run {
    stdout: String,
    console: Vec<String>,
}

/// Runs headless chromium on `page` with `extra` arguments; returns stdout and the page's
/// console messages (chromium logs them to stderr as `INFO:CONSOLE`).
fn chromium_run(browser: &Path, page: &Path, extra: &[String]) -> Run {
    let profile = tempfile::tempdir().expect("profile dir");
    let url = format!(
        "file://{}",
        page.canonicalize().expect("page path").display()
    );
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=3000",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(extra)
    .arg(url)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = cmd.spawn().expect("start chromium");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    let waiter = std::thread::spawn(move || child.wait_with_output());
    while !waiter.is_finished() {
        if Instant::now() > deadline {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("chromium did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = waiter.join().expect("join").expect("chromium output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        console: stderr
            .lines()
            .filter(|l| l.contains(":CONSOLE"))
            .map(str::to_owned)
            .collect(),
    }
}

fn render(dir: &Path, wl: &Workload, ranks: u32, findings: &[Finding]) -> PathBuf {
    let traces = dir.join("traces");
    std::fs::create_dir_all(&traces).expect("traces dir");
    for rank in 0..ranks {
        let mut wl = wl.clone();
        wl.seed = u64::from(rank) + 1;
        if ranks > 1 && rank == 1 {
            wl.data_ns *= 4;
        }
        let bytes = trace_bytes(
            "train",
            70 + rank,
            (ranks > 1).then_some(rank),
            START + u64::from(rank) * 250_000,
            &wl,
        );
        std::fs::write(traces.join(format!("train-{rank}.pktrace")), bytes).expect("write trace");
    }
    let a = analyze_path(&traces, &AnalyzeOptions::default()).expect("analyze");
    write_all(
        &a,
        dir,
        &[Format::Html],
        findings,
        &RenderOptions::default(),
    )
    .expect("render");
    dir.join("report.html")
}

/// The page's DOM after its script ran, which it must do to its end without a console message.
fn rendered_dom(browser: &Path, page: &Path) -> String {
    let run = chromium_run(browser, page, &["--dump-dom".to_owned()]);
    assert!(
        run.console.is_empty(),
        "console messages: {:#?}",
        run.console
    );
    assert!(
        run.stdout.contains("data-rendered=\"true\""),
        "the script ran to its end"
    );
    run.stdout
}

fn attr_number(dom: &str, marker: &str) -> u64 {
    let Some(at) = dom.find(marker) else {
        return 0;
    };
    dom[at + marker.len()..]
        .split('"')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
#[cfg_attr(
    not(perfkit_browser_test),
    ignore = "chromium not found at build time: apt-get install chromium, or set PERFKIT_CHROMIUM"
)]
fn report_renders_without_console_messages() {
    let browser = browser();
    let dir = tempfile::tempdir().expect("tempdir");
    let finding = Finding {
        code: "PK101".to_owned(),
        name: "host-readback-in-step-loop".to_owned(),
        severity: Severity::Warning,
        message: "a 4-byte device-to-host copy blocks every step".to_owned(),
        help: "keep the loss on the device and read it back every N steps".to_owned(),
        location: Some("src/train.rs:72".to_owned()),
        origin: "runtime".to_owned(),
        confirmed: false,
        cost_per_step_ns: Some(800_000),
        share_of_step_percent: Some(33.0),
        bytes: Some(80),
        count: Some(20),
    };
    // Two more in the source for the same rule (one of them seen at run time), and one of
    // another rule: the report groups them per rule.
    let lint = |line: u32, confirmed: bool, code: &str, name: &str| Finding {
        location: Some(format!("src/train.rs:{line}")),
        origin: "lint".to_owned(),
        confirmed,
        cost_per_step_ns: None,
        share_of_step_percent: None,
        bytes: None,
        count: None,
        code: code.to_owned(),
        name: name.to_owned(),
        ..finding.clone()
    };
    let findings = [
        lint(90, false, "PK202", "device-alloc-in-step-loop"),
        lint(72, true, "PK101", "host-readback-in-step-loop"),
        finding.clone(),
        lint(140, false, "PK101", "host-readback-in-step-loop"),
    ];
    let page = render(dir.path(), &Workload::anti_patterns(), 2, &findings);
    let dom = rendered_dom(&browser, &page);
    assert!(
        attr_number(&dom, "data-frames=\"") >= 4,
        "flamegraph frames drawn"
    );
    assert!(
        attr_number(&dom, "data-items=\"") > 5,
        "timeline items drawn"
    );
    assert!(
        dom.matches("class=\"step-bar\"").count() >= 20,
        "a bar per step"
    );
    assert!(dom.contains("class=\"memsvg\""), "memory chart drawn");
    assert!(
        dom.contains("gemm_bwd") && dom.contains("src/data.rs:31"),
        "tables filled"
    );
    assert!(
        dom.contains("PK101 host-readback-in-step-loop"),
        "findings shown"
    );
    assert!(
        dom.contains("data-groups=\"2\""),
        "findings grouped per rule"
    );
    assert!(dom.contains("4 findings under 2 rules"), "findings counted");
    // The measured rule comes first, with its three findings and their origins counted.
    let pk101 = dom.find("data-code=\"PK101\"").expect("PK101 group");
    let pk202 = dom.find("data-code=\"PK202\"").expect("PK202 group");
    assert!(pk101 < pk202, "the costly rule first");
    assert!(
        dom.contains(
            "3 findings \u{b7} 1 measured \u{b7} 2 in the source \u{b7} 1 confirmed at run time"
        ),
        "group header counts"
    );
    assert!(dom.contains("Straggler: rank 1"), "ranks compared");
    assert!(!dom.contains("<p class=\"empty\">No findings.</p>"));

    let shot = screenshot_dir().join("report.png");
    let _ = std::fs::remove_file(&shot);
    let run = chromium_run(
        &browser,
        &page,
        &[
            "--window-size=1400,2600".to_owned(),
            format!("--screenshot={}", shot.display()),
        ],
    );
    assert!(
        run.console.is_empty(),
        "console messages: {:#?}",
        run.console
    );
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 20_000, "screenshot written ({size} bytes)");
}

const SCRIPT: &str = "<script>alert(1)</script>";
const IMG: &str = "\"><img src=x onerror=alert(1)>";

/// A report of a program whose span and kernel names are HTML payloads, rendered through the
/// command line as a user would; returns the page, checked to hold the payloads escaped.
fn hostile_report(dir: &Path) -> PathBuf {
    let mut wl = Workload::tuned();
    wl.spans = [SCRIPT, IMG, "forward\u{2028}</script>", "optimizer"];
    wl.kernels = [SCRIPT, IMG, "adam_update"];
    let traces = dir.join("traces");
    std::fs::create_dir_all(&traces).expect("traces dir");
    std::fs::write(
        traces.join("train-1.pktrace"),
        trace_bytes("train", 5, None, START, &wl),
    )
    .expect("trace");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_perfkit"))
        .args(["report", "--format", "html", "--out"])
        .arg(dir)
        .arg(&traces)
        .stdout(Stdio::null())
        .status()
        .expect("run perfkit report");
    assert!(status.success());
    let page = dir.join("report.html");
    let html = std::fs::read_to_string(&page).expect("page");
    assert!(
        !html.contains(SCRIPT) && !html.contains("<img src=x"),
        "payloads are escaped in the file"
    );
    page
}

/// The file half, which needs no browser and always runs.
#[test]
fn strings_from_the_traced_program_are_escaped_in_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    hostile_report(dir.path());
}

#[test]
#[cfg_attr(
    not(perfkit_browser_test),
    ignore = "chromium not found at build time: apt-get install chromium, or set PERFKIT_CHROMIUM"
)]
fn strings_from_the_traced_program_never_run() {
    let browser = browser();
    let dir = tempfile::tempdir().expect("tempdir");
    let page = hostile_report(dir.path());
    // An injected handler or script would run (console) or be blocked by the CSP (console too).
    let dom = rendered_dom(&browser, &page);
    // Shown literally: the serialised DOM holds the payloads as escaped text in table cells.
    assert!(
        dom.contains("<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>"),
        "script name shown as text"
    );
    assert!(
        dom.contains("<td>\"&gt;&lt;img src=x onerror=alert(1)&gt;</td>"),
        "img name shown as text"
    );
    assert!(
        !dom.contains("<img src=\"x\""),
        "no img element was created"
    );
    assert_eq!(
        dom.matches("<script").count(),
        2,
        "only the report's own two script elements"
    );
    let shot = screenshot_dir().join("report-xss.png");
    let run = chromium_run(
        &browser,
        &page,
        &[
            "--window-size=1400,1800".to_owned(),
            format!("--screenshot={}", shot.display()),
        ],
    );
    assert!(
        run.console.is_empty(),
        "console messages while taking the screenshot: {:#?}",
        run.console
    );
}

/// A run with no GPU work at all (a CPU run): the step chart shows whole steps, not a
/// breakdown that would read as 100 % GPU idle.
#[test]
#[cfg_attr(
    not(perfkit_browser_test),
    ignore = "chromium not found at build time: apt-get install chromium, or set PERFKIT_CHROMIUM"
)]
fn a_run_without_gpu_work_charts_whole_steps() {
    let browser = browser();
    let dir = tempfile::tempdir().expect("tempdir");
    let traces = dir.path().join("traces");
    std::fs::create_dir_all(&traces).expect("traces dir");
    let mut s = Synth::new(Vec::new(), "train", 9, None, START);
    for step in 0..12 {
        s.enter(0, "step", Some(step));
        s.enter(0, "forward", None);
        s.work(2_000_000 + step * 10_000);
        s.exit(0);
        s.exit(0);
    }
    std::fs::write(traces.join("train-9.pktrace"), s.finish(false)).expect("write trace");
    let a = analyze_path(&traces, &AnalyzeOptions::default()).expect("analyze");
    write_all(
        &a,
        dir.path(),
        &[Format::Html],
        &[],
        &RenderOptions::default(),
    )
    .expect("render");
    let dom = rendered_dom(&browser, &dir.path().join("report.html"));
    assert_eq!(
        dom.matches("class=\"step-bar\"").count(),
        12,
        "a bar per step"
    );
    assert!(
        dom.contains("no GPU work was recorded"),
        "the legend says why"
    );
    assert!(!dom.contains("GPU idle</span>"), "no GPU breakdown legend");
}
