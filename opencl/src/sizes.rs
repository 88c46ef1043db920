//! Byte counts of image arguments, used by size expressions in the API description.
//! The API server has functions of the same names that compute the same numbers.

use hira_apis_opencl::sizes::{self, ImageGeometry};
use opencl_sys::{cl_image_desc, cl_image_format, cl_int};

use opencl_sys::CL_INVALID_IMAGE_DESCRIPTOR;
use opencl_sys::CL_INVALID_IMAGE_FORMAT_DESCRIPTOR;

/// Bytes per pixel of `*format`.
///
/// # Safety
/// `format` must be null or point to a `cl_image_format`.
unsafe fn elem(format: *const cl_image_format) -> Result<usize, cl_int> {
    if format.is_null() {
        return Err(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR);
    }
    // SAFETY: non-null, and points to a cl_image_format per the contract.
    let f = unsafe { *format };
    sizes::image_element_size(f.image_channel_order, f.image_channel_data_type)
        .ok_or(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)
}

/// Bytes `clCreateImage` reads from `host_ptr`.
///
/// # Safety
/// Both pointers must be null or point to their types.
pub unsafe fn image_desc_host_bytes(
    format: *const cl_image_format,
    desc: *const cl_image_desc,
) -> Result<usize, cl_int> {
    // SAFETY: forwarded contract.
    let e = unsafe { elem(format) }?;
    if desc.is_null() {
        return Err(CL_INVALID_IMAGE_DESCRIPTOR);
    }
    // SAFETY: non-null and points to a cl_image_desc per the contract.
    let d = unsafe { &*desc };
    let g = ImageGeometry {
        image_type: d.image_type,
        width: d.image_width,
        height: d.image_height,
        depth: d.image_depth,
        array_size: d.image_array_size,
        row_pitch: d.image_row_pitch,
        slice_pitch: d.image_slice_pitch,
    };
    sizes::image_host_bytes(e, &g).ok_or(CL_INVALID_IMAGE_DESCRIPTOR)
}

/// Bytes `clCreateImage2D`/`3D` read from `host_ptr`.
///
/// # Safety
/// `format` must be null or point to a `cl_image_format`.
pub unsafe fn image_host_bytes(
    format: *const cl_image_format,
    image_type: u32,
    width: usize,
    height: usize,
    depth: usize,
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<usize, cl_int> {
    // SAFETY: forwarded contract.
    let e = unsafe { elem(format) }?;
    let g = ImageGeometry {
        image_type,
        width,
        height,
        depth,
        array_size: 1,
        row_pitch,
        slice_pitch,
    };
    sizes::image_host_bytes(e, &g).ok_or(CL_INVALID_IMAGE_DESCRIPTOR)
}
