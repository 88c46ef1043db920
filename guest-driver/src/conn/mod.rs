//! One connection to the host, shared by every thread of the guest process.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use hira_protocol::frame::{self, FLAG_NO_REPLY, HEADER_LEN};
use hira_protocol::handshake::{
    ASYNC_FAILURE, ApiId, AsyncFailure, ErrorPayload, HOST_OUTPUT, Hello, HostOutput, OUTPUT_DONE,
    OutputDone, Token, Welcome, error_code, migrate,
};
use hira_protocol::resend::{self, Resending};
use hira_protocol::{FrameHeader, FrameKind, Span, unix};
use log::{debug, warn};
use thiserror::Error;

use crate::endpoint::Endpoint;
use crate::window::Window;

/// Errors of the transport. Once a connection has failed every later call fails too.
#[derive(Debug, Error, Clone)]
pub enum TransportError {
    #[error("cannot connect to the Hira host at {path}: {reason}")]
    Connect { path: String, reason: String },
    #[error("the host refused the session: {0}")]
    Refused(String),
    #[error("connection to the host closed: {0}")]
    Closed(String),
    #[error("the host sent a malformed frame: {0}")]
    Malformed(String),
}

/// The byte stream to the host.
#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Vsock(vsock::VsockStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Vsock(s) => Stream::Vsock(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Vsock(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Vsock(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Vsock(s) => s.read(buf),
        }
    }
}

