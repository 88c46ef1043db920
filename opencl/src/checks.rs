//! Argument checks the guest makes before forwarding a call (the `check` flag of the
//! API description).
//!
//! Calls such as `clSetKernelArg`, `clEnqueueNDRangeKernel` and non-blocking
//! transfers are forwarded without waiting for the host, so the host's error code
//! would come too late to be their return value. Each function here takes the call's
//! arguments and, from what the guest knows (kernel argument kinds and which are set,
//! buffer sizes, device and kernel limits), returns the error code the host would
//! return, or `Ok(sync)`: forward the call, synchronously when the guest cannot tell
//! (then the host's own answer is the return value).
//!
//! The API server does not trust any of this: it keeps its own record of kernel
//! argument kinds and checks every id it receives.
//!
//! Each function is named after the API function it checks and takes its arguments,
//! with the same safety contract: pointers as valid as the OpenCL API requires.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::{LazyLock, Mutex, MutexGuard};

use hira_apis_opencl::kernel_args::{
    ArgKind, CL_KERNEL_ARG_ADDRESS_QUALIFIER, CL_KERNEL_ARG_TYPE_NAME,
    CL_KERNEL_ARG_TYPE_QUALIFIER, CL_KERNEL_NUM_ARGS,
};
use hira_apis_opencl::{ARG_INFO_FOR_SHIM, Kind};
use opencl_sys::{
    cl_bool, cl_command_buffer_khr, cl_command_queue, cl_context, cl_device_id, cl_event, cl_int,
    cl_kernel, cl_mem, cl_program, cl_uint,
};

use crate::generated;
use crate::rt;

use opencl_sys::CL_INVALID_ARG_INDEX;
use opencl_sys::CL_INVALID_ARG_SIZE;
use opencl_sys::CL_INVALID_ARG_VALUE;
use opencl_sys::CL_INVALID_KERNEL_ARGS;
use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_INVALID_WORK_DIMENSION;
use opencl_sys::CL_INVALID_WORK_GROUP_SIZE;
use opencl_sys::CL_INVALID_WORK_ITEM_SIZE;
use opencl_sys::CL_MEM_COPY_OVERLAP;

use opencl_sys::CL_DEVICE_ADDRESS_BITS;
use opencl_sys::CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS;
use opencl_sys::CL_DEVICE_MAX_WORK_ITEM_SIZES;
use opencl_sys::CL_KERNEL_COMPILE_WORK_GROUP_SIZE;
use opencl_sys::CL_KERNEL_PROGRAM;
use opencl_sys::CL_KERNEL_WORK_GROUP_SIZE;
use opencl_sys::CL_QUEUE_DEVICE;

/// What the guest knows about one kernel.
#[derive(Debug, Clone)]
struct KernelMeta {
    /// Argument kinds; `None` when the host could not tell them.
    kinds: Option<Vec<ArgKind>>,
    /// Arguments set so far.
    set: Vec<bool>,
    /// Per device: the kernel's largest work-group and its required size, if any.
    limits: HashMap<usize, (usize, [usize; 3])>,
}

/// A device's work-item limits, fetched once.
#[derive(Debug, Clone, Copy)]
struct DeviceLimits {
    max_dims: cl_uint,
    /// Largest work-group size in each dimension (unused dimensions are 0).
    item_sizes: [usize; 3],
}

#[derive(Default)]
struct State {
    kernels: HashMap<u64, KernelMeta>,
    /// Device of each queue.
    queue_device: HashMap<u64, usize>,
    devices: HashMap<usize, DeviceLimits>,
    /// Build options each program was last built or compiled with.
    build_options: HashMap<u64, String>,
    /// Sources of programs made from source, whose includes a build resolves.
    sources: HashMap<u64, Vec<String>>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::default()));

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops what is known about object `id`, which the application released.
pub(crate) fn forget(id: u64) {
    let mut st = state();
    st.kernels.remove(&id);
    st.queue_device.remove(&id);
    st.build_options.remove(&id);
    st.sources.remove(&id);
}

/// The guest id of `ptr` if it is a live object of `kind`.
fn id_of(ptr: *mut c_void, kind: Kind) -> Result<u64, cl_int> {
    match rt::lookup(ptr) {
        Some((id, k)) if k == kind => Ok(id),
        _ => Err(kind.invalid_code()),
    }
}

/// A fixed-size info value from one of the generated (remoted, maybe cached) queries.
fn info<T: Copy + Default>(
    query: impl FnOnce(usize, *mut c_void, *mut usize) -> cl_int,
) -> Result<T, cl_int> {
    let mut v = T::default();
    let status = query(
        size_of::<T>(),
        (&mut v as *mut T).cast(),
        std::ptr::null_mut(),
    );
    if status == 0 { Ok(v) } else { Err(status) }
}

fn info_bytes(query: impl Fn(usize, *mut c_void, *mut usize) -> cl_int) -> Result<Vec<u8>, cl_int> {
    let mut n = 0usize;
    let status = query(0, std::ptr::null_mut(), &mut n);
    if status != 0 {
        return Err(status);
    }
    let mut v = vec![0u8; n];
    let status = query(n, v.as_mut_ptr().cast(), std::ptr::null_mut());
    if status == 0 { Ok(v) } else { Err(status) }
}

