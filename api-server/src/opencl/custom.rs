//! Host calls that need more than a direct call.
//!
//! A guest sees one host platform (the one this server was configured with) and its
//! devices, whatever else the host has.

#![allow(non_snake_case)]

use opencl_sys::{cl_device_id, cl_device_type, cl_int, cl_platform_id, cl_uint};

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
