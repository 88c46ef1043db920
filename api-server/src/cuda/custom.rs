//! CUDA calls that need more than one host call. Each decodes exactly what the
//! generated guest function sends (`protocol/api/cuda.api`).

#![allow(non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};

use hira_apis_cuda::{Kind, status};
use hira_apis_cuda_private::launch;
use hira_protocol::{Reader, Writer};

use super::{Bytes, Session};
use crate::backend::{Fail, FrameData};

pub(crate) use super::arrays::{
    cuArray3DCreate_v2, cuArrayCreate_v2, cuArrayDestroy, cuSurfObjectCreate, cuSurfObjectDestroy,
    cuSurfObjectGetResourceDesc, cuTexObjectCreate, cuTexObjectDestroy, cuTexObjectGetResourceDesc,
    hiraMemcpy3DIn, hiraMemcpy3DOut,
};

fn unsupported() -> Fail {
    Fail::Status(status::NOT_SUPPORTED)
}

/// Where the driver writes an out-value: `v`, or NULL as the guest passed.
fn out_ptr<T>(wanted: bool, v: &mut T) -> *mut T {
    if wanted { v } else { std::ptr::null_mut() }
}

fn new_id(r: &mut Reader<'_>) -> Result<Option<u64>, Fail> {
    Ok(if r.u8()? != 0 { Some(r.u64()?) } else { None })
}

/// Creates a context. The host makes it current on this thread; the guest keeps
/// it current on its own, so it is popped here and made current per call.
pub(crate) fn cuCtxCreate_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let id = new_id(r)?;
    let flags = r.u32()?;
    let dev = r.i32()?;
    r.finish()?;
    let f = s.driver.cuCtxCreate_v2.ok_or_else(unsupported)?;
    let pop = s.driver.cuCtxPopCurrent_v2.ok_or_else(unsupported)?;
    if let Some(id) = id {
        s.check_new(Kind::Context, id)?;
    }
    let mut h: *mut c_void = std::ptr::null_mut();
    let out = out_ptr(id.is_some(), &mut h);
    // SAFETY: an out-pointer to a handle, or NULL as the guest passed.
    let st = unsafe { f(out.cast(), flags, dev) };
    w.i32(st);
    if st == 0
        && let Some(id) = id
    {
        // SAFETY: pops what the call pushed on this thread.
        unsafe { pop(std::ptr::null_mut()) };
        s.bind(Kind::Context, id, h);
    }
    Ok(())
}

/// Device attributes that announce features Hira does not remote (managed and
/// mapped host memory, virtual memory management, IPC and shareable
/// handles, external semaphores, arrays, cooperative and cluster launches, graphics
/// interop): through Hira the device has none of them, so programs and libraries
/// that ask first take the paths Hira implements. Memory pools are announced as the
/// driver announces them: the guest serves them (`hira_apis_cuda_private::pool`).
const NOT_REMOTED: &[c_int] = &[
    19,  // CAN_MAP_HOST_MEMORY: cuMemHostGetDevicePointer
    83,  // MANAGED_MEMORY
    88,  // PAGEABLE_MEMORY_ACCESS: the device cannot reach the guest's memory
    89,  // CONCURRENT_MANAGED_ACCESS
    91,  // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    95,  // COOPERATIVE_LAUNCH
    96,  // COOPERATIVE_MULTI_DEVICE_LAUNCH
    99,  // HOST_REGISTER_SUPPORTED
    100, // PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
    101, // DIRECT_MANAGED_MEM_ACCESS_FROM_HOST
    102, // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    103, // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
    104, // HANDLE_TYPE_WIN32_HANDLE_SUPPORTED
    105, // HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED
    112, // SPARSE_CUDA_ARRAY_SUPPORTED
    113, // READ_ONLY_HOST_REGISTER_SUPPORTED
    114, // TIMELINE_SEMAPHORE_INTEROP_SUPPORTED
    116, // GPU_DIRECT_RDMA_SUPPORTED
    119, // MEMPOOL_SUPPORTED_HANDLE_TYPES
    120, // CLUSTER_LAUNCH: cuLaunchKernelEx
    121, // DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED
    124, // DMA_BUF_SUPPORTED
    125, // IPC_EVENT_SUPPORTED
    128, // HANDLE_TYPE_FABRIC_SUPPORTED
    132, // MULTICAST_SUPPORTED
    135, // D3D12_CIG_SUPPORTED
    138, // VULKAN_CIG_SUPPORTED
    141, // HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    142, // HOST_NUMA_MEMORY_POOLS_SUPPORTED
    143, // HOST_NUMA_MULTINODE_IPC_SUPPORTED
];