fn device_info<T: Copy + Default>(device: cl_device_id, param: u32) -> Result<T, cl_int> {
    // SAFETY: `info` passes a buffer of `size` writable bytes.
    info(|size, value, ret| unsafe { generated::clGetDeviceInfo(device, param, size, value, ret) })
}

/// Asks the host for a kernel's argument kinds (once per kernel), as the shim
/// ([`ARG_INFO_FOR_SHIM`]: answered whatever options the program was built with).
fn kernel_kinds(kernel: cl_kernel) -> Result<Option<Vec<ArgKind>>, cl_int> {
    let mut address_bits = None;
    // The count and every argument in one round trip where the names fit; else the
    // count first, then all at once with room for it, or one query at a time.
    let (n, all) = match all_arg_info(kernel, None) {
        Ok((n, all)) => (n, Some(all)),
        Err(first) => {
            // SAFETY: `info` passes a buffer of `size` writable bytes.
            let n: cl_uint = info(|size, value, ret| unsafe {
                generated::clGetKernelInfo(kernel, CL_KERNEL_NUM_ARGS, size, value, ret)
            })?;
            // Room for the count asked for is less than the first answer had unless
            // the kernel has more arguments than that room was for.
            let again = first != opencl_sys::CL_OUT_OF_RESOURCES || n > FIRST_ROOM;
            let all = again.then(|| all_arg_info(kernel, Some(n)).ok()).flatten();
            (n, all.map(|(_, all)| all))
        }
    };
    let mut kinds = Vec::with_capacity(n as usize);
    if let Some(all) = all {
        for (address, qualifier, name) in all {
            if address_bits.is_none() && (name.contains("size_t") || name.contains("ptr")) {
                address_bits = Some(kernel_address_bits(kernel).unwrap_or(64));
            }
            kinds.push(ArgKind::classify(
                address,
                &name,
                qualifier,
                address_bits.unwrap_or(64),
            ));
        }
        return Ok(Some(kinds));
    }
    // A host that cannot answer them all at once is asked one query at a time.
    for i in 0..n {
        // SAFETY: as above.
        let address: Result<u32, _> = info(|size, value, ret| unsafe {
            generated::clGetKernelArgInfo(
                kernel,
                i,
                CL_KERNEL_ARG_ADDRESS_QUALIFIER | ARG_INFO_FOR_SHIM,
                size,
                value,
                ret,
            )
        });
        // SAFETY: as above.
        let qualifier: Result<u64, _> = info(|size, value, ret| unsafe {
            generated::clGetKernelArgInfo(
                kernel,
                i,
                CL_KERNEL_ARG_TYPE_QUALIFIER | ARG_INFO_FOR_SHIM,
                size,
                value,
                ret,
            )
        });
        // SAFETY: `info_bytes` passes a buffer of `size` writable bytes.
        let name = info_bytes(|size, value, ret| unsafe {
            generated::clGetKernelArgInfo(
                kernel,
                i,
                CL_KERNEL_ARG_TYPE_NAME | ARG_INFO_FOR_SHIM,
                size,
                value,
                ret,
            )
        });
        let (Ok(address), Ok(qualifier), Ok(name)) = (address, qualifier, name) else {
            return Ok(None);
        };
        let name = CStr::from_bytes_until_nul(&name)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        if address_bits.is_none() && (name.contains("size_t") || name.contains("ptr")) {
            address_bits = Some(kernel_address_bits(kernel).unwrap_or(64));
        }
        kinds.push(ArgKind::classify(
            address,
            &name,
            qualifier,
            address_bits.unwrap_or(64),
        ));
    }
    Ok(Some(kinds))
}

/// The arguments the first `hiraKernelArgInfo` of a kernel has room for.
const FIRST_ROOM: cl_uint = 32;

/// Every argument's address qualifier, type qualifier and type name at once
/// (`hiraKernelArgInfo`), with their count; the host's status where it cannot answer
/// so (`CL_INVALID_VALUE` also where the answer is malformed). With no `count`, the
/// host answers the kernel's own, in room for [`FIRST_ROOM`] arguments.
fn all_arg_info(kernel: cl_kernel, count: Option<cl_uint>) -> Result<(cl_uint, ArgInfo), cl_int> {
    // Room for type names of up to about 48 bytes each (all the bytes come back); a
    // kernel whose names need more is asked one query at a time.
    let room = count.unwrap_or(FIRST_ROOM) as usize;
    let mut blob = vec![0u8; 8 + 64 * room];
    // SAFETY: `blob` is valid for its length of writes.
    let st = unsafe {
        generated::hiraKernelArgInfo(
            kernel,
            count.unwrap_or(0),
            blob.len(),
            blob.as_mut_ptr().cast(),
        )
    };
    if st != 0 {
        return Err(st);
    }
    parse_arg_info(&blob, count, room).ok_or(CL_INVALID_VALUE)
}

