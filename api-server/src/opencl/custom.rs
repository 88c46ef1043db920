//! Host calls that need more than a direct call.
//!
//! A guest sees one host platform (the one this server was configured with) and its
//! devices, whatever else the host has.

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_void};

use opencl_sys::{
    CL_CONTEXT_DEVICES, CL_KERNEL_ARG_ADDRESS_QUALIFIER, CL_KERNEL_ARG_INFO_NOT_AVAILABLE,
    CL_KERNEL_ARG_NAME, CL_KERNEL_CONTEXT, CL_KERNEL_PROGRAM, cl_bool, cl_command_queue,
    cl_context, cl_device_id, cl_device_type, cl_event, cl_int, cl_kernel, cl_mem, cl_platform_id,
    cl_program, cl_uint,
};

use hira_apis_opencl::ARG_INFO_FOR_SHIM;

use super::Session;
pub use super::command_buffer::{
    clCommandBarrierWithWaitListKHR, clCommandCopyBufferKHR, clCommandCopyBufferRectKHR,
    clCommandCopyBufferToImageKHR, clCommandCopyImageKHR, clCommandCopyImageToBufferKHR,
    clCommandFillBufferKHR, clCommandFillImageKHR, clCommandNDRangeKernelKHR,
    clCreateCommandBufferKHR, clEnqueueCommandBufferKHR, clFinalizeCommandBufferKHR,
    clGetCommandBufferInfoKHR, clReleaseCommandBufferKHR, clRetainCommandBufferKHR,
};
pub use super::content_size::clSetContentSizeBufferPoCL;
use super::device_time::{CL_QUEUE_PROFILING_ENABLE, DeviceTime};
use super::queues::info_value;
pub use super::zero_copy::{hiraMapWindow, hiraUnmapWindow, hiraWindowReleased};

use opencl_sys::CL_INVALID_ARG_VALUE;
use opencl_sys::CL_INVALID_PLATFORM;
use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_KERNEL_EXEC_INFO_SVM_PTRS;
use opencl_sys::CL_PROFILING_INFO_NOT_AVAILABLE;

/// Lists the one platform this server exposes.
///
/// # Safety
/// `platforms` must be null or valid for `num_entries` writes; `num_platforms` null or
/// valid for one write.
pub unsafe fn clGetPlatformIDs(
    s: &mut Session<'_>,
    num_entries: cl_uint,
    platforms: *mut cl_platform_id,
    num_platforms: *mut cl_uint,
) -> Option<cl_int> {
    if (num_entries == 0 && !platforms.is_null())
        || (platforms.is_null() && num_platforms.is_null())
    {
        return Some(CL_INVALID_VALUE);
    }
    if !platforms.is_null() {
        // SAFETY: valid for num_entries >= 1 writes.
        unsafe { *platforms = s.platform() };
    }
    if !num_platforms.is_null() {
        // SAFETY: valid for one write.
        unsafe { *num_platforms = 1 };
    }
    Some(0)
}

/// Lists devices of the exposed platform (a null platform means that one too).
///
/// # Safety
/// As `clGetDeviceIDs`.
pub unsafe fn clGetDeviceIDs(
    s: &mut Session<'_>,
    platform: cl_platform_id,
    device_type: cl_device_type,
    num_entries: cl_uint,
    devices: *mut cl_device_id,
    num_devices: *mut cl_uint,
) -> Option<cl_int> {
    if !platform.is_null() && platform != s.platform() {
        return Some(CL_INVALID_PLATFORM);
    }
    s.rt()
        .clGetDeviceIDs(s.platform(), device_type, num_entries, devices, num_devices)
}

type ProgramNotify = Option<unsafe extern "C" fn(cl_program, *mut c_void)>;

