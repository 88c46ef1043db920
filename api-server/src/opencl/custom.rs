//! Host calls that need more than a direct call.
//!
//! A guest sees one host platform (the one this server was configured with) and its
//! devices, whatever else the host has.

#![allow(non_snake_case)]

use std::ffi::{CStr, c_char, c_void};

use opencl_sys::{cl_device_id, cl_device_type, cl_int, cl_platform_id, cl_program, cl_uint};

use super::Session;

const CL_INVALID_VALUE: cl_int = -30;
const CL_INVALID_PLATFORM: cl_int = -32;

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
    // SAFETY: valid for `files_len` reads per the contract.
    let blob = unsafe { std::slice::from_raw_parts(files.cast::<u8>(), files_len) };
    match super::builds::parse(&cwd, blob) {
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
    let chunk = if len == 0 {
        &[][..]
    } else {
        // SAFETY: valid for `len` reads per the contract.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
    };
    Some(s.staging().stage(token, total, offset, chunk))
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
    // SAFETY: valid for `len` writes per the contract.
    let dst = unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), len) };
    Some(s.staging().fetch(token, offset, dst))
}