/// Decodes `hiraKernelArgInfo`'s answer (see `protocol/api/opencl.api`).
fn parse_arg_info(blob: &[u8], count: Option<cl_uint>, room: usize) -> Option<(cl_uint, ArgInfo)> {
    let total = u32::from_le_bytes(blob.get(..4)?.try_into().ok()?) as usize;
    let mut r = blob.get(4..total)?;
    let n = match count {
        Some(n) => n,
        None => {
            let n = u32::from_le_bytes(r.get(..4)?.try_into().ok()?);
            r = &r[4..];
            n
        }
    };
    let mut out = Vec::with_capacity(n.min(room as u32) as usize);
    for _ in 0..n {
        let address = u32::from_le_bytes(r.get(..4)?.try_into().ok()?);
        let qualifier = u64::from_le_bytes(r.get(4..12)?.try_into().ok()?);
        let len = u32::from_le_bytes(r.get(12..16)?.try_into().ok()?) as usize;
        let name = String::from_utf8_lossy(r.get(16..16 + len)?).into_owned();
        r = &r[16 + len..];
        out.push((address, qualifier, name));
    }
    r.is_empty().then_some((n, out))
}

/// Each argument's address qualifier, type qualifier and type name.
type ArgInfo = Vec<(u32, u64, String)>;

fn kernel_address_bits(kernel: cl_kernel) -> Result<u32, cl_int> {
    let program = kernel_program(kernel)?;
    use opencl_sys::CL_PROGRAM_DEVICES;
    // SAFETY: `info` passes a buffer of `size` writable bytes.
    let device: cl_device_id = info(|size, value, ret| unsafe {
        generated::clGetProgramInfo(program, CL_PROGRAM_DEVICES, size, value, ret)
    })
    .or_else(|e| {
        if e == CL_INVALID_VALUE {
            Ok(std::ptr::null_mut())
        } else {
            Err(e)
        }
    })?;
    if device.is_null() {
        return Ok(64);
    }
    device_info(device, CL_DEVICE_ADDRESS_BITS)
}

fn kernel_program(kernel: cl_kernel) -> Result<cl_program, cl_int> {
    // SAFETY: `info` passes a buffer of `size` writable bytes.
    info(|size, value, ret| unsafe {
        generated::clGetKernelInfo(kernel, CL_KERNEL_PROGRAM, size, value, ret)
    })
}

/// The id of `kernel`, whose record exists once this returns (the kinds are fetched
/// from the host the first time, without holding the state lock).
fn kernel_record(kernel: cl_kernel) -> Result<u64, cl_int> {
    let id = id_of(kernel.cast(), Kind::Kernel)?;
    if state().kernels.contains_key(&id) {
        return Ok(id);
    }
    let kinds = kernel_kinds(kernel)?;
    let n = kinds.as_ref().map_or(0, Vec::len);
    state().kernels.entry(id).or_insert(KernelMeta {
        kinds,
        set: vec![false; n],
        limits: HashMap::new(),
    });
    Ok(id)
}

/// Runs `f` on the kernel's record, fetching the kinds first if needed.
fn with_kernel<R>(kernel: cl_kernel, f: impl FnOnce(&mut KernelMeta) -> R) -> Result<R, cl_int> {
    let id = kernel_record(kernel)?;
    let mut st = state();
    // Gone only if another thread released the kernel meanwhile.
    let m = st.kernels.get_mut(&id).ok_or(Kind::Kernel.invalid_code())?;
    Ok(f(m))
}

/// `clSetKernelArg`: the kind of the argument decides what is valid.
pub(crate) unsafe fn clSetKernelArg(
    kernel: cl_kernel,
    arg_index: cl_uint,
    arg_size: usize,
    arg_value: *const c_void,
) -> Result<bool, cl_int> {
    let id = kernel_record(kernel)?;
    let kind = state()
        .kernels
        .get(&id)
        .and_then(|m| m.kinds.as_ref())
        .map(|k| k.get(arg_index as usize).copied());
    let kind = match kind {
        // The host could not tell the kinds: let it answer.
        None => return Ok(true),
        Some(None) => return Err(CL_INVALID_ARG_INDEX),
        Some(Some(k)) => k,
    };
    let sync = match kind {
        ArgKind::Local => {
            if !arg_value.is_null() {
                return Err(CL_INVALID_ARG_VALUE);
            }
            if arg_size == 0 {
                return Err(CL_INVALID_ARG_SIZE);
            }
            false
        }
        ArgKind::Value(n) => {
            if arg_value.is_null() {
                return Err(CL_INVALID_ARG_VALUE);
            }
            if arg_size != n {
                return Err(CL_INVALID_ARG_SIZE);
            }
            false
        }
        ArgKind::OpaqueValue | ArgKind::Unknown => true,
        object => {
            let (want, code) = object.object().ok_or(CL_INVALID_ARG_VALUE)?;
            // A sampler cannot be NULL; a buffer, image, pipe or queue can.
            if object == ArgKind::Sampler && arg_value.is_null() {
                return Err(CL_INVALID_ARG_VALUE);
            }
            if arg_size != size_of::<*mut c_void>() {
                return Err(CL_INVALID_ARG_SIZE);
            }
            let p = if arg_value.is_null() {
                std::ptr::null_mut()
            } else {
                // SAFETY: the application passes `arg_size` (pointer-size) readable bytes.
                unsafe { (arg_value as *const *mut c_void).read_unaligned() }
            };
            if !p.is_null() && !matches!(rt::lookup(p), Some((_, k)) if k == want) {
                return Err(code);
            }
            false
        }
    };
    if let Some(s) = state()
        .kernels
        .get_mut(&id)
        .and_then(|m| m.set.get_mut(arg_index as usize))
    {
        *s = true;
    }
    Ok(sync)
}

