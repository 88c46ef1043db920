//! **A CPU test executor for CUDA: test infrastructure, not a GPU, never shipped.**
//!
//! `libcuda.so.1` with the CUDA driver API's C ABI for the calls Hira's tests and its
//! API server use, running kernels' PTX on the CPU with the interpreter in [`ptx`].
//! CI has no NVIDIA GPU: the unmodified API server loads this library through the
//! library search path (`LD_LIBRARY_PATH`) as it would load the real driver, so the
//! whole guest → daemon → API server → driver path runs for real. Results measured on
//! it say nothing of a GPU's speed; where a real GPU exists the same tests run on the
//! real driver (`HIRA_CUDA_E2E=1`).
//!
//! Semantics follow the driver API's documentation where the tests can observe them:
//! errors before `cuInit`, per-thread context stacks, the primary context, bounds of
//! allocations, sticky errors after a kernel fault, events with timing. Work runs
//! when it is enqueued, so every stream is always idle. Device memory lives in this
//! process; a device address is never a host pointer.
//!
//! A kernel's `printf` output waits in its context's FIFO (`CU_LIMIT_PRINTF_FIFO_SIZE`
//! bytes, the excess dropped) and is written to the C library's `stdout`, as the
//! driver writes it, at the calls where the CUDA Programming Guide says the driver
//! flushes it: a launch (before it runs; after it too with `CUDA_LAUNCH_BLOCKING=1`),
//! context, stream and event synchronisation, blocking copies (`cuMemcpy`,
//! `cuMemcpyHtoD`, `cuMemcpyDtoH`, `cuMemcpyDtoD`), loading or unloading a module,
//! destroying a context (releasing the primary one for the last time). Not at exit.

#![allow(non_snake_case, clippy::missing_safety_doc)]

mod graphs;
mod library;
pub mod nvrtc;
mod pitched;
pub mod ptx;
mod texture;
mod vmm;

use hira_apis_cuda_private::copy2d::{DEVICE, HOST, UNIFIED};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
type Handle = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: CUresult = 209;
pub const CUDA_ERROR_INVALID_PTX: CUresult = 218;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub const CUDA_ERROR_LAUNCH_FAILED: CUresult = 719;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

