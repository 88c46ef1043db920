//! Handshake and error payload decoding. Nothing may panic; what decodes re-encodes
//! to something that decodes the same.
#![no_main]

use hira_protocol::handshake::{ErrorPayload, Hello, Welcome};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }
    if let Ok(w) = Welcome::decode(data) {
        assert_eq!(Welcome::decode(&w.encode()).unwrap(), w);
    }
    let _ = ErrorPayload::decode(data);
});
