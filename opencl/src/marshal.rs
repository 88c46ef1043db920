//! Request building and reply reading for the generated entry points.
//!
//! Each argument kind of the API description maps to one method of [`Call`] (encode)
//! and, for outputs, one of [`Reply`] (decode). The encoding of each kind is described
//! in `docs/protocol.md`; the API server's decoder is its mirror image.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::{LazyLock, Mutex};

use hira_apis_opencl::sizes::RectLayout;
use hira_apis_opencl::{CL_CONTEXT_PLATFORM, CL_PROGRAM_BINARIES, InfoHandles, Kind, tag};
use hira_guest_driver::{Connection, WindowRegion, endpoint};
use hira_protocol::Span;
use hira_protocol::codec::{MAX_ARRAY, Reader, Writer};
use hira_protocol::frame::{FrameKind, MAX_FRAME_BODY};
use hira_protocol::handshake::{ErrorPayload, error_code};
use log::warn;
use opencl_sys::{cl_image_desc, cl_int};

use crate::rt::{self, CL_INVALID_VALUE, CL_OUT_OF_RESOURCES};

use opencl_sys::CL_INVALID_IMAGE_DESCRIPTOR;
use opencl_sys::CL_INVALID_OPERATION;
use opencl_sys::CL_INVALID_WORK_DIMENSION;
/// Largest zero-terminated property list the guest will send.
const MAX_PROPERTIES: usize = 128;

static INLINE_MAX: LazyLock<usize> = LazyLock::new(endpoint::inline_max);

/// Where an output will arrive.
#[derive(Debug)]
pub enum OutSlot {
    Null,
    Inline(usize),
    /// Index into the call's window regions, and length.
    Window(usize, usize),
    /// Kept by the host under a token, fetched in chunks after the reply.
    Staged(u64, usize),
}

/// Bytes per `hiraStage`/`hiraFetch` chunk: well inside a frame.
const STAGE_CHUNK: usize = 64 << 20;

/// Sends `src` ahead in chunks; returns the token that names it.
fn stage(src: &[u8]) -> Result<u64, cl_int> {
    let token = rt::conn()?.next_token();
    let mut offset = 0;
    for chunk in src.chunks(STAGE_CHUNK) {
        // SAFETY: `chunk` is valid for `chunk.len()` reads.
        let status = unsafe {
            crate::generated::hiraStage(
                token,
                src.len() as u64,
                offset as u64,
                chunk.len(),
                chunk.as_ptr().cast(),
            )
        };
        if status != 0 {
            return Err(status);
        }
        offset += chunk.len();
    }
    Ok(token)
}

/// Fetches staged output `token` into `dst`, in chunks.
fn fetch(token: u64, dst: &mut [u8]) -> Result<(), cl_int> {
    let mut offset = 0;
    for chunk in dst.chunks_mut(STAGE_CHUNK) {
        // SAFETY: `chunk` is valid for `chunk.len()` writes.
        let status = unsafe {
            crate::generated::hiraFetch(
                token,
                offset as u64,
                chunk.len(),
                chunk.as_mut_ptr().cast(),
            )
        };
        if status != 0 {
            return Err(status);
        }
        offset += chunk.len();
    }
    Ok(())
}

/// A request under construction.
pub struct Call {
    op: u16,
    pub w: Writer,
    spans: Vec<Span>,
    regions: Vec<WindowRegion<'static>>,
    /// Bytes placed in the window for the host, and reserved there for its results.
    window_in: usize,
    window_out: usize,
    /// Token of a non-blocking read, whose output arrives after the reply.
    defer: Option<u64>,
    /// Where a write's blocking flag is in the request.
    blocking_at: Option<usize>,
}

impl Call {
    pub fn new(op: u16) -> Self {
        rt::revive(op);
        Call {
            op,
            w: Writer::with_capacity(128),
            spans: Vec::new(),
            regions: Vec::new(),
            window_in: 0,
            window_out: 0,
            defer: None,
            blocking_at: None,
        }
    }

    /// The blocking flag of a write, which [`Call::early_return`] may still clear,
    /// and the token of its window data (0: none yet; see [`Call::send`]).
    pub fn blocking_write(&mut self, blocking: bool) {
        self.blocking_at = Some(self.w.len());
        self.w.u32(u32::from(blocking)).u64(0);
    }

    /// Whether a blocking write can return without waiting, and if so makes it a
    /// non-blocking one: its data is already out of the application's memory (in the
    /// request, which the API server copies, or in the window, which stays reserved
    /// until the host has read it), so the memory is reusable at once, as the
    /// specification requires of a blocking write (which need not have completed
    /// when it returns). `allowed`: the application asked for no event, gave no wait
    /// list and the queue is in order, so nothing it can observe differs.
    pub fn early_return(&mut self, allowed: bool) -> bool {
        let Some(at) = self.blocking_at else {
            return false;
        };
        if !allowed || rt::force_sync() {
            return false;
        }
        if !self.spans.is_empty() && !rt::window_budget(self.window_in) {
            return false;
        }
        self.w.patch_u32(at, 0);
        true
    }

