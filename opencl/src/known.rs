//! What the guest knows without asking: the end of its commands.
//!
//! The reply to a call that waited for commands (`clFinish`, `clWaitForEvents`: the
//! `reports` flag) ends with the execution status and profiling timestamps of the
//! events it waited for that the guest holds and was not told about yet (the API
//! server's `Session::report_completed`). Both are final once a command has ended, so
//! `clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS)` and `clGetEventProfilingInfo`
//! on those events are answered here (the `known` flag), with the native size rules;
//! anything else is forwarded. An entry goes when the application releases its event.
//! A reply that ends after its status (the call failed before the host waited) reports
//! nothing.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex};

use hira_apis_opencl::Kind;
use opencl_sys::{cl_event, cl_int};

use crate::marshal::{ReplyReader, info_answer};

use opencl_sys::CL_EVENT_COMMAND_EXECUTION_STATUS;
use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_PROFILING_COMMAND_QUEUED;
use opencl_sys::CL_PROFILING_INFO_NOT_AVAILABLE;
/// Timestamps mask meaning: the event's queue was made without profiling.
const NO_PROFILING: u8 = 0xFF;
/// Most events one reply may report (a hostile reply cannot make the guest allocate
/// more than this).
const MAX_REPORTED: u32 = 1 << 20;

/// How a command ended, as the host reported it.
#[derive(Debug, Clone, Copy)]
struct Ended {
    status: cl_int,
    /// Which of `stamps` the host gave (bit `i`: `CL_PROFILING_COMMAND_QUEUED + i`),
    /// or [`NO_PROFILING`].
    mask: u8,
    stamps: [u64; 5],
}

static ENDED: LazyLock<Mutex<HashMap<u64, Ended>>> = LazyLock::new(Mutex::default);

fn ended(event: cl_event) -> Option<Ended> {
    let (id, kind) = crate::rt::lookup(event.cast())?;
    if kind != Kind::Event {
        return None;
    }
    ENDED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .copied()
}

/// Reads the report at the end of a `reports` call's reply (none when the call
/// failed before the host waited).
pub(crate) fn completions(r: &mut ReplyReader) -> Result<(), cl_int> {
    if r.at_end() {
        return Ok(());
    }
    let n = r.u32()?;
    if n > MAX_REPORTED {
        return Err(CL_INVALID_VALUE);
    }
    let mut got = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let id = r.u64()?;
        let status = r.i32()?;
        let mask = r.u8()?;
        let mut stamps = [0u64; 5];
        if mask != NO_PROFILING {
            for (i, t) in stamps.iter_mut().enumerate() {
                if mask & (1 << i) != 0 {
                    *t = r.u64()?;
                }
            }
        }
        got.push((
            id,
            Ended {
                status,
                mask,
                stamps,
            },
        ));
    }
    let mut m = ENDED.lock().unwrap_or_else(|e| e.into_inner());
    for (id, e) in got {
        // Only for events the application still holds.
        if crate::rt::holds_event(id) {
            m.insert(id, e);
        }
    }
    Ok(())
}

/// Whether the host reported the command of event `id` ended (complete or failed).
pub(crate) fn completed(id: u64) -> bool {
    ENDED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .is_some_and(|e| e.status <= 0)
}

/// Forgets event `id` (the application released it).
pub(crate) fn forget(id: u64) {
    ENDED.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
}

/// `clGetEventInfo`: the execution status of an ended command.
///
/// # Safety
/// As `clGetEventInfo`.
#[allow(non_snake_case)]
pub(crate) unsafe fn clGetEventInfo(
    event: cl_event,
    param: u32,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Result<Option<cl_int>, cl_int> {
    if param != CL_EVENT_COMMAND_EXECUTION_STATUS {
        return Ok(None);
    }
    let Some(e) = ended(event) else {
        return Ok(None);
    };
    // SAFETY: forwarded contract.
    Ok(Some(unsafe {
        info_answer(&e.status.to_le_bytes(), size, value, size_ret)
    }))
}

/// `clGetEventProfilingInfo`: the timestamps of a command that completed.
///
/// # Safety
/// As `clGetEventProfilingInfo`.
#[allow(non_snake_case)]
pub(crate) unsafe fn clGetEventProfilingInfo(
    event: cl_event,
    param: u32,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Result<Option<cl_int>, cl_int> {
    let Some(i) = param
        .checked_sub(CL_PROFILING_COMMAND_QUEUED)
        .filter(|&i| i < 5)
    else {
        return Ok(None);
    };
    let Some(e) = ended(event).filter(|e| e.status == 0) else {
        return Ok(None);
    };
    if e.mask == NO_PROFILING {
        return Ok(Some(CL_PROFILING_INFO_NOT_AVAILABLE));
    }
    if e.mask & (1 << i) == 0 {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    Ok(Some(unsafe {
        info_answer(&e.stamps[i as usize].to_le_bytes(), size, value, size_ret)
    }))
}
