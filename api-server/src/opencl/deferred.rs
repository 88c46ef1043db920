//! Outputs of non-blocking reads.
//!
//! A non-blocking `clEnqueueRead*` is enqueued on the host without waiting: it may sit
//! behind a user event that the application completes only with a later call, so
//! waiting for it would deadlock the session. Its output lands in the data window (or
//! in a buffer of this process) when the host completes the command, and an
//! [`OUTPUT_DONE`] notification tells the guest, which then copies the bytes into the
//! application's memory.
//!
//! The guest must see the data before anything that shows the command complete: the
//! notification is sent from the host's completion callback, and also before the reply
//! to any call after which the command's event is complete ([`Deferred::settle`]) and
//! before any event callback of that event ([`Deferred::settle_event`]). Each output is
//! sent once, under its own lock, so a reply written after `settle` returns always
//! follows the notification on the socket.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cl3::OpenCl;
use hira_protocol::FrameKind;
use hira_protocol::handshake::{OUTPUT_DONE, OutputDone};
use opencl_sys::{cl_event, cl_int};

use super::args::OutBuffer;
use crate::backend::Fail;
use crate::server::FrameWriter;

/// Most non-blocking reads one session may have in flight.
const MAX_PENDING: usize = 4096;
/// Most bytes of in-flight reads staged in this process (outputs not in the window).
const MAX_STAGED: usize = 256 << 20;

use opencl_sys::CL_COMPLETE;
use opencl_sys::CL_EVENT_COMMAND_EXECUTION_STATUS;
use opencl_sys::CL_OUT_OF_RESOURCES;

struct PendingOutput {
    rt: &'static OpenCl,
    writer: Arc<FrameWriter>,
    token: u64,
    event: cl_event,
    staged: usize,
    /// The destination until the output is sent; `None` afterwards.
    out: Mutex<Option<OutBuffer>>,
}

// SAFETY: `event` is a host event this record holds a reference to; OpenCL objects may
// be used from any thread. The output buffer is only touched under the mutex, and a
// window pointer stays valid for the process's life (the mapping is never unmapped
// while the process runs).
unsafe impl Send for PendingOutput {}
// SAFETY: as above.
unsafe impl Sync for PendingOutput {}

/// The session's in-flight non-blocking reads.
pub struct Deferred {
    rt: &'static OpenCl,
    writer: Arc<FrameWriter>,
    pending: Mutex<Vec<Arc<PendingOutput>>>,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred").finish_non_exhaustive()
    }
}

extern "C" fn output_trampoline(_event: cl_event, status: cl_int, user_data: *mut c_void) {
    // SAFETY: `user_data` is the reference `Deferred::add` leaked for this callback.
    let p = unsafe { Arc::from_raw(user_data as *const PendingOutput) };
    p.deliver(status);
}

impl PendingOutput {
    fn deliver(&self, status: cl_int) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let Some(buf) = out.take() else {
            return;
        };
        let data = match buf {
            OutBuffer::Inline(v) if status == CL_COMPLETE => Some(v),
            _ => None,
        };
        let o = OutputDone {
            token: self.token,
            status: status.min(0),
            data,
        };
        self.writer
            .send(FrameKind::Notify, OUTPUT_DONE, 0, 0, &o.encode());
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        // The last holder (the pending list, the host callback or a settling thread)
        // drops the event reference, so no thread queries a released event.
        self.rt.clReleaseEvent(self.event);
    }
}

impl Deferred {
    pub fn new(rt: &'static OpenCl, writer: Arc<FrameWriter>) -> Self {
        Deferred {
            rt,
            writer,
            pending: Mutex::new(Vec::new()),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PendingOutput>>> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.retain(|o| o.out.lock().unwrap_or_else(|e| e.into_inner()).is_some());
        p
    }

    /// Whether every deferred output has been delivered.
    pub fn is_idle(&self) -> bool {
        self.pending().is_empty()
    }

    /// Tells the guest at once that output `token` is over (a write whose window data
    /// the host no longer needs, or never read).
    pub fn done_now(&self, token: u64, status: cl_int) {
        let o = OutputDone {
            token,
            status,
            data: None,
        };
        self.writer
            .send(FrameKind::Notify, OUTPUT_DONE, 0, 0, &o.encode());
    }

    /// Whether another read may be deferred (`CL_OUT_OF_RESOURCES` when the session
    /// has too many in flight).
    pub fn may_defer(&self) -> Result<(), Fail> {
        let p = self.pending();
        let staged: usize = p.iter().map(|o| o.staged).sum();
        if p.len() >= MAX_PENDING || staged >= MAX_STAGED {
            return Err(Fail::Status(CL_OUT_OF_RESOURCES));
        }
        Ok(())
    }

    /// Follows the read enqueued with host event `event` (which this record now holds
    /// a reference to: the one given when `owned`, else a new one).
    pub fn add(&self, token: u64, event: cl_event, owned: bool, out: OutBuffer) {
        if let OutBuffer::Staged(o) = out {
            // An output too large for the window is fetched by the guest after the
            // reply, so this read completes before it (documented: a read that large
            // gated by a user event the application sets later would wait forever).
            let status = self.rt.clWaitForEvents(1, &event);
            if status == Some(0) {
                o.keep();
            }
            if owned {
                self.rt.clReleaseEvent(event);
            }
            return;
        }
        if !owned {
            self.rt.clRetainEvent(event);
        }
        let staged = match &out {
            OutBuffer::Inline(v) => v.len(),
            _ => 0,
        };
        let p = Arc::new(PendingOutput {
            rt: self.rt,
            writer: self.writer.clone(),
            token,
            event,
            staged,
            out: Mutex::new(Some(out)),
        });
        self.pending().push(p.clone());
        let raw = Arc::into_raw(p.clone());
        let status =
            self.rt
                .clSetEventCallback(event, CL_COMPLETE, Some(output_trampoline), raw as *mut _);
        if status != Some(0) {
            // SAFETY: the host refused the callback, so it never took the reference.
            drop(unsafe { Arc::from_raw(raw) });
            // Without a callback the output still goes at the next synchronising call.
            log::warn!("clSetEventCallback for a deferred read failed: {status:?}");
        }
    }

    fn status(&self, event: cl_event) -> cl_int {
        let mut st: cl_int = 1;
        let r = self.rt.clGetEventInfo(
            event,
            CL_EVENT_COMMAND_EXECUTION_STATUS,
            std::mem::size_of::<cl_int>(),
            (&mut st as *mut cl_int).cast(),
            std::ptr::null_mut(),
        );
        if r == Some(0) { st } else { 1 }
    }

    /// Sends every output whose command has completed. Called before each reply.
    pub fn settle(&self) {
        let list: Vec<_> = {
            let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.is_empty() {
                return;
            }
            p.clone()
        };
        for p in list {
            let st = self.status(p.event);
            if st <= CL_COMPLETE {
                p.deliver(st);
            }
        }
    }

    /// Sends the outputs of reads whose event is `event`, which completed with `status`.
    pub fn settle_event(&self, event: cl_event, status: cl_int) {
        if status > CL_COMPLETE {
            return;
        }
        let list: Vec<_> = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|p| p.event == event)
            .cloned()
            .collect();
        for p in list {
            p.deliver(status);
        }
    }
}
