//! Every `HIRA_*` variable the guest libraries read, in one place: read once, at the
//! first use (never while a library loads: the API server sets `HIRA_DISABLE` in its
//! own process before loading vendor libraries), typed, with defaults and bounds. A
//! value that does not read is reported once through the shim's logger and the
//! default stands.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// What the guest libraries were told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `HIRA_DISABLE` set: the library serves nothing (the API server sets it so that
    /// a Hira ICD installed on the host never calls itself).
    pub disabled: bool,
    /// `HIRA_SOCKET`: the host-local listener (else vsock in a VM, then the default
    /// socket).
    pub socket: Option<PathBuf>,
    /// `HIRA_VSOCK_PORT`, default 5571.
    pub vsock_port: u32,
    /// `HIRA_WINDOW_MB` in bytes, default 256 MiB, at most 4 GiB (0: no window).
    pub window_len: u64,
    /// `HIRA_INLINE_MAX`: transfers of at least this many bytes use the window.
    pub inline_max: usize,
    /// `HIRA_SPIN_US`, default 1 ms, at most 10 ms.
    pub spin: Duration,
    /// `HIRA_RINGS`, default on; `0` keeps every frame on the socket.
    pub rings: bool,
    /// `HIRA_RESUME_SECS`, default 60 s.
    pub resume: Duration,
    /// `HIRA_SYNC` set (to anything but `0`): every call waits for its reply.
    pub sync: bool,
    /// `HIRA_IDENTITY=tagged`: the platform names Hira.
    pub identity_tagged: bool,
    /// `HIRA_STATS`: statistics at exit, to stderr (`1`) or into a file.
    pub stats: Option<String>,
    /// `HIRA_STREAM_MIN_KB` in bytes (the OpenCL shim's default: 8 MiB).
    pub stream_min: Option<usize>,
    /// `HIRA_STREAM_CHUNK_KB` in bytes.
    pub stream_chunk: Option<usize>,
    /// `HIRA_STREAM_DEPTH`.
    pub stream_depth: Option<usize>,
    /// `HIRA_STREAM_NT_MIN_KB` in bytes; `Some(None)`: 0, never.
    pub stream_nt_min: Option<Option<usize>>,
    /// `HIRA_STREAM_DETACH`, default on.
    pub stream_detach: bool,
    /// `HIRA_CUDA_CHUNK_KB` in bytes.
    pub cuda_chunk: Option<usize>,
    /// `HIRA_ZERO_COPY`, default on; `0`: memory objects never live in the window, so
    /// every map copies its region (the OpenCL shim's `zero_copy`).
    pub zero_copy: bool,
    /// The values that did not read, for the log.
    pub problems: Vec<String>,
}

/// The settings of this process, read at the first call.
pub fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| from_env(|k| std::env::var_os(k)))
}

