//! The per-call view of the OpenCL backend that the generated dispatch works on:
//! ids resolved and bound, references counted, events reported, and what migration
//! records. Argument decoding is in [`super::args`], callbacks in
//! [`super::callbacks`], info queries in [`super::info`], the handle table in
//! [`super::handles`].

use std::ffi::c_void;
use std::sync::{Arc, MutexGuard};

use cl3::OpenCl;
use hira_apis_opencl::kernel_args::{
    ArgKind, CL_KERNEL_ARG_ADDRESS_QUALIFIER, CL_KERNEL_ARG_TYPE_NAME,
    CL_KERNEL_ARG_TYPE_QUALIFIER, CL_KERNEL_NUM_ARGS,
};
use hira_apis_opencl::{HOST_ID_BIT, Kind};
use hira_protocol::Writer;
use log::warn;
use opencl_sys::{
    CL_INVALID_ARG_INDEX, CL_INVALID_ARG_VALUE, CL_MEM_ASSOCIATED_MEMOBJECT,
    CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_MEM_SIZE, CL_SUCCESS, cl_command_queue, cl_context,
    cl_event, cl_int, cl_mem, cl_platform_id,
};

use super::OpenClBackend;
use super::args::OutBuffer;
use super::callbacks::{free_trampoline, uncharge_trampoline};
use super::device_time::HeldGate;
use super::handles::Handles;
use crate::backend::{Fail, MigrationError};

/// What a `reports` call waited for.
#[derive(Debug, Clone, Copy)]
pub enum Waited<'a> {
    /// Every command of this queue.
    Queue(cl_command_queue),
    /// These events.
    Events(&'a Option<Vec<cl_event>>),
}

/// The per-call view of the backend that the generated code works on.
#[derive(Debug)]
pub struct Session<'a> {
    pub(super) b: &'a OpenClBackend,
    /// What a call that migration keeps named, while it runs.
    pub(super) rec: Option<std::cell::RefCell<super::migrate::Rec>>,
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

    pub(super) fn note(&self, f: impl FnOnce(&mut super::migrate::Rec)) {
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

    pub(super) fn handles(&self) -> MutexGuard<'_, Handles> {
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
}
