//! CUDA graphs and stream capture in the guest (`hira_apis_cuda_private::graph`,
//! shared with the CPU test executor), and beside them stream-ordered allocation and
//! memory pools (`hira_apis_cuda_private::pool`, [`GuestMemory`]): a graph is the stream work it records, kept
//! in the application's process, and a launch of it issues that work through this
//! library's own entry points, as the program could have. The host sees the
//! launches, copies and memsets, checked as the program's own; a session holding
//! graphs moves with nothing more to carry.
//!
//! The functions named after a call are the `captured` hooks of the generated
//! code: while the call's stream captures, its work becomes a node of the capture's
//! graph (`Some`), else the call goes on (`None`).

#![allow(non_snake_case, clippy::too_many_arguments)]

use std::ffi::{c_uint, c_void};

use hira_apis_cuda_private::copy2d::{DEVICE, HOST};
use hira_apis_cuda_private::graph::{self, HostFn, Issue, Memset, Raw};
use hira_apis_cuda_private::{copy2d::Memcpy3D, launch};

use hira_apis_cuda::status;

use crate::rt::{self, CUevent, CUfunction, CUresult, CUstream};

/// Issues a graph's work through the guest's entry points.
pub(crate) struct Guest;

pub(crate) static ISSUE: Guest = Guest;

impl Issue for Guest {
    fn launch_kernel(
        &self,
        f: Raw,
        [gx, gy, gz]: [c_uint; 3],
        [bx, by, bz]: [c_uint; 3],
        shared: c_uint,
        stream: Raw,
        params: *mut *mut c_void,
    ) -> i32 {
        // SAFETY: a node's parameters, one pointer per parameter.
        unsafe {
            crate::generated::cuLaunchKernel(
                f,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                shared,
                stream,
                params,
                std::ptr::null_mut(),
            )
        }
    }

    fn launch_ex(&self, config: &launch::Config, f: Raw, params: *mut *mut c_void) -> i32 {
        // SAFETY: as above; the configuration is the node's.
        unsafe {
            crate::local::cuLaunchKernelEx(
                (config as *const launch::Config).cast(),
                f,
                params,
                std::ptr::null_mut(),
            )
        }
    }

    fn copy(&self, p: &Memcpy3D, stream: Raw) -> i32 {
        // SAFETY: the node's description, whose host sides the program keeps valid
        // while the graph may run, as the API requires.
        unsafe { crate::local::cuMemcpy3DAsync_v2((p as *const Memcpy3D).cast(), stream) }
    }

    fn memset(&self, m: &Memset, stream: Raw) -> i32 {
        use crate::local::{cuMemsetD2D8Async, cuMemsetD2D16Async, cuMemsetD2D32Async};
        let (d, p, w, h) = (m.dst, m.pitch, m.width, m.height);
        // SAFETY: device addresses only, checked against the guest's allocations.
        unsafe {
            match m.element_size {
                1 => cuMemsetD2D8Async(d, p, m.value as u8, w, h, stream),
                2 => cuMemsetD2D16Async(d, p, m.value as u16, w, h, stream),
                _ => cuMemsetD2D32Async(d, p, m.value, w, h, stream),
            }
        }
    }

    fn host(&self, f: HostFn, data: Raw, stream: Raw) -> i32 {
        // SAFETY: the program's function and data.
        unsafe { crate::local::cuLaunchHostFunc(stream, Some(f), data) }
    }

    fn record(&self, event: Raw, stream: Raw) -> i32 {
        // SAFETY: handles, checked as the program's.
        unsafe { crate::generated::cuEventRecord(event, stream) }
    }

    fn wait(&self, stream: Raw, event: Raw) -> i32 {
        // SAFETY: handles, checked as the program's.
        unsafe { crate::generated::cuStreamWaitEvent(stream, event, 0) }
    }

    fn param_sizes(&self, f: Raw) -> Option<Vec<usize>> {
        let info = rt::function(f as usize as u64)?;
        if let Some(layout) = info.layout {
            return Some(layout.iter().map(|&(_, size)| size as usize).collect());
        }
        // The host gave no layout with the function: ask it, one parameter at a time.
        let mut sizes = Vec::new();
        loop {
            let (mut off, mut size) = (0usize, 0usize);
            // SAFETY: valid out-pointers.
            let st = unsafe {
                crate::generated::cuFuncGetParamInfo(f, sizes.len(), &mut off, &mut size)
            };
            match st {
                status::SUCCESS => sizes.push(size),
                status::INVALID_VALUE => return Some(sizes),
                _ => return None,
            }
        }
    }

    fn kernel_function(&self, kern: Raw) -> Option<Raw> {
        // A library's kernel is its function in every context here.
        rt::function(kern as usize as u64).map(|_| kern)
    }

    fn stream_ok(&self, stream: Raw) -> bool {
        crate::local::stream_known(stream) == status::SUCCESS
    }

