//! Hostile guests: malformed frames, forged ids and bad spans get an error reply or a
//! closed connection, and the daemon keeps serving everyone else.

use std::io::Write;
use std::time::Duration;

use hira_apis_opencl::op;
use hira_protocol::frame::{FLAG_NO_REPLY, MAX_FRAME_BODY};
use hira_protocol::handshake::{ErrorPayload, Hello, error_code};
use hira_protocol::{FrameHeader, FrameKind, Span, Writer};

use crate::support::{Daemon, RawGuest, Vendors, c_program, run_with_timeout, status};

/// Runs a hostile-guest test twice: with frames on the guest's socket, relayed and
/// checked by the daemon, and on the shared-memory rings, checked by the API server.
macro_rules! on_both_planes {
    ($($name:ident),* $(,)?) => {
        $(mod $name {
            #[test]
            fn relayed() {
                super::$name(false)
            }

            #[test]
            fn rings() {
                super::$name(true)
            }
        })*
    };
}

on_both_planes!(
    unknown_opcode_gets_an_error_and_the_session_continues,
    truncated_payload_gets_an_error_and_the_session_continues,
    forged_stale_and_reused_ids_are_rejected,
    span_outside_the_data_window_is_rejected,
    asynchronous_flag_on_a_synchronous_call_is_dropped,
    oversized_length_closes_the_connection_and_its_api_server,
    frame_cut_short_by_a_disconnect_leaves_nothing_behind,
    guest_frames_other_than_requests_are_rejected,
    streamed_contents_from_a_forged_request_are_checked,
    a_read_sent_without_a_reply_fails_through_its_token,
);

const CL_INVALID_CONTEXT: i32 = -34;
const CL_INVALID_COMMAND_QUEUE: i32 = -36;

