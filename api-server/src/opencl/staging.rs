//! Transfers larger than a frame or the data window.
//!
//! An input too large for either is sent ahead in chunks (`hiraStage`) and named in
//! the call by a token (`tag::STAGED`); an output too large is written here and
//! fetched in chunks afterwards (`hiraFetch`). The host call itself is the one the
//! guest made, with the whole buffer: nothing is split on the host side.
//!
//! Everything here is guest-driven, so it is bounded: chunks arrive in order, a staged
//! buffer has the length announced with its first chunk, and all staged bytes of the
//! session together stay under [`MAX_STAGED`].

use std::collections::HashMap;
use std::sync::Mutex;

/// Most bytes one session may have staged at a time (inputs and outputs together).
pub const MAX_STAGED: usize = 4 << 30;

use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_OUT_OF_RESOURCES;

struct Buffer {
    /// `u64` storage, so that the host may read it as any type.
    words: Vec<u64>,
    len: usize,
    filled: usize,
}

impl Buffer {
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has no alignment
        // or validity requirements.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
}

#[derive(Default)]
struct Inner {
    inputs: HashMap<u64, Buffer>,
    outputs: HashMap<u64, Buffer>,
    total: usize,
}

/// The session's staged transfers.
#[derive(Default)]
pub struct Staging(Mutex<Inner>);

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staging").finish_non_exhaustive()
    }
}

/// A staged input, taken for the call that names it.
pub struct StagedInput {
    pub words: Vec<u64>,
    pub len: usize,
}

impl Staging {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether no transfer is staged (in either direction).
    pub fn is_empty(&self) -> bool {
        let i = self.inner();
        i.inputs.is_empty() && i.outputs.is_empty()
    }

    /// Appends the `len` bytes at `src` at `offset` of input `token`, whose whole length
    /// is `total`. `src` may be guest-writable (the data window): it is read once, by
    /// a raw copy.
    ///
    /// # Safety
    /// `src` must be valid for `len` reads.
    pub unsafe fn stage(
        &self,
        token: u64,
        total: usize,
        offset: usize,
        src: *const u8,
        len: usize,
    ) -> i32 {
        let mut st = self.inner();
        if !st.inputs.contains_key(&token) {
            if offset != 0 || st.total.saturating_add(total) > MAX_STAGED {
                return if offset != 0 {
                    CL_INVALID_VALUE
                } else {
                    CL_OUT_OF_RESOURCES
                };
            }
            st.total += total;
            st.inputs.insert(
                token,
                Buffer {
                    words: vec![0u64; total.div_ceil(8).max(1)],
                    len: total,
                    filled: 0,
                },
            );
        }
        let Some(b) = st.inputs.get_mut(&token) else {
            return CL_INVALID_VALUE;
        };
        let end = offset.checked_add(len);
        if b.len != total || offset != b.filled || end.is_none_or(|e| e > b.len) {
            return CL_INVALID_VALUE;
        }
        let dst = b.bytes_mut()[offset..offset + len].as_mut_ptr();
        if len != 0 {
            // SAFETY: `src` is valid for `len` reads per the contract, and `dst` is
            // this input's own storage with `len` bytes left at `offset` (checked above).
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        }
        b.filled += len;
        0
    }

    /// The complete input `token` of `len` bytes, removed from the stage.
    pub fn take_input(&self, token: u64, len: usize) -> Result<StagedInput, i32> {
        let mut st = self.inner();
        let b = st.inputs.remove(&token).ok_or(CL_INVALID_VALUE)?;
        st.total -= b.len;
        if b.len != len || b.filled != len {
            return Err(CL_INVALID_VALUE);
        }
        Ok(StagedInput {
            words: b.words,
            len,
        })
    }

    /// Room for an output of `len` bytes, counted against the bound until fetched.
    pub fn output_room(&self, len: usize) -> Result<Vec<u64>, i32> {
        let mut st = self.inner();
        if st.total.saturating_add(len) > MAX_STAGED {
            return Err(CL_OUT_OF_RESOURCES);
        }
        st.total += len;
        Ok(vec![0u64; len.div_ceil(8).max(1)])
    }

