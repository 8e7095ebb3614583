//! The crate's own sources, built into the binary, so that `perfkit demo` can lint the trainer
//! it runs wherever it was installed, with no source tree around.

/// Every source file of the crate that `perfkit lint` reads, with its path relative to the
/// crate's directory (`Cargo.toml` carries the crate's lint configuration).
pub const SOURCES: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("../Cargo.toml")),
    ("build.rs", include_str!("../build.rs")),
    ("src/antipatterns.rs", include_str!("antipatterns.rs")),
    ("src/bin/train.rs", include_str!("bin/train.rs")),
    ("src/cpu.rs", include_str!("cpu.rs")),
    ("src/cpu_model.rs", include_str!("cpu_model.rs")),
    ("src/data.rs", include_str!("data.rs")),
    ("src/gpu.rs", include_str!("gpu.rs")),
    ("src/lib.rs", include_str!("lib.rs")),
    ("src/nvrtc.rs", include_str!("nvrtc.rs")),
    ("src/rng.rs", include_str!("rng.rs")),
    ("src/sources.rs", include_str!("sources.rs")),
    ("src/task.rs", include_str!("task.rs")),
    ("src/train.rs", include_str!("train.rs")),
];

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn rust_files(dir: &Path, root: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap();
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }

    #[test]
    fn every_rust_file_of_the_crate_outside_its_tests_is_built_in() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec!["Cargo.toml".to_owned(), "build.rs".to_owned()];
        rust_files(&root.join("src"), root, &mut files);
        files.sort();
        let mut listed: Vec<String> = super::SOURCES.iter().map(|s| s.0.to_owned()).collect();
        listed.sort();
        assert_eq!(listed, files);
        for (path, text) in super::SOURCES {
            assert_eq!(
                *text,
                std::fs::read_to_string(root.join(path)).unwrap(),
                "{path}"
            );
        }
    }
}
