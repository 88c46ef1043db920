//! The API server's session loop.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use hira_protocol::frame::{self, HEADER_LEN, SPAN_LEN};
use hira_protocol::handshake::{
    ASYNC_FAILURE, AsyncFailure, DOORBELL, ErrorPayload, Hello, TEARDOWN_REPORT, TeardownPayload,
    Welcome, error_code, migrate,
};
use hira_protocol::usage::UsagePage;
use hira_protocol::{FrameHeader, FrameKind, Writer, unix};
use log::{debug, info, warn};
use thiserror::Error;

use crate::Config;
use crate::account::Account;
use crate::backend::{Backend, BackendError, Fail, FrameData, MigrationError, TeardownReport};
use crate::opencl::OpenClBackend;
use crate::output::HostOutput;
use crate::window::WindowMap;

/// Most guest threads one session may call from at once.
pub const MAX_CHANNELS: usize = 64;
/// Requests queued per guest thread before the session stops reading.
const CHANNEL_DEPTH: usize = 16;

/// Errors that end a session.
#[derive(Debug, Error)]
pub enum ServerError {
    #[error("session socket failed")]
    Io(#[from] std::io::Error),
    #[error("bad hello from hira-vhost: {0}")]
    Hello(String),
    #[error("cannot map the data window")]
    Window(#[from] crate::window::WindowError),
    #[error("{0}")]
    Backend(#[from] BackendError),
}

/// A frame as read from the socket.
#[derive(Debug)]
struct Frame {
    header: FrameHeader,
    body: Vec<u8>,
}

/// Bytes read from the guest at a time.
const INPUT_CHUNK: usize = 64 * 1024;

/// The guest's input, cut into frames. What was read and is not yet a whole frame
/// stays here when a read is interrupted (the daemon has a message), so that a
/// migration can carry it to the next API server, which executes it first.
struct Input<R> {
    src: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// A frame larger than the buffer, being read straight into its body.
    big: Option<(FrameHeader, Vec<u8>, usize)>,
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

impl<R: Read> Input<R> {
    /// Input from `src`, after the bytes `pending` (a migrated session's).
    fn new(src: R, pending: &[u8]) -> Self {
        let mut buf = vec![0u8; INPUT_CHUNK.max(pending.len())];
        buf[..pending.len()].copy_from_slice(pending);
        Input {
            src,
            buf,
            start: 0,
            end: pending.len(),
            big: None,
        }
    }

    /// What was read and not yet returned as a frame.
    fn pending(&self) -> Vec<u8> {
        let mut v = Vec::new();
        if let Some((h, body, filled)) = &self.big {
            v.extend_from_slice(&h.encode());
            v.extend_from_slice(&body[..*filled]);
        }
        v.extend_from_slice(&self.buf[self.start..self.end]);
        v
    }

    /// Reads until at least `n` bytes are buffered (`n` fits the buffer). `false` at
    /// the end of the input.
    fn fill(&mut self, n: usize) -> std::io::Result<bool> {
        if self.buf.len() - self.start < n {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.end - self.start < n {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// The next frame; `None` at the end of the input (a partial frame there is
    /// dropped, as the guest that sent it is gone).
    fn next(&mut self) -> std::io::Result<Option<Frame>> {
        if let Some((_, body, filled)) = &mut self.big {
            while *filled < body.len() {
                match self.src.read(&mut body[*filled..]) {
                    Ok(0) => return Ok(None),
                    Ok(k) => *filled += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let (header, body, _) = self.big.take().unwrap_or_else(|| unreachable!());
            return Ok(Some(Frame { header, body }));
        }
        if !self.fill(HEADER_LEN)? {
            return Ok(None);
        }
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
        let header = FrameHeader::decode(&hb).map_err(invalid)?;
        let total = HEADER_LEN + header.len as usize;
        if total <= self.buf.len() {
            if !self.fill(total)? {
                return Ok(None);
            }
            let body = self.buf[self.start + HEADER_LEN..self.start + total].to_vec();
            self.start += total;
            return Ok(Some(Frame { header, body }));
        }
        // Larger than the buffer: everything buffered belongs to it.
        let mut body = hira_protocol::shm::zeroed(header.len as usize);
        let have = self.end - self.start - HEADER_LEN;
        body[..have].copy_from_slice(&self.buf[self.start + HEADER_LEN..self.end]);
        self.start = 0;
        self.end = 0;
        self.big = Some((header, body, have));
        self.next()
    }
}

/// Writes whole frames to the guest (its completion ring, or the socket); shared by
/// workers and callback threads. A writer to the guest sends what the host library
/// printed ahead of each frame of the session (see [`crate::output`]).
pub struct FrameWriter {
    to: Mutex<Box<dyn Write + Send>>,
    output: Option<Arc<HostOutput>>,
}

impl std::fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameWriter")
    }
}

/// Whether a frame to the guest is part of its session (a reply, a callback), so the
/// host's output goes before it; the migration's frames on a relayed session's
/// stream are the daemon's.
fn session_frame(kind: FrameKind, opcode: u16) -> bool {
    match kind {
        FrameKind::Reply | FrameKind::Error => true,
        FrameKind::Notify => !(migrate::CAPTURE..=migrate::RESUMED).contains(&opcode),
        _ => false,
    }
}

impl FrameWriter {
    /// A writer of frames to `to`.
    pub fn new(to: impl Write + Send + 'static) -> Self {
        FrameWriter {
            to: Mutex::new(Box::new(to)),
            output: None,
        }
    }

    /// A writer of frames to the guest at `to` that sends `output` ahead of them.
    pub fn to_guest(to: impl Write + Send + 'static, output: Option<Arc<HostOutput>>) -> Self {
        FrameWriter {
            to: Mutex::new(Box::new(to)),
            output,
        }
    }

    /// Reads what the host library printed so far, for the next frame to take along:
    /// after a call that may have made it print.
    pub fn collect_output(&self) {
        if let Some(o) = &self.output {
            o.collect();
        }
    }

    /// Sends one frame with `payload`.
    pub fn send(&self, kind: FrameKind, opcode: u16, channel: u32, call_id: u64, payload: &[u8]) {
        let header = FrameHeader::new(kind, opcode, channel, call_id, payload.len());
        let mut s = self.to.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = &self.output
            && session_frame(kind, opcode)
        {
            o.flush(|op, p| {
                let h = FrameHeader::new(FrameKind::Notify, op, channel, 0, p.len());
                if let Err(e) = frame::write_parts(&mut *s, &[&h.encode(), p]) {
                    debug!("cannot send output to the guest: {e}");
                }
            });
        }
        let res = frame::write_parts(&mut *s, &[&header.encode(), payload]);
        if let Err(e) = res {
            debug!("cannot send to the guest: {e}");
        }
    }
}

/// What the daemon hands a server that takes over a migrated session: the snapshot
/// and, for host-local rings, the guest's region and eventfds.
struct Adopt {
    snapshot: OwnedFd,
    rings: Vec<OwnedFd>,
    /// The host device to move the session to (the `ADOPT` payload: a `u32` index;
    /// empty: the devices it used).
    device: Option<u32>,
}

/// Receives the `Hello` hira-vhost forwards, with the window fd if the guest sent one,
/// and before it, for a migrated session, what to adopt.
fn receive_hello(
    s: &mut UnixStream,
) -> Result<(Option<Adopt>, Hello, Option<OwnedFd>), ServerError> {
    let (mut header, mut payload, mut fds) =
        unix::recv_frame_with_fds(s).map_err(|e| ServerError::Hello(e.to_string()))?;
    let mut adopt = None;
    if header.kind == FrameKind::Notify && header.opcode == migrate::ADOPT {
        let mut it = fds.into_iter();
        let snapshot = it
            .next()
            .ok_or_else(|| ServerError::Hello("adopt without a snapshot".into()))?;
        let device = match payload.len() {
            0 => None,
            4 => Some(u32::from_le_bytes(
                payload[..4].try_into().unwrap_or_default(),
            )),
            _ => return Err(ServerError::Hello("malformed adopt".into())),
        };
        adopt = Some(Adopt {
            snapshot,
            rings: it.collect(),
            device,
        });
        (header, payload, fds) =
            unix::recv_frame_with_fds(s).map_err(|e| ServerError::Hello(e.to_string()))?;
    }
    if header.kind != FrameKind::Hello {
        return Err(ServerError::Hello(format!(
            "first frame is {:?}",
            header.kind
        )));
    }
    if fds.len() > 1 {
        return Err(ServerError::Hello("more than one window".into()));
    }
    let hello = Hello::decode(&payload).map_err(|e| ServerError::Hello(e.to_string()))?;
    Ok((adopt, hello, fds.into_iter().next()))
}

/// How long the API server spins on an empty submission ring (or a full completion
/// ring) before it sleeps: a guest that calls in a loop is served without a wake-up.
const RING_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// The submission ring as a byte stream: the end of the session reads as the end of
/// the stream.
struct Submissions(hira_ring::Consumer);

impl Read for Submissions {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.0.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
            r => r,
        }
    }
}

/// The data plane of a guest that asked for rings: this side's ends, and for a
/// host-local guest the region and eventfds to hand it (through the daemon, with the
/// `Welcome`).
struct Rings {
    ends: hira_ring::Ends,
    handoff: Option<(OwnedFd, Vec<OwnedFd>)>,
}

/// Host-local rings: a fresh memfd region and eventfds.
fn setup_rings(live: &UnixStream) -> std::io::Result<Rings> {
    use std::os::fd::AsRawFd;
    let (ends, region_fd, eventfds) = hira_ring::new_server_rings(live.as_raw_fd())?;
    Ok(Rings {
        ends,
        handoff: Some((region_fd, eventfds)),
    })
}

/// A migrated session's host-local rings, as the guest has them: both sides go on
/// from the positions the region holds.
fn adopt_rings(fds: Vec<OwnedFd>, live: &UnixStream) -> std::io::Result<Rings> {
    use std::os::fd::AsRawFd;
    Ok(Rings {
        ends: hira_ring::adopt_server_rings(fds, live.as_raw_fd())?,
        handoff: None,
    })
}

/// A VM guest's rings: at `offset` of the VM's shared window, where the daemon put
/// them, woken by doorbell frames on the socket to the daemon.
fn setup_vm_rings(
    window: &OwnedFd,
    offset: u64,
    live: &UnixStream,
    adopted: bool,
) -> std::io::Result<Rings> {
    use std::os::fd::AsRawFd;
    let region = hira_ring::Region::map_at(window, offset, hira_ring::DEFAULT_CAPACITY, false)?;
    if !adopted {
        // The slot may hold an earlier session's rings.
        region.reset();
    }
    Ok(Rings {
        ends: hira_ring::server_ends_vm(Arc::new(region), live.as_raw_fd()),
        handoff: None,
    })
}

/// Runs one session to its end and releases what the guest left behind.
///
/// The socket from hira-vhost carries the handshake and, at the end, the teardown
/// report. The guest's frames travel on the same socket (relayed by the daemon), or,
/// when the guest asked for them, on shared-memory rings straight to this process.
pub fn run(config: Config) -> Result<Outcome, ServerError> {
    let mut control = UnixStream::from(config.socket);
    let (mut adopt, hello, window_fd) = receive_hello(&mut control)?;
    let control_writer = FrameWriter::new(control.try_clone()?);
    let window = match &window_fd {
        Some(fd) => Some(WindowMap::map(fd, hello.window_len, hello.window_offset)?),
        None => None,
    };
    let adopted_rings = adopt
        .as_mut()
        .map(|a| std::mem::take(&mut a.rings))
        .filter(|r| !r.is_empty());
    let rings = match (&window_fd, hello.rings, hello.ring_offset) {
        (_, false, _) => None,
        (Some(fd), true, offset) if offset > 0 => {
            Some(setup_vm_rings(fd, offset, &control, adopt.is_some()))
        }
        (_, true, _) => Some(match adopted_rings {
            Some(fds) => adopt_rings(fds, &control),
            None => setup_rings(&control),
        }),
    };
    let rings = rings.and_then(|r| {
        r.inspect_err(|e| warn!("no rings, frames go through hira-vhost: {e}"))
            .ok()
    });
    let on_rings = rings.is_some();
    drop(window_fd);
    let (writer, reader, handoff): (Arc<FrameWriter>, Box<dyn Read + Send>, _) = match rings {
        Some(mut r) => {
            r.ends.consumer.set_spin(RING_SPIN);
            r.ends.producer.set_spin(RING_SPIN);
            (
                Arc::new(FrameWriter::to_guest(
                    r.ends.producer,
                    config.output.clone(),
                )),
                Box::new(Submissions(r.ends.consumer)),
                r.handoff,
            )
        }
        None => (
            Arc::new(FrameWriter::to_guest(
                control.try_clone()?,
                config.output.clone(),
            )),
            Box::new(control.try_clone()?),
            None,
        ),
    };
    let made = if hello.api == hira_apis_opencl::API {
        OpenClBackend::new(
            config.platform.as_deref(),
            writer.clone(),
            Arc::new(Account::new(config.vm_page, config.usage.clone())),
        )
        .map(|b| Arc::new(b) as Arc<dyn Backend>)
    } else if hello.api == hira_apis_cuda::API {
        crate::cuda::CudaBackend::new(Arc::new(Account::new(config.vm_page, config.usage.clone())))
            .map(|b| Arc::new(b) as Arc<dyn Backend>)
    } else {
        Err(BackendError::NoBackend(hello.api.to_string()))
    };
    let backend = match made {
        Ok(b) => b,
        Err(e) => {
            refuse(&control_writer, &e.to_string());
            return Err(ServerError::Backend(e));
        }
    };
    // A migrated session: its objects come back before anything of the guest runs.
    let restoring = std::time::Instant::now();
    let pending = match adopt {
        Some(a) => match read_snapshot(a.snapshot)
            .and_then(|b| backend.restore(&b, a.device, window.as_ref()))
        {
            Ok(p) => {
                info!(
                    "session {}: restored from a snapshot in {:?} ({:?} after this process started)",
                    config.session,
                    restoring.elapsed(),
                    config.started.elapsed()
                );
                p
            }
            Err(e) => {
                let e = BackendError::Restore(e);
                refuse(&control_writer, &e.to_string());
                return Err(ServerError::Backend(e));
            }
        },
        None => Vec::new(),
    };
    info!(
        "session {}: {} (pid {}), window {} bytes, {}",
        config.session,
        hello.process_name,
        hello.pid,
        window.as_ref().map_or(0, WindowMap::len),
        if on_rings {
            "shared-memory rings"
        } else {
            "frames through hira-vhost"
        }
    );
    let welcome = Welcome {
        version: hira_protocol::handshake::VERSION,
        session: config.session,
        vm_name: String::new(),
        window_len: window.as_ref().map_or(0, |w| w.len() as u64),
        window_offset: 0,
        ring_capacity: if on_rings {
            hira_ring::DEFAULT_CAPACITY as u64
        } else {
            0
        },
        ring_offset: if on_rings { hello.ring_offset } else { 0 },
        // The daemon gives the guest its token and keeps a relayed stream.
        token: [0; 16],
        resend: false,
        taken: 0,
    }
    .encode();
    let header = FrameHeader::new(FrameKind::Welcome, 0, 0, 0, welcome.len());
    let fds: Vec<&OwnedFd> = handoff
        .iter()
        .flat_map(|(region, efds)| std::iter::once(region).chain(efds.iter()))
        .collect();
    unix::send_frame_with_fds(&mut control.try_clone()?, &header, &welcome, &fds)?;
    drop(handoff);
    let window = Arc::new(window);
    // The window stays mapped until the process exits: the host may still be writing
    // the output of a non-blocking read into it while objects are released.
    std::mem::forget(window.clone());
    let mut input = Input::new(reader, &pending);
    let control = on_rings.then_some(&mut control);
    let moved = serve(
        &mut input,
        backend.clone(),
        writer.clone(),
        window,
        config.usage.as_deref(),
        control.map(|c| (c, &control_writer)),
    )?;
    if moved {
        // The session's objects live in the next API server now; nothing is released.
        info!("session {}: moved to another API server", config.session);
        return Ok(Outcome::Moved);
    }
    let report = backend.teardown();
    // The daemon keeps reading until this process exits, for this report.
    let payload = TeardownPayload {
        released: report.released as u64,
        failed: report.failed as u64,
    };
    control_writer.send(FrameKind::Notify, TEARDOWN_REPORT, 0, 0, &payload.encode());
    Ok(Outcome::Ended(report))
}

/// How a session ended in this API server.
#[derive(Debug)]
pub enum Outcome {
    /// The guest went away; what it held was released.
    Ended(TeardownReport),
    /// The session migrated to another API server.
    Moved,
}

/// The snapshot the daemon handed over, in a memfd.
fn read_snapshot(fd: OwnedFd) -> Result<Vec<u8>, MigrationError> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::from(fd);
    let len = f.metadata().map_err(MigrationError::Read)?.len();
    let len = usize::try_from(len)
        .map_err(|_| MigrationError::Read(std::io::ErrorKind::FileTooLarge.into()))?;
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, 0).map_err(MigrationError::Read)?;
    Ok(v)
}

/// Most time a capture waits for calls already read to finish.
const QUIESCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What became of a session asked to migrate.
enum Migration {
    /// It moved to another API server.
    Moved,
    /// It goes on here, where it stopped.
    Stays,
    /// The daemon closed the socket: the session is over.
    Over,
}

/// Waits until the calls already read have finished.
fn quiesce(workers: &HashMap<u32, Worker>) -> Result<(), MigrationError> {
    let started = std::time::Instant::now();
    while workers
        .values()
        .any(|w| w.pending.load(Ordering::Acquire) > 0)
    {
        if started.elapsed() > QUIESCE_LIMIT {
            return Err(MigrationError::CallsBusy);
        }
        std::thread::yield_now();
    }
    Ok(())
}

/// A relayed session's capture: the snapshot goes back in pieces on the stream,
/// then the verdict comes in it.
fn migration_inline<R: Read>(
    input: &mut Input<R>,
    writer: &FrameWriter,
    workers: &HashMap<u32, Worker>,
    backend: &dyn Backend,
) -> Result<Migration, ServerError> {
    let started = std::time::Instant::now();
    match quiesce(workers).and_then(|()| backend.capture(input.pending())) {
        Ok(bytes) => {
            for piece in bytes.chunks(migrate::DATA_PIECE) {
                writer.send(FrameKind::Notify, migrate::DATA, 0, 0, piece);
            }
            let len = bytes.len() as u64;
            info!(
                "captured the session ({len} bytes) in {:?}",
                started.elapsed()
            );
            writer.send(
                FrameKind::Notify,
                migrate::CAPTURED,
                0,
                0,
                &len.to_le_bytes(),
            );
        }
        Err(m) => {
            warn!("cannot capture the session: {m}");
            writer.send(
                FrameKind::Notify,
                migrate::FAILED,
                0,
                0,
                m.to_string().as_bytes(),
            );
            return Ok(Migration::Stays);
        }
    }
    match input.next() {
        Ok(Some(f)) if f.header.kind == FrameKind::Notify && f.header.opcode == migrate::COMMIT => {
            Ok(Migration::Moved)
        }
        Ok(Some(f)) if f.header.kind == FrameKind::Notify && f.header.opcode == migrate::ABORT => {
            info!("the migration was abandoned; serving on");
            Ok(Migration::Stays)
        }
        Ok(Some(f)) => Err(ServerError::Hello(format!(
            "unexpected frame during a migration: {:?} {:#x}",
            f.header.kind, f.header.opcode
        ))),
        Ok(None) => Ok(Migration::Over),
        Err(e) => Err(e.into()),
    }
}

/// The daemon's message while the guest's input waits: a migration's capture.
fn migration<R: Read>(
    control: &mut UnixStream,
    to_daemon: &FrameWriter,
    input: &Input<R>,
    workers: &HashMap<u32, Worker>,
    backend: &dyn Backend,
) -> Result<Migration, ServerError> {
    use std::os::unix::fs::FileExt;
    let (h, _, fds) = match unix::recv_frame_with_fds(control) {
        Ok(f) => f,
        Err(unix::UnixFrameError::Closed) => return Ok(Migration::Over),
        Err(e) => return Err(ServerError::Hello(e.to_string())),
    };
    if h.kind != FrameKind::Notify || h.opcode != migrate::CAPTURE || fds.len() != 1 {
        return Err(ServerError::Hello(format!(
            "unexpected message from hira-vhost: {:?} {:#x}",
            h.kind, h.opcode
        )));
    }
    let started = std::time::Instant::now();
    // Calls read before the capture finish first; nothing new is read.
    let captured = quiesce(workers).and_then(|()| backend.capture(input.pending()));
    let captured = captured.and_then(|bytes| {
        let f = std::fs::File::from(fds.into_iter().next().unwrap_or_else(|| unreachable!()));
        f.write_all_at(&bytes, 0)
            .map(|()| bytes.len() as u64)
            .map_err(MigrationError::Write)
    });
    match captured {
        Ok(len) => {
            info!(
                "captured the session ({len} bytes) in {:?}",
                started.elapsed()
            );
            to_daemon.send(
                FrameKind::Notify,
                migrate::CAPTURED,
                0,
                0,
                &len.to_le_bytes(),
            );
        }
        Err(m) => {
            warn!("cannot capture the session: {m}");
            to_daemon.send(
                FrameKind::Notify,
                migrate::FAILED,
                0,
                0,
                m.to_string().as_bytes(),
            );
            return Ok(Migration::Stays);
        }
    }
    // The daemon's verdict: the next server took over, or it could not. (A VM
    // guest's doorbells, which the daemon relays on this socket, may come first.)
    let verdict = loop {
        match unix::recv_frame_with_fds(control) {
            Ok((h, _, _)) if h.kind == FrameKind::Notify && h.opcode == DOORBELL => {}
            other => break other,
        }
    };
    match verdict {
        Ok((h, _, _)) if h.kind == FrameKind::Notify && h.opcode == migrate::COMMIT => {
            Ok(Migration::Moved)
        }
        Ok((h, _, _)) if h.kind == FrameKind::Notify && h.opcode == migrate::ABORT => {
            info!("the migration was abandoned; serving on");
            Ok(Migration::Stays)
        }
        Ok((h, _, _)) => Err(ServerError::Hello(format!(
            "unexpected message from hira-vhost: {:?} {:#x}",
            h.kind, h.opcode
        ))),
        Err(unix::UnixFrameError::Closed) => Ok(Migration::Over),
        Err(e) => Err(ServerError::Hello(e.to_string())),
    }
}

fn refuse(writer: &FrameWriter, message: &str) {
    crate::sandbox::log_refused();
    let e = ErrorPayload {
        code: error_code::HANDSHAKE,
        message: message.to_string(),
    };
    writer.send(FrameKind::Error, 0, 0, 0, &e.encode());
}

struct Worker {
    jobs: SyncSender<Frame>,
    thread: JoinHandle<()>,
    /// Requests sent to the worker and not yet answered.
    pending: Arc<AtomicUsize>,
}

/// Executes requests until hira-vhost closes the socket (`false`) or the session
/// migrates away (`true`). `control`: the socket to hira-vhost and a writer on it,
/// for a session whose input comes on rings (messages from the daemon then interrupt
/// the input).
fn serve<R: Read>(
    input: &mut Input<R>,
    backend: Arc<dyn Backend>,
    writer: Arc<FrameWriter>,
    window: Arc<Option<WindowMap>>,
    usage: Option<&UsagePage>,
    mut control: Option<(&mut UnixStream, &FrameWriter)>,
) -> Result<bool, ServerError> {
    let rejected = || {
        if let Some(u) = usage {
            u.rejected();
        }
    };
    let mut inline_channel: Option<u32> = None;
    let mut workers: HashMap<u32, Worker> = HashMap::new();
    let mut reply = Writer::with_capacity(4096);
    let spawn = |id: u32| -> std::io::Result<Worker> {
        // Bounded: a guest that stops reading replies stalls its workers, then this
        // reader, then its own socket; nothing queues without limit.
        let (tx, rx) = sync_channel::<Frame>(CHANNEL_DEPTH);
        let (backend, writer, window) = (backend.clone(), writer.clone(), window.clone());
        let pending = Arc::new(AtomicUsize::new(0));
        let done = pending.clone();
        let thread = std::thread::Builder::new()
            .name(format!("channel-{id}"))
            .spawn(move || {
                let mut reply = Writer::with_capacity(4096);
                for f in rx {
                    execute(&*backend, &writer, (*window).as_ref(), &f, &mut reply);
                    done.fetch_sub(1, Ordering::AcqRel);
                }
            })?;
        Ok(Worker {
            jobs: tx,
            thread,
            pending,
        })
    };
    let send = |w: &Worker, f: Frame| {
        w.pending.fetch_add(1, Ordering::AcqRel);
        if w.jobs.send(f).is_err() {
            w.pending.fetch_sub(1, Ordering::AcqRel);
        }
    };
    let mut moved = false;
    loop {
        let f = match input.next() {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let Some((c, to_daemon)) = control.as_mut() else {
                    break;
                };
                match migration(c, to_daemon, input, &workers, &*backend)? {
                    Migration::Moved => {
                        moved = true;
                        break;
                    }
                    Migration::Stays => continue,
                    Migration::Over => break,
                }
            }
            Err(e) => {
                // A frame that cannot be decoded (or a corrupt ring) loses the
                // framing: the session ends, with a word to the guest on why.
                warn!("the guest's frames failed: {e}; ending the session");
                if e.kind() == std::io::ErrorKind::InvalidData {
                    let m = format!("malformed frame or ring: {e}");
                    let e = ErrorPayload {
                        code: error_code::MALFORMED,
                        message: m,
                    };
                    writer.send(FrameKind::Error, 0, 0, 0, &e.encode());
                }
                break;
            }
        };
        // A relayed session's migration comes in its stream, from the daemon (which
        // forwards only requests from the guest).
        if control.is_none()
            && f.header.kind == FrameKind::Notify
            && f.header.opcode == migrate::CAPTURE
        {
            match migration_inline(input, &writer, &workers, &*backend)? {
                Migration::Moved => {
                    moved = true;
                    break;
                }
                Migration::Stays => continue,
                Migration::Over => break,
            }
        }
        // What the daemon checked when it relayed frames is checked here, where
        // frames arrive straight from the guest.
        if f.header.kind != FrameKind::Request {
            let m = format!("guests may only send requests, not {:?}", f.header.kind);
            warn!("{m}");
            rejected();
            error_reply(&writer, &f.header, error_code::MALFORMED, &m);
            continue;
        }
        if f.header.no_reply() && backend.may_async(f.header.opcode) == Some(false) {
            warn!(
                "{} may not be forwarded asynchronously; dropped",
                backend.name(f.header.opcode)
            );
            rejected();
            continue;
        }
        if let Some(u) = usage {
            u.command(f.header.opcode, u64::from(f.header.len));
        }
        let channel = f.header.channel;
        if inline_channel.is_none_or(|c| c == channel) && workers.len() <= 1 {
            inline_channel = Some(channel);
            // One guest thread: its calls run here, without a thread hop, except those
            // that may wait for the guest (another thread of the guest could be about
            // to set the user event, and this thread must stay free to read its
            // request); after one of those, calls run here again once the worker has
            // finished.
            let worker_idle = workers
                .get(&channel)
                .is_none_or(|w| w.pending.load(Ordering::Acquire) == 0);
            if worker_idle && !backend.may_wait_on_guest(f.header.opcode) {
                execute(&*backend, &writer, (*window).as_ref(), &f, &mut reply);
                continue;
            }
            let w = match workers.entry(channel) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(spawn(channel)?),
            };
            send(w, f);
            continue;
        }
        if let Some(first) = inline_channel.take()
            && !workers.contains_key(&first)
        {
            // A second guest thread: from now on each channel has a worker.
            workers.insert(first, spawn(first)?);
        }
        if !workers.contains_key(&channel) {
            if workers.len() >= MAX_CHANNELS {
                rejected();
                error_reply(
                    &writer,
                    &f.header,
                    error_code::POLICY,
                    "too many guest threads",
                );
                continue;
            }
            workers.insert(channel, spawn(channel)?);
        }
        if let Some(w) = workers.get(&channel) {
            send(w, f);
        }
    }
    if !moved {
        backend.guest_gone();
    }
    for (_, w) in workers.drain() {
        drop(w.jobs);
        let _ = w.thread.join();
    }
    Ok(moved)
}

fn error_reply(writer: &FrameWriter, h: &FrameHeader, code: u32, message: &str) {
    if h.no_reply() {
        return;
    }
    let e = ErrorPayload {
        code,
        message: message.to_string(),
    };
    writer.send(
        FrameKind::Error,
        h.opcode,
        h.channel,
        h.call_id,
        &e.encode(),
    );
}

/// Executes one request and sends its reply.
fn execute(
    backend: &dyn Backend,
    writer: &FrameWriter,
    window: Option<&WindowMap>,
    f: &Frame,
    reply: &mut Writer,
) {
    let h = &f.header;
    let window_len = window.map_or(0, |w| w.len() as u64);
    let span_bytes = h.span_count as usize * SPAN_LEN;
    let spans = match frame::decode_spans(&f.body[..span_bytes], h.span_count as usize, window_len)
    {
        Ok(s) => s,
        Err(e) => {
            warn!("{}: {e}", backend.name(h.opcode));
            return error_reply(writer, h, error_code::BAD_SPAN, &e.to_string());
        }
    };
    let data = FrameData {
        spans: &spans,
        window,
        no_reply: h.no_reply(),
    };
    reply.clear();
    let res = backend.execute(h.opcode, &f.body[span_bytes..], &data, reply);
    crate::sandbox::log_refused();
    if !h.no_reply() && backend.may_print(h.opcode) {
        writer.collect_output();
    }
    if h.no_reply() {
        let status = match &res {
            Ok(()) => reply
                .as_slice()
                .get(..4)
                .map_or(0, |b| i32::from_le_bytes(b.try_into().unwrap_or_default())),
            Err(Fail::Status(s)) => *s,
            Err(e) => {
                warn!("asynchronous {} rejected: {e}", backend.name(h.opcode));
                return;
            }
        };
        if status != 0 {
            debug!(
                "asynchronous {} failed with status {status}; telling the guest",
                backend.name(h.opcode)
            );
            let failure = AsyncFailure {
                opcode: h.opcode,
                status,
            };
            writer.send(
                FrameKind::Notify,
                ASYNC_FAILURE,
                h.channel,
                0,
                &failure.encode(),
            );
        }
        return;
    }
    match res {
        Ok(()) => writer.send(
            FrameKind::Reply,
            h.opcode,
            h.channel,
            h.call_id,
            reply.as_slice(),
        ),
        Err(Fail::Status(s)) => writer.send(
            FrameKind::Reply,
            h.opcode,
            h.channel,
            h.call_id,
            &s.to_le_bytes(),
        ),
        Err(e) => {
            warn!("{}: {e}", backend.name(h.opcode));
            let code = match e {
                Fail::UnknownOpcode(_) => error_code::UNKNOWN_OPCODE,
                _ => error_code::MALFORMED,
            };
            error_reply(writer, h, code, &e.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u16, body: &[u8]) -> Vec<u8> {
        let mut v = FrameHeader::new(FrameKind::Request, opcode, 1, 1, body.len())
            .encode()
            .to_vec();
        v.extend_from_slice(body);
        v
    }

    /// A source that hands out its bytes in the given pieces, then reports
    /// `WouldBlock` (the daemon has a message) once, then the rest.
    struct Pieces(std::collections::VecDeque<Option<Vec<u8>>>);

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match self.0.pop_front() {
                None => Ok(0),
                Some(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                Some(Some(mut p)) => {
                    let n = p.len().min(buf.len());
                    buf[..n].copy_from_slice(&p[..n]);
                    if n < p.len() {
                        self.0.push_front(Some(p.split_off(n)));
                    }
                    Ok(n)
                }
            }
        }
    }

    #[test]
    fn input_interrupted_mid_frame_keeps_what_it_read_for_the_next_server() {
        let small = frame(7, b"hello");
        let big = frame(9, &vec![0xAB; INPUT_CHUNK + 1000]);
        let mut all = small.clone();
        all.extend_from_slice(&big);
        for cut in [3, small.len() + 10, small.len() + INPUT_CHUNK / 2] {
            let pieces = vec![Some(all[..cut].to_vec()), None, Some(all[cut..].to_vec())];
            let mut input = Input::new(Pieces(pieces.into()), &[]);
            let mut got = Vec::new();
            let pending = loop {
                match input.next() {
                    Ok(Some(f)) => got.push(f.header.opcode),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        break input.pending();
                    }
                    other => panic!("{other:?}"),
                }
            };
            // A new server starts from the pending bytes, then reads on.
            let mut next = Input::new(Pieces(vec![Some(all[cut..].to_vec())].into()), &pending);
            while let Some(f) = next.next().unwrap() {
                got.push(f.header.opcode);
                if f.header.opcode == 9 {
                    assert_eq!(f.body.len(), INPUT_CHUNK + 1000);
                    assert!(f.body.iter().all(|&b| b == 0xAB));
                }
            }
            assert_eq!(got, [7, 9], "cut at {cut}");
        }
    }

    use crate::null::{ECHO, FAIL, FAILED, NullBackend, SYNC_ONLY, Sink};
    use hira_protocol::frame::FLAG_NO_REPLY;

    fn request(opcode: u16, channel: u32, call_id: u64, body: &[u8], no_reply: bool) -> Vec<u8> {
        let mut h = FrameHeader::new(FrameKind::Request, opcode, channel, call_id, body.len());
        if no_reply {
            h.flags = FLAG_NO_REPLY;
        }
        let mut v = h.encode().to_vec();
        v.extend_from_slice(body);
        v
    }

    /// Runs the session loop over `input` on a null backend until the input ends;
    /// returns the backend and the frames sent to the guest.
    fn serve_null(input: Vec<u8>) -> (Arc<NullBackend>, Vec<(FrameHeader, Vec<u8>)>) {
        let backend = Arc::new(NullBackend::default());
        let sink = Sink::default();
        let writer = Arc::new(FrameWriter::new(sink.clone()));
        let mut input = Input::new(std::io::Cursor::new(input), &[]);
        let moved = serve(
            &mut input,
            backend.clone(),
            writer,
            Arc::new(None),
            None,
            None,
        )
        .unwrap();
        assert!(!moved);
        assert!(
            backend.gone.load(Ordering::Acquire),
            "guest_gone not called"
        );
        (backend, sink.frames())
    }

    fn error_code_of(body: &[u8]) -> u32 {
        ErrorPayload::decode(body).unwrap().code
    }

    #[test]
    fn requests_are_answered_in_order_with_their_call_ids() {
        let mut input = request(ECHO, 1, 10, b"a", false);
        input.extend(request(FAIL, 1, 11, b"", false));
        input.extend(request(ECHO, 1, 12, b"bc", false));
        let (backend, frames) = serve_null(input);
        assert_eq!(backend.opcodes(), [ECHO, FAIL, ECHO]);
        let got: Vec<_> = frames
            .iter()
            .map(|(h, b)| (h.kind, h.opcode, h.call_id, b.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    FrameKind::Reply,
                    ECHO,
                    10,
                    [&0i32.to_le_bytes()[..], b"a"].concat()
                ),
                (FrameKind::Reply, FAIL, 11, FAILED.to_le_bytes().to_vec()),
                (
                    FrameKind::Reply,
                    ECHO,
                    12,
                    [&0i32.to_le_bytes()[..], b"bc"].concat()
                ),
            ]
        );
        // Tearing down is the caller's step, after the loop.
        assert_eq!(backend.teardowns.load(Ordering::Acquire), 0);
    }

