//! The host-API abstraction: one implementation per remoted API.

use hira_protocol::{DecodeError, Span, Writer};
use thiserror::Error;

use crate::window::WindowMap;

/// Why a call produced no ordinary reply.
#[derive(Debug, Error)]
pub enum Fail {
    /// The call fails with this API status; the reply carries only the status.
    #[error("call failed with status {0}")]
    Status(i32),
    /// The payload does not decode.
    #[error("malformed arguments")]
    Decode(#[from] DecodeError),
    /// The opcode names no function of this API.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    /// The guest broke a protocol rule (reused an id, named a missing span...).
    #[error("protocol violation: {0}")]
    Protocol(String),
}

/// Why a session of an API cannot be served here at all.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("this API server has no backend for {0}")]
    NoBackend(String),
    #[error("no usable host OpenCL: cannot load libOpenCL: {0}")]
    NoOpenCl(String),
    #[error("no usable host OpenCL: the host has no OpenCL platform (status {0:?})")]
    NoPlatform(Option<i32>),
    #[error("no usable host OpenCL: no host platform name contains {0:?}")]
    NoMatchingPlatform(String),
    #[error("no usable host OpenCL: the only host platform is Hira itself")]
    OnlyHira,
    #[error("this host has no CUDA driver: libcuda.so.1 was not found on the library path")]
    NoCudaDriver,
    #[error("the host's CUDA driver has no {0}")]
    CudaEntryPoint(&'static str),
    #[error("cannot restore the session: {0}")]
    Restore(#[source] MigrationError),
}

/// Why a session cannot be captured for migration now, or a snapshot not restored.
/// The session goes on unchanged where it was.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("{0} sessions cannot be migrated yet")]
    Unsupported(&'static str),
    /// A call the session made cannot be replayed; recorded when it was made.
    #[error("the session cannot migrate: {0}")]
    Unmigratable(String),
    #[error("the session holds SVM allocations, whose addresses cannot move")]
    Svm,
    #[error("a staged transfer is under way; try again")]
    Staging,
    #[error("commands wait on a user event without a status; try again once it is set")]
    UserEvent,
    #[error("an event callback waits on a user event without a status; try again once it is set")]
    Callback,
    #[error("the device did not finish the session's commands in {0:?}; try again")]
    DeviceBusy(std::time::Duration),
    #[error("calls of the session did not finish in time")]
    CallsBusy,
    /// A host call made to capture or restore failed.
    #[error("{what} failed ({status:?})")]
    Host {
        what: &'static str,
        status: Option<i32>,
    },
    /// What the host says of an object cannot be read.
    #[error("cannot read {0}")]
    Query(&'static str),
    #[error("memory objects of type {0:#x} cannot migrate")]
    MemType(u32),
    #[error("a {0} that no logged call made cannot migrate")]
    Unlogged(String),
    #[error("cannot allocate {bytes} bytes to move contents ({status})")]
    Bounce { bytes: usize, status: i32 },
    #[error("cannot make a queue of the server's own ({0})")]
    Queue(i32),
    #[error("the host has no device {index} (it has {count})")]
    NoDevice { index: u32, count: usize },
    #[error("cannot move the session's device")]
    DeviceSwap,
    #[error("the session uses {0} devices; it can move to another device only with one")]
    Devices(usize),
    #[error("{0}")]
    Snapshot(#[from] hira_migration::SnapshotError),
    #[error("the snapshot is not of an OpenCL session")]
    WrongApi,
    #[error("the snapshot keeps {0}, which no log keeps")]
    NotLogged(&'static str),
    #[error("replaying {name}: {source}")]
    Replay {
        name: &'static str,
        #[source]
        source: Fail,
    },
    #[error("replaying {name} failed with {status}")]
    ReplayStatus { name: &'static str, status: i32 },
    #[error("replaying {0} made other objects than the first time (another device?)")]
    ReplayDiffers(&'static str),
    /// The snapshot does not hold together.
    #[error("{0}")]
    Inconsistent(&'static str),
    #[error("contents of {got} bytes for an object of {want}")]
    ContentsSize { got: usize, want: usize },
    #[error("cannot make a stand-in event ({0})")]
    StandIn(i32),
    #[error("a stand-in's state: {0}")]
    StandInState(#[source] DecodeError),
    #[error("cannot read the snapshot: {0}")]
    Read(#[source] std::io::Error),
    #[error("cannot write the snapshot: {0}")]
    Write(#[source] std::io::Error),
}

/// The bytes of one request beyond its header.
#[derive(Debug)]
pub struct FrameData<'a> {
    pub spans: &'a [Span],
    pub window: Option<&'a WindowMap>,
    /// The guest waits for no reply (`FLAG_NO_REPLY`).
    pub no_reply: bool,
}

/// What was released when a session ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TeardownReport {
    pub released: usize,
    pub failed: usize,
}

/// A host API that executes remoted calls. Shared by all of a session's workers.
pub trait Backend: Send + Sync {
    /// Executes the call `opcode` with `payload`, writing its reply payload into `w`.
    fn execute(
        &self,
        opcode: u16,
        payload: &[u8],
        frame: &FrameData<'_>,
        w: &mut Writer,
    ) -> Result<(), Fail>;

    /// The function named by `opcode`, for logs.
    fn name(&self, opcode: u16) -> &'static str;

    /// Whether call `opcode` may wait for the device or for the guest (a user event it
    /// sets from another thread): such a call never runs on the thread that reads the
    /// guest's requests.
    fn may_block(&self, opcode: u16) -> bool;

    /// Whether call `opcode` may, right now, wait for something only the guest can do
    /// (complete a user event): only such a call must leave the reading thread free.
    /// A call that merely waits for the device runs on it, saving a thread hop.
    fn may_wait_on_guest(&self, opcode: u16) -> bool {
        self.may_block(opcode)
    }

    /// Whether the host library may print while it runs call `opcode` (a compiler's
    /// diagnostics), or while the commands the call may wait for run (a kernel's
    /// `printf`): the session reads what the library printed before it replies, so
    /// that the guest has it when the call returns.
    fn may_print(&self, opcode: u16) -> bool {
        self.may_block(opcode)
    }

    /// Whether `opcode` names a call of this API and may be forwarded without a reply
    /// (`None`: it names none).
    fn may_async(&self, opcode: u16) -> Option<bool>;

    /// Captures the session for migration, with `pending` (the guest's input read
    /// and not executed): called with no call running. Returns the snapshot, or why
    /// the session cannot move now (it then goes on unchanged).
    fn capture(&self, pending: Vec<u8>) -> Result<Vec<u8>, MigrationError>;

    /// Restores a snapshot into this fresh session, on the host's device of index
    /// `device` if given (else on the devices it used); returns the guest's input to
    /// execute first.
    fn restore(
        &self,
        snapshot: &[u8],
        device: Option<u32>,
        window: Option<&WindowMap>,
    ) -> Result<Vec<u8>, MigrationError>;

    /// The guest is gone (its connection ended; the session is not moving): nothing
    /// may wait for it, or for a scheduling decision on its behalf, any more. Called
    /// before the session's workers are joined.
    fn guest_gone(&self) {}

    /// Releases every object the guest still holds.
    fn teardown(&self) -> TeardownReport;
}
