//! What crates.io needs of every crate of the workspace, so that `cargo publish` (and then
//! `cargo install perfkit`) can work: description, license (with its texts), readme, keywords and
//! categories as crates.io accepts them, and perfkit dependencies that name a version matching
//! the crate they point to. `.ci/run` then packages and verifies every crate
//! (`cargo package --workspace`).

use cargo_metadata::{DependencyKind, MetadataCommand};

/// crates.io's category slugs used here (crates.io/category_slugs).
const CATEGORIES: [&str; 9] = [
    "command-line-utilities",
    "development-tools",
    "development-tools::cargo-plugins",
    "development-tools::debugging",
    "development-tools::profiling",
    "hardware-support",
    "science",
    "visualization",
    "text-processing",
];

#[test]
fn every_crate_has_the_metadata_crates_io_needs() {
    let metadata = MetadataCommand::new()
        .manifest_path(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .no_deps()
        .exec()
        .expect("cargo metadata");
    let members = metadata.workspace_packages();
    assert!(members.len() >= 8, "{}", members.len());
    for package in &members {
        let name = package.name.as_str();
        assert!(
            package.description.as_deref().is_some_and(|d| d.len() > 20),
            "{name}: description"
        );
        assert_eq!(
            package.license.as_deref(),
            Some("MIT OR Apache-2.0"),
            "{name}"
        );
        // `repository` is left out until the project has a public home (never a made-up one).
        assert!(
            package
                .repository
                .as_deref()
                .is_none_or(|r| r.starts_with("https://")),
            "{name}: repository"
        );
        let readme = package
            .readme
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: readme"));
        let dir = package.manifest_path.parent().unwrap();
        assert!(dir.join(readme).is_file(), "{name}: readme {readme} exists");
        assert!(
            (1..=5).contains(&package.keywords.len()),
            "{name}: 1 to 5 keywords"
        );
        for keyword in &package.keywords {
            assert!(
                keyword.len() <= 20
                    && keyword.starts_with(|c: char| c.is_ascii_alphabetic())
                    && keyword
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-+".contains(c)),
                "{name}: keyword {keyword}"
            );
        }
        assert!(!package.categories.is_empty(), "{name}: categories");
        for category in &package.categories {
            assert!(
                CATEGORIES.contains(&category.as_str()),
                "{name}: category {category}"
            );
        }
        assert!(package.publish.is_none(), "{name} is publishable");
        // A perfkit crate it depends on (not for tests only) names its version too, so that the
        // published manifest depends on the published crate.
        for dep in &package.dependencies {
            let Some(target) = members.iter().find(|p| p.name.as_str() == dep.name) else {
                continue;
            };
            if dep.kind == DependencyKind::Development {
                continue;
            }
            assert!(dep.path.is_some(), "{name} -> {}: by path", dep.name);
            assert!(
                dep.req.matches(&target.version) && dep.req.to_string() != "*",
                "{name} -> {}: version {} for {}",
                dep.name,
                dep.req,
                target.version
            );
        }
    }
}

#[test]
fn the_declared_licenses_ship_their_texts() {
    let root = env!("CARGO_MANIFEST_DIR");
    for (file, first_words) in [
        (
            "LICENSE-MIT",
            "Permission is hereby granted, free of charge",
        ),
        ("LICENSE-APACHE", "Apache License"),
    ] {
        let text = std::fs::read_to_string(format!("{root}/{file}"))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let start: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(start.starts_with(first_words), "{file}: {}", &start[..60]);
    }
    // The packaged `perfkit` crate carries them.
    let manifest = std::fs::read_to_string(format!("{root}/Cargo.toml")).unwrap();
    assert!(
        manifest.contains("\"/LICENSE-MIT\", \"/LICENSE-APACHE\""),
        "the root package's include list names the license files"
    );
}
