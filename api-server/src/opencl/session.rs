//! The handle table and the per-argument-kind helpers used by the generated dispatch.
//!
//! Every helper turns guest bytes into host values only after checking them: ids
//! must name live objects of the right kind, counts must match the counts the call
//! will use, and every buffer must hold exactly the bytes the call will touch.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

use cl3::OpenCl;
use hira_apis_opencl::kernel_args::{
    ArgKind, CL_KERNEL_ARG_ADDRESS_QUALIFIER, CL_KERNEL_ARG_TYPE_NAME,
    CL_KERNEL_ARG_TYPE_QUALIFIER, CL_KERNEL_NUM_ARGS,
};
use hira_apis_opencl::{
    CL_CONTEXT_PLATFORM, CL_PROGRAM_BINARIES, CL_PROGRAM_BINARY_SIZES, HOST_ID_BIT, InfoHandles,
    Kind, notify, tag,
};
use hira_protocol::codec::{MAX_ARRAY, MAX_STRING};
use hira_protocol::frame::MAX_FRAME_BODY;
use hira_protocol::{FrameKind, Reader, Writer};
use log::warn;
use opencl_sys::{
    cl_command_queue, cl_context, cl_event, cl_image_desc, cl_int, cl_mem, cl_platform_id,
    cl_program,
};

use super::OpenClBackend;
use super::device_time::HeldGate;
use crate::backend::{Fail, FrameData, MigrationError};
use crate::server::FrameWriter;

use opencl_sys::CL_INVALID_ARG_INDEX;
use opencl_sys::CL_INVALID_ARG_SIZE;
use opencl_sys::CL_INVALID_ARG_VALUE;
use opencl_sys::CL_INVALID_BUFFER_SIZE;
use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_MEM_ALLOC_HOST_PTR;
use opencl_sys::CL_MEM_ASSOCIATED_MEMOBJECT;
use opencl_sys::CL_MEM_COPY_HOST_PTR;
use opencl_sys::CL_MEM_OBJECT_ALLOCATION_FAILURE;
use opencl_sys::CL_MEM_SIZE;
use opencl_sys::CL_MEM_USE_HOST_PTR;
use opencl_sys::CL_OUT_OF_RESOURCES;
/// Largest info value the server will fetch.
/// `clGetProgramBuildInfo`: the build log.
use opencl_sys::CL_PROGRAM_BUILD_LOG;
use opencl_sys::CL_PROGRAM_SOURCE;
use opencl_sys::CL_SUCCESS;

use hira_apis_opencl::CALLBACK_DATA_ONLY;

/// The `user_data` the host gets when the application passed data but no function:
/// non-null, as the application's was, and never dereferenced (no function is given
/// that could receive it).
const DATA_ONLY: *mut c_void = std::ptr::dangling_mut::<u8>().cast();
/// `clGetProgramBuildInfo`: the options of the last build.
use opencl_sys::CL_PROGRAM_BUILD_OPTIONS;
const MAX_INFO: usize = 64 * 1024 * 1024;
/// Largest zero-terminated property list accepted.
const MAX_PROPERTIES: usize = 128;

impl crate::handles::ObjectKind for Kind {
    /// The guest's references are counted for objects of a reference-counted kind, and
    /// for sub-devices (which the guest creates; root devices it only finds).
    fn counted(self, guest_refs: u32) -> bool {
        self.refcounted() || (self == Kind::Device && guest_refs > 0)
    }
}

/// The session's handle table: guest ids to host objects and back, and what the
/// OpenCL backend keeps per kernel.
#[derive(Debug, Default)]
pub struct Handles {
    table: crate::handles::Handles<Kind>,
    /// Argument kinds of each kernel, learnt from the host when it was created
    /// (`None`: the host could not tell).
    kernels: HashMap<u64, Option<Arc<[ArgKind]>>>,
}

impl Handles {
    /// Names host object `host` as `id` with the guest's `guest_refs` (a new object,
    /// or a restored stand-in).
    pub(crate) fn insert(&mut self, id: u64, kind: Kind, host: usize, guest_refs: u32) {
        self.table.insert(id, kind, host, guest_refs);
    }

    /// The id of a host object, giving it the next host-assigned id if the guest never
    /// saw it.
    pub(crate) fn found(&mut self, kind: Kind, host: usize) -> u64 {
        self.table.found(kind, host)
    }

    /// Every object the table names: id, kind, host handle, the guest's references.
    pub(crate) fn objects(&self) -> Vec<(u64, Kind, usize, u32)> {
        self.table
            .iter()
            .map(|(id, e)| (id, e.kind, e.host, e.guest_refs))
            .collect()
    }

    /// The id of a host object of `kind` the table names.
    pub(crate) fn id_of(&self, kind: Kind, host: usize) -> Option<u64> {
        self.table.id_of(kind, host)
    }

    /// The host handle of `id`, if it is of `kind`.
    pub(crate) fn host_of(&self, id: u64, kind: Kind) -> Option<usize> {
        self.table.get(id, kind)
    }

    /// Swaps the host objects two ids name (both must be known and of one kind).
    pub(crate) fn swap(&mut self, a: u64, b: u64) -> bool {
        self.table.swap(a, b)
    }

    /// Sets the guest's references to `id`.
    pub(crate) fn set_refs(&mut self, id: u64, refs: u32) {
        if let Some(e) = self.table.entry_mut(id) {
            e.guest_refs = refs;
        }
    }

    /// Forgets `id` (the guest holds no reference to it any more).
    pub(crate) fn forget(&mut self, id: u64) {
        if self.table.forget(id).is_some() {
            self.kernels.remove(&id);
        }
    }

