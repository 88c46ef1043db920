//! Reading a reply: the call's status, then its outputs, copied where the
//! application wants them now or when the host completes the command.

use std::ffi::c_void;

use hira_apis_opencl::Kind;
use hira_apis_opencl::sizes::RectLayout;
use hira_guest_driver::WindowRegion;
use log::warn;
use opencl_sys::cl_int;

use super::{OutSlot, fetch};
use crate::rt::{self, CL_INVALID_VALUE};

/// Reads a reply payload; any inconsistency is `CL_INVALID_VALUE`.
pub use hira_guest_driver::reply::ReplyReader;

/// A decoded reply: the call's status, then its outputs.
pub struct Reply {
    pub status: cl_int,
    pub r: ReplyReader,
    pub(super) regions: Vec<WindowRegion<'static>>,
    pub(super) defer: Option<u64>,
}

/// Where a deferred output goes in application memory.
#[derive(Clone, Copy)]
enum Dest {
    Bytes(usize),
    Rect(usize, RectLayout),
}

impl Reply {
    /// Registers the copy of a deferred output into application memory, run when the
    /// host reports the command complete. The window regions stay reserved until then.
    fn defer_out(&mut self, token: u64, slot: &OutSlot, dest: Dest) -> Result<(), cl_int> {
        let slot_len = match *slot {
            OutSlot::Null => return Ok(()),
            // The host completed a staged read before replying.
            OutSlot::Staged(..) => {
                self.defer = None;
                return match dest {
                    // SAFETY: the application passed memory valid for the output.
                    Dest::Bytes(p) => unsafe { self.bytes_out(slot, p as *mut u8) },
                    // SAFETY: as above, for the rectangle's extent.
                    Dest::Rect(p, layout) => unsafe {
                        self.unpack_out(slot, p as *mut u8, &layout)
                    },
                };
            }
            OutSlot::Inline(len) | OutSlot::Window(_, len) => len,
            // Never deferred: only blocking calls place outputs (`Call::place`).
            OutSlot::InPlace(_) => return Err(CL_INVALID_VALUE),
        };
        let window = match *slot {
            OutSlot::Window(i, _) => Some(i),
            _ => None,
        };
        let regions = std::mem::take(&mut self.regions);
        let conn = rt::conn()?;
        let deliver = move |status: cl_int, data: Option<&[u8]>| {
            if status != 0 {
                return;
            }
            let src: &[u8] = match (window, data) {
                // SAFETY: the region holds `slot_len` bytes the host wrote before
                // it reported the command complete, and stays reserved until here.
                (Some(i), _) => unsafe { std::slice::from_raw_parts(regions[i].ptr(), slot_len) },
                (None, Some(d)) if d.len() == slot_len => d,
                _ => {
                    warn!("deferred output of the wrong size");
                    return;
                }
            };
            match dest {
                // SAFETY: the application passed memory valid for the output's
                // length and may not touch it until the read completes.
                Dest::Bytes(p) => unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), p as *mut u8, slot_len)
                },
                Dest::Rect(p, layout) => {
                    let Some(extent) = layout.extent() else {
                        return;
                    };
                    // SAFETY: as above, for the rectangle's extent.
                    let dst = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, extent) };
                    layout.unpack(src, dst);
                }
            }
            drop(regions);
        };
        let progress = crate::stream::take_progress();
        conn.on_output(
            token,
            Box::new(move |status, data| {
                deliver(status, data);
                if let Some(p) = progress {
                    p.done(status);
                }
            }),
        );
        Ok(())
    }

    fn take_out(&mut self, slot: &OutSlot) -> Result<Option<Vec<u8>>, cl_int> {
        match *slot {
            OutSlot::Null | OutSlot::InPlace(_) => Ok(None),
            OutSlot::Staged(token, len) => {
                let mut v = vec![0u8; len];
                fetch(token, &mut v)?;
                Ok(Some(v))
            }
            OutSlot::Inline(len) => {
                let b = self.r.bytes()?.to_vec();
                if b.len() != len {
                    warn!("reply carries {} bytes, expected {len}", b.len());
                    return Err(CL_INVALID_VALUE);
                }
                Ok(Some(b))
            }
            OutSlot::Window(i, len) => {
                let mut v = vec![0u8; len];
                // SAFETY: the region holds `len` bytes the host wrote before replying.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.regions[i].ptr(), v.as_mut_ptr(), len)
                };
                Ok(Some(v))
            }
        }
    }

    /// Copies an output into application memory.
    ///
    /// # Safety
    /// `ptr` must be valid for the slot's length in writes.
    pub unsafe fn bytes_out(&mut self, slot: &OutSlot, ptr: *mut u8) -> Result<(), cl_int> {
        if let Some(token) = self.defer {
            return self.defer_out(token, slot, Dest::Bytes(ptr as usize));
        }
        if let OutSlot::Window(i, len) = *slot {
            // SAFETY: the region holds `len` bytes; `ptr` is valid for `len` writes.
            unsafe { std::ptr::copy_nonoverlapping(self.regions[i].ptr(), ptr, len) };
            return Ok(());
        }
        if let OutSlot::Staged(token, len) = *slot {
            // SAFETY: `ptr` is valid for the slot's length in writes.
            return fetch(token, unsafe { std::slice::from_raw_parts_mut(ptr, len) });
        }
        if let Some(b) = self.take_out(slot)? {
            // SAFETY: `ptr` is valid for the slot's length, which `b` has.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), ptr, b.len()) };
        }
        Ok(())
    }

    /// Scatters a packed rectangle output into application memory.
    ///
    /// # Safety
    /// `ptr` must be valid for `layout.extent()` writes.
    pub unsafe fn unpack_out(
        &mut self,
        slot: &OutSlot,
        ptr: *mut u8,
        layout: &RectLayout,
    ) -> Result<(), cl_int> {
        if let Some(token) = self.defer {
            return self.defer_out(token, slot, Dest::Rect(ptr as usize, *layout));
        }
        if let OutSlot::Window(i, len) = *slot {
            if layout.packed_len() != Some(len) {
                return Err(CL_INVALID_VALUE);
            }
            // Row by row straight out of the window, as `Call::packed_in` writes.
            let src = self.regions[i].ptr();
            for (k, at) in layout.rows().enumerate() {
                // SAFETY: row `k` of the packed output lies within the region's `len`
                // bytes, which the host wrote before replying; each row of `ptr` lies
                // within `layout.extent()`, valid for writes per the contract.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.add(k * layout.row_bytes),
                        ptr.add(at),
                        layout.row_bytes,
                    )
                };
            }
            return Ok(());
        }
        if let Some(b) = self.take_out(slot)? {
            let extent = layout.extent().ok_or(CL_INVALID_VALUE)?;
            // SAFETY: valid for `extent` writes per the contract.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr, extent) };
            layout.unpack(&b, dst);
        }
        Ok(())
    }

    /// Objects returned by the host, written into the application's array of `n`.
    ///
    /// # Safety
    /// `ptr` must be valid for `n` writes.
    pub unsafe fn handles_out(
        &mut self,
        kind: Kind,
        ptr: *mut *mut c_void,
        n: usize,
    ) -> Result<(), cl_int> {
        let count = self.r.u32()? as usize;
        if count > n {
            return Err(CL_INVALID_VALUE);
        }
        for i in 0..count {
            let id = self.r.u64()?;
            // SAFETY: i < count <= n.
            unsafe { *ptr.add(i) = rt::adopt(kind, id) };
        }
        Ok(())
    }

    /// Checks the whole reply was consumed.
    pub fn finish(&self) -> Result<(), cl_int> {
        self.r.finish()
    }
}
