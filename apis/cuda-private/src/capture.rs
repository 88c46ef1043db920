//! Stream capture as a driver without graphs answers it: nothing is ever being
//! captured (`cuStreamBeginCapture` is not available), so `cuStreamIsCapturing` and
//! `cuStreamGetCaptureInfo` report `CU_STREAM_CAPTURE_STATUS_NONE`, and each thread's
//! capture mode (`cuThreadExchangeStreamCaptureMode`) is kept and exchanged, as
//! programs and libraries ask before work they must not capture (CuPy, CUB). Shared
//! by Hira's guest `libcuda.so.1` and the CPU test executor, which check the stream.

use std::cell::Cell;
use std::ffi::{c_int, c_void};

/// `CUDA_SUCCESS`, `CUDA_ERROR_INVALID_VALUE`.
const SUCCESS: i32 = 0;
const INVALID_VALUE: i32 = 1;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`, `_THREAD_LOCAL`, `_RELAXED`.
const MODES: [c_int; 3] = [0, 1, 2];

thread_local! {
    /// This thread's capture mode (global until a program sets another).
    static MODE: Cell<c_int> = const { Cell::new(0) };
}

/// Writes "not capturing" to what a `cuStreamGetCaptureInfo` (any version) or
/// `cuStreamIsCapturing` asks for: the status, and, where asked, a zero id, no graph
/// and no dependencies.
///
/// # Safety
///
/// Each pointer is null or valid for a write of its type.
pub unsafe fn not_capturing(
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    edges: *mut *const c_void,
    num_deps: *mut usize,
) -> i32 {
    if status.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's pointers, each checked non-null before its write.
    unsafe {
        status.write(STATUS_NONE);
        if !id.is_null() {
            id.write(0);
        }
        if !graph.is_null() {
            graph.write(std::ptr::null_mut());
        }
        if !deps.is_null() {
            deps.write(std::ptr::null());
        }
        if !edges.is_null() {
            edges.write(std::ptr::null());
        }
        if !num_deps.is_null() {
            num_deps.write(0);
        }
    }
    SUCCESS
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's mode to `*mode` and
/// returns the one it had in `*mode`.
///
/// # Safety
///
/// `mode` is null or valid for a read and a write.
pub unsafe fn exchange_mode(mode: *mut c_int) -> i32 {
    if mode.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller's pointer.
    let new = unsafe { mode.read() };
    if !MODES.contains(&new) {
        return INVALID_VALUE;
    }
    let old = MODE.with(|m| m.replace(new));
    // SAFETY: as above.
    unsafe { mode.write(old) };
    SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_captured_and_the_mode_is_exchanged_per_thread() {
        let (mut st, mut id, mut n) = (7, 9u64, 3usize);
        // SAFETY: valid pointers or null.
        let r = unsafe {
            not_capturing(
                &mut st,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut n,
            )
        };
        assert_eq!((r, st, id, n), (SUCCESS, STATUS_NONE, 0, 0));
        // SAFETY: a null status is refused, never written.
        let r = unsafe {
            not_capturing(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, INVALID_VALUE);
        let mut m = 2;
        // SAFETY: a valid pointer.
        assert_eq!(unsafe { exchange_mode(&mut m) }, SUCCESS);
        assert_eq!(m, 0, "global at first");
        let mut m = 1;
        // SAFETY: as above.
        unsafe { exchange_mode(&mut m) };
        assert_eq!(m, 2, "relaxed, as set");
        std::thread::spawn(|| {
            let mut m = 1;
            // SAFETY: as above.
            unsafe { exchange_mode(&mut m) };
            assert_eq!(m, 0, "another thread starts global");
        })
        .join()
        .unwrap();
        let mut bad = 5;
        // SAFETY: as above.
        assert_eq!(unsafe { exchange_mode(&mut bad) }, INVALID_VALUE);
    }
}
