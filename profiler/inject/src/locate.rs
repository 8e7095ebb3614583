//! Finding libcupti, and reading its version without a GPU.
//!
//! CUPTI ships in three usual places: the CUDA toolkit (`$CUDA_HOME/extras/CUPTI/lib64`,
//! `/usr/local/cuda*/extras/CUPTI/lib64`), distribution packages (found through `ldconfig`),
//! and Python wheels (`nvidia-cuda-cupti`: `site-packages/nvidia/cu13/lib` for 13.x,
//! `site-packages/nvidia/cuda_cupti/lib` for 12.x). [`search`] looks in all of them, in a
//! documented order, and remembers every place it looked so a failure can say where.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable naming the libcupti file to use (skips the search).
pub const CUPTI_PATH_ENV: &str = "PERFKIT_CUPTI_PATH";

/// Where the search looks, taken from the environment (kept separate so tests can give their own).
#[derive(Debug, Clone, Default)]
pub struct SearchEnv {
    /// `PERFKIT_CUPTI_PATH`.
    pub explicit: Option<PathBuf>,
    /// `CUDA_HOME`, `CUDA_PATH`, `CUDA_ROOT` (in that order, those set).
    pub cuda_roots: Vec<PathBuf>,
    /// Directories of `LD_LIBRARY_PATH`.
    pub ld_library_path: Vec<PathBuf>,
    /// Python site-packages directories to look in for `nvidia-cuda-cupti` wheels.
    pub site_packages: Vec<PathBuf>,
    /// Root under which `/usr/local/cuda*`, `/opt/cuda` and the system library directories
    /// are searched (`/` normally; a temporary directory in tests).
    pub root: PathBuf,
    /// Whether to ask `ldconfig -p` too.
    pub use_ldconfig: bool,
}

impl SearchEnv {
    /// The environment of this process: the variables above, the site-packages of
    /// `$VIRTUAL_ENV`, `$CONDA_PREFIX` and `~/.local`, root `/`, ldconfig on.
    pub fn from_process() -> SearchEnv {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let mut site = Vec::new();
        for prefix in [var("VIRTUAL_ENV"), var("CONDA_PREFIX")]
            .into_iter()
            .flatten()
            .chain(var("HOME").map(|h| Path::new(&h).join(".local").into_os_string()))
        {
            site.extend(python_site_dirs(Path::new(&prefix)));
        }
        SearchEnv {
            explicit: var(CUPTI_PATH_ENV).map(PathBuf::from),
            cuda_roots: ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
                .iter()
                .filter_map(|k| var(k).map(PathBuf::from))
                .collect(),
            ld_library_path: var("LD_LIBRARY_PATH")
                .map(|v| std::env::split_paths(&v).collect())
                .unwrap_or_default(),
            site_packages: site,
            root: PathBuf::from("/"),
            use_ldconfig: true,
        }
    }

    /// Adds the site-packages directories of a Python interpreter (asks it; nothing is added
    /// when it cannot be run). Used when the profiled program is a Python script.
    pub fn add_python(&mut self, python: &Path) {
        let out = Command::new(python)
            .args([
                "-c",
                "import site,sys;print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]+sys.path))",
            ])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        let Ok(out) = out else { return };
        if !out.status.success() {
            return;
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let p = PathBuf::from(line.trim());
            if p.is_dir()
                && (p.ends_with("site-packages") || p.ends_with("dist-packages"))
                && !self.site_packages.contains(&p)
            {
                self.site_packages.push(p);
            }
        }
    }
}

/// `lib/python3*/site-packages` (and `dist-packages`) under a prefix.
fn python_site_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(prefix.join("lib")) else {
        return out;
    };
    let mut names: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    names.sort();
    for d in names {
        let is_py = d
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("python3"));
        if is_py {
            for sub in ["site-packages", "dist-packages"] {
                if d.join(sub).is_dir() {
                    out.push(d.join(sub));
                }
            }
        }
    }
    out
}

/// Result of a search: the library found (if any) and every place looked at, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchReport {
    /// The libcupti file chosen.
    pub found: Option<PathBuf>,
    /// Directories (or files) examined, in order, with what pointed there.
    pub looked: Vec<(PathBuf, &'static str)>,
}

