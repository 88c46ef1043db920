//! Migration's side of the OpenCL backend: the session's log, recorded as calls
//! succeed; the capture of a quiesced session into a snapshot; and its restore into
//! a fresh API server.
//!
//! What the log keeps is decided by the API description (`OpInfo::replay`), through
//! `hira_migration::Log`. This module adds what only the host API can do: read and
//! write the contents of memory objects, stand in for the events of finished
//! commands, and put the guest's reference counts back on the host's objects.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cl3::OpenCl;
use hira_apis_opencl::{HOST_ID_BIT, Kind, OpInfo, Replay, op, op_info, tag};
use hira_migration::snapshot::MAX_REQUEST;
use hira_migration::{Log, Snapshot, StandIn};
use hira_protocol::{Reader, Writer};
use opencl_sys::{cl_command_queue, cl_context, cl_int, cl_mem};

use super::OpenClBackend;
use super::handles;
use super::queues::{Queues, info_value};
use super::session::Session;
use crate::backend::{FrameData, MigrationError};

use opencl_sys::CL_COMPLETE;
use opencl_sys::CL_EVENT_COMMAND_QUEUE;
use opencl_sys::CL_EVENT_COMMAND_TYPE;
use opencl_sys::CL_EVENT_CONTEXT;
use opencl_sys::CL_MEM_ASSOCIATED_MEMOBJECT;
use opencl_sys::CL_MEM_CONTEXT;
use opencl_sys::CL_MEM_COPY_HOST_PTR;
use opencl_sys::CL_MEM_READ_WRITE;
use opencl_sys::CL_MEM_SIZE;
use opencl_sys::CL_MEM_TYPE;
use opencl_sys::CL_SUCCESS;
/// `CL_PROFILING_COMMAND_QUEUED` .. `CL_PROFILING_COMMAND_COMPLETE`.
const PROFILING: std::ops::RangeInclusive<u32> = 0x1280..=0x1284;
use opencl_sys::CL_IMAGE_ARRAY_SIZE;
use opencl_sys::CL_IMAGE_DEPTH;
use opencl_sys::CL_IMAGE_ELEMENT_SIZE;
use opencl_sys::CL_IMAGE_HEIGHT;
use opencl_sys::CL_IMAGE_WIDTH;
use opencl_sys::CL_MEM_OBJECT_BUFFER;
use opencl_sys::CL_MEM_OBJECT_IMAGE1D;
use opencl_sys::CL_MEM_OBJECT_IMAGE1D_ARRAY;
use opencl_sys::CL_MEM_OBJECT_IMAGE1D_BUFFER;
use opencl_sys::CL_MEM_OBJECT_IMAGE2D;
use opencl_sys::CL_MEM_OBJECT_IMAGE2D_ARRAY;
use opencl_sys::CL_MEM_OBJECT_IMAGE3D;

/// How long a capture waits for builds' and events' callbacks to be delivered.
const CALLBACKS_DRAIN: Duration = Duration::from_secs(2);
/// How long a capture waits for the device to finish what was enqueued.
const DEVICE_DRAIN: Duration = Duration::from_secs(30);
/// How long it waits while the session has a user event without a status, which may
/// be what holds the commands back.
const USER_EVENT_DRAIN: Duration = Duration::from_secs(2);

/// Waits until every command enqueued on `queues` has finished. Commands behind a
/// user event the application has not set cannot finish: then, after a while, the
/// capture is refused (rather than waiting for ever as `clFinish` would). A user event
/// without a status that nothing waits on does not stop a capture: it moves as it is.
fn drain(
    rt: &OpenCl,
    queues: &[cl_command_queue],
    user_events_open: impl Fn() -> bool,
) -> Result<(), MigrationError> {
    use opencl_sys::CL_EVENT_COMMAND_EXECUTION_STATUS;
    let mut markers = Vec::new();
    for &q in queues {
        let mut ev: opencl_sys::cl_event = std::ptr::null_mut();
        check(
            rt.clEnqueueMarkerWithWaitList(q, 0, std::ptr::null(), &mut ev),
            "marking a queue",
        )?;
        rt.clFlush(q);
        markers.push(ev);
    }
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    let res = loop {
        let done = markers.iter().all(|&ev| {
            info_value::<cl_int>(|n, p, r| {
                rt.clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, n, p, r)
            })
            .is_some_and(|s| s <= CL_COMPLETE)
        });
        if done {
            break Ok(());
        }
        if start.elapsed() > USER_EVENT_DRAIN && user_events_open() {
            break Err(MigrationError::UserEvent);
        }
        if start.elapsed() > DEVICE_DRAIN {
            break Err(MigrationError::DeviceBusy(DEVICE_DRAIN));
        }
        // Polling: the host gives no way to wait for several events with a timeout.
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    };
    for ev in markers {
        rt.clReleaseEvent(ev);
    }
    res
}

