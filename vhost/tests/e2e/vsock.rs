//! The VM transport's device core: a guest's vsock stack, played in memory, reaches
//! a real Hira session (vms, API server, PoCL) through `VsockDevice`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hira_apis_opencl::op;
use hira_protocol::handshake::{ErrorPayload, Hello, Welcome, error_code};
use hira_protocol::{FrameHeader, FrameKind, Writer};
use hira_vhost::config::Config;
use hira_vhost::lifecycle::Lifecycle;
use hira_vhost::vms::Vms;
use hira_vhost::vsock::device::{Packet, VsockDevice};
use hira_vhost::vsock::header::{Header, Op};
use hira_vhost::vsock::{HIRA_PORT, HOST_CID};

use crate::support::{bin_dir, children_named, ensure_built, wait_exit};

const CID: u64 = 7;
const PORT: u32 = 49152;

/// The guest side of one connection.
struct Guest {
    dev: VsockDevice,
    life: Arc<Lifecycle>,
    buf_alloc: u32,
    fwd_cnt: u32,
    received: Vec<u8>,
    credit_requests: usize,
    largest_burst: usize,
}

impl Guest {
    fn new(buf_alloc: u32) -> Guest {
        Self::with_window(buf_alloc, None)
    }

    /// A guest of a VM whose shared window is the file `window` (64 MiB: four 16 MiB
    /// slots).
    fn with_window(buf_alloc: u32, window: Option<&std::path::Path>) -> Guest {
        ensure_built();
        let config = Config {
            listeners: vec![],
            vhost_user_vms: vec![],
            api_server: bin_dir().join("hira-api-server"),
            ..Config::default()
        };
        let queue = Vms::default().vm("vsock-vm");
        if let Some(path) = window {
            let w = hira_vhost::window::VmWindow::create(
                path,
                64 << 20,
                hira_vhost::window::DEFAULT_SLOTS,
            )
            .unwrap();
            queue.window.set(w).unwrap();
        }
        let life = Arc::new(Lifecycle::default());
        Guest {
            dev: VsockDevice::new(CID, "vsock-vm", Arc::new(config), queue, life.clone()),
            life,
            buf_alloc,
            fwd_cnt: 0,
            received: Vec::new(),
            credit_requests: 0,
            largest_burst: 0,
        }
    }

    /// Blocks until a session socket has something for the device (or 10 ms pass,
    /// for credit the device may now send): the event the backend's loop waits on.
    fn wait_for_sessions(&self) {
        use std::os::fd::AsRawFd;
        let mut fds: Vec<libc::pollfd> = self
            .dev
            .streams()
            .map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfds for the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10) };
    }

    fn header(&self, op: Op, len: u32) -> Header {
        Header {
            src_cid: CID,
            dst_cid: HOST_CID,
            src_port: PORT,
            dst_port: HIRA_PORT,
            len,
            op,
            flags: 0,
            buf_alloc: self.buf_alloc,
            fwd_cnt: self.fwd_cnt,
        }
    }

    fn take(&mut self, packets: Vec<Packet>) -> Vec<Header> {
        let mut burst = 0;
        let mut others = Vec::new();
        for p in packets {
            assert_eq!(p.header.dst_cid, CID);
            match p.header.op {
                Op::Rw => {
                    assert_eq!(p.payload.len(), p.header.len as usize);
                    burst += p.payload.len();
                    self.received.extend_from_slice(&p.payload);
                }
                Op::CreditRequest => self.credit_requests += 1,
                _ => others.push(p.header),
            }
        }
        self.largest_burst = self.largest_burst.max(burst);
        others
    }

    fn send(&mut self, op: Op, payload: &[u8]) -> Vec<Header> {
        let h = self.header(op, payload.len() as u32);
        let out = self.dev.from_guest(&h, payload);
        self.take(out)
    }

    /// Consumes what arrived (advertising it), polling until a whole frame is there.
    fn frame(&mut self) -> (FrameHeader, Vec<u8>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.received.len() >= 24 {
                let h = FrameHeader::decode(&self.received[..24].try_into().unwrap()).unwrap();
                let total = 24 + h.len as usize;
                if self.received.len() >= total {
                    let body = self.received[24..total].to_vec();
                    self.received.drain(..total);
                    return (h, body);
                }
            }
            assert!(Instant::now() < deadline, "no whole frame from the device");
            let out = self.dev.poll_sessions();
            let before = self.received.len();
            self.take(out);
            let got = self.received.len() - before;
            if got > 0 {
                // The application read it: tell the device.
                self.fwd_cnt = self.fwd_cnt.wrapping_add(got as u32);
                self.send(Op::CreditUpdate, &[]);
            }
            self.wait_for_sessions();
        }
    }

    /// Connects and completes the handshake; returns the session number.
    fn connect_and_hello(&mut self) -> u64 {
        let w = self.connect_with(Hello::new(hira_apis_opencl::API, 42, "vsock-guest", 0));
        assert_eq!((w.vm_name.as_str(), w.window_len), ("vsock-vm", 0));
        w.session
    }

    /// Connects, sends `hello` and returns the `Welcome`.
    fn connect_with(&mut self, hello: Hello) -> Welcome {
        let (h, body) = self.hello(hello);
        assert_eq!(h.kind, FrameKind::Welcome);
        Welcome::decode(&body).unwrap()
    }

    /// Connects, sends `hello` and returns the answer.
    fn hello(&mut self, hello: Hello) -> (FrameHeader, Vec<u8>) {
        let reply = self.send(Op::Request, &[]);
        assert!(
            matches!(reply.as_slice(), [h] if h.op == Op::Response),
            "{reply:?}"
        );
        let hello = hello.encode();
        let fh = FrameHeader::new(FrameKind::Hello, 0, 0, 0, hello.len());
        let mut bytes = fh.encode().to_vec();
        bytes.extend_from_slice(&hello);
        self.send(Op::Rw, &bytes);
        self.frame()
    }

    /// Resets the device (every connection cut, what was in flight lost) and waits
    /// until the session waits for its guest.
    fn reset(&mut self) {
        self.dev.reset();
        self.received.clear();
        self.fwd_cnt = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.life.detached() == 0 {
            assert!(
                Instant::now() < deadline,
                "the session did not wait for its guest"
            );
            std::thread::yield_now();
        }
    }
}