    /// For a non-blocking write (or one [`Call::early_return`] made so) with its data
    /// in the window: keeps the window regions until the host has read them (an
    /// `OUTPUT_DONE` notification names the token the request now carries), so the
    /// call needs no reply. False when the write has no data in the window or the
    /// session's writes in flight already hold half of it.
    fn keep_window_data(&mut self, conn: &Connection) -> bool {
        let Some(at) = self.blocking_at else {
            return false;
        };
        if self.spans.is_empty()
            || self.w.as_slice()[at..at + 4] != [0; 4]
            || !rt::window_budget(self.window_in)
        {
            return false;
        }
        let token = conn.next_token();
        self.w.patch_u64(at + 4, token);
        let regions = std::mem::take(&mut self.regions);
        let bytes = self.window_in;
        rt::window_pending(bytes, false);
        let progress = crate::stream::take_progress();
        conn.on_output(
            token,
            Box::new(move |status, _| {
                drop(regions);
                rt::window_pending(bytes, true);
                if let Some(p) = progress {
                    p.done(status);
                }
            }),
        );
        true
    }

    /// The blocking flag of a read. A non-blocking read names a token; its output is
    /// delivered when the host completes the command.
    pub fn blocking_read(&mut self, blocking: bool) -> Result<(), cl_int> {
        self.w.u32(u32::from(blocking));
        if !blocking {
            let t = rt::conn()?.next_token();
            self.w.u64(t);
            self.defer = Some(t);
        }
        Ok(())
    }

    /// A handle argument.
    pub fn handle(&mut self, kind: Kind, ptr: *mut c_void, nullable: bool) -> Result<(), cl_int> {
        if ptr.is_null() {
            if nullable {
                self.w.u64(0);
                return Ok(());
            }
            return Err(kind.invalid_code());
        }
        match rt::lookup(ptr) {
            Some((id, k)) if k == kind => {
                self.w.u64(id);
                Ok(())
            }
            _ => Err(kind.invalid_code()),
        }
    }

    /// An array of `n` handles, or null.
    ///
    /// # Safety
    /// `ptr` must be null or valid for `n` reads.
    pub unsafe fn handles(
        &mut self,
        kind: Kind,
        ptr: *const *mut c_void,
        n: usize,
        code: cl_int,
    ) -> Result<(), cl_int> {
        if ptr.is_null() {
            self.w.u8(0);
            return Ok(());
        }
        if n > MAX_ARRAY {
            return Err(CL_INVALID_VALUE);
        }
        self.w.u8(1).u32(n as u32);
        for i in 0..n {
            // SAFETY: valid for n reads per the contract.
            let h = unsafe { *ptr.add(i) };
            match rt::lookup(h) {
                Some((id, k)) if k == kind => {
                    self.w.u64(id);
                }
                _ => return Err(code),
            }
        }
        Ok(())
    }

    /// Reserves a guest-assigned id for an object the call creates (0 if none).
    pub fn new_handle(&mut self, present: bool) -> u64 {
        let id = if present { rt::new_id() } else { 0 };
        self.w.u64(id);
        id
    }

    fn window_region(&mut self, len: usize) -> Option<usize> {
        if len < *INLINE_MAX {
            return None;
        }
        let window = rt::conn().ok()?.window()?;
        let region = window.alloc(len)?;
        self.spans.push(Span {
            offset: region.offset as u64,
            len: len as u64,
        });
        self.regions.push(region);
        Some(self.regions.len() - 1)
    }

    /// Input bytes: inline, through the window, or null.
    ///
    /// # Safety
    /// `ptr` must be null or valid for `len` reads.
    pub unsafe fn bytes_in(&mut self, ptr: *const u8, len: usize) -> Result<(), cl_int> {
        if ptr.is_null() {
            self.w.u8(tag::NULL);
            return Ok(());
        }
        // SAFETY: valid for len reads per the contract.
        let src = unsafe { std::slice::from_raw_parts(ptr, len) };
        self.slice_in(src)
    }

    fn slice_in(&mut self, src: &[u8]) -> Result<(), cl_int> {
        if let Some(i) = self.window_region(src.len()) {
            // SAFETY: the region is at least src.len() bytes of the mapped window and
            // belongs to this call alone.
            unsafe { crate::stream::copy_in(src, self.regions[i].ptr()) };
            self.window_in += src.len();
            self.w.u8(tag::WINDOW).u16((self.spans.len() - 1) as u16);
            return Ok(());
        }
        if src.len() > MAX_FRAME_BODY - 64 * 1024 {
            let token = stage(src)?;
            self.w.u8(tag::STAGED).u64(token).u64(src.len() as u64);
            return Ok(());
        }
        self.w.u8(tag::INLINE).bytes(src);
        Ok(())
    }

    /// A buffer's initial contents: streamed after the call when large (`true`; see
    /// [`crate::stream::fill`]), else as any input.
    ///
    /// # Safety
    /// `ptr` must be null or valid for `len` reads.
    pub unsafe fn initial_data(
        &mut self,
        ptr: *const u8,
        len: usize,
        flags: u64,
    ) -> Result<bool, cl_int> {
        if !ptr.is_null() && crate::stream::streams_initial_data(len, flags) {
            self.w.u8(tag::STREAMED).u64(len as u64);
            return Ok(true);
        }
        // SAFETY: forwarded contract.
        unsafe { self.bytes_in(ptr, len)? };
        Ok(false)
    }

    /// A pointer into SVM allocation `id`, in place of bytes.
    pub fn svm_ref(&mut self, id: u64, offset: usize) {
        self.w.u8(tag::SVM).u64(id).u64(offset as u64);
    }

    /// Requests an output of `len` bytes for `ptr`.
    pub fn bytes_out(&mut self, ptr: *mut u8, len: usize) -> Result<OutSlot, cl_int> {
        if ptr.is_null() {
            self.w.u8(tag::NULL);
            return Ok(OutSlot::Null);
        }
        self.out_slot(len)
    }