/// `clCreateProgramWithSource`, with absolute `#include` names moved into the build
/// mirror (see [`super::builds`]): the host compiler never opens a path the guest
/// named. Sources without one are passed as they came.
///
/// # Safety
/// `strings` must be null or hold `count` pointers, each valid for `lengths[i]` bytes
/// (`lengths` non-null whenever `strings` is, as decoded from the frame).
pub unsafe fn clCreateProgramWithSource(
    s: &mut Session<'_>,
    context: cl_context,
    count: cl_uint,
    strings: *mut *const c_char,
    lengths: *const usize,
    errcode_ret: *mut cl_int,
) -> Option<cl_program> {
    let rt = s.rt();
    let forward = || rt.clCreateProgramWithSource(context, count, strings, lengths, errcode_ret);
    if strings.is_null() || lengths.is_null() {
        return forward();
    }
    let mut texts = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        // SAFETY: per the contract, `count` pointers and lengths.
        let (p, len) = unsafe { (*strings.add(i), *lengths.add(i)) };
        if p.is_null() {
            return forward();
        }
        texts.push((p, len));
    }
    let root = super::builds::mirror_root();
    let rewrites: Vec<Option<Vec<u8>>> = texts
        .iter()
        .map(|&(p, len)| {
            // SAFETY: valid for `len` bytes per the contract.
            let text = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
            super::builds::rewrite_absolute_includes(text, root).map(|mut t| {
                // NUL-terminated, as the decoded strings are.
                t.push(0);
                t
            })
        })
        .collect();
    if rewrites.iter().all(Option::is_none) {
        return forward();
    }
    let (ptrs, lens): (Vec<*const c_char>, Vec<usize>) = texts
        .iter()
        .zip(&rewrites)
        .map(|(&(p, len), r)| match r {
            Some(t) => (t.as_ptr().cast(), t.len() - 1),
            None => (p, len),
        })
        .unzip();
    rt.clCreateProgramWithSource(
        context,
        count,
        ptrs.as_ptr().cast_mut(),
        lens.as_ptr(),
        errcode_ret,
    )
}

/// Keeps the headers the guest ships for `program`'s next build.
///
/// # Safety
/// `cwd` must be null or NUL-terminated; `files` valid for `files_len` reads.
pub unsafe fn hiraBuildFiles(
    s: &mut Session<'_>,
    program: cl_program,
    cwd: *const c_char,
    files_len: usize,
    files: *const c_void,
) -> Option<cl_int> {
    if cwd.is_null() || files.is_null() {
        return Some(CL_INVALID_VALUE);
    }
    // SAFETY: NUL-terminated per the contract.
    let cwd = unsafe { CStr::from_ptr(cwd) }.to_string_lossy();
    // SAFETY: valid for `files_len` reads per the contract (possibly in the window).
    let blob = unsafe { super::args::copy_in(files, files_len) };
    match super::builds::parse(&cwd, &blob) {
        Ok(staged) => {
            s.builds().stage(program as usize, staged);
            Some(0)
        }
        Err(code) => Some(code),
    }
}

/// `clBuildProgram` with the headers the guest shipped, if any.
///
/// # Safety
/// As `clBuildProgram`.
pub unsafe fn clBuildProgram(
    s: &mut Session<'_>,
    program: cl_program,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    pfn_notify: ProgramNotify,
    user_data: *mut c_void,
) -> Option<cl_int> {
    let rt = s.rt();
    // SAFETY: null or NUL-terminated, as decoded.
    let guest = (!options.is_null()).then(|| unsafe { CStr::from_ptr(options) });
    s.builds().run(program as usize, guest, |opts| {
        rt.clBuildProgram(
            program,
            num_devices,
            device_list,
            opts,
            pfn_notify,
            user_data,
        )
    })
}

/// `clCompileProgram` with the headers the guest shipped, if any.
///
/// # Safety
/// As `clCompileProgram`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn clCompileProgram(
    s: &mut Session<'_>,
    program: cl_program,
    num_devices: cl_uint,
    device_list: *const cl_device_id,
    options: *const c_char,
    num_input_headers: cl_uint,
    input_headers: *const cl_program,
    header_include_names: *mut *const c_char,
    pfn_notify: ProgramNotify,
    user_data: *mut c_void,
) -> Option<cl_int> {
    let rt = s.rt();
    // SAFETY: null or NUL-terminated, as decoded.
    let guest = (!options.is_null()).then(|| unsafe { CStr::from_ptr(options) });
    s.builds().run(program as usize, guest, |opts| {
        rt.clCompileProgram(
            program,
            num_devices,
            device_list,
            opts,
            num_input_headers,
            input_headers,
            header_include_names as _,
            pfn_notify,
            user_data,
        )
    })
}