/// The pid of this process's API-server child for session `session`.
fn api_server_of(session: u64) -> u32 {
    children_named(std::process::id(), "hira-api-server")
        .into_iter()
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.windows(2)
                .any(|w| w[0] == b"--session" && w[1] == session.to_string().as_bytes())
        })
        .expect("the session has an API server")
}

#[test]
fn guest_vsock_connection_runs_a_hira_session() {
    let mut g = Guest::new(256 * 1024);
    let session = g.connect_and_hello();
    // clGetPlatformIDs(1, &p, &n) over the vsock stream.
    let mut w = Writer::new();
    w.u32(1).u8(1).u8(1);
    let fh = FrameHeader::new(FrameKind::Request, op::clGetPlatformIDs, 1, 1, w.len());
    let mut bytes = fh.encode().to_vec();
    bytes.extend_from_slice(w.as_slice());
    g.send(Op::Rw, &bytes);
    let (h, body) = g.frame();
    assert_eq!((h.kind, h.call_id), (FrameKind::Reply, 1));
    assert_eq!(&body[..4], &0i32.to_le_bytes(), "CL_SUCCESS");
    assert_eq!(&body[4..8], &1u32.to_le_bytes(), "one platform");
    // The guest resets the connection: the session and its API server go away.
    let server = api_server_of(session);
    assert!(g.send(Op::Rst, &[]).is_empty());
    assert!(
        wait_exit(server, Duration::from_secs(15)),
        "the API server outlived the connection"
    );
    assert_eq!(g.dev.connections(), 0);
}

/// A `clGetPlatformIDs(1, &p, &n)` request frame with call id `call`.
fn platform_ids(call: u64) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(1).u8(1).u8(1);
    let fh = FrameHeader::new(FrameKind::Request, op::clGetPlatformIDs, 1, call, w.len());
    let mut bytes = fh.encode().to_vec();
    bytes.extend_from_slice(w.as_slice());
    bytes
}

