//! The ICD dispatch table and the symbols the ICD loader looks up.

use std::ffi::{CStr, c_char, c_void};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use log::warn;
use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::{cl_int, cl_platform_id, cl_uint};

use crate::icd_slots::{SLOT_COUNT, SLOTS};

use opencl_sys::CL_INVALID_MEM_OBJECT;
use opencl_sys::CL_INVALID_OPERATION;
use opencl_sys::CL_INVALID_VALUE;
use opencl_sys::CL_PLATFORM_NOT_FOUND_KHR;

/// The dispatch table every object's first field points to.
pub(crate) struct Dispatch(pub _cl_icd_dispatch);

// SAFETY: the table is built once and never written again; it holds only function
// pointers, which are safe to share.
unsafe impl Sync for Dispatch {}
// SAFETY: as above.
unsafe impl Send for Dispatch {}

const _: () =
    assert!(std::mem::size_of::<_cl_icd_dispatch>() == SLOT_COUNT * std::mem::size_of::<usize>());

/// Whether each unsupported slot has already been logged.
static LOGGED: [AtomicBool; SLOT_COUNT] = [const { AtomicBool::new(false) }; SLOT_COUNT];

/// What an unsupported slot does: logs the function's name once, reports its
/// [`unsupported_code`] through `errcode_ret` when it has one, and returns NULL or
/// that code. The arguments are read as eight machine words; reading words
/// the caller did not pass is harmless on the System V x86-64 and AArch64 ABIs, whose
/// argument registers and caller stack are always readable.
fn unsupported(slot: usize, args: [usize; 8]) -> usize {
    let s = &SLOTS[slot];
    let code = unsupported_code(s.name);
    if !LOGGED[slot].swap(true, Ordering::Relaxed) {
        warn!("{} is not supported by Hira; returning {code}", s.name);
    }
    if let Some(i) = s.errcode_arg {
        let p = args[i] as *mut cl_int;
        if !p.is_null() {
            // SAFETY: the API defines this argument as `cl_int *errcode_ret`, which the
            // application passes null or valid.
            unsafe { p.write_unaligned(code) };
        }
    }
    if s.returns_pointer {
        0
    } else {
        code as u32 as usize
    }
}

/// The code an unsupported entry point returns: the one the specification gives for
/// what Hira reports (no pipes, no SVM, no native kernels), else
/// `CL_INVALID_OPERATION`.
fn unsupported_code(name: &str) -> cl_int {
    match name {
        // No pipe object can exist, so whatever the application passes is not one.
        "clGetPipeInfo" => CL_INVALID_MEM_OBJECT,
        _ => CL_INVALID_OPERATION,
    }
}

type RawFn = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize, usize, usize) -> usize;

macro_rules! stubs {
    ($($i:literal)*) => {
        const STUBS: [RawFn; SLOT_COUNT] = [$({
            unsafe extern "C" fn stub(a: usize, b: usize, c: usize, d: usize, e: usize, f: usize, g: usize, h: usize) -> usize {
                crate::rt::guard_raw(|| unsupported($i, [a, b, c, d, e, f, g, h]))
            }
            stub as RawFn
        },)*];
    };
}

stubs!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29
    30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59
    60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89
    90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114
    115 116 117 118 119 120 121 122 123 124 125 126 127 128 129 130 131 132 133 134 135 136
    137 138 139 140 141 142 143 144 145 146 147 148 149);

/// The process's dispatch table: generated functions where described, stubs elsewhere.
pub(crate) static DISPATCH: LazyLock<Box<Dispatch>> = LazyLock::new(|| {
    let mut words = [0usize; SLOT_COUNT];
    for (w, stub) in words.iter_mut().zip(STUBS.iter()) {
        *w = *stub as usize;
    }
    // SAFETY: `_cl_icd_dispatch` is a `repr(C)` struct of SLOT_COUNT nullable function
    // pointers (checked by the assertion above), so an array of non-null addresses of
    // `extern "C"` functions is a valid value of it. Each stub ignores the arguments
    // it is not given, see `unsupported`.
    let mut d: _cl_icd_dispatch = unsafe { std::mem::transmute(words) };
    crate::generated::fill(&mut d);
    Box::new(Dispatch(d))
});