    #[test]
    fn frames_other_than_requests_are_refused_and_the_session_goes_on() {
        let mut input = FrameHeader::new(FrameKind::Reply, ECHO, 1, 5, 0)
            .encode()
            .to_vec();
        input.extend(request(ECHO, 1, 6, b"x", false));
        let (backend, frames) = serve_null(input);
        assert_eq!(backend.opcodes(), [ECHO]);
        assert_eq!(frames.len(), 2);
        assert_eq!(
            (frames[0].0.kind, frames[0].0.call_id),
            (FrameKind::Error, 5)
        );
        assert_eq!(error_code_of(&frames[0].1), error_code::MALFORMED);
        assert_eq!(
            (frames[1].0.kind, frames[1].0.call_id),
            (FrameKind::Reply, 6)
        );
    }

    #[test]
    fn a_call_that_must_be_answered_is_dropped_when_sent_without_a_reply() {
        let mut input = request(SYNC_ONLY, 1, 0, b"", true);
        input.extend(request(SYNC_ONLY, 1, 7, b"", false));
        let (backend, frames) = serve_null(input);
        assert_eq!(backend.opcodes(), [SYNC_ONLY], "the asynchronous one ran");
        assert_eq!(frames.len(), 1);
        assert_eq!(
            (frames[0].0.kind, frames[0].0.call_id),
            (FrameKind::Reply, 7)
        );
    }