/// `clGetKernelArgInfo` as natively for a program the guest built without
/// `-cl-kernel-arg-info`: the API server always adds the option (it needs argument
/// types), so where the host would have had no information the application gets
/// `CL_KERNEL_ARG_INFO_NOT_AVAILABLE`. Which queries those are is the host's answer
/// for a probe program built the guest's way, asked once. The shim's own queries
/// ([`ARG_INFO_FOR_SHIM`]) are answered. `Ok`: the parameter to ask the host for.
pub fn clGetKernelArgInfo(
    s: &mut Session<'_>,
    kernel: cl_kernel,
    arg_indx: cl_uint,
    param_name: u32,
) -> Result<u32, cl_int> {
    if param_name & ARG_INFO_FOR_SHIM != 0 {
        return Ok(param_name & !ARG_INFO_FOR_SHIM);
    }
    match arg_info_withheld(s, kernel, arg_indx, param_name) {
        Some(code) => Err(code),
        None => Ok(param_name),
    }
}

/// A handle-valued info answer: `query(size, value)` writes one pointer.
fn handle_info<T>(query: impl FnOnce(usize, *mut c_void) -> Option<cl_int>) -> Option<*mut T> {
    let mut v: *mut T = std::ptr::null_mut();
    (query(size_of::<*mut T>(), (&raw mut v).cast()) == Some(0)).then_some(v)
}