/// The stage token that, in a replayed request, stands for zeros of the given
/// length (the initial data of a memory object, whose contents travel separately).
/// Guests never see it: a replay only reads requests from a snapshot.
pub(crate) const ZEROS: u64 = 0;

/// How a byte argument is kept in a recorded request.
#[derive(Debug)]
pub(crate) enum Splice {
    /// Its bytes, inline (they came in the window or staged).
    Inline(Vec<u8>),
    /// Zeros of this length (a memory object's initial data).
    Zeros(usize),
}

/// What one call that the log keeps named while it ran.
#[derive(Debug)]
pub(crate) struct Rec {
    /// The call.
    info: &'static OpInfo,
    /// Objects it made, in order.
    pub creates: Vec<u64>,
    /// Objects its arguments named, in order (a configuring call's subject first).
    pub uses: Vec<u64>,
    /// The setting it changed (a kernel argument's index).
    pub key: Option<u64>,
    /// Byte arguments kept otherwise than they came: the request's byte range and
    /// what goes there.
    pub splices: Vec<(usize, usize, Splice)>,
    /// Why the session can no longer migrate, if this call made it so.
    pub unmigratable: Option<&'static str>,
    /// Whether the call creates a memory object (its initial data is not kept).
    pub creates_memory: bool,
}

impl Rec {
    /// The record of a call `opcode` about to run, if the log keeps such calls (an
    /// event's callback it does not: it is delivered before any capture completes,
    /// and once only).
    pub(crate) fn of(opcode: u16) -> Option<Self> {
        let info = op_info(opcode).filter(|o| {
            o.opcode != op::clSetEventCallback
                && matches!(o.replay, Replay::Creates(_) | Replay::Configures)
        })?;
        Some(Rec {
            info,
            creates: Vec::new(),
            uses: Vec::new(),
            key: None,
            splices: Vec::new(),
            unmigratable: None,
            creates_memory: info.replay == Replay::Creates(Kind::Mem),
        })
    }
}

/// The session's migration state.
#[derive(Debug, Default)]
pub struct Migration {
    log: Mutex<Log>,
    /// Why the session cannot migrate (a call used something a snapshot cannot hold).
    unmigratable: Mutex<Option<String>>,
    /// One-shot callbacks (builds', events') registered and not yet delivered.
    one_shot: Arc<AtomicUsize>,
    /// Set while a snapshot is replayed: callbacks already delivered are not
    /// registered again.
    replaying: AtomicBool,
    /// Events of commands finished before a migration, by their stand-in's host
    /// handle: what the event told before, which the stand-in tells alike.
    finished: Mutex<HashMap<usize, Finished>>,
    /// Whether `finished` may hold anything (the session was restored).
    restored: AtomicBool,
}

/// What an event of a finished command answers after a migration.
#[derive(Debug, Clone, Copy, Default)]
struct Finished {
    command_type: u32,
    /// The queue's id (0: none, as for a user event).
    queue: u64,
    /// Its profiling timestamps, if its queue had profiling on.
    profiling: Option<[u64; 5]>,
}

impl Finished {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.command_type).u64(self.queue);
        match self.profiling {
            Some(p) => {
                w.u8(1);
                for t in p {
                    w.u64(t);
                }
            }
            None => {
                w.u8(0);
            }
        }
        w.into_vec()
    }

    fn decode(b: &[u8]) -> Result<Self, MigrationError> {
        let mut r = Reader::new(b);
        let bad = MigrationError::StandInState;
        let command_type = r.u32().map_err(bad)?;
        let queue = r.u64().map_err(bad)?;
        let profiling = match r.u8().map_err(bad)? {
            0 => None,
            _ => {
                let mut p = [0u64; 5];
                for t in &mut p {
                    *t = r.u64().map_err(bad)?;
                }
                Some(p)
            }
        };
        r.finish().map_err(bad)?;
        Ok(Finished {
            command_type,
            queue,
            profiling,
        })
    }
}

