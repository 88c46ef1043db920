//! The CUDA backend: the driver API on the host's `libcuda.so.1`, found and loaded
//! by `cudarc` (its library search: `libcuda.so`, `libcuda.so.1`, ... on the library
//! path).
//!
//! - `generated`: the table of host functions (`Driver`, each resolved by name, `None`
//!   where the driver lacks it) and one function per remoted call, generated from
//!   `protocol/api/cuda.api`.
//! - [`custom`]: the calls that need more than one host call (context creation, a
//!   function's parameter layout, launches, copies back on a stream, error texts).
//!
//! Host functions are called through signatures generated from the description with
//! the status as a plain `c_int`: `cudarc`'s bindings type it as a Rust enum, and a
//! driver newer than the bindings may return a code the enum lacks.

mod arrays;
pub mod custom;
pub mod device_time;
pub mod migrate;
pub mod params;
pub mod placement;

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

use hira_apis_cuda::{HOST_ID_BIT, Kind, op_info, status};
use hira_protocol::api::tag;
use hira_protocol::{Reader, Writer};
use log::{info, warn};

use crate::account::Account;
use crate::backend::{Backend, BackendError, Fail, FrameData, MigrationError, TeardownReport};

type CUcontext = *mut c_void;

/// Generated dispatch.
mod generated {
    #![allow(clippy::type_complexity, clippy::needless_ifs, clippy::collapsible_if)]
    use std::ffi::{c_char, c_int, c_uint, c_void};

    use hira_apis_cuda::{Kind, op};
    use hira_protocol::{Reader, Writer};

    use super::{Lib, Session};
    use crate::backend::{Fail, FrameData};

    type CUcontext = *mut c_void;
    type CUmodule = *mut c_void;
    type CUlibrary = *mut c_void;
    type CUfunction = *mut c_void;
    type CUstream = *mut c_void;
    type CUevent = *mut c_void;
    type CUarray = *mut c_void;

    include!(concat!(env!("OUT_DIR"), "/cuda_server.rs"));
}

pub(crate) use generated::Driver;

/// A kernel's parameters: (offset, size) each, shared by every launch of it.
pub(crate) type Layout = Arc<[(u32, u32)]>;

/// `cuLibraryLoadData`.
type LibraryLoadData = unsafe extern "C" fn(
    *mut *mut c_void,
    *const c_void,
    *mut c_int,
    *mut *mut c_void,
    c_uint,
    *mut c_int,
    *mut *mut c_void,
    c_uint,
) -> c_int;

