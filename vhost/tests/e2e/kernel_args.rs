//! Kernel arguments: no guest value reaches the host as a pointer. The shim refuses
//! what natively would be undefined behaviour, and the API server refuses the same
//! when a guest bypasses the shim and speaks the protocol directly.

use std::time::Duration;

use hira_apis_opencl::{Kind, op, tag};
use hira_protocol::{FrameKind, Writer};

use crate::support::{Daemon, RawGuest, Vendors, c_program, run_with_timeout, status};

const CL_INVALID_MEM_OBJECT: i32 = -38;
const CL_INVALID_ARG_VALUE: i32 = -50;
const CL_INVALID_ARG_SIZE: i32 = -51;

#[test]
fn object_arguments_that_are_not_live_objects_get_api_errors() {
    let daemon = Daemon::start(&["vm1"]);
    let out = run_with_timeout(
        &mut daemon.guest(&Vendors::hira(), "vm1", &c_program("hostile_args")),
        Duration::from_secs(120),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", daemon.log_text());
    for line in [
        "arbitrary bytes: -38",
        "released buffer: -38",
        "sampler as buffer: -38",
        "buffer as sampler: -41",
        "good buffer: 0",
        "launch: 0",
        "result_ok=1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
}

/// Ids 1.. of a raw session: context 1, program 2, kernel 3, buffer 4.
fn kernel_session(g: &mut RawGuest, source: &str) -> u64 {
    let mut w = Writer::new();
    w.u32(1).u8(1).u8(1);
    let (_, p) = g.call(op::clGetPlatformIDs, w.as_slice());
    let platform = u64::from_le_bytes(p[8..16].try_into().unwrap());
    let mut w = Writer::new();
    w.u64(platform).u64(0xFFFF_FFFF).u32(1).u8(1).u8(1);
    let (_, p) = g.call(op::clGetDeviceIDs, w.as_slice());
    let device = u64::from_le_bytes(p[8..16].try_into().unwrap());
    let mut w = Writer::new();
    w.u64(1).u8(0).u32(1).u8(1).u32(1).u64(device).u64(0);
    assert_eq!(status(&g.call(op::clCreateContext, w.as_slice()).1), 0);
    let mut w = Writer::new();
    w.u64(2).u64(1).u32(1).u8(1).u32(1).bytes(source.as_bytes());
    assert_eq!(
        status(&g.call(op::clCreateProgramWithSource, w.as_slice()).1),
        0
    );
    let mut w = Writer::new();
    w.u64(2).u32(1).u8(1).u32(1).u64(device).u8(0).u64(0);
    assert_eq!(status(&g.call(op::clBuildProgram, w.as_slice()).1), 0);
    let mut w = Writer::new();
    w.u64(3).u64(2).u8(1).bytes(b"k");
    assert_eq!(status(&g.call(op::clCreateKernel, w.as_slice()).1), 0);
    let mut w = Writer::new();
    w.u64(4).u64(1).u64(1).u64(64).u8(tag::NULL);
    assert_eq!(status(&g.call(op::clCreateBuffer, w.as_slice()).1), 0);
    device
}

fn set_arg(g: &mut RawGuest, index: u32, size: u64, value: impl FnOnce(&mut Writer)) -> i32 {
    let mut w = Writer::new();
    w.u64(3).u32(index).u64(size);
    value(&mut w);
    let (h, p) = g.call(op::clSetKernelArg, w.as_slice());
    assert_eq!(
        h.kind,
        FrameKind::Reply,
        "an API status, not a protocol error"
    );
    status(&p)
}

#[test]
fn api_server_refuses_guest_bytes_for_pointer_arguments() {
    let daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session(&daemon.socket("vm1"));
    kernel_session(
        &mut g,
        "__kernel void k(__global int *out, int n, __local int *tmp) { out[0] = n; }",
    );
    let garbage = 0x4141_4141_4141_4141u64.to_le_bytes();
    assert_eq!(
        set_arg(&mut g, 0, 8, |w| {
            w.u8(tag::INLINE).bytes(&garbage);
        }),
        CL_INVALID_MEM_OBJECT,
        "8 guest bytes for a __global pointer"
    );
    assert_eq!(
        set_arg(&mut g, 0, 8, |w| {
            w.u8(tag::HANDLE).u8(Kind::Mem as u8).u64(99);
        }),
        CL_INVALID_MEM_OBJECT,
        "an id that names nothing"
    );
    assert_eq!(
        set_arg(&mut g, 0, 8, |w| {
            w.u8(tag::HANDLE).u8(Kind::Context as u8).u64(1);
        }),
        CL_INVALID_MEM_OBJECT,
        "a context where a buffer belongs"
    );
    assert_eq!(
        set_arg(&mut g, 0, 4, |w| {
            w.u8(tag::HANDLE).u8(Kind::Mem as u8).u64(4);
        }),
        CL_INVALID_ARG_SIZE
    );
    assert_eq!(
        set_arg(&mut g, 1, 4, |w| {
            w.u8(tag::HANDLE).u8(Kind::Mem as u8).u64(4);
        }),
        CL_INVALID_ARG_VALUE,
        "an object for a by-value int"
    );
    assert_eq!(
        set_arg(&mut g, 2, 8, |w| {
            w.u8(tag::INLINE).bytes(&garbage);
        }),
        CL_INVALID_ARG_VALUE,
        "a value for a __local pointer"
    );
    assert_eq!(
        set_arg(&mut g, 0, 8, |w| {
            w.u8(tag::HANDLE).u8(Kind::Mem as u8).u64(4);
        }),
        0,
        "a live buffer of this session"
    );
    assert_eq!(
        set_arg(&mut g, 1, 4, |w| {
            w.u8(tag::INLINE).bytes(&5i32.to_le_bytes());
        }),
        0
    );
    assert_eq!(daemon.api_servers().len(), 1, "the API server is alive");
}

#[test]
fn a_failed_call_forwarded_without_reply_is_reported_to_the_guest() {
    use hira_protocol::frame::FLAG_NO_REPLY;
    use hira_protocol::handshake::{ASYNC_FAILURE, AsyncFailure};
    let daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session(&daemon.socket("vm1"));
    kernel_session(&mut g, "__kernel void k(__global int *out) { out[0] = 1; }");
    // Argument 5 of a one-argument kernel, forwarded without waiting.
    let mut w = Writer::new();
    w.u64(3)
        .u32(5)
        .u64(4)
        .u8(tag::INLINE)
        .bytes(&1i32.to_le_bytes());
    g.frame(
        FrameKind::Request,
        op::clSetKernelArg,
        FLAG_NO_REPLY,
        0,
        &[],
        w.as_slice(),
    );
    let (h, p) = g.recv().expect("a notification");
    assert_eq!((h.kind, h.opcode), (FrameKind::Notify, ASYNC_FAILURE));
    assert_eq!(
        AsyncFailure::decode(&p).unwrap(),
        AsyncFailure {
            opcode: op::clSetKernelArg,
            status: -49
        },
        "CL_INVALID_ARG_INDEX reaches the guest"
    );
}

#[test]
fn missing_or_empty_program_sources_do_not_crash_the_api_server() {
    // Found by the `api_server_calls` fuzz target: PoCL 3.1 reads through a NULL
    // source array, and runs strlen on an empty source's pointer.
    let daemon = Daemon::start(&["vm1"]);
    let mut g = RawGuest::session(&daemon.socket("vm1"));
    kernel_session(&mut g, "__kernel void k(__global int *out) { out[0] = 1; }");
    let mut w = Writer::new();
    w.u64(20).u64(1).u32(3).u8(0);
    let (_, p) = g.call(op::clCreateProgramWithSource, w.as_slice());
    assert_eq!(status(&p), -30, "a NULL source array is CL_INVALID_VALUE");
    let mut w = Writer::new();
    w.u64(21)
        .u64(1)
        .u32(2)
        .u8(1)
        .u32(2)
        .bytes(b"")
        .bytes(b"__kernel void e() {}");
    let (_, p) = g.call(op::clCreateProgramWithSource, w.as_slice());
    assert_eq!(status(&p), 0, "an empty source string is a valid source");
    assert_eq!(daemon.api_servers().len(), 1, "the API server is alive");
}
