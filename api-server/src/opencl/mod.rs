//! The OpenCL backend.
//!
//! - [`session`]: the per-call view the generated dispatch works on (ids, references,
//!   completion reports, migration's record).
//! - [`handles`]: the handle table.
//! - [`args`]: decoding and checking each kind of argument.
//! - [`callbacks`]: host callbacks that notify the guest's.
//! - [`info`]: info queries, host objects rewritten as ids.
//! - `generated`: one function per remoted call, generated from
//!   `protocol/api/opencl.api`.
//! - [`custom`]: host calls that need more than a direct call (platform selection).
//! - [`command_buffer`], [`content_size`]: the extensions whose entry points are
//!   forwarded.
//! - [`builds`]: program builds with the headers the guest shipped.
//! - [`deferred`]: outputs of non-blocking reads, delivered when the host completes them.
//! - [`svm`]: coarse-grained buffer SVM allocations.
//! - [`staging`]: transfers larger than a frame or the data window.
//! - [`sizes`]: byte counts of image arguments, recomputed from decoded arguments so
//!   that the host never reads past what the guest sent.

pub mod args;
pub mod builds;
pub mod callbacks;
pub mod command_buffer;
pub mod content_size;
pub mod custom;
pub mod deferred;
pub mod device_time;
pub mod handles;
pub mod info;
pub mod migrate;
pub(crate) mod queues;
pub mod session;
pub(crate) mod sizes;
pub mod staging;
pub mod svm;
pub mod zero_copy;

use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cl3::OpenCl;
use hira_apis_opencl::{op, op_info};
use hira_protocol::{Reader, Writer};
use log::{info, warn};
use opencl_sys::{cl_platform_id, cl_uint};

use opencl_sys::CL_DEVICE_TYPE_ALL;
use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_OUT_OF_RESOURCES;

use crate::backend::{Backend, BackendError, Fail, FrameData, MigrationError, TeardownReport};
use crate::server::FrameWriter;
pub use handles::Handles;
pub use session::Session;

/// Generated dispatch.
mod generated {
    use std::ffi::{c_char, c_uchar, c_void};
    use std::mem::size_of;

    use hira_apis_opencl::{Kind, op};
    use hira_protocol::{Reader, Writer};
    use libc::size_t;
    use opencl_sys::*;

    use super::sizes;
    use crate::backend::{Fail, FrameData};
    use crate::opencl::Session;

    use opencl_sys::CL_INVALID_EVENT_WAIT_LIST;
    const ZERO_ORIGIN: [usize; 3] = [0; 3];

    include!(concat!(env!("OUT_DIR"), "/opencl_server.rs"));
}

/// Executes OpenCL calls for one guest application.
pub struct OpenClBackend {
    pub(crate) rt: &'static OpenCl,
    /// The host platform this server exposes.
    pub(crate) platform: cl_platform_id,
    pub(crate) handles: Arc<Mutex<Handles>>,
    pub(crate) writer: Arc<FrameWriter>,
    pub(crate) deferred: Arc<deferred::Deferred>,
    pub(crate) builds: builds::Builds,
    pub(crate) staging: Arc<staging::Staging>,
    pub(crate) svm: svm::Svm,
    /// Device memory charged to the VM's quota.
    pub(crate) quota: Arc<crate::account::Account>,
    /// Device time measured, and the VM's scheduling decision applied.
    pub(crate) device_time: device_time::DeviceTime,
    /// User events created and not yet given a status: while there are any, a call
    /// that blocks may be waiting for the guest to set one.
    open_user_events: AtomicUsize,
    /// The log and state migration needs.
    pub(crate) migration: migrate::Migration,
    /// Queues of the server's own that write streamed initial contents.
    pub(crate) fills: Mutex<queues::Queues<'static>>,
    /// Events of commands the guest holds and has not been told the end of, by id:
    /// (event, queue) host handles (`Session::report_completed`).
    pub(crate) unreported: Mutex<std::collections::HashMap<u64, (usize, usize)>>,
    /// Kernels a command buffer recorded (by id): a later change of their arguments
    /// would not be what a replay records, so it keeps the session from moving.
    pub(crate) recorded_kernels: Mutex<std::collections::HashSet<u64>>,
    /// Memory objects made on the guest's data window, until the host destroys them.
    pub(crate) window_objects: zero_copy::WindowObjects,
}