impl SearchReport {
    /// The places looked at, one per line (for error messages).
    pub fn looked_lines(&self) -> String {
        self.looked
            .iter()
            .map(|(p, why)| format!("  {} ({why})", p.display()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The libcupti file in `dir`: `libcupti.so.<major>` of the highest major, else `libcupti.so`.
fn cupti_in(dir: &Path) -> Option<PathBuf> {
    let rd = std::fs::read_dir(dir).ok()?;
    let mut best: Option<(u32, PathBuf)> = None;
    let mut plain = None;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = e.path();
        if name == "libcupti.so" {
            plain = Some(path);
            continue;
        }
        // libcupti.so.13, libcupti.so.13.0.48, libcupti.so.2025.3.0: rank by the first number.
        let Some(rest) = name.strip_prefix("libcupti.so.") else {
            continue;
        };
        let Some(first) = rest.split('.').next().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // Year-style versions (2024.x) belong to CUDA 12 packages: rank them below 13.
        let rank = if first >= 1000 { 12 } else { first };
        if best
            .as_ref()
            .is_none_or(|(r, p)| rank > *r || (rank == *r && path < *p))
        {
            best = Some((rank, path));
        }
    }
    best.map(|(_, p)| p).or(plain)
}

/// `/usr/local/cuda*` directories under `root`, `cuda` first then newest version first.
fn local_cuda_dirs(root: &Path) -> Vec<PathBuf> {
    let base = root.join("usr/local");
    let Ok(rd) = std::fs::read_dir(&base) else {
        return Vec::new();
    };
    let mut dirs: Vec<(Vec<u32>, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.to_string();
            let ver = if n == "cuda" {
                vec![u32::MAX]
            } else {
                n.strip_prefix("cuda-")?
                    .split('.')
                    .map(|x| x.parse().ok())
                    .collect::<Option<Vec<u32>>>()?
            };
            Some((ver, e.path()))
        })
        .collect();
    dirs.sort_by(|a, b| b.0.cmp(&a.0));
    dirs.into_iter().map(|(_, p)| p).collect()
}

/// Paths `ldconfig -p` lists for libcupti.
fn ldconfig_paths() -> Vec<PathBuf> {
    let Ok(out) = Command::new("ldconfig")
        .arg("-p")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .or_else(|_| Command::new("/sbin/ldconfig").arg("-p").output())
    else {
        return Vec::new();
    };
    parse_ldconfig(&String::from_utf8_lossy(&out.stdout))
}

/// The libcupti paths in `ldconfig -p` output.
pub fn parse_ldconfig(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter(|l| l.trim_start().starts_with("libcupti.so"))
        .filter_map(|l| l.split("=>").nth(1))
        .map(|p| PathBuf::from(p.trim()))
        .collect()
}

/// Searches for libcupti, in order: `PERFKIT_CUPTI_PATH`; each CUDA root's `extras/CUPTI/lib64`,
/// `lib64` and `targets/*/lib`; `LD_LIBRARY_PATH`; the Python wheels in the site-packages
/// directories (`nvidia/cu13/lib`, then `nvidia/cuda_cupti/lib`); `/usr/local/cuda*` (newest
/// first) and `/opt/cuda`; the system library directories; `ldconfig -p`.
pub fn search(env: &SearchEnv) -> SearchReport {
    let mut looked: Vec<(PathBuf, &'static str)> = Vec::new();
    let mut found = None;
    fn look(
        looked: &mut Vec<(PathBuf, &'static str)>,
        dir: PathBuf,
        why: &'static str,
        found: &mut Option<PathBuf>,
    ) {
        if found.is_some() || looked.iter().any(|(p, _)| *p == dir) {
            return;
        }
        *found = cupti_in(&dir);
        looked.push((dir, why));
    }
    let mut try_dir = |dir: PathBuf, why: &'static str, found: &mut Option<PathBuf>| {
        look(&mut looked, dir, why, found)
    };
    if let Some(p) = &env.explicit {
        looked.push((p.clone(), "PERFKIT_CUPTI_PATH"));
        if p.is_file() {
            return SearchReport {
                found: Some(p.clone()),
                looked,
            };
        }
        if p.is_dir() {
            let f = cupti_in(p);
            return SearchReport { found: f, looked };
        }
        // An explicit path that does not exist is an answer too: do not guess past it.
        return SearchReport {
            found: None,
            looked,
        };
    }
    for r in &env.cuda_roots {
        try_dir(r.join("extras/CUPTI/lib64"), "CUDA_HOME", &mut found);
        try_dir(r.join("lib64"), "CUDA_HOME", &mut found);
        try_dir(r.join("targets/x86_64-linux/lib"), "CUDA_HOME", &mut found);
        try_dir(r.join("targets/sbsa-linux/lib"), "CUDA_HOME", &mut found);
    }
    for d in &env.ld_library_path {
        try_dir(d.clone(), "LD_LIBRARY_PATH", &mut found);
    }
    for s in &env.site_packages {
        try_dir(
            s.join("nvidia/cu13/lib"),
            "python wheel nvidia-cuda-cupti",
            &mut found,
        );
        try_dir(
            s.join("nvidia/cuda_cupti/lib"),
            "python wheel nvidia-cuda-cupti",
            &mut found,
        );
    }
    let mut roots = local_cuda_dirs(&env.root);
    roots.push(env.root.join("opt/cuda"));
    for r in roots {
        try_dir(r.join("extras/CUPTI/lib64"), "CUDA toolkit", &mut found);
        try_dir(r.join("lib64"), "CUDA toolkit", &mut found);
    }
    for d in [
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
        "usr/lib64",
        "usr/lib",
    ] {
        try_dir(env.root.join(d), "system libraries", &mut found);
    }
    if env.use_ldconfig && found.is_none() {
        looked.push((PathBuf::from("ldconfig -p"), "ld.so cache"));
        if let Some(p) = ldconfig_paths().into_iter().find(|p| p.is_file()) {
            found = Some(p);
        }
    }
    SearchReport { found, looked }
}

/// Why a libcupti could not be probed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// dlopen failed.
    #[error("cannot load {path}: {source}")]
    Load {
        /// The file.
        path: PathBuf,
        /// The loader's error.
        source: libloading::Error,
    },
    /// The library has no `cuptiGetVersion`.
    #[error("{path} is not a CUPTI library (no cuptiGetVersion): {source}")]
    NotCupti {
        /// The file.
        path: PathBuf,
        /// The loader's error.
        source: libloading::Error,
    },
    /// `cuptiGetVersion` returned an error code (CUPTI 13 initialises against the driver even
    /// for this call: 999 `CUPTI_ERROR_UNKNOWN` is what it returns when no driver is installed).
    #[error("{path}: cuptiGetVersion failed with CUPTI error {code}{}", if *code == 999 { " (CUPTI could not initialise: is a CUDA driver installed?)" } else { "" })]
    Call {
        /// The file.
        path: PathBuf,
        /// The `CUptiResult` value.
        code: u32,
    },
}

/// Loads the libcupti at `path` and returns its `cuptiGetVersion` (a `CUPTI_API_VERSION`
/// value). Needs no GPU; without a driver library (`libcuda.so.1`) CUPTI 13.5 fails this call
/// ([`ProbeError::Call`] with code 999) while CUPTI 13.0 answers it (and fails later, at
/// `cuptiSubscribe`): a version read here does not mean a driver is there. [`elf_soname`]
/// gives the major version without loading anything.
pub fn probe_version(path: &Path) -> Result<u32, ProbeError> {
    // SAFETY: loading libcupti runs its initialisers, which touch no driver state.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|source| ProbeError::Load {
        path: path.to_path_buf(),
        source,
    })?;
    type GetVersion = unsafe extern "C" fn(*mut u32) -> u32;
    // SAFETY: cuptiGetVersion has this signature in every CUPTI (cupti_version.h).
    let f: libloading::Symbol<'_, GetVersion> =
        unsafe { lib.get(b"cuptiGetVersion\0") }.map_err(|source| ProbeError::NotCupti {
            path: path.to_path_buf(),
            source,
        })?;
    let mut v = 0u32;
    // SAFETY: a valid out-pointer.
    let code = unsafe { f(&mut v) };
    if code != 0 {
        return Err(ProbeError::Call {
            path: path.to_path_buf(),
            code,
        });
    }
    // Keep the library loaded: unloading CUPTI is not supported by NVIDIA and some versions
    // crash in their destructors when dlclose'd early.
    std::mem::forget(lib);
    Ok(v)
}

