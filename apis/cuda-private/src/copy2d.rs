//! `cuMemcpy2D`'s and `cuMemcpy3D`'s descriptions of a copy (`CUDA_MEMCPY2D`,
//! `CUDA_MEMCPY3D` of cuda.h 13.0) and the memory types they name, shared by Hira's
//! guest library (which splits such a copy into the driver calls Hira remotes) and
//! the CPU test executor. A copy is `depth` slices of `height` rows of `width` bytes.

use std::ffi::c_void;

/// `CU_MEMORYTYPE_HOST`.
pub const HOST: u32 = 1;
/// `CU_MEMORYTYPE_DEVICE`.
pub const DEVICE: u32 = 2;
/// `CU_MEMORYTYPE_ARRAY`.
pub const ARRAY: u32 = 3;
/// `CU_MEMORYTYPE_UNIFIED`: an address the driver tells host from device memory by.
pub const UNIFIED: u32 = 4;

/// `CUDA_MEMCPY2D` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Memcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: u64,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: u64,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

/// One side of a copy, resolved: where its first byte is, its pitch, the bytes from
/// one slice to the next (3D), and whether it is device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Side {
    pub at: u64,
    pub pitch: usize,
    pub slice: usize,
    pub device: bool,
}

impl Side {
    /// The bytes from the first row's start to the last row's end, for `depth`
    /// slices of `height` rows of `width` bytes.
    pub fn span(&self, width: usize, height: usize, depth: usize) -> Option<u64> {
        (depth.checked_sub(1)?)
            .checked_mul(self.slice)?
            .checked_add((height.checked_sub(1)?).checked_mul(self.pitch)?)?
            .checked_add(width)
            .map(|n| n as u64)
    }

    /// Where row `k` starts, counting rows of `height` per slice.
    pub fn row(&self, k: usize, height: usize) -> u64 {
        self.at + ((k / height) * self.slice + (k % height) * self.pitch) as u64
    }

    /// Whether rows of `width` bytes follow each other without gaps, in slices of
    /// `height` rows.
    pub fn contiguous(&self, width: usize, height: usize) -> bool {
        self.pitch == width && self.slice == width * height
    }
}

/// `CUDA_MEMCPY3D` (200 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Memcpy3D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: u64,
    pub src_array: *mut c_void,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: u64,
    pub dst_array: *mut c_void,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

/// One side as the application described it.
struct Described {
    ty: u32,
    host: u64,
    device: u64,
    x: usize,
    y: usize,
    z: usize,
    pitch: usize,
    /// Rows per slice (3D).
    rows: usize,
}

/// Resolves a side of a copy of `depth` slices of `height` rows of `width` bytes.
fn resolve(
    d: Described,
    width: usize,
    height: usize,
    depth: usize,
    is_device: &impl Fn(u64) -> bool,
) -> Result<Side, Refused> {
    let (base, dev) = match d.ty {
        HOST => (d.host, false),
        DEVICE => (d.device, true),
        UNIFIED => (d.device, is_device(d.device)),
        ARRAY => return Err(Refused::Array),
        _ => return Err(Refused::Invalid),
    };
    let rows_apart = height > 1 || depth > 1;
    if base == 0 || (rows_apart && d.pitch < width) || (depth > 1 && d.rows < height) {
        return Err(Refused::Invalid);
    }
    let slice = d.pitch.checked_mul(d.rows).ok_or(Refused::Invalid)?;
    let off =
        d.z.checked_mul(slice)
            .and_then(|o| o.checked_add(d.y.checked_mul(d.pitch)?))
            .and_then(|o| o.checked_add(d.x))
            .ok_or(Refused::Invalid)?;
    Ok(Side {
        at: base.checked_add(off as u64).ok_or(Refused::Invalid)?,
        pitch: d.pitch,
        slice,
        device: dev,
    })
}

/// One side of a copy of bytes in a row to or from an array (`cuMemcpyHtoA`,
/// `AtoH`, `DtoA`, `AtoD`, `AtoA` and their asynchronous forms).
#[derive(Clone, Copy, Debug)]
pub enum Linear {
    /// Host memory.
    Host(*mut c_void),
    /// Device memory.
    Device(u64),
    /// An array, at a byte offset into its first row.
    Array(*mut c_void, usize),
}