/// Records that argument `index` of `kernel` was set by other means than
/// `clSetKernelArg` (an SVM pointer).
pub(crate) fn arg_was_set(kernel: cl_kernel, index: cl_uint) {
    let _ = with_kernel(kernel, |m| {
        if let Some(s) = m.set.get_mut(index as usize) {
            *s = true;
        }
    });
}

/// `clCloneKernel`: nothing to check before the call.
pub(crate) unsafe fn clCloneKernel(
    source_kernel: cl_kernel,
    _errcode_ret: *mut cl_int,
) -> Result<bool, cl_int> {
    id_of(source_kernel.cast(), Kind::Kernel)?;
    Ok(false)
}

/// `clCreateSubBuffer`: nothing to check beyond the parent's id.
pub(crate) unsafe fn clCreateSubBuffer(
    buffer: cl_mem,
    _flags: u64,
    _buffer_create_type: cl_uint,
    _buffer_create_info: *const c_void,
    _errcode_ret: *mut cl_int,
) -> Result<bool, cl_int> {
    id_of(buffer.cast(), Kind::Mem)?;
    Ok(false)
}

/// A sub-buffer inherits its parent's host-pointer use and host access, as natively:
/// mapping a sub-buffer of a `CL_MEM_USE_HOST_PTR` buffer returns the application's
/// memory at the sub-buffer's origin.
pub(crate) unsafe fn clCreateSubBuffer_created(
    sub: *mut c_void,
    buffer: cl_mem,
    flags: u64,
    _buffer_create_type: cl_uint,
    buffer_create_info: *const c_void,
    _errcode_ret: *mut cl_int,
) {
    let (Ok(parent), Ok(id)) = (id_of(buffer.cast(), Kind::Mem), id_of(sub, Kind::Mem)) else {
        return;
    };
    crate::zero_copy::sub_buffer(id, parent);
    let Some(p) = rt::mem_extra(parent) else {
        return;
    };
    // SAFETY: the host accepted the call, so the region (origin, size) was readable.
    let (origin, size) = unsafe {
        let r = buffer_create_info as *const usize;
        (*r, *r.add(1))
    };
    rt::note_sub_buffer(id, &p, flags, origin, size);
}

/// A clone has its source's arguments, and so which of them are set.
pub(crate) unsafe fn clCloneKernel_created(
    clone: *mut c_void,
    source_kernel: cl_kernel,
    _errcode_ret: *mut cl_int,
) {
    let (Ok(src), Ok(dst)) = (
        id_of(source_kernel.cast(), Kind::Kernel),
        id_of(clone, Kind::Kernel),
    ) else {
        return;
    };
    let mut st = state();
    if let Some(copy) = st.kernels.get(&src).cloned() {
        st.kernels.insert(dst, copy);
    }
}

/// `clCreateProgramWithSource`: nothing to check here (the host checks the strings).
pub(crate) unsafe fn clCreateProgramWithSource(
    _context: cl_context,
    _count: cl_uint,
    _strings: *mut *const c_char,
    _lengths: *const usize,
    _errcode_ret: *mut cl_int,
) -> Result<bool, cl_int> {
    Ok(false)
}

/// Keeps a program's sources, so that its builds can ship the headers they include.
pub(crate) unsafe fn clCreateProgramWithSource_created(
    program: *mut c_void,
    _context: cl_context,
    count: cl_uint,
    strings: *mut *const c_char,
    lengths: *const usize,
    _errcode_ret: *mut cl_int,
) {
    let Ok(id) = id_of(program, Kind::Program) else {
        return;
    };
    let mut sources = Vec::new();
    for i in 0..count as usize {
        // SAFETY: the host accepted the call, so `strings` holds `count` valid strings,
        // each `lengths[i]` bytes long or NUL-terminated.
        let text = unsafe {
            let s = *strings.add(i);
            let len = if lengths.is_null() {
                0
            } else {
                *lengths.add(i)
            };
            if len == 0 {
                CStr::from_ptr(s).to_bytes().to_vec()
            } else {
                std::slice::from_raw_parts(s.cast::<u8>(), len).to_vec()
            }
        };
        sources.push(String::from_utf8_lossy(&text).into_owned());
    }
    state().sources.insert(id, sources);
}

