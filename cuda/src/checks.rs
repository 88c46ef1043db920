//! Checks the guest makes before a call that may go without waiting (`check` in the
//! description): each returns whether the call may be forwarded without its reply.
//! It may when nothing in it is what the driver refuses at once: the objects are
//! live in the current context and the launch is within the limits the host gave
//! for the function and its device. Otherwise the call waits for the host, which
//! answers it as natively; a failure only the device finds comes back from the next
//! call marked `reports`, as CUDA reports asynchronous errors.

#![allow(non_snake_case, clippy::too_many_arguments)]

use std::ffi::{c_uint, c_void};

use hira_apis_cuda::Kind;

use crate::rt::{self, CUevent, CUfunction, CUresult, CUstream};

/// Whether `stream` is one the current context may use: a special handle or one of
/// its own streams.
fn stream_ok(stream: CUstream, ctx: u64) -> bool {
    let id = stream as usize as u64;
    hira_apis_cuda::SPECIAL_STREAMS.contains(&id) || rt::context_of(Kind::Stream, id) == Some(ctx)
}

pub(crate) fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<bool, CUresult> {
    let ctx = rt::current();
    let fid = f as usize as u64;
    let Some(info) = rt::function(fid) else {
        return Ok(false);
    };
    let Some(layout) = &info.layout else {
        return Ok(false);
    };
    if ctx == 0 || rt::context_of(Kind::Function, fid) != Some(ctx) || !extra.is_null() {
        return Ok(false);
    }
    if !stream_ok(stream, ctx) {
        return Ok(false);
    }
    let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
    let within = |v: [c_uint; 3], max: [u32; 3]| v.iter().zip(max).all(|(&d, m)| d >= 1 && d <= m);
    if threads > u64::from(info.max_threads)
        || !within([bx, by, bz], info.max_block)
        || !within([gx, gy, gz], info.max_grid)
        || shared > info.max_dynamic_shared
    {
        return Ok(false);
    }
    if !layout.is_empty() {
        if params.is_null() {
            return Ok(false);
        }
        for i in 0..layout.len() {
            // SAFETY: the application passes one pointer per parameter, as the API
            // requires for a function with this many.
            if unsafe { *params.add(i) }.is_null() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// A launch with attributes waits for the host, which checks them; one without
/// is checked as `cuLaunchKernel`.
pub(crate) fn hiraLaunchKernelEx(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    _attrs: *const c_void,
    attrs_len: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<bool, CUresult> {
    if attrs_len > 0 {
        return Ok(false);
    }
    cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
}

pub(crate) fn cuEventRecord(event: CUevent, stream: CUstream) -> Result<bool, CUresult> {
    let ctx = rt::current();
    Ok(ctx != 0
        && rt::context_of(Kind::Event, event as usize as u64) == Some(ctx)
        && stream_ok(stream, ctx))
}

pub(crate) fn cuStreamWaitEvent(
    stream: CUstream,
    event: CUevent,
    flags: c_uint,
) -> Result<bool, CUresult> {
    let ctx = rt::current();
    Ok(ctx != 0
        && flags == 0
        && rt::context_of(Kind::Event, event as usize as u64).is_some()
        && stream_ok(stream, ctx))
}

/// A copy or memset on a stream that may go without waiting: `len` bytes at `dst`
/// in an allocation of the current context, on a stream of it.
fn device_op(dst: u64, len: Option<u64>, stream: CUstream) -> bool {
    let ctx = rt::current();
    ctx != 0 && stream_ok(stream, ctx) && len.is_some_and(|n| n > 0 && rt::in_allocation(dst, n))
}

pub(crate) fn cuMemsetD8Async(
    dst: u64,
    _v: u8,
    n: usize,
    stream: CUstream,
) -> Result<bool, CUresult> {
    Ok(device_op(dst, Some(n as u64), stream))
}

pub(crate) fn cuMemsetD16Async(
    dst: u64,
    _v: u16,
    n: usize,
    stream: CUstream,
) -> Result<bool, CUresult> {
    Ok(dst.is_multiple_of(2) && device_op(dst, (n as u64).checked_mul(2), stream))
}

pub(crate) fn cuMemsetD32Async(
    dst: u64,
    _v: c_uint,
    n: usize,
    stream: CUstream,
) -> Result<bool, CUresult> {
    Ok(dst.is_multiple_of(4) && device_op(dst, (n as u64).checked_mul(4), stream))
}

/// A copy to the device may go without waiting if its bytes travel in the request
/// (smaller than the window threshold: nothing of the guest's must outlive the
/// call) and land in an allocation.
pub(crate) fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> Result<bool, CUresult> {
    Ok(!src.is_null() && n < rt::inline_max() && device_op(dst, Some(n as u64), stream))
}
