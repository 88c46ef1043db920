//! The guest's side of a CUDA session: the connection to the host, marshalling of
//! one call, the objects the application holds, each thread's context stack and the
//! parameter layouts of the kernels it looked up.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use hira_apis_cuda::{Kind, status};
use hira_guest_driver::conn::{Connection, TransportError};
use hira_guest_driver::window::WindowRegion;
use hira_guest_driver::{BORROW_MIN, Borrowed, endpoint};
use hira_protocol::Span;
use hira_protocol::Writer;
use hira_protocol::api::tag;
use hira_protocol::frame::{FrameKind, MAX_FRAME_BODY};
use hira_protocol::handshake::{ErrorPayload, error_code};
use log::warn;
use rustc_hash::FxHashMap;

pub type CUresult = c_int;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUarray = *mut c_void;

/// Largest byte argument or result one call carries (a frame, less room for the
/// rest of the call).
pub const MAX_BYTES: usize = MAX_FRAME_BODY - 64 * 1024;

/// The first id the guest gives an object.
const FIRST_ID: u64 = 3;

struct Runtime {
    conn: Option<Connection>,
    next_id: AtomicU64,
    /// Each looked-up function's parameters and launch limits.
    layouts: Mutex<FxHashMap<u64, FunctionInfo>>,
    /// Every object the application holds, by kind and id: the context it was made
    /// in (a context: itself).
    live: Mutex<FxHashMap<(Kind, u64), u64>>,
    /// Device memory the application holds, by address: its size, its context and
    /// the module of a module global.
    allocations: Mutex<std::collections::BTreeMap<u64, Allocation>>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

thread_local! {
    /// This thread's context stack, top last (the driver keeps one per thread).
    static STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        init_logger();
        // Device printf and the host driver's messages land among the program's own
        // buffered output, as NVIDIA's driver prints them.
        hira_guest_driver::set_output_sink(hira_apis_cuda_private::print_to_stdio);
        let conn = if hira_guest_driver::settings::settings().disabled {
            Err(TransportError::Refused("HIRA_DISABLE is set".into()))
        } else {
            Connection::connect_any(
                &endpoint::endpoints(),
                hira_apis_cuda::API,
                endpoint::window_len(),
            )
        };
        let conn = conn
            .inspect_err(|e| warn!("Hira CUDA is unavailable: {e}"))
            .ok();
        Runtime {
            conn,
            // Above the special stream handles (NULL, `CU_STREAM_LEGACY`,
            // `CU_STREAM_PER_THREAD`): a stream the application makes must never
            // be taken for one of them.
            next_id: AtomicU64::new(FIRST_ID),
            layouts: Mutex::new(FxHashMap::default()),
            live: Mutex::new(FxHashMap::default()),
            allocations: Mutex::new(std::collections::BTreeMap::new()),
        }
    })
}

/// The shim's own logger on stderr, as `HIRA_LOG` says.
pub(crate) fn init_logger() {
    hira_guest_driver::logger::init("hira-cuda");
}

fn conn() -> Result<&'static Connection, CUresult> {
    runtime().conn.as_ref().ok_or(status::NOT_INITIALIZED)
}

/// Runs one exported call: its status, or the error that stopped it; a panic is
/// caught (it must not unwind into C).
pub fn call(name: &str, f: impl FnOnce() -> Result<CUresult, CUresult>) -> CUresult {
    let initial = name == "cuInit";
    let s = call_inner(name, initial, f);
    if initial && s == status::SUCCESS {
        INITIALIZED.store(true, Ordering::Release);
    }
    s
}

/// Whether `cuInit` succeeded in this process.
pub fn initialized() -> bool {
    INITIALIZED.load(Ordering::Acquire)
}

static INITIALIZED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn call_inner(
    name: &str,
    initial: bool,
    f: impl FnOnce() -> Result<CUresult, CUresult>,
) -> CUresult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(s)) | Ok(Err(s)) if initial && s == status::NOT_INITIALIZED => {
            // No host to talk to: as a driver without a usable device.
            status::NO_DEVICE
        }
        Ok(Ok(s)) | Ok(Err(s)) => s,
        Err(_) => {
            warn!("{name} panicked in the Hira shim");
            status::UNKNOWN
        }
    }
}