/// A well-behaved guest still gets correct results from the same daemon.
fn still_serves(daemon: &mut Daemon) {
    assert!(daemon.alive(), "the daemon survived");
    let out = run_with_timeout(
        &mut daemon.guest(&Vendors::hira(), "vm1", &c_program("vecadd")),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "a good guest is still served: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("mismatches=0"));
}

fn error_code_of(p: &[u8]) -> u32 {
    ErrorPayload::decode(p).expect("error payload decodes").code
}

/// The platform and device ids of a raw session.
fn platform_and_device(g: &mut RawGuest) -> (u64, u64) {
    let mut w = Writer::new();
    w.u32(1).u8(1).u8(1);
    let (h, p) = g.call(op::clGetPlatformIDs, w.as_slice());
    assert_eq!(h.kind, FrameKind::Reply);
    assert_eq!(status(&p), 0);
    let platform = u64::from_le_bytes(p[8..16].try_into().unwrap());
    let mut w = Writer::new();
    w.u64(platform).u64(0xFFFF_FFFF).u32(1).u8(1).u8(1);
    let (_, p) = g.call(op::clGetDeviceIDs, w.as_slice());
    assert_eq!(status(&p), 0);
    (platform, u64::from_le_bytes(p[8..16].try_into().unwrap()))
}

fn create_context(g: &mut RawGuest, id: u64, device: u64) -> (FrameHeader, Vec<u8>) {
    let mut w = Writer::new();
    w.u64(id).u8(0).u32(1).u8(1).u32(1).u64(device).u64(0);
    g.call(op::clCreateContext, w.as_slice())
}

#[test]
fn garbage_instead_of_a_hello_is_refused() {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::connect(&daemon.socket("vm1"));
    g.s.write_all(&[0xAB; 64]).unwrap();
    let codes = g.drain_until_closed();
    assert_eq!(codes, vec![error_code::HANDSHAKE]);
    still_serves(&mut daemon);
}

#[test]
fn wrong_protocol_version_is_refused_with_a_reason() {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::connect(&daemon.socket("vm1"));
    let mut hello = Hello::new(hira_apis_opencl::API, 1, "old-guest", 0);
    hello.version = 99;
    g.frame(FrameKind::Hello, 0, 0, 0, &[], &hello.encode());
    let (h, p) = g.recv().expect("an error frame");
    assert_eq!(h.kind, FrameKind::Error);
    let e = ErrorPayload::decode(&p).unwrap();
    assert!(e.message.contains("version 99"), "{}", e.message);
    assert!(g.recv().is_none(), "the connection is closed");
    assert!(
        daemon
            .wait_api_servers(0, Duration::from_secs(5))
            .is_empty(),
        "no API server for a refused guest"
    );
    still_serves(&mut daemon);
}

#[test]
fn an_api_no_description_names_is_refused_with_a_reason() {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::connect(&daemon.socket("vm1"));
    let hello = Hello::new(hira_protocol::handshake::ApiId(77), 1, "other-api", 0);
    g.frame(FrameKind::Hello, 0, 0, 0, &[], &hello.encode());
    let (h, p) = g.recv().expect("an error frame");
    assert_eq!(h.kind, FrameKind::Error);
    let e = ErrorPayload::decode(&p).unwrap();
    assert_eq!(e.code, error_code::HANDSHAKE);
    assert!(e.message.contains("API 77"), "{}", e.message);
    assert!(g.recv().is_none(), "the connection is closed");
    assert!(
        daemon
            .wait_api_servers(0, Duration::from_secs(5))
            .is_empty(),
        "no API server for a refused guest"
    );
    still_serves(&mut daemon);
}

fn unknown_opcode_gets_an_error_and_the_session_continues(rings: bool) {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let (h, p) = g.call(9999, &[]);
    assert_eq!(h.kind, FrameKind::Error);
    assert_eq!(error_code_of(&p), error_code::UNKNOWN_OPCODE);
    platform_and_device(&mut g);
    still_serves(&mut daemon);
}

fn truncated_payload_gets_an_error_and_the_session_continues(rings: bool) {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let (h, p) = g.call(op::clFinish, &[1, 2, 3]);
    assert_eq!(h.kind, FrameKind::Error);
    assert_eq!(error_code_of(&p), error_code::MALFORMED);
    let mut extra = Writer::new();
    extra.u64(0x1234).u8(7);
    let (h, p) = g.call(op::clFinish, extra.as_slice());
    assert_eq!(h.kind, FrameKind::Error, "trailing bytes are rejected too");
    assert_eq!(error_code_of(&p), error_code::MALFORMED);
    platform_and_device(&mut g);
    still_serves(&mut daemon);
}

fn forged_stale_and_reused_ids_are_rejected(rings: bool) {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let mut w = Writer::new();
    w.u64(0x1234);
    let (h, p) = g.call(op::clFinish, w.as_slice());
    assert_eq!(
        (h.kind, status(&p)),
        (FrameKind::Reply, CL_INVALID_COMMAND_QUEUE),
        "forged queue id"
    );
    let (_, device) = platform_and_device(&mut g);
    let (_, p) = create_context(&mut g, 7, device);
    assert_eq!(status(&p), 0);
    let (h, p) = create_context(&mut g, 7, device);
    assert_eq!(
        h.kind,
        FrameKind::Error,
        "an id in use cannot name a new object"
    );
    assert_eq!(error_code_of(&p), error_code::MALFORMED);
    let mut w = Writer::new();
    w.u64(7);
    let (_, p) = g.call(op::clReleaseContext, w.as_slice());
    assert_eq!(status(&p), 0);
    let mut w = Writer::new();
    w.u64(7).u32(0x1081);
    let (_, p) = g.call(op::clGetContextInfo, w.as_slice());
    assert_eq!(status(&p), CL_INVALID_CONTEXT, "stale context id");
    let mut w = Writer::new();
    w.u64(device).u32(0x1081);
    let (_, p) = g.call(op::clGetContextInfo, w.as_slice());
    assert_eq!(
        status(&p),
        CL_INVALID_CONTEXT,
        "a device id is not a context id"
    );
    still_serves(&mut daemon);
}

fn streamed_contents_from_a_forged_request_are_checked(rings: bool) {
    // A buffer made with `tag::STREAMED` contents, then `hiraFill` chunks naming
    // other objects, ids that name nothing, and ranges past the buffer's end: each
    // gets the host's own error; a valid chunk is written.
    use hira_apis_opencl::tag;
    const CL_INVALID_VALUE: i32 = -30;
    const CL_INVALID_MEM_OBJECT: i32 = -38;
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let (_, device) = platform_and_device(&mut g);
    let (_, p) = create_context(&mut g, 7, device);
    assert_eq!(status(&p), 0);
    let create = |g: &mut RawGuest, id: u64, streamed: u64| {
        let mut w = Writer::new();
        w.u64(id)
            .u64(7)
            .u64(1 << 5)
            .u64(4096)
            .u8(tag::STREAMED)
            .u64(streamed);
        status(&g.call(op::clCreateBuffer, w.as_slice()).1)
    };
    assert_eq!(create(&mut g, 8, 4096), 0);
    assert_eq!(
        create(&mut g, 9, 100),
        CL_INVALID_VALUE,
        "length is not the size"
    );
    let fill = |g: &mut RawGuest, mem: u64, offset: u64, data: &[u8]| {
        let mut w = Writer::new();
        w.u64(mem)
            .u64(offset)
            .u64(data.len() as u64)
            .u8(tag::INLINE)
            .bytes(data);
        w.u32(1).u64(0);
        status(&g.call(op::hiraFill, w.as_slice()).1)
    };
    assert_eq!(
        fill(&mut g, 8, 4000, &[1; 200]),
        CL_INVALID_VALUE,
        "past the end"
    );
    assert_eq!(fill(&mut g, 0x999, 0, &[1; 16]), CL_INVALID_MEM_OBJECT);
    assert_eq!(
        fill(&mut g, 7, 0, &[1; 16]),
        CL_INVALID_MEM_OBJECT,
        "a context"
    );
    assert_eq!(fill(&mut g, 8, 16, &[0xAB; 16]), 0);
    still_serves(&mut daemon);
}

fn a_read_sent_without_a_reply_fails_through_its_token(rings: bool) {
    // A non-blocking read sent without a reply (as a streamed read's chunks are)
    // names a queue that does not exist: the host's error comes back as its output's
    // token, once, and nothing is reported again at the next call.
    use hira_protocol::handshake::{OUTPUT_DONE, OutputDone};
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let (_, device) = platform_and_device(&mut g);
    let (_, p) = create_context(&mut g, 7, device);
    assert_eq!(status(&p), 0);
    let mut w = Writer::new();
    // queue, buffer, non-blocking with token 55, offset, size, output inline, no
    // wait list, no event.
    w.u64(0x999).u64(0x998).u32(0).u64(55).u64(0).u64(64).u8(0);
    w.u32(0).u8(0).u64(0);
    g.frame(
        FrameKind::Request,
        op::clEnqueueReadBuffer,
        FLAG_NO_REPLY,
        90,
        &[],
        w.as_slice(),
    );
    let (h, p) = g.recv().expect("the output's word");
    assert_eq!((h.kind, h.opcode), (FrameKind::Notify, OUTPUT_DONE));
    let done = OutputDone::decode(&p).unwrap();
    assert_eq!(
        (done.token, done.status, done.data),
        (55, CL_INVALID_COMMAND_QUEUE, None)
    );
    // The next call's reply is the next frame: no asynchronous failure follows.
    platform_and_device(&mut g);
    still_serves(&mut daemon);
}

fn span_outside_the_data_window_is_rejected(rings: bool) {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let mut w = Writer::new();
    w.u64(0x1234);
    let (h, p) = g.call_spans(
        op::clFinish,
        &[Span {
            offset: 1 << 20,
            len: 16,
        }],
        w.as_slice(),
    );
    assert_eq!(h.kind, FrameKind::Error);
    assert_eq!(error_code_of(&p), error_code::BAD_SPAN);
    let (h, p) = g.call_spans(
        op::clFinish,
        &[Span {
            offset: u64::MAX - 4,
            len: 16,
        }],
        w.as_slice(),
    );
    assert_eq!(
        (h.kind, error_code_of(&p)),
        (FrameKind::Error, error_code::BAD_SPAN),
        "wrapping span"
    );
    platform_and_device(&mut g);
    still_serves(&mut daemon);
}

fn asynchronous_flag_on_a_synchronous_call_is_dropped(rings: bool) {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let mut w = Writer::new();
    w.u64(0x1234);
    g.frame(
        FrameKind::Request,
        op::clFinish,
        FLAG_NO_REPLY,
        77,
        &[],
        w.as_slice(),
    );
    // The next call's reply is the next frame: nothing was sent for the dropped one.
    platform_and_device(&mut g);
    still_serves(&mut daemon);
}

fn oversized_length_closes_the_connection_and_its_api_server(rings: bool) {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    assert_eq!(daemon.wait_api_servers(1, Duration::from_secs(10)).len(), 1);
    let mut h = FrameHeader {
        len: 0,
        kind: FrameKind::Request,
        flags: 0,
        opcode: op::clFinish,
        channel: 1,
        span_count: 0,
        call_id: 1,
    }
    .encode();
    h[0..4].copy_from_slice(&(MAX_FRAME_BODY as u32 + 1).to_le_bytes());
    g.write_raw(&h);
    let codes = g.drain_until_closed();
    assert!(codes.contains(&error_code::MALFORMED), "{codes:?}");
    assert!(
        daemon
            .wait_api_servers(0, Duration::from_secs(15))
            .is_empty(),
        "the session's API server is gone"
    );
    still_serves(&mut daemon);
}

fn frame_cut_short_by_a_disconnect_leaves_nothing_behind(rings: bool) {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    let (_, device) = platform_and_device(&mut g);
    let (_, p) = create_context(&mut g, 3, device);
    assert_eq!(status(&p), 0);
    let h = FrameHeader {
        len: 100,
        kind: FrameKind::Request,
        flags: 0,
        opcode: op::clFinish,
        channel: 1,
        span_count: 0,
        call_id: 9,
    };
    g.write_raw(&h.encode());
    g.write_raw(&[0u8; 10]);
    drop(g);
    let ended = daemon.wait_idle(Duration::from_secs(30));
    let last = ended.last().expect("the session ended");
    assert_eq!(
        (last["released"].as_u64(), last["release_failures"].as_u64()),
        (Some(1), Some(0)),
        "the context the cut-off guest held was released: {last}"
    );
    still_serves(&mut daemon);
}

fn guest_frames_other_than_requests_are_rejected(rings: bool) {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session_on(&daemon.socket("vm1"), rings);
    g.frame(FrameKind::Reply, op::clFinish, 0, 5, &[], &[0; 4]);
    let (h, p) = g.recv().expect("an error frame");
    assert_eq!((h.kind, h.call_id), (FrameKind::Error, 5));
    assert_eq!(error_code_of(&p), error_code::MALFORMED);
    platform_and_device(&mut g);
    still_serves(&mut daemon);
}

#[test]
fn a_corrupt_ring_index_ends_that_session_and_no_other() {
    let mut daemon = Daemon::start(&["vm1"]);
    let mut bystander = RawGuest::session_on_rings(&daemon.socket("vm1"));
    platform_and_device(&mut bystander);
    let mut g = RawGuest::session_on_rings(&daemon.socket("vm1"));
    platform_and_device(&mut g);
    assert_eq!(daemon.wait_api_servers(2, Duration::from_secs(10)).len(), 2);
    // The submission ring's head (offset 0 of the region) jumps past its capacity.
    g.corrupt_region(0, u64::MAX / 2);
    let codes = g.drain_until_closed();
    assert!(codes.contains(&error_code::MALFORMED), "{codes:?}");
    assert_eq!(
        daemon.wait_api_servers(1, Duration::from_secs(15)).len(),
        1,
        "only the corrupt session's API server ended"
    );
    platform_and_device(&mut bystander);
    still_serves(&mut daemon);
}
