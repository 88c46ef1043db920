//! Request building and reply reading for the generated entry points.
//!
//! Each argument kind of the API description maps to one method of [`Call`] (encode)
//! and, for outputs, one of [`Reply`] (decode). The encoding of each kind is described
//! in `docs/protocol.md`; the API server's decoder is its mirror image.
//!
//! - this module: [`Call`], a request as it is built;
//! - [`reply`]: [`Reply`], a reply as it is read, and outputs deferred until the host
//!   completes them;
//! - [`info`]: info queries (the guest's cache, handles rewritten as the guest's, what
//!   Hira masks or rewrites in values).

use std::ffi::{CStr, c_char, c_void};
use std::sync::LazyLock;

use hira_apis_opencl::sizes::RectLayout;
use hira_apis_opencl::{CL_CONTEXT_PLATFORM, Kind, tag};
use hira_guest_driver::{BORROW_MIN, Borrowed, Connection, WindowRegion, endpoint};
use hira_protocol::Span;
use hira_protocol::codec::{MAX_ARRAY, Writer};
use hira_protocol::frame::{FrameKind, MAX_FRAME_BODY};
use hira_protocol::handshake::{ErrorPayload, error_code};
use log::warn;
use opencl_sys::{cl_image_desc, cl_int};

use crate::rt::{self, CL_INVALID_VALUE, CL_OUT_OF_RESOURCES};

use opencl_sys::{CL_INVALID_IMAGE_DESCRIPTOR, CL_INVALID_OPERATION, CL_INVALID_WORK_DIMENSION};

mod info;
mod reply;

pub use info::*;
pub use reply::*;

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
    /// Written by the host where the application wants it: its destination lies in
    /// the window (see [`in_place`]); nothing to copy.
    InPlace(usize),
}

