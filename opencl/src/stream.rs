//! Large transfers streamed through the data window in chunks (the `streams` flag of
//! the API description, and buffers' initial contents).
//!
//! A transfer of many megabytes copied into the window at once touches as many fresh
//! window pages, and the host copies it only once the guest is done. In chunks, a few
//! regions of the window are used again and again (their pages stay mapped), and the
//! host copies chunk `i` while the guest copies chunk `i + 1`, each on its own core.
//!
//! - A blocking `clEnqueueWriteBuffer` with no event and no wait list on an in-order
//!   queue becomes non-blocking writes of its chunks: it returns once the last chunk
//!   is in the window, as any such write does (see `Call::early_return`).
//! - A blocking `clEnqueueReadBuffer` with no event becomes non-blocking reads of its
//!   chunks, sent without waiting for a reply (the host completes each chunk's output
//!   token with its data or its error), each copied into the application's memory as
//!   the host completes it; it returns once all are.
//! - `clCreateBuffer` with large initial contents sends them as `tag::STREAMED`; the
//!   host makes the buffer without them, and [`fill`] writes them in `hiraFill` chunks
//!   on a queue of the API server's own, the last one blocking. The call returns when
//!   the buffer holds them, as natively.
//!
//! At most [`Plan::in_flight`] chunks of one transfer are in the window at a time;
//! each frees its region when the host is done with it (`OUTPUT_DONE`).

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use hira_apis_opencl::op;
use hira_guest_driver::settings::settings;
use opencl_sys::{cl_bool, cl_command_queue, cl_event, cl_int, cl_mem, cl_uint};

use crate::marshal::Call;
use crate::rt;

use opencl_sys::CL_OUT_OF_RESOURCES;
/// `CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS`: the host may not write the buffer.
const HOST_MAY_NOT_WRITE: u64 = (1 << 8) | (1 << 9);

/// Transfers of at least this many bytes stream: `HIRA_STREAM_MIN_KB`, default 8 MiB.
static STREAM_MIN: LazyLock<usize> = LazyLock::new(|| settings().stream_min.unwrap_or(8 << 20));

/// Chunk of a write: an eighth of the transfer, from 1 MiB (about a hundred
/// microseconds of copying) to 4 MiB, and 8 MiB for writes copied around the caches
/// ([`NT_MIN`]), the size from which API servers copy that way too. Each chunk costs a
/// command on the host (PoCL wakes a worker thread for it), and the first and last
/// chunks overlap nothing, so eight chunks balance the two (measurements:
/// docs/tuning.md).
const WRITE_CHUNKS: usize = 8;
const WRITE_CHUNK_MIN: usize = 1 << 20;
const WRITE_CHUNK_MAX: usize = 4 << 20;
const WRITE_CHUNK_NT: usize = hira_protocol::STREAM_NT_CHUNK;
/// Chunk of a read: 2 MiB. Read chunks go without a reply (`HIRA_STREAM_DETACH`);
/// 2 MiB did best with them (docs/tuning.md).
const READ_CHUNK: usize = 2 << 20;

/// Chunk size overriding both: `HIRA_STREAM_CHUNK_KB`.
static CHUNK: LazyLock<Option<usize>> = LazyLock::new(|| {
    settings()
        .stream_chunk
        .map(|b| b.clamp(MIN_CHUNK, 64 << 20))
});
/// Chunks in flight: `HIRA_STREAM_DEPTH`, default 4.
static DEPTH: LazyLock<usize> =
    LazyLock::new(|| settings().stream_depth.map_or(4, |n| n.clamp(1, 64)));
/// Smallest chunk worth a round of notifications.
const MIN_CHUNK: usize = 256 << 10;

/// Writes of at least this many bytes are copied into the window around the caches
/// (`nontemporal.rs`) and their chunks, being 8 MiB, out of it so by API servers
/// (`HIRA_SERVER_NT_KB`): `HIRA_STREAM_NT_MIN_KB`, by default about the size from
/// which glibc's `memcpy` copies so ([`memcpy_nontemporal_from`]), so that a transfer
/// goes around the caches exactly when it would natively (0: never). Below glibc's
/// size the data stays in the caches natively, and a CPU device's kernels read it
/// from there; reads never go around the caches (measurements: docs/tuning.md).
static NT_MIN: LazyLock<usize> = LazyLock::new(|| {
    settings()
        .stream_nt_min
        .map_or_else(memcpy_nontemporal_from, |b| b.unwrap_or(usize::MAX))
});

/// The size from which glibc's `memcpy` stores around the caches, as glibc 2.36
/// computes it: three quarters of the last-level cache's share of each CPU (an
/// example in docs/tuning.md). Where the cache is not known, 256 MiB.
fn memcpy_nontemporal_from() -> usize {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: sysconf has no preconditions.
        let (cache, cpus) = unsafe {
            (
                libc::sysconf(libc::_SC_LEVEL3_CACHE_SIZE),
                libc::sysconf(libc::_SC_NPROCESSORS_ONLN),
            )
        };
        if cache > 0 && cpus > 0 {
            return (cache as usize / cpus as usize / 4 * 3).max(32 << 20);
        }
    }
    256 << 20
}

