//! Program builds with the guest's headers.
//!
//! The guest ships the headers its sources include (`hiraBuildFiles`) with their guest
//! paths. A build then runs in a private directory that mirrors those paths and holds
//! only those files: in the mirror of the guest's working directory, with `-I`
//! directories that could climb out rewritten to their mirrors, so the host compiler
//! never searches a directory the guest named on the host. Absolute `#include` names
//! are moved into the mirror too: the compiler would open them as written, so a
//! program's sources are created on the host with each `#include "/x"` (or `</x>`)
//! rewritten to the mirror's `/x` ([`rewrite_absolute_includes`]), and so are the
//! shipped headers; the guest reads its sources back as it wrote them. The mirror's
//! path is therefore fixed for the process ([`mirror_root`]); builds take turns in it.
//! It is emptied when the build returns, and its path is taken out of build logs,
//! which therefore name the guest's own paths.
//!
//! Every path is untrusted: only absolute paths of plain components are accepted
//! (no `.`, `..`, empty or NUL components), so nothing is written outside the mirror.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use hira_protocol::Reader;
use log::warn;

use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_OUT_OF_RESOURCES;
/// Most headers accepted for one build.
const MAX_FILES: u32 = 4096;
/// Most header bytes accepted for one build.
const MAX_BYTES: usize = 64 << 20;

/// Headers shipped for one program.
#[derive(Debug, Default)]
pub struct Staged {
    /// The guest's working directory, as relative components.
    cwd: PathBuf,
    files: Vec<(PathBuf, Vec<u8>)>,
}

/// An absolute guest path as components to put under the mirror.
fn relative(p: &str) -> Option<PathBuf> {
    if p.contains('\0') {
        return None;
    }
    let mut comps = Path::new(p).components();
    if comps.next() != Some(Component::RootDir) {
        return None;
    }
    let mut out = PathBuf::new();
    for c in comps {
        match c {
            Component::Normal(n) => out.push(n),
            _ => return None,
        }
    }
    Some(out)
}

/// Parses a `hiraBuildFiles` payload.
pub fn parse(cwd: &str, blob: &[u8]) -> Result<Staged, i32> {
    let cwd = relative(cwd).ok_or(CL_INVALID_VALUE)?;
    let mut r = Reader::new(blob);
    let n = r.u32().map_err(|_| CL_INVALID_VALUE)?;
    if n > MAX_FILES {
        return Err(CL_OUT_OF_RESOURCES);
    }
    let mut files = Vec::new();
    let mut bytes = 0usize;
    for _ in 0..n {
        let path = r.bytes(4096).map_err(|_| CL_INVALID_VALUE)?;
        let path = std::str::from_utf8(path).map_err(|_| CL_INVALID_VALUE)?;
        let rel = relative(path).ok_or(CL_INVALID_VALUE)?;
        if rel.as_os_str().is_empty() {
            return Err(CL_INVALID_VALUE);
        }
        let content = r.bytes(MAX_BYTES).map_err(|_| CL_INVALID_VALUE)?;
        bytes += content.len();
        if bytes > MAX_BYTES {
            return Err(CL_OUT_OF_RESOURCES);
        }
        files.push((rel, content.to_vec()));
    }
    r.finish().map_err(|_| CL_INVALID_VALUE)?;
    Ok(Staged { cwd, files })
}

/// Staged headers by host program.
#[derive(Debug, Default)]
pub struct Builds {
    staged: Mutex<HashMap<usize, Staged>>,
    /// Options the host was given, and the guest's options they stand for.
    options: Mutex<HashMap<String, String>>,
    /// Programs whose last build the guest made without [`ARG_INFO`]: whether it gave
    /// options at all (hosts differ between none and some, PoCL among them).
    without_arg_info: Mutex<HashMap<usize, bool>>,
    /// Per "options given", the kernel-argument queries the host answers with
    /// `CL_KERNEL_ARG_INFO_NOT_AVAILABLE` without [`ARG_INFO`] (bit `param - 0x1196`),
    /// found once by building a probe program that way.
    unavailable: Mutex<HashMap<bool, u8>>,
}

/// The directory this process's builds run in: under `XDG_CACHE_HOME` (set to the
/// API server's private cache by the daemon) or the temporary directory, named after
/// the process, so that API servers never share one.
pub fn mirror_root() -> &'static str {
    static ROOT: OnceLock<String> = OnceLock::new();
    ROOT.get_or_init(|| {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        base.join(format!("hira-build-{}", std::process::id()))
            .to_string_lossy()
            .into_owned()
    })
}

