//! Decoding of the guest's arguments for the generated dispatch, one helper per
//! argument kind.
//!
//! Every helper turns guest bytes into host values only after checking them: ids
//! must name live objects of the right kind, counts must match the counts the call
//! will use, and every buffer must hold exactly the bytes the call will touch.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use hira_apis_opencl::kernel_args::ArgKind;
use hira_apis_opencl::{CL_CONTEXT_PLATFORM, Kind, tag};
use hira_protocol::codec::{MAX_ARRAY, MAX_STRING};
use hira_protocol::frame::MAX_FRAME_BODY;
use hira_protocol::{Reader, Writer};
use log::warn;
use opencl_sys::{
    CL_INVALID_ARG_SIZE, CL_INVALID_ARG_VALUE, CL_INVALID_BUFFER_SIZE, CL_INVALID_VALUE,
    CL_MEM_ALLOC_HOST_PTR, CL_MEM_COPY_HOST_PTR, CL_MEM_USE_HOST_PTR, CL_OUT_OF_RESOURCES,
    CL_SUCCESS, cl_event, cl_image_desc,
};

use super::session::Session;
use crate::backend::{Fail, FrameData};

/// Largest zero-terminated property list accepted.
const MAX_PROPERTIES: usize = 128;

/// Input bytes of one argument.
#[derive(Debug)]
pub enum BytesIn<'a> {
    Null,
    Slice(&'a [u8]),
    /// Small inline data copied into aligned storage (the host may read structs).
    Aligned(Vec<u64>, usize),
    Window(*mut u8, usize),
    /// A host SVM address with this many bytes of its allocation after it.
    Svm(*mut u8, usize),
    /// A buffer's initial contents of this many bytes, written by `hiraFill` calls
    /// after the buffer is made.
    Streamed(usize),
    /// A memory object's storage: this many bytes of the data window, at this window
    /// offset (`zero_copy`).
    WindowMem(*mut u8, usize, u64),
}

impl BytesIn<'_> {
    pub fn ptr(&self) -> *mut c_void {
        match self {
            BytesIn::Null | BytesIn::Streamed(_) => std::ptr::null_mut(),
            BytesIn::Slice(s) => s.as_ptr() as *mut c_void,
            BytesIn::Aligned(v, _) => v.as_ptr() as *mut c_void,
            BytesIn::Window(p, _) | BytesIn::Svm(p, _) | BytesIn::WindowMem(p, ..) => p.cast(),
        }
    }

    /// Whether this is a memory object's storage in the window (used in place).
    pub fn is_window_mem(&self) -> bool {
        matches!(self, BytesIn::WindowMem(..))
    }

    /// Whether this is the host's own SVM memory (used in place, never copied).
    pub fn is_svm(&self) -> bool {
        matches!(self, BytesIn::Svm(..))
    }

    /// Whether the contents follow the call (see [`BytesIn::Streamed`]).
    pub fn is_streamed(&self) -> bool {
        matches!(self, BytesIn::Streamed(_))
    }

    /// Checks the guest sent exactly `n` bytes (nothing to check for NULL).
    pub fn expect_len(&self, n: usize) -> Result<(), Fail> {
        let len = match self {
            BytesIn::Null => return Ok(()),
            BytesIn::Slice(s) => s.len(),
            BytesIn::Aligned(_, l)
            | BytesIn::Window(_, l)
            | BytesIn::Streamed(l)
            | BytesIn::WindowMem(_, l, _) => *l,
            BytesIn::Svm(_, avail) if n <= *avail => return Ok(()),
            BytesIn::Svm(..) => return Err(Fail::Status(CL_INVALID_BUFFER_SIZE)),
        };
        if len == n {
            Ok(())
        } else {
            warn!("argument carries {len} bytes, the call uses {n}");
            Err(Fail::Status(CL_INVALID_VALUE))
        }
    }
}

/// Where the guest wants an output.
#[derive(Debug, Clone, Copy)]
pub enum OutRequest {
    Null,
    Inline,
    Window(*mut u8, usize),
    /// Kept after the call under this token, for `hiraFetch`.
    Staged(u64),
}

/// Storage for an output while the host call runs.
#[derive(Debug)]
pub enum OutBuffer {
    Null,
    Inline(Vec<u8>),
    Window(*mut u8),
    /// Too large for a frame or the window: kept for the guest to fetch.
    Staged(StagedOut),
}