/// The driver's answer, except for features Hira does not remote (`NOT_REMOTED`),
/// which read 0. The driver still validates the attribute and the device.
pub(crate) fn cuDeviceGetAttribute<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let want = r.u8()? != 0;
    let attrib = r.i32()?;
    let dev = r.i32()?;
    r.finish()?;
    let f = s.driver.cuDeviceGetAttribute.ok_or_else(unsupported)?;
    let mut v: c_int = 0;
    let out = out_ptr(want, &mut v);
    // SAFETY: an out-pointer to an int, or NULL as the guest passed.
    let st = unsafe { f(out, attrib, dev) };
    w.i32(st);
    if st == 0 && want {
        w.i32(if NOT_REMOTED.contains(&attrib) { 0 } else { v });
    }
    Ok(())
}

pub(crate) fn cuDevicePrimaryCtxRetain<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let want = r.u8()? != 0;
    let dev = r.i32()?;
    r.finish()?;
    let f = s.driver.cuDevicePrimaryCtxRetain.ok_or_else(unsupported)?;
    let mut h: *mut c_void = std::ptr::null_mut();
    let out = out_ptr(want, &mut h);
    // SAFETY: an out-pointer to a handle, or NULL as the guest passed.
    let st = unsafe { f(out.cast(), dev) };
    w.i32(st);
    if st == 0 {
        let id = want.then(|| s.found(Kind::Context, h));
        s.retained_primary(dev, 1, id);
        if let Some(id) = id {
            w.u64(id);
        }
    }
    Ok(())
}

pub(crate) fn cuDevicePrimaryCtxRelease_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let dev = r.i32()?;
    r.finish()?;
    let f = s
        .driver
        .cuDevicePrimaryCtxRelease_v2
        .ok_or_else(unsupported)?;
    // SAFETY: a device ordinal; the driver checks it.
    let st = unsafe { f(dev) };
    w.i32(st);
    if st == 0 {
        s.retained_primary(dev, -1, None);
    }
    Ok(())
}

/// Looks a kernel up and answers with its parameter layout (`cuFuncGetParamInfo`,
/// CUDA 12.4 and later), which the guest needs to pack `kernelParams`.
pub(crate) fn cuModuleGetFunction<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx = r.u64()?;
    let id = new_id(r)?;
    let hmod_id = r.u64()?;
    let name = Session::c_bytes(Session::bytes_arg(r, frame)?)?;
    r.finish()?;
    let f = s.driver.cuModuleGetFunction.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx, true)?;
    let hmod = s.lookup(Kind::Module, hmod_id, false)?;
    if let Some(id) = id {
        s.check_new(Kind::Function, id)?;
    }
    s.make_current(ctx)?;
    let mut h: *mut c_void = std::ptr::null_mut();
    let out = out_ptr(id.is_some(), &mut h);
    let name_ptr = name.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
    // SAFETY: an out-pointer, a module of this session, a NUL-terminated name.
    let st = unsafe { f(out.cast(), hmod, name_ptr.cast()) };
    w.i32(st);
    if st == 0
        && let Some(id) = id
    {
        s.bind(Kind::Function, id, h);
        // From the driver (CUDA 12.4 and later), else from the module's PTX.
        let layout = param_layout(s, h).or_else(|| {
            let name = name.as_deref()?.strip_suffix(&[0])?;
            s.ptx_layout(hmod_id, std::str::from_utf8(name).ok()?)
        });
        let limits = launch_limits(s, h);
        answer_function(s, w, id, layout, limits);
    }
    Ok(())
}

/// The reply of a function's lookup after its status: its parameter layout
/// (`u32::MAX` parameters if unknown) and launch limits, which the API server keeps
/// too.
fn answer_function(
    s: &Session,
    w: &mut Writer,
    id: u64,
    layout: Option<Vec<(u32, u32)>>,
    limits: [u32; 8],
) {
    match &layout {
        Some(l) => {
            w.u32(l.len() as u32);
            for &(o, sz) in l {
                w.u32(o).u32(sz);
            }
        }
        None => {
            w.u32(u32::MAX);
        }
    }
    for v in limits {
        w.u32(v);
    }
    s.set_layout(id, layout);
}

