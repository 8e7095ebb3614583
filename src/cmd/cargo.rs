//! `cargo perfkit lint` and `cargo perfkit profile`: the packages to lint come from `cargo
//! metadata`, the program to profile from `cargo build`'s JSON messages; the rest is
//! `perfkit lint` and `perfkit profile`.

use std::ffi::OsString;
use std::io::{BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context as _, bail};
use cargo_metadata::{Message, Metadata, MetadataCommand, Package, Target, TargetKind};

use super::lint::LintArgs;
use super::profile::{ProfileArgs, ProfileOptions};

/// The packages to work on, as cargo selects them.
#[derive(Debug, Clone, clap::Args)]
pub struct PackageSelection {
    /// Path to Cargo.toml [default: the nearest one above the current directory]
    #[arg(long, value_name = "PATH")]
    pub manifest_path: Option<PathBuf>,
    /// Package(s) to work on [default: the package of the manifest, or the workspace's
    /// default members when the manifest is the workspace root]
    #[arg(long, short = 'p', value_name = "SPEC")]
    pub package: Vec<String>,
    /// Every member of the workspace
    #[arg(long, conflicts_with = "package")]
    pub workspace: bool,
}

/// Arguments of `cargo perfkit lint`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Without PATH, lints the source directories of the selected packages' \
library, binaries and examples (as `cargo metadata` lists them). Exit status as for `perfkit \
lint`."
)]
pub struct CargoLintArgs {
    #[command(flatten)]
    pub packages: PackageSelection,
    #[command(flatten)]
    pub lint: LintArgs,
}

/// Arguments of `cargo perfkit profile`.
#[derive(Debug, clap::Args)]
#[command(
    override_usage = "cargo perfkit profile [--bin NAME | --example NAME] [--release | --profile P] \
                      [--features F] [-p SPEC] [PROFILE OPTIONS] [-- ARGS...]",
    after_help = "Builds with `cargo build --message-format=json-render-diagnostics`, takes the \
executable cargo reports (the one binary built, else the package's `default-run`), profiles it as `perfkit profile` does and lints its package. Exit status: \
the program's (as for `perfkit profile`), cargo's when the build fails, 2 for perfkit's own errors."
)]
pub struct CargoProfileArgs {
    /// Build and profile this binary
    #[arg(long, value_name = "NAME", conflicts_with = "example")]
    pub bin: Option<String>,
    /// Build and profile this example
    #[arg(long, value_name = "NAME")]
    pub example: Option<String>,
    /// Build with the release profile
    #[arg(long, short = 'r', conflicts_with = "cargo_profile")]
    pub release: bool,
    /// Build with this cargo profile
    #[arg(long = "profile", id = "cargo_profile", value_name = "PROFILE-NAME")]
    pub cargo_profile: Option<String>,
    /// Features to activate (space- or comma-separated, as cargo takes them)
    #[arg(long, short = 'F', value_name = "FEATURES")]
    pub features: Vec<String>,
    /// Activate every feature
    #[arg(long)]
    pub all_features: bool,
    /// Do not activate the default feature
    #[arg(long)]
    pub no_default_features: bool,
    /// Package of the binary or example
    #[arg(long, short = 'p', value_name = "SPEC")]
    pub package: Option<String>,
    /// Path to Cargo.toml
    #[arg(long, value_name = "PATH")]
    pub manifest_path: Option<PathBuf>,
    #[command(flatten)]
    pub options: ProfileOptions,
    /// Arguments for the program
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<OsString>,
}

/// Runs `cargo perfkit lint`.
pub fn lint(mut args: CargoLintArgs) -> anyhow::Result<ExitCode> {
    if args.lint.paths.is_empty() {
        let metadata = metadata(args.packages.manifest_path.as_deref())?;
        let packages = select_packages(&metadata, &args.packages)?;
        args.lint.paths = packages
            .iter()
            .flat_map(|package| source_dirs(package))
            .collect();
        args.lint.paths = outermost(std::mem::take(&mut args.lint.paths));
        if args.lint.paths.is_empty() {
            bail!("the selected packages have no library, binary or example sources to lint");
        }
    }
    super::lint::run(args.lint)
}