/// `status`, or, if it is a success, the status of the first call forwarded without
/// waiting that failed on the host since the last report.
pub fn with_async_failure(status: CUresult) -> CUresult {
    if status != status::SUCCESS {
        return status;
    }
    match conn().ok().and_then(Connection::take_async_failure) {
        Some(f) => {
            let name = hira_apis_cuda::op_info(f.opcode).map_or("a call", |o| o.name);
            warn!(
                "an earlier {name}, forwarded without waiting, failed with {}",
                f.status
            );
            f.status
        }
        None => status,
    }
}

/// Whether every call waits for its reply (`HIRA_SYNC`).
pub fn force_sync() -> bool {
    static SYNC: OnceLock<bool> = OnceLock::new();
    *SYNC.get_or_init(|| hira_guest_driver::settings::settings().sync)
}

/// Device memory the application holds.
#[derive(Debug, Clone, Copy)]
struct Allocation {
    size: u64,
    ctx: u64,
    module: Option<u64>,
}

/// Notes device memory at `base` of `size` bytes in the current context (`module`:
/// a module global, which ends with its module).
pub fn note_allocation(base: u64, size: u64, module: Option<u64>) {
    let ctx = current();
    runtime()
        .allocations
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(base, Allocation { size, ctx, module });
}

pub fn forget_allocation(base: u64) {
    runtime()
        .allocations
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&base);
}

/// Whether `len` bytes at `p` lie in one allocation the current context holds.
pub fn in_allocation(p: u64, len: u64) -> bool {
    let ctx = current();
    let allocations = runtime()
        .allocations
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let Some((&base, a)) = allocations.range(..=p).next_back() else {
        return false;
    };
    ctx != 0
        && a.ctx == ctx
        && p.checked_add(len)
            .is_some_and(|end| end <= base.saturating_add(a.size))
}

/// Whether `len` bytes at `p` lie in device memory the application holds, in any
/// context (unified addressing: one address space).
pub fn is_device(p: u64, len: u64) -> bool {
    let allocations = runtime()
        .allocations
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    allocations
        .range(..=p)
        .next_back()
        .is_some_and(|(&base, a)| {
            p.checked_add(len)
                .is_some_and(|end| end <= base.saturating_add(a.size))
        })
}

/// The context of the live object `id` of `kind`, if the application holds one.
pub fn context_of(kind: Kind, id: u64) -> Option<u64> {
    runtime()
        .live
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(kind, id))
        .copied()
}

/// What the guest knows of a function it looked up: its parameter layout (`None`
/// if the host could not give one) and the launch limits the host reported (0:
/// unknown).
#[derive(Debug, Clone, Default)]
pub struct FunctionInfo {
    /// The module it belongs to: unloading it ends the function.
    pub module: u64,
    pub layout: Option<Vec<(u32, u32)>>,
    pub max_threads: u32,
    pub max_dynamic_shared: u32,
    pub max_block: [u32; 3],
    pub max_grid: [u32; 3],
}

/// Function `id` may now launch with this much dynamic shared memory.
pub fn set_max_dynamic_shared(id: u64, bytes: u32) {
    if let Some(f) = runtime()
        .layouts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_mut(&id)
    {
        f.max_dynamic_shared = bytes;
    }
}

/// What the guest knows of function `id`.
pub fn function(id: u64) -> Option<FunctionInfo> {
    runtime()
        .layouts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .cloned()
}

/// The id of the calling thread's current context, 0 for none.
pub fn current() -> u64 {
    STACK.with(|s| s.borrow().last().copied().unwrap_or(0))
}

pub(crate) fn push(ctx: u64) {
    STACK.with(|s| s.borrow_mut().push(ctx));
}

pub(crate) fn pop() -> Option<u64> {
    STACK.with(|s| s.borrow_mut().pop())
}

/// Replaces the top of the stack (`cuCtxSetCurrent`); 0 pops it.
pub(crate) fn set_current(ctx: u64) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if ctx != 0 {
            s.push(ctx);
        }
    });
}

/// Whether `id` names a context the application may make current: created or
/// retained, not destroyed.
pub(crate) fn is_context(id: u64) -> bool {
    context_of(Kind::Context, id).is_some()
}

