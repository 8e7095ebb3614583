//! Finds the cargo package that built a program, from the program's path, the way a cargo user
//! reads `target/release/train`: the workspace is the directory holding `target/`, and the
//! package is the workspace member with a binary (or example) target of that name.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use perfkit_lint::output::normalize;

/// The package that built a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FoundCrate {
    /// The package's directory (the one holding its Cargo.toml).
    pub dir: PathBuf,
    /// The package's name.
    pub package: String,
    /// The source files of the target that was run, as cargo compiles it: its root file and
    /// the modules it declares, then the package's library and its modules when the target
    /// uses the library (see [`module_tree`]).
    pub files: Vec<PathBuf>,
    /// The workspace root: the directory holding `target/`.
    pub workspace_root: PathBuf,
    /// The program's path as it was resolved.
    pub executable: PathBuf,
}

impl FoundCrate {
    /// One line for the summary, such as `lint: kernels/src/bin/train.rs and 12 more files
    /// (package perfkit-kernels, from target/release/train)`; paths are shown relative to `cwd`
    /// (the sources) and to the workspace root (the program) where possible.
    pub(crate) fn describe(&self, cwd: &Path) -> String {
        let shown = |p: &Path| match p.strip_prefix(cwd) {
            Ok(rel) => rel.display().to_string(),
            Err(_) => p.display().to_string(),
        };
        let files = match self.files.as_slice() {
            [] => "no files".to_owned(),
            [one] => shown(one),
            [first, rest @ ..] => format!(
                "{} and {} more file{}",
                shown(first),
                rest.len(),
                if rest.len() == 1 { "" } else { "s" }
            ),
        };
        let exe = self
            .executable
            .strip_prefix(&self.workspace_root)
            .unwrap_or(&self.executable);
        format!(
            "lint: {files} (package {}, from {})",
            self.package,
            exe.display()
        )
    }
}

/// Finds the package that built `program`: `program` is resolved like a shell does (through
/// `path_var` when it has no `/`, else against `cwd`), then [`crate_for_executable`] reads the
/// cargo layout around it; a symbolic link is followed only if its own location says nothing.
/// A target directory elsewhere (`CARGO_TARGET_DIR`, `build.target-dir`, one shared by several
/// workspaces) is recognised by the files cargo keeps in it, and the package is then looked
/// up in the workspace that holds `cwd`, as `cargo` itself would. `None` when the program is
/// not a file in a cargo target directory of a known package.
pub(crate) fn find_crate(
    program: &OsStr,
    path_var: Option<&OsStr>,
    cwd: &Path,
) -> Option<FoundCrate> {
    let exe = resolve_program(program, path_var, cwd)?;
    let real = std::fs::canonicalize(&exe).ok().filter(|real| *real != exe);
    crate_for_executable(&exe)
        .or_else(|| crate_for_executable(real.as_deref()?))
        .or_else(|| crate_in_shared_target_dir(&exe, cwd))
        .or_else(|| crate_in_shared_target_dir(real.as_deref()?, cwd))
}

/// Where an executable sits in a cargo target directory: its name, whether it is an example,
/// and the directories that may be the target directory (`<td>/<profile>/` or
/// `<td>/<triple>/<profile>/`).
fn target_layout(exe: &Path) -> Option<(&str, TargetKind, [Option<&Path>; 2])> {
    let file_name = exe.file_name()?.to_str()?;
    let name = file_name.strip_suffix(".exe").unwrap_or(file_name);
    let mut profile_dir = exe.parent()?;
    let kind = if profile_dir.file_name() == Some(OsStr::new("examples")) {
        profile_dir = profile_dir.parent()?;
        TargetKind::Example
    } else {
        TargetKind::Bin
    };
    let above = profile_dir.parent()?;
    Some((name, kind, [Some(above), above.parent()]))
}

/// A program in a cargo target directory that is not `<workspace>/target`: the package is the
/// one with that target in the nearest package or workspace above `cwd`.
fn crate_in_shared_target_dir(exe: &Path, cwd: &Path) -> Option<FoundCrate> {
    let (name, kind, candidates) = target_layout(exe)?;
    // Cargo marks every target directory it creates with these two files.
    let is_target_dir =
        |dir: &Path| dir.join("CACHEDIR.TAG").is_file() && dir.join(".rustc_info.json").is_file();
    if !candidates.into_iter().flatten().any(is_target_dir) {
        return None;
    }
    let cwd = normalize(cwd);
    first_package(cwd.ancestors(), exe, name, kind)
}