/// An output written into process memory and kept, after the call, for `hiraFetch`.
#[derive(Debug)]
pub struct StagedOut {
    token: u64,
    words: Option<Vec<u64>>,
    len: usize,
    staging: Arc<super::staging::Staging>,
}

impl StagedOut {
    /// Hands the output to the stage, for the guest to fetch.
    pub fn keep(mut self) {
        if let Some(words) = self.words.take() {
            self.staging.keep_output(self.token, words, self.len);
        }
    }
}

impl Drop for StagedOut {
    fn drop(&mut self) {
        if self.words.is_some() {
            // Never produced (the call failed): its room goes back.
            self.staging.drop_output(self.len);
        }
    }
}

impl OutBuffer {
    pub fn ptr(&mut self) -> *mut c_void {
        match self {
            OutBuffer::Null => std::ptr::null_mut(),
            OutBuffer::Inline(v) => v.as_mut_ptr().cast(),
            OutBuffer::Window(p) => p.cast(),
            OutBuffer::Staged(o) => o
                .words
                .as_mut()
                .map_or(std::ptr::null_mut(), |w| w.as_mut_ptr().cast()),
        }
    }

    /// Appends the output to the reply (window outputs are already in place, staged
    /// ones are kept for the guest to fetch).
    pub fn reply(self, w: &mut Writer) {
        match self {
            OutBuffer::Inline(v) => {
                w.bytes(&v);
            }
            OutBuffer::Staged(o) => o.keep(),
            OutBuffer::Null | OutBuffer::Window(_) => {}
        }
    }
}

/// Length-prefixed blobs (program sources or binaries) with pointer and length arrays.
/// Each blob is stored with a NUL after it, so that even an empty one is a valid
/// pointer to an empty string (hosts read a zero-length source as a C string).
#[derive(Debug)]
pub struct Blobs {
    present: bool,
    data: Vec<Vec<u8>>,
    ptrs: Vec<*const u8>,
    lens: Vec<usize>,
}

impl Blobs {
    pub fn ptrs(&self) -> *const *const u8 {
        if self.data.is_empty() {
            std::ptr::null()
        } else {
            self.ptrs.as_ptr()
        }
    }

    pub fn lens(&self) -> *const usize {
        if self.data.is_empty() {
            std::ptr::null()
        } else {
            self.lens.as_ptr()
        }
    }

    /// The array must be present (a NULL array is invalid for every call taking
    /// sources or binaries, and PoCL 3.1 reads through it) with exactly `n` entries.
    pub fn check_count(&self, n: usize) -> Result<(), Fail> {
        if self.present && self.data.len() == n {
            Ok(())
        } else {
            Err(Fail::Status(CL_INVALID_VALUE))
        }
    }
}

/// NUL-terminated strings with a pointer array.
#[derive(Debug)]
pub struct CStrings {
    strings: Vec<CString>,
    ptrs: Vec<*const libc::c_char>,
    present: bool,
}

impl CStrings {
    pub fn ptrs(&self) -> *const *const libc::c_char {
        if self.present {
            self.ptrs.as_ptr()
        } else {
            std::ptr::null()
        }
    }

    pub fn check_count(&self, n: usize) -> Result<(), Fail> {
        if !self.present || self.strings.len() == n {
            Ok(())
        } else {
            Err(Fail::Status(CL_INVALID_VALUE))
        }
    }
}

/// A decoded kernel argument.
#[derive(Debug)]
pub enum KernelArg {
    Null,
    Bytes(Vec<u64>, usize),
    /// An object named by kind and id, not yet resolved.
    Object(Kind, u64),
    /// A resolved object: the host handle, boxed so its address is stable.
    Handle(Box<usize>),
}

impl KernelArg {
    /// The `(arg_size, arg_value)` to pass to the host.
    pub fn host_arg(&self, arg_size: usize) -> Result<(usize, *const c_void), Fail> {
        match self {
            KernelArg::Null => Ok((arg_size, std::ptr::null())),
            KernelArg::Bytes(v, len) => {
                if *len != arg_size {
                    return Err(Fail::Status(CL_INVALID_ARG_SIZE));
                }
                Ok((arg_size, v.as_ptr().cast()))
            }
            KernelArg::Handle(h) => Ok((size_of::<usize>(), (&**h as *const usize).cast())),
            KernelArg::Object(..) => {
                Err(Fail::Protocol("kernel argument object not resolved".into()))
            }
        }
    }
}