/// An object the host made under id `id`: the handle the application gets.
pub fn adopt(kind: Kind, id: u64) -> *mut c_void {
    let ctx = if kind == Kind::Context { id } else { current() };
    runtime()
        .live
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((kind, id), ctx);
    if kind == Kind::Context {
        // A context the application creates becomes current on its thread.
        if id & hira_apis_cuda::HOST_ID_BIT == 0 {
            push(id);
        }
    }
    id as usize as *mut c_void
}

/// An object the application destroyed.
pub fn released(kind: Kind, id: u64) {
    let rt = runtime();
    {
        let mut live = rt.live.lock().unwrap_or_else(|e| e.into_inner());
        live.remove(&(kind, id));
        // What a context held ends with it.
        if kind == Kind::Context {
            live.retain(|_, ctx| *ctx != id);
        }
    }
    {
        let mut allocations = rt.allocations.lock().unwrap_or_else(|e| e.into_inner());
        match kind {
            Kind::Context => allocations.retain(|_, a| a.ctx != id),
            Kind::Module | Kind::Library => allocations.retain(|_, a| a.module != Some(id)),
            _ => {}
        }
    }
    if kind == Kind::Context {
        hira_apis_cuda_private::export::context_ended(id as usize as *mut c_void);
    }
    // A module's functions end with it.
    if kind == Kind::Module || kind == Kind::Library {
        let mut layouts = rt.layouts.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<u64> = layouts
            .iter()
            .filter(|(_, f)| f.module == id)
            .map(|(&f, _)| f)
            .collect();
        let mut live = rt.live.lock().unwrap_or_else(|e| e.into_inner());
        for f in gone {
            layouts.remove(&f);
            live.remove(&(Kind::Function, f));
        }
    }
    match kind {
        Kind::Context => {
            STACK.with(|s| s.borrow_mut().retain(|&c| c != id));
        }
        Kind::Function => {
            runtime()
                .layouts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
        _ => {}
    }
}

/// Whether `id` is a function (or kernel) the guest knows.
pub fn has_layout(id: u64) -> bool {
    runtime()
        .layouts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key(&id)
}

/// Reads what the reply of `cuModuleGetFunction` tells of a function (its parameter
/// layout, `u32::MAX` parameters if unknown, then its launch limits) and keeps it.
pub fn learn_layout(id: u64, module: u64, r: &mut ReplyReader) -> Result<(), CUresult> {
    let n = r.u32()?;
    let layout = if n == u32::MAX {
        None
    } else {
        if n > 4096 {
            return Err(status::UNKNOWN);
        }
        let mut v = Vec::with_capacity(n as usize);
        for _ in 0..n {
            v.push((r.u32()?, r.u32()?));
        }
        Some(v)
    };
    let mut info = FunctionInfo {
        module,
        layout,
        max_threads: r.u32()?,
        max_dynamic_shared: r.u32()?,
        ..FunctionInfo::default()
    };
    for v in info.max_block.iter_mut().chain(info.max_grid.iter_mut()) {
        *v = r.u32()?;
    }
    runtime()
        .layouts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, info);
    Ok(())
}

/// One call being marshalled.
pub struct Call {
    op: u16,
    pub w: Writer,
    /// Bytes in the data window, named by the call's spans.
    spans: Vec<Span>,
    regions: Vec<WindowRegion<'static>>,
    /// Where each output the application gave a buffer for comes back, in order:
    /// a window region (its index), or inline in the reply.
    outs: Vec<Option<usize>>,
    /// Large inline inputs sent from the application's memory (`hira_guest_driver::
    /// borrowed`); the call is sent before its function returns ([`Call::send`]).
    borrowed: Borrowed,
}

/// Transfers smaller than this travel inline (`HIRA_INLINE_MAX`).
static INLINE_MAX: std::sync::LazyLock<usize> = std::sync::LazyLock::new(endpoint::inline_max);

/// Transfers smaller than this travel in the request.
pub fn inline_max() -> usize {
    *INLINE_MAX
}

/// The largest transfer one call places in the data window: half of it, so that two
/// threads' transfers fit; 0 without one.
pub fn window_chunk() -> usize {
    conn()
        .ok()
        .and_then(Connection::window)
        .map_or(0, |w| w.len() / 2)
}

