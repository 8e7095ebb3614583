//! What `perfkit profile` calls to capture an un-instrumented program through CUPTI injection.
//!
//! ```no_run
//! use perfkit_inject::host::{InjectMode, plan};
//! let mut cmd = std::process::Command::new("python3");
//! cmd.arg("train.py");
//! match plan(InjectMode::Auto, "python3".as_ref()) {
//!     Ok(Some(p)) => p.apply(&mut cmd),         // CUDA_INJECTION64_PATH and friends
//!     Ok(None) => {}                            // instrumented program, or injection turned off
//!     Err(e) => eprintln!("perfkit: {e}"),      // says why (no driver, no libcupti: where it looked)
//! }
//! ```

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::locate::{self, ProbeError, SearchEnv};
use crate::version::{self, VersionError};

/// The variable the CUDA driver reads to load an injection library.
pub const INJECTION_ENV: &str = "CUDA_INJECTION64_PATH";
/// Overrides where the injection library is looked for.
pub const INJECT_LIB_ENV: &str = "PERFKIT_INJECT_LIB";
/// File name of the injection library.
pub const LIBRARY_NAME: &str = "libperfkit_inject.so";

/// Whether `perfkit profile` injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InjectMode {
    /// Inject when the program does not link perfkit-profiler itself and a driver is present.
    #[default]
    Auto,
    /// Always inject (`--inject`); a missing piece is an error.
    Force,
    /// Never inject (`--no-inject`).
    Off,
}

/// Everything needed to start a program with injection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectionPlan {
    /// The injection library (`libperfkit_inject.so`).
    pub library: PathBuf,
    /// The libcupti it will load.
    pub cupti: PathBuf,
    /// That libcupti's `CUPTI_API_VERSION`.
    pub cupti_version: u32,
}

impl InjectionPlan {
    /// The environment variables to give the program.
    pub fn env(&self, current_ld_library_path: Option<OsString>) -> Vec<(OsString, OsString)> {
        let mut v = vec![
            (
                OsString::from(INJECTION_ENV),
                self.library.clone().into_os_string(),
            ),
            (
                OsString::from(locate::CUPTI_PATH_ENV),
                self.cupti.clone().into_os_string(),
            ),
        ];
        if let Some(dir) = self.cupti.parent() {
            v.push((
                OsString::from("LD_LIBRARY_PATH"),
                locate::ld_library_path_with(dir, current_ld_library_path),
            ));
        }
        v
    }

    /// Sets the variables on a command (inheriting this process's `LD_LIBRARY_PATH`).
    pub fn apply(&self, cmd: &mut Command) {
        for (k, v) in self.env(std::env::var_os("LD_LIBRARY_PATH")) {
            cmd.env(k, v);
        }
    }

    /// One line for the user.
    pub fn describe(&self) -> String {
        format!(
            "capturing CUDA activity through injection (CUPTI {} at {})",
            version::describe(self.cupti_version),
            self.cupti.display()
        )
    }
}

/// Why injection cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No CUDA driver on this machine.
    #[error(
        "CUDA injection needs a CUDA driver (libcuda.so not found); the program runs without GPU capture"
    )]
    NoDriver,
    /// No libcupti anywhere.
    #[error("libcupti not found (set PERFKIT_CUPTI_PATH to the file); looked in:\n{looked}")]
    CuptiNotFound {
        /// Where the search looked, one per line.
        looked: String,
    },
    /// libcupti found but unusable.
    #[error("{0}")]
    CuptiProbe(#[from] ProbeError),
    /// libcupti of a version whose records this build cannot read.
    #[error("{path}: {source}")]
    CuptiVersion {
        /// The library.
        path: PathBuf,
        /// The version problem.
        source: VersionError,
    },
    /// The injection library itself is missing.
    #[error(
        "{LIBRARY_NAME} not found (build it with `cargo build -p perfkit-inject` or set PERFKIT_INJECT_LIB); looked in:\n{looked}"
    )]
    LibraryNotFound {
        /// Where it looked, one per line.
        looked: String,
    },
}

/// Decides whether and how to inject into `program` (`argv[0]` as the user gave it).
pub fn plan(mode: InjectMode, program: &OsStr) -> Result<Option<InjectionPlan>, PlanError> {
    if mode == InjectMode::Off {
        return Ok(None);
    }
    let exe = resolve_program(program);
    if mode == InjectMode::Auto
        && exe
            .as_deref()
            .is_some_and(|p| is_instrumented(p).unwrap_or(false))
    {
        return Ok(None);
    }
    let driver = driver_present();
    let mut env = SearchEnv::from_process();
    if let Some(p) = exe.as_deref().filter(|p| is_python(p)) {
        env.add_python(p);
    }
    plan_with(driver, &env, find_library())
}

/// Whether the CUDA driver library (`libcuda.so`) can be loaded (no driver call is made).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The decision of [`plan`] once the facts are known (separate for tests).
pub fn plan_with(
    driver_present: bool,
    env: &SearchEnv,
    library: Result<PathBuf, Vec<PathBuf>>,
) -> Result<Option<InjectionPlan>, PlanError> {
    if !driver_present {
        return Err(PlanError::NoDriver);
    }
    let library = library.map_err(|looked| PlanError::LibraryNotFound {
        looked: lines(&looked),
    })?;
    let report = locate::search(env);
    let Some(cupti) = report.found.clone() else {
        return Err(PlanError::CuptiNotFound {
            looked: report.looked_lines(),
        });
    };
    // The soname tells the major version without loading the library: refuse a CUPTI 12 or a
    // future major before loading it into this process.
    if let Some(major) = locate::elf_soname(&cupti)
        .as_deref()
        .and_then(locate::soname_major)
    {
        version::check_major(major).map_err(|source| PlanError::CuptiVersion {
            path: cupti.clone(),
            source,
        })?;
    }
    let v = locate::probe_version(&cupti)?;
    version::check(v).map_err(|source| PlanError::CuptiVersion {
        path: cupti.clone(),
        source,
    })?;
    Ok(Some(InjectionPlan {
        library,
        cupti,
        cupti_version: v,
    }))
}

