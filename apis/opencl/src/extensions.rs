//! Which host extensions a guest sees.
//!
//! An extension that adds entry points is advertised only if Hira forwards them
//! ([`COMMAND_BUFFER`], [`CONTENT_SIZE`]); other such extensions are masked from
//! platform and device extension lists (the names, the `_WITH_VERSION` arrays). Extensions that only add kernel-language
//! features, image formats or queries need nothing of Hira and pass through. Anything
//! not known to be of the second kind is masked, so a new host extension is never
//! advertised before Hira supports it.

/// Extensions without host entry points (or whose entry points Hira implements:
/// `cl_khr_icd`).
pub const PASSED_THROUGH: &[&str] = &[
    "cl_khr_3d_image_writes",
    "cl_khr_byte_addressable_store",
    // Version 0.9.0 only: the API server takes it out of a device that reports another
    // (`api-server/src/opencl/command_buffer.rs`).
    "cl_khr_command_buffer",
    "cl_khr_depth_images",
    "cl_khr_device_uuid",
    "cl_khr_expect_assume",
    "cl_khr_extended_bit_ops",
    "cl_khr_extended_versioning",
    "cl_khr_fp16",
    "cl_khr_fp64",
    "cl_khr_global_int32_base_atomics",
    "cl_khr_global_int32_extended_atomics",
    "cl_khr_icd",
    "cl_khr_image2d_from_buffer",
    "cl_khr_int64_base_atomics",
    "cl_khr_int64_extended_atomics",
    "cl_khr_integer_dot_product",
    "cl_khr_kernel_clock",
    "cl_khr_local_int32_base_atomics",
    "cl_khr_local_int32_extended_atomics",
    "cl_khr_mipmap_image",
    "cl_khr_mipmap_image_writes",
    "cl_khr_pci_bus_info",
    "cl_khr_priority_hints",
    "cl_khr_select_fprounding_mode",
    "cl_khr_spir",
    "cl_khr_spirv_extended_debug_info",
    "cl_khr_spirv_linkonce_odr",
    "cl_khr_spirv_no_integer_wrap_decoration",
    "cl_khr_srgb_image_writes",
    "cl_khr_subgroup_ballot",
    "cl_khr_subgroup_clustered_reduce",
    "cl_khr_subgroup_extended_types",
    "cl_khr_subgroup_non_uniform_arithmetic",
    "cl_khr_subgroup_non_uniform_vote",
    "cl_khr_subgroup_rotate",
    "cl_khr_subgroup_shuffle",
    "cl_khr_subgroup_shuffle_relative",
    "cl_khr_throttle_hints",
    "cl_khr_work_group_uniform_arithmetic",
    "cl_ext_float_atomics",
    "cl_intel_required_subgroup_size",
    "cl_intel_subgroups",
    "cl_intel_subgroups_char",
    "cl_intel_subgroups_long",
    "cl_intel_subgroups_short",
    // Its one entry point is forwarded where the host gives it (the API server takes it
    // out elsewhere).
    "cl_pocl_content_size",
];

/// `cl_khr_command_buffer`: passed through, its entry points forwarded, where the host
/// reports the one version Hira knows (the API server takes it out elsewhere).
pub const COMMAND_BUFFER: &str = "cl_khr_command_buffer";

/// `cl_pocl_content_size`: passed through, `clSetContentSizeBufferPoCL` forwarded,
/// where the host platform gives the entry point (the API server takes it out
/// elsewhere).
pub const CONTENT_SIZE: &str = "cl_pocl_content_size";