/// The code the application gets instead of the host's answer, if any.
fn arg_info_withheld(
    s: &mut Session<'_>,
    kernel: cl_kernel,
    arg_indx: cl_uint,
    param_name: u32,
) -> Option<cl_int> {
    if !(CL_KERNEL_ARG_ADDRESS_QUALIFIER..=CL_KERNEL_ARG_NAME).contains(&param_name) {
        return None;
    }
    let rt = s.rt();
    let program: cl_program = handle_info(|size, value| {
        rt.clGetKernelInfo(kernel, CL_KERNEL_PROGRAM, size, value, std::ptr::null_mut())
    })?;
    let options_given = s.builds().built_without_arg_info(program as usize)?;
    // The host's own errors (an argument index out of range) come first.
    let mut size = 0usize;
    let st = rt.clGetKernelArgInfo(
        kernel,
        arg_indx,
        param_name,
        0,
        std::ptr::null_mut(),
        &mut size,
    );
    if st != Some(0) {
        return None;
    }
    let unavailable = s
        .builds()
        .unavailable_arg_info(options_given, || probe_arg_info(rt, kernel, options_given));
    (unavailable & (1 << (param_name - CL_KERNEL_ARG_ADDRESS_QUALIFIER)) != 0)
        .then_some(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
}

/// Builds a one-kernel program in `kernel`'s context without `-cl-kernel-arg-info`
/// (no options, or empty ones) and returns which argument queries the host refuses.
fn probe_arg_info(rt: &super::OpenCl, kernel: cl_kernel, options_given: bool) -> u8 {
    let null: *mut c_void = std::ptr::null_mut();
    let Some(context) = handle_info(|size, value| {
        rt.clGetKernelInfo(kernel, CL_KERNEL_CONTEXT, size, value, std::ptr::null_mut())
    }) else {
        return 0;
    };
    // The context's first device.
    let Some(device) = handle_info(|size, value| {
        rt.clGetContextInfo(
            context,
            CL_CONTEXT_DEVICES,
            size,
            value,
            std::ptr::null_mut(),
        )
    }) else {
        return 0;
    };
    let srcs = [c"kernel void hira_probe(global int *a) { a[0] = 0; }".as_ptr()];
    let mut err = 0;
    let Some(program) = rt
        .clCreateProgramWithSource(
            context,
            1,
            srcs.as_ptr().cast_mut(),
            std::ptr::null(),
            &mut err,
        )
        .filter(|p| !p.is_null())
    else {
        return 0;
    };
    let options = if options_given {
        c"".as_ptr()
    } else {
        std::ptr::null()
    };
    let mut unavailable = 0u8;
    if rt.clBuildProgram(program, 1, &device, options, None, null) == Some(0)
        && let Some(k) = rt
            .clCreateKernel(program, c"hira_probe".as_ptr(), &mut err)
            .filter(|k| !k.is_null())
    {
        for p in CL_KERNEL_ARG_ADDRESS_QUALIFIER..=CL_KERNEL_ARG_NAME {
            let mut size = 0usize;
            let st = rt.clGetKernelArgInfo(k, 0, p, 0, null, &mut size);
            if st == Some(CL_KERNEL_ARG_INFO_NOT_AVAILABLE) {
                unavailable |= 1 << (p - CL_KERNEL_ARG_ADDRESS_QUALIFIER);
            }
        }
        rt.clReleaseKernel(k);
    }
    rt.clReleaseProgram(program);
    unavailable
}

/// Stages a chunk of an input too large for a frame or the window.
///
/// # Safety
/// `data` must be valid for `len` reads.
pub unsafe fn hiraStage(
    s: &mut Session<'_>,
    token: u64,
    total: u64,
    offset: u64,
    len: usize,
    data: *const c_void,
) -> Option<cl_int> {
    let (Ok(total), Ok(offset)) = (usize::try_from(total), usize::try_from(offset)) else {
        return Some(CL_INVALID_VALUE);
    };
    if data.is_null() && len != 0 {
        return Some(CL_INVALID_VALUE);
    }
    // SAFETY: valid for `len` reads per the contract (possibly in the window).
    Some(unsafe { s.staging().stage(token, total, offset, data.cast(), len) })
}

/// A kernel's largest and required work-group sizes on `device` at once (see
/// `hiraKernelLimits` in `protocol/api/opencl.api`).
///
/// # Safety
/// `info` must be valid for 32 writes.
pub unsafe fn hiraKernelLimits(
    s: &mut Session<'_>,
    kernel: cl_kernel,
    device: cl_device_id,
    info: *mut c_void,
) -> Option<cl_int> {
    if info.is_null() {
        return Some(CL_INVALID_VALUE);
    }
    let rt = s.rt();
    let mut max = 0usize;
    let st = rt.clGetKernelWorkGroupInfo(
        kernel,
        device,
        opencl_sys::CL_KERNEL_WORK_GROUP_SIZE,
        size_of::<usize>(),
        (&raw mut max).cast(),
        std::ptr::null_mut(),
    );
    if st != Some(0) {
        return st;
    }
    let mut required = [0usize; 3];
    let st = rt.clGetKernelWorkGroupInfo(
        kernel,
        device,
        opencl_sys::CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
        size_of_val(&required),
        required.as_mut_ptr().cast(),
        std::ptr::null_mut(),
    );
    if st != Some(0) {
        return st;
    }
    let mut out = [0u8; 32];
    for (c, v) in out
        .chunks_mut(8)
        .zip([max, required[0], required[1], required[2]])
    {
        c.copy_from_slice(&(v as u64).to_le_bytes());
    }
    // SAFETY: valid for 32 writes per the contract.
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), info.cast::<u8>(), out.len()) };
    Some(0)
}