/// Looked up by the ICD loader: lists this ICD's platforms.
///
/// # Safety
/// `platforms` must be null or valid for `num_entries` writes, `num_platforms` null or
/// valid for one write, as the `cl_khr_icd` extension specifies.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clIcdGetPlatformIDsKHR(
    num_entries: cl_uint,
    platforms: *mut cl_platform_id,
    num_platforms: *mut cl_uint,
) -> cl_int {
    crate::rt::status_call("clIcdGetPlatformIDsKHR", || {
        if (num_entries == 0 && !platforms.is_null())
            || (platforms.is_null() && num_platforms.is_null())
        {
            return Err(CL_INVALID_VALUE);
        }
        if crate::rt::conn().is_err() {
            if !num_platforms.is_null() {
                // SAFETY: checked non-null; the caller passes a valid pointer.
                unsafe { *num_platforms = 0 };
            }
            return Err(CL_PLATFORM_NOT_FOUND_KHR);
        }
        // The loader asks for the count, then for the list: the count's round trip
        // brings the list, which the next call takes (once: the host's platforms do
        // not change, but the loader asks again only in another process).
        let mut listed = LISTED.lock().unwrap_or_else(|e| e.into_inner());
        if platforms.is_null() {
            let mut list = [std::ptr::null_mut(); LISTED_MAX];
            let mut n: cl_uint = 0;
            // SAFETY: `list` holds LISTED_MAX entries; `n` is a local.
            let status = unsafe {
                crate::generated::clGetPlatformIDs(LISTED_MAX as cl_uint, list.as_mut_ptr(), &mut n)
            };
            if status == 0 {
                *listed = (n as usize <= LISTED_MAX)
                    .then(|| list[..n as usize].iter().map(|&p| p as usize).collect());
                // SAFETY: checked non-null above (one of the two is).
                unsafe { *num_platforms = n };
            }
            return if status == -1001 || status == 0 {
                Ok(status)
            } else {
                Err(status)
            };
        }
        if let Some(list) = listed.take() {
            for (i, &p) in list.iter().take(num_entries as usize).enumerate() {
                // SAFETY: `platforms` is valid for `num_entries` writes.
                unsafe { *platforms.add(i) = p as cl_platform_id };
            }
            if !num_platforms.is_null() {
                // SAFETY: checked non-null; the caller passes a valid pointer.
                unsafe { *num_platforms = list.len() as cl_uint };
            }
            return Ok(0);
        }
        drop(listed);
        // SAFETY: the pointers are passed on with the same contract.
        let status =
            unsafe { crate::generated::clGetPlatformIDs(num_entries, platforms, num_platforms) };
        if status == -1001 || status == 0 {
            Ok(status)
        } else {
            Err(status)
        }
    })
}

/// The most platforms the count query brings the list of.
const LISTED_MAX: usize = 16;

/// The list the last count query brought, for the list query after it.
static LISTED: std::sync::Mutex<Option<Vec<usize>>> = std::sync::Mutex::new(None);

/// Exported because ICD loaders look this symbol up in every vendor library before
/// they use it; calls arrive through the dispatch table like every other.
///
/// # Safety
/// As `clGetPlatformInfo`: `param_value` null or valid for `param_value_size` bytes,
/// `param_value_size_ret` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetPlatformInfo(
    platform: cl_platform_id,
    param_name: opencl_sys::cl_platform_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    // SAFETY: forwarded with the same contract.
    unsafe {
        crate::generated::clGetPlatformInfo(
            platform,
            param_name,
            param_value_size,
            param_value,
            param_value_size_ret,
        )
    }
}

fn extension_function(name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the loader or application passes a NUL-terminated function name.
    let name = unsafe { CStr::from_ptr(name) };
    match name.to_bytes() {
        b"clIcdGetPlatformIDsKHR" => clIcdGetPlatformIDsKHR as *mut c_void,
        other => crate::generated::EXTENSION_FUNCTIONS
            .iter()
            .find(|(n, _)| n.as_bytes() == other)
            .filter(|(n, _)| {
                hira_apis_opencl::extensions::extension_of(n).is_some_and(extension_seen)
            })
            .map_or(std::ptr::null_mut(), |&(_, f)| f as *mut c_void),
    }
}

/// Whether the host's platform or one of its devices reports extension `name` to this
/// guest, after Hira's masking and the API server's (an extension it does not forward
/// is not there). The lists are asked for once.
fn extension_seen(name: &str) -> bool {
    static SEEN: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SEEN.get_or_init(|| {
        use crate::generated as g;
        // The value of a string query, up to 8 KiB.
        let text = |query: &dyn Fn(usize, *mut c_void) -> cl_int| {
            let mut text = vec![0u8; 8192];
            (query(text.len(), text.as_mut_ptr().cast()) == 0).then(|| {
                let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
                String::from_utf8_lossy(&text[..end]).into_owned()
            })
        };
        let mut platform: cl_platform_id = std::ptr::null_mut();
        let mut devices = [std::ptr::null_mut(); 16];
        let mut n: cl_uint = 0;
        // SAFETY: out-pointers to locals of the sizes given.
        let found = unsafe {
            g::clGetPlatformIDs(1, &mut platform, std::ptr::null_mut()) == 0
                && g::clGetDeviceIDs(platform, !0, 16, devices.as_mut_ptr(), &mut n) == 0
        };
        if !found {
            return Vec::new();
        }
        let mut lists: Vec<String> = Vec::new();
        // SAFETY: a buffer of the length given for each string query.
        lists.extend(text(&|len, value| unsafe {
            g::clGetPlatformInfo(platform, 0x0904, len, value, std::ptr::null_mut())
        }));
        for &d in &devices[..(n as usize).min(16)] {
            // SAFETY: as above.
            lists.extend(text(&|len, value| unsafe {
                g::clGetDeviceInfo(d, 0x1030, len, value, std::ptr::null_mut())
            }));
        }
        lists
            .iter()
            .flat_map(|l| l.split(' '))
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect()
    })
    .iter()
    .any(|e| e == name)
}