/// What a launch of `f` in the current context may ask for, so that the guest can
/// tell a launch the driver would refuse at once (it then waits for the host's
/// answer) from one it may forward without waiting: the function's most threads per
/// block and dynamic shared memory, and the device's largest block and grid. 0 where
/// the driver does not say (the guest then always waits).
fn launch_limits(s: &Session, f: *mut c_void) -> [u32; 8] {
    let mut out = [0u32; 8];
    let (Some(func_attr), Some(dev_attr), Some(ctx_dev)) = (
        s.driver.cuFuncGetAttribute,
        s.driver.cuDeviceGetAttribute,
        s.driver.cuCtxGetDevice,
    ) else {
        return out;
    };
    // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, _MAX_DYNAMIC_SHARED_SIZE_BYTES.
    for (slot, attr) in [(0, 0), (1, 8)] {
        let mut v: c_int = 0;
        // SAFETY: an out-pointer, an attribute number and a function of this session.
        if unsafe { func_attr(&mut v, attr, f) } == 0 {
            out[slot] = u32::try_from(v).unwrap_or(0);
        }
    }
    let mut dev: c_int = 0;
    // SAFETY: an out-pointer; the context is current.
    if unsafe { ctx_dev(&mut dev) } != 0 {
        return [0; 8];
    }
    // CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X..Z, MAX_GRID_DIM_X..Z.
    for (i, attr) in (2..=7).enumerate() {
        let mut v: c_int = 0;
        // SAFETY: an out-pointer, an attribute number and the context's device.
        if unsafe { dev_attr(&mut v, attr, dev) } == 0 {
            out[2 + i] = u32::try_from(v).unwrap_or(0);
        }
    }
    out
}

/// Most parameters a kernel may have (the driver allows 32 KiB of them).
const MAX_PARAMS: usize = 4096;

fn param_layout(s: &Session, f: *mut c_void) -> Option<Vec<(u32, u32)>> {
    layout_of(s.driver.cuFuncGetParamInfo?, f)
}

/// A function's or kernel's parameters, (offset, size) each, from the driver's
/// `cuFuncGetParamInfo` or `cuKernelGetParamInfo` (`info`).
fn layout_of(
    info: unsafe extern "C" fn(*mut c_void, usize, *mut usize, *mut usize) -> c_int,
    f: *mut c_void,
) -> Option<Vec<(u32, u32)>> {
    let mut v = Vec::new();
    for i in 0..MAX_PARAMS {
        let (mut off, mut size) = (0usize, 0usize);
        // SAFETY: a function or kernel of this session and two out-pointers.
        match unsafe { info(f, i, &mut off, &mut size) } {
            0 => v.push((u32::try_from(off).ok()?, u32::try_from(size).ok()?)),
            status::INVALID_VALUE => return Some(v),
            _ => return None,
        }
    }
    None
}

/// `CU_LAUNCH_PARAM_END`, `_BUFFER_POINTER`, `_BUFFER_SIZE`.
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// Launches a kernel with the parameters the guest packed by the function's layout.
pub(crate) fn cuLaunchKernel<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    launch(s, r, frame, w, false)
}

/// `cuLaunchKernelEx` (the guest read the configuration): a launch with attributes,
/// each checked. Numbers are forwarded as they are; an event is the guest's id,
/// looked up; what cuda.h 13.0 does not define, or defines for graph nodes only, is
/// refused as the driver refuses it.
pub(crate) fn hiraLaunchKernelEx<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    launch(s, r, frame, w, true)
}

/// The attributes of a `cuLaunchKernelEx` as the host's driver takes them, or the
/// status that refuses them.
fn launch_attributes(
    s: &Session,
    bytes: Option<Bytes<'_>>,
    len: u64,
) -> Result<Result<Vec<launch::Attribute>, c_int>, Fail> {
    let raw = bytes.as_ref().map_or_else(Vec::new, Bytes::to_vec);
    if raw.len() as u64 != len {
        return Err(Fail::Protocol(format!(
            "{} attribute bytes, {len} announced",
            raw.len()
        )));
    }
    let Some(mut attrs) = launch::Attribute::parse_all(&raw) else {
        return Ok(Err(status::INVALID_VALUE));
    };
    for a in &mut attrs {
        match launch::value_of(a.id) {
            launch::Value::Data => {}
            launch::Value::Event => {
                let ev = s.lookup(Kind::Event, a.event(), false)?;
                a.set_event(ev as usize as u64);
            }
            launch::Value::GraphNode => return Ok(Err(status::NOT_SUPPORTED)),
            launch::Value::Unknown => return Ok(Err(status::INVALID_VALUE)),
        }
    }
    Ok(Ok(attrs))
}