/// The first of the candidate workspace roots (directories holding a Cargo.toml) whose
/// workspace has a `kind` target called `name`.
fn first_package<'a>(
    roots: impl Iterator<Item = &'a Path>,
    exe: &Path,
    name: &str,
    kind: TargetKind,
) -> Option<FoundCrate> {
    roots
        .filter(|root| root.join("Cargo.toml").is_file())
        .find_map(|root| {
            let (dir, package, files) = find_package(root, name, kind)?;
            Some(FoundCrate {
                dir,
                package,
                files,
                workspace_root: root.to_path_buf(),
                executable: exe.to_path_buf(),
            })
        })
}

/// The absolute, lexically normalised path of the file `program` names, or `None` when there is
/// no such file.
fn resolve_program(program: &OsStr, path_var: Option<&OsStr>, cwd: &Path) -> Option<PathBuf> {
    let given = Path::new(program);
    if given.as_os_str().is_empty() {
        return None;
    }
    if given.components().count() > 1 || given.is_absolute() {
        let path = normalize(&cwd.join(given));
        return path.is_file().then_some(path);
    }
    std::env::split_paths(path_var?)
        .map(|dir| {
            // An empty PATH entry means the current directory.
            let dir = if dir.as_os_str().is_empty() {
                cwd.to_path_buf()
            } else {
                cwd.join(dir)
            };
            normalize(&dir.join(given))
        })
        .find(|candidate| is_executable_file(candidate))
}

#[cfg(unix)]
fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable_file(path: &Path) -> bool {
    path.is_file()
}

/// Reads the cargo layout around an executable: `<root>/target/<profile>/<name>`,
/// `<root>/target/<triple>/<profile>/<name>`, or the same with `examples/` before `<name>`,
/// where `<root>` holds a Cargo.toml; then finds the package with that target.
pub(crate) fn crate_for_executable(exe: &Path) -> Option<FoundCrate> {
    let (name, kind, candidates) = target_layout(exe)?;
    let roots = candidates
        .into_iter()
        .flatten()
        .filter(|dir| dir.file_name() == Some(OsStr::new("target")))
        .filter_map(Path::parent);
    first_package(roots, exe, name, kind)
}

/// Which kind of target an executable is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TargetKind {
    Bin,
    Example,
}

/// The directory and name of the package in the workspace at `root` that has a `kind` target
/// called `name`, and the target's source files: the root package first, then the
/// `[workspace] members` in order.
fn find_package(
    root: &Path,
    name: &str,
    kind: TargetKind,
) -> Option<(PathBuf, String, Vec<PathBuf>)> {
    let manifest = read_manifest(&root.join("Cargo.toml"))?;
    let mut dirs = vec![root.to_path_buf()];
    if let Some(workspace) = manifest.get("workspace").and_then(toml::Value::as_table) {
        let excluded: Vec<PathBuf> = string_list(workspace.get("exclude"))
            .map(|e| normalize(&root.join(e)))
            .collect();
        for member in string_list(workspace.get("members")) {
            for dir in expand_member(root, member) {
                if !excluded.contains(&dir) && !dirs.contains(&dir) {
                    dirs.push(dir);
                }
            }
        }
    }
    dirs.into_iter().find_map(|dir| {
        let manifest = if dir == root {
            manifest.clone()
        } else {
            read_manifest(&dir.join("Cargo.toml"))?
        };
        let (package, target_root) = package_with_target(&dir, &manifest, name, kind)?;
        let files = module_tree(&dir, &manifest, &package, &target_root);
        Some((dir, package, files))
    })
}

/// A manifest's table, or `None` when it is missing or not valid TOML.
fn read_manifest(path: &Path) -> Option<toml::Table> {
    std::fs::read_to_string(path).ok()?.parse().ok()
}

/// The strings of a TOML array (anything else is skipped).
fn string_list(value: Option<&toml::Value>) -> impl Iterator<Item = &str> {
    value
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(toml::Value::as_str)
}