/// The request as a replay reads it: byte arguments inline, or zeros standing for a
/// memory object's initial data.
fn splice(payload: &[u8], splices: &[(usize, usize, Splice)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len());
    let mut at = 0;
    for (start, end, s) in splices {
        out.extend_from_slice(&payload[at..*start]);
        match s {
            Splice::Inline(bytes) => {
                out.push(tag::INLINE);
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(bytes);
            }
            Splice::Zeros(len) => {
                out.push(tag::STAGED);
                out.extend_from_slice(&ZEROS.to_le_bytes());
                out.extend_from_slice(&(*len as u64).to_le_bytes());
            }
        }
        at = *end;
    }
    out.extend_from_slice(&payload[at..]);
    out
}

impl Migration {
    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn one_shot_callbacks(&self) -> Arc<AtomicUsize> {
        self.one_shot.clone()
    }

    pub(crate) fn replaying(&self) -> bool {
        self.replaying.load(Ordering::Acquire)
    }

    /// The answer to `function`'s query `param` of `object` if it is the stand-in of
    /// an event of a finished command (in host form: a queue as its host handle).
    pub(crate) fn stand_in_answer(
        &self,
        function: &str,
        object: *mut c_void,
        param: u32,
        queue_host: impl FnOnce(u64) -> usize,
    ) -> Option<Result<Vec<u8>, cl_int>> {
        if !matches!(function, "clGetEventInfo" | "clGetEventProfilingInfo") {
            return None;
        }
        let f = *self
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(object as usize))?;
        match (function, param) {
            ("clGetEventInfo", CL_EVENT_COMMAND_TYPE) => {
                Some(Ok(f.command_type.to_le_bytes().to_vec()))
            }
            ("clGetEventInfo", CL_EVENT_COMMAND_QUEUE) => {
                Some(Ok(queue_host(f.queue).to_le_bytes().to_vec()))
            }
            ("clGetEventProfilingInfo", p) if PROFILING.contains(&p) => Some(match f.profiling {
                Some(t) => Ok(t[(p - PROFILING.start()) as usize].to_le_bytes().to_vec()),
                // CL_PROFILING_INFO_NOT_AVAILABLE, as before.
                None => Err(-7),
            }),
            _ => None,
        }
    }

    /// The guest released event `host` for good: the host may reuse its handle.
    pub(crate) fn forget_event(&self, host: usize) {
        // Only a restored session has stand-ins; others skip the lock on each release.
        if self.restored.load(Ordering::Relaxed) {
            self.finished
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&host);
        }
    }

    pub(crate) fn retained(&self, id: u64) {
        self.log().retained(id);
    }

    pub(crate) fn released(&self, id: u64) {
        self.log().released(id);
    }

    /// Records a kept call that succeeded.
    pub(crate) fn record(&self, payload: &[u8], rec: Rec) {
        let (opcode, name) = (rec.info.opcode, rec.info.name);
        let request = splice(payload, &rec.splices);
        let why = match rec.unmigratable {
            Some(w) => Some(format!("{name} used {w}")),
            None if request.len() > MAX_REQUEST => {
                Some(format!("{name} passed more data than a kept request holds"))
            }
            None => None,
        };
        if let Some(why) = why {
            let mut u = self.unmigratable.lock().unwrap_or_else(|e| e.into_inner());
            u.get_or_insert(why);
            return;
        }
        let mut log = self.log();
        match rec.info.replay {
            Replay::Creates(_) => log.created(opcode, request, rec.creates, rec.uses),
            Replay::Configures => {
                let mut uses = rec.uses.into_iter();
                if let Some(subject) = uses.next() {
                    log.configured(opcode, request, subject, rec.key, uses.collect());
                }
            }
            _ => {}
        }
    }
}

fn mem_info<T: Copy + Default>(rt: &OpenCl, m: cl_mem, param: u32) -> Option<T> {
    info_value(|n, p, r| rt.clGetMemObjectInfo(m, param, n, p, r))
}

fn image_info<T: Copy + Default>(rt: &OpenCl, m: cl_mem, param: u32) -> Option<T> {
    info_value(|n, p, r| rt.clGetImageInfo(m, param, n, p, r))
}

/// Where a memory object's contents are and how many bytes they hold.
struct Layout {
    context: cl_context,
    /// `None`: a buffer; else an image's region.
    region: Option<[usize; 3]>,
    bytes: usize,
    /// A buffer the host may read and write: moved without a bounce buffer.
    direct: bool,
}

