//! Command queues of the API server's own, one per context: for moving a migrated
//! session's contents, and for writing streamed initial contents of buffers
//! (`hiraFill`). The guest never sees them.

use std::collections::HashMap;
use std::ffi::c_void;

use crate::backend::MigrationError;
use cl3::OpenCl;
use opencl_sys::{cl_command_queue, cl_context, cl_int};

use opencl_sys::CL_CONTEXT_DEVICES;
use opencl_sys::CL_SUCCESS;

/// A fixed-size info value, or `None` if the query fails.
pub(crate) fn info_value<T: Copy + Default>(
    f: impl FnOnce(usize, *mut c_void, *mut usize) -> Option<cl_int>,
) -> Option<T> {
    let mut v = T::default();
    let status = f(
        size_of::<T>(),
        (&mut v as *mut T).cast(),
        std::ptr::null_mut(),
    );
    (status == Some(CL_SUCCESS)).then_some(v)
}

/// In-order queues on each context's first device, released on drop.
pub(crate) struct Queues<'a> {
    rt: &'a OpenCl,
    by_context: HashMap<usize, cl_command_queue>,
}

impl Drop for Queues<'_> {
    fn drop(&mut self) {
        self.clear();
    }
}

impl<'a> Queues<'a> {
    pub(crate) fn new(rt: &'a OpenCl) -> Self {
        Queues {
            rt,
            by_context: HashMap::new(),
        }
    }

    /// The queue for `ctx`, made on first use.
    pub(crate) fn for_context(
        &mut self,
        ctx: cl_context,
    ) -> Result<cl_command_queue, MigrationError> {
        if let Some(&q) = self.by_context.get(&(ctx as usize)) {
            return Ok(q);
        }
        let rt = self.rt;
        let device: opencl_sys::cl_device_id =
            info_value(|n, p, r| rt.clGetContextInfo(ctx, CL_CONTEXT_DEVICES, n, p, r))
                .ok_or(MigrationError::Query("a context's device"))?;
        let mut err = CL_SUCCESS;
        #[allow(deprecated)]
        let q = rt
            .clCreateCommandQueue(ctx, device, 0, &mut err)
            .filter(|q| !q.is_null() && err == CL_SUCCESS)
            .ok_or(MigrationError::Queue(err))?;
        self.by_context.insert(ctx as usize, q);
        Ok(q)
    }

    /// Releases the queue of `ctx` (which then no longer holds the context).
    pub(crate) fn forget(&mut self, ctx: usize) {
        if let Some(q) = self.by_context.remove(&ctx) {
            self.rt.clReleaseCommandQueue(q);
        }
    }

    /// Releases every queue.
    pub(crate) fn clear(&mut self) {
        for (_, q) in self.by_context.drain() {
            self.rt.clReleaseCommandQueue(q);
        }
    }
}