/// Ships the headers `program`'s sources include, resolved on the guest, before a
/// build or compilation with `options`.
fn ship_headers(program: u64, handle: cl_program, options: &str) -> Result<(), cl_int> {
    let Some(sources) = state().sources.get(&program).cloned() else {
        return Ok(());
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let found = crate::includes::resolve(&sources, options, &cwd);
    if found.files.is_empty() {
        return Ok(());
    }
    let blob = found.encode();
    let Ok(cwd) = std::ffi::CString::new(found.cwd) else {
        return Ok(());
    };
    // SAFETY: `cwd` is NUL-terminated and `blob` holds `blob.len()` bytes.
    let status = unsafe {
        generated::hiraBuildFiles(handle, cwd.as_ptr(), blob.len(), blob.as_ptr().cast())
    };
    if status != 0 {
        return Err(status);
    }
    Ok(())
}

fn options_text(options: *const c_char) -> String {
    if options.is_null() {
        String::new()
    } else {
        // SAFETY: the application passes a NUL-terminated string.
        unsafe { CStr::from_ptr(options) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Before a build or a compilation: ships the headers the sources include and
/// remembers the options.
fn before_build(program: cl_program, options: *const c_char) -> Result<bool, cl_int> {
    let id = id_of(program.cast(), Kind::Program)?;
    let options = options_text(options);
    ship_headers(id, program, &options)?;
    state().build_options.insert(id, options);
    Ok(false)
}

/// `clCompileProgram`: remembers the options and ships the headers.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clCompileProgram(
    program: cl_program,
    _num_devices: cl_uint,
    _device_list: *const cl_device_id,
    options: *const c_char,
    _num_input_headers: cl_uint,
    _input_headers: *const cl_program,
    _header_include_names: *mut *const c_char,
    _pfn_notify: Option<unsafe extern "C" fn(cl_program, *mut c_void)>,
    _user_data: *mut c_void,
) -> Result<bool, cl_int> {
    before_build(program, options)
}

/// `clBuildProgram`: remembers the options, which decide whether work-groups may be
/// non-uniform, and ships the headers.
pub(crate) unsafe fn clBuildProgram(
    program: cl_program,
    _num_devices: cl_uint,
    _device_list: *const cl_device_id,
    options: *const c_char,
    _pfn_notify: Option<unsafe extern "C" fn(cl_program, *mut c_void)>,
    _user_data: *mut c_void,
) -> Result<bool, cl_int> {
    before_build(program, options)
}

/// Whether the program was built so that the host may accept non-uniform
/// work-groups, or `None` when the guest does not know its options.
fn may_be_non_uniform(kernel: cl_kernel) -> Option<bool> {
    let program = kernel_program(kernel).ok()?;
    let id = id_of(program.cast(), Kind::Program).ok()?;
    let options = state().build_options.get(&id).cloned()?;
    let words: Vec<&str> = options.split_whitespace().collect();
    let std20 = words.iter().any(|w| {
        w.strip_prefix("-cl-std=CL")
            .and_then(|v| v.chars().next())
            .is_some_and(|major| major >= '2')
    });
    Some(std20 && !words.contains(&"-cl-uniform-work-group-size"))
}

/// A new queue's device, which the application named and the host accepted: a
/// launch's checks need not ask for it.
fn note_queue_device(queue: *mut c_void, device: cl_device_id) {
    if let Ok(id) = id_of(queue, Kind::Queue) {
        state().queue_device.insert(id, device as usize);
    }
}

fn queue_device(queue: cl_command_queue) -> Result<cl_device_id, cl_int> {
    let id = id_of(queue.cast(), Kind::Queue)?;
    if let Some(&d) = state().queue_device.get(&id) {
        return Ok(d as cl_device_id);
    }
    // SAFETY: `info` passes a buffer of `size` writable bytes.
    let d: cl_device_id = info(|size, value, ret| unsafe {
        generated::clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, size, value, ret)
    })?;
    state().queue_device.insert(id, d as usize);
    Ok(d)
}

fn device_limits(device: cl_device_id) -> Result<DeviceLimits, cl_int> {
    if let Some(&l) = state().devices.get(&(device as usize)) {
        return Ok(l);
    }
    // One query answers both: the sizes come one per dimension (the host sends the
    // whole value, whatever room is offered).
    let mut sizes = [0usize; 16];
    let mut bytes = 0usize;
    // SAFETY: `sizes` is valid for its size of writes, `bytes` for one.
    let status = unsafe {
        generated::clGetDeviceInfo(
            device,
            CL_DEVICE_MAX_WORK_ITEM_SIZES,
            size_of_val(&sizes),
            sizes.as_mut_ptr().cast(),
            &mut bytes,
        )
    };
    let (max_dims, item_sizes) = if status == 0 && bytes > 0 && bytes <= size_of_val(&sizes) {
        let mut first = [usize::MAX; 3];
        let dims = bytes / size_of::<usize>();
        first[..dims.min(3)].copy_from_slice(&sizes[..dims.min(3)]);
        (dims as cl_uint, first)
    } else {
        // Asked on its own; the sizes unknown: no dimension is refused for its size.
        let max_dims: cl_uint = device_info(device, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS)?;
        (max_dims, [usize::MAX; 3])
    };
    let l = DeviceLimits {
        max_dims,
        item_sizes,
    };
    state().devices.insert(device as usize, l);
    Ok(l)
}

fn kernel_limits(kernel: cl_kernel, device: cl_device_id) -> Result<(usize, [usize; 3]), cl_int> {
    if let Some(l) = with_kernel(kernel, |m| m.limits.get(&(device as usize)).copied())? {
        return Ok(l);
    }
    let mut both = [0u8; 32];
    // SAFETY: `both` is valid for its 32 bytes of writes.
    if unsafe { generated::hiraKernelLimits(kernel, device, both.as_mut_ptr().cast()) } == 0 {
        let word = |i: usize| {
            let b: [u8; 8] = both[8 * i..8 * i + 8].try_into().unwrap_or_default();
            usize::try_from(u64::from_le_bytes(b))
        };
        if let (Ok(max), Ok(r0), Ok(r1), Ok(r2)) = (word(0), word(1), word(2), word(3)) {
            let l = (max, [r0, r1, r2]);
            with_kernel(kernel, |m| m.limits.insert(device as usize, l))?;
            return Ok(l);
        }
    }
    // An error (or a host without the call): the queries give the native codes.
    // SAFETY: `info` passes a buffer of `size` writable bytes.
    let max: usize = info(|size, value, ret| unsafe {
        generated::clGetKernelWorkGroupInfo(
            kernel,
            device,
            CL_KERNEL_WORK_GROUP_SIZE,
            size,
            value,
            ret,
        )
    })?;
    // SAFETY: as above.
    let required: [usize; 3] = info(|size, value, ret| unsafe {
        generated::clGetKernelWorkGroupInfo(
            kernel,
            device,
            CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
            size,
            value,
            ret,
        )
    })?;
    with_kernel(kernel, |m| {
        m.limits.insert(device as usize, (max, required))
    })?;
    Ok((max, required))
}

/// Checks a launch of `kernel` over `global`/`local` (`None`: host's choice).
fn check_launch(
    queue: cl_command_queue,
    kernel: cl_kernel,
    work_dim: cl_uint,
    global: Option<&[usize]>,
    local: Option<&[usize]>,
) -> Result<bool, cl_int> {
    id_of(queue.cast(), Kind::Queue)?;
    let unset = with_kernel(kernel, |m| m.kinds.is_some() && m.set.iter().any(|s| !s))?;
    if unset {
        return Err(CL_INVALID_KERNEL_ARGS);
    }
    let device = queue_device(queue)?;
    let limits = device_limits(device)?;
    if work_dim == 0 || work_dim > limits.max_dims {
        return Err(CL_INVALID_WORK_DIMENSION);
    }
    let (Some(global), Some(local)) = (global, local) else {
        return Ok(false);
    };
    let (max_wg, required) = kernel_limits(kernel, device)?;
    if local.contains(&0) {
        return Err(CL_INVALID_WORK_GROUP_SIZE);
    }
    let product = local
        .iter()
        .try_fold(1usize, |a, &l| a.checked_mul(l))
        .unwrap_or(usize::MAX);
    if required != [0, 0, 0] {
        let wanted = &required[..local.len().min(3)];
        if local != wanted {
            return Err(CL_INVALID_WORK_GROUP_SIZE);
        }
    }
    if product > max_wg {
        return Err(CL_INVALID_WORK_GROUP_SIZE);
    }
    if local
        .iter()
        .zip(limits.item_sizes.iter())
        .any(|(&l, &m)| l > m)
    {
        return Err(CL_INVALID_WORK_ITEM_SIZE);
    }
    let uneven = global.iter().zip(local).any(|(&g, &l)| g % l != 0);
    if uneven {
        return match may_be_non_uniform(kernel) {
            Some(false) => Err(CL_INVALID_WORK_GROUP_SIZE),
            // The host decides (OpenCL 2.0 programs may have non-uniform groups).
            _ => Ok(true),
        };
    }
    Ok(false)
}

/// `clEnqueueNDRangeKernel`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueNDRangeKernel(
    command_queue: cl_command_queue,
    kernel: cl_kernel,
    work_dim: cl_uint,
    _global_work_offset: *const usize,
    global_work_size: *const usize,
    local_work_size: *const usize,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    let dims = (work_dim as usize).min(3);
    // SAFETY: the application passes `work_dim` sizes where the pointer is not NULL.
    let slice =
        |p: *const usize| (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, dims) });
    let global = slice(global_work_size);
    if work_dim > 0 && work_dim <= 3 && global.is_none() {
        // Hosts disagree on a NULL global size; the host answers.
        id_of(command_queue.cast(), Kind::Queue)?;
        id_of(kernel.cast(), Kind::Kernel)?;
        return Ok(true);
    }
    check_launch(
        command_queue,
        kernel,
        work_dim,
        global,
        slice(local_work_size),
    )
}