use opencl_sys::CL_MEM_FLAGS;
use opencl_sys::CL_TRUE;

use super::zero_copy::Mapped;
/// The kind of a stand-in that is a mapping of an object on the window
/// (`zero_copy::Mapped`), not an object: no handle kind has this number.
const WINDOW_MAPPING: u8 = 0xF0;
/// `CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS`.
const HOST_ACCESS_LIMITS: u64 = (1 << 7) | (1 << 8) | (1 << 9);

/// The layout of `m`; `None` for objects whose contents live elsewhere (sub-buffers,
/// image views of a buffer), which their parent carries.
fn layout(rt: &OpenCl, m: cl_mem) -> Result<Option<Layout>, MigrationError> {
    let ty: u32 =
        mem_info(rt, m, CL_MEM_TYPE).ok_or(MigrationError::Query("a memory object's type"))?;
    let parent: cl_mem =
        mem_info(rt, m, CL_MEM_ASSOCIATED_MEMOBJECT).unwrap_or(std::ptr::null_mut());
    let context: cl_context = mem_info(rt, m, CL_MEM_CONTEXT)
        .ok_or(MigrationError::Query("a memory object's context"))?;
    if !parent.is_null() || ty == CL_MEM_OBJECT_IMAGE1D_BUFFER {
        return Ok(None);
    }
    if ty == CL_MEM_OBJECT_BUFFER {
        let bytes: usize =
            mem_info(rt, m, CL_MEM_SIZE).ok_or(MigrationError::Query("a buffer's size"))?;
        let flags: u64 = mem_info(rt, m, CL_MEM_FLAGS).unwrap_or(HOST_ACCESS_LIMITS);
        return Ok(Some(Layout {
            context,
            region: None,
            bytes,
            direct: flags & HOST_ACCESS_LIMITS == 0,
        }));
    }
    let get =
        |p| image_info::<usize>(rt, m, p).ok_or(MigrationError::Query("an image's description"));
    let (w, h, d, a) = (
        get(CL_IMAGE_WIDTH)?,
        get(CL_IMAGE_HEIGHT)?,
        get(CL_IMAGE_DEPTH)?,
        get(CL_IMAGE_ARRAY_SIZE)?,
    );
    let region = match ty {
        CL_MEM_OBJECT_IMAGE1D => [w, 1, 1],
        CL_MEM_OBJECT_IMAGE1D_ARRAY => [w, a, 1],
        CL_MEM_OBJECT_IMAGE2D => [w, h, 1],
        CL_MEM_OBJECT_IMAGE2D_ARRAY => [w, h, a],
        CL_MEM_OBJECT_IMAGE3D => [w, h, d],
        _ => return Err(MigrationError::MemType(ty)),
    };
    let elem = get(CL_IMAGE_ELEMENT_SIZE)?;
    Ok(Some(Layout {
        context,
        region: Some(region),
        bytes: elem * region.iter().product::<usize>(),
        direct: false,
    }))
}

/// A plain buffer of `bytes` in `ctx` for moving contents (initialised from `data`).
fn bounce(
    rt: &OpenCl,
    ctx: cl_context,
    bytes: usize,
    data: Option<&[u8]>,
) -> Result<cl_mem, MigrationError> {
    let mut err = CL_SUCCESS;
    let (flags, ptr) = match data {
        Some(d) => (
            CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
            d.as_ptr() as *mut c_void,
        ),
        None => (CL_MEM_READ_WRITE, std::ptr::null_mut()),
    };
    rt.clCreateBuffer(ctx, flags, bytes.max(1), ptr, &mut err)
        .filter(|m| !m.is_null() && err == CL_SUCCESS)
        .ok_or(MigrationError::Bounce { bytes, status: err })
}

fn check(status: Option<cl_int>, what: &'static str) -> Result<(), MigrationError> {
    match status {
        Some(CL_SUCCESS) => Ok(()),
        status => Err(MigrationError::Host { what, status }),
    }
}

