//! Coarse-grained buffer SVM on the host side.
//!
//! Each guest allocation is a real host SVM allocation named by the id the guest chose;
//! the guest maps its own memory at the same address, so that pointer values stored in
//! SVM memory mean the same on both sides (telling the guest that address shows it
//! where its own API server's heap is, nothing about any other process). The guest
//! names any pointer into an allocation as (id, offset). Every such pair is checked
//! against the allocation's size before it becomes a host pointer, so a guest never
//! makes the host touch memory outside its own allocations.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cl3::OpenCl;
use opencl_sys::cl_context;

use crate::account::Account;

use opencl_sys::CL_INVALID_VALUE;

#[derive(Debug, Clone, Copy)]
struct Alloc {
    host: usize,
    size: usize,
    context: usize,
}

/// The session's SVM allocations by guest id, each charged to the VM's quota.
#[derive(Debug, Default)]
pub struct Svm {
    table: Mutex<HashMap<u64, Alloc>>,
    quota: Arc<Account>,
}

impl Svm {
    pub fn new(quota: Arc<Account>) -> Self {
        Svm {
            table: Mutex::default(),
            quota,
        }
    }

    /// Whether the session holds no SVM allocation.
    pub fn is_empty(&self) -> bool {
        self.table().is_empty()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Alloc>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `size` bytes for guest id `id` and returns their host address (the
    /// guest maps its memory at the same address); `CL_INVALID_VALUE` when the host
    /// refuses or the VM's memory quota would be exceeded (the guest's `clSVMAlloc`
    /// then returns NULL, as natively when memory runs out).
    pub fn alloc(
        &self,
        rt: &OpenCl,
        context: cl_context,
        flags: u64,
        size: usize,
        alignment: u32,
        id: u64,
    ) -> Result<u64, i32> {
        if id == 0 || self.table().contains_key(&id) {
            return Err(CL_INVALID_VALUE);
        }
        if self.quota.charge(size as u64).is_err() {
            log::warn!("memory quota: an SVM allocation of {size} bytes refused");
            return Err(CL_INVALID_VALUE);
        }
        let host = rt.clSVMAlloc(context, flags, size, alignment);
        if host.is_none_or(|p| p.is_null()) {
            self.quota.uncharge(size as u64);
        }
        match host {
            Some(p) if !p.is_null() => {
                self.table().insert(
                    id,
                    Alloc {
                        host: p as usize,
                        size,
                        context: context as usize,
                    },
                );
                Ok(p as u64)
            }
            _ => Err(CL_INVALID_VALUE),
        }
    }

    /// Frees allocation `id`; one already freed by an enqueued free is no error (the
    /// application's `clSVMFree` in its free callback comes after).
    pub fn free(&self, rt: &OpenCl, id: u64) -> i32 {
        if let Some(a) = self.table().remove(&id) {
            rt.clSVMFree(a.context as cl_context, a.host as *mut c_void);
            self.quota.uncharge(a.size as u64);
        }
        0
    }

    /// The host address of `len` bytes at `offset` of allocation `id`.
    pub fn ptr(&self, id: u64, offset: usize, len: usize) -> Result<*mut c_void, i32> {
        let t = self.table();
        let a = t.get(&id).ok_or(CL_INVALID_VALUE)?;
        match offset.checked_add(len) {
            Some(end) if end <= a.size => Ok((a.host + offset) as *mut c_void),
            _ => Err(CL_INVALID_VALUE),
        }
    }

    /// The host address at `offset` of allocation `id` and the bytes after it.
    pub fn span(&self, id: u64, offset: usize) -> Result<(*mut c_void, usize), i32> {
        let t = self.table();
        let a = t.get(&id).ok_or(CL_INVALID_VALUE)?;
        if offset > a.size {
            return Err(CL_INVALID_VALUE);
        }
        Ok(((a.host + offset) as *mut c_void, a.size - offset))
    }

    /// Forgets allocation `id`, returning its host address (freed by the host later).
    pub fn take(&self, id: u64) -> Result<*mut c_void, i32> {
        let a = self.table().remove(&id).ok_or(CL_INVALID_VALUE)?;
        self.quota.uncharge(a.size as u64);
        Ok(a.host as *mut c_void)
    }

    /// Frees everything the guest left; returns how many.
    pub fn free_all(&self, rt: &OpenCl) -> usize {
        let all: Vec<Alloc> = self.table().drain().map(|(_, a)| a).collect();
        for a in &all {
            rt.clSVMFree(a.context as cl_context, a.host as *mut c_void);
            self.quota.uncharge(a.size as u64);
        }
        all.len()
    }
}
