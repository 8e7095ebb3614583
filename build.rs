//! Detects whether a headless browser (Debian `chromium`) is on the build machine, so the
//! browser tests (`tests/browser.rs`) run as normal tests where it is and are reported as
//! ignored (with the reason) where it is not. With `CI=true` (or `1`) they always run, and
//! fail when the browser is missing. `PERFKIT_CHROMIUM` names the browser binary.

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
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if named || on_path || ci {
        println!("cargo::rustc-cfg=perfkit_browser_test");
    }
}