fn lines(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| format!("  {}", p.display()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Finds `libperfkit_inject.so`: `$PERFKIT_INJECT_LIB`, then next to the running executable,
/// its `deps/` and `../lib/` (a cargo target directory or an installed layout). Err lists the
/// places looked at.
pub fn find_library() -> Result<PathBuf, Vec<PathBuf>> {
    let mut looked = Vec::new();
    if let Some(p) = std::env::var_os(INJECT_LIB_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p);
        return Err(looked);
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        // Test binaries live in target/<profile>/deps: look one level up as well.
        let mut dirs = vec![dir.clone(), dir.join("deps"), dir.join("../lib")];
        if dir.ends_with("deps")
            && let Some(up) = dir.parent()
        {
            dirs.insert(1, up.to_path_buf());
        }
        for d in dirs {
            let p = d.join(LIBRARY_NAME);
            if p.is_file() {
                return Ok(p);
            }
            looked.push(p);
        }
    }
    Err(looked)
}

/// The executable a command name runs: a path as given, else the first match on `PATH`.
pub fn resolve_program(program: &OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
}

fn is_python(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("python"))
}

/// The marker every program that links perfkit-profiler carries (the name of the variable its
/// `init()` reads).
const MARKER: &[u8] = perfkit_profiler::TRACE_ENV.as_bytes();

/// Whether the executable at `path` links perfkit-profiler (it then records its own GPU work
/// and needs no injection). Reads the file in chunks looking for the profiler's marker string.
pub fn is_instrumented(path: &Path) -> std::io::Result<bool> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let keep = MARKER.len() - 1;
    let mut filled = 0usize;
    loop {
        let n = f.read(&mut buf[filled..])?;
        if n == 0 {
            return Ok(false);
        }
        let end = filled + n;
        if buf[..end].windows(MARKER.len()).any(|w| w == MARKER) {
            return Ok(true);
        }
        let tail = end.saturating_sub(keep);
        buf.copy_within(tail..end, 0);
        filled = end - tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_never_injects() {
        assert!(
            plan(InjectMode::Off, OsStr::new("python3"))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn no_driver_is_explained() {
        let t = tempfile::tempdir().unwrap();
        let env = SearchEnv {
            root: t.path().to_path_buf(),
            ..SearchEnv::default()
        };
        let e = plan_with(false, &env, Ok(PathBuf::from("libperfkit_inject.so"))).unwrap_err();
        assert!(matches!(e, PlanError::NoDriver));
        assert!(e.to_string().contains("needs a CUDA driver"), "{e}");
    }

    #[test]
    fn missing_pieces_say_where_they_were_looked_for() {
        let t = tempfile::tempdir().unwrap();
        let env = SearchEnv {
            root: t.path().to_path_buf(),
            ..SearchEnv::default()
        };
        let e = plan_with(true, &env, Err(vec![PathBuf::from("target/debug/x.so")])).unwrap_err();
        assert!(e.to_string().contains("  target/debug/x.so"), "{e}");
        let e = plan_with(true, &env, Ok(PathBuf::from("lib.so"))).unwrap_err();
        assert!(matches!(e, PlanError::CuptiNotFound { .. }));
        assert!(e.to_string().contains("extras/CUPTI/lib64"), "{e}");
    }

    #[test]
    fn env_of_a_plan() {
        let p = InjectionPlan {
            library: PathBuf::from("/opt/pk/libperfkit_inject.so"),
            cupti: PathBuf::from("/cuda/extras/CUPTI/lib64/libcupti.so.13"),
            cupti_version: 130500,
        };
        let env = p.env(Some(OsString::from("/usr/lib")));
        assert_eq!(
            env,
            vec![
                (INJECTION_ENV.into(), "/opt/pk/libperfkit_inject.so".into()),
                (
                    "PERFKIT_CUPTI_PATH".into(),
                    "/cuda/extras/CUPTI/lib64/libcupti.so.13".into()
                ),
                (
                    "LD_LIBRARY_PATH".into(),
                    "/cuda/extras/CUPTI/lib64:/usr/lib".into()
                ),
            ]
        );
        assert!(p.describe().contains("CUPTI 13.5.0"), "{}", p.describe());
    }

    #[test]
    fn instrumented_programs_are_recognised() {
        let t = tempfile::tempdir().unwrap();
        let yes = t.path().join("yes");
        // The marker straddles the 1 MiB read boundary.
        let mut data = vec![b'x'; (1 << 20) - 5];
        data.extend_from_slice(MARKER);
        data.extend_from_slice(b"tail");
        std::fs::write(&yes, &data).unwrap();
        assert!(is_instrumented(&yes).unwrap());
        let no = t.path().join("no");
        std::fs::write(&no, b"PERFKIT_TRAC plain program").unwrap();
        assert!(!is_instrumented(&no).unwrap());
        assert!(is_instrumented(&t.path().join("missing")).is_err());
    }

    #[test]
    fn resolves_programs_on_path() {
        let sh = resolve_program(OsStr::new("sh")).expect("sh on PATH");
        assert!(sh.is_absolute());
        assert_eq!(resolve_program(OsStr::new("./definitely/not/here")), None);
    }
}
