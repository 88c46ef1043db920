//! CUDA graphs and stream capture, and stream-ordered allocation and memory pools,
//! on the executor (test infrastructure, standing in for NVIDIA's driver): the
//! shared implementations (`hira_apis_cuda_private::graph`, `::pool`) with this
//! library's own entry points issuing a graph's work and allocating.

use std::ffi::{c_uint, c_void};

use hira_apis_cuda_private::graph::{self, HostFn, Issue, Memset, Raw};
use hira_apis_cuda_private::{copy2d::Memcpy3D, launch};

use crate::{CUDA_SUCCESS, Handle};

/// Issues a graph's work through the executor's entry points.
pub(crate) struct Executor;

pub(crate) static ISSUE: Executor = Executor;

impl Issue for Executor {
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
            crate::cuLaunchKernel(
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
        unsafe { crate::library::cuLaunchKernelEx(config, f, params, std::ptr::null_mut()) }
    }

    fn copy(&self, p: &Memcpy3D, stream: Raw) -> i32 {
        // SAFETY: the node's description, whose host sides the program keeps
        // valid while the graph may run, as the API requires.
        unsafe { crate::pitched::cuMemcpy3DAsync_v2(p, stream) }
    }

    fn memset(&self, m: &Memset, stream: Raw) -> i32 {
        use crate::pitched::{cuMemsetD2D8Async, cuMemsetD2D16Async, cuMemsetD2D32Async};
        let (d, p, w, h) = (m.dst, m.pitch, m.width, m.height);
        match m.element_size {
            1 => cuMemsetD2D8Async(d, p, m.value as u8, w, h, stream),
            2 => cuMemsetD2D16Async(d, p, m.value as u16, w, h, stream),
            _ => cuMemsetD2D32Async(d, p, m.value, w, h, stream),
        }
    }

    fn host(&self, f: HostFn, data: Raw, stream: Raw) -> i32 {
        // SAFETY: the program's function and data.
        unsafe { crate::library::cuLaunchHostFunc(stream, Some(f), data) }
    }

    fn record(&self, event: Raw, stream: Raw) -> i32 {
        crate::cuEventRecord(event, stream)
    }

    fn wait(&self, stream: Raw, event: Raw) -> i32 {
        crate::cuStreamWaitEvent(stream, event, 0)
    }

    fn param_sizes(&self, f: Raw) -> Option<Vec<usize>> {
        let mut sizes = None;
        crate::with(|s| {
            sizes = crate::kernel_of(s, f)
                .map(|(m, i, _)| m.kernels[i].params.iter().map(|p| p.size).collect());
            CUDA_SUCCESS
        });
        sizes
    }

    fn kernel_function(&self, kern: Raw) -> Option<Raw> {
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        (unsafe { crate::library::cuKernelGetFunction(&mut f, kern) } == CUDA_SUCCESS).then_some(f)
    }

    fn stream_ok(&self, stream: Raw) -> bool {
        let mut ok = false;
        crate::with(|s| {
            ok = crate::stream_ok(s, stream);
            CUDA_SUCCESS
        });
        ok
    }

    fn memory(&self) -> &'static dyn hira_apis_cuda_private::pool::Memory {
        &MEMORY
    }
}

hira_apis_cuda_private::graph_entry_points!(&crate::graphs::ISSUE);

/// `cuEventRecordWithFlags`: `CU_EVENT_RECORD_EXTERNAL` makes an event-record node
/// while capturing, and is otherwise an ordinary record.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags(ev: Handle, stream: Handle, flags: c_uint) -> i32 {
    if flags & !graph::EVENT_EXTERNAL != 0 {
        return crate::CUDA_ERROR_INVALID_VALUE;
    }
    if let Some(st) = graph::capture_record(ev, stream, flags & graph::EVENT_EXTERNAL != 0) {
        return st;
    }
    crate::cuEventRecord(ev, stream)
}

/// Allocates and synchronises for the memory pools through the executor's entry
/// points.
pub(crate) struct ExecutorMemory;

pub(crate) static MEMORY: ExecutorMemory = ExecutorMemory;

impl hira_apis_cuda_private::pool::Memory for ExecutorMemory {
    fn alloc(&self, size: usize) -> Result<u64, i32> {
        let mut p = 0;
        // SAFETY: a valid out-pointer.
        match unsafe { crate::cuMemAlloc_v2(&mut p, size) } {
            CUDA_SUCCESS => Ok(p),
            e => Err(e),
        }
    }

    fn free(&self, ptr: u64) -> i32 {
        crate::cuMemFree_v2(ptr)
    }

    fn sync(&self, stream: Raw) -> i32 {
        crate::cuStreamSynchronize(stream)
    }

    fn stream_ok(&self, stream: Raw) -> bool {
        Issue::stream_ok(&ISSUE, stream)
    }

    fn current_device(&self) -> Result<i32, i32> {
        let mut d = 0;
        // SAFETY: a valid out-pointer.
        match unsafe { crate::cuCtxGetDevice(&mut d) } {
            CUDA_SUCCESS => Ok(d),
            e => Err(e),
        }
    }

    fn device_count(&self) -> i32 {
        let mut n = 0;
        // SAFETY: a valid out-pointer.
        unsafe { crate::cuDeviceGetCount(&mut n) };
        n
    }
}

/// The driver's stream-ordered allocation and memory-pool entry points.
pub(crate) mod pools {
    hira_apis_cuda_private::pool_entry_points!(&crate::graphs::MEMORY);
}
