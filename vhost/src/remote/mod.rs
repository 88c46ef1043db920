//! Sessions across hosts: a VM host places a VM's sessions on a GPU host, which
//! serves them with its own sandboxed API servers and its own policy, over mutual
//! TLS (`docs/remote.md`).
//!
//! - `tls`: certificates, keys, the CA and names pinned on both ends;
//! - `gpu_host`: the GPU host's listener, which authenticates a VM host and runs
//!   each of its sessions as a tenant `PEER:VM`;
//! - `forward`: the VM host's end of a placed session;
//! - `pump`: the bytes of one session between a local stream and its TLS connection.
//!
//! A placed session is relayed: its guest gets no data window and no rings, so every
//! frame, bulk data included, travels in the session's TLS stream, and the GPU host
//! checks each one as it checks a local relayed session's.

pub mod forward;
pub mod gpu_host;
pub mod pump;
pub mod tls;

/// What a VM host sends first on a session's TLS connection, then [`PROTOCOL`] (two
/// bytes, little-endian), then its VM's name (one byte of length, then the name).
pub const PREAMBLE_MAGIC: [u8; 8] = *b"HIRA-VMH";

/// The version of the exchange between hosts.
pub const PROTOCOL: u16 = 1;

/// Bounds how long a connection to another host may go unanswered: TCP keepalive
/// probes a silent peer, and the kernel drops the connection once data or probes go
/// unacknowledged for `timeout` (`TCP_USER_TIMEOUT`). A host that died, or a network
/// that split, therefore ends its sessions within about `timeout`, with no thread of
/// Hira's waking to send heartbeats.
pub fn bound_silence(
    tcp: &std::net::TcpStream,
    timeout: std::time::Duration,
) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    let probe = u32::try_from((timeout.as_secs() / 3).max(1)).unwrap_or(u32::MAX);
    let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    setsockopt(tcp, sockopt::KeepAlive, &true)?;
    setsockopt(tcp, sockopt::TcpKeepIdle, &probe)?;
    setsockopt(tcp, sockopt::TcpKeepInterval, &probe)?;
    setsockopt(tcp, sockopt::TcpKeepCount, &3)?;
    setsockopt(tcp, sockopt::TcpUserTimeout, &ms)?;
    Ok(())
}

/// A VM host's preamble for VM `vm`.
pub fn preamble(vm: &str) -> Vec<u8> {
    let mut p = PREAMBLE_MAGIC.to_vec();
    p.extend_from_slice(&PROTOCOL.to_le_bytes());
    p.push(u8::try_from(vm.len()).unwrap_or(u8::MAX));
    p.extend_from_slice(vm.as_bytes());
    p
}
