//! Driver functions the guest answers itself: each thread's context stack, host
//! memory the driver would pin (ordinary memory of the guest: nothing on the host
//! can reach it), error names (asked of the host once each, kept for the process's
//! life as the API promises), `cuGetProcAddress`, and module loading with JIT
//! options.

#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::Mutex;

use hira_apis_cuda::status;
use hira_apis_cuda_private::copy2d;
use hira_apis_cuda_private::graph;

pub use crate::graphs::entries::*;
pub use crate::graphs::pools::*;

use crate::rt::{self, CUcontext, CUfunction, CUmodule, CUresult, CUstream};

pub use crate::private::{cuKernelGetFunction, cuLibraryLoadData};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    let id = ctx as usize as u64;
    if !rt::is_context(id) {
        return status::INVALID_CONTEXT;
    }
    rt::push(id);
    status::SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    match rt::pop() {
        Some(id) => {
            if !pctx.is_null() {
                // SAFETY: not null; the application's pointer to a CUcontext.
                unsafe { pctx.write(id as usize as CUcontext) };
            }
            status::SUCCESS
        }
        None => status::INVALID_CONTEXT,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    let id = ctx as usize as u64;
    if id != 0 && !rt::is_context(id) {
        return status::INVALID_CONTEXT;
    }
    rt::set_current(id);
    status::SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    if pctx.is_null() {
        return status::INVALID_VALUE;
    }
    // SAFETY: not null; the application's pointer to a CUcontext.
    unsafe { pctx.write(rt::current() as usize as CUcontext) };
    status::SUCCESS
}

/// `CU_JIT_INFO_LOG_BUFFER`, `_SIZE_BYTES`, `CU_JIT_ERROR_LOG_BUFFER`, `_SIZE_BYTES`.
const JIT_INFO_LOG_BUFFER: c_int = 3;
const JIT_INFO_LOG_BUFFER_SIZE_BYTES: c_int = 4;
const JIT_ERROR_LOG_BUFFER: c_int = 5;
const JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;

/// Loads a module as `cuModuleLoadData` does. JIT options are not forwarded: the
/// log buffers come back empty with their used size 0, and options that steer
/// code generation are left to the host's defaults.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    num_options: c_uint,
    options: *mut c_int,
    option_values: *mut *mut c_void,
) -> CUresult {
    if num_options > 0 && (options.is_null() || option_values.is_null()) {
        return status::INVALID_VALUE;
    }
    for i in 0..num_options as usize {
        // SAFETY: `num_options` entries in each array, as the API requires.
        unsafe {
            match *options.add(i) {
                JIT_INFO_LOG_BUFFER | JIT_ERROR_LOG_BUFFER => {
                    let b = (*option_values.add(i)).cast::<c_char>();
                    if !b.is_null() {
                        *b = 0;
                    }
                }
                JIT_INFO_LOG_BUFFER_SIZE_BYTES | JIT_ERROR_LOG_BUFFER_SIZE_BYTES => {
                    *option_values.add(i) = std::ptr::null_mut();
                }
                _ => {}
            }
        }
    }
    // SAFETY: the same contract as cuModuleLoadData.
    unsafe { crate::generated::cuModuleLoadData(module, image) }
}

/// `CUDA_SUCCESS` if `stream` is one the application may name: a special handle or
/// one of its streams.
pub(crate) fn stream_known(stream: CUstream) -> CUresult {
    let id = stream as usize as u64;
    if !rt::initialized() {
        status::NOT_INITIALIZED
    } else if hira_apis_cuda::SPECIAL_STREAMS.contains(&id)
        || rt::context_of(hira_apis_cuda::Kind::Stream, id).is_some()
    {
        status::SUCCESS
    } else {
        status::INVALID_HANDLE
    }
}

/// `cuCtxCreate_v4` (`cuCtxCreate` of CUDA 13's `cuda.h`): an ordinary context is
/// `cuCtxCreate_v2`'s; execution affinity and CUDA-in-graphics are not built.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut crate::rt::CUcontext,
    params: *const hira_apis_cuda_private::context::CreateParams,
    flags: c_uint,
    dev: c_int,
) -> CUresult {
    // SAFETY: the program's pointer, null or valid as the API requires.
    if let Err(e) = unsafe { hira_apis_cuda_private::context::plain(params) } {
        return e;
    }
    // SAFETY: the program's out-pointer; the rest are values.
    unsafe { crate::generated::cuCtxCreate_v2(pctx, flags, dev) }
}

/// `cuEventRecordWithFlags`: `CU_EVENT_RECORD_EXTERNAL` makes an event-record node
/// while capturing, and is otherwise an ordinary record.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    event: crate::rt::CUevent,
    stream: CUstream,
    flags: c_uint,
) -> CUresult {
    if flags & !graph::EVENT_EXTERNAL != 0 {
        return status::INVALID_VALUE;
    }
    if let Some(st) = graph::capture_record(event, stream, flags & graph::EVENT_EXTERNAL != 0) {
        return st;
    }
    // SAFETY: handles, checked as every call's.
    unsafe { crate::generated::cuEventRecord(event, stream) }
}

