//! Hira's wire protocol, shared by the guest driver, the host daemon and the API server.
//!
//! - [`frame`]: the fixed 24-byte frame header, frame kinds, data-window spans, and the
//!   limits every decoder enforces.
//! - [`codec`]: a little-endian writer and a bounds-checked reader for frame payloads.
//! - [`handshake`]: the `Hello` a guest opens with and the `Welcome` it gets back.
//! - [`api`]: what every remoted API shares: the shape of an opcode table, argument
//!   tags, object ids. The wire knows no particular API: each is a description in
//!   `api/` and a crate of its own under `apis/` (`hira-apis-opencl`), and the daemon
//!   sees them all through the registry (`hira-apis-registry`).
//! - [`resend`]: relayed streams that outlive their connection being cut (bytes kept
//!   until acknowledged, sent again on reconnecting).
//! - `unix` (feature `unix`): sending and receiving frames with a file descriptor
//!   (the data window) over Unix sockets.
//! - `ring` (feature `unix`): the layout of the data plane's region, two byte rings in
//!   shared memory between a guest and its API server (a memfd host-local, the
//!   session's slot of its VM's shared window in a VM); the ends that use it, and how
//!   they wait, are the `hira-ring` crate.
//! - `shm` (feature `unix`): memfds sealed as their users need, what a process checks
//!   of a file another passed it, and mappings that unmap themselves.
//! - `usage` (feature `unix`): a session's counters, kept by its API server in a page
//!   the daemon reads.
//!
//! The format is described in `docs/protocol.md`.

pub mod api;
pub mod codec;
pub mod frame;
pub mod handshake;
pub mod resend;
#[cfg(feature = "unix")]
pub mod ring;
#[cfg(feature = "unix")]
pub mod shm;
#[cfg(feature = "unix")]
pub mod unix;
#[cfg(feature = "unix")]
pub mod usage;

pub use codec::{DecodeError, Reader, Writer};

/// The chunk in which a guest streams a write it copies into the data window around
/// the caches, and the size from which the daemon has API servers' `memcpy` copy
/// around the caches too (`HIRA_SERVER_NT_KB`'s default): the two sides agree on it,
/// so that both copies of such a chunk take the same path.
pub const STREAM_NT_CHUNK: usize = 8 << 20;
/// The bytes per second of the host library's output (a kernel's `printf`) a session
/// may send its guest unless the daemon is told otherwise (`--output-rate`).
pub const DEFAULT_OUTPUT_RATE: u64 = 1 << 20;
/// The bytes of it a session may hold for its guest at once, and its burst above the
/// rate (`--output-buffer`).
pub const DEFAULT_OUTPUT_BUFFER: u64 = 1 << 20;
pub use frame::{FrameError, FrameHeader, FrameKind, Span};