    /// Keeps a finished output for the guest to fetch.
    pub fn keep_output(&self, token: u64, words: Vec<u64>, len: usize) {
        let mut st = self.inner();
        if let Some(old) = st.outputs.insert(
            token,
            Buffer {
                words,
                len,
                filled: len,
            },
        ) {
            st.total -= old.len;
        }
    }

    /// Gives back room reserved by [`Staging::output_room`] for an output that was
    /// never produced.
    pub fn drop_output(&self, len: usize) {
        let mut st = self.inner();
        st.total = st.total.saturating_sub(len);
    }

    /// Copies `len` bytes at `offset` of output `token` to `dst`; the output is gone
    /// once its last byte was fetched.
    ///
    /// # Safety
    /// `dst` must be valid for `len` writes; it may be guest-readable (the data
    /// window), and is written by a raw copy.
    pub unsafe fn fetch(&self, token: u64, offset: usize, dst: *mut u8, len: usize) -> i32 {
        let mut st = self.inner();
        let Some(b) = st.outputs.get_mut(&token) else {
            return CL_INVALID_VALUE;
        };
        let Some(end) = offset.checked_add(len).filter(|&e| e <= b.len) else {
            return CL_INVALID_VALUE;
        };
        let src = b.bytes_mut()[offset..end].as_ptr();
        if len != 0 {
            // SAFETY: `dst` is valid for `len` writes per the contract; `src` is this
            // output's own storage with `len` bytes at `offset` (checked above).
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        }
        if end == b.len {
            let len = b.len;
            st.outputs.remove(&token);
            st.total -= len;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(s: &Staging, token: u64, total: usize, offset: usize, chunk: &[u8]) -> i32 {
        // SAFETY: `chunk` is valid for its length.
        unsafe { s.stage(token, total, offset, chunk.as_ptr(), chunk.len()) }
    }

    fn fetch(s: &Staging, token: u64, offset: usize, dst: &mut [u8]) -> i32 {
        // SAFETY: `dst` is valid for its length.
        unsafe { s.fetch(token, offset, dst.as_mut_ptr(), dst.len()) }
    }

    #[test]
    fn chunks_arrive_in_order_and_make_the_whole_input() {
        let s = Staging::default();
        assert_eq!(stage(&s, 1, 6, 0, b"abc"), 0);
        assert_eq!(stage(&s, 1, 6, 1, b"x"), CL_INVALID_VALUE, "out of order");
        assert_eq!(
            stage(&s, 1, 6, 3, b"defg"),
            CL_INVALID_VALUE,
            "past the end"
        );
        assert_eq!(stage(&s, 1, 6, 3, b"def"), 0);
        let i = s.take_input(1, 6).unwrap();
        // SAFETY: the words hold 6 initialised bytes.
        let bytes = unsafe { std::slice::from_raw_parts(i.words.as_ptr().cast::<u8>(), 6) };
        assert_eq!(bytes, b"abcdef");
        assert!(s.take_input(1, 6).is_err(), "taken once");
    }

    #[test]
    fn an_incomplete_or_oversized_input_is_refused() {
        let s = Staging::default();
        assert_eq!(stage(&s, 2, 4, 0, b"ab"), 0);
        assert_eq!(s.take_input(2, 4).err(), Some(CL_INVALID_VALUE));
        assert_eq!(stage(&s, 3, MAX_STAGED + 1, 0, b"a"), CL_OUT_OF_RESOURCES);
    }

    #[test]
    fn an_output_is_fetched_in_pieces_and_then_forgotten() {
        let s = Staging::default();
        let mut w = s.output_room(5).unwrap();
        // SAFETY: the words hold at least 5 bytes.
        unsafe { std::ptr::copy_nonoverlapping(b"hello".as_ptr(), w.as_mut_ptr().cast(), 5) };
        s.keep_output(9, w, 5);
        let mut a = [0u8; 2];
        let mut b = [0u8; 3];
        assert_eq!(fetch(&s, 9, 0, &mut a), 0);
        assert_eq!(fetch(&s, 9, 2, &mut b), 0);
        assert_eq!((&a, &b), (b"he", b"llo"));
        assert_eq!(fetch(&s, 9, 0, &mut a), CL_INVALID_VALUE);
        assert_eq!(s.inner().total, 0);
    }
}
