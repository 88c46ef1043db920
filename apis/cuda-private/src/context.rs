//! `cuCtxCreate_v4`, what CUDA 13's `cuda.h` calls `cuCtxCreate`: a context made as
//! `cuCtxCreate_v2` makes one, with parameters that may ask for more.

use std::ffi::{c_int, c_void};

type CUresult = c_int;

const INVALID_VALUE: CUresult = 1;
const NOT_SUPPORTED: CUresult = 801;

/// `CUctxCreateParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CreateParams {
    pub exec_affinity: *const c_void,
    pub exec_affinity_count: c_int,
    pub cig: *const c_void,
}

/// Whether the parameters ask only for an ordinary context (null, or no execution
/// affinity and no CUDA-in-graphics), which is what is built: execution affinity
/// (a share of the SMs, with MPS) and contexts of a graphics API's device get
/// `CUDA_ERROR_NOT_SUPPORTED`, as a driver and device without them answer.
///
/// # Safety
/// `p` is null or valid for a read.
pub unsafe fn plain(p: *const CreateParams) -> Result<(), CUresult> {
    if p.is_null() {
        return Ok(());
    }
    // SAFETY: the caller's promise.
    let p = unsafe { p.read_unaligned() };
    if p.exec_affinity_count < 0 || (p.exec_affinity_count > 0 && p.exec_affinity.is_null()) {
        return Err(INVALID_VALUE);
    }
    if p.exec_affinity_count > 0 || !p.cig.is_null() {
        return Err(NOT_SUPPORTED);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_ordinary_context_is_made() {
        assert_eq!(std::mem::size_of::<CreateParams>(), 24, "cuda.h's");
        let none = CreateParams {
            exec_affinity: std::ptr::null(),
            exec_affinity_count: 0,
            cig: std::ptr::null(),
        };
        let x = 0u64;
        let some = (&raw const x).cast::<c_void>();
        // SAFETY: valid or null pointers.
        unsafe {
            assert_eq!(plain(std::ptr::null()), Ok(()));
            assert_eq!(plain(&none), Ok(()));
            let affinity = CreateParams {
                exec_affinity: some,
                exec_affinity_count: 1,
                ..none
            };
            assert_eq!(plain(&affinity), Err(NOT_SUPPORTED));
            let counted = CreateParams {
                exec_affinity_count: 1,
                ..none
            };
            assert_eq!(plain(&counted), Err(INVALID_VALUE));
            let cig = CreateParams { cig: some, ..none };
            assert_eq!(plain(&cig), Err(NOT_SUPPORTED));
        }
    }
}
