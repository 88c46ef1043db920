//! Sequences of guest vsock packets through one VM's connection multiplexer: nothing
//! may panic, the connection limit holds, and no reply ever goes to another CID.
#![no_main]

use hira_vhost::vsock::header::{HDR_LEN, Header};
use hira_vhost::vsock::mux::{Action, Mux};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    const CID: u64 = 3;
    const MAX: usize = 4;
    let mut mux = Mux::new(CID, MAX);
    for chunk in data.chunks(HDR_LEN) {
        let Ok(h) = Header::decode(chunk) else { continue };
        for action in mux.on_packet(&h) {
            match action {
                Action::Reply(r) => assert_eq!(r.dst_cid, CID, "replies go to the VM only"),
                Action::Deliver(port, n) => {
                    if let Some(c) = mux.conn(port) {
                        let _ = c.consumed(n);
                        let _ = c.send(n);
                    }
                }
                _ => {}
            }
        }
        assert!(mux.len() <= MAX);
    }
});