/// `clEnqueueTask`: a launch of one work-item.
pub(crate) unsafe fn clEnqueueTask(
    command_queue: cl_command_queue,
    kernel: cl_kernel,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    check_launch(command_queue, kernel, 1, Some(&[1]), Some(&[1]))
}

use opencl_sys::CL_INVALID_OPERATION;
use opencl_sys::CL_MEM_HOST_NO_ACCESS;
use opencl_sys::CL_MEM_HOST_READ_ONLY;
use opencl_sys::CL_MEM_HOST_WRITE_ONLY;

/// What the guest knows of memory object `mem` (one lookup for all the checks).
fn mem_of(mem: cl_mem) -> Result<rt::MemExtra, cl_int> {
    let id = id_of(mem.cast(), Kind::Mem)?;
    Ok(rt::mem_extra(id).unwrap_or_default())
}

/// Whether the host-access flags forbid the host from writing (`write`) or reading
/// the object.
fn host_access_denied(m: &rt::MemExtra, write: bool) -> bool {
    let denied = if write {
        CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS
    } else {
        CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_NO_ACCESS
    };
    m.flags & denied != 0
}

/// Checks `offset..offset + size` against the buffer; `Ok(true)` when the guest does
/// not know the object's size (a sub-buffer, or not a buffer at all), so the call
/// goes synchronously and the host's answer is returned.
fn check_range(m: &rt::MemExtra, offset: usize, size: usize) -> Result<bool, cl_int> {
    match m.size {
        Some(total) if offset.checked_add(size).is_none_or(|end| end > total) => {
            Err(CL_INVALID_VALUE)
        }
        Some(_) => Ok(false),
        None => Ok(true),
    }
}