/// How one transfer is cut.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    chunk: usize,
    /// Chunks of this transfer in the window at most.
    in_flight: usize,
    /// Its chunks are copied into the window around the caches (writes only).
    nontemporal: bool,
}

/// Which way a transfer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Way {
    ToHost,
    FromHost,
}

/// How a transfer of `len` bytes streams, or `None` if it should not: too small, or
/// no window (or one too small to hold a few chunks).
pub(crate) fn plan(len: usize, way: Way) -> Option<Plan> {
    if len < (*STREAM_MIN).max(2 * MIN_CHUNK) {
        return None;
    }
    let window = rt::conn().ok()?.window()?.len();
    let in_flight = *DEPTH;
    let nontemporal = way == Way::ToHost && len >= *NT_MIN;
    let wanted = CHUNK.unwrap_or(match way {
        Way::ToHost if nontemporal => WRITE_CHUNK_NT,
        Way::ToHost => (len / WRITE_CHUNKS).clamp(WRITE_CHUNK_MIN, WRITE_CHUNK_MAX),
        Way::FromHost => READ_CHUNK,
    });
    let chunk = (window / (2 * in_flight)).min(wanted) & !0xFFFF;
    (chunk >= MIN_CHUNK).then_some(Plan {
        chunk,
        in_flight,
        // Only in chunks the API server copies around the caches too: the guest's
        // side alone makes writes slower (the host's copy then reads from memory).
        nontemporal: nontemporal && chunk >= WRITE_CHUNK_NT,
    })
}

/// Chunks of one transfer still held by the host, and the first failure it reported.
#[derive(Default)]
pub(crate) struct Progress {
    pending: AtomicUsize,
    failed: AtomicI32,
}