    fn memory(&self) -> &'static dyn hira_apis_cuda_private::pool::Memory {
        &MEMORY
    }
}

/// The driver's graph and stream-capture entry points.
pub(crate) mod entries {
    hira_apis_cuda_private::graph_entry_points!(&crate::graphs::ISSUE);
}

pub(crate) fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Option<CUresult> {
    graph::capture(stream, || {
        // SAFETY: the application's parameters, as the API requires.
        unsafe {
            graph::kernel_op(
                &ISSUE,
                f,
                [gx, gy, gz],
                [bx, by, bz],
                shared,
                params,
                extra,
                Vec::new(),
            )
        }
    })
}

pub(crate) fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> Option<CUresult> {
    graph::capture(stream, || {
        graph::linear_copy_op(dst, DEVICE, src as u64, HOST, n)
    })
}

pub(crate) fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: CUstream,
) -> Option<CUresult> {
    graph::capture(stream, || {
        graph::linear_copy_op(dst as u64, HOST, src, DEVICE, n)
    })
}

pub(crate) fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    n: usize,
    stream: CUstream,
) -> Option<CUresult> {
    graph::capture(stream, || {
        graph::linear_copy_op(dst, DEVICE, src, DEVICE, n)
    })
}

pub(crate) fn cuMemsetD8Async(dst: u64, v: u8, n: usize, stream: CUstream) -> Option<CUresult> {
    graph::capture(stream, || graph::memset_op(dst, 0, v.into(), 1, n, 1))
}

pub(crate) fn cuMemsetD16Async(dst: u64, v: u16, n: usize, stream: CUstream) -> Option<CUresult> {
    graph::capture(stream, || graph::memset_op(dst, 0, v.into(), 2, n, 1))
}

pub(crate) fn cuMemsetD32Async(
    dst: u64,
    v: c_uint,
    n: usize,
    stream: CUstream,
) -> Option<CUresult> {
    graph::capture(stream, || graph::memset_op(dst, 0, v, 4, n, 1))
}

pub(crate) fn cuStreamSynchronize(stream: CUstream) -> Option<CUresult> {
    graph::capture_forbidden(stream)
}

pub(crate) fn cuStreamQuery(stream: CUstream) -> Option<CUresult> {
    graph::capture_forbidden(stream)
}

pub(crate) fn cuStreamWaitEvent(
    stream: CUstream,
    event: CUevent,
    flags: c_uint,
) -> Option<CUresult> {
    if flags & !graph::EVENT_EXTERNAL != 0 {
        return Some(status::INVALID_VALUE);
    }
    graph::capture_wait(stream, event, flags)
}

pub(crate) fn cuEventRecord(event: CUevent, stream: CUstream) -> Option<CUresult> {
    graph::capture_record(event, stream, false)
}

/// An allocation a graph made is freed in the guest: its memory stays while a
/// graph holds its node (`hira_apis_cuda_private::graph::memory`).
pub(crate) fn cuMemFree_v2(dptr: u64) -> Option<CUresult> {
    graph::free_block(dptr)
}

/// Allocates and synchronises for the memory pools (`hira_apis_cuda_private::pool`)
/// through the guest's entry points: pool memory is ordinary device memory to the
/// host, counted against the VM's quota and placed where a moved session finds it.
pub(crate) struct GuestMemory;

pub(crate) static MEMORY: GuestMemory = GuestMemory;

impl hira_apis_cuda_private::pool::Memory for GuestMemory {
    fn alloc(&self, size: usize) -> Result<u64, i32> {
        let mut p = 0;
        // SAFETY: a valid out-pointer.
        match unsafe { crate::generated::cuMemAlloc_v2(&mut p, size) } {
            status::SUCCESS => Ok(p),
            e => Err(e),
        }
    }

    fn free(&self, ptr: u64) -> i32 {
        // SAFETY: a value; the host checks it.
        unsafe { crate::generated::cuMemFree_v2(ptr) }
    }

    fn sync(&self, stream: Raw) -> i32 {
        // SAFETY: a handle, checked as the program's.
        unsafe { crate::generated::cuStreamSynchronize(stream) }
    }

    fn stream_ok(&self, stream: Raw) -> bool {
        crate::local::stream_known(stream) == status::SUCCESS
    }

    fn current_device(&self) -> Result<i32, i32> {
        let mut d = 0;
        // SAFETY: a valid out-pointer.
        match unsafe { crate::generated::cuCtxGetDevice(&mut d) } {
            status::SUCCESS => Ok(d),
            e => Err(e),
        }
    }

    fn device_count(&self) -> i32 {
        let mut n = 0;
        // SAFETY: a valid out-pointer.
        unsafe { crate::generated::cuDeviceGetCount(&mut n) };
        n
    }
}

/// The driver's stream-ordered allocation and memory-pool entry points.
pub(crate) mod pools {
    hira_apis_cuda_private::pool_entry_points!(&crate::graphs::MEMORY);
}