/// `cuPointerGetAttributes`: the host's driver answers (the guest's own memory is
/// not the host's to describe: a pinned allocation of the guest is ordinary memory
/// there, reported as unregistered); each value is written at its size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attributes: *mut c_int,
    data: *mut *mut c_void,
    ptr: u64,
) -> CUresult {
    // SAFETY: the application's arrays, as the API requires.
    unsafe { pointer_attributes(n, attributes, data, ptr, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: u64,
) -> CUresult {
    let mut a = attribute;
    let mut d = data;
    // SAFETY: one attribute and its value pointer.
    unsafe { pointer_attributes(1, &mut a, &mut d, ptr, true) }
}

/// Both pointer queries: `single` is `cuPointerGetAttribute`, which refuses a
/// pointer its driver does not know where the plural answers zeros.
unsafe fn pointer_attributes(
    n: c_uint,
    attributes: *mut c_int,
    data: *mut *mut c_void,
    ptr: u64,
    single: bool,
) -> CUresult {
    use hira_apis_cuda_private::pointer;
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    let n = n as usize;
    if n == 0 || n > pointer::MAX_ATTRIBUTES || attributes.is_null() || data.is_null() {
        return status::INVALID_VALUE;
    }
    let mut ids = Vec::with_capacity(n * 4);
    let mut sizes = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `n` attributes and value pointers, as the API requires.
        let (a, d) = unsafe { (*attributes.add(i), *data.add(i)) };
        match pointer::value_size(a) {
            Some(size) if !d.is_null() => sizes.push(size),
            _ => return status::INVALID_VALUE,
        }
        ids.extend_from_slice(&a.to_le_bytes());
    }
    let mut values = vec![0u8; n * pointer::MAX_VALUE];
    // SAFETY: `ids` and `values` hold the lengths passed.
    let st = unsafe {
        crate::generated::hiraPointerGetAttributes(
            ids.as_ptr().cast(),
            ids.len(),
            values.as_mut_ptr().cast(),
            values.len(),
            ptr,
            c_int::from(single),
        )
    };
    if st != status::SUCCESS {
        return st;
    }
    for (i, size) in sizes.into_iter().enumerate() {
        // SAFETY: the value pointer holds the attribute's type, as the API requires.
        unsafe {
            std::ptr::copy_nonoverlapping(
                values[i * pointer::MAX_VALUE..].as_ptr(),
                (*data.add(i)).cast::<u8>(),
                size,
            );
        }
    }
    status::SUCCESS
}

/// `CUhostFn`.
type HostFn = unsafe extern "C" fn(*mut c_void);
/// `CUstreamCallback`.
type StreamCallback = unsafe extern "C" fn(CUstream, CUresult, *mut c_void);

/// `cuLaunchHostFunc`: once the stream's work is done (its synchronisation, on the
/// host), the function runs in the calling thread, so that nothing enqueued later on
/// the stream can start before it returns. The function is not run when the
/// stream's work failed, as the driver skips it after an error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc(
    stream: CUstream,
    func: Option<HostFn>,
    user_data: *mut c_void,
) -> CUresult {
    let Some(func) = func else {
        return status::INVALID_VALUE;
    };
    if let Some(st) = graph::capture(stream, || graph::host_op(func, user_data)) {
        return st;
    }
    let known = stream_known(stream);
    if known != status::SUCCESS {
        return known;
    }
    // SAFETY: a stream of the application.
    let st = unsafe { crate::generated::cuStreamSynchronize(stream) };
    if st == status::SUCCESS {
        // SAFETY: the application's function and data, as the API requires.
        unsafe { func(user_data) };
    }
    st
}

/// `cuStreamAddCallback`: as `cuLaunchHostFunc`, the callback told the status of
/// the stream's work (and called whatever it is).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamAddCallback(
    stream: CUstream,
    callback: Option<StreamCallback>,
    user_data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    let Some(callback) = callback else {
        return status::INVALID_VALUE;
    };
    if flags != 0 {
        return status::INVALID_VALUE;
    }
    if let Some(st) = graph::capture_forbidden(stream) {
        return st;
    }
    let known = stream_known(stream);
    if known != status::SUCCESS {
        return known;
    }
    // SAFETY: a stream of the application.
    let st = unsafe { crate::generated::cuStreamSynchronize(stream) };
    // SAFETY: the application's callback and data, as the API requires.
    unsafe { callback(stream, st, user_data) };
    status::SUCCESS
}

