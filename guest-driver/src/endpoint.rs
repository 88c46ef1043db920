//! Finding the host end of the transport.

use std::path::PathBuf;

/// Unix socket of the host-local listener when `HIRA_SOCKET` is not set.
pub const DEFAULT_SOCKET: &str = "/run/hira/local.sock";

/// The socket path the guest connects to: `HIRA_SOCKET`, or [`DEFAULT_SOCKET`].
pub fn socket_path() -> PathBuf {
    std::env::var_os("HIRA_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// Bytes of shared data window to offer the host: `HIRA_WINDOW_MB` (0 disables the
/// window and sends everything inline), default 256 MiB. The memfd takes memory only
/// for the pages transfers have touched.
pub fn window_len() -> u64 {
    std::env::var("HIRA_WINDOW_MB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(256)
        .min(4096)
        * 1024
        * 1024
}

/// Transfers of at least this many bytes go through the window when one is mapped:
/// `HIRA_INLINE_MAX` bytes, default 64 KiB.
pub fn inline_max() -> usize {
    std::env::var("HIRA_INLINE_MAX")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(64 * 1024)
}

/// How long a thread waiting for a reply polls before it sleeps: `HIRA_SPIN_US`
/// microseconds, default 50 (0 disables spinning).
pub fn spin() -> std::time::Duration {
    let us = std::env::var("HIRA_SPIN_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(50)
        .min(10_000);
    std::time::Duration::from_micros(us)
}
