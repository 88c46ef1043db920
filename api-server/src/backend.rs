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
    fn capture(&self, pending: Vec<u8>) -> Result<Vec<u8>, String>;

    /// Restores a snapshot into this fresh session, on the host's device of index
    /// `device` if given (else on the devices it used); returns the guest's input to
    /// execute first.
    fn restore(&self, snapshot: &[u8], device: Option<u32>) -> Result<Vec<u8>, String>;

    /// The guest is gone (its connection ended; the session is not moving): nothing
    /// may wait for it, or for a scheduling decision on its behalf, any more. Called
    /// before the session's workers are joined.
    fn guest_gone(&self) {}

    /// Releases every object the guest still holds.
    fn teardown(&self) -> TeardownReport;
}