#[test]
fn a_relayed_session_sends_again_what_a_device_reset_lost() {
    // The guest keeps its stream (`resend`). A request is sent and the device is
    // reset before its reply reaches the guest: the session waits, and when the guest
    // connects again saying it took nothing, the daemon says what it took (the
    // request, whole) and sends the reply again. A guest claiming more than was sent
    // is refused and the session ends.
    let mut g = Guest::new(256 * 1024);
    let mut hello = Hello::new(hira_apis_opencl::API, 42, "vsock-guest", 0);
    hello.resend = true;
    let w = g.connect_with(hello.clone());
    assert!(w.resend);
    let server = api_server_of(w.session);
    let request = platform_ids(1);
    g.send(Op::Rw, &request);
    g.reset();
    hello.resume = Some(w.token);
    let (h, body) = g.hello(hello.clone());
    assert_eq!(
        h.kind,
        FrameKind::Welcome,
        "{:?}",
        ErrorPayload::decode(&body)
    );
    let again = Welcome::decode(&body).unwrap();
    assert_eq!(
        (again.session, again.taken),
        (w.session, request.len() as u64)
    );
    let (h, body) = g.frame();
    assert_eq!((h.kind, h.call_id), (FrameKind::Reply, 1));
    assert_eq!(
        &body[..8],
        &[0, 0, 0, 0, 1, 0, 0, 0],
        "CL_SUCCESS, one platform"
    );
    // The same API server serves on.
    assert_eq!(api_server_of(w.session), server);
    assert_eq!(
        g.life
            .reconnections
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    g.send(Op::Rw, &platform_ids(2));
    let (h, _) = g.frame();
    assert_eq!((h.kind, h.call_id), (FrameKind::Reply, 2));
    // Cut again; this guest claims bytes that were never sent.
    let taken = (24 + body.len() + 24 + 8) as u64;
    g.reset();
    hello.taken = taken + 1_000_000;
    let (h, body) = g.hello(hello);
    assert_eq!(h.kind, FrameKind::Error);
    assert_eq!(
        ErrorPayload::decode(&body).unwrap().code,
        error_code::HANDSHAKE
    );
    assert!(
        wait_exit(server, Duration::from_secs(15)),
        "the API server outlived its session"
    );
}

#[test]
fn device_never_sends_more_than_the_guest_has_room_for() {
    let mut g = Guest::new(16);
    g.connect_and_hello();
    assert!(
        g.largest_burst <= 16,
        "burst of {} bytes into a 16-byte buffer",
        g.largest_burst
    );
    assert!(
        g.credit_requests > 0,
        "the device asked for credit when it ran out"
    );
}

#[test]
fn connection_to_another_port_is_refused_and_starts_nothing() {
    let mut g = Guest::new(4096);
    let mut h = g.header(Op::Request, 0);
    h.dst_port = 22;
    let out = g.dev.from_guest(&h, &[]);
    assert!(matches!(out.as_slice(), [p] if p.header.op == Op::Rst));
    assert_eq!(g.dev.connections(), 0);
}

#[test]
fn on_rings_a_vm_guest_may_only_ring_doorbells_on_its_socket() {
    // The window in /dev/shm (tmpfs), where operators put it.
    let dir = crate::support::shm_dir().unwrap_or_else(|| tempfile::tempdir().unwrap());
    let mut g = Guest::with_window(256 * 1024, Some(&dir.path().join("window")));
    let mut hello = Hello::new(hira_apis_opencl::API, 42, "vsock-guest", 0);
    hello.vm_window = true;
    hello.rings = true;
    let w = g.connect_with(hello);
    // The slot's end holds the rings; the rest is the data window.
    let rings = hira_ring::region_len(hira_ring::DEFAULT_CAPACITY) as u64;
    assert_eq!(w.ring_capacity, hira_ring::DEFAULT_CAPACITY as u64);
    assert_eq!(w.window_len, (16 << 20) - rings);
    assert_eq!(w.ring_offset, w.window_offset + w.window_len);
    let server = api_server_of(w.session);
    // A doorbell is relayed (the API server finds its ring empty and sleeps again).
    g.send(Op::Rw, &hira_ring::doorbell_frame());
    // A request on the socket is not: the session ends with an error.
    let fh = FrameHeader::new(FrameKind::Request, op::clGetPlatformIDs, 1, 1, 0);
    g.send(Op::Rw, &fh.encode());
    let (h, body) = g.frame();
    assert_eq!(h.kind, FrameKind::Error);
    assert_eq!(
        ErrorPayload::decode(&body).unwrap().code,
        error_code::MALFORMED
    );
    assert!(
        wait_exit(server, Duration::from_secs(15)),
        "the API server outlived its session"
    );
}
