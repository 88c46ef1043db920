//! The process-wide runtime of the guest shim.
//!
//! Every OpenCL object the application sees is an [`Obj`] allocated here: its first
//! field is the dispatch table pointer the ICD loader requires, its second the
//! session-scoped id that names the host object on the wire. The application never
//! sees a host pointer.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use hira_apis_opencl::sizes::RectLayout;
use hira_apis_opencl::{Kind, notify};
use hira_guest_driver::{Connection, TransportError, endpoint};
use hira_protocol::codec::Reader;
use log::{error, warn};
use opencl_sys::{cl_event, cl_int, cl_mem, cl_program};

use crate::icd::DISPATCH;

pub(crate) use opencl_sys::CL_INVALID_CONTEXT;
pub(crate) use opencl_sys::CL_INVALID_EVENT_WAIT_LIST;
pub(crate) use opencl_sys::CL_INVALID_HOST_PTR;
pub(crate) use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_MEM_COPY_HOST_PTR;
use opencl_sys::CL_MEM_USE_HOST_PTR;
pub(crate) use opencl_sys::CL_OUT_OF_HOST_MEMORY;
pub(crate) use opencl_sys::CL_OUT_OF_RESOURCES;

/// A guest object standing for one host object.
#[repr(C)]
pub struct Obj {
    /// Must be first: the ICD loader dispatches through it.
    dispatch: *const opencl_sys::cl_icd::_cl_icd_dispatch,
    pub id: u64,
    pub kind: Kind,
    /// The application's references, mirrored so the object can be freed when the
    /// last one is released.
    refs: AtomicU32,
}

/// What the guest remembers about a memory object.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemExtra {
    /// Flags as the application passed them (the host sees USE_HOST_PTR as COPY).
    pub flags: u64,
    /// The application's `host_ptr` for `CL_MEM_USE_HOST_PTR` objects.
    pub host_ptr: usize,
    /// Bytes per pixel, once known (images only).
    pub elem_size: usize,
    /// `CL_MEM_TYPE`, once known (images only; 0 before).
    pub image_type: u32,
    /// Size in bytes, for buffers made by `clCreateBuffer*`.
    pub size: Option<usize>,
}

#[derive(Default)]
struct Objects {
    by_id: HashMap<u64, usize>,
    by_ptr: HashMap<usize, (u64, Kind)>,
    mem: HashMap<u64, MemExtra>,
    /// The context of each queue and event.
    context_of: HashMap<u64, u64>,
    /// Command types of events whose command the guest carries out with other calls
    /// (maps, SVM operations), as the application must see them.
    command_type: HashMap<u64, u32>,
    /// The queues made out of order.
    out_of_order: std::collections::HashSet<u64>,
}

struct Runtime {
    /// The current connection (null when there is none). Connections are leaked: the
    /// application may hold window regions and callbacks of a lost one, and a process
    /// makes at most [`MAX_SESSIONS`] of them.
    conn: AtomicPtr<Connection>,
    /// Serialises reconnection; counts the sessions made.
    sessions: Mutex<u32>,
    /// Bumped at each new connection; the callback thread waits on it.
    generation: Mutex<u64>,
    generation_cv: Condvar,
    objects: Mutex<Objects>,
    next_id: AtomicU64,
    /// Objects with ids below this were made in a session whose API server was lost
    /// (0: none was lost).
    lost_below: AtomicU64,
    callbacks: Mutex<HashMap<u64, (Callback, usize)>>,
    /// One-shot callbacks registered and not yet delivered.
    outstanding: AtomicUsize,
    callback_thread: OnceLock<()>,
    force_sync: bool,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        hira_guest_driver::logger::init("hira");
        let conn = if hira_guest_driver::settings::settings().disabled {
            Err(TransportError::Refused("HIRA_DISABLE is set".into()))
        } else {
            Connection::connect_any(
                &endpoint::endpoints(),
                hira_apis_opencl::API,
                endpoint::window_len(),
            )
        };
        let ptr = match conn {
            Ok(c) => Box::into_raw(Box::new(c)),
            Err(e) => {
                warn!("Hira OpenCL is unavailable: {e}");
                std::ptr::null_mut()
            }
        };
        Runtime {
            conn: AtomicPtr::new(ptr),
            sessions: Mutex::new(1),
            generation: Mutex::new(0),
            generation_cv: Condvar::new(),
            objects: Mutex::new(Objects::default()),
            next_id: AtomicU64::new(1),
            lost_below: AtomicU64::new(0),
            callbacks: Mutex::new(HashMap::new()),
            outstanding: AtomicUsize::new(0),
            callback_thread: OnceLock::new(),
            force_sync: hira_guest_driver::settings::settings().sync,
        }
    })
}