/// `cuLaunchKernelEx`: the configuration is read here (the host cannot read the
/// application's memory) and the launch goes with its attributes as bytes, events as
/// the guest's ids, which the API server looks up as it does every handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const c_void,
    f: CUfunction,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    use hira_apis_cuda_private::launch;
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    // SAFETY: the application's configuration, as the API requires.
    let Some((c, attrs)) = (unsafe { launch::read(config.cast()) }) else {
        return status::INVALID_VALUE;
    };
    let node = || {
        // SAFETY: the application's parameters, as the API requires.
        unsafe {
            graph::kernel_op(
                &crate::graphs::ISSUE,
                f,
                c.grid,
                c.block,
                c.shared_mem_bytes,
                kernel_params,
                extra,
                attrs.clone(),
            )
        }
    };
    if let Some(st) = graph::capture(c.stream, node) {
        return st;
    }
    let bytes: Vec<u8> = attrs.iter().flat_map(|a| a.to_bytes()).collect();
    let at = if bytes.is_empty() {
        std::ptr::null()
    } else {
        bytes.as_ptr().cast()
    };
    // SAFETY: the application's parameters, as the API requires; `at` holds
    // `bytes.len()` bytes.
    unsafe {
        crate::generated::hiraLaunchKernelEx(
            f,
            c.grid[0],
            c.grid[1],
            c.grid[2],
            c.block[0],
            c.block[1],
            c.block[2],
            c.shared_mem_bytes,
            c.stream,
            at,
            bytes.len(),
            kernel_params,
            extra,
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuMemHostAlloc(pp, bytesize, 0) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytesize: usize,
    _flags: c_uint,
) -> CUresult {
    if rt::current() == 0 {
        return status::INVALID_CONTEXT;
    }
    if pp.is_null() || bytesize == 0 {
        return status::INVALID_VALUE;
    }
    // SAFETY: a plain allocation, page-aligned as the driver's are; freed by
    // cuMemFreeHost.
    let p = unsafe { libc::aligned_alloc(4096, bytesize.div_ceil(4096) * 4096) };
    if p.is_null() {
        return status::OUT_OF_MEMORY;
    }
    // SAFETY: not null; the application's pointer.
    unsafe { pp.write(p) };
    status::SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    // SAFETY: `p` came from cuMemHostAlloc, as the API requires.
    unsafe { libc::free(p) };
    status::SUCCESS
}

/// Texts of errors asked for, by (code, which): kept for the process's life.
type Texts = HashMap<(c_int, c_int), Option<&'static CStr>>;
static TEXTS: Mutex<Option<Texts>> = Mutex::new(None);

fn error_text(error: c_int, which: c_int, out: *mut *const c_char) -> CUresult {
    if out.is_null() {
        return status::INVALID_VALUE;
    }
    let mut texts = TEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let map = texts.get_or_insert_with(HashMap::new);
    let text = match map.get(&(error, which)) {
        Some(t) => *t,
        None => {
            let mut buf = [0 as c_char; 256];
            // SAFETY: a buffer of the 256 bytes the call's description names.
            let s = unsafe { crate::generated::hiraErrorText(error, which, buf.as_mut_ptr()) };
            if s != status::SUCCESS && s != status::INVALID_VALUE {
                return s;
            }
            let t = (s == status::SUCCESS).then(|| {
                // SAFETY: the host's text, NUL-terminated within the buffer.
                let c = unsafe { CStr::from_ptr(buf.as_ptr()) };
                &*Box::leak(CString::from(c).into_boxed_c_str())
            });
            map.insert((error, which), t);
            t
        }
    };
    // SAFETY: checked not null.
    unsafe { out.write(text.map_or(std::ptr::null(), CStr::as_ptr)) };
    if text.is_some() {
        status::SUCCESS
    } else {
        status::INVALID_VALUE
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: c_int, p_str: *mut *const c_char) -> CUresult {
    rt::call("cuGetErrorName", || Ok(error_text(error, 0, p_str)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: c_int, p_str: *mut *const c_char) -> CUresult {
    rt::call("cuGetErrorString", || Ok(error_text(error, 1, p_str)))
}

/// `CU_GET_PROC_ADDRESS_SUCCESS`, `_SYMBOL_NOT_FOUND`.
const PROC_FOUND: c_int = 0;
const PROC_NOT_FOUND: c_int = 1;

/// The entry point `symbol` names (without a version suffix): this library's own
/// function, whatever version the caller asks for; what Hira does not remote is not
/// found, as a driver too old for it would answer.
/// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
const PROC_VERSION_NOT_SUFFICIENT: c_int = 2;

/// Resolves `symbol` at `cuda_version` to the variant a program built for that
/// version expects (`hira_apis_cuda_private::procs`, checked against NVIDIA's driver),
/// as NVIDIA's driver does: an entry point Hira does not remote is found too, and
/// says `CUDA_ERROR_NOT_SUPPORTED` when called. Hira has no per-thread default
/// stream: a per-thread variant is its legacy one, whose default stream orders
/// work at least as strictly.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    symbol_status: *mut c_int,
) -> CUresult {
    use hira_apis_cuda_private::procs::{Lookup, lookup};
    if symbol.is_null() || pfn.is_null() {
        return status::INVALID_VALUE;
    }
    // SAFETY: a C string, as the API requires.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let (st, found) = match lookup(&name, cuda_version, flags) {
        Lookup::Found(sym) => {
            let base = sym.trim_end_matches("_ptsz").trim_end_matches("_ptds");
            match entry_point(base) {
                Some(f) => (PROC_FOUND, f),
                None => (PROC_NOT_FOUND, 0),
            }
        }
        Lookup::VersionNotSufficient => (PROC_VERSION_NOT_SUFFICIENT, 0),
        Lookup::NotFound => (PROC_NOT_FOUND, 0),
    };
    rt::init_logger();
    log::debug!("cuGetProcAddress({name}, version {cuda_version}, flags {flags}): {st}");
    // SAFETY: checked not null; `symbol_status` may be null.
    unsafe {
        pfn.write(found as *mut c_void);
        if !symbol_status.is_null() {
            symbol_status.write(st);
        }
    }
    // NVIDIA's driver 580 answers the runtime's probe with an empty name so.
    if st == PROC_FOUND || name.is_empty() {
        status::SUCCESS
    } else {
        status::NOT_FOUND
    }
}

/// This library's function exported as `symbol`.
fn entry_point(symbol: &str) -> Option<usize> {
    static TABLE: std::sync::OnceLock<HashMap<&'static str, usize>> = std::sync::OnceLock::new();
    TABLE
        .get_or_init(|| {
            let mut t: HashMap<&'static str, usize> = HashMap::new();
            t.extend(crate::generated::unsupported_entry_points());
            t.extend(crate::generated::entry_points());
            t.insert("cuGetProcAddress", cuGetProcAddress as *const () as usize);
            t.insert(
                "cuGetExportTable",
                crate::private::cuGetExportTable as *const () as usize,
            );
            t.insert(
                "cuProfilerStart",
                crate::private::cuProfilerStart as *const () as usize,
            );
            t.insert(
                "cuProfilerStop",
                crate::private::cuProfilerStop as *const () as usize,
            );
            // Older names of the same function (the same arguments; `_v2` changed
            // what the driver does, not what it takes).
            for (old, new) in [
                ("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"),
                ("cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2"),
                (
                    "cuDevicePrimaryCtxSetFlags",
                    "cuDevicePrimaryCtxSetFlags_v2",
                ),
            ] {
                if let Some(&f) = t.get(new) {
                    t.insert(old, f);
                }
            }
            t.insert(
                "cuGetProcAddress_v2",
                cuGetProcAddress_v2 as *const () as usize,
            );
            t
        })
        .get(symbol)
        .copied()
}

/// The first `cuGetProcAddress`, without the status out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

/// A copy between addresses of the unified address space: each side is device
/// memory if it lies in an allocation the application holds, else host memory of
/// this process, and the copy goes as the call for its direction (host to host: a
/// plain copy, as the driver makes it).
fn unified_copy(dst: u64, src: u64, n: usize, stream: Option<CUstream>) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    if n == 0 {
        return status::SUCCESS;
    }
    let (d, s) = (rt::is_device(dst, n as u64), rt::is_device(src, n as u64));
    let (host_dst, host_src) = (dst as usize as *mut c_void, src as usize as *const c_void);
    // SAFETY: the application passes `n` valid bytes at each side, as the API
    // requires; device sides are forwarded as addresses.
    unsafe {
        match (d, s, stream) {
            (true, true, None) => crate::generated::cuMemcpyDtoD_v2(dst, src, n),
            (true, true, Some(h)) => crate::generated::cuMemcpyDtoDAsync_v2(dst, src, n, h),
            (true, false, None) => crate::generated::cuMemcpyHtoD_v2(dst, host_src, n),
            (true, false, Some(h)) => crate::generated::cuMemcpyHtoDAsync_v2(dst, host_src, n, h),
            (false, true, None) => crate::generated::cuMemcpyDtoH_v2(host_dst, src, n),
            (false, true, Some(h)) => crate::generated::cuMemcpyDtoHAsync_v2(host_dst, src, n, h),
            (false, false, _) => {
                if host_dst.is_null() || host_src.is_null() {
                    return status::INVALID_VALUE;
                }
                std::ptr::copy(host_src.cast::<u8>(), host_dst.cast::<u8>(), n);
                status::SUCCESS
            }
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy(dst: u64, src: u64, byte_count: usize) -> CUresult {
    unified_copy(dst, src, byte_count, None)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: u64,
    src: u64,
    byte_count: usize,
    h_stream: CUstream,
) -> CUresult {
    let copy = || graph::linear_copy_op(dst, copy2d::UNIFIED, src, copy2d::UNIFIED, byte_count);
    if let Some(st) = graph::capture(h_stream, copy) {
        return st;
    }
    unified_copy(dst, src, byte_count, Some(h_stream))
}

/// A 2D or 3D copy (`cuMemcpy2D`, `cuMemcpy3D`), made of the copies Hira remotes:
/// row by row to device memory (one copy where the rows are contiguous, as each row
/// may lie between bytes the copy must not touch), and from device memory one copy
/// of the rows' whole span (bytes between rows are read, never written) scattered
/// into the destination's rows. Every device row is checked against the allocations
/// the guest knows first, so a copy the driver would refuse fails before any row is
/// copied.
///
/// # Safety
/// The host sides are valid for the rows they name, as the API requires.
unsafe fn copy_rows(
    sides: Result<(copy2d::Side, copy2d::Side), copy2d::Refused>,
    (w, h, d): (usize, usize, usize),
    stream: Option<CUstream>,
) -> CUresult {
    use copy2d::Refused;
    if w == 0 || h == 0 || d == 0 {
        return status::SUCCESS;
    }
    let (src, dst) = match sides {
        Ok(s) => s,
        // Copies with an array side went to `array_copy`.
        Err(Refused::Array) => return status::INVALID_VALUE,
        Err(Refused::Invalid) => return status::INVALID_VALUE,
    };
    let (Some(src_span), Some(dst_span)) = (src.span(w, h, d), dst.span(w, h, d)) else {
        return status::INVALID_VALUE;
    };
    if (src.device && !rt::is_device(src.at, src_span))
        || (dst.device && !rt::is_device(dst.at, dst_span))
    {
        return status::INVALID_VALUE;
    }
    let contiguous = src.contiguous(w, h) && dst.contiguous(w, h);
    let (rows, n) = if contiguous {
        (1, w * h * d)
    } else {
        (h * d, w)
    };
    // SAFETY: each row lies in memory the application described (checked above for
    // device memory; the API's promise for host memory).
    unsafe {
        match (dst.device, src.device) {
            (true, _) => {
                for k in 0..rows {
                    let (to, from) = (dst.row(k, h), src.row(k, h));
                    let host_from = from as usize as *const c_void;
                    let st = match (src.device, stream) {
                        (false, None) => crate::generated::cuMemcpyHtoD_v2(to, host_from, n),
                        (false, Some(hs)) => {
                            crate::generated::cuMemcpyHtoDAsync_v2(to, host_from, n, hs)
                        }
                        (true, None) => crate::generated::cuMemcpyDtoD_v2(to, from, n),
                        (true, Some(hs)) => crate::generated::cuMemcpyDtoDAsync_v2(to, from, n, hs),
                    };
                    if st != status::SUCCESS {
                        return st;
                    }
                }
                status::SUCCESS
            }
            (false, true) => {
                let mut span = vec![0u8; src_span as usize];
                let into = span.as_mut_ptr().cast::<c_void>();
                let st = match stream {
                    None => crate::generated::cuMemcpyDtoH_v2(into, src.at, span.len()),
                    Some(hs) => {
                        crate::generated::cuMemcpyDtoHAsync_v2(into, src.at, span.len(), hs)
                    }
                };
                if st != status::SUCCESS {
                    return st;
                }
                for k in 0..h * d {
                    let off = (src.row(k, h) - src.at) as usize;
                    std::ptr::copy_nonoverlapping(
                        span.as_ptr().add(off),
                        dst.row(k, h) as usize as *mut u8,
                        w,
                    );
                }
                status::SUCCESS
            }
            (false, false) => {
                if let Some(hs) = stream {
                    // Ordered after the stream's work, as the driver orders it.
                    let st = crate::generated::cuStreamSynchronize(hs);
                    if st != status::SUCCESS {
                        return st;
                    }
                }
                for k in 0..h * d {
                    std::ptr::copy(
                        src.row(k, h) as usize as *const u8,
                        dst.row(k, h) as usize as *mut u8,
                        w,
                    );
                }
                status::SUCCESS
            }
        }
    }
}

/// A 2D or 3D copy with a CUDA array on one side or both, made by the host's driver:
/// a host side's rows go packed in pieces of whole rows (each piece one call, within
/// what a call carries), device and array sides as they are. Unified addresses are
/// told apart here, as the host must never take a guest's address for one of its own.
/// Asynchronous copies wait for their stream first and are done on return.
///
/// # Safety
/// A host side is valid for the rows it names, as the API requires.
unsafe fn array_copy(mut c: copy2d::Memcpy3D, stream: Option<CUstream>) -> CUresult {
    use copy2d::{DEVICE, HOST, UNIFIED};
    let (w, h, d) = (c.width_in_bytes, c.height, c.depth);
    if w == 0 || h == 0 || d == 0 {
        return status::SUCCESS;
    }
    for (ty, dev) in [
        (&mut c.src_memory_type, c.src_device),
        (&mut c.dst_memory_type, c.dst_device),
    ] {
        if *ty == UNIFIED {
            *ty = if rt::is_device(dev, 1) { DEVICE } else { HOST };
        }
    }
    if c.src_memory_type == UNIFIED || c.dst_memory_type == UNIFIED {
        return status::INVALID_VALUE;
    }
    if let Some(hs) = stream {
        // SAFETY: a stream handle the application passed.
        let st = unsafe { crate::generated::cuStreamSynchronize(hs) };
        if st != status::SUCCESS {
            return st;
        }
    }
    let src_host = c.src_memory_type == HOST;
    let dst_host = c.dst_memory_type == HOST;
    if !src_host && !dst_host {
        // SAFETY: a description of 200 bytes and no data.
        return unsafe {
            crate::generated::hiraMemcpy3DIn((&raw const c).cast(), std::ptr::null(), 0)
        };
    }
    let piece = match rt::window_chunk() {
        0 => rt::MAX_BYTES,
        n => n.min(rt::MAX_BYTES),
    };
    let rows_per_piece = (piece / w).max(1);
    // The host side: where its rows start, its pitch and rows per slice.
    let base = if src_host {
        c.src_host as u64
    } else {
        c.dst_host as u64
    };
    let copy2d::Position {
        x,
        y,
        z,
        pitch,
        rows,
    } = c.position(src_host);
    if base == 0 || (h > 1 && pitch < w) || (d > 1 && rows < h) {
        return status::INVALID_VALUE;
    }
    let row_at = |slice: usize, row: usize| -> Option<u64> {
        let off = (z.checked_add(slice)?)
            .checked_mul(pitch.checked_mul(rows)?)?
            .checked_add((y.checked_add(row)?).checked_mul(pitch)?)?
            .checked_add(x)?;
        base.checked_add(off as u64)
    };
    let mut buf = Vec::new();
    for slice in 0..d {
        let mut row = 0;
        while row < h {
            let n = rows_per_piece.min(h - row);
            let mut one = c;
            one.height = n;
            one.depth = 1;
            if src_host {
                (one.src_host, one.src_x_in_bytes, one.src_y, one.src_z) =
                    (std::ptr::null(), 0, 0, 0);
                (one.src_pitch, one.src_height) = (w, n);
                one.dst_y = c.dst_y + row;
                one.dst_z = c.dst_z + slice;
            } else {
                (one.dst_host, one.dst_x_in_bytes, one.dst_y, one.dst_z) =
                    (std::ptr::null_mut(), 0, 0, 0);
                (one.dst_pitch, one.dst_height) = (w, n);
                one.src_y = c.src_y + row;
                one.src_z = c.src_z + slice;
            }
            buf.clear();
            buf.resize(w * n, 0);
            let mut starts = Vec::with_capacity(n);
            for k in 0..n {
                match row_at(slice, row + k) {
                    Some(p) => starts.push(p),
                    None => return status::INVALID_VALUE,
                }
            }
            let st = if src_host {
                for (k, p) in starts.iter().enumerate() {
                    // SAFETY: a host row the application described.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            *p as usize as *const u8,
                            buf.as_mut_ptr().add(k * w),
                            w,
                        );
                    }
                }
                // SAFETY: the piece's description and its packed rows.
                unsafe {
                    crate::generated::hiraMemcpy3DIn(
                        (&raw const one).cast(),
                        buf.as_ptr().cast(),
                        buf.len(),
                    )
                }
            } else {
                // SAFETY: the piece's description and room for its packed rows.
                let st = unsafe {
                    crate::generated::hiraMemcpy3DOut(
                        (&raw const one).cast(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                };
                if st == status::SUCCESS {
                    for (k, p) in starts.iter().enumerate() {
                        // SAFETY: a host row the application described.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                buf.as_ptr().add(k * w),
                                *p as usize as *mut u8,
                                w,
                            );
                        }
                    }
                }
                st
            };
            if st != status::SUCCESS {
                return st;
            }
            row += n;
        }
    }
    status::SUCCESS
}

/// A 2D or 3D copy (a 2D one is one slice deep).
///
/// # Safety
/// The host sides are valid for the rows they name, as the API requires.
unsafe fn copy_3d(c: copy2d::Memcpy3D, stream: Option<CUstream>) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    if c.src_memory_type == copy2d::ARRAY || c.dst_memory_type == copy2d::ARRAY {
        if c.src_lod != 0 || c.dst_lod != 0 {
            return status::INVALID_VALUE;
        }
        // SAFETY: the caller's promise.
        return unsafe { array_copy(c, stream) };
    }
    let sides = c.sides(|p| rt::is_device(p, 1));
    let size = (c.width_in_bytes, c.height, c.depth);
    // SAFETY: the caller's promise.
    unsafe { copy_rows(sides, size, stream) }
}

/// # Safety
/// `copy` points to a `CUDA_MEMCPY2D` whose host sides are valid, as the API requires.
unsafe fn copy_2d(copy: *const c_void, stream: Option<CUstream>) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    if copy.is_null() {
        return status::INVALID_VALUE;
    }
    // SAFETY: the caller's description, 128 bytes; its host sides the caller's promise.
    unsafe {
        let c = copy.cast::<copy2d::Memcpy2D>().read_unaligned();
        copy_3d(copy2d::Memcpy3D::from(&c), stream)
    }
}