    fn out_slot(&mut self, len: usize) -> Result<OutSlot, cl_int> {
        if let Some(i) = self.window_region(len) {
            self.w.u8(tag::WINDOW).u16((self.spans.len() - 1) as u16);
            self.window_out += len;
            return Ok(OutSlot::Window(i, len));
        }
        if len > MAX_FRAME_BODY - 64 * 1024 {
            let token = rt::conn()?.next_token();
            self.w.u8(tag::STAGED).u64(token);
            return Ok(OutSlot::Staged(token, len));
        }
        self.w.u8(tag::INLINE);
        Ok(OutSlot::Inline(len))
    }

    /// Input from a rectangle of application memory, sent packed.
    ///
    /// # Safety
    /// `ptr` must be null or valid for `layout.extent()` reads.
    pub unsafe fn packed_in(&mut self, ptr: *const u8, layout: &RectLayout) -> Result<(), cl_int> {
        if ptr.is_null() {
            self.w.u8(tag::NULL);
            return Ok(());
        }
        let extent = layout.extent().ok_or(CL_INVALID_VALUE)?;
        // SAFETY: valid for `extent` reads per the contract.
        let src = unsafe { std::slice::from_raw_parts(ptr, extent) };
        let packed = layout.pack(src);
        self.slice_in(&packed)
    }

    /// Requests a packed rectangle output.
    pub fn packed_out(&mut self, layout: &RectLayout) -> Result<OutSlot, cl_int> {
        self.out_slot(layout.packed_len().ok_or(CL_INVALID_VALUE)?)
    }

    /// A NUL-terminated string, or null.
    ///
    /// # Safety
    /// `s` must be null or NUL-terminated.
    pub unsafe fn cstr(&mut self, s: *const c_char) -> Result<(), cl_int> {
        if s.is_null() {
            self.w.u8(0);
        } else {
            // SAFETY: NUL-terminated per the contract.
            let b = unsafe { CStr::from_ptr(s) }.to_bytes();
            self.w.u8(1).bytes(b);
        }
        Ok(())
    }

    /// An array of `n` NUL-terminated strings, or null.
    ///
    /// # Safety
    /// `p` must be null or valid for `n` reads of NUL-terminated strings.
    pub unsafe fn cstrs(&mut self, p: *const *const c_char, n: usize) -> Result<(), cl_int> {
        if p.is_null() {
            self.w.u8(0);
            return Ok(());
        }
        if n > MAX_ARRAY {
            return Err(CL_INVALID_VALUE);
        }
        self.w.u8(1).u32(n as u32);
        for i in 0..n {
            // SAFETY: valid for n reads per the contract.
            let s = unsafe { *p.add(i) };
            if s.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: NUL-terminated per the contract.
            self.w.bytes(unsafe { CStr::from_ptr(s) }.to_bytes());
        }
        Ok(())
    }

