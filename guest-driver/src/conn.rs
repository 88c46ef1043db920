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
use hira_protocol::replay::{self, Replayed};
use hira_protocol::{FrameHeader, FrameKind, Span, ring, unix};
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
    Stream(Replayed<Stream>),
    Ring(ring::Producer),
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
        consumer: ring::Consumer,
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
    /// A relayed stream kept on both ends (`Welcome::replay`): bytes of whole frames
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
    let mut payload = vec![0u8; header.len as usize];
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

impl Connection {
    /// Connects to the first endpoint that answers (see [`crate::endpoint::endpoints`]).
    pub fn connect_any(
        endpoints: &[Endpoint],
        api: ApiId,
        window_len: u64,
    ) -> Result<Self, TransportError> {
        let mut last = TransportError::Connect {
            path: "nowhere".into(),
            reason: "no endpoint to try".into(),
        };
        for e in endpoints {
            match Self::connect(e, api, window_len) {
                Ok(c) => return Ok(c),
                Err(err) => {
                    debug!("{err}");
                    last = err;
                }
            }
        }
        Err(last)
    }

    /// Connects to the host at `endpoint` and opens a session for `api`. Over a Unix
    /// socket the guest offers a data window of `window_len` bytes (0 for none); over
    /// vsock no descriptor can cross, so everything travels inline.
    pub fn connect(
        endpoint: &Endpoint,
        api: ApiId,
        window_len: u64,
    ) -> Result<Self, TransportError> {
        let shown = match endpoint {
            Endpoint::Unix(p) => p.display().to_string(),
            Endpoint::Vsock { cid, port } => format!("vsock {cid}:{port}"),
        };
        let connect_err = |reason: String| TransportError::Connect {
            path: shown.clone(),
            reason,
        };
        let hello = |window: Option<&Window>| {
            Hello::new(
                api,
                std::process::id(),
                &process_name(),
                window.map_or(0, |w| w.len() as u64),
            )
        };
        let (mut stream, window) = match endpoint {
            Endpoint::Unix(path) => {
                let mut s = UnixStream::connect(path).map_err(|e| connect_err(e.to_string()))?;
                let window = if window_len > 0 {
                    Window::create(window_len)
                        .inspect_err(|e| warn!("no data window, sending everything inline: {e}"))
                        .ok()
                } else {
                    None
                };
                let mut hl = hello(window.as_ref());
                // The host-local data plane rides on the window's descriptor passing.
                hl.rings = window.is_some() && crate::endpoint::rings();
                let h = hl.encode();
                let header = FrameHeader::new(FrameKind::Hello, 0, 0, 0, h.len());
                unix::send_frame_with_fd(&mut s, &header, &h, window.as_ref().and_then(Window::fd))
                    .map_err(|e| connect_err(e.to_string()))?;
                (Stream::Unix(s), window)
            }
            Endpoint::Vsock { cid, port } => {
                let s = vsock::VsockStream::connect_with_cid_port(*cid, *port)
                    .map_err(|e| connect_err(e.to_string()))?;
                let mut s = Stream::Vsock(s);
                // No descriptor crosses vsock: ask for a slot of the VM's window.
                let mut hl = Hello::new(api, std::process::id(), &process_name(), 0);
                hl.vm_window = window_len > 0;
                // Relayed, the stream is kept on both ends to outlive a device reset.
                hl.replay = true;
                // Rings at the end of the window slot, woken by doorbells on vsock.
                hl.rings = hl.vm_window
                    && crate::endpoint::rings()
                    && crate::window::ivshmem_bar().is_some();
                let h = hl.encode();
                let header = FrameHeader::new(FrameKind::Hello, 0, 0, 0, h.len());
                frame::write_parts(&mut s, &[&header.encode(), &h])
                    .map_err(|e| connect_err(e.to_string()))?;
                (s, None)
            }
        };
        let (reply, ring_fds) = match &mut stream {
            Stream::Unix(s) => {
                let (header, payload, fds) = unix::recv_frame_with_fds(s)
                    .map_err(|e| TransportError::Closed(e.to_string()))?;
                (Frame { header, payload }, fds)
            }
            Stream::Vsock(_) => (read_frame(&mut stream)?, Vec::new()),
        };
        let welcome = match reply.header.kind {
            FrameKind::Welcome => Welcome::decode(&reply.payload)
                .map_err(|e| TransportError::Malformed(e.to_string()))?,
            FrameKind::Error => {
                let e = ErrorPayload::decode(&reply.payload)
                    .map(|e| e.message)
                    .unwrap_or_else(|e| e.to_string());
                return Err(TransportError::Refused(e));
            }
            other => {
                return Err(TransportError::Malformed(format!(
                    "expected Welcome, got {other:?}"
                )));
            }
        };
        let window = match (welcome.window_len, window) {
            (0, _) => None,
            (_, Some(w)) => Some(w),
            // A VM window: map this session's slot of the ivshmem region.
            (len, None) => Window::ivshmem(welcome.window_offset, len),
        };
        debug!(
            "session {} in vm {} (window {} bytes)",
            welcome.session, welcome.vm_name, welcome.window_len
        );
        let spin = crate::endpoint::spin();
        let clone = || stream.try_clone().map_err(|e| connect_err(e.to_string()));
        let mut kept = Vec::new();
        let (tx, rx) = if welcome.ring_capacity > 0 {
            let bad = |e: String| TransportError::Malformed(format!("data plane: {e}"));
            let capacity = usize::try_from(welcome.ring_capacity).unwrap_or(0);
            let mut ends = match &stream {
                Stream::Unix(_) => {
                    kept = ring_fds
                        .iter()
                        .map(|f| f.try_clone())
                        .collect::<std::io::Result<Vec<_>>>()
                        .map_err(|e| bad(e.to_string()))?;
                    let mut fds = ring_fds.into_iter();
                    let region = fds.next().ok_or_else(|| bad("no region".into()))?;
                    let region =
                        ring::Region::map(&region, capacity).map_err(|e| bad(e.to_string()))?;
                    ring::guest_ends(std::sync::Arc::new(region), fds.collect(), stream.raw_fd())
                        .map_err(|e| bad(e.to_string()))?
                }
                Stream::Vsock(_) => {
                    let bar = crate::window::ivshmem_bar()
                        .ok_or_else(|| bad("no ivshmem device".into()))?;
                    let region = ring::Region::map_at(&bar, welcome.ring_offset, capacity, false)
                        .map_err(|e| bad(e.to_string()))?;
                    ring::guest_ends_vm(std::sync::Arc::new(region), stream.raw_fd())
                }
            };
            ends.producer.set_spin(spin);
            let rx = Rx::Ring {
                consumer: ends.consumer,
                socket: clone()?,
                over: false,
            };
            (Tx::Ring(ends.producer), rx)
        } else {
            let mut tx = Replayed::plain(clone()?);
            if welcome.replay {
                tx.enable(replay::GUEST_KEEPS);
            }
            (Tx::Stream(tx), Rx::Stream(clone()?))
        };
        let host_acked = match &tx {
            Tx::Stream(t) => t.acked(),
            Tx::Ring(_) => std::sync::Arc::default(),
        };
        Ok(Connection {
            socket: stream,
            writer: Mutex::new(tx),
            paused: AtomicBool::new(false),
            unpaused: Condvar::new(),
            reader: Mutex::new(std::io::BufReader::with_capacity(64 * 1024, rx)),
            demux: Mutex::new(Demux::default()),
            cv: Condvar::new(),
            next_call: AtomicU64::new(1),
            next_channel: AtomicU32::new(1),
            next_token: AtomicU64::new(1),
            deferred: Mutex::new(HashMap::new()),
            window,
            spin,
            recent_us: (0..256)
                .map(|_| std::sync::atomic::AtomicU32::new(0))
                .collect(),
            resume: match endpoint {
                _ if welcome.token == [0; 16] => None,
                Endpoint::Unix(_) if kept.is_empty() && welcome.ring_capacity > 0 => None,
                e => Some(Resume {
                    endpoint: e.clone(),
                    api,
                    token: welcome.token,
                    rings: kept,
                    vm_rings: welcome.ring_capacity > 0 && matches!(e, Endpoint::Vsock { .. }),
                }),
            },
            keeps: AtomicBool::new(welcome.replay),
            session: AtomicU64::new(welcome.session),
            taken: AtomicU64::new(0),
            ack_sent: AtomicU64::new(0),
            host_acked,
            generation: AtomicU64::new(0),
            reconnecting: Mutex::new(()),
            welcome,
        })
    }