/// The directories a `members` entry names: a plain path, or a pattern whose components may
/// hold `*` and `?` (as in `crates/*`), matched against the directories that exist.
fn expand_member(root: &Path, member: &str) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    for part in member.split('/').filter(|p| !p.is_empty() && *p != ".") {
        let mut next = Vec::new();
        for dir in &dirs {
            if part.contains(['*', '?']) {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                let mut matched: Vec<PathBuf> = entries
                    .filter_map(Result::ok)
                    .filter(|e| e.path().is_dir())
                    .filter(|e| e.file_name().to_str().is_some_and(|n| glob_match(part, n)))
                    .map(|e| e.path())
                    .collect();
                matched.sort();
                next.extend(matched);
            } else {
                next.push(dir.join(part));
            }
        }
        dirs = next;
    }
    dirs.iter()
        .map(|d| normalize(d))
        .filter(|d| d.join("Cargo.toml").is_file())
        .collect()
}

/// Whether `name` matches `pattern`, where `*` is any run of characters and `?` any one.
fn glob_match(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == '?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// The package's name and the target's root file when the package in `dir` (manifest
/// `manifest`) has a `kind` target called `name`: declared (`[[bin]]` / `[[example]]`, with its
/// `path` or the conventional one) or found by cargo's conventions (`src/main.rs`,
/// `src/bin/<name>.rs`, `src/bin/<name>/main.rs`, `examples/<name>.rs`,
/// `examples/<name>/main.rs`) unless `autobins` / `autoexamples` is off.
fn package_with_target(
    dir: &Path,
    manifest: &toml::Table,
    name: &str,
    kind: TargetKind,
) -> Option<(String, PathBuf)> {
    let package = manifest.get("package")?.as_table()?;
    let package_name = package.get("name")?.as_str()?;
    let (section, auto_key) = match kind {
        TargetKind::Bin => ("bin", "autobins"),
        TargetKind::Example => ("example", "autoexamples"),
    };
    let conventional = || -> Option<PathBuf> {
        let candidates = match kind {
            TargetKind::Bin => vec![
                (package_name == name).then(|| dir.join("src/main.rs")),
                Some(dir.join("src/bin").join(format!("{name}.rs"))),
                Some(dir.join("src/bin").join(name).join("main.rs")),
            ],
            TargetKind::Example => vec![
                Some(dir.join("examples").join(format!("{name}.rs"))),
                Some(dir.join("examples").join(name).join("main.rs")),
            ],
        };
        candidates.into_iter().flatten().find(|p| p.is_file())
    };
    let declared = manifest
        .get(section)
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .find(|t| t.get("name").and_then(toml::Value::as_str) == Some(name));
    if let Some(target) = declared {
        let root = match target.get("path").and_then(toml::Value::as_str) {
            Some(path) => normalize(&dir.join(path)),
            None => conventional()?,
        };
        return Some((package_name.to_owned(), root));
    }
    if package.get(auto_key).and_then(toml::Value::as_bool) == Some(false) {
        return None;
    }
    conventional().map(|root| (package_name.to_owned(), root))
}

/// The source files cargo compiles for a target whose root file is `target_root`: the root and
/// the modules it declares (`mod name;`, `#[path = ".."]` honoured, `#[cfg(test)]` modules left
/// out), recursively; then, when the target names the package's library crate (`use my_lib::..`,
/// `my_lib::f()`), the library's root and its modules. Not the package's other binaries,
/// examples or tests. A file that cannot be read or parsed is listed (the linter reports it) and
/// not followed.
pub(crate) fn module_tree(
    dir: &Path,
    manifest: &toml::Table,
    package: &str,
    target_root: &Path,
) -> Vec<PathBuf> {
    let mut files = Vec::new();
    collect_modules(target_root, true, &mut files);
    let lib = manifest.get("lib").and_then(toml::Value::as_table);
    let lib_root = match lib
        .and_then(|l| l.get("path"))
        .and_then(toml::Value::as_str)
    {
        Some(path) => normalize(&dir.join(path)),
        None => dir.join("src/lib.rs"),
    };
    let lib_name = lib
        .and_then(|l| l.get("name"))
        .and_then(toml::Value::as_str)
        .map_or_else(|| package.replace('-', "_"), str::to_owned);
    if lib_root.is_file() && !files.contains(&lib_root) {
        let uses_lib = files
            .iter()
            .any(|f| std::fs::read_to_string(f).is_ok_and(|text| names_crate(&text, &lib_name)));
        if uses_lib {
            collect_modules(&lib_root, true, &mut files);
        }
    }
    files
}

/// Whether `text` refers to the crate `name` by a path (`name::`), as a `use` or a call does.
fn names_crate(text: &str, name: &str) -> bool {
    let needle = format!("{name}::");
    text.match_indices(&needle).any(|(at, _)| {
        !text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
    })
}

/// Adds `file` and the files of the modules it declares to `out`, depth first. A crate root
/// (`root`) or a `mod.rs` declares its modules beside it; `a.rs` declares them in `a/`.
fn collect_modules(file: &Path, root: bool, out: &mut Vec<PathBuf>) {
    if out.iter().any(|f| f == file) || out.len() > 10_000 {
        return;
    }
    out.push(file.to_path_buf());
    let Ok(text) = std::fs::read_to_string(file) else {
        return;
    };
    let Ok(ast) = syn::parse_file(&text) else {
        return;
    };
    let parent = file.parent().unwrap_or(Path::new("."));
    let module_dir = if root || file.file_name().is_some_and(|n| n == "mod.rs") {
        parent.to_path_buf()
    } else {
        parent.join(file.file_stem().unwrap_or_default())
    };
    modules_in(&ast.items, parent, &module_dir, out);
}

fn modules_in(items: &[syn::Item], file_dir: &Path, module_dir: &Path, out: &mut Vec<PathBuf>) {
    for item in items {
        let syn::Item::Mod(m) = item else {
            continue;
        };
        if is_cfg_test(&m.attrs) {
            // Compiled only into the test harness, not the program that ran.
            continue;
        }
        let name = m.ident.to_string();
        let name = name.strip_prefix("r#").unwrap_or(&name);
        let path_attr = m.attrs.iter().find_map(|a| {
            if !a.path().is_ident("path") {
                return None;
            }
            let syn::Meta::NameValue(nv) = &a.meta else {
                return None;
            };
            match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            }
        });
        match &m.content {
            Some((_, inner)) => {
                // An inline module: its `mod x;` items live in a directory named after it.
                let dir = match &path_attr {
                    Some(p) => file_dir.join(p),
                    None => module_dir.join(name),
                };
                modules_in(inner, &dir, &dir, out);
            }
            None => {
                let candidates = match &path_attr {
                    Some(p) => vec![file_dir.join(p)],
                    None => vec![
                        module_dir.join(format!("{name}.rs")),
                        module_dir.join(name).join("mod.rs"),
                    ],
                };
                if let Some(found) = candidates.iter().find(|p| p.is_file()) {
                    collect_modules(&normalize(found), false, out);
                }
            }
        }
    }
}