impl Progress {
    /// A chunk is done with (`status` < 0: its command failed).
    pub(crate) fn done(&self, status: i32) {
        if status != 0 {
            let _ = self
                .failed
                .compare_exchange(0, status, Ordering::AcqRel, Ordering::Acquire);
        }
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// Waits until at most `n` chunks are pending.
    fn wait_for_at_most(&self, n: usize) -> Result<(), cl_int> {
        rt::conn()?
            .wait_until(&|| self.pending.load(Ordering::Acquire) <= n)
            .map_err(|_| CL_OUT_OF_RESOURCES)
    }

    fn failure(&self) -> cl_int {
        self.failed.load(Ordering::Acquire)
    }
}

thread_local! {
    /// The transfer whose chunk this thread is sending.
    static CURRENT: RefCell<Option<Arc<Progress>>> = const { RefCell::new(None) };
    /// The chunk being sent is a read's, sent without waiting for a reply.
    static DETACHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The chunk being sent is copied into the window around the caches.
    static NONTEMPORAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's copies into the window made as `plan` says.
fn nontemporal_while<T>(plan: &Plan, f: impl FnOnce() -> T) -> T {
    NONTEMPORAL.with(|c| c.set(plan.nontemporal));
    let v = f();
    NONTEMPORAL.with(|c| c.set(false));
    v
}

/// Copies `src` into the window at `dst`: around the caches while this thread sends
/// a chunk of a large streamed write, else as any input.
///
/// # Safety
/// `dst` must be valid for `src.len()` writes and not overlap `src`.
pub(crate) unsafe fn copy_in(src: &[u8], dst: *mut u8) {
    if NONTEMPORAL.with(std::cell::Cell::get) {
        // SAFETY: the caller's contract.
        unsafe { crate::nontemporal::copy(src.as_ptr(), dst, src.len()) };
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }
}

/// Whether the read being sent is a chunk of a streamed read, which needs no reply:
/// the host completes its output's token either way (the data, or the failure).
pub(crate) fn detaching() -> bool {
    DETACHED.with(std::cell::Cell::get)
}

/// Whether read chunks go without a reply (`HIRA_STREAM_DETACH`, default on; 0 waits
/// for each chunk's reply, as with `HIRA_SYNC=1`).
static DETACH: LazyLock<bool> = LazyLock::new(|| settings().stream_detach);

/// The progress of the chunk being sent, if any: taken by whatever keeps the chunk's
/// window region until the host is done with it, which then calls
/// [`Progress::done`].
pub(crate) fn take_progress() -> Option<Arc<Progress>> {
    CURRENT.with(|c| c.borrow_mut().take())
}

/// Sends one chunk with `send`, counting it pending until the host is done with it
/// (at once if the call kept nothing in the window).
fn chunk<T>(p: &Arc<Progress>, plan: &Plan, send: impl FnOnce() -> T) -> T {
    p.pending.fetch_add(1, Ordering::AcqRel);
    CURRENT.with(|c| *c.borrow_mut() = Some(p.clone()));
    let v = nontemporal_while(plan, send);
    if take_progress().is_some() {
        p.done(0);
    }
    v
}

/// Offsets and lengths of the chunks of `len` bytes.
fn pieces(len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(chunk)
        .map(move |at| (at, chunk.min(len - at)))
}

/// A blocking write streamed in chunks; `None` when it does not stream.
///
/// # Safety
/// The arguments of `clEnqueueWriteBuffer`, already checked by the guest.
#[allow(non_snake_case, clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueWriteBuffer(
    queue: cl_command_queue,
    buffer: cl_mem,
    blocking: cl_bool,
    offset: usize,
    size: usize,
    ptr: *const c_void,
    num_events: cl_uint,
    _events: *const cl_event,
    event: *mut cl_event,
) -> Result<Option<cl_int>, cl_int> {
    if blocking == 0
        || !event.is_null()
        || num_events != 0
        || ptr.is_null()
        || rt::force_sync()
        || !rt::in_order(queue.cast())
    {
        return Ok(None);
    }
    let Some(plan) = plan(size, Way::ToHost) else {
        return Ok(None);
    };
    let p = Arc::new(Progress::default());
    for (at, len) in pieces(size, plan.chunk) {
        p.wait_for_at_most(plan.in_flight - 1)?;
        // SAFETY: a chunk of the application's write, which the checks cover.
        let status = chunk(&p, &plan, || unsafe {
            crate::generated::clEnqueueWriteBuffer(
                queue,
                buffer,
                0,
                offset + at,
                len,
                ptr.cast::<u8>().add(at).cast(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        });
        if status != 0 {
            return Ok(Some(status));
        }
    }
    Ok(Some(0))
}

/// A blocking read streamed in chunks; `None` when it does not stream.
///
/// # Safety
/// The arguments of `clEnqueueReadBuffer`, already checked by the guest.
#[allow(non_snake_case, clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueReadBuffer(
    queue: cl_command_queue,
    buffer: cl_mem,
    blocking: cl_bool,
    offset: usize,
    size: usize,
    ptr: *mut c_void,
    num_events: cl_uint,
    events: *const cl_event,
    event: *mut cl_event,
) -> Result<Option<cl_int>, cl_int> {
    if blocking == 0 || !event.is_null() || ptr.is_null() {
        return Ok(None);
    }
    let Some(plan) = plan(size, Way::FromHost) else {
        return Ok(None);
    };
    let p = Arc::new(Progress::default());
    let mut status = 0;
    for (at, len) in pieces(size, plan.chunk) {
        p.wait_for_at_most(plan.in_flight - 1)?;
        DETACHED.with(|d| d.set(*DETACH && !rt::force_sync()));
        // SAFETY: a chunk of the application's read, which the checks cover; the
        // application may not touch `ptr` until this call returns.
        status = chunk(&p, &plan, || unsafe {
            crate::generated::clEnqueueReadBuffer(
                queue,
                buffer,
                0,
                offset + at,
                len,
                ptr.cast::<u8>().add(at).cast(),
                num_events,
                events,
                std::ptr::null_mut(),
            )
        });
        DETACHED.with(|d| d.set(false));
        if status != 0 {
            break;
        }
    }
    // Every chunk sent is in the application's memory before this returns.
    p.wait_for_at_most(0)?;
    Ok(Some(if status != 0 { status } else { p.failure() }))
}

/// Writes the initial contents of buffer `id` (made with `tag::STREAMED`) in
/// `hiraFill` chunks; on failure the buffer is released and the status returned.
///
/// # Safety
/// `src` must be valid for `len` reads.
pub(crate) unsafe fn fill(id: u64, src: *const u8, len: usize) -> Result<(), cl_int> {
    let plan = plan(len, Way::ToHost).unwrap_or(Plan {
        chunk: WRITE_CHUNK_MIN,
        in_flight: 1,
        nontemporal: false,
    });
    let p = Arc::new(Progress::default());
    let mut status = 0;
    for (at, n) in pieces(len, plan.chunk) {
        p.wait_for_at_most(plan.in_flight - 1)?;
        // SAFETY: `at + n <= len`, within `src` per the contract.
        let from = unsafe { src.add(at) };
        if at + n == len {
            // The last chunk completes after all the others (the host's queue is in
            // order) before the host reads the next request.
            // SAFETY: as above.
            status = nontemporal_while(&plan, || unsafe {
                crate::generated::hiraFill(id, at, n, from.cast(), 1, 0)
            });
            break;
        }
        let mut c = Call::new(op::hiraFill);
        c.w.u64(id).u64(at as u64).u64(n as u64);
        // SAFETY: as above.
        nontemporal_while(&plan, || unsafe { c.bytes_in(from, n) })?;
        c.blocking_write(false);
        status = chunk(&p, &plan, || c.send(true).map(|r| r.status))?;
        if status != 0 {
            break;
        }
    }
    p.wait_for_at_most(0)?;
    if status == 0 {
        status = p.failure();
    }
    if status == 0 {
        return Ok(());
    }
    let mut c = Call::new(op::clReleaseMemObject);
    c.w.u64(id);
    let _ = c.send(true);
    Err(status)
}

/// Whether a buffer's initial contents of `len` bytes stream after it is made.
pub(crate) fn streams_initial_data(len: usize, flags: u64) -> bool {
    flags & HOST_MAY_NOT_WRITE == 0 && plan(len, Way::ToHost).is_some()
}