/// `cuLaunchKernelEx`.
pub(crate) type LaunchKernelEx = unsafe extern "C" fn(
    *const hira_apis_cuda_private::launch::Config,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;

/// Host functions reached through Hira's own calls (`hiraLibraryLoad`) or used by
/// the API server itself; `None` where the host's driver lacks them.
#[allow(non_snake_case)]
pub(crate) struct Extra {
    pub(crate) cuLibraryLoadData: Option<LibraryLoadData>,
    pub(crate) cuKernelGetParamInfo:
        Option<unsafe extern "C" fn(*mut c_void, usize, *mut usize, *mut usize) -> c_int>,
    pub(crate) cuKernelGetFunction:
        Option<unsafe extern "C" fn(*mut *mut c_void, *mut c_void) -> c_int>,
    pub(crate) cuPointerGetAttribute:
        Option<unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int>,
    pub(crate) cuPointerGetAttributes:
        Option<unsafe extern "C" fn(c_uint, *const c_int, *mut *mut c_void, u64) -> c_int>,
    pub(crate) cuLaunchKernelEx: Option<LaunchKernelEx>,
    pub(crate) cuMemcpy3D_v2:
        Option<unsafe extern "C" fn(*const hira_apis_cuda_private::copy2d::Memcpy3D) -> c_int>,
}

/// The loaded driver library.
pub(crate) struct Lib(&'static libloading::Library);

impl Lib {
    /// Finds the driver as `cudarc` does; `None` when the host has none.
    fn open() -> Option<Lib> {
        // SAFETY: loading the driver library runs its initialisers, which is what
        // using CUDA means; cudarc keeps it loaded for the process.
        unsafe {
            if !cudarc::driver::sys::is_culib_present() {
                return None;
            }
            Some(Lib(cudarc::driver::sys::culib()))
        }
    }

    /// The function `name`, of type `T`.
    ///
    /// # Safety
    /// `T` must be the function's C signature.
    pub(crate) unsafe fn get<T: Copy>(&self, name: &CStr) -> Option<T> {
        // SAFETY: the caller's promise.
        unsafe { self.0.get::<T>(name.to_bytes_with_nul()) }
            .ok()
            .map(|s| *s)
    }
}

impl crate::handles::ObjectKind for Kind {
    /// The driver API has no reference counts the guest could hold.
    fn counted(self, _guest_refs: u32) -> bool {
        false
    }
}

/// The session's objects: guest ids and the host handles they stand for.
#[derive(Default)]
struct Handles {
    /// Ids to host handles and back.
    table: crate::handles::Handles<Kind>,
    /// Parameter layouts of the functions looked up: (offset, size).
    layouts: HashMap<u64, Option<Layout>>,
    /// Primary-context retains per device, released at teardown.
    primary: HashMap<c_int, u32>,
    /// The guest's id of each device's primary context, once it was handed out.
    primary_ids: HashMap<c_int, u64>,
    /// The PTX text of modules loaded from PTX, for parameter layouts where the
    /// driver cannot give them (`params.rs`).
    module_ptx: HashMap<u64, Arc<str>>,
}

/// Largest byte result a call may ask for (what one frame carries).
const MAX_OUT: usize = hira_protocol::frame::MAX_FRAME_BODY - 64 * 1024;

/// What generated and custom calls work with.
pub struct Session {
    pub(crate) driver: Driver,
    /// Host functions the guest's calls reach only through Hira's own calls.
    pub(crate) extra: Extra,
    handles: Mutex<Handles>,
    /// Device memory charged to the VM's quota.
    pub(crate) quota: Arc<Account>,
    /// Kernels' device time, and the VM's scheduling decision applied to launches.
    pub(crate) device_time: device_time::DeviceTime,
    /// Where the guest's device memory lives (`placement`).
    pub(crate) placement: Mutex<placement::Placement>,
    /// The driver's virtual-memory-management calls, `None` where allocations are
    /// the driver's own (`HIRA_CUDA_PLACEMENT=driver`, or a driver without them).
    pub(crate) vmm: Option<placement::VmmCalls>,
    /// What migration needs of the session (`migrate`).
    pub(crate) log: Mutex<migrate::CudaLog>,
    /// Contexts whose `printf` FIFO size was fixed on the API server the session
    /// moved from (a kernel that prints had run there): setting it fails, as it did.
    pub(crate) fifo_fixed: Mutex<std::collections::HashSet<u64>>,
    /// Arrays and texture and surface objects (`arrays`).
    textures: Mutex<arrays::Textures>,
}

impl Session {
    fn handles(&self) -> std::sync::MutexGuard<'_, Handles> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn textures(&self) -> std::sync::MutexGuard<'_, arrays::Textures> {
        self.textures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host object id `id` names. 0 passes as NULL, for the host to answer as
    /// natively; an id that names no live object of `kind` gets the kind's error.
    pub(crate) fn lookup(&self, kind: Kind, id: u64, _nullable: bool) -> Result<*mut c_void, Fail> {
        if id == 0 {
            return Ok(std::ptr::null_mut());
        }
        self.handles()
            .table
            .get(id, kind)
            .map(|h| h as *mut c_void)
            .ok_or(Fail::Status(kind.invalid_code()))
    }

    /// A stream argument: the NULL stream and the two special handles pass as
    /// they are.
    pub(crate) fn stream(&self, id: u64) -> Result<*mut c_void, Fail> {
        if hira_apis_cuda::SPECIAL_STREAMS.contains(&id) {
            return Ok(id as usize as *mut c_void);
        }
        self.lookup(Kind::Stream, id, false)
    }

    /// Checks that a guest-assigned id is new, and not one of the special stream
    /// handles (0, 1, 2), which would make a stream the legacy or per-thread one.
    pub(crate) fn check_new(&self, kind: Kind, id: u64) -> Result<(), Fail> {
        if hira_apis_cuda::SPECIAL_STREAMS.contains(&id)
            || id & HOST_ID_BIT != 0
            || self.handles().table.contains(id)
        {
            return Err(Fail::Protocol(format!("{kind:?} id {id:#x} is not new")));
        }
        Ok(())
    }

    pub(crate) fn bind(&self, kind: Kind, id: u64, h: *mut c_void) {
        self.handles().table.insert(id, kind, h as usize, 0);
    }

    pub(crate) fn unbind(&self, kind: Kind, id: u64) {
        let mut hs = self.handles();
        if hs.table.get(id, kind).is_some() {
            hs.table.forget(id);
        }
        if kind == Kind::Function {
            hs.layouts.remove(&id);
        }
        if kind == Kind::Module {
            hs.module_ptx.remove(&id);
        }
    }

    /// The guest's id of a host object it made (a context the host names in an
    /// answer), else the id [`Session::found`] gives it.
    pub(crate) fn id_of(&self, kind: Kind, h: *mut c_void) -> u64 {
        let bound = self.handles().table.id_of(kind, h as usize);
        bound.unwrap_or_else(|| self.found(kind, h))
    }

    /// The id of an object the host returned, the same each time it returns it.
    pub(crate) fn found(&self, kind: Kind, h: *mut c_void) -> u64 {
        self.handles().table.found(kind, h as usize)
    }

    /// A byte argument: `None` for NULL; bytes in the request (borrowed: bytes the
    /// host only copies, a transfer's, are not copied again here) or in the data
    /// window (a span the API server checked lies in the session's window).
    pub(crate) fn bytes_arg<'a>(
        r: &mut Reader<'a>,
        frame: &FrameData<'a>,
    ) -> Result<Option<Bytes<'a>>, Fail> {
        Ok(match r.u8()? {
            tag::NULL => None,
            tag::INLINE => Some(Bytes::Inline(r.bytes(MAX_OUT)?)),
            tag::WINDOW => {
                let (p, len) = window_span(frame, r.u16()?)?;
                Some(Bytes::Window(p, len))
            }
            t => return Err(Fail::Protocol(format!("bad byte-argument tag {t}"))),
        })
    }

    /// Where an output goes, as the guest said: `None`, inline, or a span.
    pub(crate) fn out_arg(r: &mut Reader<'_>) -> Result<OutTo, Fail> {
        Ok(match r.u8()? {
            tag::NULL => OutTo::Nowhere,
            tag::INLINE => OutTo::Inline,
            tag::WINDOW => OutTo::Window(r.u16()?),
            t => return Err(Fail::Protocol(format!("bad output tag {t}"))),
        })
    }

    /// Checks a byte argument holds exactly what the call will read.
    pub(crate) fn check_len(b: Option<&Bytes<'_>>, want: usize) -> Result<(), Fail> {
        match b {
            Some(b) if b.len() != want => Err(Fail::Protocol(format!(
                "{} bytes sent for an argument of {want}",
                b.len()
            ))),
            _ => Ok(()),
        }
    }

    /// The buffer a result of `n` bytes is written to: the guest's window span (which
    /// must hold them), a buffer of ours for the reply, or none.
    pub(crate) fn out_buffer(to: OutTo, frame: &FrameData<'_>, n: usize) -> Result<OutBuf, Fail> {
        Ok(match to {
            OutTo::Nowhere => OutBuf::Nowhere,
            OutTo::Inline => {
                if n > MAX_OUT {
                    return Err(Fail::Status(status::INVALID_VALUE));
                }
                OutBuf::Inline(vec![0; n])
            }
            OutTo::Window(i) => {
                let (p, len) = window_span(frame, i)?;
                if len < n {
                    return Err(Fail::Protocol(format!(
                        "a span of {len} bytes for a result of {n}"
                    )));
                }
                OutBuf::Window(p)
            }
        })
    }

    /// Bytes the host reads as a C string or a module image: a NUL-terminated copy,
    /// out of the guest's reach.
    pub(crate) fn c_bytes(b: Option<Bytes<'_>>) -> Result<Option<Vec<u8>>, Fail> {
        Ok(b.map(|b| {
            let mut v = b.to_vec();
            v.push(0);
            v
        }))
    }

    /// Makes `ctx` current on this thread (NULL: none), as it is on the guest's.
    pub(crate) fn make_current(&self, ctx: CUcontext) -> Result<(), Fail> {
        let Some(set) = self.driver.cuCtxSetCurrent else {
            return Err(Fail::Status(status::NOT_SUPPORTED));
        };
        // SAFETY: a context handle of this session, or NULL.
        match unsafe { set(ctx) } {
            0 => Ok(()),
            s => Err(Fail::Status(s)),
        }
    }

    /// Checks that `n` bytes at device address `p` lie within one allocation the
    /// current context's driver knows (`cuMemGetAddressRange`), so that no guest
    /// value reaches the driver as an address of the API server's own memory;
    /// otherwise the call fails with `CUDA_ERROR_INVALID_VALUE`, as a bad device
    /// pointer does natively.
    pub(crate) fn check_device(&self, p: u64, n: u64) -> Result<(), Fail> {
        if n == 0 {
            return Ok(());
        }
        // Memory Hira placed: the bytes must lie in one of the guest's allocations.
        {
            let placed = self.placement();
            if let Some(in_one) = placed.within_allocation(p, n) {
                return if in_one {
                    Ok(())
                } else {
                    Err(Fail::Status(status::INVALID_VALUE))
                };
            }
        }
        let range = self
            .driver
            .cuMemGetAddressRange_v2
            .ok_or(Fail::Status(status::NOT_SUPPORTED))?;
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: two out-pointers and a value.
        let st = unsafe { range(&mut base, &mut size, p) };
        let end = base.checked_add(size as u64);
        match (st, p.checked_add(n), end) {
            (0, Some(last), Some(end)) if p >= base && last <= end => Ok(()),
            _ => Err(Fail::Status(status::INVALID_VALUE)),
        }
    }

    pub(crate) fn set_layout(&self, f: u64, layout: Option<Vec<(u32, u32)>>) {
        self.handles().layouts.insert(f, layout.map(Arc::from));
    }

    pub(crate) fn layout(&self, f: u64) -> Option<Option<Layout>> {
        self.handles().layouts.get(&f).cloned()
    }

    pub(crate) fn placement(&self) -> std::sync::MutexGuard<'_, placement::Placement> {
        self.placement.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn log(&self) -> std::sync::MutexGuard<'_, migrate::CudaLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An allocation freed: its charge is given back.
    pub(crate) fn freed(&self, p: u64) {
        let gone = self.placement().free(self.vmm.as_ref(), p);
        if let Some(a) = gone {
            self.quota.uncharge(a.size);
        }
    }

    /// A context destroyed (or a primary context reset, or released for the last
    /// time), and the memory allocated in it with it: the driver frees what it
    /// placed, Hira what it placed.
    pub(crate) fn context_destroyed(&self, ctx: u64) {
        let total = self.placement().free_context(self.vmm.as_ref(), ctx);
        self.quota.uncharge(total);
        let (arrays, bytes) = self.textures().context_ended(ctx);
        for id in arrays {
            self.unbind(Kind::Array, id);
        }
        self.quota.uncharge(bytes);
        self.log().context_ended(ctx);
    }

    /// Keeps the PTX text of module `id` (images that are not text are skipped).
    fn loaded_module(&self, id: u64, image: &[u8]) {
        let image = image.strip_suffix(&[0]).unwrap_or(image);
        if image.starts_with(b"\x7fELF") || image.starts_with(&[0x50, 0xED, 0x55, 0xBA]) {
            return;
        }
        if let Ok(text) = std::str::from_utf8(image) {
            self.handles().module_ptx.insert(id, Arc::from(text));
        }
    }

    /// The parameter layout of kernel `name` of module `id`, from its PTX.
    pub(crate) fn ptx_layout(&self, id: u64, name: &str) -> Option<Vec<(u32, u32)>> {
        let text = self.handles().module_ptx.get(&id).cloned()?;
        params::layout(&text, name)
    }

    /// The primary context of `dev` retained (`delta` 1) or released (-1); `id`
    /// is the guest's id of it where the guest was given one. Released for the last
    /// time, it is destroyed with what was made in it.
    pub(crate) fn retained_primary(&self, dev: c_int, delta: i32, id: Option<u64>) {
        let mut hs = self.handles();
        if let Some(id) = id {
            hs.primary_ids.insert(dev, id);
        }
        let n = hs.primary.entry(dev).or_insert(0);
        *n = n.saturating_add_signed(delta);
        let ended = (*n == 0)
            .then(|| hs.primary_ids.get(&dev).copied())
            .flatten();
        drop(hs);
        if let Some(id) = ended {
            self.context_destroyed(id);
        }
    }

    /// The primary context of `dev` was reset: what was made in it is gone.
    pub(crate) fn primary_reset(&self, dev: c_int) {
        let id = self.handles().primary_ids.get(&dev).copied();
        if let Some(id) = id {
            self.context_destroyed(id);
        }
    }
}

impl Session {
    /// What follows a call that succeeded (as it ran, or replayed by a restore):
    /// contexts' ends, modules' PTX, migration's log.
    pub(crate) fn after_call(&self, opcode: u16, payload: &[u8], frame: &FrameData<'_>) {
        use hira_apis_cuda::op;
        if [
            op::cuCtxDestroy_v2,
            op::cuDevicePrimaryCtxRelease_v2,
            op::cuDevicePrimaryCtxReset_v2,
        ]
        .contains(&opcode)
        {
            self.device_time.contexts_changed();
        }
        let mut r = Reader::new(payload);
        match opcode {
            op::cuCtxDestroy_v2 => {
                if let Ok(id) = r.u64() {
                    self.context_destroyed(id);
                }
            }
            op::cuDevicePrimaryCtxReset_v2 => {
                if let Ok(dev) = r.i32() {
                    self.primary_reset(dev);
                }
            }
            op::cuModuleLoadData => {
                // What the call decoded: the current context, the module's id, the image.
                let module = r.u64().and_then(|_| r.u8()).and_then(|present| {
                    let id = if present != 0 { Some(r.u64()?) } else { None };
                    let image = if r.u8()? == tag::INLINE {
                        Some(r.bytes(usize::MAX)?)
                    } else {
                        None
                    };
                    Ok(id.zip(image))
                });
                if let Ok(Some((id, image))) = module {
                    self.loaded_module(id, image);
                }
            }
            _ => {}
        }
        self.record(opcode, payload, frame);
    }
}

/// The span `i` of the frame: where its bytes are in the session's window, checked
/// to lie inside it.
fn window_span(frame: &FrameData<'_>, i: u16) -> Result<(*mut u8, usize), Fail> {
    let span = frame
        .spans
        .get(usize::from(i))
        .ok_or_else(|| Fail::Protocol(format!("no span {i}")))?;
    let window = frame
        .window
        .ok_or_else(|| Fail::Protocol("a span without a data window".into()))?;
    let p = window
        .at(span.offset, span.len)
        .ok_or_else(|| Fail::Protocol("a span outside the data window".into()))?;
    Ok((p, span.len as usize))
}

/// A byte argument's bytes: in the request, or in the guest's data window, which
/// the guest can change at any time (only ever handed to the driver as a pointer,
/// or copied out).
pub(crate) enum Bytes<'a> {
    Inline(&'a [u8]),
    Window(*mut u8, usize),
}

impl Bytes<'_> {
    pub(crate) fn ptr(&self) -> *const u8 {
        match self {
            Bytes::Inline(b) => b.as_ptr(),
            Bytes::Window(p, _) => *p,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Bytes::Inline(b) => b.len(),
            Bytes::Window(_, n) => *n,
        }
    }

    /// A private copy, out of the guest's reach (window memory may change while the
    /// host reads it).
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        // SAFETY: `ptr` holds `len` readable bytes (checked when it was made).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr(), v.as_mut_ptr(), self.len()) };
        v
    }
}

