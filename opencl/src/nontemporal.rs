//! Copies of large streamed transfers into the data window with non-temporal stores.
//!
//! glibc's `memcpy` bypasses the caches for a copy above its non-temporal threshold
//! (a fraction of the last-level cache) and copies through them below it. A transfer
//! streamed in chunks (`stream.rs`) is copied one chunk at a time, so each copy is
//! below that threshold even when the transfer is far above it: the guest's copy goes
//! through the caches, reading every destination line before writing it, and evicts
//! what the host's copy of the previous chunk needs. For such transfers the guest
//! copies each chunk as glibc would copy the whole transfer, and the daemon starts API
//! servers with a threshold that puts their copies of those chunks on the same path
//! (`HIRA_SERVER_NT_KB`, `vhost/src/spawn.rs`). Written here because glibc
//! chooses by the size of each call and offers no call that takes the choice, and we
//! found no crate on crates.io that provides a non-temporal copy.

/// Copies `len` bytes from `src` to `dst` (not overlapping), storing around the
/// caches where the processor can, and orders those stores before any later store
/// (so a ring message written afterwards is seen after the data).
///
/// # Safety
/// `src` must be valid for `len` reads and `dst` for `len` writes, and the two must
/// not overlap.
pub unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; SSE2 is part of the x86-64 baseline.
    unsafe {
        copy_sse2(src, dst, len)
    };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    };
}

#[cfg(target_arch = "x86_64")]
unsafe fn copy_sse2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch, _mm_sfence};
    /// Four pages are copied together, a cache line of each in turn, as glibc's
    /// large copies do: fewer DRAM pages open at once (measurements: docs/tuning.md).
    const PAGE: usize = 4096;
    const PAGES: usize = 4;
    // Non-temporal stores need 16-byte aligned destinations: the head up to the first
    // such address, and the tail past the last 64-byte line, go the ordinary way.
    let head = dst.align_offset(16).min(len);
    // SAFETY: `head <= len`, within both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut at = head;
    while at + PAGES * PAGE <= len {
        for line in (0..PAGE).step_by(64) {
            for page in 0..PAGES {
                let off = at + page * PAGE + line;
                // SAFETY: `off + 64 <= at + PAGES * PAGE <= len`; a prefetch of any
                // address is harmless.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(off + 128).cast());
                    stream_line(src.add(off), dst.add(off));
                }
            }
        }
        at += PAGES * PAGE;
    }
    while at + 64 <= len {
        // SAFETY: `at + 64 <= len`.
        unsafe { stream_line(src.add(at), dst.add(at)) };
        at += 64;
    }
    // SAFETY: `at <= len`, the rest of both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
    // SAFETY: no preconditions; orders the streaming stores before later stores.
    unsafe { _mm_sfence() };
}

/// Copies 64 bytes from `src` to the 16-byte aligned `dst` with streaming stores.
///
/// # Safety
/// Both valid for 64 bytes, `dst` 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream_line(src: *const u8, dst: *mut u8) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    // SAFETY: the caller's contract; unaligned loads, aligned streaming stores.
    unsafe {
        let s = src.cast::<__m128i>();
        let d = dst.cast::<__m128i>();
        let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
        let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
        _mm_stream_si128(d, a);
        _mm_stream_si128(d.add(1), b);
        _mm_stream_si128(d.add(2), c);
        _mm_stream_si128(d.add(3), e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_byte_at_every_alignment_and_nothing_around() {
        let src: Vec<u8> = (0..40_100u32).map(|i| (i * 131 + (i >> 7)) as u8).collect();
        for len in [
            0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 3000, 16384, 40_000,
        ] {
            for s_off in 0..17 {
                for d_off in 0..17 {
                    let mut dst = vec![0xEEu8; 40_100];
                    // SAFETY: both ranges lie inside their vectors and do not overlap.
                    unsafe { copy(src.as_ptr().add(s_off), dst.as_mut_ptr().add(d_off), len) };
                    assert_eq!(&dst[d_off..d_off + len], &src[s_off..s_off + len]);
                    assert!(
                        dst[..d_off].iter().all(|&b| b == 0xEE),
                        "{len} {s_off} {d_off}"
                    );
                    assert!(
                        dst[d_off + len..].iter().all(|&b| b == 0xEE),
                        "{len} {s_off} {d_off}"
                    );
                }
            }
        }
    }
}
