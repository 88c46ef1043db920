//! Transfers larger than one call carries: the copy goes as several calls over
//! consecutive ranges, each of at most `HIRA_CUDA_CHUNK_KB` KiB (default 64 MiB) and
//! half the data window, in order, so the result is the one copy's. Each function returns `None` when the
//! transfer fits one call (the generated function then sends it as it is).

#![allow(non_snake_case)]

use std::ffi::c_void;
use std::sync::LazyLock;

use crate::generated;
use crate::rt::{CUresult, CUstream, MAX_BYTES};

static CHUNK: LazyLock<usize> = LazyLock::new(|| {
    hira_guest_driver::settings::settings()
        .cuda_chunk
        .unwrap_or(64 << 20)
        .clamp(4096, MAX_BYTES)
});

/// Runs `one(offset, length)` over `n` bytes in chunks, stopping at the first error.
fn chunked(n: usize, mut one: impl FnMut(usize, usize) -> CUresult) -> Option<CUresult> {
    // Each piece fits the data window, where there is one.
    let chunk = match crate::rt::window_chunk() {
        0 => *CHUNK,
        w => (*CHUNK).min(w),
    };
    if n <= chunk {
        return None;
    }
    let mut off = 0;
    while off < n {
        let len = chunk.min(n - off);
        let s = one(off, len);
        if s != 0 {
            return Some(s);
        }
        off += len;
    }
    Some(0)
}

pub(crate) fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> Option<CUresult> {
    if src.is_null() {
        return None;
    }
    chunked(n, |off, len| {
        // SAFETY: `src` holds `n` bytes (the caller's promise); `off + len <= n`.
        unsafe { generated::cuMemcpyHtoD_v2(dst + off as u64, src.byte_add(off), len) }
    })
}

pub(crate) fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> Option<CUresult> {
    if dst.is_null() {
        return None;
    }
    chunked(n, |off, len| {
        // SAFETY: `dst` holds `n` bytes (the caller's promise); `off + len <= n`.
        unsafe { generated::cuMemcpyDtoH_v2(dst.byte_add(off), src + off as u64, len) }
    })
}

pub(crate) fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> Option<CUresult> {
    if src.is_null() {
        return None;
    }
    chunked(n, |off, len| {
        // SAFETY: as for the synchronous copy.
        unsafe { generated::cuMemcpyHtoDAsync_v2(dst + off as u64, src.byte_add(off), len, stream) }
    })
}

pub(crate) fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: CUstream,
) -> Option<CUresult> {
    if dst.is_null() {
        return None;
    }
    chunked(n, |off, len| {
        // SAFETY: as for the synchronous copy.
        unsafe { generated::cuMemcpyDtoHAsync_v2(dst.byte_add(off), src + off as u64, len, stream) }
    })
}
