//! Info queries: the guest's cache of values that cannot change, handles in values
//! rewritten as the guest's, and what Hira masks or rewrites in values.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{LazyLock, Mutex};

use hira_apis_opencl::{CL_CONTEXT_PLATFORM, CL_PROGRAM_BINARIES, InfoHandles, Kind};
use hira_protocol::codec::Reader;
use hira_protocol::frame::MAX_FRAME_BODY;
use opencl_sys::{
    CL_DEVICE_EXECUTION_CAPABILITIES, CL_DEVICE_EXTENSIONS, CL_DEVICE_EXTENSIONS_WITH_VERSION,
    CL_DEVICE_PARTITION_PROPERTIES, CL_DEVICE_SVM_CAPABILITIES, CL_DEVICE_SVM_COARSE_GRAIN_BUFFER,
    CL_EVENT_COMMAND_TYPE, CL_EXEC_NATIVE_KERNEL, CL_PLATFORM_EXTENSIONS,
    CL_PLATFORM_EXTENSIONS_WITH_VERSION, cl_int,
};

use super::Call;
use crate::rt::{self, CL_INVALID_VALUE};

/// Info parameters that change over an object's life and so are never cached: the
/// reference counts of devices and queues, a device's default queue
/// (`clSetDefaultDeviceCommandQueue`). (Queue properties do not change: Hira does not
/// offer the deprecated `clSetCommandQueueProperty`.)
const UNCACHEABLE: &[u32] = &[0x1047, 0x1092, 0x1095];

type InfoCache = Mutex<HashMap<(u16, Vec<u8>), Vec<u8>>>;
static INFO_CACHE: LazyLock<InfoCache> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Drops the cached answers about object `id`, which the application released (ids are
/// never given again, so this only bounds the cache).
pub(crate) fn forget_cached(id: u64) {
    INFO_CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(_, request), _| request.get(..8) != Some(&id.to_le_bytes()[..]));
}