/// Where the guest wants an output.
#[derive(Clone, Copy)]
pub(crate) enum OutTo {
    Nowhere,
    Inline,
    Window(u16),
}

/// An output's buffer.
pub(crate) enum OutBuf {
    Nowhere,
    Inline(Vec<u8>),
    /// The guest's window span, written by the driver in place.
    Window(*mut u8),
}

impl OutBuf {
    /// Where the driver writes (NULL for none, as the guest passed).
    pub(crate) fn ptr(&mut self) -> *mut u8 {
        match self {
            OutBuf::Nowhere => std::ptr::null_mut(),
            OutBuf::Inline(v) => v.as_mut_ptr(),
            OutBuf::Window(p) => *p,
        }
    }

    /// Adds the result to the reply (a window result is already where the guest
    /// reads it).
    pub(crate) fn reply(&self, w: &mut Writer) {
        if let OutBuf::Inline(v) = self {
            w.bytes(v);
        }
    }
}

/// Executes CUDA driver calls for one guest application.
pub struct CudaBackend {
    session: Session,
}

impl CudaBackend {
    /// Loads the host's driver; a host without one refuses the session with a
    /// reason the guest's log shows.
    pub fn new(quota: Arc<Account>) -> Result<CudaBackend, BackendError> {
        let lib = Lib::open().ok_or(BackendError::NoCudaDriver)?;
        let driver = Driver::load(&lib);
        // SAFETY: the signatures of cuda.h.
        let extra = unsafe {
            Extra {
                cuLibraryLoadData: lib.get(c"cuLibraryLoadData"),
                cuKernelGetParamInfo: lib.get(c"cuKernelGetParamInfo"),
                cuKernelGetFunction: lib.get(c"cuKernelGetFunction"),
                cuLaunchKernelEx: lib.get(c"cuLaunchKernelEx"),
                cuPointerGetAttribute: lib.get(c"cuPointerGetAttribute"),
                cuPointerGetAttributes: lib.get(c"cuPointerGetAttributes"),
                cuMemcpy3D_v2: lib.get(c"cuMemcpy3D_v2"),
            }
        };
        let missing = [
            ("cuInit", driver.cuInit.is_none()),
            ("cuCtxSetCurrent", driver.cuCtxSetCurrent.is_none()),
        ];
        if let Some((name, _)) = missing.iter().find(|(_, m)| *m) {
            return Err(BackendError::CudaEntryPoint(name));
        }
        let by_driver = std::env::var("HIRA_CUDA_PLACEMENT").is_ok_and(|v| v == "driver");
        let vmm = if by_driver {
            None
        } else {
            placement::VmmCalls::load(&lib)
        };
        info!(
            "CUDA backend on the host's driver; device memory placed by {}",
            if vmm.is_some() { "Hira" } else { "the driver" }
        );
        Ok(CudaBackend {
            session: Session {
                driver,
                extra,
                handles: Mutex::new(Handles::default()),
                device_time: device_time::DeviceTime::new(quota.clone()),
                quota,
                placement: Mutex::new(placement::Placement::default()),
                vmm,
                log: Mutex::new(migrate::CudaLog::default()),
                fifo_fixed: Mutex::new(Default::default()),
                textures: Mutex::new(Default::default()),
            },
        })
    }
}