/// # Safety
/// `copy` points to a `CUDA_MEMCPY3D` whose host sides are valid, as the API requires.
unsafe fn copy_3d_at(copy: *const c_void, stream: Option<CUstream>) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    if copy.is_null() {
        return status::INVALID_VALUE;
    }
    // SAFETY: the caller's description, 200 bytes; its host sides the caller's promise.
    unsafe { copy_3d(copy.cast::<copy2d::Memcpy3D>().read_unaligned(), stream) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3D_v2(copy: *const c_void) -> CUresult {
    // SAFETY: the caller's promise.
    unsafe { copy_3d_at(copy, None) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(copy: *const c_void, h_stream: CUstream) -> CUresult {
    if !copy.is_null() {
        // SAFETY: the application's description, as the API requires.
        let c = unsafe { copy.cast::<copy2d::Memcpy3D>().read_unaligned() };
        if let Some(st) = graph::capture(h_stream, || graph::copy_op(c)) {
            return st;
        }
    }
    // SAFETY: the caller's promise.
    unsafe { copy_3d_at(copy, Some(h_stream)) }
}

/// Copies of bytes in a row with an array side (the driver's `HtoA` family): made as
/// the one-row 3D copies they are, which `array_copy` carries (a host side packed
/// in the call, device and array sides as they are).
mod linear {
    use std::ffi::c_void;

    use hira_apis_cuda_private::copy2d::{Linear, Memcpy3D};

    use super::copy_3d;
    use crate::rt::{CUarray, CUresult, CUstream};

    /// # Safety
    /// `src` is valid for `n` bytes, as the API requires.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn cuMemcpyHtoA_v2(
        dst: CUarray,
        at: usize,
        src: *const c_void,
        n: usize,
    ) -> CUresult {
        let c = Memcpy3D::linear(Linear::Array(dst, at), Linear::Host(src.cast_mut()), n);
        // SAFETY: the caller's promise.
        unsafe { copy_3d(c, None) }
    }

    /// # Safety
    /// `dst` is valid for `n` bytes, as the API requires.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn cuMemcpyAtoH_v2(
        dst: *mut c_void,
        src: CUarray,
        at: usize,
        n: usize,
    ) -> CUresult {
        let c = Memcpy3D::linear(Linear::Host(dst), Linear::Array(src, at), n);
        // SAFETY: the caller's promise.
        unsafe { copy_3d(c, None) }
    }

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyDtoA_v2(dst: CUarray, at: usize, src: u64, n: usize) -> CUresult {
        let c = Memcpy3D::linear(Linear::Array(dst, at), Linear::Device(src), n);
        // SAFETY: no host side.
        unsafe { copy_3d(c, None) }
    }

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyAtoD_v2(dst: u64, src: CUarray, at: usize, n: usize) -> CUresult {
        let c = Memcpy3D::linear(Linear::Device(dst), Linear::Array(src, at), n);
        // SAFETY: no host side.
        unsafe { copy_3d(c, None) }
    }

    #[unsafe(no_mangle)]
    pub extern "C" fn cuMemcpyAtoA_v2(
        dst: CUarray,
        dst_at: usize,
        src: CUarray,
        src_at: usize,
        n: usize,
    ) -> CUresult {
        let c = Memcpy3D::linear(Linear::Array(dst, dst_at), Linear::Array(src, src_at), n);
        // SAFETY: no host side.
        unsafe { copy_3d(c, None) }
    }

    /// Waits for the stream first, and is done on return (as `array_copy`).
    ///
    /// # Safety
    /// `src` is valid for `n` bytes, as the API requires.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn cuMemcpyHtoAAsync_v2(
        dst: CUarray,
        at: usize,
        src: *const c_void,
        n: usize,
        stream: CUstream,
    ) -> CUresult {
        let c = Memcpy3D::linear(Linear::Array(dst, at), Linear::Host(src.cast_mut()), n);
        let op = || hira_apis_cuda_private::graph::copy_op(c);
        if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
            return st;
        }
        // SAFETY: the caller's promise.
        unsafe { copy_3d(c, Some(stream)) }
    }

    /// # Safety
    /// `dst` is valid for `n` bytes, as the API requires.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn cuMemcpyAtoHAsync_v2(
        dst: *mut c_void,
        src: CUarray,
        at: usize,
        n: usize,
        stream: CUstream,
    ) -> CUresult {
        let c = Memcpy3D::linear(Linear::Host(dst), Linear::Array(src, at), n);
        let op = || hira_apis_cuda_private::graph::copy_op(c);
        if let Some(st) = hira_apis_cuda_private::graph::capture(stream, op) {
            return st;
        }
        // SAFETY: the caller's promise.
        unsafe { copy_3d(c, Some(stream)) }
    }
}
pub use linear::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2D_v2(copy: *const c_void) -> CUresult {
    // SAFETY: the caller's promise.
    unsafe { copy_2d(copy, None) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(copy: *const c_void) -> CUresult {
    // SAFETY: the caller's promise.
    unsafe { copy_2d(copy, None) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(copy: *const c_void, h_stream: CUstream) -> CUresult {
    if !copy.is_null() {
        // SAFETY: the application's description, as the API requires.
        let c2 = unsafe { copy.cast::<copy2d::Memcpy2D>().read_unaligned() };
        let c = copy2d::Memcpy3D::from(&c2);
        if let Some(st) = graph::capture(h_stream, || graph::copy_op(c)) {
            return st;
        }
    }
    // SAFETY: the caller's promise.
    unsafe { copy_2d(copy, Some(h_stream)) }
}

/// A 2D memset (`width` elements of `size` bytes in each of `height` rows `pitch`
/// bytes apart), made of one memset per row (one in all where the rows are
/// contiguous), checked against the guest's allocations first.
fn memset_2d(
    dst: u64,
    pitch: usize,
    width: usize,
    height: usize,
    size: usize,
    row: impl Fn(u64, usize) -> CUresult,
) -> CUresult {
    if !rt::initialized() {
        return status::NOT_INITIALIZED;
    }
    if width == 0 || height == 0 {
        return status::SUCCESS;
    }
    let Some(bytes) = width.checked_mul(size) else {
        return status::INVALID_VALUE;
    };
    let span = (height - 1)
        .checked_mul(pitch)
        .and_then(|s| s.checked_add(bytes));
    match span {
        Some(span) if (height == 1 || pitch >= bytes) && rt::is_device(dst, span as u64) => {}
        _ => return status::INVALID_VALUE,
    }
    if pitch == bytes {
        return row(dst, width * height);
    }
    for r in 0..height {
        let st = row(dst + (r * pitch) as u64, width);
        if st != status::SUCCESS {
            return st;
        }
    }
    status::SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D8_v2(dst: u64, pitch: usize, v: u8, w: usize, h: usize) -> CUresult {
    // SAFETY: each row checked to lie in an allocation of the guest's.
    memset_2d(dst, pitch, w, h, 1, |p, n| unsafe {
        crate::generated::cuMemsetD8_v2(p, v, n)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D16_v2(dst: u64, pitch: usize, v: u16, w: usize, h: usize) -> CUresult {
    // SAFETY: each row checked to lie in an allocation of the guest's.
    memset_2d(dst, pitch, w, h, 2, |p, n| unsafe {
        crate::generated::cuMemsetD16_v2(p, v, n)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD2D32_v2(
    dst: u64,
    pitch: usize,
    v: c_uint,
    w: usize,
    h: usize,
) -> CUresult {
    // SAFETY: each row checked to lie in an allocation of the guest's.
    memset_2d(dst, pitch, w, h, 4, |p, n| unsafe {
        crate::generated::cuMemsetD32_v2(p, v, n)
    })
}

/// # Safety
/// `stream` is a stream of the application's, or NULL, as the API requires.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD2D8Async(
    dst: u64,
    pitch: usize,
    v: u8,
    w: usize,
    h: usize,
    stream: CUstream,
) -> CUresult {
    if let Some(st) = graph::capture(stream, || graph::memset_op(dst, pitch, v.into(), 1, w, h)) {
        return st;
    }
    // SAFETY: each row checked to lie in an allocation of the guest's.
    memset_2d(dst, pitch, w, h, 1, |p, n| unsafe {
        crate::generated::cuMemsetD8Async(p, v, n, stream)
    })
}

/// # Safety
/// `stream` is a stream of the application's, or NULL, as the API requires.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD2D16Async(
    dst: u64,
    pitch: usize,
    v: u16,
    w: usize,
    h: usize,
    stream: CUstream,
) -> CUresult {
    if let Some(st) = graph::capture(stream, || graph::memset_op(dst, pitch, v.into(), 2, w, h)) {
        return st;
    }
    // SAFETY: each row checked to lie in an allocation of the guest's.
    memset_2d(dst, pitch, w, h, 2, |p, n| unsafe {
        crate::generated::cuMemsetD16Async(p, v, n, stream)
    })
}

/// # Safety
/// `stream` is a stream of the application's, or NULL, as the API requires.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD2D32Async(
    dst: u64,
    pitch: usize,
    v: c_uint,
    w: usize,
    h: usize,
    stream: CUstream,
) -> CUresult {
    if let Some(st) = graph::capture(stream, || graph::memset_op(dst, pitch, v, 4, w, h)) {
        return st;
    }
    // SAFETY: each row checked to lie in an allocation of the guest's.
    memset_2d(dst, pitch, w, h, 4, |p, n| unsafe {
        crate::generated::cuMemsetD32Async(p, v, n, stream)
    })
}

/// What an entry point Hira does not remote returns; the first call of each is
/// logged.
pub fn unsupported(name: &'static str) -> CUresult {
    static SEEN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&name) {
        seen.push(name);
        log::warn!("{name} is not supported by Hira: CUDA_ERROR_NOT_SUPPORTED");
    }
    status::NOT_SUPPORTED
}

#[cfg(test)]
mod coverage {
    /// `docs/cuda-coverage.md` is what the description and the driver's entry points
    /// say.
    #[test]
    fn the_coverage_table_is_up_to_date() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let api = hira_apigen::Api::load(&format!("{root}/protocol/api/cuda.api")).unwrap();
        let list = std::fs::read_to_string(format!("{root}/cuda/driver-api.txt")).unwrap();
        let table = hira_apigen::cuda::coverage(
            &api.funcs,
            &list,
            &["cuGetProcAddress", "cuGetExportTable"],
        );
        let path = format!("{root}/docs/cuda-coverage.md");
        if std::env::var_os("HIRA_WRITE_COVERAGE").is_some() {
            std::fs::write(&path, &table).unwrap();
        }
        let doc = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            doc == table,
            "docs/cuda-coverage.md is stale: run HIRA_WRITE_COVERAGE=1 cargo test -p hira-cuda coverage"
        );
    }
}
