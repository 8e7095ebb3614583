//! Detects whether a headless browser (Debian `chromium`) is on the build machine, so the
//! browser tests (`tests/browser.rs`) run as normal tests where it is and are reported as
//! ignored (with the reason) where it is not. With `CI=true` (or `1`) they always run, and
//! fail when the browser is missing. `PERFKIT_CHROMIUM` names the browser binary.
//!
//! Also builds the lint fixtures (`fixtures/lint/`) into the binary for `perfkit demo`, which
//! lints them wherever perfkit was installed (`$OUT_DIR/demo_fixtures.rs`: a table of paths and
//! `include_str!`s; empty when the fixtures are not there, as in a packaged crate).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(perfkit_browser_test)");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=PERFKIT_CHROMIUM");
    println!("cargo::rerun-if-env-changed=CI");
    println!("cargo::rerun-if-changed=build.rs");
    let named = std::env::var_os("PERFKIT_CHROMIUM").is_some();
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            ["chromium", "chromium-browser", "google-chrome"]
                .iter()
                .any(|name| dir.join(name).is_file())
        })
    });
    demo_fixtures();
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if named || on_path || ci {
        println!("cargo::rustc-cfg=perfkit_browser_test");
    }
}

/// Writes `$OUT_DIR/demo_fixtures.rs`: `&[(path, include_str!(file)), ...]` for every `.rs` and
/// `.toml` file and Python fixture under `fixtures/lint/`, sorted by path.
fn demo_fixtures() {
    let manifest =
        std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("fixtures/lint");
    println!("cargo::rerun-if-changed=fixtures/lint");
    let mut files = Vec::new();
    collect(&root, &mut files);
    files.sort();
    let mut table = String::from("&[\n");
    for file in &files {
        let Ok(rel) = file.strip_prefix(&manifest) else {
            continue;
        };
        let rel = rel.to_string_lossy().replace('\\', "/");
        table.push_str(&format!(
            "    ({rel:?}, include_str!({:?})),\n",
            file.display().to_string()
        ));
    }
    table.push(']');
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("demo_fixtures.rs"), table).expect("write demo_fixtures.rs");
}

fn collect(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        // No fixtures (a packaged crate): nothing to build in.
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "toml" || e == "py")
        {
            out.push(path);
        }
    }
}