/// Every argument's address qualifier, type qualifier and type name, for the shim (see
/// `hiraKernelArgInfo` in `protocol/api/opencl.api`), from the argument information
/// the API server always builds with.
///
/// # Safety
/// `info` must be valid for `len` writes.
pub unsafe fn hiraKernelArgInfo(
    s: &mut Session<'_>,
    kernel: cl_kernel,
    count: cl_uint,
    len: usize,
    info: *mut c_void,
) -> Option<cl_int> {
    if info.is_null() {
        return Some(CL_INVALID_VALUE);
    }
    let rt = s.rt();
    let mut n: cl_uint = 0;
    let st = rt.clGetKernelInfo(
        kernel,
        opencl_sys::CL_KERNEL_NUM_ARGS,
        size_of::<cl_uint>(),
        (&raw mut n).cast(),
        std::ptr::null_mut(),
    );
    if st != Some(0) {
        return st;
    }
    // A count of 0 asks for the kernel's own, written after the byte count.
    let any = count == 0;
    if !any && n != count {
        return Some(CL_INVALID_VALUE);
    }
    let mut blob = vec![0u8; 4];
    if any {
        blob.extend_from_slice(&n.to_le_bytes());
    }
    for i in 0..n {
        let mut address = [0u8; 4];
        let mut qualifier = [0u8; 8];
        let mut name_len = 0usize;
        let (null, no_size) = (
            std::ptr::null_mut::<c_void>(),
            std::ptr::null_mut::<usize>(),
        );
        for (param, out) in [
            (CL_KERNEL_ARG_ADDRESS_QUALIFIER, &mut address[..]),
            (opencl_sys::CL_KERNEL_ARG_TYPE_QUALIFIER, &mut qualifier[..]),
        ] {
            let st = rt.clGetKernelArgInfo(
                kernel,
                i,
                param,
                out.len(),
                out.as_mut_ptr().cast(),
                no_size,
            );
            if st != Some(0) {
                return st;
            }
        }
        let st = rt.clGetKernelArgInfo(
            kernel,
            i,
            opencl_sys::CL_KERNEL_ARG_TYPE_NAME,
            0,
            null,
            &mut name_len,
        );
        if st != Some(0) {
            return st;
        }
        let mut name = vec![0u8; name_len];
        let st = rt.clGetKernelArgInfo(
            kernel,
            i,
            opencl_sys::CL_KERNEL_ARG_TYPE_NAME,
            name.len(),
            name.as_mut_ptr().cast(),
            no_size,
        );
        if st != Some(0) {
            return st;
        }
        let name = std::ffi::CStr::from_bytes_until_nul(&name).map_or(&[][..], |c| c.to_bytes());
        blob.extend_from_slice(&address);
        blob.extend_from_slice(&qualifier);
        blob.extend_from_slice(&u32::try_from(name.len()).unwrap_or(u32::MAX).to_le_bytes());
        blob.extend_from_slice(name);
    }
    if blob.len() > len {
        return Some(opencl_sys::CL_OUT_OF_RESOURCES);
    }
    let total = u32::try_from(blob.len()).unwrap_or(u32::MAX);
    blob[..4].copy_from_slice(&total.to_le_bytes());
    // SAFETY: valid for `len` writes per the contract, and `blob` is no longer.
    unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), info.cast::<u8>(), blob.len()) };
    Some(0)
}

/// Copies a chunk of a staged output.
///
/// # Safety
/// `data` must be valid for `len` writes.
pub unsafe fn hiraFetch(
    s: &mut Session<'_>,
    token: u64,
    offset: u64,
    len: usize,
    data: *mut c_void,
) -> Option<cl_int> {
    let Ok(offset) = usize::try_from(offset) else {
        return Some(CL_INVALID_VALUE);
    };
    if data.is_null() {
        return Some(CL_INVALID_VALUE);
    }
    // SAFETY: valid for `len` writes per the contract (possibly in the window).
    Some(unsafe { s.staging().fetch(token, offset, data.cast(), len) })
}

/// `clSVMAlloc` for the guest's allocation `id`.
///
/// # Safety
/// As `clSVMAlloc`.
pub unsafe fn hiraSVMAlloc(
    s: &mut Session<'_>,
    context: cl_context,
    flags: u64,
    size: usize,
    alignment: cl_uint,
    id: u64,
    address: *mut u64,
) -> Option<cl_int> {
    match s.svm().alloc(s.rt(), context, flags, size, alignment, id) {
        Ok(a) => {
            if !address.is_null() {
                // SAFETY: the decoded output slot, valid for one write.
                unsafe { *address = a };
            }
            Some(0)
        }
        Err(code) => Some(code),
    }
}

/// `clSVMFree` of the guest's allocation `id`.
///
/// # Safety
/// As `clSVMFree`.
pub unsafe fn hiraSVMFree(s: &mut Session<'_>, _context: cl_context, id: u64) -> Option<cl_int> {
    Some(s.svm().free(s.rt(), id))
}