    /// Program sources: `n` strings with optional lengths (0 or null: NUL-terminated).
    ///
    /// # Safety
    /// `strings` must be null or valid for `n` reads; `lengths` null or valid for `n`.
    pub unsafe fn sources(
        &mut self,
        strings: *const *const c_char,
        lengths: *const usize,
        n: usize,
    ) -> Result<(), cl_int> {
        if strings.is_null() || n == 0 {
            self.w.u8(0);
            return Ok(());
        }
        if n > MAX_ARRAY {
            return Err(CL_INVALID_VALUE);
        }
        self.w.u8(1).u32(n as u32);
        for i in 0..n {
            // SAFETY: valid for n reads per the contract.
            let s = unsafe { *strings.add(i) };
            if s.is_null() {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: as above.
            let len = if lengths.is_null() {
                0
            } else {
                // SAFETY: non-null lengths are valid for n reads per the contract.
                unsafe { *lengths.add(i) }
            };
            let bytes = if len == 0 {
                // SAFETY: without a length the string is NUL-terminated.
                unsafe { CStr::from_ptr(s) }.to_bytes()
            } else {
                // SAFETY: the application names `len` readable bytes.
                unsafe { std::slice::from_raw_parts(s.cast::<u8>(), len) }
            };
            self.w.bytes(bytes);
        }
        Ok(())
    }

    /// Program binaries with their lengths.
    ///
    /// # Safety
    /// `bins` and `lengths` must be null or valid for `n` reads, each binary for its length.
    pub unsafe fn binaries(
        &mut self,
        bins: *const *const u8,
        lengths: *const usize,
        n: usize,
    ) -> Result<(), cl_int> {
        if bins.is_null() || lengths.is_null() {
            self.w.u8(0);
            return Ok(());
        }
        if n > MAX_ARRAY {
            return Err(CL_INVALID_VALUE);
        }
        self.w.u8(1).u32(n as u32);
        for i in 0..n {
            // SAFETY: valid for n reads per the contract.
            let (b, len) = unsafe { (*bins.add(i), *lengths.add(i)) };
            if b.is_null() || len == 0 {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the application names `len` readable bytes.
            self.w.bytes(unsafe { std::slice::from_raw_parts(b, len) });
        }
        Ok(())
    }

    /// An array of `n` (at most 3) `size_t`, or null.
    ///
    /// # Safety
    /// `p` must be null or valid for `n` reads.
    pub unsafe fn sizes(&mut self, p: *const usize, n: usize) -> Result<(), cl_int> {
        if p.is_null() {
            self.w.u8(0);
            return Ok(());
        }
        if n > 3 {
            return Err(CL_INVALID_WORK_DIMENSION);
        }
        self.w.u8(1).u32(n as u32);
        for i in 0..n {
            // SAFETY: valid for n reads per the contract.
            self.w.u64(unsafe { *p.add(i) } as u64);
        }
        Ok(())
    }

    /// A property list (key/value pairs ended by a zero key), or null. Values may be
    /// zero, so the list is read in pairs.
    ///
    /// # Safety
    /// `p` must be null or a list of key/value pairs ended by a zero key.
    pub unsafe fn zlist(&mut self, p: *const u64) -> Result<(), cl_int> {
        // SAFETY: forwarded contract.
        let words = unsafe { read_list(p, 2) }?;
        self.words(words);
        Ok(())
    }

    /// Device partition properties: a partition type, then its values (see
    /// [`hira_apis_opencl::partition_words`]). A type this build does not know is
    /// `CL_INVALID_VALUE`, as for a device that does not support it.
    ///
    /// # Safety
    /// `p` must be null or a partition property list as the specification defines it.
    pub unsafe fn partition_properties(&mut self, p: *const isize) -> Result<(), cl_int> {
        if p.is_null() {
            self.words(None);
            return Ok(());
        }
        let mut v: Vec<u64> = Vec::new();
        loop {
            if v.len() > hira_apis_opencl::MAX_PARTITION_WORDS {
                return Err(CL_INVALID_VALUE);
            }
            // SAFETY: the list is read word by word only as far as its shape says.
            v.push(unsafe { *p.add(v.len()) } as u64);
            match hira_apis_opencl::partition_words(&v) {
                Some(true) => break,
                Some(false) => {}
                None => return Err(CL_INVALID_VALUE),
            }
        }
        self.words(Some(v));
        Ok(())
    }

    /// Context properties, translating the platform handle.
    ///
    /// # Safety
    /// `p` must be null or a zero-terminated list of key/value pairs.
    pub unsafe fn context_properties(&mut self, p: *const isize) -> Result<(), cl_int> {
        // SAFETY: forwarded contract; isize and u64 have the same size.
        let mut words = unsafe { read_list(p.cast(), 2) }?;
        if let Some(w) = &mut words {
            for pair in w
                .chunks_mut(2)
                .filter(|pair| pair[0] == CL_CONTEXT_PLATFORM)
            {
                pair[1] = match rt::lookup(pair[1] as *mut c_void) {
                    Some((id, Kind::Platform)) => id,
                    _ => return Err(Kind::Platform.invalid_code()),
                };
            }
        }
        self.words(words);
        Ok(())
    }

    fn words(&mut self, words: Option<Vec<u64>>) {
        match words {
            None => {
                self.w.u8(0);
            }
            Some(v) => {
                self.w.u8(1).u32(v.len() as u32);
                for x in v {
                    self.w.u64(x);
                }
            }
        }
    }

    /// A kernel argument: an object handle when the value is one of ours, else bytes.
    ///
    /// # Safety
    /// `value` must be null or valid for `size` reads.
    pub unsafe fn kernel_arg(&mut self, value: *const c_void, size: usize) -> Result<(), cl_int> {
        if value.is_null() {
            self.w.u8(tag::NULL);
            return Ok(());
        }
        if size == size_of::<*mut c_void>() {
            // SAFETY: `size` bytes are readable; read unaligned as the API allows any.
            let h = unsafe { (value as *const *mut c_void).read_unaligned() };
            if let Some((id, kind @ (Kind::Mem | Kind::Sampler | Kind::Queue))) = rt::lookup(h) {
                self.w.u8(tag::HANDLE).u8(kind as u8).u64(id);
                return Ok(());
            }
        }
        if size > 64 * 1024 {
            return Err(CL_INVALID_VALUE);
        }
        // SAFETY: valid for size reads per the contract.
        self.w
            .u8(tag::INLINE)
            .bytes(unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
        Ok(())
    }

    /// An image descriptor, translating its buffer handle.
    ///
    /// # Safety
    /// `d` must be null or point to a `cl_image_desc`.
    pub unsafe fn image_desc(&mut self, d: *const cl_image_desc) -> Result<(), cl_int> {
        if d.is_null() {
            self.w.u8(0);
            return Ok(());
        }
        // SAFETY: points to a cl_image_desc per the contract.
        let d = unsafe { &*d };
        let buffer = if d.buffer.is_null() {
            0
        } else {
            match rt::lookup(d.buffer) {
                Some((id, Kind::Mem)) => id,
                _ => return Err(CL_INVALID_IMAGE_DESCRIPTOR),
            }
        };
        self.w
            .u8(1)
            .u32(d.image_type)
            .u64(d.image_width as u64)
            .u64(d.image_height as u64)
            .u64(d.image_depth as u64)
            .u64(d.image_array_size as u64)
            .u64(d.image_row_pitch as u64)
            .u64(d.image_slice_pitch as u64)
            .u32(d.num_mip_levels)
            .u32(d.num_samples)
            .u64(buffer);
        Ok(())
    }

    /// Sends the call. With `may_async` and no data in the window, it is forwarded
    /// without waiting and reported successful (errors are logged by the host).
    pub fn send(mut self, may_async: bool) -> Result<Reply, cl_int> {
        let conn = rt::conn()?;
        let kept = may_async && !rt::force_sync() && self.keep_window_data(conn);
        // A chunk of a streamed read: its output's token brings the data, or why not.
        let detached = self.defer.is_some() && crate::stream::detaching();
        let no_reply =
            detached || (may_async && (self.spans.is_empty() || kept) && !rt::force_sync());
        crate::stats::bytes(self.w.len() + self.window_in, 0);
        match conn.call(self.op, &self.spans, self.w.as_slice(), no_reply) {
            Ok(None) => Ok(Reply {
                status: 0,
                r: ReplyReader::new(Vec::new(), CL_INVALID_VALUE),
                regions: self.regions,
                defer: self.defer,
            }),
            Ok(Some(frame)) => match frame.header.kind {
                FrameKind::Reply => {
                    crate::stats::bytes(0, frame.payload.len() + self.window_out);
                    let mut r = ReplyReader::new(frame.payload, CL_INVALID_VALUE);
                    let status = r.i32()?;
                    Ok(Reply {
                        status,
                        r,
                        regions: self.regions,
                        defer: self.defer,
                    })
                }
                _ => {
                    let e =
                        ErrorPayload::decode(&frame.payload).map_err(|_| CL_OUT_OF_RESOURCES)?;
                    warn!("host rejected opcode {}: {}", self.op, e.message);
                    Err(match e.code {
                        error_code::UNKNOWN_OPCODE => CL_INVALID_OPERATION,
                        error_code::SERVER_GONE => CL_OUT_OF_RESOURCES,
                        _ => CL_INVALID_VALUE,
                    })
                }
            },
            Err(_) => Err(CL_OUT_OF_RESOURCES),
        }
    }
}

/// Reads a zero-terminated list of entries of `stride` words (properties: 1,
/// key/value pairs: 2) up to the zero that starts an entry; `None` for NULL.
///
/// # Safety
/// `p` must be null or such a list.
unsafe fn read_list(p: *const u64, stride: usize) -> Result<Option<Vec<u64>>, cl_int> {
    if p.is_null() {
        return Ok(None);
    }
    let mut v = Vec::new();
    loop {
        // SAFETY: reading entries up to and including the terminating zero.
        if unsafe { *p.add(v.len()) } == 0 {
            return Ok(Some(v));
        }
        if v.len() >= MAX_PROPERTIES {
            return Err(CL_INVALID_VALUE);
        }
        for _ in 0..stride {
            // SAFETY: an entry that does not start with zero is `stride` words long.
            v.push(unsafe { *p.add(v.len()) });
        }
    }
}

/// Reads a reply payload; any inconsistency is `CL_INVALID_VALUE`.
pub use hira_guest_driver::reply::ReplyReader;

/// A decoded reply: the call's status, then its outputs.
pub struct Reply {
    pub status: cl_int,
    pub r: ReplyReader,
    regions: Vec<WindowRegion<'static>>,
    defer: Option<u64>,
}

/// Where a deferred output goes in application memory.
#[derive(Clone, Copy)]
enum Dest {
    Bytes(usize),
    Rect(usize, RectLayout),
}

impl Reply {
    /// Registers the copy of a deferred output into application memory, run when the
    /// host reports the command complete. The window regions stay reserved until then.
    fn defer_out(&mut self, token: u64, slot: &OutSlot, dest: Dest) -> Result<(), cl_int> {
        let slot_len = match *slot {
            OutSlot::Null => return Ok(()),
            // The host completed a staged read before replying.
            OutSlot::Staged(..) => {
                self.defer = None;
                return match dest {
                    // SAFETY: the application passed memory valid for the output.
                    Dest::Bytes(p) => unsafe { self.bytes_out(slot, p as *mut u8) },
                    // SAFETY: as above, for the rectangle's extent.
                    Dest::Rect(p, layout) => unsafe {
                        self.unpack_out(slot, p as *mut u8, &layout)
                    },
                };
            }
            OutSlot::Inline(len) | OutSlot::Window(_, len) => len,
        };
        let window = match *slot {
            OutSlot::Window(i, _) => Some(i),
            _ => None,
        };
        let regions = std::mem::take(&mut self.regions);
        let conn = rt::conn()?;
        let deliver = move |status: cl_int, data: Option<&[u8]>| {
            if status != 0 {
                return;
            }
            let src: &[u8] = match (window, data) {
                // SAFETY: the region holds `slot_len` bytes the host wrote before
                // it reported the command complete, and stays reserved until here.
                (Some(i), _) => unsafe { std::slice::from_raw_parts(regions[i].ptr(), slot_len) },
                (None, Some(d)) if d.len() == slot_len => d,
                _ => {
                    warn!("deferred output of the wrong size");
                    return;
                }
            };
            match dest {
                // SAFETY: the application passed memory valid for the output's
                // length and may not touch it until the read completes.
                Dest::Bytes(p) => unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), p as *mut u8, slot_len)
                },
                Dest::Rect(p, layout) => {
                    let Some(extent) = layout.extent() else {
                        return;
                    };
                    // SAFETY: as above, for the rectangle's extent.
                    let dst = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, extent) };
                    layout.unpack(src, dst);
                }
            }
            drop(regions);
        };
        let progress = crate::stream::take_progress();
        conn.on_output(
            token,
            Box::new(move |status, data| {
                deliver(status, data);
                if let Some(p) = progress {
                    p.done(status);
                }
            }),
        );
        Ok(())
    }

    fn take_out(&mut self, slot: &OutSlot) -> Result<Option<Vec<u8>>, cl_int> {
        match *slot {
            OutSlot::Null => Ok(None),
            OutSlot::Staged(token, len) => {
                let mut v = vec![0u8; len];
                fetch(token, &mut v)?;
                Ok(Some(v))
            }
            OutSlot::Inline(len) => {
                let b = self.r.bytes()?.to_vec();
                if b.len() != len {
                    warn!("reply carries {} bytes, expected {len}", b.len());
                    return Err(CL_INVALID_VALUE);
                }
                Ok(Some(b))
            }
            OutSlot::Window(i, len) => {
                let mut v = vec![0u8; len];
                // SAFETY: the region holds `len` bytes the host wrote before replying.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.regions[i].ptr(), v.as_mut_ptr(), len)
                };
                Ok(Some(v))
            }
        }
    }

    /// Copies an output into application memory.
    ///
    /// # Safety
    /// `ptr` must be valid for the slot's length in writes.
    pub unsafe fn bytes_out(&mut self, slot: &OutSlot, ptr: *mut u8) -> Result<(), cl_int> {
        if let Some(token) = self.defer {
            return self.defer_out(token, slot, Dest::Bytes(ptr as usize));
        }
        if let OutSlot::Window(i, len) = *slot {
            // SAFETY: the region holds `len` bytes; `ptr` is valid for `len` writes.
            unsafe { std::ptr::copy_nonoverlapping(self.regions[i].ptr(), ptr, len) };
            return Ok(());
        }
        if let OutSlot::Staged(token, len) = *slot {
            // SAFETY: `ptr` is valid for the slot's length in writes.
            return fetch(token, unsafe { std::slice::from_raw_parts_mut(ptr, len) });
        }
        if let Some(b) = self.take_out(slot)? {
            // SAFETY: `ptr` is valid for the slot's length, which `b` has.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), ptr, b.len()) };
        }
        Ok(())
    }

    /// Scatters a packed rectangle output into application memory.
    ///
    /// # Safety
    /// `ptr` must be valid for `layout.extent()` writes.
    pub unsafe fn unpack_out(
        &mut self,
        slot: &OutSlot,
        ptr: *mut u8,
        layout: &RectLayout,
    ) -> Result<(), cl_int> {
        if let Some(token) = self.defer {
            return self.defer_out(token, slot, Dest::Rect(ptr as usize, *layout));
        }
        if let Some(b) = self.take_out(slot)? {
            let extent = layout.extent().ok_or(CL_INVALID_VALUE)?;
            // SAFETY: valid for `extent` writes per the contract.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr, extent) };
            layout.unpack(&b, dst);
        }
        Ok(())
    }

    /// Objects returned by the host, written into the application's array of `n`.
    ///
    /// # Safety
    /// `ptr` must be valid for `n` writes.
    pub unsafe fn handles_out(
        &mut self,
        kind: Kind,
        ptr: *mut *mut c_void,
        n: usize,
    ) -> Result<(), cl_int> {
        let count = self.r.u32()? as usize;
        if count > n {
            return Err(CL_INVALID_VALUE);
        }
        for i in 0..count {
            let id = self.r.u64()?;
            // SAFETY: i < count <= n.
            unsafe { *ptr.add(i) = rt::adopt(kind, id) };
        }
        Ok(())
    }

    /// Checks the whole reply was consumed.
    pub fn finish(&self) -> Result<(), cl_int> {
        self.r.finish()
    }
}

