//! The data plane: a guest and its API server exchange frames through two byte rings
//! in one shared memory region, with no daemon in between.
//!
//! Host-local, the API server creates the region (a sealed memfd) and four eventfds
//! and hands them to the guest with its `Welcome`; the daemon only passes them on. In
//! a VM the region is the end of the session's slot of the VM's shared window, and
//! the sides wake each other with `DOORBELL` frames on the session's connection
//! (`server_ends_vm`, `guest_ends_vm`). Each ring is
//! single-producer, single-consumer, and carries the same frames a socket would: the
//! guest's requests in the submission ring, replies and notifications in the
//! completion ring.
//!
//! Layout (all offsets in bytes, counters little-endian `u64`/`u32`, shared):
//!
//! | offset              | what                                    |
//! |---------------------|-----------------------------------------|
//! | 0                   | submission ring header                  |
//! | 2048                | completion ring header                  |
//! | 4096                | submission ring data (`capacity` bytes) |
//! | 4096 + `capacity`   | completion ring data (`capacity` bytes) |
//!
//! A ring header holds, each on its own cache line: `head` (bytes ever produced,
//! written by the producer), `tail` (bytes ever consumed, written by the consumer),
//! `consumer_sleeping` and `producer_sleeping` (set by a side before it sleeps on its
//! eventfd, so that the other side knows to ring it).
//!
//!
//!
//! Everything in the region is writable by the peer, so neither side trusts what it
//! reads there: each side keeps its own position privately and only reads the
//! peer's; an index that moves backwards or past the capacity ends the session
//! ([`std::io::ErrorKind::InvalidData`]). Bytes are copied out once, then decoded and
//! checked as a socket's would be. A peer that stops updating its index can only
//!
//! This module holds the layout and the region; the ends that produce into and consume
//! from the rings, and how they wait and wake each other, are in the `hira-ring` crate.

use std::io::{Error, ErrorKind};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Bytes before the rings' data: the two ring headers.
pub const HEADER_BYTES: usize = 4096;
/// Offset of the completion ring's header.
const SECOND_HEADER: usize = 2048;
/// Offsets of the fields within a ring header.
const HEAD: usize = 0;
const TAIL: usize = 64;
const CONSUMER_SLEEPING: usize = 128;
const PRODUCER_SLEEPING: usize = 192;
/// Set by the consumer while it waits for data (spinning, yielding or asleep).
const CONSUMER_WAITING: usize = 256;
/// Default capacity of each ring.
pub const DEFAULT_CAPACITY: usize = 1024 * 1024;
/// Largest capacity either side accepts.
pub const MAX_CAPACITY: usize = 64 * 1024 * 1024;

/// The number of eventfds that travel with a region, in this order: submission data
/// (the API server sleeps on it), submission space (the guest), completion data (the
/// guest), completion space (the API server).
pub const EVENTFDS: usize = 4;

/// Bytes a region with rings of `capacity` bytes takes.
pub fn region_len(capacity: usize) -> usize {
    HEADER_BYTES + 2 * capacity
}

/// Whether `capacity` is a capacity both sides accept: a whole number of pages, at
/// least one, at most [`MAX_CAPACITY`].
pub fn valid_capacity(capacity: usize) -> bool {
    (4096..=MAX_CAPACITY).contains(&capacity) && capacity.is_multiple_of(4096)
}

/// One side's mapping of a region.
#[derive(Debug)]
pub struct Region {
    map: crate::shm::Mapping,
    capacity: usize,
}

impl Region {
    /// Creates a region in a fresh memfd, sealed so that neither side can resize it,
    /// and maps it. Returns the mapping and the descriptor to pass to the peer.
    pub fn create(capacity: usize) -> std::io::Result<(Region, OwnedFd)> {
        if !valid_capacity(capacity) {
            return Err(Error::new(ErrorKind::InvalidInput, "bad ring capacity"));
        }
        let len = region_len(capacity);
        let fd = crate::shm::memfd(c"hira-rings", len as u64, crate::shm::FIXED)?;
        let region = Self::map(&fd, capacity)?;
        Ok((region, fd))
    }

    /// Maps a region the peer created. The descriptor must hold at least
    /// [`region_len`]`(capacity)` bytes and be sealed against shrinking, so that no
    /// access to the mapping can fault.
    pub fn map(fd: &OwnedFd, capacity: usize) -> std::io::Result<Region> {
        Self::map_at(fd, 0, capacity, true)
    }

