//! What NVIDIA's runtime asks of the driver beyond the calls of `cuda.h` programs:
//! context-independent libraries (`cuLibrary*`, `cuKernel*`), the module loading
//! mode, and the entry points CUDA 13.0 changed (`cuCtxGetDevice_v2`,
//! `cuCtxSynchronize_v2`).
//!
//! A library here is a module of no context (its variables live in the one device
//! memory every context shares); a kernel handle is the handle of the function it
//! gives, as `cuKernelGetFunction` returns it, so `cuLaunchKernel` takes either.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use hira_apis_cuda_private::launch;

use super::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_SUPPORTED, CUDA_SUCCESS,
    CUdevice, CUdeviceptr, CUresult, Context, Handle, State, current, image_ptx, in_ctx, load_ptx,
    put, take_printf, unload, with, with_flushing, with_output,
};

/// The module a library handle stands for.
fn module_of(s: &State, lib: Handle) -> Option<usize> {
    s.libraries.get(&(lib as usize)).copied()
}

/// The handle of kernel `i` of module `m`, made once.
fn kernel_handle(s: &mut State, m: usize, i: usize) -> usize {
    if let Some(h) = s
        .functions
        .iter()
        .find(|(_, f)| **f == (m, i))
        .map(|(h, _)| *h)
    {
        return h;
    }
    let h = s.handle();
    s.functions.insert(h, (m, i));
    h
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut Handle,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_values: *mut *mut c_void,
    _num_jit: c_uint,
    _lib_options: *mut c_int,
    _lib_values: *mut *mut c_void,
    _num_lib: c_uint,
) -> CUresult {
    with_flushing(|s| {
        if library.is_null() || code.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: a module image, a fatbin or the runtime's wrapper of one, as the API
        // requires. Options tune loading and JIT, which an interpreter has none of.
        let text = match unsafe { image_ptx(code) } {
            Ok(t) => t,
            Err(e) => return e,
        };
        match load_ptx(s, &text, 0) {
            Ok(m) => {
                let h = s.handle();
                s.libraries.insert(h, m);
                // SAFETY: checked not null.
                unsafe { put(library, h as Handle) }
            }
            Err(e) => e,
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryUnload(library: Handle) -> CUresult {
    with(|s| match s.libraries.remove(&(library as usize)) {
        Some(m) => {
            unload(s, m);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut Handle,
    library: Handle,
    name: *const c_char,
) -> CUresult {
    with(|s| {
        if kernel.is_null() || name.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let Some(m) = module_of(s, library) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        // SAFETY: a C string, as the API requires.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let Some(i) = s.modules[&m]
            .ptx
            .kernels
            .iter()
            .position(|k| k.name == name)
        else {
            return CUDA_ERROR_NOT_FOUND;
        };
        let h = kernel_handle(s, m, i);
        // SAFETY: checked not null.
        unsafe { put(kernel, h as Handle) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut c_uint, library: Handle) -> CUresult {
    with(|s| match module_of(s, library) {
        // SAFETY: as the API requires.
        Some(m) => unsafe { put(count, s.modules[&m].ptx.kernels.len() as c_uint) },
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut Handle,
    n: c_uint,
    library: Handle,
) -> CUresult {
    with(|s| {
        let Some(m) = module_of(s, library) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        let count = s.modules[&m].ptx.kernels.len();
        if kernels.is_null() || (n as usize) < count {
            return CUDA_ERROR_INVALID_VALUE;
        }
        for i in 0..count {
            let h = kernel_handle(s, m, i);
            // SAFETY: the caller's array holds `n` >= `count` handles.
            unsafe { kernels.add(i).write(h as Handle) };
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetModule(module: *mut Handle, library: Handle) -> CUresult {
    with(|s| match module_of(s, library) {
        // SAFETY: as the API requires.
        Some(m) => unsafe { put(module, m as Handle) },
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: Handle,
    name: *const c_char,
) -> CUresult {
    with(|s| match module_of(s, library) {
        // SAFETY: the caller's out-pointers and name.
        Some(m) => unsafe { super::global(s, m, name, dptr, bytes) },
        None if name.is_null() => CUDA_ERROR_INVALID_VALUE,
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

/// Managed variables need unified memory, which this executor does not have: the
/// runtime asks only for those a program declares `__managed__`.
#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryGetManaged(
    _dptr: *mut CUdeviceptr,
    _bytes: *mut usize,
    library: Handle,
    _name: *const c_char,
) -> CUresult {
    with(|s| match module_of(s, library) {
        Some(_) => CUDA_ERROR_NOT_FOUND,
        None => CUDA_ERROR_INVALID_HANDLE,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(func: *mut Handle, kernel: Handle) -> CUresult {
    with(|s| {
        in_ctx(s, |s, _| {
            if !s.functions.contains_key(&(kernel as usize)) {
                return CUDA_ERROR_INVALID_HANDLE;
            }
            // SAFETY: as the API requires.
            unsafe { put(func, kernel) }
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: c_int,
    kernel: Handle,
    dev: CUdevice,
) -> CUresult {
    if dev != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    // SAFETY: same contract.
    unsafe { super::cuFuncGetAttribute(pi, attrib, kernel) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetAttribute(
    attrib: c_int,
    value: c_int,
    kernel: Handle,
    dev: CUdevice,
) -> CUresult {
    if dev != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    super::cuFuncSetAttribute(kernel, attrib, value)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetCacheConfig(kernel: Handle, config: c_int, dev: CUdevice) -> CUresult {
    if dev != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    super::cuFuncSetCacheConfig(kernel, config)
}

/// `CU_MODULE_LAZY_LOADING`, NVIDIA's default since CUDA 12.2.
const LAZY_LOADING: c_int = 2;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    // SAFETY: as the API requires.
    with(|_| unsafe { put(mode, LAZY_LOADING) })
}

/// The API version of contexts made by `cuCtxCreate_v2` and primary contexts.
const CONTEXT_API_VERSION: c_uint = 3020;

/// The context `ctx` names, or the current one for null.
fn context_or_current(s: &State, ctx: Handle) -> Result<usize, CUresult> {
    let c = if ctx.is_null() {
        current().ok_or(CUDA_ERROR_INVALID_CONTEXT)?
    } else {
        ctx as usize
    };
    if s.contexts.contains_key(&c) {
        Ok(c)
    } else {
        Err(CUDA_ERROR_INVALID_CONTEXT)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: Handle, version: *mut c_uint) -> CUresult {
    with(|s| match context_or_current(s, ctx) {
        // SAFETY: as the API requires.
        Ok(_) => unsafe { put(version, CONTEXT_API_VERSION) },
        Err(e) => e,
    })
}

/// CUDA 13.0's `cuCtxGetDevice`: of `ctx`, or of the current context for null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: Handle) -> CUresult {
    with(|s| match context_or_current(s, ctx) {
        // SAFETY: as the API requires.
        Ok(_) => unsafe { put(dev, 0) },
        Err(e) => e,
    })
}

/// CUDA 13.0's `cuCtxSynchronize`: of `ctx`, or of the current context for null.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(ctx: Handle) -> CUresult {
    with_output(|s, out| match context_or_current(s, ctx) {
        Ok(c) => {
            let sticky = s.contexts[&c].sticky;
            take_printf(s, c, out);
            sticky
        }
        Err(e) => e,
    })
}

/// Ends what the primary context holds; its handle stays valid and retained.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    with_output(|s, out| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if let Some((h, _)) = s.primary {
            take_printf(s, h, out);
            super::drop_context(s, h);
            s.contexts.insert(h, Context::new(true, 0));
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, _flags: c_uint) -> CUresult {
    with(|_| {
        if dev != 0 {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: same contract; the flags (portable, mapped, write-combined) change
    // nothing for memory this process reads and writes itself.
    unsafe { super::cuMemAllocHost_v2(pp, size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    blocks: *mut c_int,
    f: Handle,
    block_size: c_int,
    dynamic: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: same contract; the flag (disable caching override) changes nothing here.
    unsafe { super::cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, f, block_size, dynamic) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxGetId(ctx: Handle, id: *mut u64) -> CUresult {
    with(|s| match context_or_current(s, ctx) {
        // SAFETY: as the API requires.
        Ok(c) => unsafe { put(id, c as u64) },
        Err(e) => e,
    })
}

/// What the private tables ask of this driver (`hira_apis_cuda_private::export`).
struct Private;

impl hira_apis_cuda_private::export::Driver for Private {
    fn driver_version(&self) -> c_int {
        super::DRIVER_VERSION
    }

    /// The primary context, made (inactive: not retained) if it does not exist.
    fn primary_context(&self, dev: c_int) -> Result<Handle, CUresult> {
        if dev != 0 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        let mut h = 0;
        let st = with(|s| {
            h = match s.primary {
                Some((h, _)) => h,
                None => {
                    let n = s.handle();
                    s.contexts.insert(n, Context::new(true, 0));
                    s.primary = Some((n, 0));
                    n
                }
            };
            CUDA_SUCCESS
        });
        if st == CUDA_SUCCESS {
            Ok(h as Handle)
        } else {
            Err(st)
        }
    }

    fn current_context(&self) -> Handle {
        current().unwrap_or(0) as Handle
    }

    fn devices(&self) -> Result<Vec<hira_apis_cuda_private::export::Device>, CUresult> {
        let mut uuid = [0u8; 16];
        // SAFETY: an out-pointer of 16 bytes.
        match unsafe { super::cuDeviceGetUuid(&mut uuid, 0) } {
            CUDA_SUCCESS => {}
            e => return Err(e),
        }
        let attr = |a| super::attribute(a).unwrap_or(0);
        Ok(vec![hira_apis_cuda_private::export::Device {
            uuid,
            pci_domain: attr(50),
            pci_bus: attr(33),
            pci_device: attr(34),
        }])
    }

    fn load_module(&self, module: *mut Handle, image: *const c_void) -> CUresult {
        // SAFETY: the runtime's module out-pointer and image.
        unsafe { super::load_image(module, image) }
    }
}

static PRIVATE: Private = Private;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> CUresult {
    hira_apis_cuda_private::export::install(&PRIVATE);
    // SAFETY: the caller's out-pointer and 16-byte id.
    unsafe { hira_apis_cuda_private::export::get_export_table(table, id) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    kernel: Handle,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    // SAFETY: same contract; a kernel handle is its function's here.
    unsafe { super::cuFuncGetParamInfo(kernel, index, offset, size) }
}

/// `cuProfilerStart`/`Stop` with no profiler attached: success in a context.
#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStart() -> CUresult {
    with(|s| in_ctx(s, |_, _| CUDA_SUCCESS))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuProfilerStop() -> CUresult {
    with(|s| in_ctx(s, |_, _| CUDA_SUCCESS))
}

/// `cuLaunchKernelEx`: the launch its configuration describes. Of the attributes,
/// the hints (priority, synchronisation and scheduling preferences, programmatic
/// stream serialisation, which a device that runs each launch to its end before the
/// next satisfies) are taken and have no effect; a cooperative launch and clusters
/// are refused as on a device without them (compute capability 7.5, cooperative
/// launch not announced); the events of `PROGRAMMATIC_EVENT` and
/// `LAUNCH_COMPLETION_EVENT` are recorded when the kernel has run.
///
/// # Safety
///
/// `config` and the parameters are as `cuLaunchKernelEx` requires of its caller.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const launch::Config,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's configuration, as the API requires.
    let Some((c, attrs)) = (unsafe { launch::read(config) }) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let node = || {
        let [gx, gy, gz] = c.grid;
        // SAFETY: the caller's parameters, as the API requires.
        unsafe {
            hira_apis_cuda_private::graph::kernel_op(
                &crate::graphs::ISSUE,
                f,
                [gx, gy, gz],
                c.block,
                c.shared_mem_bytes,
                params,
                extra,
                attrs.clone(),
            )
        }
    };
    if let Some(st) = hira_apis_cuda_private::graph::capture(c.stream, node) {
        return st;
    }
    let mut events = Vec::new();
    for a in &attrs {
        match launch::value_of(a.id) {
            launch::Value::Data => {}
            launch::Value::Event => events.push(a.event() as usize as Handle),
            launch::Value::GraphNode => return CUDA_ERROR_NOT_SUPPORTED,
            launch::Value::Unknown => return CUDA_ERROR_INVALID_VALUE,
        }
        let unsupported = match a.id {
            launch::COOPERATIVE => a.int() != 0,
            launch::CLUSTER_DIMENSION | launch::PREFERRED_CLUSTER_DIMENSION => {
                a.dims().iter().any(|&d| d > 1)
            }
            _ => false,
        };
        if unsupported {
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    // SAFETY: the caller's parameters, as the API requires.
    let st = unsafe {
        super::cuLaunchKernel(
            f,
            c.grid[0],
            c.grid[1],
            c.grid[2],
            c.block[0],
            c.block[1],
            c.block[2],
            c.shared_mem_bytes,
            c.stream,
            params,
            extra,
        )
    };
    if st != CUDA_SUCCESS {
        return st;
    }
    for ev in events {
        let r = super::cuEventRecord(ev, c.stream);
        if r != CUDA_SUCCESS {
            return r;
        }
    }
    CUDA_SUCCESS
}

/// Runs `write` if `stream` is one the current context may use (the stream-capture
/// queries, host functions).
fn capture_query(stream: Handle, write: impl FnOnce() -> CUresult) -> CUresult {
    let known = super::with_ctx(|s, _| {
        if super::stream_ok(s, stream) {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_HANDLE
        }
    });
    if known != CUDA_SUCCESS {
        return known;
    }
    write()
}

/// The value of pointer attribute `attr` for `ptr` (device memory of an allocation
/// at `base` of `len` bytes, in context `ctx`), or for a pointer this driver did not
/// allocate (`None`: every value 0, as `cuPointerGetAttributes` reports one).
fn pointer_value(attr: c_int, ptr: u64, alloc: Option<(u64, usize)>, ctx: usize) -> [u8; 16] {
    let mut v = [0u8; 16];
    let Some((base, len)) = alloc else {
        return v;
    };
    let x: u64 = match attr {
        1 => ctx as u64,
        2 => 2, // CU_MEMORYTYPE_DEVICE
        3 => ptr,
        7 | 11 | 19 | 20 => base,
        12 | 18 => len as u64,
        13 => 1,
        16 => 3, // CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
        _ => 0,
    };
    v[..8].copy_from_slice(&x.to_le_bytes());
    v
}

/// `cuPointerGetAttributes`: device memory this driver allocated is described; any
/// other pointer gets 0 for every attribute, with success. Host memory from
/// `cuMemHostAlloc` is not registered here (it is ordinary memory of the process,
/// as in Hira's guest), so it is reported as unregistered too.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const c_int,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    use hira_apis_cuda_private::pointer;
    if n == 0 || attrs.is_null() || data.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    super::with_ctx(|s, ctx| {
        let alloc = s
            .mem
            .find(ptr, 0)
            .map(|(base, _)| (base, s.mem.allocs[&base].len()));
        for i in 0..n as usize {
            // SAFETY: `n` attributes and as many value pointers, as the API requires.
            let (attr, out) = unsafe { (*attrs.add(i), *data.add(i)) };
            let Some(size) = pointer::value_size(attr) else {
                return CUDA_ERROR_INVALID_VALUE;
            };
            if attr == pointer::P2P_TOKENS {
                return CUDA_ERROR_NOT_SUPPORTED;
            }
            if out.is_null() {
                return CUDA_ERROR_INVALID_VALUE;
            }
            let v = pointer_value(attr, ptr, alloc, ctx);
            // SAFETY: the value pointer holds the attribute's type, as the API
            // requires.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out.cast::<u8>(), size) };
        }
        CUDA_SUCCESS
    })
}

/// `cuPointerGetAttribute`: as the plural for device memory this driver
/// allocated; any other pointer is refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    ptr: CUdeviceptr,
) -> CUresult {
    let known = super::with_ctx(|s, _| {
        if s.mem.find(ptr, 0).is_some() {
            CUDA_SUCCESS
        } else {
            CUDA_ERROR_INVALID_VALUE
        }
    });
    if known != CUDA_SUCCESS {
        return known;
    }
    let mut d = data;
    // SAFETY: one attribute and its value pointer.
    unsafe { cuPointerGetAttributes(1, &attr, &mut d, ptr) }
}

/// `cuLaunchHostFunc`: work runs when it is enqueued here, so the stream's work is
/// done: the function runs now, in the calling thread (outside the driver's lock).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc(
    stream: Handle,
    func: Option<unsafe extern "C" fn(*mut c_void)>,
    user_data: *mut c_void,
) -> CUresult {
    let Some(func) = func else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    if let Some(st) = hira_apis_cuda_private::graph::capture(stream, || {
        hira_apis_cuda_private::graph::host_op(func, user_data)
    }) {
        return st;
    }
    let st = capture_query(stream, || CUDA_SUCCESS);
    if st == CUDA_SUCCESS {
        // SAFETY: the caller's function and data, as the API requires.
        unsafe { func(user_data) };
    }
    st
}

/// `cuStreamAddCallback`: as `cuLaunchHostFunc`, the callback told the stream's
/// status.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamAddCallback(
    stream: Handle,
    callback: Option<unsafe extern "C" fn(Handle, CUresult, *mut c_void)>,
    user_data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    let Some(callback) = callback else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if let Some(st) = hira_apis_cuda_private::graph::capture_forbidden(stream) {
        return st;
    }
    let st = capture_query(stream, || CUDA_SUCCESS);
    if st != CUDA_SUCCESS {
        return st;
    }
    // SAFETY: the caller's callback and data, as the API requires.
    unsafe { callback(stream, CUDA_SUCCESS, user_data) };
    CUDA_SUCCESS
}