/// Most sessions (API servers) one process starts: the first, then one after each
/// loss of its API server.
const MAX_SESSIONS: u32 = 16;

/// The connection to the host, or the error code every call returns without one.
pub(crate) fn conn() -> Result<&'static Connection, cl_int> {
    let p = runtime().conn.load(Ordering::Acquire);
    // SAFETY: a non-null pointer was made by `Box::into_raw` and is never freed.
    unsafe { p.as_ref() }.ok_or(CL_OUT_OF_RESOURCES)
}

/// Calls that need no object of a session: after the API server was lost, these
/// start a new session (a new API server), so that an application that finds its
/// device again and recreates its context recovers. Platform and device handles stay
/// valid, because every session names them alike; every other object of the lost
/// session is unknown to the new one and fails with the API's invalid-object code.
fn starts_session(op: u16) -> bool {
    use hira_apis_opencl::op;
    [
        op::clGetPlatformIDs,
        op::clGetPlatformInfo,
        op::clGetDeviceIDs,
        op::clGetDeviceInfo,
        op::clCreateContext,
        op::clCreateContextFromType,
    ]
    .contains(&op)
}

/// Before a call `op` is encoded: if the API server was lost and `op` may start a new
/// session, connects again.
pub(crate) fn revive(op: u16) {
    if !starts_session(op) {
        return;
    }
    let rt = runtime();
    let Ok(c) = conn() else { return };
    if !c.is_dead() {
        return;
    }
    let mut sessions = rt.sessions.lock().unwrap_or_else(|e| e.into_inner());
    let still_dead = conn().is_ok_and(Connection::is_dead);
    if !still_dead || *sessions >= MAX_SESSIONS {
        return;
    }
    *sessions += 1;
    match Connection::connect_any(
        &endpoint::endpoints(),
        hira_apis_opencl::API,
        endpoint::window_len(),
    ) {
        Ok(new) => {
            warn!(
                "the Hira API server was lost; calls on objects made before fail with CL_OUT_OF_RESOURCES, new ones use session {}",
                new.welcome.session
            );
            rt.lost_below
                .store(rt.next_id.load(Ordering::Relaxed), Ordering::Release);
            rt.conn
                .store(Box::into_raw(Box::new(new)), Ordering::Release);
            *rt.generation.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            rt.generation_cv.notify_all();
        }
        Err(e) => warn!("cannot start a new Hira session: {e}"),
    }
}

/// `status`, or, if it is a success, the status of the first call forwarded without a
/// reply that failed on the host since the last report: such errors reach the
/// application at the next call that can return them.
pub(crate) fn with_async_failure(name: &str, status: cl_int) -> cl_int {
    if status != 0 {
        return status;
    }
    let Some(f) = conn().ok().and_then(Connection::take_async_failure) else {
        return status;
    };
    let failed = hira_apis_opencl::op_info(f.opcode).map_or("a call", |o| o.name);
    warn!(
        "{name} reports that an earlier {failed}, forwarded without waiting, failed with {}",
        f.status
    );
    f.status
}

/// Whether asynchronous forwarding is disabled (`HIRA_SYNC`).
pub(crate) fn force_sync() -> bool {
    runtime().force_sync
}

fn objects() -> MutexGuard<'static, Objects> {
    runtime().objects.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh guest-assigned id.
pub(crate) fn new_id() -> u64 {
    runtime().next_id.fetch_add(1, Ordering::Relaxed)
}

