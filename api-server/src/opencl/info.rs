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
        if function == "clGetPlatformInfo" {
            super::content_size::mask_unforwarded(param, &mut buf);
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

/// Takes extension `name` out of a value of query `param` if `param` is one of
/// `lists`: the names (a space-separated string) or the name-version array.
pub(super) fn remove_extension(name: &str, param: u32, lists: (u32, u32), buf: &mut Vec<u8>) {
    use hira_apis_opencl::extensions::{filter_list, filter_name_versions};
    if param == lists.0 {
        let text =
            String::from_utf8_lossy(buf.split(|&b| b == 0).next().unwrap_or(&[])).into_owned();
        *buf = filter_list(&text, |e| e != name).into_bytes();
        buf.push(0);
    } else if param == lists.1 {
        *buf = filter_name_versions(buf, |e| e != name);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use hira_apis_opencl::HOST_ID_BIT;
    use hira_protocol::Reader;
    use opencl_sys::{CL_DEVICE_PLATFORM, CL_DEVICE_TYPE_ALL};

    use super::*;
    use crate::opencl::test_backend;

    /// The reply of an info query: its status and, on success, its value.
    fn answer(w: &Writer) -> (cl_int, Option<Vec<u8>>) {
        let mut r = Reader::new(w.as_slice());
        let status = r.i32().unwrap();
        let value = (status == CL_SUCCESS).then(|| r.bytes(MAX_INFO).unwrap().to_vec());
        r.finish().unwrap();
        (status, value)
    }

    #[test]
    fn an_extension_is_taken_out_of_both_lists_and_nothing_else() {
        use opencl_sys::{CL_DEVICE_EXTENSIONS, CL_DEVICE_EXTENSIONS_WITH_VERSION};
        let lists = (CL_DEVICE_EXTENSIONS, CL_DEVICE_EXTENSIONS_WITH_VERSION);
        let name = "cl_khr_command_buffer";
        let mut text = b"cl_khr_fp64 cl_khr_command_buffer cl_khr_spir\0".to_vec();
        remove_extension(name, CL_DEVICE_EXTENSIONS, lists, &mut text);
        assert_eq!(text, b"cl_khr_fp64 cl_khr_spir\0");
        let entry = |name: &str, version: u32| {
            let mut e = version.to_le_bytes().to_vec();
            let mut n = name.as_bytes().to_vec();
            n.resize(64, 0);
            e.extend(n);
            e
        };
        let mut array = [entry("cl_khr_fp64", 0x400000), entry(name, 9 << 12)].concat();
        remove_extension(name, CL_DEVICE_EXTENSIONS_WITH_VERSION, lists, &mut array);
        assert_eq!(array, entry("cl_khr_fp64", 0x400000));
        let mut other = b"cl_khr_command_buffer".to_vec();
        remove_extension(name, 0x1000, lists, &mut other);
        assert_eq!(
            other, b"cl_khr_command_buffer",
            "another query's value changed"
        );
    }

    #[test]
    fn host_handles_in_a_value_become_the_guests_ids() {
        let t = test_backend();
        let backend = &t.backend;
        let s = Session::new(backend);
        let rt = s.rt();
        let mut device = std::ptr::null_mut();
        assert_eq!(
            rt.clGetDeviceIDs(
                s.platform(),
                CL_DEVICE_TYPE_ALL,
                1,
                &mut device,
                std::ptr::null_mut()
            ),
            Some(CL_SUCCESS)
        );
        let mut w = Writer::new();
        s.info_query(
            "clGetDeviceInfo",
            device.cast(),
            CL_DEVICE_PLATFORM,
            &mut w,
            |p, n, v, r| rt.clGetDeviceInfo(device, p, n, v, r),
        )
        .unwrap();
        let (status, value) = answer(&w);
        assert_eq!(status, CL_SUCCESS);
        let id = u64::from_le_bytes(value.unwrap().try_into().unwrap());
        assert_ne!(
            id,
            s.platform() as u64,
            "the host's handle reached the guest"
        );
        assert_ne!(id & HOST_ID_BIT, 0);
        assert_eq!(
            s.handles().id_of(Kind::Platform, s.platform() as usize),
            Some(id)
        );
    }

    #[test]
    fn a_value_of_no_size_is_answered_without_asking_the_host_again() {
        let t = test_backend();
        let backend = &t.backend;
        let s = Session::new(backend);
        let calls = Cell::new(0);
        let mut w = Writer::new();
        s.info_query(
            "clGetContextInfo",
            std::ptr::null_mut(),
            0x1082,
            &mut w,
            |_, n, _, r| {
                calls.set(calls.get() + 1);
                assert_eq!(n, 0, "a value of no size was fetched");
                // SAFETY: the size query passes a valid `size_ret`.
                unsafe { *r = 0 };
                Some(CL_SUCCESS)
            },
        )
        .unwrap();
        assert_eq!(answer(&w), (CL_SUCCESS, Some(Vec::new())));
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn a_failed_or_oversized_value_answers_only_a_status() {
        let t = test_backend();
        let backend = &t.backend;
        let s = Session::new(backend);
        let mut w = Writer::new();
        s.info_query(
            "clGetDeviceInfo",
            std::ptr::null_mut(),
            0x1000,
            &mut w,
            |_, _, _, _| Some(CL_INVALID_VALUE),
        )
        .unwrap();
        assert_eq!(answer(&w), (CL_INVALID_VALUE, None));
        let mut w = Writer::new();
        s.info_query(
            "clGetDeviceInfo",
            std::ptr::null_mut(),
            0x1000,
            &mut w,
            |_, n, _, r| {
                assert_eq!(n, 0, "an oversized value was fetched");
                // SAFETY: the size query passes a valid `size_ret`.
                unsafe { *r = MAX_INFO + 1 };
                Some(CL_SUCCESS)
            },
        )
        .unwrap();
        assert_eq!(answer(&w), (CL_OUT_OF_RESOURCES, None));
    }

    #[test]
    fn program_binaries_come_back_whole_and_in_order() {
        let t = test_backend();
        let backend = &t.backend;
        let s = Session::new(backend);
        let bins: [&[u8]; 2] = [b"abc", b""];
        let mut w = Writer::new();
        s.info_query(
            "clGetProgramInfo",
            std::ptr::null_mut(),
            CL_PROGRAM_BINARIES,
            &mut w,
            |p, n, v, r| {
                match (p, v.is_null()) {
                    (CL_PROGRAM_BINARY_SIZES, true) => {
                        // SAFETY: the size query passes a valid `size_ret`.
                        unsafe { *r = 2 * size_of::<usize>() };
                    }
                    (CL_PROGRAM_BINARY_SIZES, false) => {
                        assert_eq!(n, 2 * size_of::<usize>());
                        // SAFETY: `v` holds two sizes, as asked.
                        unsafe { *v.cast::<[usize; 2]>() = [3, 0] };
                    }
                    (CL_PROGRAM_BINARIES, false) => {
                        // SAFETY: `v` holds two pointers, to storage of the sizes given.
                        let ptrs = unsafe { *v.cast::<[*mut u8; 2]>() };
                        assert!(ptrs[1].is_null(), "storage for an empty binary");
                        // SAFETY: `ptrs[0]` has room for the 3 bytes its size said.
                        unsafe { std::ptr::copy_nonoverlapping(bins[0].as_ptr(), ptrs[0], 3) };
                    }
                    other => panic!("unexpected query {other:?}"),
                }
                Some(CL_SUCCESS)
            },
        )
        .unwrap();
        let (status, value) = answer(&w);
        assert_eq!(status, CL_SUCCESS);
        let value = value.unwrap();
        let mut r = Reader::new(&value);
        for b in bins {
            assert_eq!(r.bytes(MAX_INFO).unwrap(), b);
        }
        r.finish().unwrap();
    }
}