    /// A relayed session is about to be suspended: sends the last frame of this
    /// connection (`DRAINED`), after any frame being written, and holds every later
    /// one until the session resumes, so that the host's capture misses none.
    fn pause(&self) {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let h = FrameHeader::new(FrameKind::Notify, migrate::DRAINED, 0, 0, 0);
        if let Err(e) = frame::write_parts(&mut *w, &[&h.encode()]) {
            drop(w);
            self.kill(TransportError::Closed(e.to_string()));
            return;
        }
        self.paused.store(true, Ordering::Release);
    }

    /// Lets writers go on (the session resumed, or the suspension was abandoned).
    fn unpause(&self) {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        self.paused.store(false, Ordering::Release);
        self.unpaused.notify_all();
    }

    /// Resumes the session after the host suspended it: connects again (to `to`, or
    /// where it first connected) with its token, window, ring region and eventfds,
    /// until a daemon that holds the session takes it or the time runs out. The new
    /// socket takes the old one's descriptor numbers, which the rings watch; the
    /// rings go on from where they were.
    fn resume_session(&self, to: &str, after_reset: bool) -> Result<(), TransportError> {
        let Some(kit) = &self.resume else {
            return Err(TransportError::Closed(
                "the host suspended the session, which cannot resume here".into(),
            ));
        };
        let endpoint = match &kit.endpoint {
            Endpoint::Unix(_) if !to.is_empty() => Endpoint::Unix(to.into()),
            // A VM reaches whichever daemon serves its vsock device.
            e => e.clone(),
        };
        let start = std::time::Instant::now();
        // After a reset, the daemon keeps the session for RESET_GRACE at most, and
        // one that refuses the token has none to give back.
        let limit = if after_reset {
            resume_limit().min(RESET_GRACE)
        } else {
            resume_limit()
        };
        let mut pause = RESUME_RETRY.0;
        let (socket, welcome) = loop {
            match self.try_resume(&endpoint, kit, after_reset) {
                Ok(s) => break s,
                Err(TransportError::Refused(m))
                    if after_reset && start.elapsed() >= RESET_REFUSALS =>
                {
                    return Err(TransportError::Refused(m));
                }
                Err(e) if start.elapsed() < limit => {
                    debug!("resuming: {e}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(RESUME_RETRY.1);
                }
                Err(e) => return Err(e),
            }
        };
        let mut r = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: dup2 onto descriptors this connection owns, replacing them
        // atomically with the new socket.
        unsafe { libc::dup2(socket.raw_fd(), self.socket.raw_fd()) };
        match r.get_mut() {
            Rx::Ring {
                socket: rs, over, ..
            } => {
                // SAFETY: as above.
                unsafe { libc::dup2(socket.raw_fd(), rs.raw_fd()) };
                *over = false;
            }
            Rx::Stream(rs) => {
                // Relayed: frames go on on the new socket, in both directions.
                // SAFETY: as above.
                unsafe { libc::dup2(socket.raw_fd(), rs.raw_fd()) };
                let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
                if let Tx::Stream(ws) = &mut *w {
                    // SAFETY: as above.
                    unsafe { libc::dup2(socket.raw_fd(), ws.get_ref().raw_fd()) };
                    // The same session after a cut goes on with its stream (one
                    // suspended meanwhile resumes as a new session: it starts afresh).
                    let same = welcome.session == self.session.load(Ordering::Acquire);
                    if after_reset && same && self.keeps.load(Ordering::Acquire) {
                        // The host says what it took; what followed is sent again.
                        ws.resume(welcome.taken).map_err(|e| {
                            TransportError::Refused(format!("the stream cannot go on: {e}"))
                        })?;
                    } else {
                        // A resumed session's stream starts afresh (everything before
                        // the suspension reached the API server that was captured).
                        ws.enable(if welcome.replay {
                            replay::GUEST_KEEPS
                        } else {
                            0
                        });
                        self.keeps.store(welcome.replay, Ordering::Release);
                        self.session.store(welcome.session, Ordering::Release);
                        self.taken.store(0, Ordering::Release);
                        self.ack_sent.store(0, Ordering::Release);
                    }
                }
            }
        }
        // Nothing the old connection held is read after its last word.
        let stale = r.buffer().len();
        std::io::BufRead::consume(&mut *r, stale);
        drop(r);
        if kit.vm_rings {
            // A doorbell rung while the connection was down was lost: ring again.
            let b = ring::doorbell_frame();
            // SAFETY: sends a local buffer on a descriptor this connection owns,
            // without blocking or SIGPIPE (a doorbell that does not fit is dropped, as
            // the rings do).
            unsafe {
                libc::send(
                    self.socket.raw_fd(),
                    b.as_ptr().cast(),
                    b.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
        }
        self.unpause();
        self.generation.fetch_add(1, Ordering::AcqRel);
        log::info!(
            "the Hira session {}; resumed after {:?}",
            if after_reset {
                "lost its connection"
            } else {
                "moved"
            },
            start.elapsed()
        );
        Ok(())
    }

    /// Connects again after the connection failed under a session that outlives it,
    /// unless another thread did since `seen` (a generation read before the failing
    /// read or write began).
    fn reconnect(&self, seen: u64) -> Result<(), TransportError> {
        let _one = self.reconnecting.lock().unwrap_or_else(|e| e.into_inner());
        if self.generation.load(Ordering::Acquire) != seen || self.dead().is_some() {
            return Ok(());
        }
        self.resume_session("", true)
    }

    /// Counts a frame taken in from a kept stream and acknowledges the stream every
    /// `replay::ACK_EVERY` bytes, unless a writer holds the socket or it has no room
    /// now (a writer acknowledges after its next frame: the reader never waits for the
    /// host to read, which may be waiting for this end to read), or the session is
    /// suspending (nothing may follow `DRAINED`).
    fn took(&self, f: &Frame) {
        if !self.keeps.load(Ordering::Acquire) {
            return;
        }
        self.taken
            .fetch_add((HEADER_LEN + f.payload.len()) as u64, Ordering::AcqRel);
        if let Ok(mut w) = self.writer.try_lock() {
            self.acknowledge(&mut w);
        }
    }

    /// Sends an acknowledgement if one is due (the caller holds the writer).
    fn acknowledge(&self, w: &mut Tx) {
        let taken = self.taken.load(Ordering::Acquire);
        if taken - self.ack_sent.load(Ordering::Acquire) < replay::ACK_EVERY
            || self.paused.load(Ordering::Acquire)
        {
            return;
        }
        if let Tx::Stream(ws) = w
            && (ws.is_broken() || unix::writable_now(ws.get_ref().raw_fd()))
        {
            let _ = std::io::Write::write_all(ws, &replay::ack_frame(taken));
            self.ack_sent.store(taken, Ordering::Release);
        }
    }

    fn try_resume(
        &self,
        endpoint: &Endpoint,
        kit: &Resume,
        after_reset: bool,
    ) -> Result<(Stream, Welcome), TransportError> {
        let err = |reason: String| TransportError::Connect {
            path: format!("{endpoint:?}"),
            reason,
        };
        let mut hl = Hello::new(
            kit.api,
            std::process::id(),
            &process_name(),
            self.window.as_ref().map_or(0, |w| w.len() as u64),
        );
        hl.rings = !kit.rings.is_empty();
        hl.resume = Some(kit.token);
        let (stream, reply) = match endpoint {
            Endpoint::Unix(path) => {
                let mut s = UnixStream::connect(path).map_err(|e| err(e.to_string()))?;
                let h = hl.encode();
                let header = FrameHeader::new(FrameKind::Hello, 0, 0, 0, h.len());
                let mut fds: Vec<&std::os::fd::OwnedFd> = self
                    .window
                    .as_ref()
                    .and_then(Window::fd)
                    .into_iter()
                    .collect();
                fds.extend(kit.rings.iter());
                unix::send_frame_with_fds(&mut s, &header, &h, &fds)
                    .map_err(|e| err(e.to_string()))?;
                let (rh, rp, _) =
                    unix::recv_frame_with_fds(&mut s).map_err(|e| err(e.to_string()))?;
                (
                    Stream::Unix(s),
                    Frame {
                        header: rh,
                        payload: rp,
                    },
                )
            }
            Endpoint::Vsock { cid, port } => {
                let s = vsock::VsockStream::connect_with_cid_port(*cid, *port)
                    .map_err(|e| err(e.to_string()))?;
                let mut s = Stream::Vsock(s);
                // Its window and rings are in its slot of the VM's window, which the
                // daemon kept for it.
                hl.window_len = 0;
                hl.vm_window = self.window.is_some();
                hl.rings = kit.vm_rings;
                hl.replay = true;
                if after_reset {
                    hl.taken = self.taken.load(Ordering::Acquire);
                }
                let h = hl.encode();
                let header = FrameHeader::new(FrameKind::Hello, 0, 0, 0, h.len());
                frame::write_parts(&mut s, &[&header.encode(), &h])
                    .map_err(|e| err(e.to_string()))?;
                let f = read_frame(&mut s)?;
                (s, f)
            }
        };
        match reply.header.kind {
            FrameKind::Welcome => Welcome::decode(&reply.payload)
                .map(|w| (stream, w))
                .map_err(|e| TransportError::Malformed(e.to_string())),
            _ => Err(TransportError::Refused(
                ErrorPayload::decode(&reply.payload)
                    .map(|e| e.message)
                    .unwrap_or_default(),
            )),
        }
    }

    /// Whether the session survives its connection being cut: a VM session on rings,
    /// which lives in the VM's window, or a relayed one whose stream both ends keep.
    fn outlives_resets(&self) -> bool {
        self.resume
            .as_ref()
            .is_some_and(|k| k.vm_rings || self.keeps.load(Ordering::Acquire))
    }

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

    fn dead(&self) -> Option<TransportError> {
        self.demux
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dead
            .clone()
    }

    fn kill(&self, e: TransportError) {
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
        if let Some(e) = self.dead() {
            return Err(e);
        }
        let channel = self.channel();
        let call_id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let len = spans.len() * frame::SPAN_LEN + payload.len();
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
            if let Err(e) = frame::write_parts(&mut *w, &[&head, payload]) {
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

    /// Waits for what `want` names (a reply or a notification: `Some(frame)`; a
    /// condition: `None`). Whoever is not waiting on a reader becomes the reader, if
    /// `may_read` allows.
    fn wait_for(
        &self,
        want: Want<'_>,
        spin: std::time::Duration,
        may_read: &dyn Fn() -> bool,
    ) -> Result<Option<Frame>, TransportError> {
        let key = match want {
            Want::Reply(k) => Some(k),
            Want::Notification | Want::Until(_) => None,
        };
        let mut d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match want {
                Want::Reply(k) => {
                    if let Some(f) = d.replies.remove(&k) {
                        return Ok(Some(f));
                    }
                }
                Want::Notification => {
                    if let Some(f) = d.notifications.pop_front() {
                        return Ok(Some(f));
                    }
                }
                Want::Until(done) => {
                    if done() {
                        return Ok(None);
                    }
                }
            }
            if let Some(e) = &d.dead {
                return Err(e.clone());
            }
            if d.reading || !may_read() {
                d = self.cv.wait(d).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            d.reading = true;
            drop(d);
            let seen = self.generation.load(Ordering::Acquire);
            let res = {
                let mut r = self.reader.lock().unwrap_or_else(|e| e.into_inner());
                if r.buffer().is_empty() {
                    r.get_mut().spin(spin);
                }
                read_frame(&mut *r)
            };
            if let Ok(f) = &res {
                self.took(f);
            }
            // A deferred output is delivered while this thread is still the reader, so
            // no frame sent after it (a reply that shows the command complete, an event
            // callback) is seen before the application's memory holds the data.
            let res = match res {
                Ok(f)
                    if f.header.kind == FrameKind::Notify
                        && matches!(f.header.opcode, migrate::SUSPENDING | migrate::RESUMED) =>
                {
                    if f.header.opcode == migrate::SUSPENDING {
                        self.pause();
                    } else {
                        self.unpause();
                    }
                    d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                    d.reading = false;
                    self.cv.notify_all();
                    continue;
                }
                Ok(f) if replay::is_ack(&f.header) => {
                    if let Some(n) = replay::ack_count(&f.payload) {
                        self.host_acked.fetch_max(n, Ordering::AcqRel);
                    }
                    d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                    d.reading = false;
                    self.cv.notify_all();
                    continue;
                }
                Ok(f) if f.header.kind == FrameKind::Notify && f.header.opcode == OUTPUT_DONE => {
                    match OutputDone::decode(&f.payload) {
                        Ok(o) => {
                            self.output_arrived(o);
                            d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                            d.reading = false;
                            self.cv.notify_all();
                            continue;
                        }
                        Err(e) => Err(TransportError::Malformed(format!("output frame: {e}"))),
                    }
                }
                // What the host's library printed: written where the application's
                // descriptor points now, before the reply that follows is seen.
                Ok(f) if f.header.kind == FrameKind::Notify && f.header.opcode == HOST_OUTPUT => {
                    match HostOutput::decode(&f.payload) {
                        Ok(o) => {
                            match OUTPUT_SINK.get() {
                                Some(sink) => sink(o.stream.fd(), &o.data),
                                None => write_to_fd(o.stream.fd(), &o.data),
                            }
                            d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                            d.reading = false;
                            self.cv.notify_all();
                            continue;
                        }
                        Err(e) => Err(TransportError::Malformed(format!("host output frame: {e}"))),
                    }
                }
                other => other,
            };
            d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
            d.reading = false;
            match res {
                Ok(f) => {
                    let fk = (f.header.channel, f.header.call_id);
                    match f.header.kind {
                        FrameKind::Notify if f.header.opcode == ASYNC_FAILURE => {
                            // Recorded as it is read, so a reply read after it (on
                            // the same channel) finds it.
                            if let Ok(failure) = AsyncFailure::decode(&f.payload) {
                                d.async_failure.get_or_insert(failure);
                            }
                        }
                        FrameKind::Notify => {
                            if matches!(want, Want::Notification) {
                                self.cv.notify_all();
                                return Ok(Some(f));
                            }
                            d.notifications.push_back(f);
                        }
                        FrameKind::Reply | FrameKind::Error if f.header.call_id != 0 => {
                            if Some(fk) == key {
                                self.cv.notify_all();
                                return Ok(Some(f));
                            }
                            d.replies.insert(fk, f);
                        }
                        FrameKind::Error => {
                            let e = ErrorPayload::decode(&f.payload).ok();
                            let msg = e.as_ref().map(|e| e.message.clone()).unwrap_or_default();
                            drop(d);
                            if e.is_some_and(|e| e.code == error_code::MOVED) {
                                // Suspended: calls wait while the session moves.
                                d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                                d.reading = true;
                                drop(d);
                                let resumed = self.resume_session(&msg, false);
                                d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                                d.reading = false;
                                if let Err(e) = resumed {
                                    drop(d);
                                    self.kill(e);
                                    d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                                }
                            } else {
                                self.kill(TransportError::Closed(format!(
                                    "host ended the session: {msg}"
                                )));
                                d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                            }
                        }
                        other => {
                            drop(d);
                            self.kill(TransportError::Malformed(format!(
                                "unexpected {other:?} frame"
                            )));
                            d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                        }
                    }
                    self.cv.notify_all();
                }
                Err(e) if self.outlives_resets() && d.dead.is_none() => {
                    // A VM session on rings, or relayed with its stream kept: its
                    // connection ended without a word from the host, as when the
                    // VM's vsock device is reset. The session lives on (in the
                    // window, in the kept streams); connect again and go on.
                    d.reading = true;
                    drop(d);
                    let back = self.reconnect(seen);
                    d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                    d.reading = false;
                    if let Err(again) = back {
                        drop(d);
                        warn!("the connection to the host ended ({e}) and could not be made again");
                        self.kill(again);
                        d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                    }
                    self.cv.notify_all();
                }
                Err(e) => {
                    drop(d);
                    self.kill(e);
                    d = self.demux.lock().unwrap_or_else(|e| e.into_inner());
                }
            }
        }
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

    fn output_arrived(&self, o: OutputDone) {
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