    #[test]
    fn asynchronous_calls_report_only_their_failures() {
        let mut input = request(ECHO, 1, 0, b"quiet", true);
        input.extend(request(FAIL, 1, 0, b"", true));
        let (backend, frames) = serve_null(input);
        assert_eq!(backend.opcodes(), [ECHO, FAIL]);
        assert_eq!(frames.len(), 1, "{frames:?}");
        let (h, body) = &frames[0];
        assert_eq!((h.kind, h.opcode), (FrameKind::Notify, ASYNC_FAILURE));
        assert_eq!(
            AsyncFailure::decode(body).unwrap(),
            AsyncFailure {
                opcode: FAIL,
                status: FAILED
            }
        );
    }

    #[test]
    fn an_unknown_opcode_is_answered_with_its_own_error() {
        let (backend, frames) = serve_null(request(999, 1, 3, b"", false));
        assert!(backend.opcodes().is_empty());
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].0.kind, FrameKind::Error);
        assert_eq!(error_code_of(&frames[0].1), error_code::UNKNOWN_OPCODE);
    }

    #[test]
    fn guest_threads_beyond_the_limit_are_refused_and_the_others_served() {
        let channels = MAX_CHANNELS as u32 + 1;
        let input: Vec<u8> = (1..=channels)
            .flat_map(|c| request(ECHO, c, u64::from(c), &c.to_le_bytes(), false))
            .collect();
        let (backend, frames) = serve_null(input);
        assert_eq!(backend.opcodes().len(), MAX_CHANNELS);
        let mut replied: Vec<u32> = frames
            .iter()
            .filter(|(h, _)| h.kind == FrameKind::Reply)
            .map(|(h, b)| {
                assert_eq!(b[4..], h.channel.to_le_bytes(), "reply on another channel");
                h.channel
            })
            .collect();
        replied.sort_unstable();
        assert_eq!(replied, (1..channels).collect::<Vec<_>>());
        let refused: Vec<_> = frames
            .iter()
            .filter(|(h, _)| h.kind == FrameKind::Error)
            .map(|(h, b)| (h.channel, error_code_of(b)))
            .collect();
        assert_eq!(refused, [(channels, error_code::POLICY)]);
    }

    #[test]
    fn a_frame_that_cannot_be_decoded_ends_the_session_with_the_reason() {
        let mut input = request(ECHO, 1, 1, b"", false);
        let mut bad = request(ECHO, 1, 2, b"", false);
        bad[4] = 0xEE; // no such frame kind
        input.extend(bad);
        input.extend(request(ECHO, 1, 3, b"", false));
        let (backend, frames) = serve_null(input);
        assert_eq!(backend.opcodes(), [ECHO], "a call after the bad frame ran");
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].0.kind, FrameKind::Error);
        assert_eq!(error_code_of(&frames[1].1), error_code::MALFORMED);
    }
}