    /// Number of ids in the table.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Empties the table, returning every object the guest still holds references
    /// to, dependents first.
    pub(crate) fn drain_owned(&mut self) -> Vec<(Kind, usize, u32)> {
        let mut v: Vec<(Kind, usize, u32)> = self
            .table
            .drain_owned()
            .into_iter()
            .map(|e| (e.kind, e.host, e.guest_refs))
            .collect();
        self.kernels.clear();
        v.sort_by_key(|(k, _, _)| k.teardown_rank());
        v
    }
}

/// Takes one more reference to a host object.
pub(crate) fn retain(rt: &OpenCl, kind: Kind, p: *mut c_void) -> Option<cl_int> {
    match kind {
        Kind::Event => rt.clRetainEvent(p.cast()),
        Kind::Kernel => rt.clRetainKernel(p.cast()),
        Kind::Program => rt.clRetainProgram(p.cast()),
        Kind::Sampler => rt.clRetainSampler(p.cast()),
        Kind::Mem => rt.clRetainMemObject(p.cast()),
        Kind::Queue => rt.clRetainCommandQueue(p.cast()),
        Kind::Context => rt.clRetainContext(p.cast()),
        Kind::Device => rt.clRetainDevice(p.cast()),
        Kind::CommandBuffer => super::command_buffer::retain(p),
        Kind::Platform => Some(CL_SUCCESS),
    }
}

/// Releases one reference to a host object.
pub(crate) fn release(rt: &OpenCl, kind: Kind, p: *mut c_void) -> Option<cl_int> {
    match kind {
        Kind::Event => rt.clReleaseEvent(p.cast()),
        Kind::Kernel => rt.clReleaseKernel(p.cast()),
        Kind::Program => rt.clReleaseProgram(p.cast()),
        Kind::Sampler => rt.clReleaseSampler(p.cast()),
        Kind::Mem => rt.clReleaseMemObject(p.cast()),
        Kind::Queue => {
            rt.clFinish(p.cast());
            rt.clReleaseCommandQueue(p.cast())
        }
        Kind::Context => rt.clReleaseContext(p.cast()),
        Kind::Device => rt.clReleaseDevice(p.cast()),
        Kind::CommandBuffer => super::command_buffer::release(p),
        Kind::Platform => Some(CL_SUCCESS),
    }
}

/// What a `reports` call waited for.
#[derive(Debug, Clone, Copy)]
pub enum Waited<'a> {
    /// Every command of this queue.
    Queue(cl_command_queue),
    /// These events.
    Events(&'a Option<Vec<cl_event>>),
}

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
}

impl BytesIn<'_> {
    pub fn ptr(&self) -> *mut c_void {
        match self {
            BytesIn::Null | BytesIn::Streamed(_) => std::ptr::null_mut(),
            BytesIn::Slice(s) => s.as_ptr() as *mut c_void,
            BytesIn::Aligned(v, _) => v.as_ptr() as *mut c_void,
            BytesIn::Window(p, _) | BytesIn::Svm(p, _) => p.cast(),
        }
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
            BytesIn::Aligned(_, l) | BytesIn::Window(_, l) | BytesIn::Streamed(l) => *l,
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

fn aligned_copy(b: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; b.len().div_ceil(8).max(1)];
    // SAFETY: `v` has at least b.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), v.as_mut_ptr().cast::<u8>(), b.len()) };
    v
}