/// `text` with every absolute `#include` name (`"/..."` or `</...>`) moved under
/// `root`; `None` when it has none. Only the directive's name changes, so line
/// numbers stay the guest's.
pub fn rewrite_absolute_includes(text: &[u8], root: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut changed = false;
    for line in text.split_inclusive(|c| *c == b'\n') {
        let at = include_name_at(line);
        match at {
            Some(i) if line.get(i + 1) == Some(&b'/') => {
                out.extend_from_slice(&line[..=i]);
                out.extend_from_slice(root.as_bytes());
                out.extend_from_slice(&line[i + 1..]);
                changed = true;
            }
            _ => out.extend_from_slice(line),
        }
    }
    changed.then_some(out)
}

/// Where the opening `"` or `<` of an `#include` line's name is.
fn include_name_at(line: &[u8]) -> Option<usize> {
    let blank = |c: &u8| *c == b' ' || *c == b'\t';
    let mut i = line.iter().position(|c| !blank(c))?;
    if line[i] != b'#' {
        return None;
    }
    i += 1;
    i += line[i..].iter().take_while(|c| blank(c)).count();
    if !line[i..].starts_with(b"include") {
        return None;
    }
    i += "include".len();
    i += line[i..].iter().take_while(|c| blank(c)).count();
    matches!(line.get(i), Some(b'"' | b'<')).then_some(i)
}

/// `CL_PROGRAM_SOURCE` as the guest wrote it, from the rewritten host source.
pub fn guest_source(value: &mut Vec<u8>) {
    let root = mirror_root().as_bytes();
    if !value.windows(root.len()).any(|w| w == root) {
        return;
    }
    let mut out = Vec::with_capacity(value.len());
    for line in value.split_inclusive(|c| *c == b'\n') {
        match include_name_at(line) {
            Some(i) if line[i + 1..].starts_with(root) => {
                out.extend_from_slice(&line[..=i]);
                out.extend_from_slice(&line[i + 1 + root.len()..]);
            }
            _ => out.extend_from_slice(line),
        }
    }
    *value = out;
}

/// A mirror directory, removed when dropped.
struct Mirror(PathBuf);

impl Drop for Mirror {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            warn!("cannot remove build directory {}: {e}", self.0.display());
        }
    }
}

/// `options` with each `-I` directory that could leave the mirror made absolute
/// against the guest's `cwd` (lexically, so it stays inside), every other word kept.
fn rewrite_options(options: &str, cwd: &Path, root: &Path) -> String {
    let guest_cwd = Path::new("/").join(cwd);
    let mirror = |d: &str| -> String {
        let mut abs = PathBuf::from("/");
        for c in guest_cwd.join(d).components() {
            match c {
                Component::ParentDir => {
                    abs.pop();
                }
                Component::Normal(n) => abs.push(n),
                _ => {}
            }
        }
        root.join(abs.strip_prefix("/").unwrap_or(&abs))
            .to_string_lossy()
            .into_owned()
    };
    // A relative directory that does not climb is kept as written (the build runs in
    // the mirror of the working directory), so logs name it as natively.
    let dir = |d: &str| -> String {
        let climbs = Path::new(d)
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
        if climbs { mirror(d) } else { d.to_string() }
    };
    let mut out = Vec::new();
    let mut words = options.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-I" {
            if let Some(d) = words.next() {
                out.push("-I".into());
                out.push(dir(d));
            }
        } else if let Some(d) = w.strip_prefix("-I") {
            out.push("-I".into());
            out.push(dir(d));
        } else {
            out.push(w.to_string());
        }
    }
    out.join(" ")
}

/// The option that makes the host describe kernel arguments.
const ARG_INFO: &str = "-cl-kernel-arg-info";

/// `options` with [`ARG_INFO`] added if missing. The API server needs every kernel's
/// argument types to refuse guest bytes where the host would read a pointer; without
/// the option some hosts (PoCL when options are given) describe none, and pointer-sized
/// values would have to be refused for every argument.
fn with_arg_info(options: &str) -> String {
    if options.split_whitespace().any(|w| w == ARG_INFO) {
        options.to_string()
    } else if options.trim().is_empty() {
        ARG_INFO.to_string()
    } else {
        format!("{options} {ARG_INFO}")
    }
}