/// Whether object `id` of `kind` was made in a session whose API server was lost:
/// the device it lived on is gone, whichever call names it first after the loss
/// (platforms and devices are the host's, and stay).
pub(crate) fn lost(id: u64, kind: Kind) -> bool {
    !matches!(kind, Kind::Platform | Kind::Device)
        && id < runtime().lost_below.load(Ordering::Acquire)
}

/// Whether the application holds event `id`.
pub(crate) fn holds_event(id: u64) -> bool {
    let o = objects();
    o.by_id
        .get(&id)
        .and_then(|p| o.by_ptr.get(p))
        .is_some_and(|&(_, kind)| kind == Kind::Event)
}

/// The id and kind of a live object, if `ptr` is one.
pub fn lookup(ptr: *mut c_void) -> Option<(u64, Kind)> {
    if ptr.is_null() {
        return None;
    }
    objects().by_ptr.get(&(ptr as usize)).copied()
}

/// The object for `id`, created if this is the first time the guest sees it. A new
/// object holds one application reference.
pub fn adopt(kind: Kind, id: u64) -> *mut c_void {
    let mut o = objects();
    if let Some(&p) = o.by_id.get(&id) {
        return p as *mut c_void;
    }
    let obj = Box::new(Obj {
        dispatch: &DISPATCH.0,
        id,
        kind,
        refs: AtomicU32::new(1),
    });
    let p = Box::into_raw(obj) as usize;
    o.by_id.insert(id, p);
    o.by_ptr.insert(p, (id, kind));
    p as *mut c_void
}

/// Records an application retain of `ptr`.
pub(crate) fn retained(ptr: *mut c_void) {
    if let Some((_, kind)) = lookup(ptr)
        && kind.refcounted()
    {
        // SAFETY: `lookup` found `ptr` among the live objects made by `adopt`.
        unsafe { (*(ptr as *const Obj)).refs.fetch_add(1, Ordering::Relaxed) };
    }
}

/// Records an application release of `ptr`; frees the object at zero.
pub(crate) fn released(ptr: *mut c_void) {
    let mut o = objects();
    let Some(&(id, kind)) = o.by_ptr.get(&(ptr as usize)) else {
        return;
    };
    if !kind.refcounted() {
        return;
    }
    // SAFETY: `ptr` is a live object made by `adopt`; the objects lock is held, so no
    // other thread frees it meanwhile.
    let left = unsafe { (*(ptr as *const Obj)).refs.fetch_sub(1, Ordering::AcqRel) } - 1;
    if left == 0 {
        o.by_ptr.remove(&(ptr as usize));
        o.by_id.remove(&id);
        o.mem.remove(&id);
        if kind == Kind::Mem {
            crate::zero_copy::released(id);
        }
        o.context_of.remove(&id);
        o.command_type.remove(&id);
        o.out_of_order.remove(&id);
        crate::checks::forget(id);
        // Only the kinds each table holds: an event's release (one per launch in
        // many programs) scans no cache.
        if matches!(kind, Kind::CommandBuffer | Kind::Queue | Kind::Event) {
            crate::notes::forget(id);
        }
        if matches!(kind, Kind::Queue | Kind::Device) {
            crate::marshal::forget_cached(id);
        }
        if kind == Kind::Event {
            crate::known::forget(id);
        }
        // SAFETY: made by `Box::into_raw` in `adopt` and now unreachable from the tables.
        drop(unsafe { Box::from_raw(ptr as *mut Obj) });
    }
}

/// Bytes of the window that writes sent without a reply hold until the host has
/// read them, and how many such writes there are.
static WINDOW_PENDING: AtomicUsize = AtomicUsize::new(0);
static WINDOW_WRITES: AtomicUsize = AtomicUsize::new(0);
/// Most writes in flight without a reply: each is an event the API server follows,
/// and a few dozen already keep the host busy while the guest copies the next.
const MAX_WINDOW_WRITES: usize = 32;