thread_local! {
    /// Set while the shim's own blocking map and unmap calls run (see [`in_place`]).
    static IN_PLACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, in which data whose application memory lies in the data window (a
/// mapping's shadow placed there) goes to and from the host where it is, instead of
/// being copied into a region of its own: only for the shim's blocking map and
/// unmap calls, which hold the mapping's region until the host has read or written it.
pub(crate) fn in_place<T>(f: impl FnOnce() -> T) -> T {
    let before = IN_PLACE.replace(true);
    let out = f();
    IN_PLACE.set(before);
    out
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
    /// Some data goes where it is in the window (see [`in_place`]): the call waits for
    /// its reply.
    in_place: bool,
    /// Token of a non-blocking read, whose output arrives after the reply.
    defer: Option<u64>,
    /// Where a write's blocking flag is in the request.
    blocking_at: Option<usize>,
    /// Large inline inputs sent from the application's memory (`hira_guest_driver::
    /// borrowed`); the call is sent before its function returns ([`Call::send`]).
    borrowed: Borrowed,
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
            in_place: false,
            defer: None,
            blocking_at: None,
            borrowed: Borrowed::default(),
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
        if !allowed || rt::force_sync() || self.in_place {
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
            Some((id, k)) if k == kind && rt::lost(id, k) => Err(CL_OUT_OF_RESOURCES),
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
                Some((id, k)) if k == kind && rt::lost(id, k) => return Err(CL_OUT_OF_RESOURCES),
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

    /// The span index of `len` bytes at `ptr` sent where they are: inside
    /// [`in_place`], when they lie in the window.
    fn place(&mut self, ptr: *const u8, len: usize) -> Option<u16> {
        // Only blocking calls: a non-blocking read's output arrives after its reply.
        if !IN_PLACE.get() || len == 0 || self.defer.is_some() {
            return None;
        }
        let offset = rt::conn().ok()?.window()?.offset_of(ptr, len)?;
        self.spans.push(Span {
            offset: offset as u64,
            len: len as u64,
        });
        self.in_place = true;
        Some((self.spans.len() - 1) as u16)
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
        if let Some(span) = self.place(ptr, len) {
            self.window_in += len;
            self.w.u8(tag::WINDOW).u16(span);
            return Ok(());
        }
        // SAFETY: valid for len reads per the contract.
        let src = unsafe { std::slice::from_raw_parts(ptr, len) };
        self.slice_in(src, true)
    }

    /// The request's payload: `w`, with the borrowed inputs in their places.
    fn parts(&self) -> Vec<&[u8]> {
        self.borrowed.parts(self.w.as_slice())
    }

    /// Whether some of the request's inputs are sent from where they are, not in
    /// `w`.
    pub fn borrows(&self) -> bool {
        !self.borrowed.is_empty()
    }

    /// Input bytes `src`, through the window, staged or inline; `application`: they
    /// are the application's, valid until the call is sent, and may be sent from
    /// where they are.
    fn slice_in(&mut self, src: &[u8], application: bool) -> Result<(), cl_int> {
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
        if application && src.len() >= BORROW_MIN {
            // The length as `bytes` writes it; the bytes follow when sent.
            self.w.u8(tag::INLINE).u32(src.len() as u32);
            // SAFETY: the application's bytes, valid until the call is sent
            // (`application`).
            unsafe { self.borrowed.note(self.w.len(), src.as_ptr(), src.len()) };
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
        if let Some(span) = self.place(ptr, len) {
            self.window_out += len;
            self.w.u8(tag::WINDOW).u16(span);
            return Ok(OutSlot::InPlace(len));
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
        let len = layout.packed_len().ok_or(CL_INVALID_VALUE)?;
        if layout.is_tight()
            // SAFETY: `offset` lies within `extent` of `ptr` (only compared).
            && let Some(span) = self.place(unsafe { ptr.add(layout.offset) }, len)
        {
            self.window_in += len;
            self.w.u8(tag::WINDOW).u16(span);
            return Ok(());
        }
        if let Some(i) = self.window_region(len) {
            // Row by row straight into the window: no packed copy in between, whose
            // fresh pages would each fault in.
            let dst = self.regions[i].ptr();
            for (k, at) in layout.rows().enumerate() {
                // SAFETY: each row lies within `extent` of `ptr` (valid for reads per
                // the contract), and row `k` of the packed output within the region's
                // `len` bytes, which belong to this call alone.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        ptr.add(at),
                        dst.add(k * layout.row_bytes),
                        layout.row_bytes,
                    )
                };
            }
            self.window_in += len;
            self.w.u8(tag::WINDOW).u16((self.spans.len() - 1) as u16);
            return Ok(());
        }
        // SAFETY: valid for `extent` reads per the contract.
        let src = unsafe { std::slice::from_raw_parts(ptr, extent) };
        let packed = layout.pack(src);
        self.slice_in(&packed, false)
    }

    /// Requests a packed rectangle output.
    pub fn packed_out(&mut self, ptr: *mut u8, layout: &RectLayout) -> Result<OutSlot, cl_int> {
        let len = layout.packed_len().ok_or(CL_INVALID_VALUE)?;
        if !ptr.is_null()
            && layout.is_tight()
            && let Some(span) = self.place(ptr.wrapping_add(layout.offset), len)
        {
            self.window_out += len;
            self.w.u8(tag::WINDOW).u16(span);
            return Ok(OutSlot::InPlace(len));
        }
        self.out_slot(len)
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
        // Data sent where it is stays the application's: the call waits for the host.
        let may_async = may_async && !self.in_place;
        let conn = rt::conn()?;
        let kept = may_async && !rt::force_sync() && self.keep_window_data(conn);
        // A chunk of a streamed read: its output's token brings the data, or why not.
        let detached = self.defer.is_some() && crate::stream::detaching();
        let no_reply =
            detached || (may_async && (self.spans.is_empty() || kept) && !rt::force_sync());
        let parts = self.parts();
        let inline: usize = parts.iter().map(|p| p.len()).sum();
        crate::stats::bytes(inline + self.window_in, 0);
        match conn.call_parts(self.op, &self.spans, &parts, no_reply) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_object_is_not_a_kernel_handle() {
        let mut c = Call::new(1);
        let v: usize = 0x1234;
        // SAFETY: `v` is 8 readable bytes.
        unsafe { c.kernel_arg((&v as *const usize).cast(), 8).unwrap() };
        assert_eq!(c.w.as_slice()[0], tag::INLINE);
    }

    #[test]
    fn large_inputs_go_from_where_they_are_as_the_bytes_they_would_be_copied_as() {
        let big: Vec<u8> = (0..3 * BORROW_MIN).map(|i| (i % 251) as u8).collect();
        let small = [7u8; 16];
        let mut c = Call::new(1);
        c.w.u64(42);
        // SAFETY: each buffer is readable for its length, and outlives `c`.
        unsafe {
            c.bytes_in(big.as_ptr(), big.len()).unwrap();
            c.bytes_in(small.as_ptr(), small.len()).unwrap();
            c.bytes_in(big[1..].as_ptr(), BORROW_MIN).unwrap();
        }
        assert!(c.borrows());
        // Only the lengths are in the request under construction.
        assert!(c.w.len() < 64, "{}", c.w.len());
        let mut copied = Writer::new();
        copied.u64(42);
        copied.u8(tag::INLINE).bytes(&big);
        copied.u8(tag::INLINE).bytes(&small);
        copied.u8(tag::INLINE).bytes(&big[1..=BORROW_MIN]);
        assert_eq!(c.parts().concat(), copied.as_slice());
        // Below the threshold an input is copied.
        let mut d = Call::new(1);
        // SAFETY: as above.
        unsafe { d.bytes_in(big.as_ptr(), BORROW_MIN - 1).unwrap() };
        assert!(!d.borrows());
    }
}
