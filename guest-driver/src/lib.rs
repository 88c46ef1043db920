//! The guest end of Hira's transport.
//!
//! - [`conn`]: one connection per guest process to the host daemon, shared by all the
//!   process's threads. Each thread calls on its own channel; calls from different
//!   threads may be in flight together. Replies are demultiplexed leader/follower
//!   style: whichever waiting thread holds the read side reads the next frame and
//!   hands it to its owner, so a single-threaded caller reads its own reply with no
//!   extra thread hop.
//! - [`window`]: the shared data window, a memfd the host maps, with a first-fit
//!   allocator for bulk transfers.
//! - [`endpoint`]: where the host is (`HIRA_SOCKET`, default [`endpoint::DEFAULT_SOCKET`]).
//! - [`settings`]: every `HIRA_*` variable the guest libraries read, read once.
//! - [`logger`], [`reply`]: the shims' own logger and reply reader.

pub mod borrowed;
pub mod conn;
pub mod endpoint;
pub mod logger;
pub mod reply;
pub mod settings;
pub mod window;

pub use borrowed::{BORROW_MIN, Borrowed};
pub use conn::{Connection, Delivery, Frame, TransportError, set_output_sink};
pub use window::{Window, WindowRegion};