/// `clEnqueueSVMMemcpy` from allocation `id` into an output.
///
/// # Safety
/// As `clEnqueueSVMMemcpy`; `ptr` valid for `size` writes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn hiraSVMRead(
    s: &mut Session<'_>,
    command_queue: cl_command_queue,
    blocking_read: cl_bool,
    id: u64,
    offset: usize,
    size: usize,
    ptr: *mut c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> Option<cl_int> {
    let src = match s.svm().ptr(id, offset, size) {
        Ok(p) => p,
        Err(code) => return Some(code),
    };
    s.rt().clEnqueueSVMMemcpy(
        command_queue,
        blocking_read,
        ptr,
        src,
        size,
        num_events_in_wait_list,
        event_wait_list,
        event,
    )
}

/// `clEnqueueSVMMemcpy` of guest data into allocation `id`.
///
/// # Safety
/// As `clEnqueueSVMMemcpy`; `ptr` valid for `size` reads until the copy completes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn hiraSVMWrite(
    s: &mut Session<'_>,
    command_queue: cl_command_queue,
    blocking_write: cl_bool,
    id: u64,
    offset: usize,
    size: usize,
    ptr: *const c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> Option<cl_int> {
    let dst = match s.svm().ptr(id, offset, size) {
        Ok(p) => p,
        Err(code) => return Some(code),
    };
    s.rt().clEnqueueSVMMemcpy(
        command_queue,
        blocking_write,
        dst,
        ptr,
        size,
        num_events_in_wait_list,
        event_wait_list,
        event,
    )
}

/// `clEnqueueSVMMemcpy` between two allocations.
///
/// # Safety
/// As `clEnqueueSVMMemcpy`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn hiraSVMCopy(
    s: &mut Session<'_>,
    command_queue: cl_command_queue,
    blocking_copy: cl_bool,
    dst_id: u64,
    dst_offset: usize,
    src_id: u64,
    src_offset: usize,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> Option<cl_int> {
    let (dst, src) = match (
        s.svm().ptr(dst_id, dst_offset, size),
        s.svm().ptr(src_id, src_offset, size),
    ) {
        (Ok(d), Ok(p)) => (d, p),
        (Err(code), _) | (_, Err(code)) => return Some(code),
    };
    s.rt().clEnqueueSVMMemcpy(
        command_queue,
        blocking_copy,
        dst,
        src,
        size,
        num_events_in_wait_list,
        event_wait_list,
        event,
    )
}

/// `clEnqueueSVMMemFill` of allocation `id`.
///
/// # Safety
/// As `clEnqueueSVMMemFill`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn hiraSVMFill(
    s: &mut Session<'_>,
    command_queue: cl_command_queue,
    id: u64,
    offset: usize,
    pattern: *const c_void,
    pattern_size: usize,
    size: usize,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> Option<cl_int> {
    let dst = match s.svm().ptr(id, offset, size) {
        Ok(p) => p,
        Err(code) => return Some(code),
    };
    s.rt().clEnqueueSVMMemFill(
        command_queue,
        dst,
        pattern,
        pattern_size,
        size,
        num_events_in_wait_list,
        event_wait_list,
        event,
    )
}

/// `clSetKernelArgSVMPointer` with a pointer into allocation `id` (0: NULL), for a
/// pointer argument only.
///
/// # Safety
/// As `clSetKernelArgSVMPointer`.
pub unsafe fn hiraSetKernelArgSVM(
    s: &mut Session<'_>,
    kernel: cl_kernel,
    arg_index: cl_uint,
    id: u64,
    offset: usize,
) -> Option<cl_int> {
    if let Err(code) = s.svm_arg_allowed(kernel, arg_index) {
        return Some(code);
    }
    let ptr = if id == 0 {
        std::ptr::null_mut()
    } else {
        match s.svm().ptr(id, offset, 0) {
            Ok(p) => p,
            Err(_) => return Some(CL_INVALID_ARG_VALUE),
        }
    };
    s.rt().clSetKernelArgSVMPointer(kernel, arg_index, ptr)
}

