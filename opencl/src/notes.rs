//! What the guest notes after a call succeeds, for the checks of later calls: the
//! state of its command buffers (`cl_khr_command_buffer`), so that an enqueue the host
//! will take goes without waiting (`checks::clEnqueueCommandBufferKHR`).
//!
//! A command buffer can run once finalized. Unless made for simultaneous use it is
//! pending from an enqueue until that run completes, and an enqueue while it is
//! pending is an error. The guest knows that a run completed when the host reported
//! its event complete (`known`), or when `clFinish` of its queue, called by the thread
//! that enqueued it, returned after the enqueue (a thread's calls run in order on the
//! host). Whatever the guest does not know goes to the host synchronously, which
//! answers as natively.

#![allow(non_snake_case)]

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::thread::ThreadId;

use hira_apis_opencl::Kind;
use opencl_sys::{
    CL_COMMAND_BUFFER_FLAGS_KHR, CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR, cl_command_buffer_khr,
    cl_command_buffer_properties_khr, cl_command_queue, cl_event, cl_int, cl_uint,
};

use crate::rt;

/// A run of a command buffer, until the guest knows it completed.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// The event the application got for it.
    event: Option<u64>,
    queue: u64,
    thread: ThreadId,
    /// Its place among the enqueues the guest noted.
    seq: u64,
}

#[derive(Debug, Default)]
struct CommandBuffer {
    /// The queue it was made for (and runs on when an enqueue names none).
    queue: Option<u64>,
    simultaneous: bool,
    finalized: bool,
    last_run: Option<Run>,
}

#[derive(Default)]
struct State {
    buffers: HashMap<u64, CommandBuffer>,
    /// Per queue and thread: enqueues noted before this place are complete.
    finished: HashMap<(u64, ThreadId), u64>,
    next_seq: u64,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Mutex::default);

