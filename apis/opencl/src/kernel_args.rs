//! Kernel argument kinds, derived from what the host reports with
//! `clGetKernelArgInfo`.
//!
//! The API server uses them to decide what a guest may pass for each argument: an
//! argument the kernel reads as a pointer or an object accepts only a live id of the
//! right kind, never guest bytes, so no guest value reaches the host as a pointer. The
//! guest shim uses the same classification to return the native error codes of
//! `clSetKernelArg` and `clEnqueueNDRangeKernel` without waiting for the host.

use super::Kind;

/// `CL_KERNEL_ARG_ADDRESS_QUALIFIER` values.
pub const ADDRESS_GLOBAL: u32 = 0x119B;
pub const ADDRESS_LOCAL: u32 = 0x119C;
pub const ADDRESS_CONSTANT: u32 = 0x119D;
pub const ADDRESS_PRIVATE: u32 = 0x119E;
/// `CL_KERNEL_ARG_TYPE_PIPE`, a bit of `CL_KERNEL_ARG_TYPE_QUALIFIER`.
pub const TYPE_PIPE: u64 = 1 << 3;

/// `clGetKernelArgInfo` parameter names.
pub const CL_KERNEL_ARG_ADDRESS_QUALIFIER: u32 = 0x1196;
pub const CL_KERNEL_ARG_TYPE_NAME: u32 = 0x1198;
pub const CL_KERNEL_ARG_TYPE_QUALIFIER: u32 = 0x1199;
/// `clGetKernelInfo(CL_KERNEL_NUM_ARGS)`.
pub const CL_KERNEL_NUM_ARGS: u32 = 0x1191;

/// What one kernel argument is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// A `__global` or `__constant` pointer: a buffer (or NULL).
    Buffer,
    /// A `__local` pointer: a size and no value.
    Local,
    /// An image of any type.
    Image,
    /// A pipe.
    Pipe,
    /// A `sampler_t`.
    Sampler,
    /// A `queue_t` (device-side enqueue).
    Queue,
    /// A value of this many bytes.
    Value(usize),
    /// A value whose size the type name does not tell (a struct, a typedef).
    OpaqueValue,
    /// The host reported nothing usable about this argument.
    Unknown,
}

impl ArgKind {
    /// Classifies an argument from its address qualifier, type name (without the
    /// trailing NUL) and type qualifier. `address_bits` is the device's
    /// `CL_DEVICE_ADDRESS_BITS`, for `size_t` and friends.
    pub fn classify(address: u32, type_name: &str, type_qualifier: u64, address_bits: u32) -> Self {
        let name = type_name.trim();
        if type_qualifier & TYPE_PIPE != 0 {
            return ArgKind::Pipe;
        }
        match address {
            ADDRESS_LOCAL => ArgKind::Local,
            ADDRESS_GLOBAL | ADDRESS_CONSTANT if is_image(name) => ArgKind::Image,
            ADDRESS_GLOBAL | ADDRESS_CONSTANT => ArgKind::Buffer,
            ADDRESS_PRIVATE => {
                if is_image(name) {
                    ArgKind::Image
                } else if name == "sampler_t" {
                    ArgKind::Sampler
                } else if name == "queue_t" {
                    ArgKind::Queue
                } else if name.ends_with('*') {
                    // A private pointer cannot be a kernel argument; the host would
                    // have refused to build the kernel.
                    ArgKind::Unknown
                } else {
                    value_size(name, address_bits).map_or(ArgKind::OpaqueValue, ArgKind::Value)
                }
            }
            _ => ArgKind::Unknown,
        }
    }