/// Runs `cargo perfkit profile`.
pub fn profile(args: CargoProfileArgs) -> anyhow::Result<ExitCode> {
    let built = match build(&args)? {
        Ok(built) => built,
        Err(code) => return Ok(code),
    };
    let mut options = args.options.clone();
    if options.lint.is_empty() && !options.no_lint {
        let metadata = metadata(Some(built.manifest_path.as_path()))?;
        if let Some(package) = metadata
            .packages
            .iter()
            .find(|p| p.manifest_path.as_std_path() == built.manifest_path)
        {
            // Shown relative to the current directory, as the findings are.
            options.lint = outermost(source_dirs(package))
                .iter()
                .map(|dir| match perfkit_lint::output::display_path(dir) {
                    shown if shown.is_empty() => PathBuf::from("."),
                    shown => PathBuf::from(shown),
                })
                .collect();
            options.lint_source = Some(format!(
                "package {}, built by cargo as {}",
                package.name, built.target
            ));
        }
    }
    let mut command = vec![built.executable.into_os_string()];
    command.extend(args.args);
    super::profile::run(ProfileArgs { options, command })
}

/// What `cargo build` made to be profiled.
#[derive(Debug)]
struct Built {
    executable: PathBuf,
    manifest_path: PathBuf,
    /// `bin NAME` or `example NAME`.
    target: String,
}

/// Builds with cargo and finds the executable in its JSON messages. `Err(code)`: the build
/// failed (cargo said why on stderr) and perfkit exits with cargo's status.
fn build(args: &CargoProfileArgs) -> anyhow::Result<Result<Built, ExitCode>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command.args(["build", "--message-format=json-render-diagnostics"]);
    if let Some(bin) = &args.bin {
        command.args(["--bin", bin]);
    }
    if let Some(example) = &args.example {
        command.args(["--example", example]);
    }
    if args.release {
        command.arg("--release");
    }
    if let Some(profile) = &args.cargo_profile {
        command.args(["--profile", profile]);
    }
    for features in &args.features {
        command.args(["--features", features]);
    }
    if args.all_features {
        command.arg("--all-features");
    }
    if args.no_default_features {
        command.arg("--no-default-features");
    }
    if let Some(package) = &args.package {
        command.args(["--package", package]);
    }
    if let Some(manifest) = &args.manifest_path {
        command.arg("--manifest-path").arg(manifest);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot run `{}`", Path::new(&cargo).display()))?;
    let stdout = child.stdout.take().context("cargo's standard output")?;
    let mut executables: Vec<(PathBuf, PathBuf, String)> = Vec::new();
    for message in Message::parse_stream(BufReader::new(stdout)) {
        let message = message.context("cannot read cargo's messages")?;
        match message {
            Message::CompilerArtifact(artifact) => {
                let Some(executable) = artifact.executable else {
                    continue; // a library, or a build script
                };
                let Some(kind) = runnable_kind(&artifact.target) else {
                    continue;
                };
                executables.push((
                    executable.into_std_path_buf(),
                    artifact.manifest_path.into_std_path_buf(),
                    format!("{kind} {}", artifact.target.name),
                ));
            }
            // A line that is not a message (a build script printing to stdout): pass it on.
            Message::TextLine(line) => crate::eprintln_lossy!("{line}"),
            _ => {}
        }
    }
    let status = child.wait().context("cannot wait for cargo")?;
    if !status.success() {
        crate::eprintln_lossy!("perfkit: error: `cargo build` failed; nothing was profiled");
        let code = status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(101);
        return Ok(Err(ExitCode::from(code)));
    }
    let _ = std::io::stderr().flush();
    match &executables[..] {
        [] => bail!(
            "cargo built no binary{}: pass --bin NAME or --example NAME",
            args.bin
                .as_deref()
                .or(args.example.as_deref())
                .map(|n| format!(" named `{n}`"))
                .unwrap_or_default()
        ),
        [(executable, manifest_path, target)] => Ok(Ok(Built {
            executable: executable.clone(),
            manifest_path: manifest_path.clone(),
            target: target.clone(),
        })),
        several => {
            // As `cargo run`: the `default-run` binary of the one package that built them.
            let manifest = &several[0].1;
            if several.iter().all(|(_, m, _)| m == manifest)
                && let Some(default_run) = metadata(Some(manifest.as_path()))?
                    .packages
                    .iter()
                    .find(|p| p.manifest_path.as_std_path() == manifest)
                    .and_then(|p| p.default_run.clone())
                && let Some((executable, manifest_path, target)) = several
                    .iter()
                    .find(|(_, _, t)| *t == format!("bin {default_run}"))
            {
                return Ok(Ok(Built {
                    executable: executable.clone(),
                    manifest_path: manifest_path.clone(),
                    target: target.clone(),
                }));
            }
            let names: Vec<&str> = several.iter().map(|(_, _, t)| t.as_str()).collect();
            bail!(
                "cargo built several binaries ({}): pass --bin NAME or --example NAME to say which \
                 one to profile, or set `default-run` in the package",
                names.join(", ")
            )
        }
    }
}