/// Context for a host callback: which guest callback it stands for.
struct CallbackContext {
    id: u64,
    handles: Arc<Mutex<Handles>>,
    writer: Arc<FrameWriter>,
    deferred: Arc<super::deferred::Deferred>,
    /// For a one-shot callback (a build's, an event's): the count of those not yet
    /// delivered, which a migration waits to reach zero.
    one_shot: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

impl Drop for CallbackContext {
    fn drop(&mut self) {
        if let Some(n) = &self.one_shot {
            n.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

impl CallbackContext {
    fn notify(&self, kind: u16, body: impl FnOnce(&mut Writer, &mut Handles)) {
        let mut w = Writer::new();
        w.u64(self.id);
        {
            let mut h = self.handles.lock().unwrap_or_else(|e| e.into_inner());
            body(&mut w, &mut h);
        }
        self.writer
            .send(FrameKind::Notify, kind, 0, 0, w.as_slice());
    }
}

extern "C" fn context_trampoline(
    errinfo: *const libc::c_char,
    private: *const c_void,
    cb: usize,
    user_data: *mut c_void,
) {
    // SAFETY: `user_data` is the CallbackContext leaked for this context's life.
    let ctx = unsafe { &*(user_data as *const CallbackContext) };
    let info = if errinfo.is_null() {
        Vec::new()
    } else {
        // SAFETY: the host passes a NUL-terminated message.
        unsafe { std::ffi::CStr::from_ptr(errinfo) }
            .to_bytes()
            .to_vec()
    };
    let private = if private.is_null() {
        Vec::new()
    } else {
        // SAFETY: the host passes `cb` readable bytes.
        unsafe { std::slice::from_raw_parts(private.cast::<u8>(), cb.min(64 * 1024)) }.to_vec()
    };
    ctx.notify(notify::CONTEXT, |w, _| {
        w.bytes(&info[..info.len().min(64 * 1024)]).bytes(&private);
    });
}

extern "C" fn program_trampoline(program: cl_program, user_data: *mut c_void) {
    // SAFETY: one-shot: `user_data` is the box leaked for this callback, taken back here.
    let ctx = unsafe { Box::from_raw(user_data as *mut CallbackContext) };
    ctx.notify(notify::PROGRAM, |w, h| {
        w.u64(h.found(Kind::Program, program as usize));
    });
}

extern "C" fn event_trampoline(event: cl_event, status: cl_int, user_data: *mut c_void) {
    // SAFETY: as in `program_trampoline`.
    let ctx = unsafe { Box::from_raw(user_data as *mut CallbackContext) };
    // A read's data reaches the guest before any callback of its event.
    ctx.deferred.settle_event(event, status);
    ctx.notify(notify::EVENT, |w, h| {
        w.u64(h.found(Kind::Event, event as usize)).i32(status);
    });
}

extern "C" fn mem_trampoline(mem: cl_mem, user_data: *mut c_void) {
    // SAFETY: as in `program_trampoline`.
    let ctx = unsafe { Box::from_raw(user_data as *mut CallbackContext) };
    ctx.notify(notify::MEM, |w, h| {
        w.u64(h.id_of(Kind::Mem, mem as usize).unwrap_or(0));
    });
}

extern "C" fn destructor_trampoline(_context: cl_context, user_data: *mut c_void) {
    // SAFETY: as in `program_trampoline`.
    let ctx = unsafe { Box::from_raw(user_data as *mut CallbackContext) };
    ctx.notify(notify::DESTRUCTOR, |_, _| {});
}

extern "C" fn free_trampoline(_event: cl_event, _status: cl_int, user_data: *mut c_void) {
    // SAFETY: `user_data` is the box leaked by `free_when_complete` for this one call.
    drop(unsafe { Box::from_raw(user_data as *mut Box<[u8]>) });
}

type ContextFn = unsafe extern "C" fn(*const libc::c_char, *const c_void, usize, *mut c_void);
type ProgramFn = unsafe extern "C" fn(cl_program, *mut c_void);
type EventFn = unsafe extern "C" fn(cl_event, cl_int, *mut c_void);
type MemFn = unsafe extern "C" fn(cl_mem, *mut c_void);
type DestructorFn = unsafe extern "C" fn(cl_context, *mut c_void);

/// Gives back a memory object's charge when the host destroys it.
unsafe extern "C" fn uncharge_trampoline(_mem: cl_mem, data: *mut c_void) {
    // SAFETY: `data` is the box leaked in `charge_mem`, passed to exactly one callback.
    let (quota, size) =
        *unsafe { Box::from_raw(data.cast::<(Arc<crate::account::Account>, u64)>()) };
    quota.uncharge(size);
}

/// The per-call view of the backend that the generated code works on.
#[derive(Debug)]
pub struct Session<'a> {
    b: &'a OpenClBackend,
    /// What a call that migration keeps named, while it runs.
    rec: Option<std::cell::RefCell<super::migrate::Rec>>,
    /// The token of a deferred output the call names and has not handed over yet.
    output: std::cell::Cell<u64>,
    /// A call replayed from migration's log: the ids the host assigned the objects it
    /// made the first time, to give them again, and whether it made more.
    replay_ids: Option<std::cell::RefCell<(std::collections::VecDeque<u64>, bool)>>,
}

impl<'a> Session<'a> {
    pub fn new(b: &'a OpenClBackend) -> Self {
        Session {
            b,
            rec: None,
            output: std::cell::Cell::new(0),
            replay_ids: None,
        }
    }

    /// A view for replaying a logged call whose objects the host gave `ids` (in the
    /// order it made them): they get the same ids again.
    pub(crate) fn replaying(b: &'a OpenClBackend, ids: Vec<u64>) -> Self {
        Session {
            replay_ids: Some(std::cell::RefCell::new((ids.into(), false))),
            ..Session::new(b)
        }
    }

    /// Whether a replayed call made exactly the objects it made the first time.
    pub(crate) fn replayed_alike(&self) -> bool {
        self.replay_ids
            .as_ref()
            .is_none_or(|r| matches!(&*r.borrow(), (left, false) if left.is_empty()))
    }

    /// The id for an object the host made: the one it had, when replaying.
    fn host_assigned_id(&self, h: &mut Handles) -> u64 {
        match &self.replay_ids {
            Some(r) => {
                let mut r = r.borrow_mut();
                match r.0.pop_front() {
                    Some(id) => id,
                    None => {
                        r.1 = true;
                        h.table.fresh_host_id()
                    }
                }
            }
            None => h.table.fresh_host_id(),
        }
    }

    /// A view that also notes what the call names, into `rec`, for migration's log.
    pub(crate) fn recording(b: &'a OpenClBackend, rec: super::migrate::Rec) -> Self {
        Session {
            rec: Some(std::cell::RefCell::new(rec)),
            ..Session::new(b)
        }
    }

    /// The call names deferred output `token` (0: none), which the guest waits for
    /// until it is handed over ([`Session::defer_output`]) or the call fails.
    pub fn expect_output(&self, token: u64) {
        self.output.set(token);
    }

    /// The token of a deferred output the call named and did not hand over.
    pub(crate) fn unclaimed_output(&self) -> Option<u64> {
        Some(self.output.take()).filter(|&t| t != 0)
    }

    /// What the call named, if it was recorded.
    pub(crate) fn take_rec(&mut self) -> Option<super::migrate::Rec> {
        self.rec.take().map(std::cell::RefCell::into_inner)
    }

    fn note(&self, f: impl FnOnce(&mut super::migrate::Rec)) {
        if let Some(r) = &self.rec {
            f(&mut r.borrow_mut());
        }
    }

    pub fn rt(&self) -> &'static OpenCl {
        self.b.rt
    }

    pub fn platform(&self) -> cl_platform_id {
        self.b.platform
    }

    fn handles(&self) -> MutexGuard<'_, Handles> {
        self.b.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host object for `id`, which must be of `kind` (0 is NULL if allowed).
    pub fn lookup(&self, id: u64, kind: Kind, nullable: bool) -> Result<*mut c_void, Fail> {
        if id == 0 {
            return if nullable {
                Ok(std::ptr::null_mut())
            } else {
                Err(Fail::Status(kind.invalid_code()))
            };
        }
        if kind == Kind::Platform {
            // The one exposed platform is always known to the guest by its host id.
            let mut h = self.handles();
            let pid = h.found(Kind::Platform, self.b.platform as usize);
            return if id == pid {
                Ok(self.b.platform.cast())
            } else {
                Err(Fail::Status(kind.invalid_code()))
            };
        }
        let p = self
            .handles()
            .host_of(id, kind)
            .map(|p| p as *mut c_void)
            .ok_or(Fail::Status(kind.invalid_code()))?;
        self.note(|r| r.uses.push(id));
        Ok(p)
    }

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

    /// Resolves an optional array of ids of `kind`; any bad one fails with `code`.
    pub fn lookup_many(
        &self,
        ids: Option<Vec<u64>>,
        kind: Kind,
        code: cl_int,
    ) -> Result<Option<Vec<*mut c_void>>, Fail> {
        let Some(ids) = ids else { return Ok(None) };
        self.note(|r| r.uses.extend(&ids));
        let h = self.handles();
        ids.into_iter()
            .map(|id| {
                h.host_of(id, kind)
                    .map(|p| p as *mut c_void)
                    .ok_or(Fail::Status(code))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Checks that a guest-assigned id is fresh (0 allowed only if `allow_zero`).
    pub fn check_fresh(&self, id: u64, allow_zero: bool) -> Result<(), Fail> {
        if id == 0 {
            return if allow_zero {
                Ok(())
            } else {
                Err(Fail::Protocol("object id 0 for a new object".into()))
            };
        }
        if id & HOST_ID_BIT != 0 || self.handles().table.contains(id) {
            return Err(Fail::Protocol(format!("object id {id:#x} is not fresh")));
        }
        Ok(())
    }

    /// Records a new host object under the guest's id, holding one guest reference,
    /// and returns the call's status. A kernel's argument kinds are learnt from the
    /// host now. A memory object is charged to the VM's quota: over it, the object is
    /// released at once and the call fails with `CL_MEM_OBJECT_ALLOCATION_FAILURE`.
    pub fn bind(&self, id: u64, kind: Kind, host: *mut c_void) -> cl_int {
        if kind == Kind::Mem
            && let Err(code) = self.charge_mem(host.cast())
        {
            self.rt().clReleaseMemObject(host.cast());
            return code;
        }
        let signature = (kind == Kind::Kernel).then(|| self.kernel_signature(host));
        if kind == Kind::Event {
            self.note_unreported(id, host.cast());
        }
        self.note(|r| r.creates.push(id));
        let mut h = self.handles();
        h.insert(id, kind, host as usize, 1);
        if let Some(sig) = signature {
            h.kernels.insert(id, sig);
        }
        CL_SUCCESS
    }

    /// Charges a new memory object's size (the host's `CL_MEM_SIZE`; a sub-buffer
    /// uses its parent's memory and costs nothing) and arranges for the charge to be
    /// given back when the host destroys the object, whoever held it last.
    fn charge_mem(&self, mem: cl_mem) -> Result<(), cl_int> {
        let rt = self.rt();
        let mut parent: cl_mem = std::ptr::null_mut();
        let mut size: usize = 0;
        let known = rt.clGetMemObjectInfo(
            mem,
            CL_MEM_ASSOCIATED_MEMOBJECT,
            size_of::<cl_mem>(),
            (&mut parent as *mut cl_mem).cast(),
            std::ptr::null_mut(),
        ) == Some(CL_SUCCESS)
            && rt.clGetMemObjectInfo(
                mem,
                CL_MEM_SIZE,
                size_of::<usize>(),
                (&mut size as *mut usize).cast(),
                std::ptr::null_mut(),
            ) == Some(CL_SUCCESS);
        if !known {
            warn!("the host cannot tell a memory object's size; it is not charged");
            return Ok(());
        }
        if !parent.is_null() || size == 0 {
            return Ok(());
        }
        let quota = self.b.quota.clone();
        if let Err(over) = quota.charge(size as u64) {
            warn!(
                "memory quota: {size} bytes refused ({} of {} held)",
                over.used, over.quota
            );
            return Err(CL_MEM_OBJECT_ALLOCATION_FAILURE);
        }
        let charge = Box::into_raw(Box::new((quota, size as u64)));
        let registered =
            rt.clSetMemObjectDestructorCallback(mem, Some(uncharge_trampoline), charge.cast());
        if registered != Some(CL_SUCCESS) {
            // SAFETY: the callback was not registered, so this is the only owner.
            let (quota, size) = *unsafe { Box::from_raw(charge) };
            quota.uncharge(size);
            warn!("the host cannot report a memory object's end ({registered:?}); not charged");
        }
        Ok(())
    }

    /// The kinds of a host kernel's arguments, from `clGetKernelArgInfo`.
    fn kernel_signature(&self, kernel: *mut c_void) -> Option<Arc<[ArgKind]>> {
        let rt = self.rt();
        let kernel: opencl_sys::cl_kernel = kernel.cast();
        let mut n: u32 = 0;
        let status = rt.clGetKernelInfo(
            kernel,
            CL_KERNEL_NUM_ARGS,
            size_of::<u32>(),
            (&mut n as *mut u32).cast(),
            std::ptr::null_mut(),
        );
        if status != Some(CL_SUCCESS) {
            return None;
        }
        let scalar = |i: u32, param: u32, out: &mut [u8]| {
            rt.clGetKernelArgInfo(
                kernel,
                i,
                param,
                out.len(),
                out.as_mut_ptr().cast(),
                std::ptr::null_mut(),
            ) == Some(CL_SUCCESS)
        };
        let type_name = |i: u32| -> Option<String> {
            let mut len = 0usize;
            let sized = rt.clGetKernelArgInfo(
                kernel,
                i,
                CL_KERNEL_ARG_TYPE_NAME,
                0,
                std::ptr::null_mut(),
                &mut len,
            ) == Some(CL_SUCCESS);
            let mut name = vec![0u8; len];
            (sized && scalar(i, CL_KERNEL_ARG_TYPE_NAME, &mut name)).then(|| {
                std::ffi::CStr::from_bytes_until_nul(&name)
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default()
            })
        };
        let mut kinds = Vec::with_capacity(n as usize);
        for i in 0..n {
            let (mut address, mut qualifier) = ([0u8; 4], [0u8; 8]);
            let name = type_name(i);
            let named = name.is_some();
            let described = scalar(i, CL_KERNEL_ARG_ADDRESS_QUALIFIER, &mut address)
                && scalar(i, CL_KERNEL_ARG_TYPE_QUALIFIER, &mut qualifier);
            let (Some(name), true) = (name, described) else {
                warn!(
                    "the host cannot describe argument {i} of a kernel (type name known: {named}); pointer-sized values are refused"
                );
                return None;
            };
            kinds.push(ArgKind::classify(
                u32::from_le_bytes(address),
                &name,
                u64::from_le_bytes(qualifier),
                usize::BITS,
            ));
        }
        Some(kinds.into())
    }

    pub fn retained(&self, id: u64) {
        if let Some(e) = self.handles().table.entry_mut(id)
            && e.counted
        {
            e.guest_refs += 1;
        }
        self.b.migration.retained(id);
    }

    pub fn released(&self, id: u64) {
        self.b.migration.released(id);
        let mut h = self.handles();
        let Some(e) = h.table.entry_mut(id) else {
            return;
        };
        if !e.counted {
            return;
        }
        e.guest_refs = e.guest_refs.saturating_sub(1);
        if e.guest_refs == 0 {
            let (host, kind) = (e.host, e.kind);
            if kind == Kind::Event {
                self.b.migration.forget_event(host);
                self.b
                    .unreported
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            }
            h.forget(id);
            drop(h);
            if kind == Kind::Context {
                // The guest is done with it: the server's own queue lets it go too.
                self.b
                    .fills
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .forget(host);
            }
        }
    }

    /// An event the guest holds, of a command on a queue: reported to the guest by the
    /// next `clFinish` of that queue or `clWaitForEvents` naming it.
    fn note_unreported(&self, id: u64, event: cl_event) {
        use opencl_sys::CL_EVENT_COMMAND_QUEUE;
        let rt = self.rt();
        let queue: Option<cl_command_queue> = super::queues::info_value(|n, p, r| {
            rt.clGetEventInfo(event, CL_EVENT_COMMAND_QUEUE, n, p, r)
        });
        if let Some(q) = queue.filter(|q| !q.is_null()) {
            self.b
                .unreported
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, (event as usize, q as usize));
        }
    }

    /// Ends the reply of a call that waited (`reports`), after the device time of what
    /// completed is accounted, with the execution status and profiling timestamps of
    /// the guest's events it waited for that were not reported yet, so that the guest answers their queries itself (both are final once a
    /// command has ended): `u32` count, then per event `u64` id, `i32` status, and
    /// `u8` which of the timestamps follow (bit `i`: `CL_PROFILING_COMMAND_QUEUED + i`,
    /// `0xFF`: the guest's queue has no profiling) and those `u64` values.
    pub fn report_completed(&self, w: &mut Writer, waited: Waited<'_>) {
        use opencl_sys::CL_EVENT_COMMAND_EXECUTION_STATUS;
        self.b.device_time.sweep_now();
        use opencl_sys::CL_PROFILING_COMMAND_QUEUED;
        let picked: Vec<(u64, usize, usize)> = {
            let mut u = self.b.unreported.lock().unwrap_or_else(|e| e.into_inner());
            let ids: Vec<u64> = u
                .iter()
                .filter(|&(_, &(ev, q))| match waited {
                    Waited::Queue(wq) => q == wq as usize,
                    Waited::Events(list) => list.iter().flatten().any(|&e| e as usize == ev),
                })
                .map(|(&id, _)| id)
                .collect();
            ids.into_iter()
                .filter_map(|id| u.remove(&id).map(|(ev, q)| (id, ev, q)))
                .collect()
        };
        let rt = self.rt();
        let mut entries = Writer::new();
        let mut n = 0u32;
        for (id, ev, q) in picked {
            let ev = ev as cl_event;
            let status: Option<cl_int> = super::queues::info_value(|n, p, r| {
                rt.clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, n, p, r)
            });
            let Some(status) = status.filter(|&st| st <= 0) else {
                continue;
            };
            n += 1;
            entries.u64(id).i32(status);
            if status != 0 {
                entries.u8(0);
            } else if !self.b.device_time.guest_profiling(q as cl_command_queue) {
                entries.u8(0xFF);
            } else {
                let stamps: Vec<Option<u64>> = (0..5)
                    .map(|i| {
                        super::queues::info_value(|n, p, r| {
                            rt.clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_QUEUED + i, n, p, r)
                        })
                    })
                    .collect();
                let mask = stamps
                    .iter()
                    .enumerate()
                    .fold(0u8, |m, (i, t)| if t.is_some() { m | 1 << i } else { m });
                entries.u8(mask);
                for t in stamps.into_iter().flatten() {
                    entries.u64(t);
                }
            }
        }
        w.u32(n);
        w.raw(entries.as_slice());
    }

    /// The server's own queue for writing streamed contents into `ctx`'s buffers.
    pub fn fill_queue(&self, ctx: cl_context) -> Result<cl_command_queue, MigrationError> {
        self.b
            .fills
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .for_context(ctx)
    }

    /// Writes host objects returned by a call as ids: created ones (`owned`) get a
    /// guest reference, found ones (devices) none.
    pub fn reply_handles(&self, w: &mut Writer, kind: Kind, hosts: &[*mut c_void], owned: bool) {
        let signatures: Vec<_> = if kind == Kind::Kernel && owned {
            hosts
                .iter()
                .take_while(|p| !p.is_null())
                .map(|&p| self.kernel_signature(p))
                .collect()
        } else {
            Vec::new()
        };
        let mut signatures = signatures.into_iter();
        let mut h = self.handles();
        let live: Vec<u64> = hosts
            .iter()
            .take_while(|p| !p.is_null())
            .map(|&p| {
                if owned {
                    let id = self.host_assigned_id(&mut h);
                    self.note(|r| r.creates.push(id));
                    h.insert(id, kind, p as usize, 1);
                    if let Some(sig) = signatures.next() {
                        h.kernels.insert(id, sig);
                    }
                    id
                } else {
                    h.found(kind, p as usize)
                }
            })
            .collect();
        w.u32(live.len() as u32);
        for id in live {
            w.u64(id);
        }
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
                    // SAFETY: the span lies inside the mapped window (checked by
                    // `span`); a raw copy makes no reference to guest-writable memory.
                    Some(super::migrate::Splice::Inline(
                        unsafe { std::slice::from_raw_parts(*p, *len) }.to_vec(),
                    ))
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
                Ok(OutBuffer::Inline(vec![0u8; len]))
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

    /// A write sent without a reply left its data in the window under `token`: the
    /// guest may reuse that part of the window once the host has read it, which an
    /// `OUTPUT_DONE` for the token says (now, if the write failed or has no event).
    /// `owned`: `ev` is the server's own reference, which this takes over.
    pub fn window_read_when_complete(
        &self,
        token: u64,
        status: cl_int,
        ev: opencl_sys::cl_event,
        owned: bool,
    ) {
        if status != CL_SUCCESS || ev.is_null() {
            if owned && !ev.is_null() {
                self.rt().clReleaseEvent(ev);
            }
            self.b.deferred.done_now(token, status.min(0));
            return;
        }
        self.b
            .deferred
            .add(token, ev, owned, OutBuffer::Window(std::ptr::null_mut()));
    }

    /// Copies input bytes into a buffer the host may read after the call returns.
    pub fn detach(b: &BytesIn<'_>) -> (*mut c_void, Option<Box<[u8]>>) {
        let (src, len): (*const u8, usize) = match b {
            BytesIn::Null | BytesIn::Streamed(_) => return (std::ptr::null_mut(), None),
            BytesIn::Slice(s) => (s.as_ptr(), s.len()),
            BytesIn::Aligned(v, len) => (v.as_ptr().cast(), *len),
            BytesIn::Window(p, len) | BytesIn::Svm(p, len) => (*p, *len),
        };
        let mut owned: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        // SAFETY: `src` is valid for `len` reads (a private buffer, or a span checked to
        // lie inside the mapped window); a raw copy makes no reference to shared memory.
        unsafe { std::ptr::copy_nonoverlapping(src, owned.as_mut_ptr(), len) };
        (owned.as_mut_ptr().cast(), Some(owned))
    }

    /// Keeps `data` alive until the command behind `ev` completes; releases `ev` too
    /// when only the server held it.
    pub fn free_when_complete(
        &self,
        status: cl_int,
        ev: opencl_sys::cl_event,
        data: Box<[u8]>,
        release: bool,
    ) {
        if status != CL_SUCCESS || ev.is_null() {
            return;
        }
        let raw = Box::into_raw(Box::new(data));
        let registered = self
            .rt()
            .clSetEventCallback(ev, 0, Some(free_trampoline), raw.cast());
        if registered != Some(CL_SUCCESS) {
            warn!("cannot watch a detached write ({registered:?}); waiting for it");
            self.rt().clWaitForEvents(1, &ev);
            // SAFETY: the callback was not registered, so this is the only owner.
            drop(unsafe { Box::from_raw(raw) });
        }
        if release {
            self.rt().clReleaseEvent(ev);
        }
    }

    /// Coarse-grained SVM allocations.
    pub fn svm(&self) -> &super::svm::Svm {
        &self.b.svm
    }

    /// Whether argument `index` of `kernel` may take an SVM pointer: a `__global` or
    /// `__constant` pointer (or an argument the host could not describe).
    pub fn svm_arg_allowed(&self, kernel: opencl_sys::cl_kernel, index: u32) -> Result<(), i32> {
        let id = self.handles().id_of(Kind::Kernel, kernel as usize);
        let Some(id) = id else {
            return Ok(());
        };
        match self.handles().kernels.get(&id).cloned() {
            Some(Some(kinds)) => match kinds.get(index as usize) {
                Some(ArgKind::Buffer | ArgKind::Unknown) => Ok(()),
                Some(_) => Err(CL_INVALID_ARG_VALUE),
                None => Err(CL_INVALID_ARG_INDEX),
            },
            _ => Ok(()),
        }
    }

    /// Transfers too large for a frame or the window.
    pub fn staging(&self) -> &super::staging::Staging {
        &self.b.staging
    }

    /// Headers shipped for builds.
    pub fn builds(&self) -> &super::builds::Builds {
        &self.b.builds
    }

    /// Whether another non-blocking read may be in flight.
    pub fn may_defer(&self) -> Result<(), Fail> {
        self.b.deferred.may_defer()
    }

    /// Delivers `out` to the guest as `token` when host event `event` completes.
    pub fn defer_output(&self, token: u64, event: cl_event, owned: bool, out: OutBuffer) {
        self.output.set(0);
        self.b.deferred.add(token, event, owned, out);
    }

    fn callback_context(&self, id: u64, one_shot: bool) -> *mut c_void {
        let one_shot = one_shot.then(|| {
            let n = self.b.migration.one_shot_callbacks();
            n.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            n
        });
        Box::into_raw(Box::new(CallbackContext {
            id,
            handles: self.b.handles.clone(),
            writer: self.b.writer.clone(),
            deferred: self.b.deferred.clone(),
            one_shot,
        }))
        .cast()
    }

    /// Frees the callback context made for a context that the host did not create.
    /// (The stand-in for data without a function was never allocated.)
    pub fn drop_callback_context(&self, data: *mut c_void) {
        if !data.is_null() && data != DATA_ONLY {
            // SAFETY: made by `callback_context` for a call whose object was not
            // created, so the host never got to keep or call it.
            drop(unsafe { Box::from_raw(data as *mut CallbackContext) });
        }
    }

    /// The host's function and user data for guest callback `id`: none (0), none but a
    /// non-null stand-in ([`CALLBACK_DATA_ONLY`]), or `trampoline` with a context that
    /// delivers the callback to the guest.
    fn callback<F>(&self, id: u64, trampoline: F, one_shot: bool) -> (Option<F>, *mut c_void) {
        match id {
            0 => (None, std::ptr::null_mut()),
            // A replayed build's callback was delivered where the build first ran.
            _ if one_shot && self.b.migration.replaying() => (None, std::ptr::null_mut()),
            CALLBACK_DATA_ONLY => (None, DATA_ONLY),
            _ => (Some(trampoline), self.callback_context(id, one_shot)),
        }
    }

    pub fn callback_context_fn(&self, id: u64) -> (Option<ContextFn>, *mut c_void) {
        self.callback(id, context_trampoline as ContextFn, false)
    }

    pub fn callback_program(&self, id: u64) -> (Option<ProgramFn>, *mut c_void) {
        self.callback(id, program_trampoline as ProgramFn, true)
    }

    pub fn callback_event(&self, id: u64) -> (Option<EventFn>, *mut c_void) {
        self.callback(id, event_trampoline as EventFn, true)
    }

    pub fn callback_destructor(&self, id: u64) -> (Option<DestructorFn>, *mut c_void) {
        self.callback(id, destructor_trampoline as DestructorFn, false)
    }

    pub fn callback_mem(&self, id: u64) -> (Option<MemFn>, *mut c_void) {
        self.callback(id, mem_trampoline as MemFn, false)
    }

    /// Whether a wait list is exactly as long as its count says (an inconsistent one is
    /// left for the host to refuse, and gets no gate added).
    pub fn wait_list_given(list: &Option<Vec<cl_event>>, n: u32) -> bool {
        list.as_ref().map_or(0, Vec::len) == n as usize
    }

    /// A command buffer recorded host kernel `kernel` with its arguments as they are.
    pub fn recorded_kernel(&self, kernel: opencl_sys::cl_kernel) {
        if let Some(id) = self.handles().id_of(Kind::Kernel, kernel as usize) {
            self.b
                .recorded_kernels
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id);
        }
    }

    /// The gate a device command must wait behind, if the VM's decision holds it.
    pub fn admit(&self, queue: opencl_sys::cl_command_queue) -> Option<HeldGate> {
        self.b.device_time.admit(queue)
    }

    /// After a device command's host call (see [`super::device_time`]).
    pub fn device_command(
        &self,
        queue: cl_command_queue,
        status: cl_int,
        gate: Option<HeldGate>,
        event: cl_event,
        own: bool,
    ) {
        self.b.device_time.enqueued(queue, status, gate, event, own);
    }

    pub fn device_time(&self) -> &super::device_time::DeviceTime {
        &self.b.device_time
    }

    /// Runs an info query and replies with its whole value, host objects rewritten as
    /// ids. `query(param, size, value, size_ret)` calls the host function.
    pub fn info_query(
        &self,
        function: &str,
        object: *mut c_void,
        param: u32,
        w: &mut Writer,
        mut query: impl FnMut(u32, usize, *mut c_void, *mut usize) -> Option<cl_int>,
    ) -> Result<(), Fail> {
        if function == "clGetProgramInfo" && param == CL_PROGRAM_BINARIES {
            return self.program_binaries(w, query);
        }
        let queue_host = |id| self.handles().host_of(id, Kind::Queue).unwrap_or(0);
        if let Some(answer) = self
            .b
            .migration
            .stand_in_answer(function, object, param, queue_host)
        {
            match answer {
                Ok(mut buf) => {
                    if let Some(how) = hira_apis_opencl::info_handles(function, param) {
                        self.host_to_ids(how, &mut buf);
                    }
                    w.i32(CL_SUCCESS).bytes(&buf);
                }
                Err(status) => {
                    w.i32(status);
                }
            }
            return Ok(());
        }
        let mut size = 0usize;
        let status = query(param, 0, std::ptr::null_mut(), &mut size).ok_or(Fail::Status(-59))?;
        if status != CL_SUCCESS {
            w.i32(status);
            return Ok(());
        }
        if size > MAX_INFO {
            w.i32(CL_OUT_OF_RESOURCES);
            return Ok(());
        }
        if size == 0 {
            // Nothing to fetch: a second call would ask the host for a value of no
            // size, a call the guest never made (PoCL 3.1 crashes on it for
            // CL_CONTEXT_PROPERTIES of a context made without properties).
            w.i32(CL_SUCCESS).bytes(&[]);
            return Ok(());
        }
        let mut buf = vec![0u8; size];
        let status = query(param, size, buf.as_mut_ptr().cast(), std::ptr::null_mut())
            .ok_or(Fail::Status(-59))?;
        if status != CL_SUCCESS {
            w.i32(status);
            return Ok(());
        }
        if let Some(how) = hira_apis_opencl::info_handles(function, param) {
            self.host_to_ids(how, &mut buf);
        }
        if function == "clGetDeviceInfo" {
            super::command_buffer::mask_unforwarded(param, &mut buf);
        }
        if function == "clGetProgramInfo" && param == CL_PROGRAM_SOURCE {
            super::builds::guest_source(&mut buf);
        }
        if function == "clGetProgramBuildInfo" && param == CL_PROGRAM_BUILD_LOG {
            self.b.builds.guest_log(&mut buf);
        }
        if function == "clGetProgramBuildInfo" && param == CL_PROGRAM_BUILD_OPTIONS {
            self.b.builds.guest_options(&mut buf);
        }
        if function == "clGetCommandQueueInfo" {
            self.b
                .device_time
                .guest_queue_info(object.cast(), param, &mut buf);
        }
        w.i32(CL_SUCCESS).bytes(&buf);
        Ok(())
    }

    fn host_to_ids(&self, how: InfoHandles, buf: &mut [u8]) {
        let mut h = self.handles();
        let words = buf.len() / 8;
        for i in 0..words {
            let at = i * 8;
            let v = u64::from_le_bytes(buf[at..at + 8].try_into().expect("8-byte chunk"));
            let id = match how {
                InfoHandles::One(kind) | InfoHandles::Array(kind) => h.found(kind, v as usize),
                InfoHandles::ContextProperties => {
                    let is_value = i % 2 == 1;
                    let key = if is_value {
                        u64::from_le_bytes(buf[at - 8..at].try_into().expect("8-byte chunk"))
                    } else {
                        0
                    };
                    if is_value && key == CL_CONTEXT_PLATFORM {
                        h.found(Kind::Platform, v as usize)
                    } else {
                        v
                    }
                }
            };
            buf[at..at + 8].copy_from_slice(&id.to_le_bytes());
        }
    }

    fn program_binaries(
        &self,
        w: &mut Writer,
        mut query: impl FnMut(u32, usize, *mut c_void, *mut usize) -> Option<cl_int>,
    ) -> Result<(), Fail> {
        let mut size = 0usize;
        let status = query(CL_PROGRAM_BINARY_SIZES, 0, std::ptr::null_mut(), &mut size)
            .ok_or(Fail::Status(-59))?;
        if status != CL_SUCCESS || !size.is_multiple_of(size_of::<usize>()) || size > MAX_ARRAY * 8
        {
            w.i32(if status == CL_SUCCESS {
                CL_INVALID_VALUE
            } else {
                status
            });
            return Ok(());
        }
        let mut sizes = vec![0usize; size / size_of::<usize>()];
        let status = query(
            CL_PROGRAM_BINARY_SIZES,
            size,
            sizes.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
        .ok_or(Fail::Status(-59))?;
        if status != CL_SUCCESS || sizes.iter().sum::<usize>() > MAX_INFO {
            w.i32(if status == CL_SUCCESS {
                CL_OUT_OF_RESOURCES
            } else {
                status
            });
            return Ok(());
        }
        let mut bins: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        let mut ptrs: Vec<*mut u8> = bins
            .iter_mut()
            .map(|b| {
                if b.is_empty() {
                    std::ptr::null_mut()
                } else {
                    b.as_mut_ptr()
                }
            })
            .collect();
        let status = query(
            CL_PROGRAM_BINARIES,
            size,
            ptrs.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
        .ok_or(Fail::Status(-59))?;
        if status != CL_SUCCESS {
            w.i32(status);
            return Ok(());
        }
        let mut inner = Writer::new();
        for b in &bins {
            inner.bytes(b);
        }
        w.i32(CL_SUCCESS).bytes(inner.as_slice());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_objects_keep_one_id() {
        let mut h = Handles::default();
        let a = h.found(Kind::Device, 0x1000);
        assert_eq!(h.found(Kind::Device, 0x1000), a);
        assert_ne!(a & HOST_ID_BIT, 0);
    }

    #[test]
    fn lookup_of_wrong_kind_fails() {
        let mut h = Handles::default();
        h.insert(5, Kind::Mem, 0x2000, 1);
        assert_eq!(h.host_of(5, Kind::Mem), Some(0x2000));
        assert_eq!(h.host_of(5, Kind::Kernel), None);
    }

    #[test]
    fn teardown_releases_dependents_first_and_skips_found_objects() {
        let mut h = Handles::default();
        h.insert(1, Kind::Context, 0x10, 1);
        h.insert(2, Kind::Kernel, 0x20, 2);
        h.found(Kind::Device, 0x30);
        let v = h.drain_owned();
        assert_eq!(v, vec![(Kind::Kernel, 0x20, 2), (Kind::Context, 0x10, 1)]);
        assert!(h.is_empty());
    }

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