/// `CU_LAUNCH_PARAM_END`, `_BUFFER_POINTER`, `_BUFFER_SIZE`.
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

impl Call {
    pub fn new(op: u16) -> Self {
        Call {
            op,
            // Most calls' arguments fit: no growing on the way.
            w: Writer::with_capacity(256),
            spans: Vec::new(),
            regions: Vec::new(),
            outs: Vec::new(),
            borrowed: Borrowed::default(),
        }
    }

    /// A region of the data window for `len` bytes of this call, if the transfer is
    /// large enough to use it and it has room.
    fn window_region(&mut self, len: usize) -> Option<usize> {
        if len < *INLINE_MAX || self.spans.len() >= hira_protocol::frame::MAX_SPANS {
            return None;
        }
        let region = conn().ok()?.window()?.alloc(len)?;
        self.spans.push(Span {
            offset: region.offset as u64,
            len: len as u64,
        });
        self.regions.push(region);
        Some(self.regions.len() - 1)
    }

    /// The calling thread's current context.
    pub fn current(&mut self) {
        self.w.u64(current());
    }

    /// A new object's id, assigned here so that the host binds it (sent only if the
    /// application passed somewhere to put it).
    pub fn new_id(&mut self, present: bool) -> u64 {
        let id = runtime().next_id.fetch_add(1, Ordering::Relaxed);
        self.w.u8(u8::from(present));
        if present {
            self.w.u64(id);
        }
        id
    }

    /// Whether the application gave a buffer for an output of `len` bytes, and where
    /// the host is to put it: a region of the data window, or inline in the reply.
    pub fn out_len(&mut self, present: bool, len: usize) {
        if !present {
            self.w.u8(tag::NULL);
            return;
        }
        match self.window_region(len) {
            Some(i) => {
                self.w.u8(tag::WINDOW).u16((self.spans.len() - 1) as u16);
                self.outs.push(Some(i));
            }
            None => {
                self.w.u8(tag::INLINE);
                self.outs.push(None);
            }
        }
    }

    /// `len` bytes at `p` (NULL: none).
    ///
    /// # Safety
    /// `p` is null or valid for `len` bytes.
    pub unsafe fn bytes_in(&mut self, p: *const u8, len: usize) -> Result<(), CUresult> {
        if p.is_null() {
            self.w.u8(tag::NULL);
            return Ok(());
        }
        if let Some(i) = self.window_region(len) {
            // SAFETY: the caller's promise for `p`; the region holds at least `len`
            // bytes of the mapped window and belongs to this call alone.
            unsafe { std::ptr::copy_nonoverlapping(p, self.regions[i].ptr(), len) };
            self.w.u8(tag::WINDOW).u16((self.spans.len() - 1) as u16);
            return Ok(());
        }
        // SAFETY: the caller's promise.
        unsafe { self.bytes_inline(p, len) }
    }

    /// `len` bytes at `p`, in the request itself.
    ///
    /// # Safety
    /// `p` is valid for `len` bytes.
    unsafe fn bytes_inline(&mut self, p: *const u8, len: usize) -> Result<(), CUresult> {
        if len > MAX_BYTES {
            warn!("a transfer of {len} bytes is larger than one call carries ({MAX_BYTES})");
            return Err(status::INVALID_VALUE);
        }
        self.w.u8(tag::INLINE);
        if len >= BORROW_MIN {
            // The length as `bytes` writes it; the bytes follow when sent.
            self.w.u32(len as u32);
            // SAFETY: the caller's promise, until the call is sent.
            unsafe { self.borrowed.note(self.w.len(), p, len) };
            return Ok(());
        }
        // SAFETY: the caller's promise.
        self.w.bytes(unsafe { std::slice::from_raw_parts(p, len) });
        Ok(())
    }

    /// The request's payload: `w`, with the borrowed inputs in their places.
    fn parts(&self) -> Vec<&[u8]> {
        self.borrowed.parts(self.w.as_slice())
    }