/// The extensions whose entry points Hira forwards, and those entry points (the `ext`
/// functions of `protocol/api/opencl.api`): a guest gets an entry point only if the
/// host platform or one of its devices reports the extension to it.
pub const ENTRY_POINTS: &[(&str, &[&str])] = &[
    (
        COMMAND_BUFFER,
        &[
            "clCreateCommandBufferKHR",
            "clFinalizeCommandBufferKHR",
            "clRetainCommandBufferKHR",
            "clReleaseCommandBufferKHR",
            "clEnqueueCommandBufferKHR",
            "clCommandBarrierWithWaitListKHR",
            "clCommandCopyBufferKHR",
            "clCommandCopyBufferRectKHR",
            "clCommandCopyBufferToImageKHR",
            "clCommandCopyImageKHR",
            "clCommandCopyImageToBufferKHR",
            "clCommandFillBufferKHR",
            "clCommandFillImageKHR",
            "clCommandNDRangeKernelKHR",
            "clGetCommandBufferInfoKHR",
        ],
    ),
    (CONTENT_SIZE, &["clSetContentSizeBufferPoCL"]),
];

/// The extension that adds entry point `function`, if Hira forwards it.
pub fn extension_of(function: &str) -> Option<&'static str> {
    ENTRY_POINTS
        .iter()
        .find(|(_, fns)| fns.contains(&function))
        .map(|&(ext, _)| ext)
}

/// Whether a guest sees host extension `name`.
pub fn passed_through(name: &str) -> bool {
    PASSED_THROUGH.contains(&name)
}

/// A space-separated extension list without the masked names, each taken out with the
/// white space before it; the rest is the host's string.
pub fn mask_list(list: &str) -> String {
    filter_list(list, passed_through)
}

/// A space-separated extension list with only the names `keep` keeps, each taken out
/// with the white space before it; the rest is the host's string.
pub fn filter_list(list: &str, keep: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(list.len());
    let mut rest = list;
    while !rest.is_empty() {
        let start = rest.len() - rest.trim_start_matches(' ').len();
        let (space, tail) = rest.split_at(start);
        let end = tail.find(' ').unwrap_or(tail.len());
        let (word, after) = tail.split_at(end);
        // A masked name goes with the white space before it.
        if word.is_empty() || keep(word) {
            out.push_str(space);
            out.push_str(word);
        }
        rest = after;
    }
    out.trim_start().to_string()
}

/// Size of a `cl_name_version`: a `cl_version` and a 64-byte name.
pub const NAME_VERSION_LEN: usize = 4 + 64;

/// A `cl_name_version` array without the masked names.
pub fn mask_name_versions(bytes: &[u8]) -> Vec<u8> {
    filter_name_versions(bytes, passed_through)
}

/// A `cl_name_version` array with only the entries whose names `keep` keeps (a ragged
/// last entry is dropped).
pub fn filter_name_versions(bytes: &[u8], keep: impl Fn(&str) -> bool) -> Vec<u8> {
    bytes
        .chunks(NAME_VERSION_LEN)
        .filter(|entry| {
            let name = &entry[4.min(entry.len())..];
            let name = name.split(|&b| b == 0).next().unwrap_or(&[]);
            entry.len() == NAME_VERSION_LEN && std::str::from_utf8(name).is_ok_and(&keep)
        })
        .flatten()
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_with_entry_points_are_masked_and_spacing_kept() {
        assert_eq!(
            mask_list("cl_khr_fp64   cl_khr_semaphore cl_khr_spir cl_khr_external_memory"),
            "cl_khr_fp64 cl_khr_spir"
        );
        assert_eq!(
            filter_list("cl_khr_icd cl_pocl_content_size", |e| e != CONTENT_SIZE),
            "cl_khr_icd"
        );
        assert_eq!(mask_list("cl_khr_semaphore cl_khr_icd"), "cl_khr_icd");
        assert_eq!(mask_list(""), "");
    }

    #[test]
    fn name_version_arrays_keep_only_passed_through_entries() {
        let entry = |name: &str| {
            let mut e = 0x400000u32.to_le_bytes().to_vec();
            let mut n = name.as_bytes().to_vec();
            n.resize(64, 0);
            e.extend(n);
            e
        };
        let all = [entry("cl_khr_icd"), entry("cl_khr_semaphore")].concat();
        assert_eq!(mask_name_versions(&all), entry("cl_khr_icd"));
        let all = [entry("cl_khr_icd"), entry(CONTENT_SIZE)].concat();
        assert_eq!(
            filter_name_versions(&all, |e| e != CONTENT_SIZE),
            entry("cl_khr_icd")
        );
    }
}
