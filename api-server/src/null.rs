//! A null [`Backend`] for the API server's own tests, in the manner of
//! vhost-device-gpu's null backend: it executes nothing on a host API, answers each
//! call by a fixed rule of its opcode and records what it was asked, so that the
//! session loop (framing, channels, asynchronous calls, refusals) is tested without
//! OpenCL or CUDA.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hira_protocol::frame::HEADER_LEN;
use hira_protocol::{FrameHeader, Writer};

use crate::backend::{Backend, Fail, FrameData, MigrationError, TeardownReport};

/// Replies status 0 followed by the request's payload; may go without a reply.
pub const ECHO: u16 = 1;
/// Fails with [`FAILED`]; may go without a reply.
pub const FAIL: u16 = 2;
/// Replies status 0; must never go without a reply.
pub const SYNC_ONLY: u16 = 3;
/// The status [`FAIL`] fails with.
pub const FAILED: i32 = -5;

/// A backend that records calls instead of making them.
#[derive(Debug, Default)]
pub struct NullBackend {
    /// Every executed call: opcode and payload, in the order they ran.
    pub calls: Mutex<Vec<(u16, Vec<u8>)>>,
    /// Whether the session loop said the guest is gone.
    pub gone: AtomicBool,
    /// How many times the session was torn down.
    pub teardowns: AtomicUsize,
}

impl NullBackend {
    /// The opcodes executed so far, in order.
    pub fn opcodes(&self) -> Vec<u16> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls.iter().map(|(op, _)| *op).collect()
    }
}

impl Backend for NullBackend {
    fn execute(
        &self,
        opcode: u16,
        payload: &[u8],
        _frame: &FrameData<'_>,
        w: &mut Writer,
    ) -> Result<(), Fail> {
        if !matches!(opcode, ECHO | FAIL | SYNC_ONLY) {
            return Err(Fail::UnknownOpcode(opcode));
        }
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((opcode, payload.to_vec()));
        match opcode {
            ECHO => {
                w.i32(0).raw(payload);
                Ok(())
            }
            FAIL => Err(Fail::Status(FAILED)),
            _ => {
                w.i32(0);
                Ok(())
            }
        }
    }

    fn name(&self, opcode: u16) -> &'static str {
        match opcode {
            ECHO => "nullEcho",
            FAIL => "nullFail",
            SYNC_ONLY => "nullSyncOnly",
            _ => "unknown",
        }
    }

    fn may_block(&self, _opcode: u16) -> bool {
        false
    }

    fn may_async(&self, opcode: u16) -> Option<bool> {
        match opcode {
            ECHO | FAIL => Some(true),
            SYNC_ONLY => Some(false),
            _ => None,
        }
    }

    fn capture(&self, _pending: Vec<u8>) -> Result<Vec<u8>, MigrationError> {
        Err(MigrationError::Inconsistent(
            "the null backend has no state",
        ))
    }

    fn restore(
        &self,
        _snapshot: &[u8],
        _device: Option<u32>,
        _window: Option<&crate::window::WindowMap>,
    ) -> Result<Vec<u8>, MigrationError> {
        Err(MigrationError::Inconsistent(
            "the null backend has no state",
        ))
    }

    fn guest_gone(&self) {
        self.gone.store(true, Ordering::Release);
    }

    fn teardown(&self) -> TeardownReport {
        self.teardowns.fetch_add(1, Ordering::AcqRel);
        TeardownReport::default()
    }
}

/// Where a test's [`crate::server::FrameWriter`] writes: kept for the test to read back
/// as frames.
#[derive(Clone, Debug, Default)]
pub struct Sink(Arc<Mutex<Vec<u8>>>);

impl Sink {
    /// The frames written so far: header and payload each.
    pub fn frames(&self) -> Vec<(FrameHeader, Vec<u8>)> {
        let out = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut frames = Vec::new();
        let mut at = 0;
        while at < out.len() {
            let header: &[u8; HEADER_LEN] = out[at..at + HEADER_LEN].try_into().expect("a header");
            let h = FrameHeader::decode(header).expect("a frame the session wrote");
            let end = at + HEADER_LEN + h.len as usize;
            frames.push((h, out[at + HEADER_LEN..end].to_vec()));
            at = end;
        }
        frames
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
