//! Info queries: the host's whole value, with host objects rewritten as ids and the
//! values Hira changes for the guest (masked features, build logs, queue properties).

use std::ffi::c_void;

use hira_apis_opencl::{
    CL_CONTEXT_PLATFORM, CL_PROGRAM_BINARIES, CL_PROGRAM_BINARY_SIZES, InfoHandles, Kind,
};
use hira_protocol::Writer;
use hira_protocol::codec::MAX_ARRAY;
use opencl_sys::{
    CL_INVALID_VALUE, CL_OUT_OF_RESOURCES, CL_PROGRAM_BUILD_LOG, CL_PROGRAM_BUILD_OPTIONS,
    CL_PROGRAM_SOURCE, CL_SUCCESS, cl_int,
};

use super::session::Session;
use crate::backend::Fail;

/// Largest info value the server will fetch.
const MAX_INFO: usize = 64 * 1024 * 1024;

impl Session<'_> {
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