/// `clEnqueueFillImage`: the host checks the image region against the image, which the
/// guest does not know, so the call goes synchronously (fills are rare).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueFillImage(
    _command_queue: cl_command_queue,
    _image: cl_mem,
    _fill_color: *const c_void,
    _origin: *const usize,
    _region: *const usize,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    Ok(true)
}

/// `clEnqueueMigrateMemObjects`: its list, flags and contexts are checked by the host,
/// synchronously (migrations are rare).
pub(crate) unsafe fn clEnqueueMigrateMemObjects(
    _command_queue: cl_command_queue,
    _num_mem_objects: cl_uint,
    _mem_objects: *const cl_mem,
    _flags: u64,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    Ok(true)
}

/// A transfer between host memory and a buffer: range, pointer and the buffer's
/// host-access flags (`write`: the host writes the buffer).
fn check_transfer(
    queue: cl_command_queue,
    buffer: cl_mem,
    offset: usize,
    size: usize,
    ptr_is_null: bool,
    write: bool,
) -> Result<bool, cl_int> {
    id_of(queue.cast(), Kind::Queue)?;
    let m = mem_of(buffer)?;
    let unknown = check_range(&m, offset, size)?;
    rt::check_same_context(queue.cast(), &[buffer.cast()])?;
    if ptr_is_null || size == 0 {
        return Err(CL_INVALID_VALUE);
    }
    if host_access_denied(&m, write) {
        return Err(CL_INVALID_OPERATION);
    }
    Ok(unknown)
}

/// `clEnqueueWriteBuffer`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueWriteBuffer(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    _blocking_write: cl_bool,
    offset: usize,
    size: usize,
    ptr: *const c_void,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    check_transfer(command_queue, buffer, offset, size, ptr.is_null(), true)
}

/// A write forwarded without waiting must still fail at once where the host-access
/// flags forbid it, as natively.
fn check_host_write(queue: cl_command_queue, mem: cl_mem) -> Result<bool, cl_int> {
    id_of(queue.cast(), Kind::Queue)?;
    if host_access_denied(&mem_of(mem)?, true) {
        return Err(CL_INVALID_OPERATION);
    }
    Ok(false)
}

/// `clEnqueueWriteBufferRect`: the buffer's host-access flags.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueWriteBufferRect(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    _blocking_write: cl_bool,
    _buffer_origin: *const usize,
    _host_origin: *const usize,
    _region: *const usize,
    _buffer_row_pitch: usize,
    _buffer_slice_pitch: usize,
    _host_row_pitch: usize,
    _host_slice_pitch: usize,
    _ptr: *const c_void,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    check_host_write(command_queue, buffer)
}

/// `clEnqueueWriteImage`: the image's host-access flags.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueWriteImage(
    command_queue: cl_command_queue,
    image: cl_mem,
    _blocking_write: cl_bool,
    _origin: *const usize,
    _region: *const usize,
    _input_row_pitch: usize,
    _input_slice_pitch: usize,
    _ptr: *const c_void,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    check_host_write(command_queue, image)
}

/// `clEnqueueReadBuffer`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueReadBuffer(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    _blocking_read: cl_bool,
    offset: usize,
    size: usize,
    ptr: *mut c_void,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    check_transfer(command_queue, buffer, offset, size, ptr.is_null(), false)
}