fn runnable_kind(target: &Target) -> Option<&'static str> {
    if target.is_bin() {
        Some("bin")
    } else if target.is_example() {
        Some("example")
    } else {
        None
    }
}

/// `cargo metadata --no-deps` of the workspace around `manifest` (or the current directory).
fn metadata(manifest: Option<&Path>) -> anyhow::Result<Metadata> {
    let mut command = MetadataCommand::new();
    command.no_deps();
    if let Some(manifest) = manifest {
        command.manifest_path(manifest);
    }
    command.exec().context("`cargo metadata` failed")
}

/// The packages cargo would work on: `--package`, `--workspace`, else the manifest's package,
/// or the workspace's default members when the manifest is the workspace root's.
fn select_packages<'m>(
    metadata: &'m Metadata,
    selection: &PackageSelection,
) -> anyhow::Result<Vec<&'m Package>> {
    let members = metadata.workspace_packages();
    if selection.workspace {
        return Ok(members);
    }
    if !selection.package.is_empty() {
        return selection
            .package
            .iter()
            .map(|spec| {
                members
                    .iter()
                    .copied()
                    .find(|p| p.name.as_str() == spec || p.id.repr == *spec)
                    .with_context(|| {
                        let names: Vec<&str> = members.iter().map(|p| p.name.as_str()).collect();
                        format!(
                            "--package {spec}: no such member of the workspace (members: {})",
                            names.join(", ")
                        )
                    })
            })
            .collect();
    }
    let manifest = match &selection.manifest_path {
        Some(path) => std::path::absolute(path)
            .with_context(|| format!("--manifest-path {}", path.display()))?,
        None => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            cwd.ancestors()
                .map(|dir| dir.join("Cargo.toml"))
                .find(|path| path.is_file())
                .context("no Cargo.toml in the current directory or above it")?
        }
    };
    let root_manifest = metadata.workspace_root.join("Cargo.toml");
    if same_file(&manifest, root_manifest.as_std_path()) {
        let defaults = if metadata.workspace_default_members.is_available() {
            metadata.workspace_default_packages()
        } else {
            members.clone()
        };
        return Ok(if defaults.is_empty() {
            members
        } else {
            defaults
        });
    }
    members
        .into_iter()
        .find(|p| same_file(&manifest, p.manifest_path.as_std_path()))
        .map(|p| vec![p])
        .with_context(|| format!("{}: not a member of the workspace", manifest.display()))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The directories holding the sources of a package's library, binaries and examples (not its
/// tests, benchmarks or build script): the directory of each such target's root file.
fn source_dirs(package: &Package) -> Vec<PathBuf> {
    package
        .targets
        .iter()
        .filter(|t| {
            !t.kind.iter().any(|k| {
                matches!(
                    k,
                    TargetKind::Test | TargetKind::Bench | TargetKind::CustomBuild
                )
            })
        })
        .filter_map(|t| {
            t.src_path
                .parent()
                .map(|dir| dir.as_std_path().to_path_buf())
        })
        .collect()
}

/// `paths` without duplicates and without those inside another one, in their first order.
fn outermost(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut kept: Vec<PathBuf> = Vec::new();
    for path in paths {
        if kept.iter().any(|k| path.starts_with(k)) {
            continue;
        }
        kept.retain(|k| !k.starts_with(&path));
        kept.push(path);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::outermost;
    use std::path::PathBuf;

    #[test]
    fn nested_and_repeated_directories_are_linted_once() {
        let paths = [
            "/w/src/bin",
            "/w/src",
            "/w/examples",
            "/w/src",
            "/w/lint/src",
        ]
        .map(PathBuf::from)
        .to_vec();
        assert_eq!(
            outermost(paths),
            ["/w/src", "/w/examples", "/w/lint/src"].map(PathBuf::from)
        );
    }
}
