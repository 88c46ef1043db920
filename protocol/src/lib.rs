//! Hira's wire protocol, shared by the guest driver, the host daemon and the API server.
//!
//! - [`frame`]: the fixed 24-byte frame header, frame kinds, data-window spans, and the
//!   limits every decoder enforces.
//! - [`codec`]: a little-endian writer and a bounds-checked reader for frame payloads.
//! - [`handshake`]: the `Hello` a guest opens with and the `Welcome` it gets back.
//! - [`opencl`]: object kinds, opcodes (derived from `api/opencl.api`), and the table of
//!   info queries whose values carry object handles.
//! - [`sizes`]: size computations both ends must agree on (image pixels, rectangles).
//! - `unix` (feature `unix`): sending and receiving frames with a file descriptor
//!   (the data window) over Unix sockets.
//! - `ring` (feature `unix`): the host-local data plane, two byte rings in shared
//!   memory between a guest and its API server.
//! - `usage` (feature `unix`): a session's counters, kept by its API server in a page
//!   the daemon reads.
//!
//! The format is described in `docs/protocol.md`.

pub mod codec;
pub mod frame;
pub mod handshake;
pub mod opencl;
#[cfg(feature = "unix")]
pub mod ring;
pub mod sizes;
#[cfg(feature = "unix")]
pub mod unix;
#[cfg(feature = "unix")]
pub mod usage;

pub use codec::{DecodeError, Reader, Writer};
pub use frame::{FrameError, FrameHeader, FrameKind, Span};