/// A write of `bytes` now holds part of the window (`done`: no longer).
pub(crate) fn window_pending(bytes: usize, done: bool) {
    if done {
        WINDOW_PENDING.fetch_sub(bytes, Ordering::Relaxed);
        WINDOW_WRITES.fetch_sub(1, Ordering::Relaxed);
    } else {
        WINDOW_PENDING.fetch_add(bytes, Ordering::Relaxed);
        WINDOW_WRITES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether a write of `bytes` in the window may be sent without a reply: writes in
/// flight hold at most half the window, so other calls always find room, and are
/// at most [`MAX_WINDOW_WRITES`].
pub(crate) fn window_budget(bytes: usize) -> bool {
    let Ok(c) = conn() else { return false };
    let Some(w) = c.window() else { return false };
    WINDOW_WRITES.load(Ordering::Relaxed) < MAX_WINDOW_WRITES
        && WINDOW_PENDING.load(Ordering::Relaxed) + bytes <= w.len() / 2
}

/// Records that queue `queue` was made out of order.
pub(crate) fn note_out_of_order(queue: *mut c_void) {
    let mut o = objects();
    if let Some(&(id, Kind::Queue)) = o.by_ptr.get(&(queue as usize)) {
        o.out_of_order.insert(id);
    }
}

/// Whether `queue` is one of ours made in order (its commands run one after another).
pub(crate) fn in_order(queue: *mut c_void) -> bool {
    let o = objects();
    matches!(o.by_ptr.get(&(queue as usize)), Some(&(id, Kind::Queue)) if !o.out_of_order.contains(&id))
}

/// Records that the event the application got in `*event` (if it asked for one)
/// stands for a command of type `command_type`.
pub(crate) fn note_command_type(event: *mut cl_event, command_type: u32) {
    if event.is_null() {
        return;
    }
    // SAFETY: the application's event slot, written by the call that just succeeded.
    let e = unsafe { *event };
    let mut o = objects();
    if let Some(&(id, Kind::Event)) = o.by_ptr.get(&(e as usize)) {
        o.command_type.insert(id, command_type);
    }
}

/// The command type the application sees for event `id`, if the guest decides it.
pub(crate) fn command_type(id: u64) -> Option<u32> {
    objects().command_type.get(&id).copied()
}

/// Remembers the context of queue, event or memory object `id`: `parent` is its
/// context, the queue that made the event, or the buffer a sub-buffer is part of.
pub(crate) fn note_context_of(id: u64, parent: *mut c_void) {
    let mut o = objects();
    let context = match o.by_ptr.get(&(parent as usize)).copied() {
        Some((pid, Kind::Context)) => pid,
        Some((pid, Kind::Queue | Kind::Mem)) => match o.context_of.get(&pid) {
            Some(&c) => c,
            None => return,
        },
        _ => return,
    };
    o.context_of.insert(id, context);
}

/// `CL_INVALID_CONTEXT` when `queue` and the objects `objs` (memory objects, events)
/// belong to different contexts, as far as the guest knows (the host checks whatever
/// it does not).
pub(crate) fn check_same_context(queue: *mut c_void, objs: &[*mut c_void]) -> Result<(), cl_int> {
    let o = objects();
    let context = |p: *mut c_void| {
        o.by_ptr
            .get(&(p as usize))
            .and_then(|(id, _)| o.context_of.get(id))
            .copied()
    };
    let Some(ctx) = context(queue) else {
        return Ok(());
    };
    if objs.iter().any(|&m| context(m).is_some_and(|c| c != ctx)) {
        return Err(CL_INVALID_CONTEXT);
    }
    Ok(())
}

/// The wait list of an enqueue on `queue`: `CL_INVALID_EVENT_WAIT_LIST` when `list`
/// and `n` disagree, `CL_INVALID_CONTEXT` when an event belongs to another context than
/// `queue` (as far as the guest knows; the host checks whatever it does not).
pub(crate) fn check_wait_context(
    queue: *mut c_void,
    list: *const *mut c_void,
    n: usize,
) -> Result<(), cl_int> {
    if list.is_null() != (n == 0) {
        return Err(CL_INVALID_EVENT_WAIT_LIST);
    }
    if n == 0 {
        return Ok(());
    }
    // SAFETY: the caller checked `list` holds `n` handles.
    check_same_context(queue, unsafe { std::slice::from_raw_parts(list, n) })
}

/// Whether `flags` make the host read `host_ptr` at creation.
pub(crate) fn sends_host_ptr(flags: u64) -> bool {
    flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR) != 0
}

/// Remembers what the application passed when it created memory object `id`.
pub(crate) fn note_mem(id: u64, flags: u64, host_ptr: *mut c_void, size: Option<usize>) {
    let host_ptr = if flags & CL_MEM_USE_HOST_PTR != 0 {
        host_ptr as usize
    } else {
        0
    };
    objects().mem.insert(
        id,
        MemExtra {
            flags,
            host_ptr,
            elem_size: 0,
            image_type: 0,
            size,
        },
    );
}

/// Remembers sub-buffer `id` of a parent described by `parent`: its flags as the API
/// reports them (its own, plus the access and host-pointer flags it inherits) and,
/// under a `CL_MEM_USE_HOST_PTR` parent, its part of the application's memory.
pub(crate) fn note_sub_buffer(id: u64, parent: &MemExtra, flags: u64, origin: usize, size: usize) {
    const DEVICE_ACCESS: u64 = 0x7;
    const HOST_ACCESS: u64 = (1 << 7) | (1 << 8) | (1 << 9);
    const HOST_PTR: u64 = (1 << 3) | (1 << 4) | (1 << 5);
    let mut f = flags;
    for group in [DEVICE_ACCESS, HOST_ACCESS] {
        if f & group == 0 {
            f |= parent.flags & group;
        }
    }
    f |= parent.flags & HOST_PTR;
    let host_ptr = if parent.host_ptr != 0 {
        parent.host_ptr + origin
    } else {
        0
    };
    objects().mem.insert(
        id,
        MemExtra {
            flags: f,
            host_ptr,
            elem_size: 0,
            image_type: 0,
            size: Some(size),
        },
    );
}

/// What the guest remembers about memory object `id`.
pub fn mem_extra(id: u64) -> Option<MemExtra> {
    objects().mem.get(&id).copied()
}

fn set_elem_size(id: u64, elem: usize) {
    objects().mem.entry(id).or_default().elem_size = elem;
}

/// Runs an API entry point, turning `Err` and panics into OpenCL status codes.
pub(crate) fn status_call(
    name: &'static str,
    f: impl FnOnce() -> Result<cl_int, cl_int>,
) -> cl_int {
    match crate::stats::timed(name, || catch_unwind(AssertUnwindSafe(f))) {
        Ok(Ok(s)) | Ok(Err(s)) => s,
        Err(_) => {
            error!("panic inside {name}; returning CL_OUT_OF_HOST_MEMORY");
            CL_OUT_OF_HOST_MEMORY
        }
    }
}

/// Runs an entry point that returns an object and reports through `errcode_ret`.
pub(crate) fn handle_call(
    name: &'static str,
    errcode_ret: *mut cl_int,
    f: impl FnOnce() -> Result<*mut c_void, cl_int>,
) -> *mut c_void {
    let (ptr, code) = match crate::stats::timed(name, || catch_unwind(AssertUnwindSafe(f))) {
        Ok(Ok(p)) => (p, 0),
        Ok(Err(s)) => (std::ptr::null_mut(), s),
        Err(_) => {
            error!("panic inside {name}; returning CL_OUT_OF_HOST_MEMORY");
            (std::ptr::null_mut(), CL_OUT_OF_HOST_MEMORY)
        }
    };
    if !errcode_ret.is_null() {
        // SAFETY: the application passes `errcode_ret` null or valid for one write.
        unsafe { *errcode_ret = code };
    }
    ptr
}

/// Runs raw code with no OpenCL status to report; a panic yields 0.
pub(crate) fn guard_raw(f: impl FnOnce() -> usize) -> usize {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        error!("panic inside a Hira entry point");
        0
    })
}

