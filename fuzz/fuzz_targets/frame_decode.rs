//! Frame decoding as the daemon does it: header, then spans checked against a
//! window, then payload reads of every kind. Nothing may panic.
#![no_main]

use hira_protocol::frame::{self, HEADER_LEN, SPAN_LEN};
use hira_protocol::{FrameHeader, Reader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN + 8 {
        return;
    }
    let window = u64::from_le_bytes(data[..8].try_into().unwrap()) % (1 << 32);
    let data = &data[8..];
    let hb: [u8; HEADER_LEN] = data[..HEADER_LEN].try_into().unwrap();
    let Ok(h) = FrameHeader::decode(&hb) else { return };
    assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
    let body = &data[HEADER_LEN..];
    let span_bytes = h.span_count as usize * SPAN_LEN;
    if body.len() < span_bytes {
        return;
    }
    if let Ok(spans) = frame::decode_spans(&body[..span_bytes], h.span_count as usize, window) {
        for s in spans {
            assert!(s.offset + s.len <= window);
        }
    }
    // Drive the payload reader through every primitive until it runs out.
    let mut r = Reader::new(&body[span_bytes..]);
    let mut step = 0u8;
    loop {
        step = step.wrapping_add(1);
        let ok = match step % 8 {
            0 => r.u8().is_ok(),
            1 => r.u32().is_ok(),
            2 => r.u64().is_ok(),
            3 => r.bytes(1 << 20).is_ok(),
            4 => r.string().is_ok(),
            5 => r.flag().is_ok(),
            6 => r.count(65536).is_ok(),
            _ => r.usize().is_ok(),
        };
        if !ok || r.remaining() == 0 {
            break;
        }
    }
    let _ = r.finish();
});