thread_local! {
    /// The queue this thread's `clFinish` waits for and the place of the next enqueue
    /// when it started.
    static FINISHING: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn id(ptr: *mut c_void, kind: Kind) -> Option<u64> {
    rt::lookup(ptr)
        .filter(|&(_, k)| k == kind)
        .map(|(id, _)| id)
}

impl State {
    fn completed(&self, run: &Run) -> bool {
        run.event.is_some_and(crate::known::completed)
            || self
                .finished
                .get(&(run.queue, run.thread))
                .is_some_and(|&upto| run.seq < upto)
    }
}

/// Whether command buffer `buffer`, enqueued on `queue` (none: its own), certainly
/// runs now: it is finalized, the queue is its own, and it is made for simultaneous
/// use or its last run is known to be complete.
pub(crate) fn may_enqueue(buffer: u64, queue: Option<u64>) -> bool {
    let st = state();
    let Some(b) = st.buffers.get(&buffer) else {
        return false;
    };
    let own_queue = b.queue.is_some() && queue.is_none_or(|q| Some(q) == b.queue);
    let idle = b.simultaneous || b.last_run.is_none_or(|r| st.completed(&r));
    b.finalized && own_queue && idle
}

/// `clCreateCommandBufferKHR` made `buffer`.
///
/// # Safety
/// As `clCreateCommandBufferKHR`, which succeeded.
pub(crate) unsafe fn clCreateCommandBufferKHR(
    buffer: *mut c_void,
    num_queues: cl_uint,
    queues: *const cl_command_queue,
    properties: *const cl_command_buffer_properties_khr,
    _errcode_ret: *mut cl_int,
) {
    let Some(buffer) = id(buffer, Kind::CommandBuffer) else {
        return;
    };
    let queue = (num_queues == 1 && !queues.is_null())
        // SAFETY: `queues` holds `num_queues` handles.
        .then(|| id(unsafe { *queues }.cast(), Kind::Queue))
        .flatten();
    let mut simultaneous = false;
    let mut p = properties;
    // SAFETY: a property list ends with a zero key; the call accepted it.
    while !p.is_null() && unsafe { *p } != 0 {
        // SAFETY: a key other than zero comes with its value.
        let (key, value) = unsafe { (*p, *p.add(1)) };
        if key == CL_COMMAND_BUFFER_FLAGS_KHR {
            simultaneous = value & CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR != 0;
        }
        // SAFETY: keys come with their values.
        p = unsafe { p.add(2) };
    }
    state().buffers.insert(
        buffer,
        CommandBuffer {
            queue,
            simultaneous,
            ..CommandBuffer::default()
        },
    );
}

/// `clFinalizeCommandBufferKHR` finalized `command_buffer`.
///
/// # Safety
/// As `clFinalizeCommandBufferKHR`, which succeeded.
pub(crate) unsafe fn clFinalizeCommandBufferKHR(command_buffer: cl_command_buffer_khr) {
    if let Some(id) = id(command_buffer.cast(), Kind::CommandBuffer)
        && let Some(b) = state().buffers.get_mut(&id)
    {
        b.finalized = true;
    }
}

/// `clEnqueueCommandBufferKHR` enqueued `command_buffer`.
///
/// # Safety
/// As `clEnqueueCommandBufferKHR`, which succeeded (or was forwarded without waiting
/// after its checks): `event`, if not null, holds the new event.
pub(crate) unsafe fn clEnqueueCommandBufferKHR(
    num_queues: cl_uint,
    queues: *mut cl_command_queue,
    command_buffer: cl_command_buffer_khr,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    event: *mut cl_event,
) {
    let Some(buffer) = id(command_buffer.cast(), Kind::CommandBuffer) else {
        return;
    };
    let named = (num_queues >= 1 && !queues.is_null())
        // SAFETY: `queues` holds `num_queues` handles.
        .then(|| id(unsafe { *queues }.cast(), Kind::Queue))
        .flatten();
    // SAFETY: `event`, if not null, holds the event the call made.
    let event = (!event.is_null())
        .then(|| id(unsafe { *event }.cast(), Kind::Event))
        .flatten();
    let mut st = state();
    let seq = st.next_seq;
    st.next_seq += 1;
    if let Some(b) = st.buffers.get_mut(&buffer) {
        b.last_run = named.or(b.queue).map(|queue| Run {
            event,
            queue,
            thread: std::thread::current().id(),
            seq,
        });
        if b.last_run.is_none() {
            // Its queue is not known: the run is taken to be pending until its
            // event says otherwise, so the next enqueue asks the host.
            b.finalized = false;
        }
    }
}

/// Before this thread's `clFinish` of `queue`.
pub(crate) fn finish_starts(queue: cl_command_queue) {
    let start = id(queue.cast(), Kind::Queue).map(|q| (q, state().next_seq));
    FINISHING.set(start);
}

/// This thread's `clFinish` of `command_queue` returned: the enqueues this thread
/// made on it before are complete.
///
/// # Safety
/// As `clFinish`, which succeeded.
pub(crate) unsafe fn clFinish(command_queue: cl_command_queue) {
    let Some((queue, upto)) = FINISHING.take() else {
        return;
    };
    if id(command_queue.cast(), Kind::Queue) != Some(queue) {
        return;
    }
    let mut st = state();
    let mark = st
        .finished
        .entry((queue, std::thread::current().id()))
        .or_default();
    *mark = (*mark).max(upto);
}

/// Drops what is known about object `id`, which the application released (before
/// `known` forgets an event: a run whose event was reported ended stays complete).
pub(crate) fn forget(id: u64) {
    let mut st = state();
    st.buffers.remove(&id);
    st.finished.retain(|&(queue, _), _| queue != id);
    if !st.buffers.is_empty() && crate::known::completed(id) {
        for b in st.buffers.values_mut() {
            if b.last_run.is_some_and(|r| r.event == Some(id)) {
                b.last_run = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seq: u64) -> Run {
        Run {
            event: None,
            queue: 7,
            thread: std::thread::current().id(),
            seq,
        }
    }

    #[test]
    fn a_run_is_complete_once_its_threads_finish_of_its_queue_came_after_it() {
        let mut st = State::default();
        assert!(!st.completed(&run(3)));
        st.finished.insert((7, std::thread::current().id()), 3);
        assert!(!st.completed(&run(3)), "the finish started before the run");
        assert!(st.completed(&run(2)));
        let other = std::thread::spawn(|| std::thread::current().id())
            .join()
            .unwrap();
        let elsewhere = Run {
            thread: other,
            ..run(1)
        };
        assert!(
            !st.completed(&elsewhere),
            "another thread's finish says nothing"
        );
    }
}