    /// A C string (NULL: none).
    ///
    /// # Safety
    /// `p` is null or a NUL-terminated string.
    pub unsafe fn c_str(&mut self, p: *const c_char) {
        if p.is_null() {
            self.w.u8(tag::NULL);
        } else {
            self.w.u8(tag::INLINE);
            // SAFETY: the caller's promise.
            self.w.bytes(unsafe { CStr::from_ptr(p) }.to_bytes());
        }
    }

    /// A module image: PTX text (up to its NUL), or a cubin (ELF) or fatbin, whose
    /// length its header gives.
    ///
    /// # Safety
    /// `p` is null or a module image as the API defines one.
    pub unsafe fn module_image(&mut self, p: *const u8) -> Result<(), CUresult> {
        if p.is_null() {
            self.w.u8(tag::NULL);
            return Ok(());
        }
        // The runtime's wrapper of a fatbin: the fatbin it points at goes.
        // SAFETY: every image has at least 4 bytes; a wrapper has 24.
        let p = unsafe {
            let head = p.cast::<[u8; 4]>().read_unaligned();
            if hira_apis_cuda_private::fatbin::classify(head)
                == hira_apis_cuda_private::fatbin::Image::Wrapper
            {
                let w = p.cast::<[u8; 24]>().read_unaligned();
                match hira_apis_cuda_private::fatbin::wrapped(&w) {
                    Some(f) if f != 0 => f as *const u8,
                    _ => return Err(status::INVALID_VALUE),
                }
            } else {
                p
            }
        };
        // SAFETY: an image starts with at least 16 bytes (a header or text).
        let len = unsafe { image_len(p) }.ok_or(status::INVALID_VALUE)?;
        // Inline: the host reads an image, so it copies it out of the guest's reach
        // anyway. SAFETY: as computed from the image's own header or text.
        unsafe { self.bytes_inline(p, len) }
    }