impl std::fmt::Debug for OpenClBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClBackend")
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

// SAFETY: `platform` is an opaque host handle valid for the process's life; OpenCL
// objects may be used from any thread.
unsafe impl Send for OpenClBackend {}
// SAFETY: as above; mutable state is behind mutexes.
unsafe impl Sync for OpenClBackend {}

fn platform_name(rt: &OpenCl, p: cl_platform_id) -> String {
    let mut buf = vec![0u8; 1024];
    let mut n = 0usize;
    // SAFETY: `buf` has 1024 writable bytes; `n` receives the size.
    let status = rt.clGetPlatformInfo(p, 0x0902, buf.len(), buf.as_mut_ptr().cast(), &mut n);
    if status != Some(0) {
        return String::new();
    }
    CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The names of the host's OpenCL platforms, Hira's own excluded.
pub fn platform_names() -> Result<Vec<String>, BackendError> {
    let rt = cl3::load_library()
        .as_ref()
        .map_err(|e| BackendError::NoOpenCl(e.to_string()))?;
    let mut n: cl_uint = 0;
    if rt.clGetPlatformIDs(0, std::ptr::null_mut(), &mut n) != Some(0) || n == 0 {
        return Ok(Vec::new());
    }
    let mut ids = vec![std::ptr::null_mut(); n as usize];
    rt.clGetPlatformIDs(n, ids.as_mut_ptr(), std::ptr::null_mut());
    Ok(ids
        .iter()
        .map(|&p| platform_name(rt, p))
        .filter(|name| !name.starts_with("Hira"))
        .collect())
}

/// What an API server sees of the host's OpenCL, one line each: its platforms
/// (`opencl platform: NAME`) and each one's devices (`opencl device: PLATFORM: NAME`),
/// Hira's own platform excluded; or why it sees none (`opencl: ...`).
pub fn probe() -> Vec<String> {
    let rt = match cl3::load_library().as_ref() {
        Ok(rt) => rt,
        Err(e) => return vec![format!("opencl: {}", BackendError::NoOpenCl(e.to_string()))],
    };
    let mut n: cl_uint = 0;
    if rt.clGetPlatformIDs(0, std::ptr::null_mut(), &mut n) != Some(0) || n == 0 {
        return vec!["opencl: no platform".into()];
    }
    let mut ids = vec![std::ptr::null_mut(); n as usize];
    rt.clGetPlatformIDs(n, ids.as_mut_ptr(), std::ptr::null_mut());
    let mut lines = Vec::new();
    for &p in &ids {
        let name = platform_name(rt, p);
        if name.starts_with("Hira") {
            continue;
        }
        lines.push(format!("opencl platform: {name}"));
        let mut count: cl_uint = 0;
        // CL_DEVICE_TYPE_ALL.
        if rt.clGetDeviceIDs(p, 0xFFFF_FFFF, 0, std::ptr::null_mut(), &mut count) != Some(0) {
            continue;
        }
        let mut devices = vec![std::ptr::null_mut(); count as usize];
        rt.clGetDeviceIDs(
            p,
            0xFFFF_FFFF,
            count,
            devices.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        for d in devices {
            let mut buf = vec![0u8; 1024];
            // CL_DEVICE_NAME.
            // SAFETY: `buf` has 1024 writable bytes.
            let st = rt.clGetDeviceInfo(
                d,
                0x102B,
                buf.len(),
                buf.as_mut_ptr().cast(),
                std::ptr::null_mut(),
            );
            let device = if st == Some(0) {
                CStr::from_bytes_until_nul(&buf)
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default()
            } else {
                String::new()
            };
            lines.push(format!("opencl device: {name}: {}", device.trim()));
        }
    }
    if lines.is_empty() {
        lines.push("opencl: no platform".into());
    }
    lines
}

impl OpenClBackend {
    /// Loads the host OpenCL library and picks the platform to expose: the first
    /// whose name contains `wanted`, or the first that is not Hira itself.
    pub fn new(
        wanted: Option<&str>,
        writer: Arc<FrameWriter>,
        quota: Arc<crate::account::Account>,
    ) -> Result<Self, BackendError> {
        let rt = cl3::load_library()
            .as_ref()
            .map_err(|e| BackendError::NoOpenCl(e.to_string()))?;
        let mut n: cl_uint = 0;
        let status = rt.clGetPlatformIDs(0, std::ptr::null_mut(), &mut n);
        if status != Some(0) || n == 0 {
            return Err(BackendError::NoPlatform(status));
        }
        let mut ids = vec![std::ptr::null_mut(); n as usize];
        rt.clGetPlatformIDs(n, ids.as_mut_ptr(), std::ptr::null_mut());
        let chosen = ids.iter().copied().find(|&p| {
            let name = platform_name(rt, p);
            match wanted {
                Some(w) => name.contains(w),
                None => !name.starts_with("Hira"),
            }
        });
        let platform = chosen.ok_or_else(|| match wanted {
            Some(w) => BackendError::NoMatchingPlatform(w.to_string()),
            None => BackendError::OnlyHira,
        })?;
        info!("serving host platform {:?}", platform_name(rt, platform));
        content_size::resolve(rt, platform);
        // The platform and its devices get the same ids in every session, in the host's
        // order, so that a guest whose API server was lost keeps using its platform
        // and device handles with the next one.
        let mut handles = Handles::default();
        handles.found(hira_apis_opencl::Kind::Platform, platform as usize);
        let mut n: cl_uint = 0;
        if rt.clGetDeviceIDs(
            platform,
            CL_DEVICE_TYPE_ALL,
            0,
            std::ptr::null_mut(),
            &mut n,
        ) == Some(0)
        {
            let mut devices = vec![std::ptr::null_mut(); n as usize];
            if rt.clGetDeviceIDs(
                platform,
                CL_DEVICE_TYPE_ALL,
                n,
                devices.as_mut_ptr(),
                std::ptr::null_mut(),
            ) == Some(0)
            {
                command_buffer::resolve(rt, platform, &devices);
                for d in devices {
                    handles.found(hira_apis_opencl::Kind::Device, d as usize);
                }
            }
        }
        Ok(OpenClBackend {
            rt,
            platform,
            handles: Arc::new(Mutex::new(handles)),
            deferred: Arc::new(deferred::Deferred::new(rt, writer.clone())),
            builds: builds::Builds::default(),
            staging: Arc::new(staging::Staging::default()),
            svm: svm::Svm::new(quota.clone()),
            device_time: device_time::DeviceTime::new(rt, quota.clone()),
            quota,
            open_user_events: AtomicUsize::new(0),
            migration: migrate::Migration::default(),
            fills: Mutex::new(queues::Queues::new(rt)),
            unreported: Mutex::default(),
            recorded_kernels: Mutex::default(),
            window_objects: zero_copy::WindowObjects::default(),
            writer,
        })
    }
}

impl Backend for OpenClBackend {
    fn execute(
        &self,
        opcode: u16,
        payload: &[u8],
        frame: &FrameData<'_>,
        w: &mut Writer,
    ) -> Result<(), Fail> {
        let mut r = Reader::new(payload);
        let mut s = match migrate::Rec::of(opcode) {
            Some(rec) => Session::recording(self, rec),
            None => Session::new(self),
        };
        let mut res = generated::dispatch(&mut s, opcode, &mut r, frame, w);
        if frame.no_reply
            && let Some(token) = s.unclaimed_output()
        {
            // A read sent without a reply (a chunk of a streamed read) failed: its
            // output's token says so, which is how the guest hears of it; nothing is
            // reported again at its next synchronising call.
            let status = match &res {
                Ok(()) => w.as_slice().get(..4).map_or(CL_OUT_OF_RESOURCES, |b| {
                    i32::from_le_bytes(b.try_into().unwrap_or_default())
                }),
                Err(Fail::Status(st)) => *st,
                Err(_) => CL_INVALID_VALUE,
            };
            self.deferred.done_now(
                token,
                if status < 0 {
                    status
                } else {
                    CL_OUT_OF_RESOURCES
                },
            );
            w.clear();
            w.i32(0);
            res = Ok(());
        }
        // Whatever this call showed complete, the guest must hold its data first.
        self.deferred.settle();
        let succeeded = res.is_ok() && w.as_slice().get(..4) == Some(&[0, 0, 0, 0]);
        if succeeded && let Some(rec) = s.take_rec() {
            self.migration.record(payload, rec);
        }
        if succeeded && opcode == op::clCreateUserEvent {
            self.open_user_events.fetch_add(1, Ordering::AcqRel);
        } else if succeeded && opcode == op::clSetUserEventStatus {
            // Setting a status succeeds once per user event.
            let _ = self
                .open_user_events
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
        res
    }

    fn name(&self, opcode: u16) -> &'static str {
        op_info(opcode).map_or("unknown call", |o| o.name)
    }

    fn may_block(&self, opcode: u16) -> bool {
        op_info(opcode).is_some_and(|o| o.may_block)
    }

    fn may_print(&self, opcode: u16) -> bool {
        self.may_block(opcode)
            || matches!(
                opcode,
                op::clBuildProgram | op::clCompileProgram | op::clLinkProgram
            )
    }

    fn may_wait_on_guest(&self, opcode: u16) -> bool {
        self.may_block(opcode) && self.open_user_events.load(Ordering::Acquire) > 0
    }

    fn may_async(&self, opcode: u16) -> Option<bool> {
        op_info(opcode).map(|o| o.may_async)
    }

    fn capture(&self, pending: Vec<u8>) -> Result<Vec<u8>, MigrationError> {
        self.capture_session(pending)
    }

    fn restore(
        &self,
        snapshot: &[u8],
        device: Option<u32>,
        window: Option<&crate::window::WindowMap>,
    ) -> Result<Vec<u8>, MigrationError> {
        self.restore_session(snapshot, device, window)
    }

    fn guest_gone(&self) {
        // Commands held for the VM's decision go now: a worker may be waiting for
        // one (a blocking call), and is joined next.
        self.device_time.open_all();
    }

    fn teardown(&self) -> TeardownReport {
        // Nothing may wait for a scheduling decision any more.
        self.device_time.open_all();
        // The server's own queues hold their contexts.
        self.fills.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // SVM allocations go first, while their contexts are alive.
        let svm_freed = self.svm.free_all(self.rt);
        let leftovers = self
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain_owned();
        let mut report = TeardownReport {
            released: svm_freed,
            ..TeardownReport::default()
        };
        for (kind, host, refs) in leftovers {
            for _ in 0..refs {
                let ptr = host as *mut c_void;
                let status = handles::release(self.rt, kind, ptr);
                if status == Some(0) {
                    report.released += 1;
                } else {
                    warn!("releasing a leftover {kind:?} failed: {status:?}");
                    report.failed += 1;
                }
            }
        }
        report
    }
}

/// A backend on the host's OpenCL (PoCL in tests) whose frames to the guest are kept,
/// for unit tests. Tests that use the host's OpenCL run one at a time: PoCL 3.1 and the
/// ICD loader do not expect a process to set up platforms from several threads at once
/// (an API server does it once), and a device query made meanwhile can find none.
#[cfg(test)]
pub(crate) struct TestBackend {
    // Dropped in this order: the backend before the lock.
    pub backend: OpenClBackend,
    pub sink: crate::null::Sink,
    _serial: std::sync::MutexGuard<'static, ()>,
}

#[cfg(test)]
pub(crate) fn test_backend() -> TestBackend {
    static SERIAL: Mutex<()> = Mutex::new(());
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sink = crate::null::Sink::default();
    let writer = Arc::new(FrameWriter::new(sink.clone()));
    let account = Arc::new(crate::account::Account::new(None, None));
    let backend = OpenClBackend::new(None, writer, account)
        .expect("the host's OpenCL platform (PoCL in tests)");
    TestBackend {
        backend,
        sink,
        _serial: serial,
    }
}