/// The `DT_SONAME` of an ELF64 little-endian shared library (`libcupti.so.13`), read from the
/// file without loading it. None when the file is not such a library or has no soname.
pub fn elf_soname(path: &Path) -> Option<String> {
    let data = std::fs::read(path).ok()?;
    let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(data.get(o..o + 8)?.try_into().ok()?));
    // ELF magic, 64-bit, little-endian.
    if data.get(0..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let shentsize = usize::from(u16_at(0x3a)?);
    let shnum = usize::from(u16_at(0x3c)?);
    let section = |i: usize| -> Option<(u32, usize, usize, u32)> {
        let b = shoff.checked_add(i.checked_mul(shentsize)?)?;
        Some((
            u32_at(b + 4)?,                           // sh_type
            usize::try_from(u64_at(b + 0x18)?).ok()?, // sh_offset
            usize::try_from(u64_at(b + 0x20)?).ok()?, // sh_size
            u32_at(b + 0x28)?,                        // sh_link
        ))
    };
    const SHT_DYNAMIC: u32 = 6;
    const DT_NULL: u64 = 0;
    const DT_SONAME: u64 = 14;
    for i in 0..shnum {
        let (ty, off, size, link) = section(i)?;
        if ty != SHT_DYNAMIC {
            continue;
        }
        let (_, str_off, str_size, _) = section(usize::try_from(link).ok()?)?;
        let mut at = off;
        while at + 16 <= off.checked_add(size)? {
            let tag = u64_at(at)?;
            if tag == DT_NULL {
                break;
            }
            if tag == DT_SONAME {
                let name_at = usize::try_from(u64_at(at + 8)?).ok()?;
                let strtab = data.get(str_off..str_off.checked_add(str_size)?)?;
                let rest = strtab.get(name_at..)?;
                let end = rest.iter().position(|b| *b == 0)?;
                return Some(String::from_utf8_lossy(&rest[..end]).into_owned());
            }
            at += 16;
        }
    }
    None
}