impl Backend for CudaBackend {
    fn execute(
        &self,
        opcode: u16,
        payload: &[u8],
        frame: &FrameData<'_>,
        w: &mut Writer,
    ) -> Result<(), Fail> {
        if self.session.fifo_still_fixed(opcode, payload) {
            w.i32(status::INVALID_VALUE);
            return Ok(());
        }
        let mut r = Reader::new(payload);
        let res = generated::dispatch(&self.session, opcode, &mut r, frame, w);
        // Launches that completed meanwhile (after a synchronising call: all it
        // waited for) are accounted before the guest sees the reply.
        self.session.device_time.sweep(&self.session.driver, false);
        let succeeded = res.is_ok() && w.as_slice().get(..4) == Some(&[0, 0, 0, 0]);
        if succeeded {
            self.session.after_call(opcode, payload, frame);
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
        use hira_apis_cuda::op;
        self.may_block(opcode) || opcode == op::cuModuleLoadData
    }

    fn may_wait_on_guest(&self, opcode: u16) -> bool {
        // A launch the VM's decision holds runs off the reading thread, which stays
        // free to see the guest go (and the launch is then let through).
        self.may_block(opcode)
            || ((opcode == hira_apis_cuda::op::cuLaunchKernel
                || opcode == hira_apis_cuda::op::hiraLaunchKernelEx)
                && self.session.device_time.would_hold())
    }

    fn may_async(&self, opcode: u16) -> Option<bool> {
        op_info(opcode).map(|o| o.may_async)
    }

    fn guest_gone(&self) {
        self.session.device_time.close();
    }

    fn capture(&self, pending: Vec<u8>) -> Result<Vec<u8>, MigrationError> {
        self.session.capture(pending)
    }

    fn restore(
        &self,
        snapshot: &[u8],
        device: Option<u32>,
        _window: Option<&crate::window::WindowMap>,
    ) -> Result<Vec<u8>, MigrationError> {
        self.session.restore(snapshot, device)
    }

    fn teardown(&self) -> TeardownReport {
        let s = &self.session;
        s.device_time.sweep(&s.driver, false);
        let (contexts, primary): (Vec<usize>, Vec<(c_int, u32)>) = {
            let hs = s.handles();
            (
                hs.table
                    .iter()
                    .filter(|(id, e)| e.kind == Kind::Context && id & HOST_ID_BIT == 0)
                    .map(|(_, e)| e.host)
                    .collect(),
                hs.primary.iter().map(|(&d, &n)| (d, n)).collect(),
            )
        };
        let mut report = TeardownReport::default();
        // Memory Hira placed goes back first: no context holds it.
        let (released, failed) = s.placement().release_all(s.vmm.as_ref());
        report.released += released;
        report.failed += failed;
        // Libraries belong to no context: each is unloaded.
        let libraries: Vec<usize> = s
            .handles()
            .table
            .iter()
            .filter(|(_, e)| e.kind == Kind::Library)
            .map(|(_, e)| e.host)
            .collect();
        for h in libraries {
            let unload = s.driver.cuLibraryUnload;
            // SAFETY: a library this session loaded and the guest did not unload.
            match unload.map(|f| unsafe { f(h as *mut c_void) }) {
                Some(0) => report.released += 1,
                _ => report.failed += 1,
            }
        }
        // Destroying a context frees everything made in it.
        for h in contexts {
            let destroy = s.driver.cuCtxDestroy_v2;
            // SAFETY: a context this session created and the guest did not destroy.
            match destroy.map(|f| unsafe { f(h as *mut c_void) }) {
                Some(0) => report.released += 1,
                _ => report.failed += 1,
            }
        }
        for (dev, n) in primary {
            for _ in 0..n {
                let release = s.driver.cuDevicePrimaryCtxRelease_v2;
                // SAFETY: releases a retain this session made.
                match release.map(|f| unsafe { f(dev) }) {
                    Some(0) => report.released += 1,
                    _ => report.failed += 1,
                }
            }
        }
        if report.failed > 0 {
            warn!("{} CUDA objects could not be released", report.failed);
        }
        report
    }
}

/// What an API server sees of the host's CUDA, one line each: the driver's version
/// (`cuda driver: VERSION`) and each device (`cuda device: ORDINAL: NAME`); or why it
/// sees none (`cuda: ...`).
pub fn probe() -> Vec<String> {
    type Init = unsafe extern "C" fn(c_uint) -> c_int;
    type Int = unsafe extern "C" fn(*mut c_int) -> c_int;
    type Name = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
    let Some(lib) = Lib::open() else {
        return vec![format!("cuda: {}", BackendError::NoCudaDriver)];
    };
    // SAFETY: the signatures of cuda.h.
    let (init, version, count, name) = unsafe {
        (
            lib.get::<Init>(c"cuInit"),
            lib.get::<Int>(c"cuDriverGetVersion"),
            lib.get::<Int>(c"cuDeviceGetCount"),
            lib.get::<Name>(c"cuDeviceGetName"),
        )
    };
    let (Some(init), Some(version), Some(count), Some(name)) = (init, version, count, name) else {
        return vec!["cuda: the driver lacks cuInit, cuDriverGetVersion or cuDeviceGet*".into()];
    };
    // SAFETY: flags 0, as the API requires.
    let st = unsafe { init(0) };
    if st != 0 {
        return vec![format!("cuda: cuInit failed with {st}")];
    }
    let (mut v, mut n) = (0, 0);
    // SAFETY: out-pointers.
    unsafe {
        version(&mut v);
        count(&mut n);
    }
    let mut lines = vec![format!("cuda driver: {v}")];
    for d in 0..n {
        let mut buf = [0 as c_char; 256];
        // SAFETY: a buffer of the length passed.
        let st = unsafe { name(buf.as_mut_ptr(), buf.len() as c_int, d) };
        let device = if st == 0 {
            // SAFETY: the driver wrote a NUL-terminated name.
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        } else {
            String::new()
        };
        lines.push(format!("cuda device: {d}: {device}"));
    }
    lines
}

/// The driver's text for an error (`which` 0: its name, 1: its description).
pub(crate) fn error_text(d: &Driver, error: c_int, which: c_int) -> Result<String, c_int> {
    let f = match which {
        0 => d.cuGetErrorName,
        1 => d.cuGetErrorString,
        _ => return Err(status::INVALID_VALUE),
    }
    .ok_or(status::NOT_SUPPORTED)?;
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: the driver writes a pointer to a static string.
    let s = unsafe { f(error, &mut p) };
    if s != 0 || p.is_null() {
        return Err(if s != 0 { s } else { status::INVALID_VALUE });
    }
    // SAFETY: a NUL-terminated static string of the driver.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}