/// Whether the attributes hold `#[cfg(test)]`.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[cfg(unix)]
    fn write_exe(path: &Path) {
        use std::os::unix::fs::PermissionsExt as _;
        write(path, "#!/bin/sh\n");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A workspace with a root package, a glob member with a declared bin, a member with
    /// `src/bin/*` and examples, and an excluded directory.
    fn workspace() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(
            &root.join("Cargo.toml"),
            "[package]\nname = \"top\"\n\n[workspace]\nmembers = [\"crates/*\", \"tools\"]\n\
             exclude = [\"crates/skipped\"]\n",
        );
        write(&root.join("src/main.rs"), "fn main() {}\n");
        write(
            &root.join("crates/kernels/Cargo.toml"),
            "[package]\nname = \"my-kernels\"\n\n[[bin]]\nname = \"train\"\npath = \"src/train.rs\"\n",
        );
        write(
            &root.join("crates/skipped/Cargo.toml"),
            "[package]\nname = \"skipped\"\n\n[[bin]]\nname = \"hidden\"\n",
        );
        write(
            &root.join("tools/Cargo.toml"),
            "[package]\nname = \"tools\"\n",
        );
        write(&root.join("tools/src/bin/gen.rs"), "fn main() {}\n");
        write(&root.join("tools/src/bin/serve/main.rs"), "fn main() {}\n");
        write(&root.join("tools/examples/demo.rs"), "fn main() {}\n");
        tmp
    }

    fn found(exe: &Path) -> Option<(PathBuf, String)> {
        crate_for_executable(exe).map(|f| (f.dir, f.package))
    }

    #[test]
    fn declared_bin_in_a_glob_member() {
        let tmp = workspace();
        let root = tmp.path();
        let kernels = root.join("crates/kernels");
        for exe in [
            "target/release/train",
            "target/debug/train",
            "target/x86_64-unknown-linux-gnu/release/train",
        ] {
            assert_eq!(
                found(&root.join(exe)),
                Some((kernels.clone(), "my-kernels".to_owned())),
                "{exe}"
            );
        }
    }

    #[test]
    fn conventional_bins_and_examples() {
        let tmp = workspace();
        let root = tmp.path();
        let tools = Some((root.join("tools"), "tools".to_owned()));
        assert_eq!(found(&root.join("target/debug/gen")), tools);
        assert_eq!(found(&root.join("target/debug/serve")), tools);
        assert_eq!(found(&root.join("target/debug/examples/demo")), tools);
        assert_eq!(
            found(&root.join("target/debug/top")),
            Some((root.to_path_buf(), "top".to_owned()))
        );
        // An example name is not a bin, and a bin name is not an example.
        assert_eq!(found(&root.join("target/debug/demo")), None);
        assert_eq!(found(&root.join("target/debug/examples/gen")), None);
    }

    #[test]
    fn unknown_names_excluded_members_and_non_target_dirs_give_nothing() {
        let tmp = workspace();
        let root = tmp.path();
        assert_eq!(found(&root.join("target/debug/nope")), None);
        assert_eq!(found(&root.join("target/debug/hidden")), None);
        assert_eq!(found(&root.join("build/debug/train")), None);
        assert_eq!(found(Path::new("/bin/true")), None);
        assert_eq!(found(Path::new("train")), None);
    }

    #[test]
    fn a_broken_manifest_gives_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        write(&tmp.path().join("Cargo.toml"), "[package\nname = ");
        assert_eq!(found(&tmp.path().join("target/debug/x")), None);
    }

    #[cfg(unix)]
    #[test]
    fn programs_resolve_through_path_and_relative_paths() {
        let tmp = workspace();
        let root = tmp.path();
        let exe = root.join("target/release/train");
        write_exe(&exe);
        let path_var =
            std::env::join_paths([Path::new("/nonexistent"), &root.join("target/release")])
                .unwrap();
        let by_path = find_crate(OsStr::new("train"), Some(&path_var), Path::new("/")).unwrap();
        assert_eq!(by_path.package, "my-kernels");
        assert_eq!(by_path.executable, exe);
        let relative =
            find_crate(OsStr::new("./target/../target/release/train"), None, root).unwrap();
        assert_eq!(relative.dir, root.join("crates/kernels"));
        assert_eq!(
            relative.describe(root),
            "lint: crates/kernels/src/train.rs (package my-kernels, from target/release/train)"
        );
        assert_eq!(find_crate(OsStr::new("train"), None, root), None);
        assert_eq!(
            find_crate(OsStr::new("missing"), Some(&path_var), root),
            None
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_outside_target_is_followed() {
        let tmp = workspace();
        let root = tmp.path();
        let exe = root.join("target/debug/gen");
        write_exe(&exe);
        let link = root.join("bin-gen");
        std::os::unix::fs::symlink(&exe, &link).unwrap();
        let found = find_crate(OsStr::new("bin-gen"), None, root);
        assert_eq!(found, None, "not on PATH, no slash");
        let found = find_crate(link.as_os_str(), None, root).unwrap();
        assert_eq!(found.package, "tools");
    }

    #[cfg(unix)]
    #[test]
    fn a_target_dir_elsewhere_is_read_against_the_workspace_of_cwd() {
        let tmp = workspace();
        let root = tmp.path();
        let shared = tempfile::tempdir().unwrap();
        let exe = shared.path().join("release/train");
        write_exe(&exe);
        let example = shared.path().join("debug/examples/demo");
        write_exe(&example);
        // Not marked as a cargo target directory yet: nothing.
        assert_eq!(find_crate(exe.as_os_str(), None, root), None);
        write(
            &shared.path().join("CACHEDIR.TAG"),
            "Signature: 8a477f597d28d172789f06886806bc55\n",
        );
        write(&shared.path().join(".rustc_info.json"), "{}");
        let found = find_crate(exe.as_os_str(), None, root).unwrap();
        assert_eq!(
            (found.dir, found.package.as_str()),
            (root.join("crates/kernels"), "my-kernels")
        );
        // From inside a member, the member first, then the workspace above it.
        let found = find_crate(example.as_os_str(), None, &root.join("tools/src")).unwrap();
        assert_eq!(
            (found.dir, found.package.as_str()),
            (root.join("tools"), "tools")
        );
        let found = find_crate(exe.as_os_str(), None, &root.join("tools")).unwrap();
        assert_eq!(found.package, "my-kernels");
        // Outside any workspace: nothing.
        assert_eq!(find_crate(exe.as_os_str(), None, shared.path()), None);
    }

    #[test]
    fn the_target_that_ran_is_linted_as_cargo_compiles_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(
            &root.join("Cargo.toml"),
            "[package]\nname = \"my-app\"\n\n[[bin]]\nname = \"custom\"\npath = \"tools/custom.rs\"\n",
        );
        // The lib, with a module of its own and one only tests compile.
        write(
            &root.join("src/lib.rs"),
            "pub mod model;\n#[cfg(test)]\nmod tests;\n",
        );
        write(&root.join("src/model.rs"), "pub fn f() {}\n");
        write(&root.join("src/tests.rs"), "\n");
        // The main bin: modules beside it, nested ones in a directory, `#[path]`, an inline
        // module with a file module inside, and the lib used by name.
        write(
            &root.join("src/main.rs"),
            "mod data;\nmod net;\n#[path = \"extra/odd_name.rs\"]\nmod odd;\n\
             mod inline { mod deep; }\nfn main() { my_app::model::f(); }\n",
        );
        write(&root.join("src/data.rs"), "mod shards;\n");
        write(&root.join("src/data/shards.rs"), "\n");
        write(&root.join("src/net/mod.rs"), "mod layer;\n");
        write(&root.join("src/net/layer.rs"), "\n");
        write(&root.join("src/extra/odd_name.rs"), "\n");
        write(&root.join("src/inline/deep.rs"), "\n");
        // Other binaries of the package: never linted with the one that ran.
        write(
            &root.join("src/bin/other.rs"),
            "mod helper;\nfn main() {}\n",
        );
        write(&root.join("src/bin/helper.rs"), "\n");
        write(&root.join("tools/custom.rs"), "fn main() {}\n");
        let files = |exe: &str| -> Vec<String> {
            crate_for_executable(&root.join(exe))
                .unwrap()
                .files
                .iter()
                .map(|f| f.strip_prefix(root).unwrap().display().to_string())
                .collect()
        };
        assert_eq!(
            files("target/debug/my-app"),
            [
                "src/main.rs",
                "src/data.rs",
                "src/data/shards.rs",
                "src/net/mod.rs",
                "src/net/layer.rs",
                "src/extra/odd_name.rs",
                "src/inline/deep.rs",
                "src/lib.rs",
                "src/model.rs",
            ]
        );
        // A bin that does not use the lib: its own tree only.
        assert_eq!(
            files("target/debug/other"),
            ["src/bin/other.rs", "src/bin/helper.rs"]
        );
        assert_eq!(files("target/release/custom"), ["tools/custom.rs"]);
        // The lib's name counts only as the first segment of a path.
        assert!(names_crate("use my_app::x;", "my_app"));
        assert!(!names_crate("use not_my_app::x;", "my_app"));
        assert!(!names_crate("use other::my_app::x;", "my_app"));
    }

    #[test]
    fn glob_patterns() {
        assert!(glob_match("*", "kernels"));
        assert!(glob_match("k*s", "kernels"));
        assert!(glob_match("k?rnels", "kernels"));
        assert!(glob_match("*-cli", "perfkit-cli"));
        assert!(!glob_match("k*x", "kernels"));
        assert!(!glob_match("?", ""));
    }
}
