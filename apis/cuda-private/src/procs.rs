//! What `cuGetProcAddress` answers: which exported function serves a name at a CUDA
//! version, with the per-thread default stream or not.
//!
//! An entry point's signature changes between CUDA versions (`cuCtxGetDevice` takes
//! a context from 13.0); a program built for version V asks for the newest variant
//! not newer than V. The variants and the versions that introduced them come from
//! CUDA 13.0's `cuda*Typedefs.h` (`data/versions.txt`, made by
//! `tools/cuda-trace/versions.py`); a test checks the table against every lookup
//! NVIDIA's driver answered for the CUDA 13.0 runtime and PyTorch
//! (`data/lookups-580.txt`, traced by `tools/cuda-trace`).

use std::collections::HashMap;
use std::sync::OnceLock;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult`.
pub const SUCCESS: i32 = 0;
pub const SYMBOL_NOT_FOUND: i32 = 1;
pub const VERSION_NOT_SUFFICIENT: i32 = 2;

/// The answer to a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The exported function that serves it, e.g. `cuMemAlloc_v2`.
    Found(&'static str),
    /// The name exists only from a newer version than asked for.
    VersionNotSufficient,
    /// No such entry point.
    NotFound,
}

struct Variant {
    version: i32,
    per_thread: bool,
    symbol: &'static str,
}

fn table() -> &'static HashMap<&'static str, Vec<Variant>> {
    static TABLE: OnceLock<HashMap<&'static str, Vec<Variant>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t: HashMap<&'static str, Vec<Variant>> = HashMap::new();
        for line in include_str!("../data/versions.txt").lines() {
            let f: Vec<&'static str> = line.split_whitespace().collect();
            if line.starts_with('#') || f.len() != 4 {
                continue;
            }
            let Ok(version) = f[1].parse() else { continue };
            t.entry(f[0]).or_default().push(Variant {
                version,
                per_thread: f[2] != "-",
                symbol: f[3],
            });
        }
        t
    })
}

/// The variant of `name` a program built for CUDA `version` gets, per-thread
/// default-stream variants where `flags` asks for them and one exists.
pub fn lookup(name: &str, version: i32, flags: u64) -> Lookup {
    let Some(vs) = table().get(name) else {
        return Lookup::NotFound;
    };
    let newest = |pt: bool| {
        vs.iter()
            .filter(|v| v.per_thread == pt && v.version <= version)
            .max_by_key(|v| v.version)
    };
    let pick = if flags & PER_THREAD_DEFAULT_STREAM != 0 {
        newest(true).or_else(|| newest(false))
    } else {
        newest(false)
    };
    match pick {
        Some(v) => Lookup::Found(v.symbol),
        None => Lookup::VersionNotSufficient,
    }
}

/// Every exported function name the table knows, each once.
pub fn symbols() -> impl Iterator<Item = &'static str> {
    let mut all: Vec<&'static str> = table().values().flatten().map(|v| v.symbol).collect();
    all.sort_unstable();
    all.dedup();
    all.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lookup_the_driver_answered_resolves_to_the_same_function() {
        let mut n = 0;
        for line in include_str!("../data/lookups-580.txt").lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if line.starts_with('#') || f.len() != 4 {
                continue;
            }
            let version: i32 = f[1].parse().unwrap();
            let flags = u64::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap();
            assert_eq!(lookup(f[0], version, flags), Lookup::Found(f[3]), "{line}");
            n += 1;
        }
        assert!(n > 400, "{n} lookups");
    }

    #[test]
    fn versions_pick_the_newest_variant_not_newer_than_asked() {
        assert_eq!(
            lookup("cuCtxGetDevice", 12090, 0),
            Lookup::Found("cuCtxGetDevice")
        );
        assert_eq!(
            lookup("cuCtxGetDevice", 13000, 0),
            Lookup::Found("cuCtxGetDevice_v2")
        );
        assert_eq!(lookup("cuMemAlloc", 2000, 0), Lookup::Found("cuMemAlloc"));
        assert_eq!(
            lookup("cuLibraryLoadData", 11000, 0),
            Lookup::VersionNotSufficient
        );
        assert_eq!(lookup("cuNoSuchThing", 13000, 0), Lookup::NotFound);
        assert_eq!(
            lookup("cuLaunchKernel", 13000, PER_THREAD_DEFAULT_STREAM),
            Lookup::Found("cuLaunchKernel_ptsz")
        );
        assert_eq!(
            lookup("cuInit", 13000, PER_THREAD_DEFAULT_STREAM),
            Lookup::Found("cuInit")
        );
        assert!(symbols().any(|s| s == "cuMemcpyHtoD_v2_ptds"));
    }
}