/// An application callback, by the kind of object it reports on.
#[derive(Clone, Copy)]
pub enum Callback {
    Context(
        Option<unsafe extern "C" fn(*const libc::c_char, *const c_void, libc::size_t, *mut c_void)>,
    ),
    Program(Option<unsafe extern "C" fn(cl_program, *mut c_void)>),
    Event(Option<unsafe extern "C" fn(cl_event, cl_int, *mut c_void)>),
    Mem(Option<unsafe extern "C" fn(cl_mem, *mut c_void)>),
    /// A context destructor callback, with the context handle the application had.
    Destructor(
        Option<unsafe extern "C" fn(opencl_sys::cl_context, *mut c_void)>,
        usize,
    ),
}

impl Callback {
    fn is_set(&self) -> bool {
        match self {
            Callback::Context(f) => f.is_some(),
            Callback::Program(f) => f.is_some(),
            Callback::Event(f) => f.is_some(),
            Callback::Mem(f) => f.is_some(),
            Callback::Destructor(f, _) => f.is_some(),
        }
    }

    fn one_shot(&self) -> bool {
        !matches!(self, Callback::Context(_))
    }
}

/// Registers a callback; returns the id the host will name it by (0 for none).
pub(crate) fn register_callback(cb: Callback, user_data: *mut c_void) -> u64 {
    if !cb.is_set() {
        return if user_data.is_null() {
            0
        } else {
            hira_apis_opencl::CALLBACK_DATA_ONLY
        };
    }
    let rt = runtime();
    let id = new_id();
    rt.callbacks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, (cb, user_data as usize));
    if cb.one_shot() {
        rt.outstanding.fetch_add(1, Ordering::AcqRel);
    }
    rt.callback_thread.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("hira-callbacks".into())
            .spawn(callback_loop);
        if let Err(e) = spawned {
            error!("cannot start the callback thread: {e}");
        }
    });
    if let Ok(c) = conn() {
        c.wake();
    }
    id
}