/// The settings `get` gives (the environment, or a test's table).
pub fn from_env(get: impl Fn(&str) -> Option<OsString>) -> Settings {
    let mut problems = Vec::new();
    let mut text = |var: &'static str| -> Option<String> {
        let v = get(var)?;
        match v.into_string() {
            Ok(s) => Some(s),
            Err(_) => {
                problems.push(format!("{var} is not valid UTF-8; its default stands"));
                None
            }
        }
    };
    // A number, or the default with a note.
    fn number<T: std::str::FromStr>(
        problems: &mut Vec<String>,
        var: &str,
        v: Option<String>,
    ) -> Option<T> {
        let v = v?;
        match v.trim().parse::<T>() {
            Ok(n) => Some(n),
            Err(_) => {
                problems.push(format!("{var}={v:?} is not a number; its default stands"));
                None
            }
        }
    }
    let on = |v: Option<&String>| v.is_some_and(|v| v != "0");
    let disabled = get("HIRA_DISABLE").is_some();
    let socket = get("HIRA_SOCKET").map(PathBuf::from);
    let vsock_port = text("HIRA_VSOCK_PORT");
    let window_mb = text("HIRA_WINDOW_MB");
    let inline_max = text("HIRA_INLINE_MAX");
    let spin_us = text("HIRA_SPIN_US");
    let rings = text("HIRA_RINGS");
    let resume = text("HIRA_RESUME_SECS");
    let sync = text("HIRA_SYNC");
    let identity = text("HIRA_IDENTITY");
    let stats = text("HIRA_STATS");
    let stream_min = text("HIRA_STREAM_MIN_KB");
    let stream_chunk = text("HIRA_STREAM_CHUNK_KB");
    let stream_depth = text("HIRA_STREAM_DEPTH");
    let stream_nt_min = text("HIRA_STREAM_NT_MIN_KB");
    let stream_detach = text("HIRA_STREAM_DETACH");
    let cuda_chunk = text("HIRA_CUDA_CHUNK_KB");
    let zero_copy = text("HIRA_ZERO_COPY");
    let p = &mut problems;
    let kib = |n: usize| n.saturating_mul(1024);
    Settings {
        disabled,
        socket,
        vsock_port: number(p, "HIRA_VSOCK_PORT", vsock_port).unwrap_or(crate::endpoint::VSOCK_PORT),
        window_len: number::<u64>(p, "HIRA_WINDOW_MB", window_mb)
            .unwrap_or(256)
            .min(4096)
            << 20,
        inline_max: number(p, "HIRA_INLINE_MAX", inline_max).unwrap_or(64 * 1024),
        spin: Duration::from_micros(
            number::<u64>(p, "HIRA_SPIN_US", spin_us)
                .unwrap_or(1000)
                .min(10_000),
        ),
        rings: rings.as_ref().is_none_or(|v| v != "0"),
        resume: Duration::from_secs(number(p, "HIRA_RESUME_SECS", resume).unwrap_or(60)),
        sync: on(sync.as_ref()),
        identity_tagged: identity.as_deref() == Some("tagged"),
        stats: stats.filter(|v| !v.is_empty() && v != "0"),
        stream_min: number(p, "HIRA_STREAM_MIN_KB", stream_min).map(kib),
        stream_chunk: number(p, "HIRA_STREAM_CHUNK_KB", stream_chunk).map(kib),
        stream_depth: number(p, "HIRA_STREAM_DEPTH", stream_depth),
        stream_nt_min: number::<usize>(p, "HIRA_STREAM_NT_MIN_KB", stream_nt_min)
            .map(|kb| (kb != 0).then(|| kib(kb))),
        stream_detach: stream_detach.as_ref().is_none_or(|v| v != "0"),
        cuda_chunk: number(p, "HIRA_CUDA_CHUNK_KB", cuda_chunk).map(kib),
        zero_copy: zero_copy.as_ref().is_none_or(|v| v != "0"),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn with(vars: &[(&str, &str)]) -> Settings {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        from_env(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_hold_when_nothing_is_set() {
        let s = with(&[]);
        assert!(!s.disabled && !s.sync && s.rings && s.stream_detach && s.zero_copy);
        assert_eq!(s.window_len, 256 << 20);
        assert_eq!(s.inline_max, 64 << 10);
        assert_eq!(s.spin, Duration::from_millis(1));
        assert_eq!(s.resume, Duration::from_secs(60));
        assert_eq!(s.vsock_port, crate::endpoint::VSOCK_PORT);
        assert_eq!((s.stream_min, s.cuda_chunk, s.stats), (None, None, None));
        assert!(s.problems.is_empty());
    }

    #[test]
    fn values_read_with_their_bounds_and_bad_ones_are_reported() {
        let s = with(&[
            ("HIRA_WINDOW_MB", "5000"),
            ("HIRA_SPIN_US", "20000"),
            ("HIRA_RINGS", "0"),
            ("HIRA_SYNC", "0"),
            ("HIRA_DISABLE", ""),
            ("HIRA_STATS", "0"),
            ("HIRA_STREAM_NT_MIN_KB", "0"),
            ("HIRA_CUDA_CHUNK_KB", "18446744073709551615"),
            ("HIRA_INLINE_MAX", "lots"),
            ("HIRA_ZERO_COPY", "0"),
        ]);
        assert!(!s.zero_copy);
        assert_eq!(s.window_len, 4096 << 20);
        assert_eq!(s.spin, Duration::from_millis(10));
        assert!(!s.rings && !s.sync && s.disabled);
        assert_eq!(s.stats, None);
        assert_eq!(s.stream_nt_min, Some(None));
        // A huge chunk saturates rather than wrapping to a small one.
        assert_eq!(s.cuda_chunk, Some(usize::MAX));
        assert_eq!(s.inline_max, 64 << 10);
        assert_eq!(s.problems.len(), 1, "{:?}", s.problems);
        assert!(s.problems[0].contains("HIRA_INLINE_MAX"));
        let s = with(&[("HIRA_SYNC", "1"), ("HIRA_IDENTITY", "tagged")]);
        assert!(s.sync && s.identity_tagged);
    }
}