impl Builds {
    /// Keeps `staged` for the next build of `program`.
    pub fn stage(&self, program: usize, staged: Staged) {
        self.staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(program, staged);
    }

    /// Runs `build(options)` for `program`, with its staged headers mirrored when the
    /// guest shipped any; otherwise with the guest's options unchanged.
    pub fn run(
        &self,
        program: usize,
        options: Option<&CStr>,
        build: impl FnOnce(*const libc::c_char) -> Option<i32>,
    ) -> Option<i32> {
        let staged = self
            .staged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&program);
        let guest = options
            .map(|o| o.to_string_lossy().into_owned())
            .unwrap_or_default();
        {
            let mut w = self
                .without_arg_info
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if guest.split_whitespace().any(|o| o == ARG_INFO) {
                w.remove(&program);
            } else {
                w.insert(program, options.is_some());
            }
        }
        let Some(staged) = staged else {
            let Ok(opts) = CString::new(self.host_options(&guest, with_arg_info(&guest))) else {
                return Some(CL_INVALID_VALUE);
            };
            return build(opts.as_ptr());
        };
        // The host driver searches the working directory, as natively: the build runs
        // in the mirror of the guest's. The working directory is the process's, and
        // the mirror's path is fixed, so builds take turns.
        static TURN: Mutex<()> = Mutex::new(());
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let root = PathBuf::from(mirror_root());
        // A directory left by an earlier process of the same id goes first.
        let _ = std::fs::remove_dir_all(&root);
        if let Err(e) = std::fs::create_dir(&root) {
            warn!("cannot create build directory {}: {e}", root.display());
            return Some(CL_OUT_OF_RESOURCES);
        }
        let mirror = Mirror(root.clone());
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(root.join(&staged.cwd))?;
            for (rel, bytes) in &staged.files {
                let p = root.join(rel);
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                match rewrite_absolute_includes(bytes, mirror_root()) {
                    Some(b) => std::fs::write(p, b)?,
                    None => std::fs::write(p, bytes)?,
                }
            }
            Ok(())
        };
        if let Err(e) = write() {
            warn!("cannot write shipped headers: {e}");
            return Some(CL_OUT_OF_RESOURCES);
        }
        let host = with_arg_info(&rewrite_options(&guest, &staged.cwd, &root));
        let Ok(opts) = CString::new(self.host_options(&guest, host)) else {
            return Some(CL_INVALID_VALUE);
        };
        let before = std::env::current_dir().ok();
        if let Err(e) = std::env::set_current_dir(root.join(&staged.cwd)) {
            warn!("cannot enter the build directory: {e}");
            return Some(CL_OUT_OF_RESOURCES);
        }
        let status = build(opts.as_ptr());
        if let Some(d) = before {
            let _ = std::env::set_current_dir(d);
        }
        drop(mirror);
        status
    }

    fn host_options(&self, guest: &str, host: String) -> String {
        if host != guest {
            self.options
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(host.clone(), guest.to_string());
        }
        host
    }

    /// For a program the guest built without [`ARG_INFO`]: whether it gave options.
    pub fn built_without_arg_info(&self, program: usize) -> Option<bool> {
        self.without_arg_info
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&program)
            .copied()
    }

    /// The host's unavailable kernel-argument queries without [`ARG_INFO`] (see
    /// `unavailable`), from `probe` the first time.
    pub fn unavailable_arg_info(&self, options_given: bool, probe: impl FnOnce() -> u8) -> u8 {
        let mut u = self.unavailable.lock().unwrap_or_else(|e| e.into_inner());
        *u.entry(options_given).or_insert_with(probe)
    }

    /// `CL_PROGRAM_BUILD_OPTIONS` as the guest gave them, from what the host reports.
    pub fn guest_options(&self, value: &mut Vec<u8>) {
        let text = String::from_utf8_lossy(value);
        let host = text.trim_end_matches('\0');
        let options = self.options.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(guest) = options.get(host) {
            let mut v = guest.clone().into_bytes();
            v.push(0);
            *value = v;
        }
    }

    /// A build log with the mirror directory taken out of its paths.
    pub fn guest_log(&self, log: &mut Vec<u8>) {
        let root = mirror_root();
        let text = String::from_utf8_lossy(log);
        if text.contains(root) {
            *log = text.replace(root, "").into_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = hira_protocol::Writer::new();
        w.u32(files.len() as u32);
        for (p, b) in files {
            w.bytes(p.as_bytes()).bytes(b);
        }
        w.into_vec()
    }

    #[test]
    fn paths_that_could_leave_the_mirror_are_rejected() {
        for bad in ["/a/../../etc/x", "rel/x.h", "/", "/a\0b"] {
            assert_eq!(
                parse("/w", &payload(&[(bad, b"x")])).err(),
                Some(CL_INVALID_VALUE),
                "{bad:?}"
            );
        }
        assert!(parse("/w/../x", &payload(&[])).is_err());
        let s = parse("/w", &payload(&[("/w/inc/a.h", b"#define A")])).unwrap();
        assert_eq!(s.files[0].0, PathBuf::from("w/inc/a.h"));
    }

    #[test]
    fn include_directories_point_into_the_mirror() {
        let o = rewrite_options(
            "-DX=1 -I inc -I/abs/dir -Irel/../up -cl-std=CL3.0",
            Path::new("home/u"),
            Path::new("/m"),
        );
        assert_eq!(
            o,
            "-DX=1 -I inc -I /m/abs/dir -I /m/home/u/up -cl-std=CL3.0"
        );
        // Climbing above the root stays inside the mirror.
        assert_eq!(
            rewrite_options("-I ../../../../etc", Path::new("a"), Path::new("/m")),
            "-I /m/etc"
        );
    }

    #[test]
    fn absolute_includes_move_under_the_root_and_back() {
        let src = b"#include \"/g/a.h\"\n  #  include </g/b.h>\n#include \"rel.h\"\nint x; // #include \"/no\"\n";
        let host = rewrite_absolute_includes(src, "/R").unwrap();
        assert_eq!(
            host,
            b"#include \"/R/g/a.h\"\n  #  include </R/g/b.h>\n#include \"rel.h\"\nint x; // #include \"/no\"\n"
        );
        assert_eq!(
            rewrite_absolute_includes(b"#include \"rel.h\"\n", "/R"),
            None
        );
        assert_eq!(rewrite_absolute_includes(b"", "/R"), None);
        // The guest reads back what it wrote.
        let mut back = rewrite_absolute_includes(src, mirror_root()).unwrap();
        guest_source(&mut back);
        assert_eq!(back, src);
        let mut untouched = b"#include \"/g/a.h\"\n".to_vec();
        guest_source(&mut untouched);
        assert_eq!(untouched, b"#include \"/g/a.h\"\n");
    }

    #[test]
    fn shipped_headers_with_absolute_includes_resolve_in_the_mirror() {
        let b = Builds::default();
        let staged = parse(
            "/w",
            &payload(&[
                ("/w/h.h", b"#include \"/abs/i.h\"\n"),
                ("/abs/i.h", b"#define I 1"),
            ]),
        )
        .unwrap();
        b.stage(8, staged);
        let status = b.run(8, None, |_| {
            let h = std::fs::read_to_string("h.h").unwrap();
            let name = h.trim().trim_start_matches("#include ").trim_matches('"');
            assert!(name.starts_with(mirror_root()), "{h}");
            assert_eq!(std::fs::read(name).unwrap(), b"#define I 1");
            Some(0)
        });
        assert_eq!(status, Some(0));
    }

    #[test]
    fn a_build_sees_the_headers_and_they_are_gone_after() {
        let b = Builds::default();
        let staged = parse("/w", &payload(&[("/w/h.h", b"#define V 3")])).unwrap();
        b.stage(7, staged);
        let mut seen_root = String::new();
        let status = b.run(7, None, |_| {
            // The build runs in the mirror of the guest's working directory.
            let here = std::env::current_dir().unwrap();
            assert_eq!(std::fs::read(here.join("h.h")).unwrap(), b"#define V 3");
            seen_root = here.to_string_lossy().into_owned();
            Some(0)
        });
        assert_eq!(status, Some(0));
        assert!(!Path::new(&seen_root).exists());
        let mut opts = b"-cl-kernel-arg-info\0".to_vec();
        b.guest_options(&mut opts);
        assert_eq!(opts, b"\0", "the guest sees the options it gave");
        let mut log = format!("{seen_root}/h.h:1: warning").into_bytes();
        b.guest_log(&mut log);
        assert_eq!(log, b"/w/h.h:1: warning");
    }
}