/// The names and descriptions `cuGetErrorName`/`cuGetErrorString` give.
const ERRORS: &[(CUresult, &CStr, &CStr)] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (4, c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
    (
        100,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (
        200,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        201,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        209,
        c"CUDA_ERROR_NO_BINARY_FOR_GPU",
        c"no kernel image is available for execution on the device",
    ),
    (
        218,
        c"CUDA_ERROR_INVALID_PTX",
        c"a PTX JIT compilation failed",
    ),
    (301, c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
    (
        400,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (
        700,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        701,
        c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        c"too many resources requested for launch",
    ),
    (
        709,
        c"CUDA_ERROR_CONTEXT_IS_DESTROYED",
        c"context is destroyed",
    ),
    (
        719,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// What this executor says it is.
const DEVICE_NAME: &str = "Hira CPU test executor (not a GPU)";
/// Device memory it offers.
const TOTAL_MEMORY: u64 = 4 << 30;
/// The driver version it reports: 13.0, as NVIDIA's driver 580 (the CUDA 13.0
/// runtime requires at least its own version).
const DRIVER_VERSION: c_int = 13000;
/// The compute capability it reports, 7.5: the oldest nvcc 13 compiles for.
const COMPUTE_CAPABILITY: u32 = 75;
/// Where device addresses start; far from any host pointer of this process.
const DEVICE_BASE: u64 = 0x7_0000_0000;
const MAX_THREADS: u32 = 1024;
const MAX_SHARED: usize = 48 * 1024;

/// Device memory: allocations by start address.
#[derive(Default)]
struct Memory {
    allocs: BTreeMap<u64, Vec<u8>>,
    next: u64,
    used: u64,
    /// Bases of ranges mapped by `cuMemMap` (which `cuMemFree` does not free).
    mapped: std::collections::HashSet<u64>,
    /// Mapped ranges no device may access yet (`cuMemSetAccess` not called).
    no_access: std::collections::HashSet<u64>,
    /// Texture and surface objects, which kernels reach through this memory.
    objects: texture::Objects,
}

impl Memory {
    fn find(&self, addr: u64, len: usize) -> Option<(u64, usize)> {
        let (&base, buf) = self.allocs.range(..=addr).next_back()?;
        if self.no_access.contains(&base) {
            return None;
        }
        let off = usize::try_from(addr - base).ok()?;
        (off.checked_add(len)? <= buf.len()).then_some((base, off))
    }

    fn alloc(&mut self, size: usize) -> Option<u64> {
        if size == 0 || self.used + size as u64 > TOTAL_MEMORY {
            return None;
        }
        if self.next == 0 {
            self.next = DEVICE_BASE;
        }
        let at = self.next;
        // 512-byte aligned with a gap, so that running off an allocation faults.
        self.next += (size as u64).div_ceil(512) * 512 + 512;
        self.allocs.insert(at, vec![0; size]);
        self.used += size as u64;
        Some(at)
    }

    fn free(&mut self, at: u64) -> bool {
        if self.mapped.contains(&at) {
            return false;
        }
        match self.allocs.remove(&at) {
            Some(b) => {
                self.used -= b.len() as u64;
                true
            }
            None => false,
        }
    }
}

impl ptx::DeviceMemory for Memory {
    fn read(&self, addr: u64, out: &mut [u8]) -> bool {
        match self.find(addr, out.len()) {
            Some((base, off)) => {
                out.copy_from_slice(&self.allocs[&base][off..off + out.len()]);
                true
            }
            None => false,
        }
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((base, off)) => {
                let b = self.allocs.get_mut(&base).expect("found above");
                b[off..off + data.len()].copy_from_slice(data);
                true
            }
            None => false,
        }
    }

    fn texture(&self, handle: u64) -> Option<ptx::tex::Texture> {
        self.objects.textures.get(&handle).map(|t| t.0)
    }

    fn surface(&self, handle: u64) -> Option<ptx::tex::Surface> {
        self.objects.surfaces.get(&handle).map(|t| t.0)
    }
}

struct Context {
    /// A fault of a kernel: every later call in the context fails with it.
    sticky: CUresult,
    primary: bool,
    flags: c_uint,
    limits: HashMap<c_int, usize>,
    cache_config: c_int,
    /// What its kernels printed, until a flush.
    printf: ptx::PrintfFifo,
    /// Whether a kernel that calls `printf` was launched: the FIFO's size is fixed.
    printf_launched: bool,
}

impl Context {
    fn new(primary: bool, flags: c_uint) -> Context {
        Context {
            sticky: CUDA_SUCCESS,
            primary,
            flags,
            limits: HashMap::new(),
            cache_config: 0,
            printf: ptx::PrintfFifo::new(PRINTF_FIFO_SIZE),
            printf_launched: false,
        }
    }
}

/// `CU_LIMIT_PRINTF_FIFO_SIZE`.
const LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
/// Its default, as the driver's: 1 MiB.
const PRINTF_FIFO_SIZE: usize = 1 << 20;

/// `CUlimit` defaults: stack size, printf FIFO, malloc heap, device-runtime sync
/// depth and pending launches, L2 fetch granularity, persisting L2 size.
const LIMITS: &[(c_int, usize)] = &[
    (0, 1024),
    (LIMIT_PRINTF_FIFO_SIZE, PRINTF_FIFO_SIZE),
    (2, 8 << 20),
    (3, 2),
    (4, 2048),
    (5, 64),
    (6, 0),
];

struct LoadedModule {
    ptx: Arc<ptx::Module>,
    /// Device addresses of the module's variables.
    globals: Vec<u64>,
    ctx: usize,
}

struct Event {
    recorded: Option<Instant>,
    timing: bool,
}

#[derive(Default)]
struct State {
    initialized: bool,
    mem: Memory,
    next_handle: usize,
    contexts: HashMap<usize, Context>,
    primary: Option<(usize, u32)>,
    modules: HashMap<usize, LoadedModule>,
    functions: HashMap<usize, (usize, usize)>,
    /// Streams: context, flags, priority.
    streams: HashMap<usize, (usize, c_uint, c_int)>,
    /// Functions' `cuFuncSetAttribute` values, by function and attribute.
    func_attrs: HashMap<(usize, c_int), c_int>,
    events: HashMap<usize, Event>,
    /// Libraries: the module of no context each stands for.
    libraries: HashMap<usize, usize>,
    /// Contexts ended by the current call, whose context-local storage ends once
    /// the state is unlocked.
    ended: Vec<usize>,
    /// Virtual memory management: reservations, physical allocations, mappings.
    vmm: vmm::Vmm,
    /// CUDA arrays.
    arrays: HashMap<usize, texture::Array>,
}

impl State {
    fn handle(&mut self) -> usize {
        self.next_handle += 0x10;
        0x1000 + self.next_handle
    }
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

thread_local! {
    /// This thread's context stack, top last.
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on the initialised state.
fn with<F: FnOnce(&mut State) -> CUresult>(f: F) -> CUresult {
    let (r, ended) = {
        let mut g = state();
        match g.as_mut() {
            Some(s) if s.initialized => {
                let r = f(s);
                (r, std::mem::take(&mut s.ended))
            }
            _ => return CUDA_ERROR_NOT_INITIALIZED,
        }
    };
    // Once the state is unlocked: the destructors are the program's code.
    for c in ended {
        hira_apis_cuda_private::export::context_ended(c as Handle);
    }
    r
}

fn current() -> Option<usize> {
    STACK.with(|s| s.borrow().last().copied())
}

/// Runs `f` with the current context, which must be live and without a fault.
fn with_ctx<F: FnOnce(&mut State, usize) -> CUresult>(f: F) -> CUresult {
    with(|s| in_ctx(s, f))
}

/// Runs `f` on `s` with the current context, which must be live and without a
/// fault.
fn in_ctx<F: FnOnce(&mut State, usize) -> CUresult>(s: &mut State, f: F) -> CUresult {
    match current() {
        Some(c) => match s.contexts.get(&c) {
            Some(ctx) if ctx.sticky != CUDA_SUCCESS => ctx.sticky,
            Some(_) => f(s, c),
            None => CUDA_ERROR_INVALID_CONTEXT,
        },
        None => CUDA_ERROR_INVALID_CONTEXT,
    }
}

/// Runs `f` on the initialised state, then writes to descriptor 1 the `printf`
/// output `f` took from contexts' FIFOs, once the state's lock is released.
fn with_output<F: FnOnce(&mut State, &mut Vec<u8>) -> CUresult>(f: F) -> CUresult {
    let mut out = Vec::new();
    let r = with(|s| f(s, &mut out));
    write_stdout(&out);
    r
}

/// Appends what context `ctx`'s `printf` FIFO holds to `out`, emptying it.
fn take_printf(s: &mut State, ctx: usize, out: &mut Vec<u8>) {
    if let Some(c) = s.contexts.get_mut(&ctx) {
        out.extend_from_slice(&c.printf.take());
    }
}

/// Like [`with`], for a call at which the driver flushes the current context's
/// `printf` FIFO: its output is written first.
fn with_flushing<F: FnOnce(&mut State) -> CUresult>(f: F) -> CUresult {
    with_output(|s, out| {
        if let Some(c) = current() {
            take_printf(s, c, out);
        }
        f(s)
    })
}

/// Like [`with_ctx`], for a call at which the driver flushes the context's `printf`
/// FIFO: its output is written first, even if a kernel has faulted since (what it
/// printed before its fault is still printed).
fn with_ctx_flushing<F: FnOnce(&mut State, usize) -> CUresult>(f: F) -> CUresult {
    with_flushing(|s| in_ctx(s, f))
}

/// Writes a kernel's `printf` output as NVIDIA's driver does: into the C library's
/// `stdout`, among the program's own buffered output (seen on driver 580: with
/// output to a file, kernel lines keep their place between the program's lines).
/// A kernel's fault as the executor reports it on standard error: the faulting
/// address left out, since it depends on where the memory was placed (Hira places
/// a guest's memory elsewhere than the driver would), unless
/// `HIRA_EXECUTOR_FAULT_ADDRESSES=1` asks for it.
fn fault_text(e: &str) -> String {
    const MARK: &str = "illegal address 0x";
    if std::env::var_os("HIRA_EXECUTOR_FAULT_ADDRESSES").is_some_and(|v| v == "1") {
        return e.to_string();
    }
    match e.find(MARK) {
        Some(i) => {
            let rest = &e[i + MARK.len()..];
            let hex = rest
                .find(|c: char| !c.is_ascii_hexdigit())
                .unwrap_or(rest.len());
            format!("{}illegal address{}", &e[..i], &rest[hex..])
        }
        None => e.to_string(),
    }
}

fn write_stdout(data: &[u8]) {
    hira_apis_cuda_private::print_to_stdio(1, data);
}

/// Writes `v` through `p` if it is not null.
unsafe fn put<T>(p: *mut T, v: T) -> CUresult {
    if p.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a pointer valid for a `T`, as the API requires.
    unsafe { p.write(v) };
    CUDA_SUCCESS
}

fn stream_ok(s: &State, h: Handle) -> bool {
    let h = h as usize;
    h == 0 || h == 1 || h == 2 || s.streams.contains_key(&h)
}

// ---------------------------------------------------------------------------------
// Initialisation, version, devices

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut g = state();
    g.get_or_insert_with(State::default).initialized = true;
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // SAFETY: as the API requires.
    unsafe { put(v, DRIVER_VERSION) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    // SAFETY: as the API requires.
    with(|_| unsafe { put(n, 1) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int) -> CUresult {
    with(|_| {
        if ordinal != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        // SAFETY: as the API requires.
        unsafe { put(d, 0) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    with(|_| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if name.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let b = DEVICE_NAME.as_bytes();
        let n = b.len().min(len as usize - 1);
        // SAFETY: `name` holds `len` bytes, as the API requires.
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    with(|_| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        // SAFETY: as the API requires.
        unsafe { put(bytes, TOTAL_MEMORY as usize) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    with(|_| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        // SAFETY: as the API requires.
        unsafe { put(uuid, *b"hira-cpu-test-ex") }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetUuid_v2(uuid, dev) }
}

/// Device attributes, by `CUdevice_attribute` number; others are 0.
fn attribute(a: c_int) -> Option<c_int> {
    Some(match a {
        1 => MAX_THREADS as c_int,
        2 | 3 => 1024,
        4 => 64,
        5 => i32::MAX,
        6 | 7 => 65535,
        8 => MAX_SHARED as c_int,
        9 => 64 * 1024,
        10 => 32,
        11 => i32::MAX,
        12 => 65536,
        13 => 1_000_000,
        14 => 512,
        // GPU_OVERLAP: copies overlap kernels (programs check it before using streams).
        15 => 1,
        16 => 1,
        19 => 0,
        20 => 0,
        31 => 1,
        39 => 2048,
        // ASYNC_ENGINE_COUNT, as a Turing GPU's.
        40 => 2,
        41 => 1,
        75 => (COMPUTE_CAPABILITY / 10) as c_int,
        76 => (COMPUTE_CAPABILITY % 10) as c_int,
        81 => 64 * 1024,
        82 => 65536,
        97 => 1,
        // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (`vmm.rs`).
        102 => 1,
        // MEMORY_POOLS_SUPPORTED, as GPUs since Pascal report: libraries then use
        // cuMemAllocAsync and the cuMemPool calls (`graphs::pools`).
        115 => 1,
        0 | 1000.. => return None,
        _ => 0,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    dev: CUdevice,
) -> CUresult {
    with(|_| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        match attribute(attrib) {
            // SAFETY: as the API requires.
            Some(v) => unsafe { put(pi, v) },
            None => CUDA_ERROR_INVALID_VALUE,
        }
    })
}

// ---------------------------------------------------------------------------------
// Contexts

/// `cuCtxCreate_v4` (`cuCtxCreate` of CUDA 13's `cuda.h`): an ordinary context is
/// `cuCtxCreate_v2`'s; execution affinity and CUDA-in-graphics are not built.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut Handle,
    params: *const hira_apis_cuda_private::context::CreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the program's pointer, null or valid as the API requires.
    if let Err(e) = unsafe { hira_apis_cuda_private::context::plain(params) } {
        return e;
    }
    // SAFETY: the program's out-pointer.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut Handle,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    with(|s| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if pctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = s.handle();
        s.contexts.insert(h, Context::new(false, _flags));
        STACK.with(|st| st.borrow_mut().push(h));
        // SAFETY: checked not null.
        unsafe { put(pctx, h as Handle) }
    })
}

fn drop_context(s: &mut State, h: usize) {
    s.contexts.remove(&h);
    s.ended.push(h);
    let mods: Vec<usize> = s
        .modules
        .iter()
        .filter(|(_, m)| m.ctx == h)
        .map(|(&k, _)| k)
        .collect();
    for m in mods {
        unload(s, m);
    }
    s.streams.retain(|_, (c, _, _)| *c != h);
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    with_output(|s, out| {
        let h = ctx as usize;
        match s.contexts.get(&h) {
            Some(c) if !c.primary => {}
            _ => return CUDA_ERROR_INVALID_CONTEXT,
        }
        take_printf(s, h, out);
        drop_context(s, h);
        STACK.with(|st| st.borrow_mut().retain(|&c| c != h));
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    with(|s| {
        if !s.contexts.contains_key(&(ctx as usize)) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        STACK.with(|st| st.borrow_mut().push(ctx as usize));
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut Handle) -> CUresult {
    with(|_| match STACK.with(|st| st.borrow_mut().pop()) {
        Some(c) => {
            if !pctx.is_null() {
                // SAFETY: not null, as the API requires.
                unsafe { pctx.write(c as Handle) };
            }
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_CONTEXT,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    with(|s| {
        let h = ctx as usize;
        if h != 0 && !s.contexts.contains_key(&h) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        STACK.with(|st| {
            let mut st = st.borrow_mut();
            st.pop();
            if h != 0 {
                st.push(h);
            }
        });
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut Handle) -> CUresult {
    // SAFETY: as the API requires.
    with(|_| unsafe { put(pctx, current().unwrap_or(0) as Handle) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    // SAFETY: as the API requires.
    with_ctx(|_, _| unsafe { put(dev, 0) })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    with_ctx_flushing(|_, _| CUDA_SUCCESS)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut Handle, dev: CUdevice) -> CUresult {
    with(|s| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if pctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = match s.primary {
            Some((h, n)) => {
                s.primary = Some((h, n + 1));
                h
            }
            None => {
                let h = s.handle();
                s.contexts.insert(h, Context::new(true, 0));
                s.primary = Some((h, 1));
                h
            }
        };
        // SAFETY: checked not null.
        unsafe { put(pctx, h as Handle) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    with_output(|s, out| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        match s.primary {
            Some((h, 1)) => {
                take_printf(s, h, out);
                drop_context(s, h);
                s.primary = None;
                CUDA_SUCCESS
            }
            Some((_, 0)) => CUDA_ERROR_INVALID_CONTEXT,
            Some((h, n)) => {
                s.primary = Some((h, n - 1));
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_CONTEXT,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    with(|s| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        // SAFETY: as the API requires.
        unsafe {
            let r = put(flags, 0);
            if r != CUDA_SUCCESS {
                return r;
            }
            put(active, c_int::from(s.primary.is_some_and(|(_, n)| n > 0)))
        }
    })
}

// ---------------------------------------------------------------------------------
// Memory

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    // As NVIDIA's driver (seen on 580): a failed allocation leaves 0.
    let st = with_ctx(|s, _| {
        if dptr.is_null() || size == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        match s.mem.alloc(size) {
            // SAFETY: checked not null.
            Some(a) => unsafe { put(dptr, a) },
            None => CUDA_ERROR_OUT_OF_MEMORY,
        }
    });
    if st != CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: the caller's out-pointer, not null.
        unsafe { dptr.write(0) };
    }
    st
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    // An allocation a graph made: its memory stays while a graph holds its node.
    if let Some(st) = hira_apis_cuda_private::graph::free_block(dptr) {
        return st;
    }
    with_ctx(|s, _| {
        if dptr == 0 || s.mem.free(dptr) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_VALUE
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    with_ctx(|s, _| {
        let used = s.mem.used;
        // SAFETY: as the API requires.
        unsafe {
            let r = put(free, (TOTAL_MEMORY - used) as usize);
            if r != CUDA_SUCCESS {
                return r;
            }
            put(total, TOTAL_MEMORY as usize)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    with_ctx(|s, _| match s.mem.find(dptr, 0) {
        Some((b, _)) => {
            let len = s.mem.allocs[&b].len();
            // SAFETY: either may be null, as the API allows.
            unsafe {
                if !base.is_null() {
                    base.write(b);
                }
                if !size.is_null() {
                    size.write(len);
                }
            }
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_NOT_FOUND,
    })
}

fn copy_to_device(s: &mut State, dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    if n == 0 {
        return CUDA_SUCCESS;
    }
    if src.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the application's `src` holds `n` bytes, as the API requires.
    let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) };
    if ptx::DeviceMemory::write(&mut s.mem, dst, data) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

fn copy_from_device(s: &State, dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    if n == 0 {
        return CUDA_SUCCESS;
    }
    if dst.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the application's `dst` holds `n` bytes, as the API requires.
    let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), n) };
    if ptx::DeviceMemory::read(&s.mem, src, out) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    with_ctx_flushing(|s, _| copy_to_device(s, dst, src, n))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    with_ctx_flushing(|s, _| copy_from_device(s, dst, src, n))
}

/// Copies `n` bytes of device memory from `src` to `dst`.
fn copy_on_device(s: &mut State, dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    let mut tmp = vec![0u8; n];
    if !ptx::DeviceMemory::read(&s.mem, src, &mut tmp)
        || !ptx::DeviceMemory::write(&mut s.mem, dst, &tmp)
    {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUDA_SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    with_ctx_flushing(|s, _| copy_on_device(s, dst, src, n))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: Handle,
) -> CUresult {
    let copy = || hira_apis_cuda_private::graph::linear_copy_op(dst, DEVICE, src as u64, HOST, n);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, copy) {
        return st;
    }
    with_ctx(|s, _| {
        if !stream_ok(s, stream) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        copy_to_device(s, dst, src, n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    let copy = || hira_apis_cuda_private::graph::linear_copy_op(dst as u64, HOST, src, DEVICE, n);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, copy) {
        return st;
    }
    with_ctx(|s, _| {
        if !stream_ok(s, stream) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        copy_from_device(s, dst, src, n)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    let copy = || hira_apis_cuda_private::graph::linear_copy_op(dst, DEVICE, src, DEVICE, n);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, copy) {
        return st;
    }
    let ok = with(|s| {
        if stream_ok(s, stream) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_HANDLE
        }
    });
    if ok != CUDA_SUCCESS {
        return ok;
    }
    with_ctx(|s, _| copy_on_device(s, dst, src, n))
}

/// A copy in the unified address space: each side is device memory if it lies in an
/// allocation, else host memory. A blocking one flushes the `printf` FIFO.
fn unified_copy(dst: CUdeviceptr, src: CUdeviceptr, n: usize, blocking: bool) -> CUresult {
    let copy = |s: &mut State, _| {
        if n == 0 {
            return CUDA_SUCCESS;
        }
        let (d, h) = (s.mem.find(dst, n).is_some(), s.mem.find(src, n).is_some());
        match (d, h) {
            (true, true) => {
                let mut tmp = vec![0u8; n];
                if ptx::DeviceMemory::read(&s.mem, src, &mut tmp)
                    && ptx::DeviceMemory::write(&mut s.mem, dst, &tmp)
                {
                    CUDA_SUCCESS
                } else {
                    CUDA_ERROR_INVALID_VALUE
                }
            }
            (true, false) => copy_to_device(s, dst, src as usize as *const c_void, n),
            (false, true) => copy_from_device(s, dst as usize as *mut c_void, src, n),
            (false, false) => {
                if dst == 0 || src == 0 {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                // SAFETY: both are host memory of `n` bytes, as the API requires.
                unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, n) };
                CUDA_SUCCESS
            }
        }
    };
    if blocking {
        with_ctx_flushing(copy)
    } else {
        with_ctx(copy)
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    unified_copy(dst, src, n, true)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: Handle,
) -> CUresult {
    let copy = || hira_apis_cuda_private::graph::linear_copy_op(dst, UNIFIED, src, UNIFIED, n);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, copy) {
        return st;
    }
    let ok = with(|s| {
        if stream_ok(s, stream) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_HANDLE
        }
    });
    if ok != CUDA_SUCCESS {
        return ok;
    }
    unified_copy(dst, src, n, false)
}

fn memset(dst: CUdeviceptr, pattern: &[u8], count: usize) -> CUresult {
    with_ctx(|s, _| {
        let Some(len) = count.checked_mul(pattern.len()) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        if len == 0 {
            return CUDA_SUCCESS;
        }
        let data: Vec<u8> = pattern.iter().copied().cycle().take(len).collect();
        if !dst.is_multiple_of(pattern.len() as u64)
            || !ptx::DeviceMemory::write(&mut s.mem, dst, &data)
        {
            return CUDA_ERROR_INVALID_VALUE;
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    memset(dst, &[v], n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize) -> CUresult {
    memset(dst, &v.to_le_bytes(), n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult {
    memset(dst, &v.to_le_bytes(), n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, stream: Handle) -> CUresult {
    let op = || hira_apis_cuda_private::graph::memset_op(dst, 0, v.into(), 1, n, 1);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
        return st;
    }
    memset(dst, &[v], n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, stream: Handle) -> CUresult {
    let op = || hira_apis_cuda_private::graph::memset_op(dst, 0, v.into(), 2, n, 1);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
        return st;
    }
    memset(dst, &v.to_le_bytes(), n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    v: c_uint,
    n: usize,
    stream: Handle,
) -> CUresult {
    let op = || hira_apis_cuda_private::graph::memset_op(dst, 0, v, 4, n, 1);
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
        return st;
    }
    memset(dst, &v.to_le_bytes(), n)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    with_ctx(|_, _| {
        if pp.is_null() || size == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: plain allocation; freed by cuMemFreeHost.
        let p = unsafe { libc::calloc(1, size) };
        if p.is_null() {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        // SAFETY: checked not null.
        unsafe { put(pp, p) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    // SAFETY: `p` came from cuMemAllocHost_v2, as the API requires.
    with(|_| unsafe {
        libc::free(p);
        CUDA_SUCCESS
    })
}

// ---------------------------------------------------------------------------------
// Modules and functions

fn unload(s: &mut State, m: usize) {
    if let Some(lm) = s.modules.remove(&m) {
        for g in lm.globals {
            s.mem.free(g);
        }
        s.functions.retain(|_, (mm, _)| *mm != m);
    }
}

/// The PTX text of a module image: PTX itself, or the PTX a fatbin (or the
/// runtime's wrapper of one) holds for this device; a cubin cannot run here.
///
/// # Safety
/// `image` points to a module image as the API defines one.
unsafe fn image_ptx(image: *const c_void) -> Result<String, CUresult> {
    use hira_apis_cuda_private::fatbin::{self, Image};
    // SAFETY: every image has at least 4 bytes.
    let head: [u8; 4] = unsafe { image.cast::<[u8; 4]>().read_unaligned() };
    let fatbin_at = match fatbin::classify(head) {
        Image::Wrapper => {
            // SAFETY: a wrapper is 24 bytes.
            let wrapper = unsafe { image.cast::<[u8; 24]>().read_unaligned() };
            match fatbin::wrapped(&wrapper) {
                Some(p) if p != 0 => p as *const u8,
                _ => return Err(CUDA_ERROR_INVALID_IMAGE),
            }
        }
        Image::Fatbin => image.cast::<u8>(),
        Image::Elf => {
            eprintln!("hira CPU test executor: only PTX images can run here");
            return Err(CUDA_ERROR_INVALID_IMAGE);
        }
        Image::Ptx => {
            // SAFETY: PTX is a NUL-terminated string, as the API requires.
            let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) };
            return text
                .to_str()
                .map(str::to_owned)
                .map_err(|_| CUDA_ERROR_INVALID_IMAGE);
        }
    };
    // SAFETY: a fatbin starts with its 16-byte header, which gives its length.
    let head: [u8; 16] = unsafe { fatbin_at.cast::<[u8; 16]>().read_unaligned() };
    let len = fatbin::len(&head).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
    // SAFETY: as its header says.
    let data = unsafe { std::slice::from_raw_parts(fatbin_at, len) };
    let entries = fatbin::entries(data).map_err(|e| {
        eprintln!("hira CPU test executor: {e}");
        CUDA_ERROR_INVALID_IMAGE
    })?;
    // A GPU of this compute capability would run the fatbin's cubin for it; this
    // executor runs PTX only, so where the only PTX is for newer targets (NVIDIA's
    // libraries, cuRAND and CUB among them, ship a cubin per architecture and PTX for
    // the newest) it interprets the oldest of those.
    let best = fatbin::best_ptx(&entries, COMPUTE_CAPABILITY).or_else(|| {
        entries
            .iter()
            .filter(|e| e.kind == fatbin::Kind::Ptx)
            .min_by_key(|e| e.sm)
            .cloned()
    });
    let Some(best) = best else {
        eprintln!("hira CPU test executor: the fatbin has no PTX");
        return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
    };
    let text = best.contents().map_err(|e| {
        eprintln!("hira CPU test executor: {e}");
        CUDA_ERROR_INVALID_IMAGE
    })?;
    String::from_utf8(text).map_err(|_| CUDA_ERROR_INVALID_PTX)
}

/// Parses PTX into a module of context `ctx` (0: a library's, of no context) and
/// allocates its variables.
fn load_ptx(s: &mut State, text: &str, ctx: usize) -> Result<usize, CUresult> {
    let module = match ptx::Module::parse(text) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("hira CPU test executor: {e}");
            return Err(CUDA_ERROR_INVALID_PTX);
        }
    };
    let mut globals = Vec::new();
    for g in &module.globals {
        let Some(a) = s.mem.alloc(g.size.max(1)) else {
            for a in globals {
                s.mem.free(a);
            }
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        };
        ptx::DeviceMemory::write(&mut s.mem, a, &g.init);
        globals.push(a);
    }
    let h = s.handle();
    s.modules.insert(
        h,
        LoadedModule {
            ptx: Arc::new(module),
            globals,
            ctx,
        },
    );
    Ok(h)
}

/// Loads a module image into the current context.
unsafe fn load_image(pmod: *mut Handle, image: *const c_void) -> CUresult {
    with_ctx_flushing(|s, ctx| {
        if pmod.is_null() || image.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's promise.
        let text = match unsafe { image_ptx(image) } {
            Ok(t) => t,
            Err(e) => return e,
        };
        match load_ptx(s, &text, ctx) {
            // SAFETY: checked not null.
            Ok(h) => unsafe { put(pmod, h as Handle) },
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(pmod: *mut Handle, image: *const c_void) -> CUresult {
    // SAFETY: same contract.
    unsafe { load_image(pmod, image) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pmod: *mut Handle,
    image: *const c_void,
    _n: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract; JIT options do not apply to an interpreter.
    unsafe { load_image(pmod, image) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(pmod: *mut Handle, fname: *const c_char) -> CUresult {
    if fname.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a C string, as the API requires.
    let path = unsafe { CStr::from_ptr(fname) };
    let path: &std::ffi::OsStr = std::os::unix::ffi::OsStrExt::from_bytes(path.to_bytes());
    let Ok(mut text) = std::fs::read(path) else {
        return CUDA_ERROR_FILE_NOT_FOUND;
    };
    text.push(0);
    // SAFETY: NUL-terminated above.
    unsafe { load_image(pmod, text.as_ptr().cast()) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(m: Handle) -> CUresult {
    with_output(|s, out| {
        let Some(ctx) = s.modules.get(&(m as usize)).map(|lm| lm.ctx) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        take_printf(s, ctx, out);
        unload(s, m as usize);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    pf: *mut Handle,
    m: Handle,
    name: *const c_char,
) -> CUresult {
    // As NVIDIA's driver (seen on 580): a failed lookup leaves a null handle.
    let st = with_ctx(|s, _| {
        if pf.is_null() || name.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Some(lm) = s.modules.get(&(m as usize)) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        // SAFETY: a C string, as the API requires.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let Some(i) = lm.ptx.kernels.iter().position(|k| k.name == name) else {
            return CUDA_ERROR_NOT_FOUND;
        };
        let h = s.handle();
        s.functions.insert(h, (m as usize, i));
        // SAFETY: checked not null.
        unsafe { put(pf, h as Handle) }
    });
    if st != CUDA_SUCCESS && !pf.is_null() {
        // SAFETY: the caller's out-pointer, not null.
        unsafe { pf.write(std::ptr::null_mut()) };
    }
    st
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: Handle,
    name: *const c_char,
) -> CUresult {
    // SAFETY: the caller's out-pointers and name.
    with_ctx(|s, _| unsafe { global(s, m as usize, name, dptr, bytes) })
}

/// Writes the address and size of variable `name` of module `m` (either out-pointer
/// may be null, as the API allows).
///
/// # Safety
/// `name` is null or a C string; `dptr` and `bytes` are null or valid for a write.
unsafe fn global(
    s: &State,
    m: usize,
    name: *const c_char,
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
) -> CUresult {
    if name.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(lm) = s.modules.get(&m) else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    // SAFETY: a C string, as the API requires.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let Some(i) = lm.ptx.globals.iter().position(|g| g.name == name) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: either may be null, as the API allows.
    unsafe {
        if !dptr.is_null() {
            dptr.write(lm.globals[i]);
        }
        if !bytes.is_null() {
            bytes.write(lm.ptx.globals[i].size);
        }
    }
    CUDA_SUCCESS
}

fn kernel_of(s: &State, f: Handle) -> Option<(Arc<ptx::Module>, usize, Vec<u64>)> {
    let &(m, i) = s.functions.get(&(f as usize))?;
    let lm = s.modules.get(&m)?;
    Some((lm.ptx.clone(), i, lm.globals.clone()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: Handle,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // Tests play a driver older than CUDA 12.4, which cannot answer this.
    if std::env::var_os("HIRA_CUDA_CPU_NO_PARAM_INFO").is_some() {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    with(|s| {
        let Some((m, i, _)) = kernel_of(s, f) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        let Some(p) = m.kernels[i].params.get(index) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: either may be null, as the API allows.
        unsafe {
            if !offset.is_null() {
                offset.write(p.offset);
            }
            if !size.is_null() {
                size.write(p.size);
            }
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut c_int, attrib: c_int, f: Handle) -> CUresult {
    with(|s| {
        let Some((m, i, _)) = kernel_of(s, f) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        let k = &m.kernels[i];
        let v = match attrib {
            0 => MAX_THREADS as c_int,
            1 => k.shared_size() as c_int,
            2 | 3 => 0,
            4 => k.registers().min(255) as c_int,
            // PTX and binary version, as the compute capability it reports.
            5 | 6 => COMPUTE_CAPABILITY as c_int,
            // CACHE_MODE_CA (not built with -dlcm=ca), and the cluster attributes
            // (10 to 17) of a kernel that asks for no cluster: what
            // cudaFuncGetAttributes and the occupancy calculator read.
            7 | 10..=17 => 0,
            8 => s
                .func_attrs
                .get(&(f as usize, 8))
                .copied()
                .unwrap_or((MAX_SHARED - k.shared_size()) as c_int),
            9 => s.func_attrs.get(&(f as usize, 9)).copied().unwrap_or(-1),
            _ => return CUDA_ERROR_INVALID_VALUE,
        };
        // SAFETY: as the API requires.
        unsafe { put(pi, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetAttribute(f: Handle, attrib: c_int, value: c_int) -> CUresult {
    with_ctx(|s, _| {
        let Some((m, i, _)) = kernel_of(s, f) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        let room = (MAX_SHARED - m.kernels[i].shared_size()) as c_int;
        let ok = match attrib {
            // MAX_DYNAMIC_SHARED_SIZE_BYTES: what the device has beside the static.
            8 => (0..=room).contains(&value),
            // PREFERRED_SHARED_MEMORY_CARVEOUT: a percentage, or -1 for none.
            9 => (-1..=100).contains(&value),
            _ => false,
        };
        if !ok {
            return CUDA_ERROR_INVALID_VALUE;
        }
        s.func_attrs.insert((f as usize, attrib), value);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetCacheConfig(f: Handle, config: c_int) -> CUresult {
    with_ctx(|s, _| {
        if kernel_of(s, f).is_none() {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        if !(0..=3).contains(&config) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    blocks: *mut c_int,
    f: Handle,
    block_size: c_int,
    dynamic: usize,
) -> CUresult {
    with_ctx(|s, _| {
        let Some((m, i, _)) = kernel_of(s, f) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        let shared = m.kernels[i].shared_size() + dynamic;
        let n = if block_size <= 0 || block_size > MAX_THREADS as c_int || shared > MAX_SHARED {
            0
        } else {
            // 2048 threads, 32 blocks and 64 KiB of shared memory per multiprocessor.
            let by_threads = 2048 / block_size;
            let by_shared = (64 * 1024 / shared.max(1)) as c_int;
            by_threads.min(32).min(by_shared)
        };
        // SAFETY: as the API requires.
        unsafe { put(blocks, n) }
    })
}

/// `CU_LAUNCH_PARAM_BUFFER_POINTER`, `_SIZE`, `_END`.
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;
const PARAM_END: usize = 0;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let node = || {
        // SAFETY: the caller's parameters, as the API requires.
        unsafe {
            hira_apis_cuda_private::graph::kernel_op(
                &graphs::ISSUE,
                f,
                [gx, gy, gz],
                [bx, by, bz],
                shared,
                params,
                extra,
                Vec::new(),
            )
        }
    };
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, node) {
        return st;
    }
    // Tests play a launch the device refuses for a reason the guest cannot see
    // (registers, say): launch number N fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.
    static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if std::env::var("HIRA_CUDA_CPU_FAIL_LAUNCH").is_ok_and(|v| v == n.to_string()) {
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    }
    let r = with_ctx_flushing(|s, ctx| {
        let Some((m, i, globals)) = kernel_of(s, f) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        if !stream_ok(s, stream) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        let k = &m.kernels[i];
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        if [gx, gy, gz, bx, by, bz].contains(&0)
            || threads > u64::from(MAX_THREADS)
            || bz > 64
            || k.shared_size() + shared as usize > MAX_SHARED
            || s.func_attrs
                .get(&(f as usize, 8))
                .is_some_and(|&m| i64::from(shared) > i64::from(m))
        {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut buf = vec![0u8; k.param_bytes()];
        if !params.is_null() {
            for (n, p) in k.params.iter().enumerate() {
                // SAFETY: `params` has one pointer per kernel parameter, each to a
                // value of the parameter's size, as the API requires.
                unsafe {
                    let src = *params.add(n);
                    if src.is_null() {
                        return CUDA_ERROR_INVALID_VALUE;
                    }
                    std::ptr::copy_nonoverlapping(
                        src.cast::<u8>(),
                        buf[p.offset..].as_mut_ptr(),
                        p.size,
                    );
                }
            }
        } else if !extra.is_null() {
            let (mut ptr, mut len) = (std::ptr::null::<u8>(), None);
            let mut at = 0;
            loop {
                // SAFETY: `extra` is a list ended by CU_LAUNCH_PARAM_END.
                let key = unsafe { *extra.add(at) } as usize;
                match key {
                    PARAM_END => break,
                    // SAFETY: as above; each key has a value.
                    PARAM_BUFFER_POINTER => ptr = unsafe { *extra.add(at + 1) }.cast::<u8>(),
                    PARAM_BUFFER_SIZE => {
                        // SAFETY: as above; the value points to a size_t.
                        len = Some(unsafe { *(*extra.add(at + 1)).cast::<usize>() })
                    }
                    _ => return CUDA_ERROR_INVALID_VALUE,
                }
                at += 2;
            }
            match len {
                Some(n) if !ptr.is_null() && n >= buf.len() => {
                    // SAFETY: the buffer holds `n` bytes, as the API requires.
                    unsafe { std::ptr::copy_nonoverlapping(ptr, buf.as_mut_ptr(), buf.len()) };
                }
                _ => return CUDA_ERROR_INVALID_VALUE,
            }
        } else if !k.params.is_empty() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let dims = ptx::Dims {
            grid: [gx, gy, gz],
            block: [bx, by, bz],
        };
        let Some(c) = s.contexts.get_mut(&ctx) else {
            return CUDA_ERROR_INVALID_CONTEXT;
        };
        c.printf_launched |= k.uses_printf();
        let run = ptx::launch(
            k,
            dims,
            shared as usize,
            &buf,
            &globals,
            &mut s.mem,
            &mut c.printf,
        );
        if let Err(e) = run {
            eprintln!(
                "hira CPU test executor: kernel {} faulted: {}",
                k.name,
                fault_text(&e.0)
            );
            // As on a GPU, the fault is reported by later calls and sticks.
            c.sticky = if e.0.contains("address") {
                CUDA_ERROR_ILLEGAL_ADDRESS
            } else {
                CUDA_ERROR_LAUNCH_FAILED
            };
        }
        CUDA_SUCCESS
    });
    // With CUDA_LAUNCH_BLOCKING=1 the driver flushes at the end of a launch too.
    if r == CUDA_SUCCESS && std::env::var_os("CUDA_LAUNCH_BLOCKING").is_some_and(|v| v == "1") {
        with_flushing(|_| CUDA_SUCCESS);
    }
    r
}

// ---------------------------------------------------------------------------------
// Streams and events

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut Handle, flags: c_uint) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuStreamCreateWithPriority(ph, flags, 0) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut Handle,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    with_ctx(|s, ctx| {
        if ph.is_null() || flags > 1 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = s.handle();
        // Priorities are clamped to the range, as the driver does.
        s.streams
            .insert(h, (ctx, flags, priority.clamp(GREATEST_PRIORITY, 0)));
        // SAFETY: checked not null.
        unsafe { put(ph, h as Handle) }
    })
}

/// The greatest stream priority (numerically lowest); the least is 0.
const GREATEST_PRIORITY: c_int = -5;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority(h: Handle, priority: *mut c_int) -> CUresult {
    with_ctx(|s, _| match h as usize {
        // SAFETY: as the API requires.
        0..=2 => unsafe { put(priority, 0) },
        id => match s.streams.get(&id) {
            // SAFETY: as the API requires.
            Some(&(_, _, p)) => unsafe { put(priority, p) },
            None => CUDA_ERROR_INVALID_HANDLE,
        },
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetFlags(h: Handle, flags: *mut c_uint) -> CUresult {
    with_ctx(|s, _| match h as usize {
        // SAFETY: as the API requires.
        0..=2 => unsafe { put(flags, 0) },
        id => match s.streams.get(&id) {
            // SAFETY: as the API requires.
            Some(&(_, f, _)) => unsafe { put(flags, f) },
            None => CUDA_ERROR_INVALID_HANDLE,
        },
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    with_ctx(|_, _| {
        // SAFETY: either may be null, as the API allows.
        unsafe {
            if !least.is_null() {
                least.write(0);
            }
            if !greatest.is_null() {
                greatest.write(GREATEST_PRIORITY);
            }
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    // SAFETY: as the API requires.
    with_ctx(|s, ctx| unsafe { put(flags, s.contexts[&ctx].flags) })
}

/// The printf FIFO's size cannot change once a kernel that calls `printf` was
/// launched in the context: `CUDA_ERROR_INVALID_VALUE`, as the documentation says.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    with_ctx(|s, ctx| {
        if !LIMITS.iter().any(|&(l, _)| l == limit) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let c = s.contexts.get_mut(&ctx).expect("current");
        if limit == LIMIT_PRINTF_FIFO_SIZE {
            if c.printf_launched {
                return CUDA_ERROR_INVALID_VALUE;
            }
            c.printf.set_capacity(value);
        }
        c.limits.insert(limit, value);
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: c_int) -> CUresult {
    with_ctx(|s, ctx| {
        let Some(&(_, default)) = LIMITS.iter().find(|&&(l, _)| l == limit) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let v = s.contexts[&ctx]
            .limits
            .get(&limit)
            .copied()
            .unwrap_or(default);
        // SAFETY: as the API requires.
        unsafe { put(value, v) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCacheConfig(config: c_int) -> CUresult {
    with_ctx(|s, ctx| {
        if !(0..=3).contains(&config) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        s.contexts.get_mut(&ctx).expect("current").cache_config = config;
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCacheConfig(config: *mut c_int) -> CUresult {
    // SAFETY: as the API requires.
    with_ctx(|s, ctx| unsafe { put(config, s.contexts[&ctx].cache_config) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    with(|_| {
        if dev != 0 || peer != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        // One device: no peer.
        // SAFETY: as the API requires.
        unsafe { put(can, 0) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(h: Handle) -> CUresult {
    with(|s| match s.streams.remove(&(h as usize)) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

/// `CUDA_SUCCESS` if stream `h` exists: work runs when it is enqueued, so a stream
/// is always idle.
fn stream_idle(s: &State, h: Handle) -> CUresult {
    if stream_ok(s, h) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_HANDLE
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(h: Handle) -> CUresult {
    if let Some(st) = hira_apis_cuda_private::graph::capture_forbidden(h) {
        return st;
    }
    with_ctx_flushing(|s, _| stream_idle(s, h))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(h: Handle) -> CUresult {
    if let Some(st) = hira_apis_cuda_private::graph::capture_forbidden(h) {
        return st;
    }
    with_ctx(|s, _| stream_idle(s, h))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(h: Handle, ev: Handle, flags: c_uint) -> CUresult {
    if flags & !hira_apis_cuda_private::graph::EVENT_EXTERNAL != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if let Some(st) = hira_apis_cuda_private::graph::capture_wait(h, ev, flags) {
        return st;
    }
    with_ctx(|s, _| {
        if stream_ok(s, h) && s.events.contains_key(&(ev as usize)) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_HANDLE
        }
    })
}

/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: c_uint = 2;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(ph: *mut Handle, flags: c_uint) -> CUresult {
    with_ctx(|s, _| {
        if ph.is_null() || flags & !0xF != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = s.handle();
        s.events.insert(
            h,
            Event {
                recorded: None,
                timing: flags & EVENT_DISABLE_TIMING == 0,
            },
        );
        // SAFETY: checked not null.
        unsafe { put(ph, h as Handle) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(ev: Handle, stream: Handle) -> CUresult {
    if let Some(st) = hira_apis_cuda_private::graph::capture_record(ev, stream, false) {
        return st;
    }
    with_ctx(|s, _| {
        if !stream_ok(s, stream) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        match s.events.get_mut(&(ev as usize)) {
            Some(e) => {
                e.recorded = Some(Instant::now());
                CUDA_SUCCESS
            }
            None => CUDA_ERROR_INVALID_HANDLE,
        }
    })
}

/// `CUDA_SUCCESS` if event `ev` exists: work runs when it is enqueued, so an event
/// is always complete.
fn event_known(s: &State, ev: Handle) -> CUresult {
    if s.events.contains_key(&(ev as usize)) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_HANDLE
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(ev: Handle) -> CUresult {
    with(|s| event_known(s, ev))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(ev: Handle) -> CUresult {
    with_flushing(|s| event_known(s, ev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    with(|s| {
        let (Some(a), Some(b)) = (
            s.events.get(&(start as usize)),
            s.events.get(&(end as usize)),
        ) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        if !a.timing || !b.timing {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        let (Some(ta), Some(tb)) = (a.recorded, b.recorded) else {
            return CUDA_ERROR_NOT_READY;
        };
        let d = if tb >= ta {
            (tb - ta).as_secs_f32() * 1e3
        } else {
            -((ta - tb).as_secs_f32() * 1e3)
        };
        // SAFETY: as the API requires.
        unsafe { put(ms, d) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: Handle,
    end: Handle,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy_v2(ev: Handle) -> CUresult {
    with(|s| match s.events.remove(&(ev as usize)) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

// ---------------------------------------------------------------------------------
// Errors and entry points

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(e: CUresult, out: *mut *const c_char) -> CUresult {
    error_text(e, out, |(_, n, _)| n)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(e: CUresult, out: *mut *const c_char) -> CUresult {
    error_text(e, out, |(_, _, d)| d)
}

fn error_text(
    e: CUresult,
    out: *mut *const c_char,
    pick: fn(&(CUresult, &'static CStr, &'static CStr)) -> &'static CStr,
) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let found = ERRORS.iter().find(|x| x.0 == e);
    // SAFETY: checked not null.
    unsafe { out.write(found.map_or(std::ptr::null(), |x| pick(x).as_ptr())) };
    if found.is_some() {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

/// The functions this library exports, by their exported names (`cuMemAlloc_v2`),
/// which `cuGetProcAddress` resolves a name and version to.
fn entry_points() -> &'static [(&'static str, usize)] {
    static TABLE: std::sync::OnceLock<Vec<(&'static str, usize)>> = std::sync::OnceLock::new();
    macro_rules! table {
        ($($name:literal => $f:path),* $(,)?) => {
            TABLE.get_or_init(|| {
                let mut t = vec![$(($name, $f as *const () as usize)),*];
                t.extend(graphs::graph_entries());
                t.extend(graphs::pools::pool_entries());
                t
            })
        };
    }
    table! {
        "cuCtxCreate_v2" => cuCtxCreate_v2,
        "cuCtxCreate_v4" => cuCtxCreate_v4,
        "cuCtxDestroy_v2" => cuCtxDestroy_v2,
        "cuCtxGetApiVersion" => library::cuCtxGetApiVersion,
        "cuCtxGetCacheConfig" => cuCtxGetCacheConfig,
        "cuCtxGetCurrent" => cuCtxGetCurrent,
        "cuCtxGetDevice" => cuCtxGetDevice,
        "cuCtxGetDevice_v2" => library::cuCtxGetDevice_v2,
        "cuCtxGetFlags" => cuCtxGetFlags,
        "cuCtxGetId" => library::cuCtxGetId,
        "cuCtxGetLimit" => cuCtxGetLimit,
        "cuCtxGetStreamPriorityRange" => cuCtxGetStreamPriorityRange,
        "cuCtxPopCurrent_v2" => cuCtxPopCurrent_v2,
        "cuCtxPushCurrent_v2" => cuCtxPushCurrent_v2,
        "cuCtxSetCacheConfig" => cuCtxSetCacheConfig,
        "cuCtxSetCurrent" => cuCtxSetCurrent,
        "cuCtxSetLimit" => cuCtxSetLimit,
        "cuCtxSynchronize" => cuCtxSynchronize,
        "cuCtxSynchronize_v2" => library::cuCtxSynchronize_v2,
        "cuDeviceCanAccessPeer" => cuDeviceCanAccessPeer,
        "cuMemAllocPitch_v2" => pitched::cuMemAllocPitch_v2,
        "cuArrayCreate_v2" => texture::cuArrayCreate_v2,
        "cuArray3DCreate_v2" => texture::cuArray3DCreate_v2,
        "cuArrayDestroy" => texture::cuArrayDestroy,
        "cuArrayGetDescriptor_v2" => texture::cuArrayGetDescriptor_v2,
        "cuArray3DGetDescriptor_v2" => texture::cuArray3DGetDescriptor_v2,
        "cuTexObjectCreate" => texture::cuTexObjectCreate,
        "cuTexObjectDestroy" => texture::cuTexObjectDestroy,
        "cuTexObjectGetResourceDesc" => texture::cuTexObjectGetResourceDesc,
        "cuTexObjectGetTextureDesc" => texture::cuTexObjectGetTextureDesc,
        "cuSurfObjectCreate" => texture::cuSurfObjectCreate,
        "cuSurfObjectDestroy" => texture::cuSurfObjectDestroy,
        "cuSurfObjectGetResourceDesc" => texture::cuSurfObjectGetResourceDesc,
        "cuMemcpy2D_v2" => pitched::cuMemcpy2D_v2,
        "cuMemcpy2DUnaligned_v2" => pitched::cuMemcpy2DUnaligned_v2,
        "cuMemcpy2DAsync_v2" => pitched::cuMemcpy2DAsync_v2,
        "cuMemcpy3D_v2" => pitched::cuMemcpy3D_v2,
        "cuMemcpy3DAsync_v2" => pitched::cuMemcpy3DAsync_v2,
        "cuMemcpyHtoA_v2" => pitched::cuMemcpyHtoA_v2,
        "cuMemcpyAtoH_v2" => pitched::cuMemcpyAtoH_v2,
        "cuMemcpyDtoA_v2" => pitched::cuMemcpyDtoA_v2,
        "cuMemcpyAtoD_v2" => pitched::cuMemcpyAtoD_v2,
        "cuMemcpyAtoA_v2" => pitched::cuMemcpyAtoA_v2,
        "cuMemcpyHtoAAsync_v2" => pitched::cuMemcpyHtoAAsync_v2,
        "cuMemcpyAtoHAsync_v2" => pitched::cuMemcpyAtoHAsync_v2,
        "cuMemsetD2D8_v2" => pitched::cuMemsetD2D8_v2,
        "cuMemsetD2D16_v2" => pitched::cuMemsetD2D16_v2,
        "cuMemsetD2D32_v2" => pitched::cuMemsetD2D32_v2,
        "cuMemsetD2D8Async" => pitched::cuMemsetD2D8Async,
        "cuMemsetD2D16Async" => pitched::cuMemsetD2D16Async,
        "cuMemsetD2D32Async" => pitched::cuMemsetD2D32Async,
        "cuLaunchKernelEx" => library::cuLaunchKernelEx,
        "cuLaunchHostFunc" => library::cuLaunchHostFunc,
        "cuStreamAddCallback" => library::cuStreamAddCallback,
        "cuPointerGetAttribute" => library::cuPointerGetAttribute,
        "cuPointerGetAttributes" => library::cuPointerGetAttributes,
        "cuDeviceGet" => cuDeviceGet,
        "cuDeviceGetAttribute" => cuDeviceGetAttribute,
        "cuDeviceGetCount" => cuDeviceGetCount,
        "cuDeviceGetName" => cuDeviceGetName,
        "cuDeviceGetUuid" => cuDeviceGetUuid,
        "cuDeviceGetUuid_v2" => cuDeviceGetUuid_v2,
        "cuDevicePrimaryCtxGetState" => cuDevicePrimaryCtxGetState,
        "cuDevicePrimaryCtxRelease_v2" => cuDevicePrimaryCtxRelease_v2,
        "cuDevicePrimaryCtxReset_v2" => library::cuDevicePrimaryCtxReset_v2,
        "cuDevicePrimaryCtxReset" => library::cuDevicePrimaryCtxReset_v2,
        "cuDevicePrimaryCtxRelease" => cuDevicePrimaryCtxRelease_v2,
        "cuDevicePrimaryCtxSetFlags" => library::cuDevicePrimaryCtxSetFlags_v2,
        "cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain,
        "cuDevicePrimaryCtxSetFlags_v2" => library::cuDevicePrimaryCtxSetFlags_v2,
        "cuDeviceTotalMem_v2" => cuDeviceTotalMem_v2,
        "cuDriverGetVersion" => cuDriverGetVersion,
        "cuEventCreate" => cuEventCreate,
        "cuEventDestroy_v2" => cuEventDestroy_v2,
        "cuEventElapsedTime" => cuEventElapsedTime,
        "cuEventElapsedTime_v2" => cuEventElapsedTime_v2,
        "cuEventQuery" => cuEventQuery,
        "cuEventRecord" => cuEventRecord,
        "cuEventRecordWithFlags" => graphs::cuEventRecordWithFlags,
        "cuEventSynchronize" => cuEventSynchronize,
        "cuFuncGetAttribute" => cuFuncGetAttribute,
        "cuFuncGetParamInfo" => cuFuncGetParamInfo,
        "cuFuncSetAttribute" => cuFuncSetAttribute,
        "cuFuncSetCacheConfig" => cuFuncSetCacheConfig,
        "cuGetErrorName" => cuGetErrorName,
        "cuGetExportTable" => library::cuGetExportTable,
        "cuKernelGetParamInfo" => library::cuKernelGetParamInfo,
        "cuProfilerStart" => library::cuProfilerStart,
        "cuProfilerStop" => library::cuProfilerStop,
        "cuGetErrorString" => cuGetErrorString,
        "cuGetProcAddress" => cuGetProcAddress,
        "cuGetProcAddress_v2" => cuGetProcAddress_v2,
        "cuInit" => cuInit,
        "cuKernelGetAttribute" => library::cuKernelGetAttribute,
        "cuKernelGetFunction" => library::cuKernelGetFunction,
        "cuKernelSetAttribute" => library::cuKernelSetAttribute,
        "cuKernelSetCacheConfig" => library::cuKernelSetCacheConfig,
        "cuLaunchKernel" => cuLaunchKernel,
        "cuLibraryEnumerateKernels" => library::cuLibraryEnumerateKernels,
        "cuLibraryGetGlobal" => library::cuLibraryGetGlobal,
        "cuLibraryGetKernel" => library::cuLibraryGetKernel,
        "cuLibraryGetKernelCount" => library::cuLibraryGetKernelCount,
        "cuLibraryGetManaged" => library::cuLibraryGetManaged,
        "cuLibraryGetModule" => library::cuLibraryGetModule,
        "cuLibraryLoadData" => library::cuLibraryLoadData,
        "cuLibraryUnload" => library::cuLibraryUnload,
        "cuMemAllocHost_v2" => cuMemAllocHost_v2,
        "cuMemAlloc_v2" => cuMemAlloc_v2,
        "cuMemFreeHost" => cuMemFreeHost,
        "cuMemFree_v2" => cuMemFree_v2,
        "cuMemGetAddressRange_v2" => cuMemGetAddressRange_v2,
        "cuMemGetInfo_v2" => cuMemGetInfo_v2,
        "cuMemHostAlloc" => library::cuMemHostAlloc,
        "cuMemcpy" => cuMemcpy,
        "cuMemcpyAsync" => cuMemcpyAsync,
        "cuMemcpyDtoDAsync_v2" => cuMemcpyDtoDAsync_v2,
        "cuMemcpyDtoD_v2" => cuMemcpyDtoD_v2,
        "cuMemcpyDtoHAsync_v2" => cuMemcpyDtoHAsync_v2,
        "cuMemcpyDtoH_v2" => cuMemcpyDtoH_v2,
        "cuMemcpyHtoDAsync_v2" => cuMemcpyHtoDAsync_v2,
        "cuMemcpyHtoD_v2" => cuMemcpyHtoD_v2,
        "cuMemsetD16_v2" => cuMemsetD16_v2,
        "cuMemsetD16Async" => cuMemsetD16Async,
        "cuMemsetD32Async" => cuMemsetD32Async,
        "cuMemsetD32_v2" => cuMemsetD32_v2,
        "cuMemsetD8Async" => cuMemsetD8Async,
        "cuMemsetD8_v2" => cuMemsetD8_v2,
        "cuModuleGetFunction" => cuModuleGetFunction,
        "cuModuleGetGlobal_v2" => cuModuleGetGlobal_v2,
        "cuModuleGetLoadingMode" => library::cuModuleGetLoadingMode,
        "cuModuleLoad" => cuModuleLoad,
        "cuModuleLoadData" => cuModuleLoadData,
        "cuModuleLoadDataEx" => cuModuleLoadDataEx,
        "cuModuleUnload" => cuModuleUnload,
        "cuOccupancyMaxActiveBlocksPerMultiprocessor" => cuOccupancyMaxActiveBlocksPerMultiprocessor,
        "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" => library::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
        "cuStreamCreate" => cuStreamCreate,
        "cuStreamCreateWithPriority" => cuStreamCreateWithPriority,
        "cuStreamDestroy_v2" => cuStreamDestroy_v2,
        "cuStreamGetFlags" => cuStreamGetFlags,
        "cuStreamGetPriority" => cuStreamGetPriority,
        "cuStreamQuery" => cuStreamQuery,
        "cuStreamSynchronize" => cuStreamSynchronize,
        "cuStreamWaitEvent" => cuStreamWaitEvent,
    }
}

/// `CU_GET_PROC_ADDRESS_SUCCESS`, `_SYMBOL_NOT_FOUND`.
const PROC_FOUND: c_int = 0;
const PROC_NOT_FOUND: c_int = 1;

/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
const PROC_VERSION_NOT_SUFFICIENT: c_int = 2;

/// Resolves `symbol` at `version` to the variant a program built for that version
/// expects (`hira_apis_cuda_private::procs`), if this library has it. Every stream is
/// always idle here, so a per-thread default-stream variant is its legacy one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    use hira_apis_cuda_private::procs::{Lookup, lookup};
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a C string, as the API requires.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let (st, found) = match lookup(&name, version, flags) {
        Lookup::Found(sym) => {
            let base = sym.trim_end_matches("_ptsz").trim_end_matches("_ptds");
            match entry_points().iter().find(|(n, _)| *n == base) {
                Some(&(_, f)) => (PROC_FOUND, f),
                None => (PROC_NOT_FOUND, 0),
            }
        }
        Lookup::VersionNotSufficient => (PROC_VERSION_NOT_SUFFICIENT, 0),
        Lookup::NotFound => (PROC_NOT_FOUND, 0),
    };
    // SAFETY: checked not null; `status` may be null.
    unsafe {
        pfn.write(found as *mut c_void);
        if !status.is_null() {
            status.write(st);
        }
    }
    // As NVIDIA's driver 580 answers the runtime's probe with an empty name.
    if st == PROC_FOUND || name.is_empty() {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_NOT_FOUND
    }
}

/// The first `cuGetProcAddress`, without the status out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_faults_address_is_left_out_of_what_is_printed() {
        assert_eq!(
            super::fault_text("ld.global.f32 %f24, [%rd10]: illegal address 0x6fffffc00"),
            "ld.global.f32 %f24, [%rd10]: illegal address"
        );
        assert_eq!(
            super::fault_text("illegal address 0xfc00 in a texture"),
            "illegal address in a texture"
        );
        assert_eq!(super::fault_text("trap"), "trap");
    }
}