/// The host's launch: `cuLaunchKernel`, or `cuLaunchKernelEx` with the checked
/// attributes.
enum Host<P> {
    Plain(P),
    Ex(super::LaunchKernelEx, Vec<launch::Attribute>),
}

/// A launch, plain or with attributes (`ex`).
fn launch<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
    ex: bool,
) -> Result<(), Fail> {
    let ctx = r.u64()?;
    let fid = r.u64()?;
    let mut dims = [0 as c_uint; 7];
    for d in &mut dims {
        *d = r.u32()?;
    }
    let stream = r.u64()?;
    let attr_bytes = if ex {
        let b = Session::bytes_arg(r, frame)?;
        Some((b, r.u64()?))
    } else {
        None
    };
    let params = Session::bytes_arg(r, frame)?;
    let extra = Session::bytes_arg(r, frame)?;
    r.finish()?;
    let ctx = s.lookup(Kind::Context, ctx, true)?;
    let f = s.lookup(Kind::Function, fid, false)?;
    let stream = s.stream(stream)?;
    // The host's function, resolved before the VM's decision is applied.
    let host = match attr_bytes {
        None => Host::Plain(s.driver.cuLaunchKernel.ok_or_else(unsupported)?),
        Some((b, len)) => {
            let launch = s.extra.cuLaunchKernelEx.ok_or_else(unsupported)?;
            match launch_attributes(s, b, len)? {
                Ok(a) => Host::Ex(launch, a),
                Err(st) => {
                    w.i32(st);
                    return Ok(());
                }
            }
        }
    };
    // Values copied into 8-byte-aligned storage, as the driver may read them so.
    let aligned = |b: &Bytes<'_>| -> Vec<u64> {
        let mut v = vec![0u64; b.len().div_ceil(8).max(1)];
        // SAFETY: `v` holds at least `b.len()` bytes; `b` that many readable ones.
        unsafe { std::ptr::copy_nonoverlapping(b.ptr(), v.as_mut_ptr().cast::<u8>(), b.len()) };
        v
    };
    let mut param_store = Vec::new();
    let mut pointers: Vec<*mut c_void> = Vec::new();
    if let Some(p) = &params {
        let layout = match s.layout(fid) {
            Some(Some(l)) => l,
            Some(None) => return Err(unsupported()),
            None if f.is_null() => return Err(Fail::Status(status::INVALID_HANDLE)),
            None => return Err(Fail::Protocol("launch of a function with no layout".into())),
        };
        let total = layout
            .iter()
            .map(|&(o, sz)| (o + sz) as usize)
            .max()
            .unwrap_or(0);
        if p.len() != total {
            return Err(Fail::Protocol(format!(
                "{} parameter bytes for a kernel taking {total}",
                p.len()
            )));
        }
        param_store = aligned(p);
        let base = param_store.as_mut_ptr().cast::<u8>();
        // SAFETY: every offset is within the buffer (checked against the layout).
        pointers = layout
            .iter()
            .map(|&(o, _)| unsafe { base.add(o as usize) }.cast::<c_void>())
            .collect();
    }
    let mut extra_store = Vec::new();
    let mut extra_len = extra.as_ref().map_or(0, Bytes::len);
    let mut extra_list: Vec<*mut c_void> = Vec::new();
    if let Some(e) = &extra {
        extra_store = aligned(e);
        extra_list = vec![
            PARAM_BUFFER_POINTER as *mut c_void,
            extra_store.as_mut_ptr().cast(),
            PARAM_BUFFER_SIZE as *mut c_void,
            (&mut extra_len as *mut usize).cast(),
            PARAM_END as *mut c_void,
        ];
    }
    // The VM's scheduling decision, then the launch between two timing events.
    s.device_time.admit();
    s.make_current(ctx)?;
    let bracket = s.device_time.before(&s.driver, ctx, stream);
    let pp = if params.is_some() {
        pointers.as_mut_ptr()
    } else {
        std::ptr::null_mut()
    };
    let ep = if extra.is_some() {
        extra_list.as_mut_ptr()
    } else {
        std::ptr::null_mut()
    };
    let st = match &host {
        Host::Plain(launch) => {
            // SAFETY: the parameter pointers point into `param_store`, the extra list
            // into `extra_store` and `extra_len`, alive until the call returns (the
            // driver copies parameters at launch).
            unsafe {
                launch(
                    f, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], stream, pp,
                    ep,
                )
            }
        }
        Host::Ex(launch, a) => {
            let config = launch::Config {
                grid: [dims[0], dims[1], dims[2]],
                block: [dims[3], dims[4], dims[5]],
                shared_mem_bytes: dims[6],
                stream,
                attrs: if a.is_empty() {
                    std::ptr::null()
                } else {
                    a.as_ptr()
                },
                num_attrs: a.len() as c_uint,
            };
            // SAFETY: as above; the configuration's attributes are `a`, alive until
            // the call returns.
            unsafe { launch(&config, f, pp, ep) }
        }
    };
    drop((param_store, extra_store));
    s.device_time.after(&s.driver, bracket, stream, st == 0);
    w.i32(st);
    Ok(())
}

