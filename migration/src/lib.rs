//! Migration's record-and-replay state, kept per session.
//!
//! A session's API objects are recreated elsewhere by replaying the calls that made
//! and configured them: object ids are assigned by the guest and travel in the
//! requests, so a replayed request makes the same object under the same id, and the
//! guest's handles stay valid. [`Log`] keeps exactly the calls a replay needs: those
//! that made objects still alive (or still needed by one: a kernel's program after the
//! application released it), and the latest of each setting of theirs (a kernel
//! argument set twice replays once). What a log cannot recreate — buffer and image
//! contents — goes into the [`Snapshot`] next to it, read through the API at a
//! quiesced point.
//!
//! Which calls create, retain, release and configure objects comes from the API
//! description (`hira_protocol::api::Replay`, generated from `protocol/api/*.api`),
//! not from a list per function.

pub mod log;
pub mod snapshot;

pub use log::{Entry, Log, ObjectId};
pub use snapshot::{Snapshot, SnapshotError, StandIn};