/// Info parameters that change over an object's life and so are never cached.
const UNCACHEABLE: &[u32] = &[0x1047];

type InfoCache = Mutex<HashMap<(u16, Vec<u8>), Vec<u8>>>;
static INFO_CACHE: LazyLock<InfoCache> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Runs an info query: the host returns the whole value; the guest translates
/// handles, applies its own view (platform identity, memory flags) and the API's
/// size rules.
///
/// # Safety
/// `value` must be null or valid for `size` writes, `size_ret` null or valid.
pub unsafe fn info_call(
    c: Call,
    function: &str,
    cache: bool,
    param: u32,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Result<cl_int, cl_int> {
    let first_id =
        c.w.as_slice()
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
    let key = (cache && !UNCACHEABLE.contains(&param)).then(|| (c.op, c.w.as_slice().to_vec()));
    let cached = key.as_ref().and_then(|k| {
        INFO_CACHE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(k)
            .cloned()
    });
    let bytes = match cached {
        Some(b) => b,
        None => {
            let mut rep = c.send(false)?;
            if rep.status != 0 {
                rep.finish()?;
                return Ok(rep.status);
            }
            let mut b = rep.r.bytes()?.to_vec();
            rep.finish()?;
            translate_handles(function, param, &mut b)?;
            rewrite(function, param, first_id, &mut b);
            if let Some(k) = key {
                INFO_CACHE
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(k, b.clone());
            }
            b
        }
    };
    if function == "clGetProgramInfo" && param == CL_PROGRAM_BINARIES {
        // SAFETY: forwarded contract.
        return unsafe { program_binaries(&bytes, size, value, size_ret) };
    }
    // SAFETY: forwarded contract.
    Ok(unsafe { info_answer(&bytes, size, value, size_ret) })
}

/// Writes a whole info value with the API's size rules: `CL_INVALID_VALUE` when
/// `value` is given and smaller than it; its size into `size_ret` if asked.
///
/// # Safety
/// `value` must be null or valid for `size` writes, `size_ret` null or valid.
pub(crate) unsafe fn info_answer(
    bytes: &[u8],
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    if !value.is_null() {
        if size < bytes.len() {
            return CL_INVALID_VALUE;
        }
        // SAFETY: `value` is valid for `size` >= bytes.len() writes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), value.cast::<u8>(), bytes.len()) };
    }
    if !size_ret.is_null() {
        // SAFETY: valid for one write per the contract.
        unsafe { *size_ret = bytes.len() };
    }
    0
}

/// `CL_PROGRAM_BINARIES`: the host sends each binary length-prefixed; the value the
/// application sees is its own array of pointers, which we fill.
unsafe fn program_binaries(
    bytes: &[u8],
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Result<cl_int, cl_int> {
    let mut r = Reader::new(bytes);
    let mut bins = Vec::new();
    while r.remaining() > 0 {
        bins.push(r.bytes(MAX_FRAME_BODY).map_err(|_| CL_INVALID_VALUE)?);
    }
    let need = bins.len() * size_of::<*mut u8>();
    if !value.is_null() {
        if size < need {
            return Ok(CL_INVALID_VALUE);
        }
        for (i, b) in bins.iter().enumerate() {
            // SAFETY: `value` holds `size >= need` bytes of pointers.
            let dst = unsafe { *(value as *const *mut u8).add(i) };
            if !dst.is_null() {
                // SAFETY: the application sized each buffer from CL_PROGRAM_BINARY_SIZES.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
            }
        }
    }
    if !size_ret.is_null() {
        // SAFETY: valid for one write.
        unsafe { *size_ret = need };
    }
    Ok(0)
}

fn translate_handles(function: &str, param: u32, b: &mut [u8]) -> Result<(), cl_int> {
    let Some(how) = hira_apis_opencl::info_handles(function, param) else {
        return Ok(());
    };
    if !b.len().is_multiple_of(8) {
        return Err(CL_INVALID_VALUE);
    }
    let mut words: Vec<u64> = b
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    match how {
        InfoHandles::One(kind) | InfoHandles::Array(kind) => {
            for w in words.iter_mut().filter(|w| **w != 0) {
                *w = rt::adopt(kind, *w) as u64;
            }
        }
        InfoHandles::ContextProperties => {
            for pair in words.chunks_mut(2) {
                if pair.len() == 2 && pair[0] == CL_CONTEXT_PLATFORM && pair[1] != 0 {
                    pair[1] = rt::adopt(Kind::Platform, pair[1]) as u64;
                }
            }
        }
    }
    for (c, w) in b.chunks_mut(8).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
    }
    Ok(())
}

/// The platform's identity strings as the guest sees them. By default they are the
/// host's, so that libraries select platforms and per-vendor paths as natively; Hira
/// shows itself only in the ICD suffix (`CL_PLATFORM_ICD_SUFFIX_KHR` = `HIRA`), which
/// no application selects by. `tagged` (`HIRA_IDENTITY=tagged`) also names Hira in
/// the platform's name, vendor and version.
fn platform_string(param: u32, host: &str, tagged: bool) -> Option<String> {
    match (param, tagged) {
        (0x0920, _) => Some("HIRA".to_string()),
        (0x0902, true) => Some(format!("Hira remote OpenCL ({host})")),
        (0x0903, true) => Some("Hira".to_string()),
        (0x0901, true) => Some(format!("{host} Hira/{}", env!("CARGO_PKG_VERSION"))),
        _ => None,
    }
}

/// Whether the platform names Hira (`HIRA_IDENTITY=tagged`).
fn tagged_identity() -> bool {
    static TAGGED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TAGGED.get_or_init(|| hira_guest_driver::settings::settings().identity_tagged)
}

fn rewrite(function: &str, param: u32, obj_id: u64, b: &mut Vec<u8>) {
    match function {
        "clGetPlatformInfo" => {
            let host = String::from_utf8_lossy(b.strip_suffix(&[0]).unwrap_or(b)).into_owned();
            if let Some(s) = platform_string(param, &host, tagged_identity()) {
                *b = s.into_bytes();
                b.push(0);
            }
            mask_extensions(
                param,
                CL_PLATFORM_EXTENSIONS,
                CL_PLATFORM_EXTENSIONS_WITH_VERSION,
                b,
            );
        }
        "clGetEventInfo" if param == CL_EVENT_COMMAND_TYPE => {
            if let Some(t) = rt::command_type(obj_id) {
                *b = t.to_le_bytes().to_vec();
            }
        }
        "clGetDeviceInfo" => {
            mask_device(param, b);
            mask_extensions(
                param,
                CL_DEVICE_EXTENSIONS,
                CL_DEVICE_EXTENSIONS_WITH_VERSION,
                b,
            );
        }
        "clGetMemObjectInfo" => {
            let Some(extra) = rt::mem_extra(obj_id) else {
                return;
            };
            match param {
                0x1101 => *b = extra.flags.to_le_bytes().to_vec(),
                0x1103 => *b = (extra.host_ptr as u64).to_le_bytes().to_vec(),
                _ => {}
            }
        }
        _ => {}
    }
}

use opencl_sys::CL_DEVICE_EXTENSIONS;
use opencl_sys::CL_DEVICE_EXTENSIONS_WITH_VERSION;
use opencl_sys::CL_EVENT_COMMAND_TYPE;
use opencl_sys::CL_PLATFORM_EXTENSIONS;
use opencl_sys::CL_PLATFORM_EXTENSIONS_WITH_VERSION;

/// Extension lists without the extensions whose entry points Hira does not forward
/// (`hira_apis_opencl::extensions`).
fn mask_extensions(param: u32, names: u32, versioned: u32, b: &mut Vec<u8>) {
    use hira_apis_opencl::extensions;
    if param == names {
        let host = String::from_utf8_lossy(b.strip_suffix(&[0]).unwrap_or(b)).into_owned();
        *b = extensions::mask_list(&host).into_bytes();
        b.push(0);
    } else if param == versioned {
        *b = extensions::mask_name_versions(b);
    }
}

/// `CL_DEVICE_EXECUTION_CAPABILITIES` and its `CL_EXEC_NATIVE_KERNEL` bit.
use opencl_sys::CL_DEVICE_EXECUTION_CAPABILITIES;
use opencl_sys::CL_DEVICE_PARTITION_PROPERTIES;
/// `CL_DEVICE_SVM_CAPABILITIES`.
use opencl_sys::CL_DEVICE_SVM_CAPABILITIES;
use opencl_sys::CL_DEVICE_SVM_COARSE_GRAIN_BUFFER;
use opencl_sys::CL_EXEC_NATIVE_KERNEL;

/// What Hira cannot honour across the VM boundary, or does not forward yet, is masked
/// from device properties, so that applications never select it: fine-grained shared
/// virtual memory and SVM atomics (guest and host address spaces differ; coarse-grained
/// buffers are supported, `crate::svm`), native kernels (a guest function pointer
/// cannot run on the host). The matching entry points return the specification's codes for a device
/// without them (see `icd::unsupported_code`). Of the partition types, only those the
/// specification defines are reported: a vendor's own has a property list whose shape
/// Hira cannot know, so `clCreateSubDevices` could not forward it.
fn mask_device(param: u32, b: &mut Vec<u8>) {
    if param == CL_DEVICE_PARTITION_PROPERTIES {
        let mut kept: Vec<u8> = b
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .filter(|&t| {
                matches!(
                    t,
                    hira_apis_opencl::CL_DEVICE_PARTITION_EQUALLY
                        | hira_apis_opencl::CL_DEVICE_PARTITION_BY_COUNTS
                        | hira_apis_opencl::CL_DEVICE_PARTITION_BY_AFFINITY_DOMAIN
                )
            })
            .flat_map(u64::to_le_bytes)
            .collect();
        if kept.is_empty() {
            // No type: the list is a single 0.
            kept = 0u64.to_le_bytes().to_vec();
        }
        *b = kept;
        return;
    }
    let Ok(bytes) = <[u8; 8]>::try_from(&b[..]) else {
        return;
    };
    let v = u64::from_le_bytes(bytes);
    let masked = match param {
        CL_DEVICE_EXECUTION_CAPABILITIES => v & !CL_EXEC_NATIVE_KERNEL,
        CL_DEVICE_SVM_CAPABILITIES => v & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER,
        _ => return,
    };
    b.copy_from_slice(&masked.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fine_grained_svm_and_native_kernels_are_masked_from_devices() {
        let mut caps = 3u64.to_le_bytes().to_vec();
        mask_device(CL_DEVICE_EXECUTION_CAPABILITIES, &mut caps);
        assert_eq!(caps, 1u64.to_le_bytes());
        let mut svm = 7u64.to_le_bytes().to_vec();
        mask_device(CL_DEVICE_SVM_CAPABILITIES, &mut svm);
        assert_eq!(svm, 1u64.to_le_bytes(), "coarse-grained buffers only");
        let mut other = 7u64.to_le_bytes().to_vec();
        mask_device(0x1000, &mut other);
        assert_eq!(other, 7u64.to_le_bytes());
    }

    #[test]
    fn only_the_specifications_partition_types_are_reported() {
        let words = |v: &[u64]| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        let mut types = words(&[0x1086, 0x4040, 0x1087]);
        mask_device(CL_DEVICE_PARTITION_PROPERTIES, &mut types);
        assert_eq!(types, words(&[0x1086, 0x1087]));
        let mut vendor = words(&[0x4040]);
        mask_device(CL_DEVICE_PARTITION_PROPERTIES, &mut vendor);
        assert_eq!(vendor, words(&[0]));
    }

    #[test]
    fn platform_identity_is_the_hosts_unless_tagged() {
        assert_eq!(platform_string(0x0902, "PoCL", false), None);
        assert_eq!(platform_string(0x0920, "POCL", false).unwrap(), "HIRA");
        assert_eq!(
            platform_string(0x0902, "PoCL", true).unwrap(),
            "Hira remote OpenCL (PoCL)"
        );
        assert_eq!(platform_string(0x0904, "PoCL", true), None);
    }

    #[test]
    fn null_handle_in_info_value_stays_null() {
        let mut b = 0u64.to_le_bytes().to_vec();
        translate_handles("clGetDeviceInfo", 0x1042, &mut b).unwrap();
        assert_eq!(b, 0u64.to_le_bytes());
    }

    #[test]
    fn ragged_handle_value_is_rejected() {
        let mut b = vec![0u8; 5];
        assert_eq!(
            translate_handles("clGetContextInfo", 0x1081, &mut b),
            Err(CL_INVALID_VALUE)
        );
    }

    #[test]
    fn unknown_object_is_not_a_kernel_handle() {
        let mut c = Call::new(1);
        let v: usize = 0x1234;
        // SAFETY: `v` is 8 readable bytes.
        unsafe { c.kernel_arg((&v as *const usize).cast(), 8).unwrap() };
        assert_eq!(c.w.as_slice()[0], tag::INLINE);
    }
}
