//! Byte counts of image arguments, as the guest shim's functions of the same names
//! compute them, but from the decoded arguments: the API server trusts only these.

use hira_apis_opencl::sizes::{self, ImageGeometry};
use opencl_sys::{cl_image_desc, cl_image_format};

use crate::backend::Fail;

use opencl_sys::CL_INVALID_IMAGE_DESCRIPTOR;
use opencl_sys::CL_INVALID_IMAGE_FORMAT_DESCRIPTOR;

fn elem(format: *const cl_image_format) -> Result<usize, Fail> {
    if format.is_null() {
        return Err(Fail::Status(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR));
    }
    // SAFETY: non-null pointers here point to decoded, aligned locals of the call.
    let f = unsafe { format.read_unaligned() };
    sizes::image_element_size(f.image_channel_order, f.image_channel_data_type)
        .ok_or(Fail::Status(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR))
}

/// Bytes `clCreateImage` will read from `host_ptr`.
pub(crate) fn image_desc_host_bytes(
    format: *const cl_image_format,
    desc: *const cl_image_desc,
) -> Result<usize, Fail> {
    let e = elem(format)?;
    if desc.is_null() {
        return Err(Fail::Status(CL_INVALID_IMAGE_DESCRIPTOR));
    }
    // SAFETY: non-null, points to the decoded descriptor of this call.
    let d = unsafe { desc.read_unaligned() };
    let g = ImageGeometry {
        image_type: d.image_type,
        width: d.image_width,
        height: d.image_height,
        depth: d.image_depth,
        array_size: d.image_array_size,
        row_pitch: d.image_row_pitch,
        slice_pitch: d.image_slice_pitch,
    };
    sizes::image_host_bytes(e, &g).ok_or(Fail::Status(CL_INVALID_IMAGE_DESCRIPTOR))
}

/// Bytes `clCreateImage2D`/`3D` will read from `host_ptr`.
pub(crate) fn image_host_bytes(
    format: *const cl_image_format,
    image_type: u32,
    width: usize,
    height: usize,
    depth: usize,
    row_pitch: usize,
    slice_pitch: usize,
) -> Result<usize, Fail> {
    let e = elem(format)?;
    let g = ImageGeometry {
        image_type,
        width,
        height,
        depth,
        array_size: 1,
        row_pitch,
        slice_pitch,
    };
    sizes::image_host_bytes(e, &g).ok_or(Fail::Status(CL_INVALID_IMAGE_DESCRIPTOR))
}
