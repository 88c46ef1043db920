//! Size computations that the guest and the API server must agree on.
//!
//! The guest uses them to know how many bytes to send; the API server recomputes them
//! from the decoded arguments and checks the bytes it received before it lets the host
//! library touch them. All arithmetic is checked: `None` means the guest's numbers
//! overflow and the call is rejected.

/// Bytes per pixel of an image format, or `None` for an unknown order or type.
pub fn image_element_size(channel_order: u32, channel_type: u32) -> Option<usize> {
    let packed = match channel_type {
        0x10D4 | 0x10D5 => Some(2),          // UNORM_SHORT_565, UNORM_SHORT_555
        0x10D6 | 0x10DF | 0x10E0 => Some(4), // UNORM_INT_101010, UNORM_INT24, _101010_2
        _ => None,
    };
    if packed.is_some() {
        return packed;
    }
    let per_channel = match channel_type {
        0x10D0 | 0x10D2 | 0x10D7 | 0x10DA => 1,
        0x10D1 | 0x10D3 | 0x10D8 | 0x10DB | 0x10DD => 2,
        0x10D9 | 0x10DC | 0x10DE => 4,
        _ => return None,
    };
    let channels = match channel_order {
        0x10B0 | 0x10B1 | 0x10B8 | 0x10B9 | 0x10BA | 0x10BD | 0x10BE => 1,
        0x10B2 | 0x10B3 | 0x10BB => 2,
        0x10B4 | 0x10BC | 0x10BF => 3,
        0x10B5 | 0x10B6 | 0x10B7 | 0x10C0 | 0x10C1 | 0x10C2 | 0x10C3 => 4,
        _ => return None,
    };
    Some(per_channel * channels)
}

/// Image object types.
pub mod image_type {
    pub const IMAGE2D: u32 = 0x10F1;
    pub const IMAGE3D: u32 = 0x10F2;
    pub const IMAGE2D_ARRAY: u32 = 0x10F3;
    pub const IMAGE1D: u32 = 0x10F4;
    pub const IMAGE1D_ARRAY: u32 = 0x10F5;
    pub const IMAGE1D_BUFFER: u32 = 0x10F6;
}

/// The geometry of an image as `clCreateImage` describes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImageGeometry {
    pub image_type: u32,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub array_size: usize,
    pub row_pitch: usize,
    pub slice_pitch: usize,
}

/// Bytes of host memory an image creation reads from `host_ptr`.
pub fn image_host_bytes(elem: usize, g: &ImageGeometry) -> Option<usize> {
    use image_type::*;
    let row = if g.row_pitch != 0 {
        g.row_pitch
    } else {
        g.width.checked_mul(elem)?
    };
    let slice = |rows_per_slice: usize| {
        if g.slice_pitch != 0 {
            Some(g.slice_pitch)
        } else {
            row.checked_mul(rows_per_slice)
        }
    };
    match g.image_type {
        IMAGE1D | IMAGE1D_BUFFER => Some(row),
        IMAGE2D => row.checked_mul(g.height),
        IMAGE3D => slice(g.height)?.checked_mul(g.depth),
        IMAGE1D_ARRAY => slice(1)?.checked_mul(g.array_size),
        IMAGE2D_ARRAY => slice(g.height)?.checked_mul(g.array_size),
        _ => None,
    }
}

/// A rectangle of host memory: `slices` slices of `rows` rows of `row_bytes` bytes,
/// starting `offset` bytes from the base pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RectLayout {
    pub offset: usize,
    pub row_bytes: usize,
    pub rows: usize,
    pub slices: usize,
    pub row_pitch: usize,
    pub slice_pitch: usize,
}

impl RectLayout {
    /// Builds the layout of a buffer-rect host region as `clEnqueue*BufferRect` defines
    /// it: `origin` in bytes/rows/slices, pitches of 0 mean tightly packed.
    pub fn buffer(
        origin: [usize; 3],
        region: [usize; 3],
        row_pitch: usize,
        slice_pitch: usize,
    ) -> Option<Self> {
        let row_pitch = if row_pitch == 0 { region[0] } else { row_pitch };
        let slice_pitch = if slice_pitch == 0 {
            region[1].checked_mul(row_pitch)?
        } else {
            slice_pitch
        };
        let offset = origin[2]
            .checked_mul(slice_pitch)?
            .checked_add(origin[1].checked_mul(row_pitch)?)?
            .checked_add(origin[0])?;
        Self::checked(RectLayout {
            offset,
            row_bytes: region[0],
            rows: region[1],
            slices: region[2],
            row_pitch,
            slice_pitch,
        })
    }