impl Memcpy3D {
    /// The copy of `bytes` bytes from `src` to `dst` as one row: what the driver's
    /// copies with an array side in bytes (rather than rows) make.
    pub fn linear(dst: Linear, src: Linear, bytes: usize) -> Memcpy3D {
        // SAFETY: all zeroes is a valid description (integers and null pointers).
        let mut c: Memcpy3D = unsafe { std::mem::zeroed() };
        (c.width_in_bytes, c.height, c.depth) = (bytes, 1, 1);
        match src {
            Linear::Host(p) => (c.src_memory_type, c.src_host, c.src_pitch) = (HOST, p, bytes),
            Linear::Device(d) => {
                (c.src_memory_type, c.src_device, c.src_pitch) = (DEVICE, d, bytes)
            }
            Linear::Array(a, at) => {
                (c.src_memory_type, c.src_array, c.src_x_in_bytes) = (ARRAY, a, at)
            }
        }
        match dst {
            Linear::Host(p) => (c.dst_memory_type, c.dst_host, c.dst_pitch) = (HOST, p, bytes),
            Linear::Device(d) => {
                (c.dst_memory_type, c.dst_device, c.dst_pitch) = (DEVICE, d, bytes)
            }
            Linear::Array(a, at) => {
                (c.dst_memory_type, c.dst_array, c.dst_x_in_bytes) = (ARRAY, a, at)
            }
        }
        (c.src_height, c.dst_height) = (1, 1);
        c
    }
}

impl Memcpy3D {
    /// The source and destination, as [`Memcpy2D::sides`] resolves them; levels of
    /// detail other than 0 are invalid (they are for arrays).
    pub fn sides(&self, is_device: impl Fn(u64) -> bool) -> Result<(Side, Side), Refused> {
        if self.src_lod != 0 || self.dst_lod != 0 {
            return Err(Refused::Invalid);
        }
        let (w, h, d) = (self.width_in_bytes, self.height, self.depth);
        let src = Described {
            ty: self.src_memory_type,
            host: self.src_host as u64,
            device: self.src_device,
            x: self.src_x_in_bytes,
            y: self.src_y,
            z: self.src_z,
            pitch: self.src_pitch,
            rows: self.src_height,
        };
        let dst = Described {
            ty: self.dst_memory_type,
            host: self.dst_host as u64,
            device: self.dst_device,
            x: self.dst_x_in_bytes,
            y: self.dst_y,
            z: self.dst_z,
            pitch: self.dst_pitch,
            rows: self.dst_height,
        };
        Ok((
            resolve(src, w, h, d, &is_device)?,
            resolve(dst, w, h, d, &is_device)?,
        ))
    }
}

/// Why a 2D copy cannot be made as described.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// A CUDA array (not supported here).
    Array,
    /// A bad memory type, a pitch below the width, a null host pointer, or an
    /// overflow: `CUDA_ERROR_INVALID_VALUE`.
    Invalid,
}

impl Memcpy2D {
    /// The source and destination, each told host from device by `is_device` for
    /// `CU_MEMORYTYPE_UNIFIED`: those of the same copy one slice deep.
    pub fn sides(&self, is_device: impl Fn(u64) -> bool) -> Result<(Side, Side), Refused> {
        Memcpy3D::from(self).sides(is_device)
    }
}

impl From<&Memcpy2D> for Memcpy3D {
    /// The same copy as `cuMemcpy3D` describes it: one slice deep, each side's rows
    /// per slice the copy's height.
    fn from(c: &Memcpy2D) -> Memcpy3D {
        Memcpy3D {
            src_x_in_bytes: c.src_x_in_bytes,
            src_y: c.src_y,
            src_z: 0,
            src_lod: 0,
            src_memory_type: c.src_memory_type,
            src_host: c.src_host,
            src_device: c.src_device,
            src_array: c.src_array,
            reserved0: std::ptr::null_mut(),
            src_pitch: c.src_pitch,
            src_height: c.height,
            dst_x_in_bytes: c.dst_x_in_bytes,
            dst_y: c.dst_y,
            dst_z: 0,
            dst_lod: 0,
            dst_memory_type: c.dst_memory_type,
            dst_host: c.dst_host,
            dst_device: c.dst_device,
            dst_array: c.dst_array,
            reserved1: std::ptr::null_mut(),
            dst_pitch: c.dst_pitch,
            dst_height: c.height,
            width_in_bytes: c.width_in_bytes,
            height: c.height,
            depth: 1,
        }
    }
}