/// The major version in a libcupti soname (`libcupti.so.13` -> 13), None for other forms.
pub fn soname_major(soname: &str) -> Option<u32> {
    soname
        .strip_prefix("libcupti.so.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// `LD_LIBRARY_PATH` with `dir` in front (what a child needs to find the chosen libcupti by name).
pub fn ld_library_path_with(dir: &Path, current: Option<OsString>) -> OsString {
    let mut parts = vec![dir.to_path_buf()];
    if let Some(cur) = current {
        parts.extend(std::env::split_paths(&cur).filter(|p| p != dir));
    }
    std::env::join_paths(parts).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    fn env(root: &Path) -> SearchEnv {
        SearchEnv {
            root: root.to_path_buf(),
            ..SearchEnv::default()
        }
    }

    #[test]
    fn nothing_found_lists_every_place() {
        let t = tempfile::tempdir().unwrap();
        let r = search(&env(t.path()));
        assert_eq!(r.found, None);
        let lines = r.looked_lines();
        assert!(
            lines.contains("usr/lib/x86_64-linux-gnu (system libraries)"),
            "{lines}"
        );
        assert!(
            lines.contains("opt/cuda/extras/CUPTI/lib64 (CUDA toolkit)"),
            "{lines}"
        );
    }

    #[test]
    fn cuda_home_comes_before_local_cuda() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("toolkit");
        touch(&home.join("extras/CUPTI/lib64/libcupti.so.13"));
        touch(
            &t.path()
                .join("usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"),
        );
        let mut e = env(t.path());
        e.cuda_roots = vec![home.clone()];
        let r = search(&e);
        assert_eq!(
            r.found,
            Some(home.join("extras/CUPTI/lib64/libcupti.so.13"))
        );
        assert_eq!(r.looked.len(), 1);
    }

    #[test]
    fn newest_local_cuda_first() {
        let t = tempfile::tempdir().unwrap();
        for v in ["cuda-12.4", "cuda-13.0", "cuda-13.1"] {
            touch(
                &t.path()
                    .join(format!("usr/local/{v}/extras/CUPTI/lib64/libcupti.so.13")),
            );
        }
        let r = search(&env(t.path()));
        let found = r.found.unwrap();
        assert!(found.to_string_lossy().contains("cuda-13.1"), "{found:?}");
    }

    #[test]
    fn python_wheel_layouts() {
        let t = tempfile::tempdir().unwrap();
        let site = t.path().join("venv/lib/python3.11/site-packages");
        touch(&site.join("nvidia/cuda_cupti/lib/libcupti.so.12"));
        touch(&site.join("nvidia/cu13/lib/libcupti.so.13"));
        let mut e = env(t.path());
        e.site_packages = python_site_dirs(&t.path().join("venv"));
        assert_eq!(e.site_packages, vec![site.clone()]);
        let r = search(&e);
        assert_eq!(r.found, Some(site.join("nvidia/cu13/lib/libcupti.so.13")));
    }

    #[test]
    fn highest_major_in_a_directory() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("lib");
        for n in [
            "libcupti.so",
            "libcupti.so.2024.1.0",
            "libcupti.so.13",
            "libcupti_static.a",
        ] {
            touch(&d.join(n));
        }
        assert_eq!(cupti_in(&d), Some(d.join("libcupti.so.13")));
        std::fs::remove_file(d.join("libcupti.so.13")).unwrap();
        assert_eq!(cupti_in(&d), Some(d.join("libcupti.so.2024.1.0")));
    }

    #[test]
    fn explicit_path_wins_and_is_not_second_guessed() {
        let t = tempfile::tempdir().unwrap();
        touch(
            &t.path()
                .join("usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"),
        );
        let mut e = env(t.path());
        e.explicit = Some(t.path().join("missing/libcupti.so.13"));
        let r = search(&e);
        assert_eq!(r.found, None);
        assert_eq!(r.looked.len(), 1);
        assert_eq!(r.looked[0].1, "PERFKIT_CUPTI_PATH");
    }

    #[test]
    fn parses_ldconfig_output() {
        let text = "1234 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcupti.so.13 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcupti.so.13\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n";
        assert_eq!(
            parse_ldconfig(text),
            vec![PathBuf::from("/usr/lib/x86_64-linux-gnu/libcupti.so.13")]
        );
    }

    #[test]
    fn probe_of_a_non_library_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("libcupti.so.13");
        std::fs::write(&p, b"not an ELF file").unwrap();
        let e = probe_version(&p).unwrap_err();
        assert!(matches!(e, ProbeError::Load { .. }), "{e}");
        assert!(e.to_string().contains("libcupti.so.13"), "{e}");
    }

    #[test]
    fn soname_of_real_libraries() {
        // The test executable's own C library has a soname like libc.so.6.
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/libc.so.6",
            "/usr/lib/libc.so.6",
        ]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .expect("a libc.so.6");
        assert_eq!(elf_soname(libc).as_deref(), Some("libc.so.6"));
        let t = tempfile::tempdir().unwrap();
        let junk = t.path().join("junk.so");
        std::fs::write(&junk, b"\x7fELF\x02\x01 truncated").unwrap();
        assert_eq!(elf_soname(&junk), None);
        assert_eq!(soname_major("libcupti.so.13"), Some(13));
        assert_eq!(soname_major("libcupti.so.2024.1.0"), Some(2024));
        assert_eq!(soname_major("libc.so.6"), None);
    }

    #[test]
    fn ld_library_path_puts_dir_first_once() {
        let v = ld_library_path_with(Path::new("/a"), Some(OsString::from("/b:/a:/c")));
        assert_eq!(v, OsString::from("/a:/b:/c"));
        assert_eq!(
            ld_library_path_with(Path::new("/a"), None),
            OsString::from("/a")
        );
    }
}