/// `clEnqueueCommandBufferKHR`: without waiting when the guest knows the host runs the
/// buffer (`notes::may_enqueue`), else the host answers.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueCommandBufferKHR(
    num_queues: cl_uint,
    queues: *mut cl_command_queue,
    command_buffer: cl_command_buffer_khr,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    let buffer = id_of(command_buffer.cast(), Kind::CommandBuffer)?;
    let queue = match (num_queues, queues.is_null()) {
        (0, true) => None,
        // SAFETY: `queues` holds `num_queues` handles.
        (1, false) => Some(id_of(unsafe { *queues }.cast(), Kind::Queue)?),
        _ => return Ok(true),
    };
    Ok(!crate::notes::may_enqueue(buffer, queue))
}

/// `clFinish`: always answered by the host; notes where the enqueues it waits for end.
pub(crate) unsafe fn clFinish(command_queue: cl_command_queue) -> Result<bool, cl_int> {
    crate::notes::finish_starts(command_queue);
    Ok(true)
}

/// `clEnqueueCopyBuffer`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueCopyBuffer(
    command_queue: cl_command_queue,
    src_buffer: cl_mem,
    dst_buffer: cl_mem,
    src_offset: usize,
    dst_offset: usize,
    size: usize,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    id_of(command_queue.cast(), Kind::Queue)?;
    let unknown = check_range(&mem_of(src_buffer)?, src_offset, size)?
        | check_range(&mem_of(dst_buffer)?, dst_offset, size)?;
    if size == 0 {
        return Err(CL_INVALID_VALUE);
    }
    let overlap = src_offset < dst_offset.saturating_add(size)
        && dst_offset < src_offset.saturating_add(size);
    if src_buffer == dst_buffer && overlap {
        return Err(CL_MEM_COPY_OVERLAP);
    }
    Ok(unknown)
}

/// `clEnqueueFillBuffer`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn clEnqueueFillBuffer(
    command_queue: cl_command_queue,
    buffer: cl_mem,
    pattern: *const c_void,
    pattern_size: usize,
    offset: usize,
    size: usize,
    _num_events_in_wait_list: cl_uint,
    _event_wait_list: *const cl_event,
    _event: *mut cl_event,
) -> Result<bool, cl_int> {
    id_of(command_queue.cast(), Kind::Queue)?;
    let unknown = check_range(&mem_of(buffer)?, offset, size)?;
    rt::check_same_context(command_queue.cast(), &[buffer.cast()])?;
    let valid_pattern = pattern_size.is_power_of_two() && pattern_size <= 128;
    if pattern.is_null()
        || !valid_pattern
        || !offset.is_multiple_of(pattern_size)
        || !size.is_multiple_of(pattern_size)
    {
        return Err(CL_INVALID_VALUE);
    }
    Ok(unknown)
}

/// `CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE`.
const OUT_OF_ORDER: u64 = 1 << 0;
/// `CL_QUEUE_PROPERTIES` in a property list.
/// The key of a queue's properties in a property list (whose words are 64-bit).
const CL_QUEUE_PROPERTIES: u64 = opencl_sys::CL_QUEUE_PROPERTIES as u64;

/// `clCreateCommandQueue`: the host checks the properties.
pub(crate) unsafe fn clCreateCommandQueue(
    _context: cl_context,
    _device: cl_device_id,
    _properties: u64,
    _errcode_ret: *mut cl_int,
) -> Result<bool, cl_int> {
    Ok(false)
}

/// Whether a queue runs its commands in order matters to how writes are forwarded
/// (see `Call::early_return`).
pub(crate) unsafe fn clCreateCommandQueue_created(
    queue: *mut c_void,
    _context: cl_context,
    device: cl_device_id,
    properties: u64,
    _errcode_ret: *mut cl_int,
) {
    note_queue_device(queue, device);
    if properties & OUT_OF_ORDER != 0 {
        rt::note_out_of_order(queue);
    }
}

/// `clCreateCommandQueueWithProperties`: the host checks the list.
pub(crate) unsafe fn clCreateCommandQueueWithProperties(
    _context: cl_context,
    _device: cl_device_id,
    _properties: *const u64,
    _errcode_ret: *mut cl_int,
) -> Result<bool, cl_int> {
    Ok(false)
}

/// As for `clCreateCommandQueue`, from the property list (which the host accepted, so
/// it is well formed and zero-terminated).
pub(crate) unsafe fn clCreateCommandQueueWithProperties_created(
    queue: *mut c_void,
    _context: cl_context,
    device: cl_device_id,
    properties: *const u64,
    _errcode_ret: *mut cl_int,
) {
    note_queue_device(queue, device);
    if properties.is_null() {
        return;
    }
    let mut i = 0;
    loop {
        // SAFETY: key/value pairs up to a zero key, as the host read them.
        let (key, value) = unsafe { (*properties.add(i), *properties.add(i + 1)) };
        if key == 0 {
            return;
        }
        if key == CL_QUEUE_PROPERTIES && value & OUT_OF_ORDER != 0 {
            rt::note_out_of_order(queue);
        }
        i += 2;
    }
}