/// `clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_PTRS)` with `count` (id, offset) pairs.
///
/// # Safety
/// `ids` must be valid for `count * 16` reads.
pub unsafe fn hiraSetKernelExecInfoSVM(
    s: &mut Session<'_>,
    kernel: cl_kernel,
    count: cl_uint,
    ids: *const c_void,
) -> Option<cl_int> {
    if count == 0 {
        return s.rt().clSetKernelExecInfo(
            kernel,
            CL_KERNEL_EXEC_INFO_SVM_PTRS,
            0,
            std::ptr::null(),
        );
    }
    // SAFETY: valid for `count * 16` reads per the contract (possibly in the window).
    let raw = unsafe { super::args::copy_in(ids, count as usize * 16) };
    let mut ptrs = Vec::with_capacity(count as usize);
    for pair in raw.chunks_exact(16) {
        let id = u64::from_le_bytes(pair[..8].try_into().unwrap_or_default());
        let off = u64::from_le_bytes(pair[8..].try_into().unwrap_or_default()) as usize;
        match s.svm().ptr(id, off, 0) {
            Ok(p) => ptrs.push(p),
            Err(code) => return Some(code),
        }
    }
    s.rt().clSetKernelExecInfo(
        kernel,
        CL_KERNEL_EXEC_INFO_SVM_PTRS,
        ptrs.len() * size_of::<*mut c_void>(),
        ptrs.as_ptr().cast(),
    )
}

/// `clEnqueueSVMFree` of `count` allocations; the host frees them once the command
/// runs.
///
/// # Safety
/// `ids` must be valid for `count * 8` reads; the rest as `clEnqueueSVMFree`.
pub unsafe fn hiraSVMEnqueueFree(
    s: &mut Session<'_>,
    command_queue: cl_command_queue,
    count: cl_uint,
    ids: *const c_void,
    num_events_in_wait_list: cl_uint,
    event_wait_list: *const cl_event,
    event: *mut cl_event,
) -> Option<cl_int> {
    // SAFETY: valid for `count * 8` reads per the contract (possibly in the window).
    let raw = unsafe { super::args::copy_in(ids, count as usize * 8) };
    let mut ptrs = Vec::with_capacity(count as usize);
    for id in raw.chunks_exact(8) {
        let id = u64::from_le_bytes(id.try_into().unwrap_or_default());
        if s.svm().ptr(id, 0, 0).is_err() {
            return Some(CL_INVALID_VALUE);
        }
        ptrs.push(id);
    }
    let mut host: Vec<*mut c_void> = Vec::with_capacity(ptrs.len());
    for id in ptrs {
        match s.svm().take(id) {
            Ok(p) => host.push(p),
            Err(code) => return Some(code),
        }
    }
    // The host may read the array when the command runs: it is kept until then, on
    // an event of the server's own when the guest asked for none.
    let mut bytes: Box<[u8]> = host
        .iter()
        .flat_map(|p| (*p as usize).to_ne_bytes())
        .collect();
    let mut own: cl_event = std::ptr::null_mut();
    let ev: *mut cl_event = if event.is_null() { &mut own } else { event };
    let status = s.rt().clEnqueueSVMFree(
        command_queue,
        count,
        bytes.as_mut_ptr().cast(),
        None,
        std::ptr::null_mut(),
        num_events_in_wait_list,
        event_wait_list,
        ev,
    );
    if let Some(st) = status {
        // SAFETY: `ev` points to the event slot the host just wrote (or left null).
        let e = unsafe { *ev };
        s.free_when_complete(st, e, bytes, event.is_null());
    }
    status
}

/// `clCreateCommandQueue` with profiling on, so that the server can time each command;
/// the guest sees the properties it asked for (see `device_time.rs`).
///
/// # Safety
/// As `clCreateCommandQueue`.
pub unsafe fn clCreateCommandQueue(
    s: &mut Session<'_>,
    context: cl_context,
    device: cl_device_id,
    properties: u64,
    errcode_ret: *mut cl_int,
) -> Option<cl_command_queue> {
    let host = DeviceTime::host_properties(properties);
    #[allow(deprecated)]
    let q = s
        .rt()
        .clCreateCommandQueue(context, device, host, errcode_ret)?;
    if !q.is_null() {
        s.device_time()
            .queue_created(q, properties & CL_QUEUE_PROFILING_ENABLE != 0, None);
    }
    Some(q)
}

