//! Decoded calls against the real OpenCL backend (PoCL here), as an API server runs
//! them: any opcode, any payload, spans into a real shared window, after a fixed
//! prelude that creates objects for the calls to name (context 1, queue 2, program 3,
//! kernel 4 with a `__global` pointer, an int and a `__local` pointer, buffer 5, and
//! buffer 6 on the window).
//! Nothing a guest sends may crash the server or make the host read outside what the
//! guest sent; a host crash found here is a guard to add. Run it with
//! `ASAN_OPTIONS=detect_leaks=0 cargo fuzz run api_server_calls -- -detect_leaks=0`:
//! objects the inputs create stay in the session (as they would until the guest
//! leaves), which LeakSanitizer would report as leaks.
#![no_main]

use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};

use hira_api_server::backend::{Backend, FrameData};
use hira_api_server::opencl::OpenClBackend;
use hira_api_server::server::FrameWriter;
use hira_api_server::window::WindowMap;
use hira_protocol::frame::{self, SPAN_LEN};
use hira_apis_opencl::{op, tag};
use hira_protocol::Writer;
use libfuzzer_sys::fuzz_target;

const WINDOW: u64 = 1 << 20;

/// Calls that can wait forever on what a guest controls (user events, queues
/// blocked behind them, launches of any size, which a guest may make as long as it
/// likes); the protocol fuzzers and end-to-end tests cover them.
const SKIPPED: &[u16] = &[
    op::clEnqueueNDRangeKernel,
    op::clEnqueueTask,
    op::clFinish,
    op::clWaitForEvents,
    op::clCreateUserEvent,
    op::clSetUserEventStatus,
    op::clEnqueueWaitForEvents,
    op::clReleaseCommandQueue,
    op::clReleaseContext,
];

struct Fixture {
    backend: OpenClBackend,
    window: WindowMap,
    _sink: UnixStream,
}

fn call(b: &OpenClBackend, window: &WindowMap, opcode: u16, payload: &[u8]) -> i32 {
    let data = FrameData {
        spans: &[],
        window: Some(window),
        no_reply: false,
    };
    let mut w = Writer::new();
    match b.execute(opcode, payload, &data, &mut w) {
        Ok(()) => w
            .as_slice()
            .get(..4)
            .map_or(0, |s| i32::from_le_bytes(s.try_into().unwrap())),
        Err(_) => -1000,
    }
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        // SAFETY: set before any thread that reads the environment exists.
        unsafe { std::env::set_var("HIRA_DISABLE", "1") };
        let (ours, sink) = UnixStream::pair().unwrap();
        // Notifications (callbacks) are read and dropped, as a guest reads them.
        let mut drain = sink.try_clone().unwrap();
        std::thread::spawn(move || std::io::copy(&mut drain, &mut std::io::sink()));
        // A VM page with a quota, so the charging paths are fuzzed too.
        let (vm, _) = hira_protocol::usage::VmPage::create().unwrap();
        vm.set_quota(Some(1 << 30));
        let quota = Arc::new(hira_api_server::account::Account::new(Some(vm), None));
        let backend = OpenClBackend::new(None, Arc::new(FrameWriter::new(ours)), quota)
            .expect("a host OpenCL platform");
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe {
            libc::memfd_create(c"fuzz-window".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        std::fs::File::from(fd.try_clone().unwrap()).set_len(WINDOW).unwrap();
        // SAFETY: sealing our own memfd.
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        let window = WindowMap::map(&fd, WINDOW, 0).unwrap();
        let b = &backend;
        let mut w = Writer::new();
        w.u32(1).u8(1).u8(1);
        let mut out = Writer::new();
        let data = FrameData { spans: &[], window: Some(&window), no_reply: false };
        b.execute(op::clGetPlatformIDs, w.as_slice(), &data, &mut out).unwrap();
        let platform = u64::from_le_bytes(out.as_slice()[8..16].try_into().unwrap());
        let mut w = Writer::new();
        w.u64(platform).u64(0xFFFF_FFFF).u32(1).u8(1).u8(1);
        let mut out = Writer::new();
        b.execute(op::clGetDeviceIDs, w.as_slice(), &data, &mut out).unwrap();
        let device = u64::from_le_bytes(out.as_slice()[8..16].try_into().unwrap());
        let mut w = Writer::new();
        w.u64(1).u8(0).u32(1).u8(1).u32(1).u64(device).u64(0);
        assert_eq!(call(b, &window, op::clCreateContext, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u64(2).u64(1).u64(device).u8(0);
        assert_eq!(call(b, &window, op::clCreateCommandQueueWithProperties, w.as_slice()), 0);
        let src = b"__kernel void k(__global int *o, int n, __local int *t) { t[0] = n; o[0] = t[0]; }";
        let mut w = Writer::new();
        w.u64(3).u64(1).u32(1).u8(1).u32(1).bytes(src);
        assert_eq!(call(b, &window, op::clCreateProgramWithSource, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u64(3).u32(1).u8(1).u32(1).u64(device).u8(0).u64(0);
        assert_eq!(call(b, &window, op::clBuildProgram, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u64(4).u64(3).u8(1).bytes(b"k");
        assert_eq!(call(b, &window, op::clCreateKernel, w.as_slice()), 0);
        let mut w = Writer::new();
        w.u64(5).u64(1).u64(1).u64(4096).u8(tag::NULL);
        assert_eq!(call(b, &window, op::clCreateBuffer, w.as_slice()), 0);
        // Buffer 6 lives in the window (`zero_copy`): maps of it are the host's own.
        let mut w = Writer::new();
        w.u64(6).u64(1).u64(1).u64(65536).u8(tag::WINDOW_MEM).u64(WINDOW / 2).u64(65536);
        assert_eq!(call(b, &window, op::clCreateBuffer, w.as_slice()), 0);
        Fixture {
            backend,
            window,
            _sink: sink,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let opcode = u16::from_le_bytes([data[0], data[1]]);
    if SKIPPED.contains(&opcode) {
        return;
    }
    // The third byte: the span count, and in its top bit the frame's `NO_REPLY`.
    let no_reply = data[2] & 0x80 != 0;
    let n = ((data[2] & 0x7F) % 4) as usize;
    let rest = &data[3..];
    if rest.len() < n * SPAN_LEN {
        return;
    }
    let Ok(spans) = frame::decode_spans(&rest[..n * SPAN_LEN], n, WINDOW) else {
        return;
    };
    let f = fixture();
    let frame_data = FrameData {
        spans: &spans,
        window: Some(&f.window),
        no_reply,
    };
    let mut w = Writer::new();
    let _ = f.backend.execute(opcode, &rest[n * SPAN_LEN..], &frame_data, &mut w);
});
