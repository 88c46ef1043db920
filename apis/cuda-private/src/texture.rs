//! The descriptions of CUDA arrays, texture objects and surface objects of cuda.h
//! 13.0 (`CUDA_ARRAY_DESCRIPTOR`, `CUDA_ARRAY3D_DESCRIPTOR`, `CUDA_RESOURCE_DESC`,
//! `CUDA_TEXTURE_DESC`), shared by Hira's guest library, its API server (which puts
//! the host's array handles in place of the guest's) and the CPU test executor.

use std::ffi::c_void;

/// `CUDA_ARRAY_DESCRIPTOR` (24 bytes): `height` 0 for a 1D array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (40 bytes): `depth` 0 for a 2D array, `height` and
/// `depth` 0 for a 1D one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

impl From<ArrayDescriptor> for Array3dDescriptor {
    /// A 2D (or 1D) array as `cuArray3DCreate` describes it: no depth, no flags.
    fn from(d: ArrayDescriptor) -> Array3dDescriptor {
        Array3dDescriptor {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            channels: d.channels,
            flags: 0,
        }
    }
}

/// `CUDA_ARRAY3D_LAYERED`, `_SURFACE_LDST`, `_CUBEMAP`, `_TEXTURE_GATHER`.
pub const ARRAY3D_LAYERED: u32 = 0x01;
pub const ARRAY3D_SURFACE_LDST: u32 = 0x02;
pub const ARRAY3D_CUBEMAP: u32 = 0x04;
pub const ARRAY3D_TEXTURE_GATHER: u32 = 0x08;

/// `CUresourcetype`.
pub const RESOURCE_ARRAY: u32 = 0;
pub const RESOURCE_MIPMAPPED_ARRAY: u32 = 1;
pub const RESOURCE_LINEAR: u32 = 2;
pub const RESOURCE_PITCH2D: u32 = 3;

/// `CUDA_RESOURCE_DESC` (144 bytes): the type, then the union read by the type.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceDesc {
    pub res_type: u32,
    pub res: [u64; 16],
    pub flags: u32,
}

/// A resource as its type reads the union.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `res.array.hArray`.
    Array(*mut c_void),
    /// `res.linear`: device address, format, channels, bytes.
    Linear {
        device: u64,
        format: u32,
        channels: u32,
        bytes: usize,
    },
    /// `res.pitch2D`: device address, format, channels, width, height, pitch.
    Pitch2d {
        device: u64,
        format: u32,
        channels: u32,
        width: usize,
        height: usize,
        pitch: usize,
    },
    /// Mipmapped arrays and unknown types.
    Other(u32),
}

impl ResourceDesc {
    pub fn resource(&self) -> Resource {
        let r = &self.res;
        let (format, channels) = (r[1] as u32, (r[1] >> 32) as u32);
        match self.res_type {
            RESOURCE_ARRAY => Resource::Array(r[0] as usize as *mut c_void),
            RESOURCE_LINEAR => Resource::Linear {
                device: r[0],
                format,
                channels,
                bytes: r[2] as usize,
            },
            RESOURCE_PITCH2D => Resource::Pitch2d {
                device: r[0],
                format,
                channels,
                width: r[2] as usize,
                height: r[3] as usize,
                pitch: r[4] as usize,
            },
            t => Resource::Other(t),
        }
    }

    /// The array a `RESOURCE_ARRAY` names, replaced by `f`'s answer (the API server
    /// puts its host handle in place of the guest's).
    pub fn map_array(&mut self, f: impl FnOnce(*mut c_void) -> Option<*mut c_void>) -> Option<()> {
        if self.res_type == RESOURCE_ARRAY {
            self.res[0] = f(self.res[0] as usize as *mut c_void)? as usize as u64;
        }
        Some(())
    }
}

/// `CUaddress_mode`: `CU_TR_ADDRESS_MODE_WRAP`, `_CLAMP`, `_MIRROR`, `_BORDER`.
pub const ADDRESS_WRAP: u32 = 0;
pub const ADDRESS_CLAMP: u32 = 1;
pub const ADDRESS_MIRROR: u32 = 2;
pub const ADDRESS_BORDER: u32 = 3;
/// `CU_TR_FILTER_MODE_LINEAR` (0 is point).
pub const FILTER_LINEAR: u32 = 1;
/// `CU_TRSF_READ_AS_INTEGER`, `CU_TRSF_NORMALIZED_COORDINATES`.
pub const TRSF_READ_AS_INTEGER: u32 = 0x01;
pub const TRSF_NORMALIZED_COORDINATES: u32 = 0x02;

/// `CUDA_TEXTURE_DESC` (104 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TextureDesc {
    pub address_mode: [u32; 3],
    pub filter_mode: u32,
    pub flags: u32,
    pub max_anisotropy: u32,
    pub mipmap_filter_mode: u32,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub border_color: [f32; 4],
    pub reserved: [i32; 12],
}

/// `CUDA_RESOURCE_VIEW_DESC` (112 bytes).
pub const RESOURCE_VIEW_DESC_SIZE: usize = 112;

/// `CUarray_format`s and the bytes of one channel of each: unsigned and signed
/// integers of 8, 16 and 32 bits, half and float.
pub const FORMATS: &[(u32, usize)] = &[
    (0x01, 1),
    (0x02, 2),
    (0x03, 4),
    (0x08, 1),
    (0x09, 2),
    (0x0a, 4),
    (0x10, 2),
    (0x20, 4),
];

/// The bytes of one texel of `channels` channels of `format`, for the formats of
/// [`FORMATS`] and 1, 2 or 4 channels.
pub fn texel_bytes(format: u32, channels: u32) -> Option<usize> {
    let one = FORMATS.iter().find(|(f, _)| *f == format)?.1;
    matches!(channels, 1 | 2 | 4).then_some(one * channels as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_cuda_h_s() {
        assert_eq!(std::mem::size_of::<ArrayDescriptor>(), 24);
        assert_eq!(std::mem::size_of::<Array3dDescriptor>(), 40);
        assert_eq!(std::mem::size_of::<ResourceDesc>(), 144);
        assert_eq!(std::mem::size_of::<TextureDesc>(), 104);
    }

    #[test]
    fn a_pitched_resource_reads_its_fields_from_the_union() {
        let mut d = ResourceDesc {
            res_type: RESOURCE_PITCH2D,
            ..Default::default()
        };
        d.res[0] = 0x7000;
        d.res[1] = 0x20 | (2 << 32);
        d.res[2] = 16;
        d.res[3] = 8;
        d.res[4] = 512;
        assert_eq!(
            d.resource(),
            Resource::Pitch2d {
                device: 0x7000,
                format: 0x20,
                channels: 2,
                width: 16,
                height: 8,
                pitch: 512
            }
        );
        assert_eq!(texel_bytes(0x20, 2), Some(8));
        assert_eq!(texel_bytes(0x20, 3), None);
    }
}