/// Runs an info query: the host returns the whole value; the guest translates
/// handles, applies its own view (platform identity, memory flags) and the API's
/// size rules.
///
/// # Safety
/// `value` must be null or valid for `size` writes, `size_ret` null or valid.
pub unsafe fn info_call(
    c: Call,
    function: &str,
    cache: bool,
    param: u32,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Result<cl_int, cl_int> {
    let first_id =
        c.w.as_slice()
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
    // A key holds the whole request: inputs sent from where they are are not in `w`.
    let key = (cache && !UNCACHEABLE.contains(&param) && !c.borrows())
        .then(|| (c.op, c.w.as_slice().to_vec()));
    let cached = key.as_ref().and_then(|k| {
        INFO_CACHE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(k)
            .cloned()
    });
    let bytes = match cached {
        Some(b) => b,
        None => {
            let mut rep = c.send(false)?;
            if rep.status != 0 {
                rep.finish()?;
                return Ok(rep.status);
            }
            let mut b = rep.r.bytes()?.to_vec();
            rep.finish()?;
            translate_handles(function, param, &mut b)?;
            rewrite(function, param, first_id, &mut b);
            if let Some(k) = key {
                INFO_CACHE
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(k, b.clone());
            }
            b
        }
    };
    if function == "clGetProgramInfo" && param == CL_PROGRAM_BINARIES {
        // SAFETY: forwarded contract.
        return unsafe { program_binaries(&bytes, size, value, size_ret) };
    }
    // SAFETY: forwarded contract.
    Ok(unsafe { info_answer(&bytes, size, value, size_ret) })
}

/// Writes a whole info value with the API's size rules: `CL_INVALID_VALUE` when
/// `value` is given and smaller than it; its size into `size_ret` if asked.
///
/// # Safety
/// `value` must be null or valid for `size` writes, `size_ret` null or valid.
pub(crate) unsafe fn info_answer(
    bytes: &[u8],
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    if !value.is_null() {
        if size < bytes.len() {
            return CL_INVALID_VALUE;
        }
        // SAFETY: `value` is valid for `size` >= bytes.len() writes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), value.cast::<u8>(), bytes.len()) };
    }
    if !size_ret.is_null() {
        // SAFETY: valid for one write per the contract.
        unsafe { *size_ret = bytes.len() };
    }
    0
}

/// `CL_PROGRAM_BINARIES`: the host sends each binary length-prefixed; the value the
/// application sees is its own array of pointers, which we fill.
unsafe fn program_binaries(
    bytes: &[u8],
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> Result<cl_int, cl_int> {
    let mut r = Reader::new(bytes);
    let mut bins = Vec::new();
    while r.remaining() > 0 {
        bins.push(r.bytes(MAX_FRAME_BODY).map_err(|_| CL_INVALID_VALUE)?);
    }
    let need = bins.len() * size_of::<*mut u8>();
    if !value.is_null() {
        if size < need {
            return Ok(CL_INVALID_VALUE);
        }
        for (i, b) in bins.iter().enumerate() {
            // SAFETY: `value` holds `size >= need` bytes of pointers.
            let dst = unsafe { *(value as *const *mut u8).add(i) };
            if !dst.is_null() {
                // SAFETY: the application sized each buffer from CL_PROGRAM_BINARY_SIZES.
                unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
            }
        }
    }
    if !size_ret.is_null() {
        // SAFETY: valid for one write.
        unsafe { *size_ret = need };
    }
    Ok(0)
}

fn translate_handles(function: &str, param: u32, b: &mut [u8]) -> Result<(), cl_int> {
    let Some(how) = hira_apis_opencl::info_handles(function, param) else {
        return Ok(());
    };
    if !b.len().is_multiple_of(8) {
        return Err(CL_INVALID_VALUE);
    }
    let mut words: Vec<u64> = b
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    match how {
        InfoHandles::One(kind) | InfoHandles::Array(kind) => {
            for w in words.iter_mut().filter(|w| **w != 0) {
                *w = rt::adopt(kind, *w) as u64;
            }
        }
        InfoHandles::ContextProperties => {
            for pair in words.chunks_mut(2) {
                if pair.len() == 2 && pair[0] == CL_CONTEXT_PLATFORM && pair[1] != 0 {
                    pair[1] = rt::adopt(Kind::Platform, pair[1]) as u64;
                }
            }
        }
    }
    for (c, w) in b.chunks_mut(8).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
    }
    Ok(())
}

/// The platform's identity strings as the guest sees them. By default they are the
/// host's, so that libraries select platforms and per-vendor paths as natively; Hira
/// shows itself only in the ICD suffix (`CL_PLATFORM_ICD_SUFFIX_KHR` = `HIRA`), which
/// no application selects by. `tagged` (`HIRA_IDENTITY=tagged`) also names Hira in
/// the platform's name, vendor and version.
fn platform_string(param: u32, host: &str, tagged: bool) -> Option<String> {
    match (param, tagged) {
        (0x0920, _) => Some("HIRA".to_string()),
        (0x0902, true) => Some(format!("Hira remote OpenCL ({host})")),
        (0x0903, true) => Some("Hira".to_string()),
        (0x0901, true) => Some(format!("{host} Hira/{}", env!("CARGO_PKG_VERSION"))),
        _ => None,
    }
}

/// Whether the platform names Hira (`HIRA_IDENTITY=tagged`).
fn tagged_identity() -> bool {
    static TAGGED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TAGGED.get_or_init(|| hira_guest_driver::settings::settings().identity_tagged)
}

fn rewrite(function: &str, param: u32, obj_id: u64, b: &mut Vec<u8>) {
    match function {
        "clGetPlatformInfo" => {
            let host = String::from_utf8_lossy(b.strip_suffix(&[0]).unwrap_or(b)).into_owned();
            if let Some(s) = platform_string(param, &host, tagged_identity()) {
                *b = s.into_bytes();
                b.push(0);
            }
            mask_extensions(
                param,
                CL_PLATFORM_EXTENSIONS,
                CL_PLATFORM_EXTENSIONS_WITH_VERSION,
                b,
            );
        }
        "clGetEventInfo" if param == CL_EVENT_COMMAND_TYPE => {
            if let Some(t) = rt::command_type(obj_id) {
                *b = t.to_le_bytes().to_vec();
            }
        }
        "clGetDeviceInfo" => {
            mask_device(param, b);
            mask_extensions(
                param,
                CL_DEVICE_EXTENSIONS,
                CL_DEVICE_EXTENSIONS_WITH_VERSION,
                b,
            );
        }
        "clGetMemObjectInfo" => {
            let Some(extra) = rt::mem_extra(obj_id) else {
                return;
            };
            match param {
                0x1101 => *b = extra.flags.to_le_bytes().to_vec(),
                0x1103 => *b = (extra.host_ptr as u64).to_le_bytes().to_vec(),
                _ => {}
            }
        }
        _ => {}
    }
}

/// Extension lists without the extensions whose entry points Hira does not forward
/// (`hira_apis_opencl::extensions`).
fn mask_extensions(param: u32, names: u32, versioned: u32, b: &mut Vec<u8>) {
    use hira_apis_opencl::extensions;
    if param == names {
        let host = String::from_utf8_lossy(b.strip_suffix(&[0]).unwrap_or(b)).into_owned();
        *b = extensions::mask_list(&host).into_bytes();
        b.push(0);
    } else if param == versioned {
        *b = extensions::mask_name_versions(b);
    }
}

/// What Hira cannot honour across the VM boundary, or does not forward yet, is masked
/// from device properties, so that applications never select it: fine-grained shared
/// virtual memory and SVM atomics (guest and host address spaces differ; coarse-grained
/// buffers are supported, `crate::svm`), native kernels (a guest function pointer
/// cannot run on the host). The matching entry points return the specification's codes for a device
/// without them (see `icd::unsupported_code`). Of the partition types, only those the
/// specification defines are reported: a vendor's own has a property list whose shape
/// Hira cannot know, so `clCreateSubDevices` could not forward it.
fn mask_device(param: u32, b: &mut Vec<u8>) {
    if param == CL_DEVICE_PARTITION_PROPERTIES {
        let mut kept: Vec<u8> = b
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .filter(|&t| {
                matches!(
                    t,
                    hira_apis_opencl::CL_DEVICE_PARTITION_EQUALLY
                        | hira_apis_opencl::CL_DEVICE_PARTITION_BY_COUNTS
                        | hira_apis_opencl::CL_DEVICE_PARTITION_BY_AFFINITY_DOMAIN
                )
            })
            .flat_map(u64::to_le_bytes)
            .collect();
        if kept.is_empty() {
            // No type: the list is a single 0.
            kept = 0u64.to_le_bytes().to_vec();
        }
        *b = kept;
        return;
    }
    let Ok(bytes) = <[u8; 8]>::try_from(&b[..]) else {
        return;
    };
    let v = u64::from_le_bytes(bytes);
    let masked = match param {
        CL_DEVICE_EXECUTION_CAPABILITIES => v & !CL_EXEC_NATIVE_KERNEL,
        CL_DEVICE_SVM_CAPABILITIES => v & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER,
        _ => return,
    };
    b.copy_from_slice(&masked.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fine_grained_svm_and_native_kernels_are_masked_from_devices() {
        let mut caps = 3u64.to_le_bytes().to_vec();
        mask_device(CL_DEVICE_EXECUTION_CAPABILITIES, &mut caps);
        assert_eq!(caps, 1u64.to_le_bytes());
        let mut svm = 7u64.to_le_bytes().to_vec();
        mask_device(CL_DEVICE_SVM_CAPABILITIES, &mut svm);
        assert_eq!(svm, 1u64.to_le_bytes(), "coarse-grained buffers only");
        let mut other = 7u64.to_le_bytes().to_vec();
        mask_device(0x1000, &mut other);
        assert_eq!(other, 7u64.to_le_bytes());
    }

    #[test]
    fn only_the_specifications_partition_types_are_reported() {
        let words = |v: &[u64]| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
        let mut types = words(&[0x1086, 0x4040, 0x1087]);
        mask_device(CL_DEVICE_PARTITION_PROPERTIES, &mut types);
        assert_eq!(types, words(&[0x1086, 0x1087]));
        let mut vendor = words(&[0x4040]);
        mask_device(CL_DEVICE_PARTITION_PROPERTIES, &mut vendor);
        assert_eq!(vendor, words(&[0]));
    }

    #[test]
    fn platform_identity_is_the_hosts_unless_tagged() {
        assert_eq!(platform_string(0x0902, "PoCL", false), None);
        assert_eq!(platform_string(0x0920, "POCL", false).unwrap(), "HIRA");
        assert_eq!(
            platform_string(0x0902, "PoCL", true).unwrap(),
            "Hira remote OpenCL (PoCL)"
        );
        assert_eq!(platform_string(0x0904, "PoCL", true), None);
    }

    #[test]
    fn null_handle_in_info_value_stays_null() {
        let mut b = 0u64.to_le_bytes().to_vec();
        translate_handles("clGetDeviceInfo", 0x1042, &mut b).unwrap();
        assert_eq!(b, 0u64.to_le_bytes());
    }

    #[test]
    fn ragged_handle_value_is_rejected() {
        let mut b = vec![0u8; 5];
        assert_eq!(
            translate_handles("clGetContextInfo", 0x1081, &mut b),
            Err(CL_INVALID_VALUE)
        );
    }
}
