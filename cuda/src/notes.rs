//! What the guest notes after calls succeed (`noted` in the description): the
//! device memory of each context, so that its checks can tell a copy or memset the
//! driver would refuse at once (outside every allocation) from one that may go
//! without waiting.

#![allow(non_snake_case)]

use std::ffi::c_char;

use crate::rt::{self, CUmodule};

pub(crate) fn cuMemAlloc_v2(dptr: *mut u64, bytesize: usize) {
    if !dptr.is_null() {
        // SAFETY: the call wrote the address there (it succeeded).
        let base = unsafe { *dptr };
        rt::note_allocation(base, bytesize as u64, None);
    }
}

pub(crate) fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    _width: usize,
    height: usize,
    _element_size: std::ffi::c_uint,
) {
    if !dptr.is_null() && !pitch.is_null() {
        // SAFETY: the call wrote both (it succeeded).
        let (base, pitch) = unsafe { (*dptr, *pitch) };
        rt::note_allocation(base, (pitch as u64).saturating_mul(height as u64), None);
    }
}

pub(crate) fn cuMemFree_v2(dptr: u64) {
    rt::forget_allocation(dptr);
}

pub(crate) fn cuModuleGetGlobal_v2(
    dptr: *mut u64,
    bytes: *mut usize,
    hmod: CUmodule,
    _name: *const c_char,
) {
    if dptr.is_null() || bytes.is_null() {
        return;
    }
    // SAFETY: the call wrote both (it succeeded).
    let (base, size) = unsafe { (*dptr, *bytes) };
    rt::note_allocation(base, size as u64, Some(hmod as usize as u64));
}

/// A function's largest dynamic shared memory changed: launches are checked against
/// the new value.
pub(crate) fn cuFuncSetAttribute(
    hfunc: crate::rt::CUfunction,
    attrib: std::ffi::c_int,
    value: std::ffi::c_int,
) {
    // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
    if attrib == 8 {
        rt::set_max_dynamic_shared(hfunc as usize as u64, u32::try_from(value).unwrap_or(0));
    }
}

pub(crate) fn cuLibraryGetGlobal(
    dptr: *mut u64,
    bytes: *mut usize,
    library: crate::rt::CUlibrary,
    name: *const c_char,
) {
    cuModuleGetGlobal_v2(dptr, bytes, library, name);
}

/// The primary context's state ended, and with it what the runtime kept in it.
pub(crate) fn cuDevicePrimaryCtxReset_v2(dev: std::ffi::c_int) {
    crate::private::primary_reset(dev);
}

/// As `cuFuncSetAttribute`, for a library's kernel.
pub(crate) fn cuKernelSetAttribute(
    attrib: std::ffi::c_int,
    value: std::ffi::c_int,
    kernel: crate::rt::CUfunction,
    _dev: std::ffi::c_int,
) {
    cuFuncSetAttribute(kernel, attrib, value);
}