    /// Maps a region at `offset` (page-aligned) of `fd`: a VM's shared window, whose
    /// file the daemon created (and no guest can resize; `sealed` false), or its
    /// ivshmem BAR inside the guest.
    pub fn map_at(
        fd: &OwnedFd,
        offset: u64,
        capacity: usize,
        sealed: bool,
    ) -> std::io::Result<Region> {
        if !valid_capacity(capacity) || !offset.is_multiple_of(4096) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "bad ring capacity or offset",
            ));
        }
        let len = region_len(capacity);
        let info = crate::shm::inspect(fd)?;
        let fits = offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= info.size);
        if !fits || (sealed && !info.sealed_against_shrinking()) {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "ring region too small or not sealed against shrinking",
            ));
        }
        Ok(Region {
            map: crate::shm::Mapping::map(fd, offset, len)?,
            capacity,
        })
    }

    /// Capacity of each ring.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets both rings to empty, for a region reused from an earlier session (a VM
    /// window slot). Only before either side uses it.
    pub fn reset(&self) {
        for which in [Which::Submission, Which::Completion] {
            for off in [HEAD, TAIL] {
                self.u64_at(which.header() + off)
                    .store(0, Ordering::Release);
            }
            for off in [CONSUMER_SLEEPING, PRODUCER_SLEEPING, CONSUMER_WAITING] {
                self.u32_at(which.header() + off)
                    .store(0, Ordering::Release);
            }
        }
    }

    /// Bytes ever produced into ring `which` (written by its producer).
    pub fn head(&self, which: Which) -> &AtomicU64 {
        self.u64_at(which.header() + HEAD)
    }

    /// Bytes ever consumed from ring `which` (written by its consumer).
    pub fn tail(&self, which: Which) -> &AtomicU64 {
        self.u64_at(which.header() + TAIL)
    }

    /// Set by the consumer of ring `which` before it sleeps.
    pub fn consumer_sleeping(&self, which: Which) -> &AtomicU32 {
        self.u32_at(which.header() + CONSUMER_SLEEPING)
    }

    /// Set by the producer of ring `which` before it sleeps.
    pub fn producer_sleeping(&self, which: Which) -> &AtomicU32 {
        self.u32_at(which.header() + PRODUCER_SLEEPING)
    }

    /// Set by the consumer of ring `which` while it waits (spinning, yielding or
    /// asleep).
    pub fn consumer_waiting(&self, which: Which) -> &AtomicU32 {
        self.u32_at(which.header() + CONSUMER_WAITING)
    }

    /// The first of ring `which`'s [`Region::capacity`] data bytes. Shared with the
    /// peer: access it only by raw copies.
    pub fn data(&self, which: Which) -> *mut u8 {
        // SAFETY: the ring's data lies inside the mapping (see `region_len`).
        unsafe { self.map.as_ptr().add(which.data(self.capacity)) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= HEADER_BYTES && off.is_multiple_of(8));
        // SAFETY: `off` is an aligned offset inside the header page of the mapping,
        // which lives as long as `self`; shared memory is only accessed atomically here.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= HEADER_BYTES && off.is_multiple_of(4));
        // SAFETY: as for `u64_at`.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }
}

/// Which ring of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// Guest to API server.
    Submission,
    /// API server to guest.
    Completion,
}

impl Which {
    fn header(self) -> usize {
        match self {
            Which::Submission => 0,
            Which::Completion => SECOND_HEADER,
        }
    }

    fn data(self, capacity: usize) -> usize {
        match self {
            Which::Submission => HEADER_BYTES,
            Which::Completion => HEADER_BYTES + capacity,
        }
    }
}

/// Whether a frame header is a migration's capture request from the daemon (see
/// `handshake::migrate`).
pub fn is_control(b: &[u8; crate::frame::HEADER_LEN]) -> bool {
    crate::frame::FrameHeader::decode(b).is_ok_and(|h| {
        h.kind == crate::frame::FrameKind::Notify && h.opcode == crate::handshake::migrate::CAPTURE
    })
}

/// Whether a frame header is a doorbell.
pub fn is_doorbell(b: &[u8; crate::frame::HEADER_LEN]) -> bool {
    crate::frame::FrameHeader::decode(b).is_ok_and(|h| {
        h.kind == crate::frame::FrameKind::Notify
            && h.opcode == crate::handshake::DOORBELL
            && h.len == 0
    })
}

/// A doorbell frame.
pub fn doorbell_frame() -> [u8; crate::frame::HEADER_LEN] {
    crate::frame::FrameHeader::new(
        crate::frame::FrameKind::Notify,
        crate::handshake::DOORBELL,
        0,
        0,
        0,
    )
    .encode()
}