/// Reads `m`'s contents through a bounce buffer (so host-access flags do not matter).
fn read_contents(
    rt: &OpenCl,
    qs: &mut Queues<'_>,
    m: cl_mem,
    l: &Layout,
) -> Result<Vec<u8>, MigrationError> {
    let q = qs.for_context(l.context)?;
    let mut out = vec![0u8; l.bytes];
    let tmp = if l.direct {
        None
    } else {
        Some(bounce(rt, l.context, l.bytes, None)?)
    };
    let res = tmp
        .map_or(Ok(()), |t| bounce_copy(rt, q, l, m, t, true))
        .and_then(|()| {
            check(
                rt.clEnqueueReadBuffer(
                    q,
                    tmp.unwrap_or(m),
                    1,
                    0,
                    l.bytes,
                    out.as_mut_ptr().cast(),
                    0,
                    std::ptr::null(),
                    std::ptr::null_mut(),
                ),
                "reading contents",
            )
        });
    if let Some(t) = tmp {
        rt.clReleaseMemObject(t);
    }
    res.map(|()| out)
}

/// Copies between memory object `m` and its bounce buffer `tmp` (`out`: from the
/// object), on `q`.
fn bounce_copy(
    rt: &OpenCl,
    q: cl_command_queue,
    l: &Layout,
    m: cl_mem,
    tmp: cl_mem,
    out: bool,
) -> Result<(), MigrationError> {
    let (none, no_list, origin) = (std::ptr::null_mut(), std::ptr::null(), [0usize; 3]);
    let status = match (l.region, out) {
        (None, true) => rt.clEnqueueCopyBuffer(q, m, tmp, 0, 0, l.bytes, 0, no_list, none),
        (None, false) => rt.clEnqueueCopyBuffer(q, tmp, m, 0, 0, l.bytes, 0, no_list, none),
        (Some(region), true) => rt.clEnqueueCopyImageToBuffer(
            q,
            m,
            tmp,
            origin.as_ptr(),
            region.as_ptr(),
            0,
            0,
            no_list,
            none,
        ),
        (Some(region), false) => rt.clEnqueueCopyBufferToImage(
            q,
            tmp,
            m,
            0,
            origin.as_ptr(),
            region.as_ptr(),
            0,
            no_list,
            none,
        ),
    };
    check(status, "copying contents")
}

fn write_contents(
    rt: &OpenCl,
    qs: &mut Queues<'_>,
    m: cl_mem,
    data: &[u8],
) -> Result<(), MigrationError> {
    let l = layout(rt, m)?.ok_or(MigrationError::Inconsistent(
        "contents for an object that holds none",
    ))?;
    if l.bytes != data.len() {
        return Err(MigrationError::ContentsSize {
            got: data.len(),
            want: l.bytes,
        });
    }
    if data.is_empty() {
        return Ok(());
    }
    let q = qs.for_context(l.context)?;
    if l.direct {
        return check(
            rt.clEnqueueWriteBuffer(
                q,
                m,
                1,
                0,
                l.bytes,
                data.as_ptr().cast(),
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
            ),
            "writing contents",
        );
    }
    let tmp = bounce(rt, l.context, l.bytes, Some(data))?;
    let res = bounce_copy(rt, q, &l, m, tmp, false)
        .and_then(|()| check(rt.clFinish(q), "finishing a restore"));
    rt.clReleaseMemObject(tmp);
    res
}

impl OpenClBackend {
    /// Points the one device the snapshot's calls name at host device `k`.
    fn retarget(&self, snap: &Snapshot, k: u32) -> Result<(), MigrationError> {
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let devices: Vec<(u64, usize)> = {
            let mut d: Vec<_> = handles
                .objects()
                .into_iter()
                .filter(|o| o.1 == Kind::Device)
                .map(|o| (o.0, o.2))
                .collect();
            // Found in the host's order, so ids follow it.
            d.sort_unstable();
            d
        };
        let target = devices
            .get(k as usize)
            .ok_or(MigrationError::NoDevice {
                index: k,
                count: devices.len(),
            })?
            .0;
        let used: HashSet<u64> = snap
            .entries
            .iter()
            .flat_map(|e| e.uses.iter().copied())
            .filter(|id| devices.iter().any(|d| d.0 == *id))
            .collect();
        match used.len() {
            0 => Ok(()),
            1 => {
                let from = *used.iter().next().unwrap_or_else(|| unreachable!());
                if from != target && !handles.swap(from, target) {
                    return Err(MigrationError::DeviceSwap);
                }
                Ok(())
            }
            n => Err(MigrationError::Devices(n)),
        }
    }

