//! `cuMemcpy2D`'s description of a copy (`CUDA_MEMCPY2D` of cuda.h 13.0) and the
//! memory types it names, shared by Hira's guest library (which splits such a copy
//! into the driver calls Hira remotes) and the CPU test executor.

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

/// One side of a 2D copy, resolved: where its first byte is, its pitch, and whether
/// it is device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Side {
    pub at: u64,
    pub pitch: usize,
    pub device: bool,
}

impl Side {
    /// The bytes from the first row's start to the last row's end.
    pub fn span(&self, width: usize, height: usize) -> Option<u64> {
        (height.checked_sub(1)?)
            .checked_mul(self.pitch)?
            .checked_add(width)
            .map(|n| n as u64)
    }

    /// Where row `r` starts.
    pub fn row(&self, r: usize) -> u64 {
        self.at + (r * self.pitch) as u64
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
    /// `CU_MEMORYTYPE_UNIFIED`.
    pub fn sides(&self, is_device: impl Fn(u64) -> bool) -> Result<(Side, Side), Refused> {
        let side = |ty: u32, host: u64, device: u64, x: usize, y: usize, pitch: usize| {
            let (base, dev) = match ty {
                HOST => (host, false),
                DEVICE => (device, true),
                UNIFIED => (device, is_device(device)),
                ARRAY => return Err(Refused::Array),
                _ => return Err(Refused::Invalid),
            };
            if base == 0 || (self.height > 1 && pitch < self.width_in_bytes) {
                return Err(Refused::Invalid);
            }
            let off = y
                .checked_mul(pitch)
                .and_then(|o| o.checked_add(x))
                .ok_or(Refused::Invalid)?;
            Ok(Side {
                at: base.checked_add(off as u64).ok_or(Refused::Invalid)?,
                pitch,
                device: dev,
            })
        };
        Ok((
            side(
                self.src_memory_type,
                self.src_host as u64,
                self.src_device,
                self.src_x_in_bytes,
                self.src_y,
                self.src_pitch,
            )?,
            side(
                self.dst_memory_type,
                self.dst_host as u64,
                self.dst_device,
                self.dst_x_in_bytes,
                self.dst_y,
                self.dst_pitch,
            )?,
        ))
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
        assert_eq!(
            s,
            Side {
                at: 0x1000 + 204,
                pitch: 100,
                device: false
            }
        );
        assert_eq!(
            d,
            Side {
                at: 0x7000 + 512,
                pitch: 512,
                device: true
            }
        );
        assert_eq!(d.span(64, 3), Some(2 * 512 + 64));
        assert_eq!(d.row(2), 0x7000 + 3 * 512);
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