/// A copy back to the guest on a stream: the host copies into a buffer of its own,
/// which the reply carries once the stream has reached it.
pub(crate) fn cuMemcpyDtoHAsync_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx = r.u64()?;
    let to = Session::out_arg(r)?;
    let src = r.u64()?;
    let n = r.u64()? as usize;
    let stream = r.u64()?;
    r.finish()?;
    let copy = s.driver.cuMemcpyDtoHAsync_v2.ok_or_else(unsupported)?;
    let sync = s.driver.cuStreamSynchronize.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx, true)?;
    let stream = s.stream(stream)?;
    let mut buf = Session::out_buffer(to, frame, n)?;
    s.make_current(ctx)?;
    s.check_device(src, n as u64)?;
    let dst = buf.ptr().cast::<c_void>();
    // SAFETY: `buf` holds `n` bytes and outlives the copy: the stream is
    // synchronised before it is read or dropped.
    let mut st = unsafe { copy(dst, src, n, stream) };
    if st == 0 {
        // SAFETY: a stream of this session's current context.
        st = unsafe { sync(stream) };
    }
    w.i32(st);
    if st == 0 {
        buf.reply(w);
    }
    Ok(())
}

/// The driver's name or description of an error, for the guest's cache.
pub(crate) fn hiraErrorText<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let error: c_int = r.i32()?;
    let which: c_int = r.i32()?;
    let to = Session::out_arg(r)?;
    r.finish()?;
    match super::error_text(&s.driver, error, which) {
        Ok(text) => {
            let mut b = text.into_bytes();
            b.truncate(255);
            b.push(0);
            let mut out = Session::out_buffer(to, frame, 256)?;
            if !out.ptr().is_null() {
                // SAFETY: the buffer holds 256 bytes; `b` at most that.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.ptr(), b.len()) };
            }
            w.i32(0);
            out.reply(w);
        }
        Err(st) => {
            w.i32(st);
        }
    }
    Ok(())
}

/// Allocates device memory charged to the VM's quota: an allocation the quota
/// does not allow fails with `CUDA_ERROR_OUT_OF_MEMORY`, as a full device would.
/// Hira places it at addresses it reserved (`placement`), or, without the driver's
/// virtual-memory-management calls, the driver's `cuMemAlloc` does.
pub(crate) fn cuMemAlloc_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let want = r.u8()? != 0;
    let size = r.u64()?;
    r.finish()?;
    let alloc = s.driver.cuMemAlloc_v2.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx_id, true)?;
    s.make_current(ctx)?;
    let charged = want && size > 0;
    if charged && s.quota.charge(size).is_err() {
        w.i32(status::OUT_OF_MEMORY);
        return Ok(());
    }
    let placed = match s.vmm.as_ref().filter(|_| charged) {
        Some(v) => place(s, v, ctx_id, size).transpose(),
        None => None,
    };
    let st = match placed {
        Some(Ok(p)) => {
            w.i32(0).u64(p);
            return Ok(());
        }
        Some(Err(st)) => st,
        None => {
            let mut p = 0u64;
            let out = out_ptr(want, &mut p);
            // SAFETY: an out-pointer to a device address, or NULL as the guest passed.
            let st = unsafe { alloc(out, size as usize) };
            if st == 0 {
                if charged {
                    s.placement().driver_allocated(p, ctx_id, size);
                }
                w.i32(0);
                if want {
                    w.u64(p);
                }
                return Ok(());
            }
            st
        }
    };
    w.i32(st);
    if charged {
        s.quota.uncharge(size);
    }
    Ok(())
}

