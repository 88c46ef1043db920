//! `cl_pocl_content_size`, PoCL's platform extension: `clSetContentSizeBufferPoCL`
//! names a buffer whose value says how many bytes of another buffer are meaningful
//! (PoCL's remote driver then moves only those).
//!
//! The entry point is not in the ICD loader's exports: it is looked up once from the
//! host platform. Where the platform does not give it, the extension is taken out of
//! the platform's extension lists (so the guest never sees it) and the call answers
//! as an unsupported one.

#![allow(non_snake_case)]

use std::ffi::c_void;
use std::sync::OnceLock;

use cl3::OpenCl;
use opencl_sys::{
    CL_PLATFORM_EXTENSIONS, CL_PLATFORM_EXTENSIONS_WITH_VERSION, cl_int, cl_mem, cl_platform_id,
};

use super::Session;

/// The extension's name.
pub const NAME: &str = hira_apis_opencl::extensions::CONTENT_SIZE;

type SetContentSize = unsafe extern "C" fn(cl_mem, cl_mem) -> cl_int;

static ENTRY: OnceLock<Option<SetContentSize>> = OnceLock::new();

/// Looks the entry point up on `platform`. Called once, at start.
pub fn resolve(rt: &OpenCl, platform: cl_platform_id) {
    let found = rt
        .clGetExtensionFunctionAddressForPlatform(platform, c"clSetContentSizeBufferPoCL".as_ptr())
        .filter(|p| !p.is_null())
        .map(|p| {
            // SAFETY: the host's entry point of that name, whose C signature
            // (`CL/cl_ext_pocl.h`) is `SetContentSize`; a function pointer is of a
            // pointer's size.
            unsafe { std::mem::transmute::<*mut c_void, SetContentSize>(p) }
        });
    let _ = ENTRY.set(found);
}

/// Whether the host's entry point is forwarded.
pub fn forwarded() -> bool {
    ENTRY.get().is_some_and(Option::is_some)
}

/// `clSetContentSizeBufferPoCL`, forwarded.
///
/// # Safety
/// As `clSetContentSizeBufferPoCL`: both are memory objects of this session.
pub unsafe fn clSetContentSizeBufferPoCL(
    _s: &mut Session<'_>,
    buffer: cl_mem,
    content_size_buffer: cl_mem,
) -> Option<cl_int> {
    let f = (*ENTRY.get()?)?;
    // SAFETY: the forwarded contract; `f` is the host's entry point.
    Some(unsafe { f(buffer, content_size_buffer) })
}

/// Takes the extension out of a platform's extension list or name-version array when
/// it is not forwarded.
pub fn mask_unforwarded(param: u32, buf: &mut Vec<u8>) {
    if forwarded() {
        return;
    }
    super::info::remove_extension(
        NAME,
        param,
        (CL_PLATFORM_EXTENSIONS, CL_PLATFORM_EXTENSIONS_WITH_VERSION),
        buf,
    );
}