/// Where a side of a copy starts and how its rows lie, as the application described
/// it: byte, row and slice, bytes per row, rows per slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub x: usize,
    pub y: usize,
    pub z: usize,
    pub pitch: usize,
    pub rows: usize,
}

impl Memcpy3D {
    /// The source's position (`src`), else the destination's.
    pub fn position(&self, src: bool) -> Position {
        if src {
            Position {
                x: self.src_x_in_bytes,
                y: self.src_y,
                z: self.src_z,
                pitch: self.src_pitch,
                rows: self.src_height,
            }
        } else {
            Position {
                x: self.dst_x_in_bytes,
                y: self.dst_y,
                z: self.dst_z,
                pitch: self.dst_pitch,
                rows: self.dst_height,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy() -> Memcpy2D {
        Memcpy2D {
            src_x_in_bytes: 4,
            src_y: 2,
            src_memory_type: HOST,
            src_host: 0x1000 as *const c_void,
            src_device: 0,
            src_array: std::ptr::null_mut(),
            src_pitch: 100,
            dst_x_in_bytes: 0,
            dst_y: 1,
            dst_memory_type: UNIFIED,
            dst_host: std::ptr::null_mut(),
            dst_device: 0x7000,
            dst_array: std::ptr::null_mut(),
            dst_pitch: 512,
            width_in_bytes: 64,
            height: 3,
        }
    }

    #[test]
    fn sides_start_at_their_row_and_column() {
        assert_eq!(std::mem::size_of::<Memcpy2D>(), 128);
        assert_eq!(std::mem::offset_of!(Memcpy2D, dst_x_in_bytes), 56);
        let (s, d) = copy().sides(|p| p == 0x7000).unwrap();
        assert_eq!((s.at, s.pitch, s.device), (0x1000 + 204, 100, false));
        assert_eq!((d.at, d.pitch, d.device), (0x7000 + 512, 512, true));
        assert_eq!(d.span(64, 3, 1), Some(2 * 512 + 64));
        assert_eq!(d.row(2, 3), 0x7000 + 3 * 512);
    }

    #[test]
    fn a_3d_copy_is_slices_of_rows() {
        assert_eq!(std::mem::size_of::<Memcpy3D>(), 200);
        assert_eq!(std::mem::offset_of!(Memcpy3D, dst_x_in_bytes), 88);
        assert_eq!(std::mem::offset_of!(Memcpy3D, depth), 192);
        let c = Memcpy3D {
            src_x_in_bytes: 8,
            src_y: 1,
            src_z: 2,
            src_lod: 0,
            src_memory_type: DEVICE,
            src_host: std::ptr::null(),
            src_device: 0x10_0000,
            src_array: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            src_pitch: 512,
            src_height: 10,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_z: 0,
            dst_lod: 0,
            dst_memory_type: HOST,
            dst_host: 0x2000 as *mut c_void,
            dst_device: 0,
            dst_array: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dst_pitch: 64,
            dst_height: 4,
            width_in_bytes: 64,
            height: 4,
            depth: 3,
        };
        let (s, d) = c.sides(|_| true).unwrap();
        assert_eq!(s.at, 0x10_0000 + 2 * 5120 + 512 + 8);
        assert_eq!(s.row(5, 4), s.at + 5120 + 512, "row 1 of slice 1");
        assert_eq!(s.span(64, 4, 3), Some(2 * 5120 + 3 * 512 + 64));
        assert!(d.contiguous(64, 4) && !s.contiguous(64, 4));
        let mut short = c;
        short.src_height = 3;
        assert_eq!(
            short.sides(|_| true).unwrap_err(),
            Refused::Invalid,
            "slices overlap"
        );
        short = c;
        short.dst_lod = 1;
        assert_eq!(short.sides(|_| true).unwrap_err(), Refused::Invalid);
    }

    #[test]
    fn arrays_bad_types_and_short_pitches_are_refused() {
        let mut c = copy();
        c.src_memory_type = ARRAY;
        assert_eq!(c.sides(|_| true), Err(Refused::Array));
        c.src_memory_type = 9;
        assert_eq!(c.sides(|_| true), Err(Refused::Invalid));
        let mut c = copy();
        c.src_pitch = 10;
        assert_eq!(c.sides(|_| true), Err(Refused::Invalid));
        c.height = 1;
        assert!(c.sides(|_| true).is_ok(), "one row needs no pitch");
    }
}