    /// `kernelParams` of a launch of `f`, packed by its parameter layout.
    ///
    /// # Safety
    /// `params` is null or has one valid pointer per parameter of `f`.
    pub unsafe fn kernel_params(
        &mut self,
        f: u64,
        params: *mut *mut c_void,
    ) -> Result<(), CUresult> {
        if params.is_null() {
            self.w.u8(tag::NULL);
            return Ok(());
        }
        let layouts = runtime().layouts.lock().unwrap_or_else(|e| e.into_inner());
        let layout = layouts
            .get(&f)
            .ok_or(status::INVALID_HANDLE)?
            .layout
            .as_ref()
            .ok_or(status::NOT_SUPPORTED)?;
        let total = layout
            .iter()
            .map(|&(o, s)| (o + s) as usize)
            .max()
            .unwrap_or(0);
        let mut buf = vec![0u8; total];
        for (i, &(off, size)) in layout.iter().enumerate() {
            // SAFETY: the caller's promise: one pointer per parameter.
            let src = unsafe { *params.add(i) };
            if src.is_null() {
                return Err(status::INVALID_VALUE);
            }
            // SAFETY: each points to a value of the parameter's size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.cast::<u8>(),
                    buf[off as usize..].as_mut_ptr(),
                    size as usize,
                )
            };
        }
        self.w.u8(tag::INLINE);
        self.w.bytes(&buf);
        Ok(())
    }

    /// `extra` of a launch: the parameter buffer it names.
    ///
    /// # Safety
    /// `extra` is null or a list ended by `CU_LAUNCH_PARAM_END`.
    pub unsafe fn kernel_extra(
        &mut self,
        _f: u64,
        extra: *mut *mut c_void,
    ) -> Result<(), CUresult> {
        if extra.is_null() {
            self.w.u8(tag::NULL);
            return Ok(());
        }
        let (mut ptr, mut len) = (std::ptr::null::<u8>(), None);
        let mut at = 0;
        loop {
            // SAFETY: the caller's promise: keys and values until the end key.
            let key = unsafe { *extra.add(at) } as usize;
            match key {
                PARAM_END => break,
                // SAFETY: as above.
                PARAM_BUFFER_POINTER => ptr = unsafe { *extra.add(at + 1) }.cast::<u8>(),
                PARAM_BUFFER_SIZE => {
                    // SAFETY: as above; the value points to a size_t.
                    len = Some(unsafe { *(*extra.add(at + 1)).cast::<usize>() });
                }
                _ => return Err(status::INVALID_VALUE),
            }
            at += 2;
            if at > 64 {
                return Err(status::INVALID_VALUE);
            }
        }
        match len {
            Some(n) if !ptr.is_null() && n <= MAX_BYTES => {
                self.w.u8(tag::INLINE);
                // SAFETY: the buffer holds `n` bytes, as the API requires.
                self.w.bytes(unsafe { std::slice::from_raw_parts(ptr, n) });
                Ok(())
            }
            _ => Err(status::INVALID_VALUE),
        }
    }

    /// Answers from the first successful answer to the same call (same opcode and
    /// arguments), or sends it and keeps a successful answer: for properties that
    /// cannot change while the host runs (`cache`).
    pub fn send_cached(self) -> Result<Reply, CUresult> {
        type Cache = HashMap<(u16, Vec<u8>), Vec<u8>>;
        static CACHE: Mutex<Option<Cache>> = Mutex::new(None);
        if !self.spans.is_empty() || !self.borrowed.is_empty() {
            return self.send(false);
        }
        let key = (self.op, self.w.as_slice().to_vec());
        let cached = CACHE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|c| c.get(&key).cloned());
        let buf = match cached {
            Some(buf) => buf,
            None => {
                let frame = match conn()?.call(self.op, &[], self.w.as_slice(), false) {
                    Ok(Some(f)) if f.header.kind == FrameKind::Reply => f,
                    _ => return self.send(false),
                };
                if frame.payload.get(..4) == Some(&[0, 0, 0, 0]) {
                    CACHE
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert_with(HashMap::new)
                        .insert(key, frame.payload.clone());
                }
                frame.payload
            }
        };
        let mut r = ReplyReader::new(buf, status::UNKNOWN);
        let status = r.i32()?;
        Ok(Reply {
            status,
            r,
            regions: Vec::new(),
            outs: self.outs.into_iter(),
        })
    }

    /// Sends the call and waits for its reply; with `no_reply`, returns at once (a
    /// failure on the host comes back through [`with_async_failure`]).
    pub fn send(self, no_reply: bool) -> Result<Reply, CUresult> {
        let conn = conn()?;
        match conn.call_parts(self.op, &self.spans, &self.parts(), no_reply) {
            Ok(Some(frame)) if frame.header.kind == FrameKind::Reply => {
                let mut r = ReplyReader::new(frame.payload, status::UNKNOWN);
                let status = r.i32()?;
                Ok(Reply {
                    status,
                    r,
                    regions: self.regions,
                    outs: self.outs.into_iter(),
                })
            }
            Ok(Some(frame)) => {
                let e = ErrorPayload::decode(&frame.payload).map_err(|_| status::UNKNOWN)?;
                warn!("the host refused opcode {}: {}", self.op, e.message);
                Err(match e.code {
                    error_code::UNKNOWN_OPCODE => status::NOT_SUPPORTED,
                    error_code::SERVER_GONE => status::UNKNOWN,
                    _ => status::INVALID_VALUE,
                })
            }
            Ok(None) if no_reply => Ok(Reply {
                status: status::SUCCESS,
                r: ReplyReader::new(Vec::new(), status::UNKNOWN),
                regions: Vec::new(),
                outs: Vec::new().into_iter(),
            }),
            Ok(None) => Err(status::UNKNOWN),
            Err(e) => {
                warn!("the Hira session failed: {e}");
                Err(status::UNKNOWN)
            }
        }
    }
}

/// The length of a module image: an ELF (cubin) up to its last header table, a
/// fatbin by its header, else PTX text with its NUL.
///
/// # Safety
/// `p` points to a module image.
unsafe fn image_len(p: *const u8) -> Option<usize> {
    // SAFETY: every image has a 4-byte start.
    let magic = unsafe { std::slice::from_raw_parts(p, 4) };
    let rd = |at: usize, n: usize| -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: within the header of an image of this kind.
        unsafe { std::ptr::copy_nonoverlapping(p.add(at), b.as_mut_ptr(), n) };
        u64::from_le_bytes(b)
    };
    if magic == b"\x7fELF" {
        let sh = rd(0x28, 8).checked_add(rd(0x3A, 2).checked_mul(rd(0x3C, 2))?)?;
        let ph = rd(0x20, 8).checked_add(rd(0x36, 2).checked_mul(rd(0x38, 2))?)?;
        return usize::try_from(sh.max(ph)).ok();
    }
    if magic == [0x50, 0xED, 0x55, 0xBA] {
        return usize::try_from(rd(6, 2).checked_add(rd(8, 8))?).ok();
    }
    // SAFETY: PTX is NUL-terminated text.
    Some(
        unsafe { CStr::from_ptr(p.cast::<c_char>()) }
            .to_bytes()
            .len()
            + 1,
    )
}