/// Delivers host notifications to application callbacks, on a thread of its own as
/// the OpenCL specification expects. While one-shot callbacks are outstanding it also
/// reads the connection when no caller is, so callbacks arrive while the application
/// waits in its own code.
fn callback_loop() {
    let rt = runtime();
    loop {
        let seen = *rt.generation.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(c) = conn() else { return };
        loop {
            let may_read = || rt.outstanding.load(Ordering::Acquire) > 0;
            let Ok(frame) = c.next_notification(&may_read) else {
                break;
            };
            deliver(frame.header.opcode, &frame.payload);
        }
        // The connection failed: callbacks of its session will never come; wait for
        // a new session's.
        let mut g = rt.generation.lock().unwrap_or_else(|e| e.into_inner());
        while *g == seen {
            g = rt.generation_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn deliver(kind: u16, payload: &[u8]) {
    let rt = runtime();
    let mut r = Reader::new(payload);
    let Ok(id) = r.u64() else {
        warn!("malformed notification");
        return;
    };
    let entry = {
        let mut cbs = rt.callbacks.lock().unwrap_or_else(|e| e.into_inner());
        match cbs.get(&id).copied() {
            Some(e) if e.0.one_shot() => {
                cbs.remove(&id);
                rt.outstanding.fetch_sub(1, Ordering::AcqRel);
                Some(e)
            }
            other => other,
        }
    };
    let Some((cb, data)) = entry else {
        warn!("notification for unknown callback {id}");
        return;
    };
    let data = data as *mut c_void;
    let res = catch_unwind(AssertUnwindSafe(|| -> Option<()> {
        match (kind, cb) {
            (notify::CONTEXT, Callback::Context(Some(f))) => {
                let mut info = r.bytes(64 * 1024).ok()?.to_vec();
                info.push(0);
                let private = r.bytes(64 * 1024).ok()?;
                // SAFETY: calling the application's callback with the arguments the
                // API defines; `info` is NUL-terminated and outlives the call.
                unsafe {
                    f(
                        info.as_ptr().cast(),
                        private.as_ptr().cast(),
                        private.len(),
                        data,
                    )
                };
            }
            (notify::PROGRAM, Callback::Program(Some(f))) => {
                let p = adopt(Kind::Program, r.u64().ok()?);
                // SAFETY: as above.
                unsafe { f(p as cl_program, data) };
            }
            (notify::EVENT, Callback::Event(Some(f))) => {
                let e = adopt(Kind::Event, r.u64().ok()?);
                let status = r.i32().ok()?;
                // SAFETY: as above.
                unsafe { f(e as cl_event, status, data) };
            }
            (notify::DESTRUCTOR, Callback::Destructor(Some(f), ctx)) => {
                // SAFETY: as above; the handle is the one the application registered
                // the callback on (natively, the context being destroyed).
                unsafe { f(ctx as opencl_sys::cl_context, data) };
            }
            (notify::MEM, Callback::Mem(Some(f))) => {
                let m = r.u64().ok()?;
                let p = objects().by_id.get(&m).copied().unwrap_or(0);
                // SAFETY: as above; the object may already be released, as natively.
                unsafe { f(p as cl_mem, data) };
            }
            _ => return None,
        }
        Some(())
    }));
    if !matches!(res, Ok(Some(()))) {
        warn!("could not deliver notification {kind} for callback {id}");
    }
}

/// Layout of the host side of a buffer-rect transfer.
///
/// # Safety
/// `origin` and `region` must be null or point to three `size_t`s.
pub(crate) unsafe fn buffer_rect(
    origin: *const usize,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<RectLayout, cl_int> {
    if origin.is_null() || region.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    // SAFETY: both point to three size_t, per the contract above.
    let (o, r) = unsafe {
        (
            *(origin as *const [usize; 3]),
            *(region as *const [usize; 3]),
        )
    };
    RectLayout::buffer(o, r, row_pitch, slice_pitch).ok_or(CL_INVALID_VALUE)
}

/// Layout of the host side of an image transfer.
///
/// # Safety
/// `region` must be null or point to three `size_t`s.
pub(crate) unsafe fn image_rect(
    image: cl_mem,
    region: *const usize,
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<RectLayout, cl_int> {
    if region.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    let elem = image_elem_size(image)?;
    // SAFETY: points to three size_t, per the contract above.
    let r = unsafe { *(region as *const [usize; 3]) };
    RectLayout::image(elem, r, row_pitch, slice_pitch).ok_or(CL_INVALID_VALUE)
}

/// `CL_MEM_OBJECT_IMAGE1D_ARRAY`.
pub(crate) use opencl_sys::CL_MEM_OBJECT_IMAGE1D_ARRAY;

/// The type of image `image` (`CL_MEM_TYPE`), asked of the host once and remembered.
pub(crate) fn image_type(image: cl_mem) -> Result<u32, cl_int> {
    let (id, kind) = lookup(image).ok_or(-38)?;
    if kind != Kind::Mem {
        return Err(-38);
    }
    if let Some(e) = mem_extra(id).filter(|e| e.image_type != 0) {
        return Ok(e.image_type);
    }
    let mut t: u32 = 0;
    // SAFETY: asking for CL_MEM_TYPE, a cl_mem_object_type (u32), into a local u32.
    let status = unsafe {
        crate::generated::clGetMemObjectInfo(
            image,
            0x1100,
            std::mem::size_of::<u32>(),
            (&mut t as *mut u32).cast(),
            std::ptr::null_mut(),
        )
    };
    if status != 0 {
        return Err(status);
    }
    objects().mem.entry(id).or_default().image_type = t;
    Ok(t)
}

/// Bytes per pixel of `image`, asked of the host once and remembered.
pub(crate) fn image_elem_size(image: cl_mem) -> Result<usize, cl_int> {
    let (id, kind) = lookup(image).ok_or(-38)?;
    if kind != Kind::Mem {
        return Err(-38);
    }
    if let Some(e) = mem_extra(id).filter(|e| e.elem_size != 0) {
        return Ok(e.elem_size);
    }
    let mut elem: usize = 0;
    // SAFETY: asking for CL_IMAGE_ELEMENT_SIZE, a size_t, into a local size_t.
    let status = unsafe {
        crate::generated::clGetImageInfo(
            image,
            0x1111,
            std::mem::size_of::<usize>(),
            (&mut elem as *mut usize).cast(),
            std::ptr::null_mut(),
        )
    };
    if status != 0 {
        return Err(status);
    }
    set_elem_size(id, elem);
    Ok(elem)
}
