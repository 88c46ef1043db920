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

pub mod client;
pub mod forward;
pub mod gpu_host;
pub mod pump;
pub mod tls;

/// What a VM host sends first on a session's TLS connection, then [`PROTOCOL`] (two
/// bytes, little-endian), then its VM's name (one byte of length, then the name); the
/// session's frames follow, starting with the guest's `Hello`.
pub const PREAMBLE_MAGIC: [u8; 8] = *b"HIRA-VMH";

/// What a host sends first to hand over a suspended session: then [`PROTOCOL`], the
/// tenant (one byte of length, `PEER:VM`), the token (16 bytes), the snapshot's length
/// (8 bytes, little-endian) and the snapshot. The answer is one line: `parked`, or
/// why not.
pub const PARK: [u8; 8] = *b"HIRA-PRK";

/// What a host sends first to ask what a GPU host can take: then [`PROTOCOL`]. The
/// answer is one line of JSON, a [`Capacity`].
pub const CAPACITY: [u8; 8] = *b"HIRA-CAP";

/// How a GPU host that handed a session over names, in the `MOVED` error its guest
/// gets, the GPU host that keeps it now; the guest's VM host reads it and tells its
/// guest to reconnect where it did.
pub const MOVED_TO: &str = "gpu-host:";

/// A VM's placement across the configuration's GPU hosts, by what each can take,
/// with this host as the fallback.
pub const AUTO: &str = "auto";

/// What a GPU host can take now, as it answers [`CAPACITY`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Capacity {
    /// It is being drained: it takes no new sessions.
    pub draining: bool,
    /// Its live sessions.
    pub sessions: usize,
    /// The shares of its VMs that have live sessions, summed: the weight it divides
    /// its device time by.
    pub busy_shares: u64,
    /// Device memory its sessions hold, in bytes.
    pub mem_held: u64,
}

impl Capacity {
    /// Orders GPU hosts for a new session: least shares busy, then least memory held.
    pub fn key(&self) -> (u64, u64) {
        (self.busy_shares, self.mem_held)
    }
}

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

/// Socket buffer for a session's local stream on either host (the guest's connection
/// on a VM host, the socket pair to the session on a GPU host), each way.
const LOCAL_BUFFER: usize = 4 << 20;

/// Widens a session's local stream so that a bulk transfer streams through the hops
/// rather than stopping at each one: the default (about 208 KiB) holds less than
/// one of the pump's reads, so every hop waited for the next to empty it.
pub(crate) fn widen(s: &std::os::unix::net::UnixStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    // Capped by net.core.wmem_max and rmem_max: where those are lower the stream
    // keeps a smaller buffer, which costs throughput, not correctness.
    let _ = setsockopt(s, sockopt::SndBuf, &LOCAL_BUFFER);
    let _ = setsockopt(s, sockopt::RcvBuf, &LOCAL_BUFFER);
}