/// A reply: the status and what follows it.
pub struct Reply {
    pub status: CUresult,
    pub r: ReplyReader,
    /// The call's window regions, kept until its outputs are copied out.
    regions: Vec<WindowRegion<'static>>,
    outs: std::vec::IntoIter<Option<usize>>,
}

impl Reply {
    /// Copies a byte result into the application's buffer of `len` bytes.
    ///
    /// # Safety
    /// `dst` is valid for `len` bytes.
    pub unsafe fn copy_out(&mut self, dst: *mut u8, len: usize) -> Result<(), CUresult> {
        if let Some(Some(i)) = self.outs.next() {
            // The host put the result in the call's window region, of `len` bytes.
            let region = self.regions.get(i).ok_or(status::UNKNOWN)?;
            // SAFETY: the caller's promise for `dst`; the region holds at least `len`
            // bytes of the mapped window.
            unsafe { std::ptr::copy_nonoverlapping(region.ptr(), dst, len.min(region.len)) };
            return Ok(());
        }
        let b = self.r.bytes()?;
        let n = b.len().min(len);
        // SAFETY: the caller's promise; `n` is within both.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, n) };
        Ok(())
    }

    /// Checks the reply held nothing more.
    pub fn finish(&self) -> Result<(), CUresult> {
        self.r.finish()
    }
}

/// Reads a reply's payload; a short reply is an error of the host (`UNKNOWN`).
pub use hira_guest_driver::reply::ReplyReader;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_inputs_go_from_where_they_are_as_the_bytes_they_would_be_copied_as() {
        // SAFETY: set before the runtime (which reads it) starts on this thread.
        unsafe { std::env::set_var("HIRA_DISABLE", "1") };
        let big: Vec<u8> = (0..2 * BORROW_MIN).map(|i| (i % 253) as u8).collect();
        let mut c = Call::new(1);
        c.w.u64(5);
        // SAFETY: each buffer is readable for its length, and outlives `c`.
        unsafe {
            c.bytes_in(big.as_ptr(), big.len()).unwrap();
            c.bytes_in(big.as_ptr(), 10).unwrap();
        }
        assert_eq!(c.borrowed.len(), 1);
        let mut copied = Writer::new();
        copied.u64(5);
        copied.u8(tag::INLINE).bytes(&big);
        copied.u8(tag::INLINE).bytes(&big[..10]);
        assert_eq!(c.parts().concat(), copied.as_slice());
    }

    #[test]
    fn allocations_are_known_per_context_until_they_end() {
        // SAFETY: set before the runtime (which reads it) starts on this thread.
        unsafe { std::env::set_var("HIRA_DISABLE", "1") };
        push(7);
        note_allocation(0x1000, 256, None);
        note_allocation(0x2000, 64, Some(9));
        assert!(in_allocation(0x1000, 256));
        assert!(in_allocation(0x10F0, 16));
        assert!(!in_allocation(0x10F0, 17), "past the end");
        assert!(!in_allocation(0x0FFF, 2), "before the start");
        assert!(!in_allocation(0x1800, 1), "between allocations");
        push(8);
        assert!(!in_allocation(0x1000, 1), "another context's memory");
        pop();
        released(Kind::Module, 9);
        assert!(!in_allocation(0x2000, 1), "a module's globals end with it");
        forget_allocation(0x1000);
        assert!(!in_allocation(0x1000, 1));
        note_allocation(0x3000, 16, None);
        released(Kind::Context, 7);
        assert_eq!(current(), 0, "a destroyed context is no longer current");
        push(7);
        assert!(!in_allocation(0x3000, 1), "a context's memory ends with it");
    }
}