    /// Builds the layout of the host side of an image read or write: `region` in
    /// pixels of `elem` bytes, pitches of 0 mean tightly packed.
    pub fn image(
        elem: usize,
        region: [usize; 3],
        row_pitch: usize,
        slice_pitch: usize,
    ) -> Option<Self> {
        let row_bytes = region[0].checked_mul(elem)?;
        let row_pitch = if row_pitch == 0 { row_bytes } else { row_pitch };
        let slice_pitch = if slice_pitch == 0 {
            row_pitch.checked_mul(region[1])?
        } else {
            slice_pitch
        };
        Self::checked(RectLayout {
            offset: 0,
            row_bytes,
            rows: region[1],
            slices: region[2],
            row_pitch,
            slice_pitch,
        })
    }

    fn checked(l: RectLayout) -> Option<Self> {
        if l.row_pitch < l.row_bytes {
            return None;
        }
        l.extent()?;
        l.packed_len()?;
        Some(l)
    }

    /// Bytes of the region when packed tightly.
    pub fn packed_len(&self) -> Option<usize> {
        self.row_bytes
            .checked_mul(self.rows)?
            .checked_mul(self.slices)
    }

    /// Whether the region's rows follow each other with no gap, slice after slice: its
    /// bytes from `offset` on are already packed.
    pub fn is_tight(&self) -> bool {
        (self.rows <= 1 || self.row_pitch == self.row_bytes)
            && (self.slices <= 1 || self.slice_pitch == self.row_bytes * self.rows)
    }

    /// One past the last byte the region touches, from the base pointer.
    pub fn extent(&self) -> Option<usize> {
        if self.packed_len()? == 0 {
            return Some(self.offset);
        }
        let last_slice = (self.slices - 1).checked_mul(self.slice_pitch)?;
        let last_row = (self.rows - 1).checked_mul(self.row_pitch)?;
        self.offset
            .checked_add(last_slice)?
            .checked_add(last_row)?
            .checked_add(self.row_bytes)
    }

    /// Offsets from the base pointer of each row, in packed order.
    pub fn rows(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.slices).flat_map(move |z| {
            (0..self.rows).map(move |y| self.offset + z * self.slice_pitch + y * self.row_pitch)
        })
    }

    /// Copies the region out of `src` (which must cover `extent()`) into a packed vector.
    pub fn pack(&self, src: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.packed_len().unwrap_or(0));
        for at in self.rows() {
            out.extend_from_slice(&src[at..at + self.row_bytes]);
        }
        out
    }

    /// Copies packed bytes into the region of `dst` (which must cover `extent()`),
    /// leaving bytes between rows untouched.
    pub fn unpack(&self, packed: &[u8], dst: &mut [u8]) {
        for (i, at) in self.rows().enumerate() {
            let from = i * self.row_bytes;
            dst[at..at + self.row_bytes].copy_from_slice(&packed[from..from + self.row_bytes]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rgba_float_is_sixteen_bytes() {
        assert_eq!(image_element_size(0x10B5, 0x10DE), Some(16));
    }

    #[test]
    fn packed_565_ignores_channel_count() {
        assert_eq!(image_element_size(0x10B4, 0x10D4), Some(2));
    }

    #[test]
    fn unknown_channel_type_has_no_size() {
        assert_eq!(image_element_size(0x10B5, 0x1), None);
    }

    #[test]
    fn image2d_host_bytes_use_row_pitch() {
        let g = ImageGeometry {
            image_type: image_type::IMAGE2D,
            width: 4,
            height: 3,
            row_pitch: 64,
            ..Default::default()
        };
        assert_eq!(image_host_bytes(4, &g), Some(192));
    }

    #[test]
    fn overflowing_image_is_rejected() {
        let g = ImageGeometry {
            image_type: image_type::IMAGE3D,
            width: usize::MAX / 2,
            height: 4,
            depth: 4,
            ..Default::default()
        };
        assert_eq!(image_host_bytes(4, &g), None);
    }

    #[test]
    fn buffer_rect_extent_counts_origin_and_pitches() {
        let l = RectLayout::buffer([2, 1, 0], [4, 2, 1], 10, 0).unwrap();
        assert_eq!(l.offset, 12);
        assert_eq!(l.extent(), Some(12 + 10 + 4));
        assert_eq!(l.packed_len(), Some(8));
    }

    #[test]
    fn pitch_smaller_than_row_is_rejected() {
        assert_eq!(RectLayout::buffer([0, 0, 0], [8, 2, 1], 4, 0), None);
    }

    #[test]
    fn overflowing_rect_origin_is_rejected() {
        assert_eq!(
            RectLayout::buffer([0, 0, usize::MAX], [1, 1, 1], 1, 1),
            None
        );
    }

    #[test]
    fn pack_then_unpack_leaves_gaps_untouched() {
        let l = RectLayout::buffer([1, 0, 0], [2, 2, 1], 4, 0).unwrap();
        let src: Vec<u8> = (0..8).collect();
        let packed = l.pack(&src);
        assert_eq!(packed, vec![1, 2, 5, 6]);
        let mut dst = vec![0xAA; 8];
        l.unpack(&packed, &mut dst);
        assert_eq!(dst, vec![0xAA, 1, 2, 0xAA, 0xAA, 5, 6, 0xAA]);
    }
}