/// `clCreateCommandQueueWithProperties` with profiling on; `CL_QUEUE_PROPERTIES_ARRAY`
/// reads back as the guest gave it.
///
/// # Safety
/// As `clCreateCommandQueueWithProperties`; `properties` null or zero-terminated.
pub unsafe fn clCreateCommandQueueWithProperties(
    s: &mut Session<'_>,
    context: cl_context,
    device: cl_device_id,
    properties: *const u64,
    errcode_ret: *mut cl_int,
) -> Option<cl_command_queue> {
    let guest: Vec<u64> = if properties.is_null() {
        Vec::new()
    } else {
        let mut v = Vec::new();
        // SAFETY: zero-terminated key-value pairs per the contract (the decoder
        // guarantees the terminator).
        unsafe {
            let mut i = 0;
            loop {
                let k = *properties.add(i);
                v.push(k);
                if k == 0 {
                    break;
                }
                v.push(*properties.add(i + 1));
                i += 2;
            }
        }
        v
    };
    let (host, profiling) = DeviceTime::host_property_list(&guest);
    let q =
        s.rt()
            .clCreateCommandQueueWithProperties(context, device, host.as_ptr(), errcode_ret)?;
    if !q.is_null() {
        s.device_time()
            .queue_created(q, profiling, (!properties.is_null()).then_some(guest));
    }
    Some(q)
}

/// A profiling query on an event of a queue the guest made without profiling gets
/// the error a host would give (the server turned profiling on for its own timing).
pub fn clGetEventProfilingInfo(
    s: &mut Session<'_>,
    event: cl_event,
    param_name: u32,
) -> Result<u32, cl_int> {
    if s.device_time().event_profiling(event) {
        Ok(param_name)
    } else {
        Err(CL_PROFILING_INFO_NOT_AVAILABLE)
    }
}

/// Writes a chunk of a buffer's streamed initial contents (`tag::STREAMED`) on the
/// server's own queue for the buffer's context. A chunk with a `token` and not
/// `blocking` stays in the window until the host has read it (`OUTPUT_DONE`); any
/// other completes before the reply, and a blocking one after every chunk before it.
///
/// # Safety
/// `data` must be null or valid for `size` reads until the write completes.
pub unsafe fn hiraFill(
    s: &mut Session<'_>,
    mem: u64,
    offset: usize,
    size: usize,
    data: *const c_void,
    blocking: cl_uint,
    token: u64,
) -> Option<cl_int> {
    use opencl_sys::CL_INVALID_MEM_OBJECT;
    use opencl_sys::CL_MEM_CONTEXT;
    use opencl_sys::CL_OUT_OF_RESOURCES;
    let Ok(m) = s.lookup(mem, hira_apis_opencl::Kind::Mem, false) else {
        return Some(CL_INVALID_MEM_OBJECT);
    };
    if data.is_null() {
        return Some(CL_INVALID_VALUE);
    }
    let rt = s.rt();
    let m: cl_mem = m.cast();
    let ctx: Option<cl_context> =
        info_value(|n, p, r| rt.clGetMemObjectInfo(m, CL_MEM_CONTEXT, n, p, r));
    let Some(q) = ctx.and_then(|c| {
        s.fill_queue(c)
            .map_err(|e| log::warn!("streamed contents: {e}"))
            .ok()
    }) else {
        return Some(CL_OUT_OF_RESOURCES);
    };
    let kept = blocking == 0 && token != 0 && s.may_defer().is_ok();
    let mut ev: cl_event = std::ptr::null_mut();
    let status = rt.clEnqueueWriteBuffer(
        q,
        m,
        if kept { 0 } else { 1 },
        offset,
        size,
        data,
        0,
        std::ptr::null(),
        if kept { &mut ev } else { std::ptr::null_mut() },
    )?;
    if kept {
        rt.clFlush(q);
    }
    if token != 0 {
        s.window_read_when_complete(token, status, ev, kept);
    }
    Some(status)
}