/// A private copy of `len` bytes at `p`, which may be guest-writable (the data window):
/// a raw copy, so no Rust reference to memory the guest changes concurrently is made
/// and every later read sees the one copied value.
///
/// # Safety
/// `p` must be valid for `len` reads (or `len` zero).
pub(crate) unsafe fn copy_in(p: *const c_void, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    if len != 0 {
        // SAFETY: `p` is valid for `len` reads per the contract; `v` holds `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), v.as_mut_ptr(), len) };
    }
    v
}

fn aligned_copy(b: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; b.len().div_ceil(8).max(1)];
    // SAFETY: `v` has at least b.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), v.as_mut_ptr().cast::<u8>(), b.len()) };
    v
}

impl Session<'_> {
    /// An optional array of ids.
    pub fn ids(r: &mut Reader<'_>) -> Result<Option<Vec<u64>>, Fail> {
        if !r.flag()? {
            return Ok(None);
        }
        let n = r.count(MAX_ARRAY)?;
        (0..n)
            .map(|_| r.u64().map_err(Fail::from))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The host never sees `CL_MEM_USE_HOST_PTR`: the guest's memory is not the host's,
    /// so the host gets a copy and the guest keeps its pointer coherent at map time.
    /// `CL_MEM_USE_HOST_PTR` with `CL_MEM_ALLOC_HOST_PTR` or `CL_MEM_COPY_HOST_PTR` is
    /// invalid (the API's `CL_INVALID_VALUE`); it is answered here, because the host
    /// would see a valid copy instead.
    pub fn host_mem_flags(flags: u64) -> Result<u64, Fail> {
        if flags & CL_MEM_USE_HOST_PTR == 0 {
            Ok(flags)
        } else if flags & (CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR) != 0 {
            Err(Fail::Status(CL_INVALID_VALUE))
        } else {
            Ok((flags & !CL_MEM_USE_HOST_PTR) | CL_MEM_COPY_HOST_PTR)
        }
    }

    pub fn array_ptr<T>(v: &Option<Vec<T>>) -> *const T {
        v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr())
    }

    /// A present array must have exactly the count the call names.
    pub fn check_count<T>(v: &Option<Vec<T>>, n: usize) -> Result<(), Fail> {
        match v {
            Some(v) if v.len() != n => Err(Fail::Status(CL_INVALID_VALUE)),
            _ => Ok(()),
        }
    }

    pub fn capped_count(n: usize) -> Result<usize, Fail> {
        if n > MAX_ARRAY {
            Err(Fail::Status(CL_INVALID_VALUE))
        } else {
            Ok(n)
        }
    }

    pub fn cstring(r: &mut Reader<'_>) -> Result<Option<CString>, Fail> {
        if !r.flag()? {
            return Ok(None);
        }
        let s = r.string()?;
        Ok(Some(
            CString::new(s).map_err(|_| hira_protocol::DecodeError::InteriorNul)?,
        ))
    }

    pub fn cstring_ptr(s: &Option<CString>) -> *const libc::c_char {
        s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
    }

    pub fn cstrings(r: &mut Reader<'_>) -> Result<CStrings, Fail> {
        let present = r.flag()?;
        let mut strings = Vec::new();
        if present {
            let n = r.count(MAX_ARRAY)?;
            for _ in 0..n {
                strings.push(
                    CString::new(r.string()?)
                        .map_err(|_| hira_protocol::DecodeError::InteriorNul)?,
                );
            }
        }
        let ptrs = strings.iter().map(|s| s.as_ptr()).collect();
        Ok(CStrings {
            strings,
            ptrs,
            present,
        })
    }

    pub fn blobs(r: &mut Reader<'_>) -> Result<Blobs, Fail> {
        let mut data = Vec::new();
        let mut lens = Vec::new();
        let present = r.flag()?;
        if present {
            let n = r.count(MAX_ARRAY)?;
            let mut total = 0usize;
            for _ in 0..n {
                let b = r.bytes(MAX_STRING)?;
                total += b.len();
                if total > MAX_FRAME_BODY {
                    return Err(Fail::Status(CL_INVALID_VALUE));
                }
                let mut v = Vec::with_capacity(b.len() + 1);
                v.extend_from_slice(b);
                v.push(0);
                lens.push(b.len());
                data.push(v);
            }
        }
        let ptrs = data.iter().map(|d| d.as_ptr()).collect();
        Ok(Blobs {
            present,
            data,
            ptrs,
            lens,
        })
    }

    /// An optional array of at most three `size_t`.
    pub fn sizes(r: &mut Reader<'_>) -> Result<Option<Vec<usize>>, Fail> {
        if !r.flag()? {
            return Ok(None);
        }
        let n = r.count(3)?;
        (0..n)
            .map(|_| r.usize().map_err(Fail::from))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An optional property list: key/value pairs (a value may be zero), to which the
    /// terminating zero key is added. A zero key inside or an odd count is refused.
    pub fn zlist(r: &mut Reader<'_>) -> Result<Option<Vec<u64>>, Fail> {
        if !r.flag()? {
            return Ok(None);
        }
        let n = r.count(MAX_PROPERTIES)?;
        let mut v = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        if n % 2 != 0 || v.iter().step_by(2).any(|&key| key == 0) {
            return Err(Fail::Status(CL_INVALID_VALUE));
        }
        v.push(0);
        Ok(Some(v))
    }

    /// Device partition properties: exactly one list of a shape the specification
    /// defines (see [`hira_apis_opencl::partition_words`]), else `CL_INVALID_VALUE`.
    pub fn partition_properties(r: &mut Reader<'_>) -> Result<Option<Vec<u64>>, Fail> {
        if !r.flag()? {
            return Ok(None);
        }
        let n = r.count(hira_apis_opencl::MAX_PARTITION_WORDS)?;
        let v = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        // A list whose last word ends it is one list: its shape fixes where it ends.
        if hira_apis_opencl::partition_words(&v) != Some(true) {
            return Err(Fail::Status(CL_INVALID_VALUE));
        }
        Ok(Some(v))
    }

    /// Context properties with the platform id turned back into the host platform.
    pub fn context_properties(&self, words: Option<Vec<u64>>) -> Result<Option<Vec<isize>>, Fail> {
        let Some(words) = words else {
            return Ok(None);
        };
        let body = &words[..words.len() - 1];
        if body.len() % 2 != 0 {
            return Err(Fail::Status(CL_INVALID_VALUE));
        }
        let mut out = Vec::with_capacity(words.len());
        for pair in body.chunks(2) {
            let value = if pair[0] == CL_CONTEXT_PLATFORM {
                self.lookup(pair[1], Kind::Platform, false)? as usize as u64
            } else {
                pair[1]
            };
            out.push(pair[0] as isize);
            out.push(value as isize);
        }
        out.push(0);
        Ok(Some(out))
    }

    /// Input bytes of one argument. Bytes in the shared window stay there only if
    /// `opaque` (the host copies them without interpreting them); otherwise they are
    /// copied once out of guest reach, so the host never reads values the guest can
    /// change under it.
    pub fn bytes_in<'f>(
        &self,
        r: &mut Reader<'f>,
        frame: &FrameData<'_>,
        opaque: bool,
    ) -> Result<BytesIn<'f>, Fail> {
        let start = r.position();
        let out_of_line = self.rec.is_some() && matches!(r.peek(), Some(tag::WINDOW | tag::STAGED));
        let b = self.bytes_in_at(r, frame, opaque)?;
        if let Some(rec) = &self.rec {
            let end = r.position();
            let splice = match &b {
                BytesIn::Svm(..) => {
                    rec.borrow_mut().unmigratable = Some("data in SVM memory");
                    None
                }
                // A memory object's initial data (bytes the host copies without
                // reading them) is not kept: its contents are, and a replay makes it
                // from zeros of the same length.
                BytesIn::Slice(_) | BytesIn::Aligned(..) | BytesIn::Window(..)
                    if opaque && rec.borrow().creates_memory =>
                {
                    let len = match &b {
                        BytesIn::Slice(s) => s.len(),
                        BytesIn::Aligned(_, l) | BytesIn::Window(_, l) => *l,
                        _ => 0,
                    };
                    Some(super::migrate::Splice::Zeros(len))
                }
                BytesIn::Window(p, len) if out_of_line => {
                    // SAFETY: the span lies inside the mapped window (checked by `span`).
                    Some(super::migrate::Splice::Inline(unsafe {
                        copy_in(p.cast(), *len)
                    }))
                }
                BytesIn::Aligned(words, len) if out_of_line => {
                    // SAFETY: `words` holds at least `len` bytes.
                    Some(super::migrate::Splice::Inline(
                        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), *len) }
                            .to_vec(),
                    ))
                }
                _ => None,
            };
            if let Some(splice) = splice {
                rec.borrow_mut().splices.push((start, end, splice));
            }
        }
        Ok(b)
    }

    fn bytes_in_at<'f>(
        &self,
        r: &mut Reader<'f>,
        frame: &FrameData<'_>,
        opaque: bool,
    ) -> Result<BytesIn<'f>, Fail> {
        match r.u8()? {
            tag::NULL => Ok(BytesIn::Null),
            tag::INLINE => {
                let b = r.bytes(MAX_FRAME_BODY)?;
                if b.len() <= 4096 {
                    Ok(BytesIn::Aligned(aligned_copy(b), b.len()))
                } else {
                    Ok(BytesIn::Slice(b))
                }
            }
            tag::SVM if opaque => {
                let id = r.u64()?;
                let off = usize::try_from(r.u64()?).map_err(|_| Fail::Status(CL_INVALID_VALUE))?;
                let (p, avail) = self.b.svm.span(id, off).map_err(Fail::Status)?;
                Ok(BytesIn::Svm(p.cast(), avail))
            }
            tag::STREAMED if opaque => {
                let len = usize::try_from(r.u64()?).map_err(|_| Fail::Status(CL_INVALID_VALUE))?;
                Ok(BytesIn::Streamed(len))
            }
            tag::WINDOW_MEM if opaque => {
                let (offset, len) = (r.u64()?, r.u64()?);
                let w = frame
                    .window
                    .ok_or_else(|| Fail::Protocol("window memory without a data window".into()))?;
                let p = w
                    .at(offset, len)
                    .filter(|_| len > 0)
                    .ok_or_else(|| Fail::Protocol("window memory outside the window".into()))?;
                Ok(BytesIn::WindowMem(p, len as usize, offset))
            }
            tag::STAGED => {
                let token = r.u64()?;
                let len = usize::try_from(r.u64()?).map_err(|_| Fail::Status(CL_INVALID_VALUE))?;
                if token == super::migrate::ZEROS && self.b.migration.replaying() {
                    return Ok(BytesIn::Aligned(vec![0u64; len.div_ceil(8).max(1)], len));
                }
                let staged = self
                    .b
                    .staging
                    .take_input(token, len)
                    .map_err(Fail::Status)?;
                Ok(BytesIn::Aligned(staged.words, staged.len))
            }
            tag::WINDOW => {
                let (p, len) = Self::span(r, frame)?;
                if opaque {
                    return Ok(BytesIn::Window(p, len));
                }
                let mut v = vec![0u64; len.div_ceil(8).max(1)];
                // SAFETY: the span lies inside the mapped window (checked by `span`) and
                // `v` holds at least `len` bytes; a raw copy makes no reference to
                // memory the guest may write concurrently.
                unsafe { std::ptr::copy_nonoverlapping(p, v.as_mut_ptr().cast::<u8>(), len) };
                Ok(BytesIn::Aligned(v, len))
            }
            t => Err(Fail::Protocol(format!("bad byte-argument tag {t}"))),
        }
    }

    fn span(r: &mut Reader<'_>, frame: &FrameData<'_>) -> Result<(*mut u8, usize), Fail> {
        let i = r.u16()? as usize;
        let s = frame
            .spans
            .get(i)
            .ok_or_else(|| Fail::Protocol(format!("span {i} not in the frame")))?;
        let w = frame
            .window
            .ok_or_else(|| Fail::Protocol("span without a data window".into()))?;
        let p = w
            .at(s.offset, s.len)
            .ok_or_else(|| Fail::Protocol("span outside the window".into()))?;
        Ok((p, s.len as usize))
    }

    pub fn out_request(
        &self,
        r: &mut Reader<'_>,
        frame: &FrameData<'_>,
    ) -> Result<OutRequest, Fail> {
        match r.u8()? {
            tag::NULL => Ok(OutRequest::Null),
            tag::INLINE => Ok(OutRequest::Inline),
            tag::STAGED => Ok(OutRequest::Staged(r.u64()?)),
            tag::WINDOW => {
                let (p, len) = Self::span(r, frame)?;
                Ok(OutRequest::Window(p, len))
            }
            t => Err(Fail::Protocol(format!("bad output tag {t}"))),
        }
    }

    /// Storage for an output of exactly `len` bytes.
    pub fn out_buffer(&self, req: OutRequest, len: usize) -> Result<OutBuffer, Fail> {
        match req {
            OutRequest::Null => Ok(OutBuffer::Null),
            OutRequest::Inline => {
                if len > MAX_FRAME_BODY - 4096 {
                    return Err(Fail::Status(CL_OUT_OF_RESOURCES));
                }
                Ok(OutBuffer::Inline(hira_protocol::shm::zeroed(len)))
            }
            OutRequest::Staged(token) => {
                let words = self.b.staging.output_room(len).map_err(Fail::Status)?;
                Ok(OutBuffer::Staged(StagedOut {
                    token,
                    words: Some(words),
                    len,
                    staging: self.b.staging.clone(),
                }))
            }
            OutRequest::Window(p, span_len) => {
                if span_len != len {
                    warn!("output span of {span_len} bytes for a {len}-byte result");
                    return Err(Fail::Status(CL_INVALID_VALUE));
                }
                Ok(OutBuffer::Window(p))
            }
        }
    }

    /// Parses a kernel argument; object ids are resolved by [`Session::resolve_kernel_arg`].
    pub fn kernel_arg(r: &mut Reader<'_>) -> Result<KernelArg, Fail> {
        match r.u8()? {
            tag::NULL => Ok(KernelArg::Null),
            tag::INLINE => {
                let b = r.bytes(64 * 1024)?;
                Ok(KernelArg::Bytes(aligned_copy(b), b.len()))
            }
            tag::HANDLE => {
                let kind = Kind::try_from(r.u8()?)
                    .map_err(|k| Fail::Protocol(format!("bad object kind {k}")))?;
                Ok(KernelArg::Object(kind, r.u64()?))
            }
            t => Err(Fail::Protocol(format!("bad kernel-argument tag {t}"))),
        }
    }

    /// Checks a kernel argument against the kind the host reported for it and turns
    /// an object id into the host handle the kernel receives. Guest bytes never reach
    /// the host where the kernel expects a pointer or an object.
    pub fn resolve_kernel_arg(
        &self,
        kernel: u64,
        index: u32,
        arg_size: usize,
        k: KernelArg,
    ) -> Result<KernelArg, Fail> {
        self.note(|r| r.key = Some(u64::from(index)));
        if self
            .b
            .recorded_kernels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&kernel)
        {
            self.note(|r| {
                r.unmigratable =
                    Some("a kernel's arguments changed after a command buffer recorded it")
            });
        }
        let signature = self.handles().kernels.get(&kernel).cloned();
        let kind = match &signature {
            // The host checks the index; nothing of the value reaches it then.
            Some(Some(kinds)) => match kinds.get(index as usize) {
                Some(&kind) => kind,
                None => return Ok(KernelArg::Null),
            },
            _ => ArgKind::Unknown,
        };
        match (kind.object(), k) {
            (Some(_), _) if arg_size != size_of::<usize>() => {
                Err(Fail::Status(CL_INVALID_ARG_SIZE))
            }
            (Some(_), KernelArg::Null) => Ok(KernelArg::Null),
            (Some((want, code)), KernelArg::Object(kind, id)) => {
                if kind != want {
                    return Err(Fail::Status(code));
                }
                let host = self
                    .lookup(id, kind, false)
                    .map_err(|_| Fail::Status(code))?;
                Ok(KernelArg::Handle(Box::new(host as usize)))
            }
            // "arg_value ... can point to a NULL value": a NULL buffer, as natively.
            (Some(_), KernelArg::Bytes(words, len))
                if kind == ArgKind::Buffer && len == size_of::<usize>() && words[0] == 0 =>
            {
                Ok(KernelArg::Handle(Box::new(0)))
            }
            (Some((_, code)), KernelArg::Bytes(..)) => Err(Fail::Status(code)),
            (None, KernelArg::Object(obj, id))
                if kind == ArgKind::Unknown
                    && matches!(obj, Kind::Mem | Kind::Sampler | Kind::Queue) =>
            {
                // Unknown kinds: an id still names only an object of this session.
                let host = self
                    .lookup(id, obj, false)
                    .map_err(|_| Fail::Status(CL_INVALID_ARG_VALUE))?;
                Ok(KernelArg::Handle(Box::new(host as usize)))
            }
            (None, KernelArg::Object(..)) => Err(Fail::Status(CL_INVALID_ARG_VALUE)),
            (None, KernelArg::Bytes(_, len))
                if kind == ArgKind::Unknown && len == size_of::<usize>() =>
            {
                // The host cannot say whether this argument is a pointer: refuse bytes
                // that could be read as one.
                Err(Fail::Status(CL_INVALID_ARG_VALUE))
            }
            (None, KernelArg::Bytes(..)) if kind == ArgKind::Local => {
                Err(Fail::Status(CL_INVALID_ARG_VALUE))
            }
            (_, other) => Ok(other),
        }
    }

    /// Parses an image descriptor; its buffer id is resolved by
    /// [`Session::resolve_image_desc`].
    pub fn image_desc(r: &mut Reader<'_>) -> Result<Option<(Box<cl_image_desc>, u64)>, Fail> {
        if !r.flag()? {
            return Ok(None);
        }
        let image_type = r.u32()?;
        let image_width = r.usize()?;
        let image_height = r.usize()?;
        let image_depth = r.usize()?;
        let image_array_size = r.usize()?;
        let image_row_pitch = r.usize()?;
        let image_slice_pitch = r.usize()?;
        let num_mip_levels = r.u32()?;
        let num_samples = r.u32()?;
        let buffer = r.u64()?;
        let desc = cl_image_desc {
            image_type,
            image_width,
            image_height,
            image_depth,
            image_array_size,
            image_row_pitch,
            image_slice_pitch,
            num_mip_levels,
            num_samples,
            buffer: std::ptr::null_mut(),
        };
        Ok(Some((Box::new(desc), buffer)))
    }

    /// Resolves the buffer a 1-D buffer image is made from.
    pub fn resolve_image_desc(
        &self,
        d: Option<(Box<cl_image_desc>, u64)>,
    ) -> Result<Option<Box<cl_image_desc>>, Fail> {
        let Some((mut desc, buffer)) = d else {
            return Ok(None);
        };
        desc.buffer = self
            .lookup(buffer, Kind::Mem, true)
            .map_err(|_| Fail::Status(-65))?
            .cast();
        Ok(Some(desc))
    }

    pub fn desc_ptr(d: &Option<Box<cl_image_desc>>) -> *const cl_image_desc {
        d.as_ref().map_or(std::ptr::null(), |d| &**d)
    }

    /// Bytes of a packed region of `[w, h, d]` bytes/rows/slices.
    pub fn region_bytes(region: &Option<Vec<usize>>) -> Result<usize, Fail> {
        match region.as_deref() {
            Some(&[w, h, d]) => w
                .checked_mul(h)
                .and_then(|x| x.checked_mul(d))
                .filter(|&n| n <= super::staging::MAX_STAGED)
                .ok_or(Fail::Status(CL_INVALID_VALUE)),
            _ => Err(Fail::Status(CL_INVALID_VALUE)),
        }
    }

    /// Bytes of a packed image region, using the host's element size for `image`.
    pub fn image_region_bytes(
        &self,
        image: opencl_sys::cl_mem,
        region: &Option<Vec<usize>>,
    ) -> Result<usize, Fail> {
        let px = Self::region_bytes(region)?;
        let mut elem = 0usize;
        let status = self.rt().clGetImageInfo(
            image,
            0x1111,
            size_of::<usize>(),
            (&mut elem as *mut usize).cast(),
            std::ptr::null_mut(),
        );
        if status != Some(CL_SUCCESS) {
            return Err(Fail::Status(status.unwrap_or(CL_OUT_OF_RESOURCES)));
        }
        px.checked_mul(elem)
            .filter(|&n| n <= super::staging::MAX_STAGED)
            .ok_or(Fail::Status(CL_INVALID_VALUE))
    }

    /// Whether input bytes are in the data window.
    pub fn in_window(b: &BytesIn<'_>) -> bool {
        matches!(b, BytesIn::Window(..))
    }

    /// Copies input bytes into a buffer the host may read after the call returns.
    pub fn detach(b: &BytesIn<'_>) -> (*mut c_void, Option<Box<[u8]>>) {
        let (src, len): (*const u8, usize) = match b {
            BytesIn::Null | BytesIn::Streamed(_) => return (std::ptr::null_mut(), None),
            BytesIn::Slice(s) => (s.as_ptr(), s.len()),
            BytesIn::Aligned(v, len) => (v.as_ptr().cast(), *len),
            BytesIn::Window(p, len) | BytesIn::Svm(p, len) | BytesIn::WindowMem(p, len, _) => {
                (*p, *len)
            }
        };
        let mut owned: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        // SAFETY: `src` is valid for `len` reads (a private buffer, or a span checked to
        // lie inside the mapped window); a raw copy makes no reference to shared memory.
        unsafe { std::ptr::copy_nonoverlapping(src, owned.as_mut_ptr(), len) };
        (owned.as_mut_ptr().cast(), Some(owned))
    }

    /// Whether a wait list is exactly as long as its count says (an inconsistent one is
    /// left for the host to refuse, and gets no gate added).
    pub fn wait_list_given(list: &Option<Vec<cl_event>>, n: u32) -> bool {
        list.as_ref().map_or(0, Vec::len) == n as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_host_ptr_becomes_copy_for_the_host() {
        assert_eq!(
            Session::host_mem_flags(CL_MEM_USE_HOST_PTR | 1).ok(),
            Some(CL_MEM_COPY_HOST_PTR | 1)
        );
        assert_eq!(Session::host_mem_flags(1).ok(), Some(1));
        // Invalid combinations stay invalid, not a valid copy.
        for other in [CL_MEM_ALLOC_HOST_PTR, CL_MEM_COPY_HOST_PTR] {
            assert!(matches!(
                Session::host_mem_flags(CL_MEM_USE_HOST_PTR | other),
                Err(Fail::Status(CL_INVALID_VALUE))
            ));
        }
    }

    #[test]
    fn present_array_with_wrong_count_is_rejected() {
        assert!(Session::check_count(&Some(vec![1, 2]), 3).is_err());
        assert!(Session::check_count::<u8>(&None, 3).is_ok());
    }

    #[test]
    fn property_list_with_a_zero_key_is_rejected() {
        let mut w = Writer::new();
        w.u8(1).u32(4).u64(5).u64(1).u64(0).u64(7);
        assert!(Session::zlist(&mut Reader::new(w.as_slice())).is_err());
    }

    #[test]
    fn property_list_with_a_zero_value_is_kept_whole() {
        let mut w = Writer::new();
        w.u8(1).u32(2).u64(0x1093).u64(0);
        let v = Session::zlist(&mut Reader::new(w.as_slice())).unwrap();
        assert_eq!(v, Some(vec![0x1093, 0, 0]));
    }

    #[test]
    fn property_list_of_odd_length_is_rejected() {
        let mut w = Writer::new();
        w.u8(1).u32(3).u64(0x1093).u64(0).u64(5);
        assert!(Session::zlist(&mut Reader::new(w.as_slice())).is_err());
    }

    #[test]
    fn empty_source_is_a_valid_empty_string_and_a_missing_array_is_invalid() {
        let mut w = Writer::new();
        w.u8(1).u32(2).bytes(b"").bytes(b"ab");
        let b = Session::blobs(&mut Reader::new(w.as_slice())).unwrap();
        assert!(b.check_count(2).is_ok());
        // SAFETY: `ptrs` holds two pointers to NUL-terminated storage.
        let first = unsafe { std::ffi::CStr::from_ptr((*b.ptrs()).cast()) };
        assert_eq!(first.to_bytes(), b"");
        let mut w = Writer::new();
        w.u8(0);
        let absent = Session::blobs(&mut Reader::new(w.as_slice())).unwrap();
        assert!(matches!(
            absent.check_count(3),
            Err(Fail::Status(CL_INVALID_VALUE))
        ));
    }

    #[test]
    fn kernel_bytes_of_wrong_size_are_rejected() {
        let k = KernelArg::Bytes(vec![0], 4);
        assert!(matches!(
            k.host_arg(8),
            Err(Fail::Status(CL_INVALID_ARG_SIZE))
        ));
    }
}