/// Places `size` bytes in the current context `ctx_id`'s device; `None` where the
/// device does not support virtual memory management (the driver allocates then).
/// A context that failed (a kernel's fault sticks to it) fails the allocation with
/// its error, as `cuMemAlloc` does there.
fn place(
    s: &Session,
    v: &super::placement::VmmCalls,
    ctx_id: u64,
    size: u64,
) -> Result<Option<u64>, c_int> {
    context_intact(s)?;
    let get_dev = s.driver.cuCtxGetDevice.ok_or(status::NOT_SUPPORTED)?;
    let mut dev: c_int = 0;
    // SAFETY: an out-pointer; the context is current.
    let st = unsafe { get_dev(&mut dev) };
    if st != 0 {
        return Err(st);
    }
    let attr = s.driver.cuDeviceGetAttribute.ok_or(status::NOT_SUPPORTED)?;
    let supported = s.placement().supported(dev, || {
        let mut v: c_int = 0;
        // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED.
        // SAFETY: an out-pointer, an attribute and the context's device.
        unsafe { attr(&mut v, 102, dev) == 0 && v != 0 }
    });
    if !supported {
        return Ok(None);
    }
    s.placement().alloc(v, dev, ctx_id, size).map(Some)
}

/// `cuMemAllocPitch`: the host's driver validates the request and picks the pitch
/// (its own rule for the device); Hira then places `pitch * height` bytes as
/// `cuMemAlloc`'s are placed, giving the driver's allocation back, so that pitched
/// memory moves with the session too.
pub(crate) fn cuMemAllocPitch_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx_id = r.u64()?;
    let want_ptr = r.u8()? != 0;
    let want_pitch = r.u8()? != 0;
    let width = r.u64()?;
    let height = r.u64()?;
    let element = r.u32()?;
    r.finish()?;
    let f = s.driver.cuMemAllocPitch_v2.ok_or_else(unsupported)?;
    let free = s.driver.cuMemFree_v2.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx_id, true)?;
    s.make_current(ctx)?;
    let (mut p, mut pitch) = (0u64, 0usize);
    // SAFETY: two out-pointers (or NULL, as the guest passed) and values.
    let st = unsafe {
        f(
            out_ptr(want_ptr, &mut p),
            out_ptr(want_pitch, &mut pitch),
            width as usize,
            height as usize,
            element,
        )
    };
    if st != 0 || !want_ptr {
        w.i32(st);
        return Ok(());
    }
    let size = (pitch as u64).saturating_mul(height);
    if s.quota.charge(size).is_err() {
        // SAFETY: the allocation the driver just made.
        unsafe { free(p) };
        w.i32(status::OUT_OF_MEMORY);
        return Ok(());
    }
    let placed = match s.vmm.as_ref() {
        Some(v) => place(s, v, ctx_id, size),
        None => Ok(None),
    };
    let at = match placed {
        Ok(Some(at)) => {
            // SAFETY: the driver's allocation, replaced by Hira's.
            unsafe { free(p) };
            at
        }
        Ok(None) => {
            s.placement().driver_allocated(p, ctx_id, size);
            p
        }
        Err(st) => {
            // SAFETY: the driver's allocation, not handed out.
            unsafe { free(p) };
            s.quota.uncharge(size);
            w.i32(st);
            return Ok(());
        }
    };
    w.i32(0).u64(at);
    if want_pitch {
        w.u64(pitch as u64);
    }
    Ok(())
}

/// The current context's sticky error, if a kernel's fault broke it (its legacy
/// stream's query says so without waiting): memory calls Hira answers itself fail
/// with it, as the driver's do in such a context.
fn context_intact(s: &Session) -> Result<(), c_int> {
    let query = s.driver.cuStreamQuery.ok_or(status::NOT_SUPPORTED)?;
    // SAFETY: the legacy stream of the current context.
    match unsafe { query(std::ptr::null_mut()) } {
        0 | status::NOT_READY => Ok(()),
        st => Err(st),
    }
}

