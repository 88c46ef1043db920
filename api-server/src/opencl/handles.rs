//! The OpenCL session's handle table: guest ids to host objects and back (the
//! generic table of [`crate::handles`]), the argument kinds of each kernel, and
//! taking and dropping host references by kind.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cl3::OpenCl;
use hira_apis_opencl::Kind;
use hira_apis_opencl::kernel_args::ArgKind;
use opencl_sys::{CL_SUCCESS, cl_int};

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
    pub(super) table: crate::handles::Handles<Kind>,
    /// Argument kinds of each kernel, learnt from the host when it was created
    /// (`None`: the host could not tell).
    pub(super) kernels: HashMap<u64, Option<Arc<[ArgKind]>>>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use hira_apis_opencl::HOST_ID_BIT;

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
}