// Writes go through `send`/`sendmsg` with MSG_NOSIGNAL: a host that closed the
// connection must give the application an error code, not a SIGPIPE that kills it.
impl std::io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` reads; the fd is this stream's socket.
        let n = unsafe {
            libc::send(
                self.raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        // SAFETY: an all-zero msghdr is valid; the fields set below describe `bufs`,
        // whose IoSlices are ABI-compatible with iovec.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        // SAFETY: `msg` points to `bufs.len()` valid iovecs for the call's duration.
        let n = unsafe { libc::sendmsg(self.raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where requests go: the socket (kept until acknowledged where the session's stream
/// outlives its connection), or the submission ring of the data plane.
enum Tx {
    Stream(Resending<Stream>),
    Ring(hira_ring::Producer),
}

impl std::io::Write for Tx {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Tx::Stream(s) => s.write(buf),
            Tx::Ring(r) => r.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Tx::Stream(s) => s.write_vectored(bufs),
            Tx::Ring(r) => r.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a caller of `Connection::wait_for` waits for.
#[derive(Clone, Copy)]
enum Want<'a> {
    /// The reply to the call with this (channel, call id).
    Reply((u32, u64)),
    /// Any notification (a callback to deliver).
    Notification,
    /// A condition that frames read meanwhile make true.
    Until(&'a dyn Fn() -> bool),
}

/// Where replies and notifications come from: the socket, or the completion ring.
/// Once the session is over (the API server gone, the daemon's error frame on the
/// socket), a ring reader reads on from the socket, so that the daemon's word on why
/// reaches the caller as it would without rings.
enum Rx {
    Stream(Stream),
    Ring {
        consumer: hira_ring::Consumer,
        socket: Stream,
        over: bool,
    },
}

impl Read for Rx {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Rx::Stream(s) => s.read(buf),
            Rx::Ring {
                consumer,
                socket,
                over,
            } => {
                if !*over {
                    match consumer.read(buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => *over = true,
                        r => return r,
                    }
                }
                socket.read(buf)
            }
        }
    }
}

impl Rx {
    /// Lets the next read spin for up to `budget` before it sleeps.
    fn spin(&mut self, budget: std::time::Duration) {
        match self {
            Rx::Stream(s) => spin_until_readable(s, budget),
            Rx::Ring { consumer, .. } => consumer.set_spin(budget),
        }
    }
}

/// A frame received from the host.
#[derive(Debug)]
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Vec<u8>,
}

#[derive(Default)]
struct Demux {
    /// A thread is blocked reading the socket on everyone's behalf.
    reading: bool,
    replies: HashMap<(u32, u64), Frame>,
    notifications: VecDeque<Frame>,
    /// The first asynchronous call that failed and was not reported yet.
    async_failure: Option<AsyncFailure>,
    dead: Option<TransportError>,
}

/// What to do with a deferred output when it arrives: called with the command's
/// status and, when the bytes travelled in the frame, those bytes.
pub type Delivery = Box<dyn FnOnce(i32, Option<&[u8]>) + Send>;

enum Deferred {
    /// The request was sent; its output has not arrived.
    Waiting(Delivery),
    /// The output arrived before the caller registered what to do with it.
    Arrived(i32, Option<Vec<u8>>),
}

/// The process's connection to the host.
pub struct Connection {
    /// The socket to the host: the whole session, or with rings its handshake and
    /// its end.
    socket: Stream,
    writer: Mutex<Tx>,
    /// Set (under the writer lock) once a relayed session's last frame before a
    /// suspension was sent: writers wait on `unpaused` until it resumes.
    paused: AtomicBool,
    unpaused: Condvar,
    reader: Mutex<std::io::BufReader<Rx>>,
    demux: Mutex<Demux>,
    cv: Condvar,
    next_call: AtomicU64,
    next_channel: AtomicU32,
    next_token: AtomicU64,
    /// Outputs of non-blocking reads, by token.
    deferred: Mutex<HashMap<u64, Deferred>>,
    window: Option<Window>,
    /// How long a caller spins for its reply before it blocks.
    spin: std::time::Duration,
    /// Latest round trip of each opcode, in microseconds.
    recent_us: Box<[std::sync::atomic::AtomicU32]>,
    /// What resumes the session if the host suspends it (host-local sessions on
    /// rings).
    resume: Option<Resume>,
    /// A relayed stream kept on both ends (`Welcome::resend`): bytes of whole frames
    /// taken in since the `Welcome`, what this end last acknowledged, and what the
    /// host acknowledged of what this end sent.
    keeps: AtomicBool,
    /// The session the host serves this connection as now (a suspended session
    /// resumes as a new one).
    session: AtomicU64,
    taken: AtomicU64,
    ack_sent: AtomicU64,
    host_acked: std::sync::Arc<AtomicU64>,
    /// Reconnections so far, and the lock one takes: a thread that saw the
    /// connection fail reconnects only if nobody did since.
    generation: AtomicU64,
    reconnecting: Mutex<()>,
    pub welcome: Welcome,
}

/// What a suspended session is resumed with: where the guest connected, its token,
/// and its ring region and eventfds, which it hands to the API server that resumes it.
struct Resume {
    endpoint: Endpoint,
    api: ApiId,
    token: Token,
    /// Host-local: the ring region and eventfds (a VM's rings are in its window).
    rings: Vec<std::os::fd::OwnedFd>,
    /// A VM session on rings (in its slot of the VM's window).
    vm_rings: bool,
}

/// How long a guest whose session was suspended tries to resume it
/// (`HIRA_RESUME_SECS`, default 60).
fn resume_limit() -> std::time::Duration {
    crate::settings::settings().resume
}

/// Pauses between attempts to resume (the session may not be placed yet, or its
/// daemon restarting): growing from the first to the last.
/// How long a VM session's guest tries to reconnect after its connection ended
/// without a word (the daemon keeps such a session as long), and for how long it
/// takes a refusal of its token for a daemon still noticing the reset.
const RESET_GRACE: std::time::Duration = std::time::Duration::from_secs(30);
const RESET_REFUSALS: std::time::Duration = std::time::Duration::from_secs(3);

const RESUME_RETRY: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_millis(5),
    std::time::Duration::from_millis(200),
);

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("welcome", &self.welcome)
            .finish_non_exhaustive()
    }
}

fn read_frame(s: &mut impl Read) -> Result<Frame, TransportError> {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb)
        .map_err(|e| TransportError::Closed(e.to_string()))?;
    let header = FrameHeader::decode(&hb).map_err(|e| TransportError::Malformed(e.to_string()))?;
    let mut payload = hira_protocol::shm::zeroed(header.len as usize);
    s.read_exact(&mut payload)
        .map_err(|e| TransportError::Closed(e.to_string()))?;
    Ok(Frame { header, payload })
}

fn process_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Spins for up to `budget` waiting for `s` to become readable, so that a reply that
/// comes back within microseconds is seen without the thread (and its CPU) going to
/// sleep and being woken again, which costs tens of microseconds on virtual CPUs.
/// Returns at once when data is there; the caller then reads as usual and blocks if
/// the budget ran out.
fn spin_until_readable(s: &Stream, budget: std::time::Duration) {
    if budget.is_zero() {
        return;
    }
    let fd = s.raw_fd();
    let start = std::time::Instant::now();
    let mut byte = 0u8;
    loop {
        // SAFETY: peeking one byte into a local without blocking on a valid socket.
        let n = unsafe {
            libc::recv(
                fd,
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n != -1 || start.elapsed() >= budget {
            return;
        }
        for _ in 0..64 {
            std::hint::spin_loop();
        }
    }
}

thread_local! {
    static CHANNEL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

mod connect;
mod resume;
mod wait;

impl Connection {
    /// The shared data window, if the host accepted one.
    pub fn window(&self) -> Option<&Window> {
        self.window.as_ref()
    }

    /// The calling thread's channel.
    pub fn channel(&self) -> u32 {
        CHANNEL.with(|c| {
            if c.get() == 0 {
                c.set(self.next_channel.fetch_add(1, Ordering::Relaxed));
            }
            c.get()
        })
    }

    pub(super) fn dead(&self) -> Option<TransportError> {
        self.demux
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dead
            .clone()
    }

    pub(super) fn kill(&self, e: TransportError) {
        let mut d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
        if d.dead.is_none() {
            warn!("Hira transport failed: {e}");
            d.dead = Some(e);
        }
        drop(d);
        self.cv.notify_all();
        {
            // Writers held by a suspension give up too.
            let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            self.unpaused.notify_all();
        }
        self.socket.shutdown();
    }

    /// Sends a request. With `no_reply` the call is forwarded asynchronously and
    /// `Ok(None)` returns at once; otherwise this waits for the reply frame.
    pub fn call(
        &self,
        opcode: u16,
        spans: &[Span],
        payload: &[u8],
        no_reply: bool,
    ) -> Result<Option<Frame>, TransportError> {
        self.call_parts(opcode, spans, &[payload], no_reply)
    }

    /// As [`Connection::call`], the payload in parts, written one after the other
    /// (large inputs from where the application has them).
    pub fn call_parts(
        &self,
        opcode: u16,
        spans: &[Span],
        payload: &[&[u8]],
        no_reply: bool,
    ) -> Result<Option<Frame>, TransportError> {
        if let Some(e) = self.dead() {
            return Err(e);
        }
        let channel = self.channel();
        let call_id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let len = spans.len() * frame::SPAN_LEN + payload.iter().map(|p| p.len()).sum::<usize>();
        if len > frame::MAX_FRAME_BODY {
            return Err(TransportError::Malformed(format!(
                "request of {len} bytes exceeds the frame limit"
            )));
        }
        let header = FrameHeader {
            len: len as u32,
            kind: FrameKind::Request,
            flags: if no_reply { FLAG_NO_REPLY } else { 0 },
            opcode,
            channel,
            span_count: spans.len() as u16,
            call_id,
        };
        let mut head = Vec::with_capacity(HEADER_LEN + spans.len() * frame::SPAN_LEN);
        head.extend_from_slice(&header.encode());
        for s in spans {
            head.extend_from_slice(&s.encode());
        }
        let seen = self.generation.load(Ordering::Acquire);
        let broken = {
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            while self.paused.load(Ordering::Acquire) && self.dead().is_none() {
                w = self.unpaused.wait(w).unwrap_or_else(|e| e.into_inner());
            }
            // Most calls have one part: no list to build for them.
            let (one, many);
            let parts: &[&[u8]] = match payload {
                [p] => {
                    one = [&head[..], p];
                    &one
                }
                _ => {
                    many = [&[&head[..]][..], payload].concat();
                    &many
                }
            };
            if let Err(e) = frame::write_parts(&mut *w, parts) {
                drop(w);
                let e = TransportError::Closed(e.to_string());
                self.kill(e.clone());
                return Err(e);
            }
            self.acknowledge(&mut w);
            matches!(&*w, Tx::Stream(ws) if ws.is_broken())
        };
        if broken && self.outlives_resets() {
            // The connection failed under a kept stream: the request is kept, and
            // goes again once connected again.
            if let Err(e) = self.reconnect(seen) {
                self.kill(e.clone());
                return Err(e);
            }
        }
        if no_reply {
            return Ok(None);
        }
        ROUND_TRIPS.fetch_add(1, Ordering::Relaxed);
        if crate::settings::settings().stats.is_some() {
            *ROUND_TRIPS_BY_OP
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(opcode)
                .or_default() += 1;
        }
        // Spin only for calls that recently came back within the spin budget: a call
        // that waits on the device (clFinish, a blocking read) would only burn the CPU
        // the device work needs.
        let slot = &self.recent_us[opcode as usize % self.recent_us.len()];
        let spin = if (slot.load(Ordering::Relaxed) as u128) < 2 * self.spin.as_micros() {
            self.spin
        } else {
            std::time::Duration::ZERO
        };
        let start = std::time::Instant::now();
        let reply = self
            .wait_for(Want::Reply((channel, call_id)), spin, &|| true)
            .and_then(|f| f.ok_or_else(|| TransportError::Malformed("no reply".into())));
        let took = start.elapsed().as_micros().min(u32::MAX as u128) as u32;
        slot.store(took, Ordering::Relaxed);
        reply.map(Some)
    }

    /// Blocks until the host sends a notification (a callback to deliver). The caller
    /// reads the socket itself only while `may_read` says so; otherwise it waits for a
    /// caller of [`Connection::call`] to pass notifications on.
    pub fn next_notification(&self, may_read: &dyn Fn() -> bool) -> Result<Frame, TransportError> {
        self.wait_for(Want::Notification, std::time::Duration::ZERO, may_read)?
            .ok_or_else(|| TransportError::Malformed("no notification".into()))
    }

    /// Blocks until `done` holds, reading the host's frames meanwhile (deferred
    /// outputs run their deliveries, which is what `done` usually waits for).
    pub fn wait_until(&self, done: &dyn Fn() -> bool) -> Result<(), TransportError> {
        self.wait_for(Want::Until(done), self.spin, &|| true)
            .map(|_| ())
    }

    /// A fresh token for a deferred output.
    pub fn next_token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers what to do with the deferred output `token`; runs it at once if the
    /// output has already arrived.
    pub fn on_output(&self, token: u64, f: Delivery) {
        let mut m = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        match m.remove(&token) {
            Some(Deferred::Arrived(status, data)) => {
                drop(m);
                f(status, data.as_deref());
            }
            _ => {
                m.insert(token, Deferred::Waiting(f));
            }
        }
    }

    pub(super) fn output_arrived(&self, o: OutputDone) {
        let mut m = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        match m.remove(&o.token) {
            Some(Deferred::Waiting(f)) => {
                drop(m);
                f(o.status, o.data.as_deref());
            }
            Some(Deferred::Arrived(..)) | None => {
                m.insert(o.token, Deferred::Arrived(o.status, o.data));
            }
        }
    }

    /// The first asynchronous call that failed since the last time this was asked.
    pub fn take_async_failure(&self) -> Option<AsyncFailure> {
        self.demux
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .async_failure
            .take()
    }

    /// Wakes waiters so they re-check their conditions.
    pub fn wake(&self) {
        let _guard = self.demux.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
    }

    /// Whether the connection has failed.
    pub fn is_dead(&self) -> bool {
        self.dead().is_some()
    }
}

/// Where the host's output goes instead of [`write_to_fd`], if a library says.
/// Calls this process sent and then waited for the host's reply to: its round trips
/// to the host (asynchronously forwarded calls are not among them).
pub static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);

/// With `HIRA_STATS`: the round trips of each opcode.
static ROUND_TRIPS_BY_OP: std::sync::LazyLock<Mutex<HashMap<u16, u64>>> =
    std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));

/// With `HIRA_STATS`: the round trips of each opcode so far, busiest first.
pub fn round_trips_by_opcode() -> Vec<(u16, u64)> {
    let mut v: Vec<(u16, u64)> = ROUND_TRIPS_BY_OP
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(o, n)| (*o, *n))
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

static OUTPUT_SINK: std::sync::OnceLock<fn(i32, &[u8])> = std::sync::OnceLock::new();

/// Has what the host's library printed for this process's sessions written by
/// `sink(fd, bytes)`: for a library whose native counterpart prints through the C
/// library's buffered streams (NVIDIA's driver does), so that its output keeps its
/// place among the program's own. The first setting holds.
pub fn set_output_sink(sink: fn(i32, &[u8])) {
    let _ = OUTPUT_SINK.set(sink);
}

/// Writes `data` to descriptor `fd` of this process, as the host's library would
/// have written it natively (unbuffered, with `write`). A descriptor that is closed or
/// full of errors loses the bytes, as it would natively.
fn write_to_fd(fd: i32, mut data: &[u8]) {
    while !data.is_empty() {
        // SAFETY: `data` is valid for `data.len()` bytes; an invalid `fd` is an error.
        let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            debug!(
                "cannot write the host's output to descriptor {fd}: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        data = &data[n as usize..];
    }
}