/// Frees an allocation: Hira's own, or the driver's (which checks the address).
pub(crate) fn cuMemFree_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx = r.u64()?;
    let p = r.u64()?;
    r.finish()?;
    let free = s.driver.cuMemFree_v2.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx, true)?;
    s.make_current(ctx)?;
    let ours = s.placement().get(p).is_some_and(|a| a.chunk.is_some());
    let st = if ours {
        // A context that failed refuses it, as the driver's cuMemFree does.
        context_intact(s).err().unwrap_or(0)
    } else {
        // SAFETY: a device address; the driver checks it is an allocation.
        unsafe { free(p) }
    };
    w.i32(st);
    if st == 0 {
        s.freed(p);
    }
    Ok(())
}

/// The allocation holding an address: Hira's answer for memory it placed, as the
/// driver's for an allocation of `cuMemAlloc`; the driver's for any other address.
pub(crate) fn cuMemGetAddressRange_v2<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    _frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx = r.u64()?;
    let want_base = r.u8()? != 0;
    let want_size = r.u8()? != 0;
    let p = r.u64()?;
    r.finish()?;
    let range = s.driver.cuMemGetAddressRange_v2.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx, true)?;
    s.make_current(ctx)?;
    let held = s.placement().holding(p).filter(|(_, a)| a.chunk.is_some());
    let (st, base, size) = match held {
        Some((at, a)) => (0, at, a.size),
        None => {
            let (mut base, mut size) = (0u64, 0usize);
            // SAFETY: two out-pointers (or NULL, as the guest passed) and a value.
            let st = unsafe {
                range(
                    out_ptr(want_base, &mut base),
                    out_ptr(want_size, &mut size),
                    p,
                )
            };
            (st, base, size as u64)
        }
    };
    w.i32(st);
    if st == 0 {
        if want_base {
            w.u64(base);
        }
        if want_size {
            w.u64(size);
        }
    }
    Ok(())
}

/// `cuLibraryLoadData` of the code the guest sent (PTX, a cubin or a fatbin; the
/// guest sends the fatbin a runtime's wrapper points at), without options: the host's
/// driver copies the code and picks the image its device runs.
pub(crate) fn hiraLibraryLoad<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let id = new_id(r)?;
    let code = Session::c_bytes(Session::bytes_arg(r, frame)?)?;
    r.finish()?;
    let f = s.extra.cuLibraryLoadData.ok_or_else(unsupported)?;
    if let Some(id) = id {
        s.check_new(Kind::Library, id)?;
    }
    let mut h: *mut c_void = std::ptr::null_mut();
    let out = out_ptr(id.is_some(), &mut h);
    let code = code.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
    let (no, none) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: an out-pointer and a copy of the code, NUL-terminated, that outlives
    // the call (the driver copies it: no option says it is preserved).
    let st = unsafe { f(out.cast(), code.cast(), no, none, 0, no, none, 0) };
    w.i32(st);
    if st == 0
        && let Some(id) = id
    {
        s.bind(Kind::Library, id, h);
    }
    Ok(())
}

/// Looks a library's kernel up and answers as `cuModuleGetFunction` does: its
/// parameter layout (`cuKernelGetParamInfo`, CUDA 12.4 and later) and launch limits
/// (of its function in the current context).
pub(crate) fn cuLibraryGetKernel<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    let ctx = r.u64()?;
    let id = new_id(r)?;
    let lib_id = r.u64()?;
    let name = Session::c_bytes(Session::bytes_arg(r, frame)?)?;
    r.finish()?;
    let f = s.driver.cuLibraryGetKernel.ok_or_else(unsupported)?;
    let ctx = s.lookup(Kind::Context, ctx, true)?;
    let lib = s.lookup(Kind::Library, lib_id, false)?;
    if let Some(id) = id {
        s.check_new(Kind::Function, id)?;
    }
    s.make_current(ctx)?;
    let mut k: *mut c_void = std::ptr::null_mut();
    let out = out_ptr(id.is_some(), &mut k);
    let name_ptr = name.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
    // SAFETY: an out-pointer, a library of this session, a NUL-terminated name.
    let st = unsafe { f(out.cast(), lib, name_ptr.cast()) };
    w.i32(st);
    if st == 0
        && let Some(id) = id
    {
        s.bind(Kind::Function, id, k);
        let layout = s
            .extra
            .cuKernelGetParamInfo
            .and_then(|info| layout_of(info, k));
        // The limits are the kernel's function's in the current context.
        let mut func: *mut c_void = std::ptr::null_mut();
        let limits = match s.extra.cuKernelGetFunction {
            // SAFETY: an out-pointer and a kernel of this session.
            Some(get) if !ctx.is_null() && unsafe { get(&mut func, k) } == 0 => {
                launch_limits(s, func)
            }
            _ => [0; 8],
        };
        answer_function(s, w, id, layout, limits);
    }
    Ok(())
}

