//! `#include` resolution on the guest side.
//!
//! A program's headers are the application's files, not the host's: before a build
//! the shim finds every file the sources include (quoted and angle forms, searched in
//! the working directory, then the including file's directory for quoted forms, then
//! each `-I` directory, recursively) and ships them with the build. The API server
//! builds with them in a private directory that mirrors the guest's paths and holds
//! nothing else, so that the host compiler resolves exactly what the guest's would.
//!
//! The scan is textual and ignores conditional compilation: a header under a false
//! `#if` is shipped too, which costs bytes but never changes the build. An include
//! whose name comes from a macro is not resolved (the compiler then reports it missing,
//! naming the file).

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

/// Most headers shipped with one build.
pub const MAX_FILES: usize = 1024;
/// Most header bytes shipped with one build.
pub const MAX_BYTES: usize = 32 << 20;

/// What a build ships: the guest's working directory and the headers, by absolute
/// guest path.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BuildFiles {
    pub cwd: String,
    pub files: Vec<(String, Vec<u8>)>,
}

impl BuildFiles {
    /// The wire form: `u32` count, then per file a path and its bytes (each a `u32`
    /// length and the bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = hira_protocol::Writer::new();
        w.u32(self.files.len() as u32);
        for (path, bytes) in &self.files {
            w.bytes(path.as_bytes()).bytes(bytes);
        }
        w.into_vec()
    }
}

/// The `-I` directories of a build-options string, in order (`-I dir` and `-Idir`).
pub fn include_dirs(options: &str) -> Vec<String> {
    let mut dirs = Vec::new();
    let mut words = options.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-I" {
            if let Some(d) = words.next() {
                dirs.push(d.to_string());
            }
        } else if let Some(d) = w.strip_prefix("-I") {
            dirs.push(d.to_string());
        }
    }
    dirs
}

/// The names included by `text`: (name, quoted).
fn includes(text: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix('#') else {
            continue;
        };
        let Some(rest) = rest.trim_start().strip_prefix("include") else {
            continue;
        };
        let rest = rest.trim_start();
        let (close, quoted) = match rest.chars().next() {
            Some('"') => ('"', true),
            Some('<') => ('>', false),
            _ => continue,
        };
        if let Some(end) = rest[1..].find(close) {
            out.push((rest[1..1 + end].to_string(), quoted));
        }
    }
    out
}

/// `p` made absolute against `cwd`, with `.` and `..` folded (lexically, as the
/// compiler's search does).
fn absolute(cwd: &Path, p: &Path) -> PathBuf {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Finds the headers `sources` include, built with `options` in `cwd`.
pub fn resolve(sources: &[String], options: &str, cwd: &Path) -> BuildFiles {
    let dirs: Vec<PathBuf> = include_dirs(options)
        .iter()
        .map(|d| absolute(cwd, Path::new(d)))
        .collect();
    let mut found = BuildFiles {
        cwd: cwd.to_string_lossy().into_owned(),
        files: Vec::new(),
    };
    let mut seen = HashSet::new();
    let mut bytes = 0usize;
    // (text, directory of the file it came from; None for a program source)
    let mut work: Vec<(String, Option<PathBuf>)> =
        sources.iter().map(|s| (s.clone(), None)).collect();
    while let Some((text, dir)) = work.pop() {
        for (name, quoted) in includes(&text) {
            let name = Path::new(&name);
            // A quoted name is looked for next to the file that includes it first; the
            // host driver then searches the working directory, then each -I directory.
            let mut candidates = Vec::new();
            if let (true, Some(d)) = (quoted, &dir) {
                candidates.push(absolute(d, name));
            }
            candidates.push(absolute(cwd, name));
            if !name.is_absolute() {
                candidates.extend(dirs.iter().map(|d| absolute(d, name)));
            }
            let Some(path) = candidates.into_iter().find(|p| p.is_file()) else {
                continue;
            };
            if !seen.insert(path.clone()) {
                continue;
            }
            let Ok(content) = std::fs::read(&path) else {
                continue;
            };
            if found.files.len() >= MAX_FILES || bytes + content.len() > MAX_BYTES {
                log::warn!("headers beyond {MAX_FILES} files or {MAX_BYTES} bytes are not shipped");
                return found;
            }
            bytes += content.len();
            let parent = path.parent().map(Path::to_path_buf);
            work.push((String::from_utf8_lossy(&content).into_owned(), parent));
            found
                .files
                .push((path.to_string_lossy().into_owned(), content));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_dirs_take_both_spellings() {
        assert_eq!(
            include_dirs("-cl-fast-relaxed-math -I inc -Isub/dir -DX=1"),
            vec!["inc", "sub/dir"]
        );
    }

    #[test]
    fn includes_are_found_in_both_forms_with_spacing() {
        let t = "#include \"a.h\"\n  #  include <b/c.h>\n// #include \"no\"\n#define X 1\n";
        assert_eq!(
            includes(t),
            vec![("a.h".to_string(), true), ("b/c.h".to_string(), false)]
        );
    }

    #[test]
    fn headers_resolve_against_cwd_including_file_and_include_dirs() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(root.join("inc")).unwrap();
        std::fs::write(root.join("main.h"), "#include \"sub/s.h\"\n").unwrap();
        std::fs::write(root.join("sub/s.h"), "#include \"deep.h\"\n").unwrap();
        std::fs::write(root.join("sub/deep.h"), "#define DEEP 1\n").unwrap();
        std::fs::write(root.join("inc/lib.h"), "#define LIB 2\n").unwrap();
        let src = "#include \"main.h\"\n#include <lib.h>\n#include \"missing.h\"\n".to_string();
        let b = resolve(&[src], "-I inc", root);
        let mut names: Vec<_> = b
            .files
            .iter()
            .map(|(p, _)| {
                Path::new(p)
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        assert_eq!(names, vec!["inc/lib.h", "main.h", "sub/deep.h", "sub/s.h"]);
    }

    #[test]
    fn a_header_included_twice_or_in_a_cycle_is_shipped_once() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.h"), "#include \"b.h\"\n").unwrap();
        std::fs::write(d.path().join("b.h"), "#include \"a.h\"\n").unwrap();
        let src = "#include \"a.h\"\n#include \"a.h\"\n".to_string();
        assert_eq!(resolve(&[src], "", d.path()).files.len(), 2);
    }

    #[test]
    fn dot_dot_is_folded_lexically() {
        assert_eq!(
            absolute(Path::new("/w/x"), Path::new("../y/./z.h")),
            PathBuf::from("/w/y/z.h")
        );
    }
}