    /// Captures the quiesced session (no call runs; the guest's input read and not
    /// executed is `pending`): drains the device, then writes the log, the stand-ins
    /// and the contents of every memory object into a snapshot.
    pub(crate) fn capture_session(&self, pending: Vec<u8>) -> Result<Vec<u8>, MigrationError> {
        let m = &self.migration;
        if let Some(why) = m
            .unmigratable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(MigrationError::Unmigratable(why));
        }
        if !self.svm.is_empty() {
            return Err(MigrationError::Svm);
        }
        if !self.staging.is_empty() {
            return Err(MigrationError::Staging);
        }
        let rt = self.rt;
        let objects = self
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .objects();
        let queues: Vec<cl_command_queue> = objects
            .iter()
            .filter(|o| o.1 == Kind::Queue)
            .map(|o| o.2 as cl_command_queue)
            .collect();
        drain(rt, &queues, || {
            self.open_user_events.load(Ordering::Acquire) > 0
        })?;
        let start = Instant::now();
        while m.one_shot.load(Ordering::Acquire) > 0 || !self.deferred.is_idle() {
            if start.elapsed() > CALLBACKS_DRAIN {
                return Err(MigrationError::Callback);
            }
            self.deferred.settle();
            std::thread::yield_now();
        }
        let mut log = m.log();
        log.compact();
        let logged: HashSet<u64> = log
            .entries()
            .flat_map(|e| e.creates.iter().copied())
            .collect();
        let mut qs = Queues::new(rt);
        let mut contents = Vec::new();
        let mut standins = Vec::new();
        let handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        for &(id, kind, host, refs) in &objects {
            match kind {
                Kind::Mem if logged.contains(&id) => {
                    if let Some(l) = layout(rt, host as cl_mem)? {
                        contents.push((id, read_contents(rt, &mut qs, host as cl_mem, &l)?));
                    }
                }
                Kind::Event if refs > 0 && !logged.contains(&id) => {
                    let ctx: cl_context = info_value(|n, p, r| {
                        rt.clGetEventInfo(host as _, CL_EVENT_CONTEXT, n, p, r)
                    })
                    .ok_or(MigrationError::Query("an event's context"))?;
                    let owner = handles.id_of(Kind::Context, ctx as usize).ok_or(
                        MigrationError::Inconsistent(
                            "an event of a context the guest no longer names",
                        ),
                    )?;
                    let ev = host as opencl_sys::cl_event;
                    let earlier = m
                        .finished
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&host)
                        .copied();
                    let finished = match earlier {
                        // Moved before: it tells what it told then.
                        Some(f) => f,
                        None => {
                            let queue: cl_command_queue = info_value(|n, p, r| {
                                rt.clGetEventInfo(ev, CL_EVENT_COMMAND_QUEUE, n, p, r)
                            })
                            .unwrap_or(std::ptr::null_mut());
                            let mut profiling = [0u64; 5];
                            let timed = PROFILING.zip(profiling.iter_mut()).all(|(p, t)| {
                                info_value(|n, v, r| rt.clGetEventProfilingInfo(ev, p, n, v, r))
                                    .map(|v| *t = v)
                                    .is_some()
                            });
                            Finished {
                                command_type: info_value(|n, p, r| {
                                    rt.clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, n, p, r)
                                })
                                .ok_or(MigrationError::Query("an event's command type"))?,
                                queue: handles.id_of(Kind::Queue, queue as usize).unwrap_or(0),
                                profiling: timed.then_some(profiling),
                            }
                        }
                    };
                    standins.push(StandIn {
                        id,
                        kind: Kind::Event as u8,
                        owner,
                        refs,
                        state: finished.encode(),
                    });
                }
                Kind::Platform | Kind::Device => {}
                _ if refs > 0 && !logged.contains(&id) => {
                    return Err(MigrationError::Unlogged(format!("{kind:?}")));
                }
                _ => {}
            }
        }
        drop(handles);
        // Mappings of objects on the window that the guest will unmap on the target.
        for mapped in self.window_objects.mapped() {
            standins.push(StandIn {
                id: mapped.mem,
                kind: WINDOW_MAPPING,
                owner: 0,
                refs: 1,
                state: mapped.encode(),
            });
        }
        contents.sort_unstable_by_key(|c| c.0);
        standins.sort_unstable_by_key(|s| s.id);
        let mut snap = Snapshot::of(u16::from(hira_apis_opencl::API.0), &log, contents);
        snap.standins = standins;
        snap.pending = pending;
        Ok(snap.encode())
    }

    /// Maps an object on the window as the guest had it mapped on the source: the same
    /// region of the same object memory, so the same window offset.
    fn map_again(
        &self,
        qs: &mut Queues<'_>,
        m: cl_mem,
        mapped: Mapped,
    ) -> Result<(), MigrationError> {
        let rt = self.rt;
        let ctx: cl_context = mem_info(rt, m, CL_MEM_CONTEXT)
            .ok_or(MigrationError::Query("a memory object's context"))?;
        let ty: u32 =
            mem_info(rt, m, CL_MEM_TYPE).ok_or(MigrationError::Query("a memory object's type"))?;
        let q = qs.for_context(ctx)?;
        let mut err = CL_SUCCESS;
        let (o, r) = (mapped.origin, mapped.region);
        let p = if ty == CL_MEM_OBJECT_BUFFER {
            rt.clEnqueueMapBuffer(
                q,
                m,
                CL_TRUE,
                mapped.flags,
                o[0],
                r[0],
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
                &mut err,
            )
        } else {
            let (mut row, mut slice) = (0usize, 0usize);
            rt.clEnqueueMapImage(
                q,
                m,
                CL_TRUE,
                mapped.flags,
                o.as_ptr(),
                r.as_ptr(),
                &mut row,
                &mut slice,
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
                &mut err,
            )
        };
        check(p.map(|_| err), "mapping an object on the window again")?;
        let at = p.and_then(|p| self.window_objects.offset_of(p as usize));
        if at != Some(mapped.offset) {
            return Err(MigrationError::Inconsistent(
                "an object on the window maps elsewhere on the target",
            ));
        }
        self.window_objects.remapped(mapped);
        Ok(())
    }

    /// Restores a snapshot into this fresh session: replays the log, makes the
    /// stand-ins, writes the contents and sets the guest's reference counts. With
    /// `device`, the device the session used becomes the host's device of that index
    /// (its id then names it; the device that had that id gets the old one's). Returns
    /// the guest's input to execute first.
    pub(crate) fn restore_session(
        &self,
        bytes: &[u8],
        device: Option<u32>,
        window: Option<&crate::window::WindowMap>,
    ) -> Result<Vec<u8>, MigrationError> {
        let snap = Snapshot::decode(bytes)?;
        if snap.api != u16::from(hira_apis_opencl::API.0) {
            return Err(MigrationError::WrongApi);
        }
        let rt = self.rt;
        let m = &self.migration;
        if let Some(k) = device {
            self.retarget(&snap, k)?;
        }
        m.replaying.store(true, Ordering::Release);
        let replayed = (|| {
            // Objects made on the window are made again on the same regions.
            let frame = FrameData {
                spans: &[],
                window,
                no_reply: false,
            };
            let mut w = Writer::new();
            for e in &snap.entries {
                let name = op_info(e.opcode).map_or("an unknown call", |o| o.name);
                if Rec::of(e.opcode).is_none() {
                    return Err(MigrationError::NotLogged(name));
                }
                w.clear();
                // Objects the host named get the ids it gave them the first time.
                let host_ids = e.creates.iter().copied().filter(|id| id & HOST_ID_BIT != 0);
                let mut s = Session::replaying(self, host_ids.collect());
                let mut r = Reader::new(&e.request);
                super::generated::dispatch(&mut s, e.opcode, &mut r, &frame, &mut w)
                    .map_err(|source| MigrationError::Replay { name, source })?;
                let status = w.as_slice().get(..4).map_or(CL_SUCCESS, |b| {
                    i32::from_le_bytes(b.try_into().unwrap_or_default())
                });
                if status != CL_SUCCESS {
                    return Err(MigrationError::ReplayStatus { name, status });
                }
                if !s.replayed_alike() {
                    return Err(MigrationError::ReplayDiffers(name));
                }
                self.deferred.settle();
            }
            Ok(())
        })();
        m.replaying.store(false, Ordering::Release);
        replayed?;
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        let mut mappings = Vec::new();
        for si in &snap.standins {
            if si.kind == WINDOW_MAPPING {
                mappings.push(Mapped::decode(si.id, &si.state).ok_or(
                    MigrationError::Inconsistent("a mapping the snapshot holds does not read"),
                )?);
                continue;
            }
            if si.kind != Kind::Event as u8 || si.refs == 0 {
                return Err(MigrationError::Inconsistent(
                    "the snapshot holds a stand-in this build cannot make",
                ));
            }
            let ctx =
                handles
                    .host_of(si.owner, Kind::Context)
                    .ok_or(MigrationError::Inconsistent(
                        "a stand-in event of an unknown context",
                    ))?;
            if handles.host_of(si.id, Kind::Event).is_some() {
                return Err(MigrationError::Inconsistent(
                    "a stand-in names a live object",
                ));
            }
            let mut err = CL_SUCCESS;
            let ev = rt
                .clCreateUserEvent(ctx as cl_context, &mut err)
                .filter(|e| !e.is_null() && err == CL_SUCCESS)
                .ok_or(MigrationError::StandIn(err))?;
            let finished = Finished::decode(&si.state)?;
            if finished.queue != 0 && handles.host_of(finished.queue, Kind::Queue).is_none() {
                return Err(MigrationError::Inconsistent(
                    "a stand-in event of an unknown queue",
                ));
            }
            m.restored.store(true, Ordering::Relaxed);
            m.finished
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ev as usize, finished);
            handles.insert(si.id, Kind::Event, ev as usize, si.refs);
            check(
                rt.clSetUserEventStatus(ev, CL_COMPLETE),
                "completing a stand-in event",
            )?;
            for _ in 1..si.refs {
                handles::retain(rt, Kind::Event, ev.cast());
            }
        }
        let mut qs = Queues::new(rt);
        for (id, data) in &snap.contents {
            let host = handles
                .host_of(*id, Kind::Mem)
                .ok_or(MigrationError::Inconsistent(
                    "contents for an object the log did not make",
                ))?;
            write_contents(rt, &mut qs, host as cl_mem, data)?;
        }
        for mapped in mappings {
            let host =
                handles
                    .host_of(mapped.mem, Kind::Mem)
                    .ok_or(MigrationError::Inconsistent(
                        "a mapping of an object the log did not make",
                    ))?;
            self.map_again(&mut qs, host as cl_mem, mapped)?;
        }
        drop(qs);
        // Every object the log made holds one reference; the guest's count goes back
        // on, and objects only kept for others lose theirs.
        let refs: HashMap<u64, u32> = snap.refs.iter().copied().collect();
        let made: HashMap<u64, (Kind, usize)> = handles
            .objects()
            .into_iter()
            .map(|(id, kind, host, _)| (id, (kind, host)))
            .collect();
        for e in snap.entries.iter().rev() {
            for &id in &e.creates {
                let Some(&(kind, host)) = made.get(&id) else {
                    continue;
                };
                match refs.get(&id).copied().unwrap_or(0) {
                    0 => {
                        handles.forget(id);
                        handles::release(rt, kind, host as *mut c_void);
                    }
                    n => {
                        for _ in 1..n {
                            handles::retain(rt, kind, host as *mut c_void);
                        }
                        handles.set_refs(id, n);
                    }
                }
            }
        }
        drop(handles);
        // User events the application has not set yet go on waiting for it.
        let count = |op| snap.entries.iter().filter(|e| e.opcode == op).count();
        let open = count(op::clCreateUserEvent).saturating_sub(count(op::clSetUserEventStatus));
        self.open_user_events.store(open, Ordering::Release);
        *m.log() = snap.log();
        Ok(snap.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_request_carries_data_inline_and_initial_contents_as_zeros() {
        let payload = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let out = splice(
            &payload,
            &[
                (1, 3, Splice::Inline(vec![9, 9])),
                (5, 7, Splice::Zeros(4096)),
            ],
        );
        let mut r = Reader::new(&out);
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u8().unwrap(), tag::INLINE);
        assert_eq!(r.bytes(16).unwrap(), [9, 9]);
        assert_eq!(r.u8().unwrap(), 4);
        assert_eq!(r.u8().unwrap(), 5);
        assert_eq!(r.u8().unwrap(), tag::STAGED);
        assert_eq!(r.u64().unwrap(), ZEROS);
        assert_eq!(r.u64().unwrap(), 4096);
        assert_eq!(r.u8().unwrap(), 8);
        r.finish().unwrap();
    }

    #[test]
    fn a_finished_event_reads_back_as_written() {
        for f in [
            Finished {
                command_type: 0x11F0,
                queue: 5,
                profiling: Some([1, 2, 3, 4, 5]),
            },
            Finished::default(),
        ] {
            let back = Finished::decode(&f.encode()).unwrap();
            assert_eq!(
                (back.command_type, back.queue, back.profiling),
                (f.command_type, f.queue, f.profiling)
            );
        }
        assert!(Finished::decode(&[1, 2, 3]).is_err());
    }
}
