//! The API server's end of a submission ring whose whole region a hostile guest has
//! written: any header (indices, sleeping flags) and any bytes. Reading frames from it
//! must end in a frame, an error or the end of the session; never a panic, a read
//! outside the region, or more bytes than the ring holds.
#![no_main]

use std::io::{BufReader, Read};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use hira_protocol::frame::HEADER_LEN;
use hira_ring::{self, Region};
use hira_protocol::FrameHeader;
use libfuzzer_sys::fuzz_target;

const CAPACITY: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let (region, fd) = Region::create(CAPACITY).unwrap();
    let len = hira_ring::region_len(CAPACITY);
    // The session is already over (the daemon's end closed), so nothing waits.
    let (live, daemon) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(daemon);
    // The API server's end exists before the guest writes anything, as in a session.
    let ends = hira_ring::server_ends(Arc::new(region), hira_ring::eventfds().unwrap(), live.as_raw_fd())
        .unwrap();
    // The guest's view: the fuzzer's bytes over the whole region.
    // SAFETY: maps the region's memfd, shared, and unmaps it before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let n = data.len().min(len);
        std::ptr::copy_nonoverlapping(data.as_ptr(), p.cast::<u8>(), n);
        libc::munmap(p, len);
    }
    let mut r = BufReader::new(ends.consumer);
    let mut total = 0usize;
    loop {
        let mut hb = [0u8; HEADER_LEN];
        if r.read_exact(&mut hb).is_err() {
            break;
        }
        total += HEADER_LEN;
        let Ok(h) = FrameHeader::decode(&hb) else { break };
        let mut body = vec![0u8; (h.len as usize).min(1 << 20)];
        if r.read_exact(&mut body).is_err() {
            break;
        }
        total += body.len();
        assert!(total <= CAPACITY, "read {total} bytes from a {CAPACITY}-byte ring");
    }
});