    /// For an argument that names an OpenCL object (a handle on the wire): the kind of
    /// object it takes and the API's error code for anything else.
    pub fn object(self) -> Option<(Kind, i32)> {
        match self {
            ArgKind::Buffer | ArgKind::Image | ArgKind::Pipe => {
                Some((Kind::Mem, Kind::Mem.invalid_code()))
            }
            ArgKind::Sampler => Some((Kind::Sampler, Kind::Sampler.invalid_code())),
            ArgKind::Queue => Some((Kind::Queue, CL_INVALID_DEVICE_QUEUE)),
            ArgKind::Local | ArgKind::Value(_) | ArgKind::OpaqueValue | ArgKind::Unknown => None,
        }
    }
}

/// `CL_INVALID_DEVICE_QUEUE`: a `queue_t` argument given something else.
pub const CL_INVALID_DEVICE_QUEUE: i32 = -70;

fn is_image(name: &str) -> bool {
    name.starts_with("image") && name.ends_with("_t")
}

/// Byte size of a scalar or vector OpenCL C type named `name`, if it is one.
pub fn value_size(name: &str, address_bits: u32) -> Option<usize> {
    let name = name.strip_prefix("unsigned ").unwrap_or(name);
    let split = name
        .find(|c: char| c.is_ascii_digit())
        .unwrap_or(name.len());
    let (base, lanes) = name.split_at(split);
    let elem = match base {
        "char" | "uchar" => 1,
        "short" | "ushort" | "half" => 2,
        "int" | "uint" | "float" => 4,
        "long" | "ulong" | "double" => 8,
        "size_t" | "ptrdiff_t" | "intptr_t" | "uintptr_t" if lanes.is_empty() => {
            (address_bits / 8) as usize
        }
        _ => return None,
    };
    let lanes = match lanes {
        "" => 1,
        "2" => 2,
        // Three-component vectors are laid out as four.
        "3" | "4" => 4,
        "8" => 8,
        "16" => 16,
        _ => return None,
    };
    Some(elem * lanes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_pointer_is_a_buffer() {
        assert_eq!(
            ArgKind::classify(ADDRESS_GLOBAL, "float*", 0, 64),
            ArgKind::Buffer
        );
        assert_eq!(
            ArgKind::classify(ADDRESS_CONSTANT, "int*", 0, 64),
            ArgKind::Buffer
        );
    }

    #[test]
    fn images_samplers_and_pipes_are_objects() {
        assert_eq!(
            ArgKind::classify(ADDRESS_GLOBAL, "image2d_t", 0, 64),
            ArgKind::Image
        );
        assert_eq!(
            ArgKind::classify(ADDRESS_PRIVATE, "sampler_t", 0, 64),
            ArgKind::Sampler
        );
        assert_eq!(
            ArgKind::classify(ADDRESS_GLOBAL, "int", TYPE_PIPE, 64),
            ArgKind::Pipe
        );
        assert_eq!(ArgKind::Image.object(), Some((Kind::Mem, -38)));
        assert_eq!(ArgKind::Sampler.object(), Some((Kind::Sampler, -41)));
        assert_eq!(ArgKind::Local.object(), None);
    }

    #[test]
    fn vector_sizes_follow_the_opencl_layout() {
        assert_eq!(value_size("float4", 64), Some(16));
        assert_eq!(value_size("int3", 64), Some(16));
        assert_eq!(value_size("uchar16", 64), Some(16));
        assert_eq!(value_size("double", 64), Some(8));
        assert_eq!(value_size("unsigned int", 64), Some(4));
        assert_eq!(value_size("size_t", 32), Some(4));
        assert_eq!(value_size("float5", 64), None);
        assert_eq!(value_size("struct pair", 64), None);
    }

    #[test]
    fn struct_values_are_opaque_and_bad_qualifiers_unknown() {
        assert_eq!(
            ArgKind::classify(ADDRESS_PRIVATE, "struct pair", 0, 64),
            ArgKind::OpaqueValue
        );
        assert_eq!(ArgKind::classify(0, "int", 0, 64), ArgKind::Unknown);
        assert_eq!(
            ArgKind::classify(ADDRESS_LOCAL, "float*", 0, 64),
            ArgKind::Local
        );
    }
}