/// `cuPointerGetAttribute(s)`: the guest's attribute ids, the host's driver's answer,
/// each value in 16 bytes; a context comes back as the guest's id, a memory pool as
/// none (pools are not remoted).
pub(crate) fn hiraPointerGetAttributes<'a>(
    s: &Session,
    r: &mut Reader<'a>,
    frame: &FrameData<'a>,
    w: &mut Writer,
) -> Result<(), Fail> {
    use hira_apis_cuda_private::pointer;
    let ctx = r.u64()?;
    let ids = Session::bytes_arg(r, frame)?;
    let ids_len = r.u64()?;
    let to = Session::out_arg(r)?;
    let values_len = r.u64()?;
    let ptr = r.u64()?;
    let single = r.i32()? != 0;
    r.finish()?;
    let raw = ids.as_ref().map_or_else(Vec::new, Bytes::to_vec);
    let n = raw.len() / 4;
    if raw.len() as u64 != ids_len
        || !raw.len().is_multiple_of(4)
        || values_len != (n * pointer::MAX_VALUE) as u64
    {
        return Err(Fail::Protocol(format!(
            "{} attribute bytes ({ids_len} announced) for {values_len} value bytes",
            raw.len()
        )));
    }
    if n == 0 || n > pointer::MAX_ATTRIBUTES || (single && n != 1) {
        return Err(Fail::Status(status::INVALID_VALUE));
    }
    let attrs: Vec<c_int> = raw
        .chunks_exact(4)
        .map(|c| c_int::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    for &a in &attrs {
        if pointer::value_size(a).is_none() {
            return Err(Fail::Status(status::INVALID_VALUE));
        }
        if a == pointer::P2P_TOKENS {
            return Err(Fail::Status(status::NOT_SUPPORTED));
        }
    }
    let ctx = s.lookup(Kind::Context, ctx, true)?;
    let mut values = vec![[0u8; pointer::MAX_VALUE]; n];
    let mut out = Session::out_buffer(to, frame, n * pointer::MAX_VALUE)?;
    s.make_current(ctx)?;
    let st = if single {
        let get = s.extra.cuPointerGetAttribute.ok_or_else(unsupported)?;
        // SAFETY: a 16-byte value, wider than any attribute's.
        unsafe { get(values[0].as_mut_ptr().cast(), attrs[0], ptr) }
    } else {
        let get = s.extra.cuPointerGetAttributes.ok_or_else(unsupported)?;
        let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
        // SAFETY: `n` attribute ids and `n` pointers to 16-byte values.
        unsafe { get(n as c_uint, attrs.as_ptr(), ptrs.as_mut_ptr(), ptr) }
    };
    w.i32(st);
    if st != 0 {
        return Ok(());
    }
    // Memory Hira placed is described as the allocation the guest made, as the
    // driver describes an allocation of `cuMemAlloc`.
    let held = s
        .placement()
        .holding(ptr)
        .filter(|(_, a)| a.chunk.is_some());
    for (a, v) in attrs.iter().zip(values.iter_mut()) {
        let host = u64::from_le_bytes(v[..8].try_into().expect("8 bytes"));
        let guest = match (*a, held) {
            (pointer::CONTEXT, Some((_, al))) => al.ctx,
            (pointer::BUFFER_ID, Some((_, al))) => al.buffer_id,
            (pointer::RANGE_START_ADDR, Some((at, _))) => at,
            (pointer::RANGE_SIZE, Some((_, al))) => al.size,
            (pointer::CONTEXT, None) if host != 0 => {
                s.id_of(Kind::Context, host as usize as *mut c_void)
            }
            (pointer::MEMPOOL_HANDLE, _) => 0,
            _ => continue,
        };
        v[..8].copy_from_slice(&guest.to_le_bytes());
    }
    let b = out.ptr();
    if !b.is_null() {
        for (i, v) in values.iter().enumerate() {
            // SAFETY: the out buffer holds `n` values of 16 bytes (made above).
            unsafe {
                std::ptr::copy_nonoverlapping(v.as_ptr(), b.add(i * pointer::MAX_VALUE), v.len())
            };
        }
    }
    out.reply(w);
    Ok(())
}