/// Returns the address of an extension function this ICD implements, or NULL.
///
/// # Safety
/// `func_name` must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetExtensionFunctionAddress(func_name: *const c_char) -> *mut c_void {
    crate::rt::guard_raw(|| extension_function(func_name) as usize) as *mut c_void
}

/// Per-platform form of [`clGetExtensionFunctionAddress`].
///
/// # Safety
/// `func_name` must be null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetExtensionFunctionAddressForPlatform(
    _platform: cl_platform_id,
    func_name: *const c_char,
) -> *mut c_void {
    crate::rt::guard_raw(|| extension_function(func_name) as usize) as *mut c_void
}

#[cfg(test)]
mod coverage {
    use super::*;

    #[test]
    fn every_extension_entry_point_belongs_to_the_one_extension_that_adds_it() {
        let api = hira_apigen::Api::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../protocol/api/opencl.api"
        ))
        .unwrap();
        let mut described: Vec<&str> = api
            .funcs
            .iter()
            .filter(|f| f.ext)
            .map(|f| f.name.as_str())
            .collect();
        let mut listed: Vec<&str> = hira_apis_opencl::extensions::ENTRY_POINTS
            .iter()
            .flat_map(|(_, fns)| fns.iter().copied())
            .collect();
        described.sort_unstable();
        listed.sort_unstable();
        assert_eq!(described, listed);
        for (ext, _) in hira_apis_opencl::extensions::ENTRY_POINTS {
            assert!(
                hira_apis_opencl::extensions::passed_through(ext),
                "{ext} is masked"
            );
        }
    }

    /// The coverage table of `docs/coverage.md`: every entry point of the ICD dispatch
    /// table (all of OpenCL 3.0 and the extensions the loader dispatches) as forwarded,
    /// emulated or unsupported, from the API description and the dispatch table; then
    /// the extension policy.
    fn table() -> String {
        let api = hira_apigen::Api::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../protocol/api/opencl.api"
        ))
        .unwrap();
        let mut out = String::from(
            "# OpenCL coverage\n\n\
             Generated from `protocol/api/opencl.api` and the ICD dispatch table by\n\
             `cargo test -p hira-opencl coverage` (set `HIRA_WRITE_COVERAGE=1` to rewrite\n\
             it). *Forwarded*: the call reaches the host as the application made it;\n\
             *emulated*: the guest implements it on forwarded calls; *unsupported*: it\n\
             fails with the code shown, and what would advertise it is masked.\n\n\
             | Entry point | Status |\n|---|---|\n",
        );
        let (mut fwd, mut emu, mut none) = (0, 0, 0);
        for s in SLOTS.iter() {
            let status = match api.funcs.iter().find(|f| f.name == s.name) {
                Some(f) if f.local => {
                    emu += 1;
                    "emulated".to_string()
                }
                Some(_) => {
                    fwd += 1;
                    "forwarded".to_string()
                }
                None => {
                    none += 1;
                    format!("unsupported ({})", unsupported_code(s.name))
                }
            };
            out.push_str(&format!("| `{}` | {status} |\n", s.name));
        }
        out.push_str(&format!(
            "\n{fwd} forwarded, {emu} emulated, {none} unsupported.\n\n\
             ## Extensions\n\n\
             Host extensions pass through when they add no entry points (or only ones\n\
             Hira implements); every other host extension is masked from platform and\n\
             device extension lists (`apis/opencl/src/extensions.rs`). Passed\n\
             through:\n\n"
        ));
        for e in hira_apis_opencl::extensions::PASSED_THROUGH {
            out.push_str(&format!("- `{e}`\n"));
        }
        out.push_str(
            "\nMasked device properties: `CL_DEVICE_SVM_CAPABILITIES` keeps only\n\
             `CL_DEVICE_SVM_COARSE_GRAIN_BUFFER` (fine-grained sharing and SVM atomics\n\
             cannot cross the VM boundary), the `CL_EXEC_NATIVE_KERNEL` bit of\n\
             `CL_DEVICE_EXECUTION_CAPABILITIES` is cleared, and\n\
             `CL_DEVICE_PARTITION_PROPERTIES` keeps the partition types the\n\
             specification defines.\n",
        );
        out
    }

    #[test]
    fn coverage_table_in_the_docs_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/coverage.md");
        let want = table();
        if std::env::var_os("HIRA_WRITE_COVERAGE").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/coverage.md is stale: HIRA_WRITE_COVERAGE=1 cargo test -p hira-opencl coverage"
        );
    }
}
