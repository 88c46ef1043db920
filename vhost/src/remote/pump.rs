//! Moves one session's bytes between a local stream (the guest's connection on a VM
//! host; the session's socket pair on a GPU host) and its TLS connection, both ways,
//! on one thread.
//!
//! rustls keeps one state machine per connection, so the two directions share it
//! under `poll(2)` rather than running as two blocking threads. Each direction
//! holds at most one read's worth of bytes: the local side is read only once the TLS
//! records before are written to the socket, and the TLS side only once the local
//! stream took the plaintext before. A slow reader on either end therefore holds up
//! its own session's sender and nothing else.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use std::collections::VecDeque;

use hira_protocol::frame::HEADER_LEN;
use hira_protocol::resend;
use hira_protocol::{FrameHeader, FrameKind};

/// Bytes read from either side at once.
const CHUNK: usize = 256 * 1024;

/// A session's TLS connection and its socket.
#[derive(Debug)]
pub struct TlsLink {
    pub conn: rustls::Connection,
    pub tcp: TcpStream,
}

impl TlsLink {
    /// Writes `data` and the records it makes, blocking (the exchange before the
    /// pump).
    pub fn write_all(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            // rustls takes what its buffer holds; the records go before the rest.
            let n = self.conn.writer().write(data)?;
            data = &data[n..];
            while self.conn.wants_write() {
                self.conn.write_tls(&mut self.tcp)?;
            }
        }
        Ok(())
    }
}

impl Read for TlsLink {
    /// Blocks until some plaintext is there; 0 at the peer's end.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if self.conn.read_tls(&mut self.tcp)? == 0 {
                        return Ok(0);
                    }
                    let state = self.conn.process_new_packets();
                    while self.conn.wants_write() {
                        self.conn.write_tls(&mut self.tcp)?;
                    }
                    state.map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))?;
                }
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
        }
    }
}

/// How the pump ended.
#[derive(Debug)]
pub enum End {
    /// The local side closed (or failed); the peer was told with `close_notify`.
    Local,
    /// The peer closed, or the TLS connection failed (`error`: a bad record, a
    /// reset). `at_frame` says whether the local side got whole frames only, so that
    /// one more frame can follow.
    Peer {
        at_frame: bool,
        error: Option<std::io::Error>,
    },
}

/// What a pump does with a session-level `Error` frame from the peer (call id 0,
/// its payload at most [`HELD_MAX`] bytes): takes it whole and gives the frame the
/// local side gets instead.
pub type OnSessionError<'a> = &'a mut dyn FnMut(FrameHeader, Vec<u8>) -> Vec<u8>;

/// The largest session-level error frame held whole.
const HELD_MAX: u32 = 64 * 1024;

/// The peer's stream of frames: where it stands, and a session-level error frame
/// being held whole.
#[derive(Debug, Default)]
struct PeerFrames {
    header: [u8; HEADER_LEN],
    have: usize,
    body_left: u64,
    held: Option<(FrameHeader, Vec<u8>)>,
    /// The stream is kept (`Kept`): the peer's acknowledgements are held too, and
    /// taken out of it.
    acks: bool,
    /// The count the last acknowledgement carried.
    acked: Option<u64>,
}

impl PeerFrames {
    /// Passes `bytes` from the peer on to `out`, session-level errors through
    /// `on_error`.
    fn take(&mut self, mut bytes: &[u8], out: &mut Vec<u8>, on_error: OnSessionError<'_>) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = (self.body_left.min(bytes.len() as u64)) as usize;
                match &mut self.held {
                    Some((_, p)) => p.extend_from_slice(&bytes[..n]),
                    None => out.extend_from_slice(&bytes[..n]),
                }
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                self.release(out, on_error);
                continue;
            }
            let n = (HEADER_LEN - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < HEADER_LEN {
                continue;
            }
            self.have = 0;
            match FrameHeader::decode(&self.header) {
                Ok(h)
                    if (h.kind == FrameKind::Error && h.call_id == 0 && h.len <= HELD_MAX)
                        || (self.acks && resend::is_ack(&h)) =>
                {
                    self.body_left = u64::from(h.len);
                    self.held = Some((h, Vec::with_capacity(h.len as usize)));
                    self.release(out, on_error);
                }
                Ok(h) => {
                    out.extend_from_slice(&self.header);
                    self.body_left = u64::from(h.len);
                }
                // Not a frame: passed on, and never at a boundary again.
                Err(_) => {
                    out.extend_from_slice(&self.header);
                    self.body_left = u64::MAX;
                }
            }
        }
    }

    /// Hands a held frame that is whole to `on_error` (an acknowledgement is noted
    /// and goes no further).
    fn release(&mut self, out: &mut Vec<u8>, on_error: OnSessionError<'_>) {
        if self.body_left == 0
            && let Some((h, p)) = self.held.take()
        {
            if self.acks && resend::is_ack(&h) {
                self.acked = resend::ack_count(&p).or(self.acked);
            } else {
                out.extend_from_slice(&on_error(h, p));
            }
        }
    }

    fn at_frame(&self) -> bool {
        self.have == 0 && self.body_left == 0 && self.held.is_none()
    }
}

/// Passes a session-level error frame on as it came.
pub fn unchanged(h: FrameHeader, payload: Vec<u8>) -> Vec<u8> {
    let mut f = h.encode().to_vec();
    f.extend_from_slice(&payload);
    f
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

/// Where the local side's stream of frames stands: acknowledgements go in only
/// between its frames.
#[derive(Debug, Default)]
struct LocalFrames {
    header: [u8; HEADER_LEN],
    have: usize,
    body_left: u64,
}

impl LocalFrames {
    /// How many of `bytes` finish the frame under way (all of them if they do not).
    fn step(&mut self, bytes: &[u8]) -> usize {
        let mut used = 0;
        loop {
            if self.body_left > 0 {
                let n = self.body_left.min((bytes.len() - used) as u64) as usize;
                self.body_left -= n as u64;
                return used + n;
            }
            if used == bytes.len() {
                return used;
            }
            let n = (HEADER_LEN - self.have).min(bytes.len() - used);
            self.header[self.have..self.have + n].copy_from_slice(&bytes[used..used + n]);
            self.have += n;
            used += n;
            if self.have == HEADER_LEN {
                self.have = 0;
                self.body_left =
                    FrameHeader::decode(&self.header).map_or(u64::MAX, |h| u64::from(h.len));
                if self.body_left == 0 {
                    return used;
                }
            }
        }
    }

    fn at_frame(&self) -> bool {
        self.have == 0 && self.body_left == 0
    }
}

/// A stream both ends keep until acknowledged (`hira_protocol::resend`), so that a
/// session outlives its TLS connection: what this end sent is kept until the peer
/// acknowledges it, and what it took in is counted; on a new connection each sends
/// again what the other has not taken.
#[derive(Debug, Default)]
pub struct Kept {
    bytes: VecDeque<u8>,
    /// Stream offset of the first byte kept.
    base: u64,
    sent: u64,
    /// Bytes taken in from the peer.
    pub taken: u64,
    ack_sent: u64,
    local: LocalFrames,
}

impl Kept {
    fn keep(&mut self, b: &[u8]) {
        self.bytes.extend(b);
        self.sent += b.len() as u64;
        let over = self.bytes.len().saturating_sub(resend::DAEMON_KEEPS);
        if over > 0 {
            // A cut now cannot be survived; the session goes on until one comes.
            self.bytes.drain(..over);
            self.base += over as u64;
        }
    }

    fn acknowledged(&mut self, upto: u64) {
        let drop = upto.clamp(self.base, self.sent) - self.base;
        self.bytes.drain(..drop as usize);
        self.base += drop;
    }

    /// What to send again on a new connection whose peer took `taken` bytes.
    pub fn since(&self, taken: u64) -> Result<Vec<u8>, resend::ResumeError> {
        if taken > self.sent {
            return Err(resend::ResumeError::Ahead {
                taken,
                sent: self.sent,
            });
        }
        if taken < self.base {
            return Err(resend::ResumeError::Dropped {
                taken,
                kept_from: self.base,
            });
        }
        Ok(self
            .bytes
            .iter()
            .skip((taken - self.base) as usize)
            .copied()
            .collect())
    }
}

/// One session's pump. It lives as long as the session, across its TLS connections:
/// what was on its way when one failed goes on with the next.
#[derive(Debug, Default)]
pub struct Pump {
    frames: PeerFrames,
    to_local: Vec<u8>,
    delivered: usize,
    kept: Option<Kept>,
    spin: Spin,
}

/// How long the pump looks again before it sleeps, learnt as the rings' ends learn
/// it (`hira_ring`): a call's answer usually follows within tens of microseconds,
/// and a thread that slept for it is woken on an idle CPU, which costs about as much
/// again (about 40 µs on this project's machines, `docs/benchmarks.md`) and comes
/// four times per round trip on each host. A look that found something doubles the
/// next one; one that did not halves it; below [`Spin::FLOOR`] the pump stops
/// looking but for one probe in [`Spin::PROBE_EVERY`] waits, so that an idle or
/// CPU-starved session costs nothing.
#[derive(Debug, Default)]
struct Spin {
    ns: u64,
    waits: u32,
}

impl Spin {
    const MAX: u64 = 100_000;
    const FLOOR: u64 = 2_000;
    const PROBE: u64 = 20_000;
    const PROBE_EVERY: u32 = 16;

    /// The look before the next sleep, ns (0: none).
    fn budget(&mut self) -> u64 {
        if self.ns >= Self::FLOOR {
            return self.ns;
        }
        self.waits = self.waits.wrapping_add(1);
        if self.waits.is_multiple_of(Self::PROBE_EVERY) {
            Self::PROBE
        } else {
            0
        }
    }

    fn learn(&mut self, budget: u64, found: bool) {
        self.ns = if found {
            (budget.max(Self::FLOOR) * 2).min(Self::MAX)
        } else {
            budget / 2
        };
    }
}

/// A session's local end, which the pump joins to the session's TLS connection.
pub enum Local<'a> {
    /// A socket: the guest's connection (its frames inline), or on a GPU host the
    /// socket pair to the ordinary session.
    Socket(&'a UnixStream),
    /// A host-local guest's shared-memory rings on a VM host: the pump is their
    /// host end, as an API server is a local session's. The guest's socket carries
    /// nothing more; its end (or anything sent on it) ends the session.
    Rings {
        ends: &'a mut hira_ring::Ends,
        guest: &'a UnixStream,
    },
}

impl Local<'_> {
    fn start(&self) -> std::io::Result<()> {
        match self {
            Local::Socket(s) => s.set_nonblocking(true),
            // The guest's socket is only polled.
            Local::Rings { .. } => Ok(()),
        }
    }

    /// Reads what is there: `WouldBlock` if nothing, 0 at the local side's end.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Local::Socket(s) => (&**s).read(buf),
            // What the guest put in its ring before it went still goes on.
            Local::Rings { ends, guest } => match ends.consumer.try_read(buf) {
                Err(e) if e.kind() == ErrorKind::WouldBlock && guest_gone(guest) => Ok(0),
                r => r,
            },
        }
    }

    /// Writes what fits: `WouldBlock` if nothing does.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Local::Socket(s) => (&**s).write(buf),
            Local::Rings { ends, .. } => ends.producer.try_write(buf),
        }
    }

    /// Whether a read (`read`) or a write (`write`) would do something now, for the
    /// spin before a sleep (a socket's readiness, and the guest's end, are the
    /// poll's).
    fn ready(&self, read: bool, write: bool) -> bool {
        match self {
            Local::Socket(_) => false,
            Local::Rings { ends, .. } => {
                (read && ends.consumer.ready().unwrap_or(true))
                    || (write && ends.producer.has_room().unwrap_or(true))
            }
        }
    }

    /// What to poll for, into `fds`: the socket, or the guest's socket and the
    /// rings' bells; how many entries.
    fn poll_fds(&self, read: bool, write: bool, fds: &mut [libc::pollfd]) -> usize {
        let mut n = 0;
        let mut push = |fd: std::os::fd::RawFd, events: i16| {
            fds[n] = libc::pollfd {
                fd,
                events,
                revents: 0,
            };
            n += 1;
        };
        match self {
            Local::Socket(s) => {
                let mut events = 0;
                if read {
                    events |= libc::POLLIN;
                }
                if write {
                    events |= libc::POLLOUT;
                }
                push(s.as_raw_fd(), events);
            }
            Local::Rings { ends, guest } => {
                push(guest.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP);
                if read && let Some(b) = ends.consumer.bell() {
                    push(b, libc::POLLIN);
                }
                if write && let Some(b) = ends.producer.bell() {
                    push(b, libc::POLLIN);
                }
            }
        }
        n
    }

    /// Announces a sleep on the rings' bells; whether there is something to do
    /// already (then the pump does not sleep). [`Local::awake`] follows either way.
    fn will_sleep(&self, read: bool, write: bool) -> bool {
        let Local::Rings { ends, .. } = self else {
            return false;
        };
        let data = read && ends.consumer.will_sleep().unwrap_or(true);
        let room = write && ends.producer.will_sleep().unwrap_or(true);
        data || room
    }

    fn awake(&self, read: bool, write: bool) {
        if let Local::Rings { ends, .. } = self {
            if read {
                ends.consumer.awake();
            }
            if write {
                ends.producer.awake();
            }
        }
    }

    /// Writes all of `b`, blocking.
    fn write_all_blocking(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Local::Socket(s) => {
                s.set_nonblocking(false)?;
                (&**s).write_all(b)
            }
            Local::Rings { ends, .. } => ends.producer.write_all(b),
        }
    }
}

/// Whether a guest on rings is gone: its socket hung up, or it sent something
/// there, which a guest on rings never does.
fn guest_gone(guest: &UnixStream) -> bool {
    let mut p = [libc::pollfd {
        fd: guest.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }];
    !matches!(poll_now(&mut p), Ok(0))
}

/// Polls `fds` without waiting.
fn poll_now(fds: &mut [libc::pollfd]) -> std::io::Result<i32> {
    // SAFETY: a valid array of pollfds; a zero timeout never blocks.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n)
}

/// Waits until the TLS socket or the local end may have something to do, looking
/// again for up to the learnt spin first. `tcp` is the TLS socket's entry (first in
/// `fds`); the local end adds its own.
fn wait(
    tcp: libc::pollfd,
    local: &Local<'_>,
    read: bool,
    write: bool,
    spin: &mut Spin,
) -> std::io::Result<()> {
    // The TLS socket, then at most three of the local end's.
    let mut all = [tcp; 4];
    let n = 1 + local.poll_fds(read, write, &mut all[1..]);
    let fds = &mut all[..n];
    let budget = spin.budget();
    if budget > 0 {
        let start = std::time::Instant::now();
        loop {
            if local.ready(read, write) || poll_now(fds)? > 0 {
                spin.learn(budget, true);
                return Ok(());
            }
            if start.elapsed().as_nanos() as u64 >= budget {
                spin.learn(budget, false);
                break;
            }
            std::hint::spin_loop();
        }
    }
    if !local.will_sleep(read, write) {
        // SAFETY: a valid array of pollfds; no timeout.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                local.awake(read, write);
                return Err(e);
            }
        }
    }
    local.awake(read, write);
    Ok(())
}

impl Pump {
    /// A pump that passes bytes as they are.
    pub fn plain() -> Pump {
        Pump::default()
    }

    /// A pump whose stream is kept for sending again (the peer was asked `resend`).
    pub fn kept() -> Pump {
        Pump {
            frames: PeerFrames {
                acks: true,
                ..PeerFrames::default()
            },
            kept: Some(Kept::default()),
            ..Pump::default()
        }
    }

    /// The kept stream, if any.
    pub fn kept_stream(&self) -> Option<&Kept> {
        self.kept.as_ref()
    }

    /// Whether the local side got whole frames only.
    pub fn at_frame(&self) -> bool {
        self.frames.at_frame()
    }

    /// Writes `b` from the local side to the peer, keeping it and putting an
    /// acknowledgement in between frames when one is due.
    fn send_peer(&mut self, conn: &mut rustls::Connection, mut b: &[u8]) -> std::io::Result<()> {
        let Some(k) = &mut self.kept else {
            return conn.writer().write_all(b);
        };
        while !b.is_empty() {
            let n = k.local.step(b);
            conn.writer().write_all(&b[..n])?;
            k.keep(&b[..n]);
            b = &b[n..];
            Self::ack_if_due(k, conn)?;
        }
        Ok(())
    }

    fn ack_if_due(k: &mut Kept, conn: &mut rustls::Connection) -> std::io::Result<()> {
        if k.local.at_frame() && k.taken - k.ack_sent >= resend::ACK_EVERY {
            let f = resend::ack_frame(k.taken);
            conn.writer().write_all(&f)?;
            k.keep(&f);
            k.ack_sent = k.taken;
        }
        Ok(())
    }

    /// Takes `b` from the peer.
    fn take_peer(&mut self, b: &[u8], on_error: OnSessionError<'_>) {
        self.frames.take(b, &mut self.to_local, on_error);
        if let Some(k) = &mut self.kept {
            k.taken += b.len() as u64;
            if let Some(n) = self.frames.acked.take() {
                k.acknowledged(n);
            }
        }
    }

    /// Pumps until either side ends; the peer's session-level error frames go through
    /// `on_error` ([`unchanged`] passes them on). A peer that closes without
    /// `close_notify` failed.
    pub fn run(
        &mut self,
        local: &mut Local<'_>,
        link: &mut TlsLink,
        on_error: OnSessionError<'_>,
    ) -> End {
        let TlsLink { conn, tcp } = link;
        // What rustls holds is bounded here instead: the local side is read only once
        // the records before went out, so at most one read's worth waits.
        conn.set_buffer_limit(None);
        if let Err(e) = local.start().and_then(|()| tcp.set_nonblocking(true)) {
            return self.failed(e);
        }
        let mut buf = vec![0u8; CHUNK];
        let mut local_eof = false;
        let mut peer_eof = false;
        // Plaintext the exchange before the pump left in rustls is taken first.
        let mut take_plain = true;
        loop {
            if take_plain {
                take_plain = false;
                loop {
                    match conn.reader().read(&mut buf) {
                        Ok(0) => {
                            peer_eof = true;
                            break;
                        }
                        Ok(n) => self.take_peer(&buf[..n], on_error),
                        Err(e) if would_block(&e) => break,
                        Err(e) => return self.failed(e),
                    }
                }
            }
            if let Some(k) = &mut self.kept
                && let Err(e) = Self::ack_if_due(k, conn)
            {
                return self.failed(e);
            }
            while conn.wants_write() {
                match conn.write_tls(tcp) {
                    Ok(_) => {}
                    Err(e) if would_block(&e) => break,
                    Err(e) => return self.failed(e),
                }
            }
            while self.delivered < self.to_local.len() {
                match local.write(&self.to_local[self.delivered..]) {
                    Ok(n) => self.delivered += n,
                    Err(e) if would_block(&e) => break,
                    Err(_) => return End::Local,
                }
            }
            if self.delivered == self.to_local.len() {
                self.to_local.clear();
                self.delivered = 0;
                if peer_eof {
                    return End::Peer {
                        at_frame: self.frames.at_frame(),
                        error: None,
                    };
                }
            }
            if local_eof && !conn.wants_write() {
                return End::Local;
            }
            let read_local = !local_eof && !conn.wants_write();
            let read_peer = !peer_eof && self.to_local.is_empty();
            // Each side is read in turn, so that neither starves the other.
            let mut progressed = false;
            if read_local {
                match local.read(&mut buf) {
                    Ok(0) => {
                        conn.send_close_notify();
                        local_eof = true;
                        progressed = true;
                    }
                    Ok(n) => {
                        if let Err(e) = self.send_peer(conn, &buf[..n]) {
                            return self.failed(e);
                        }
                        progressed = true;
                    }
                    Err(e) if would_block(&e) => {}
                    Err(_) => {
                        conn.send_close_notify();
                        local_eof = true;
                        progressed = true;
                    }
                }
            }
            if read_peer {
                match conn.read_tls(tcp) {
                    // The socket closed under TLS, with no close_notify: a failure.
                    Ok(0) => {
                        return self.failed(std::io::Error::new(
                            ErrorKind::UnexpectedEof,
                            "the connection closed without close_notify",
                        ));
                    }
                    Ok(_) => {
                        if let Err(e) = conn.process_new_packets() {
                            // rustls queued an alert for the peer; it goes if it can.
                            let _ = conn.write_tls(tcp);
                            return self.failed(std::io::Error::new(ErrorKind::InvalidData, e));
                        }
                        take_plain = true;
                        progressed = true;
                    }
                    Err(e) if would_block(&e) => {}
                    Err(e) => return self.failed(e),
                }
            }
            if progressed {
                continue;
            }
            // Nothing to do without waiting.
            let mut tcp_events = 0;
            if read_peer {
                tcp_events |= libc::POLLIN;
            }
            if conn.wants_write() {
                tcp_events |= libc::POLLOUT;
            }
            let tcp_fd = libc::pollfd {
                fd: tcp.as_raw_fd(),
                events: tcp_events,
                revents: 0,
            };
            let write_local = !self.to_local.is_empty();
            if let Err(e) = wait(tcp_fd, local, read_local, write_local, &mut self.spin) {
                return self.failed(e);
            }
        }
    }

    fn failed(&self, e: std::io::Error) -> End {
        End::Peer {
            at_frame: self.frames.at_frame(),
            error: Some(e),
        }
    }

    /// Delivers what the peer sent and the local side has not taken yet, blocking:
    /// after a last failure, before the local side is told.
    pub fn flush(&mut self, local: &mut Local<'_>) -> std::io::Result<()> {
        local.write_all_blocking(&self.to_local[self.delivered..])?;
        self.to_local.clear();
        self.delivered = 0;
        Ok(())
    }
}

/// Pumps until either side ends, the stream passed as it is.
pub fn pump(local: &UnixStream, link: &mut TlsLink, on_error: OnSessionError<'_>) -> End {
    Pump::plain().run(&mut Local::Socket(local), link, on_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spin_grows_while_it_pays_and_stops_but_for_probes_when_it_does_not() {
        let mut s = Spin::default();
        // A fresh pump does not spin, but probes.
        let budgets: Vec<u64> = (0..Spin::PROBE_EVERY).map(|_| s.budget()).collect();
        assert_eq!(budgets.iter().filter(|&&b| b > 0).count(), 1);
        s.learn(Spin::PROBE, true);
        assert_eq!(s.budget(), 2 * Spin::PROBE);
        for _ in 0..10 {
            let b = s.budget();
            s.learn(b, true);
        }
        assert_eq!(s.budget(), Spin::MAX);
        for _ in 0..10 {
            let b = s.budget();
            s.learn(b, false);
        }
        assert!(s.ns < Spin::FLOOR);
        let budgets: Vec<u64> = (0..2 * Spin::PROBE_EVERY).map(|_| s.budget()).collect();
        assert_eq!(budgets.iter().filter(|&&b| b > 0).count(), 2);
    }

    #[test]
    fn a_wait_returns_once_the_socket_is_ready_whether_it_spun_or_slept() {
        let (a, b) = UnixStream::pair().unwrap();
        let (idle, _idle_peer) = UnixStream::pair().unwrap();
        let tcp = |fd: &UnixStream| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let mut spin = Spin {
            ns: Spin::MAX,
            waits: 0,
        };
        (&b).write_all(b"x").unwrap();
        wait(tcp(&a), &Local::Socket(&idle), true, false, &mut spin).unwrap();
        assert_eq!(
            spin.ns,
            Spin::MAX,
            "a spin that found data keeps its length"
        );
        let mut one = [0u8; 1];
        (&a).read_exact(&mut one).unwrap();
        // A pump that learnt not to spin sleeps in poll(2) and wakes for the peer.
        let mut spin = Spin::default();
        let writer = std::thread::spawn(move || (&b).write_all(b"y").unwrap());
        wait(tcp(&a), &Local::Socket(&idle), true, false, &mut spin).unwrap();
        (&a).read_exact(&mut one).unwrap();
        assert_eq!(&one, b"y");
        writer.join().unwrap();
    }

    #[test]
    fn frames_pass_whole_and_session_errors_go_through_the_hook() {
        let mut c = PeerFrames::default();
        let mut out = Vec::new();
        let seen = std::cell::RefCell::new(Vec::new());
        let mut hook = |_: FrameHeader, p: Vec<u8>| {
            seen.borrow_mut().push(p);
            unchanged(
                FrameHeader::new(FrameKind::Error, 0, 0, 0, 7),
                b"swapped".to_vec(),
            )
        };
        assert!(c.at_frame());
        let reply = FrameHeader::new(FrameKind::Reply, 1, 0, 7, 10).encode();
        let mut stream = reply.to_vec();
        stream.extend_from_slice(&[1; 10]);
        let err = FrameHeader::new(FrameKind::Error, 0, 0, 0, 3).encode();
        stream.extend_from_slice(&err);
        stream.extend_from_slice(b"abc");
        // Byte by byte: boundaries are known across pieces.
        for (i, b) in stream.iter().enumerate() {
            c.take(std::slice::from_ref(b), &mut out, &mut hook);
            let whole = i + 1 == HEADER_LEN + 10 || i + 1 == stream.len();
            assert_eq!(c.at_frame(), whole, "after {} bytes", i + 1);
        }
        assert_eq!(*seen.borrow(), vec![b"abc".to_vec()]);
        assert_eq!(&out[..HEADER_LEN + 10], &stream[..HEADER_LEN + 10]);
        assert!(out.ends_with(b"swapped"));
        // An error answering a call is passed as it is.
        let mut out = Vec::new();
        let call_err = FrameHeader::new(FrameKind::Error, 4, 0, 9, 2).encode();
        let mut s2 = call_err.to_vec();
        s2.extend_from_slice(b"no");
        c.take(&s2, &mut out, &mut hook);
        assert_eq!(out, s2);
        c.take(&[0xff; HEADER_LEN], &mut out, &mut unchanged);
        c.take(&[0; 4096], &mut out, &mut unchanged);
        assert!(
            !c.at_frame(),
            "after bytes that are no frame, never at a boundary"
        );
    }

    #[test]
    fn a_kept_stream_sends_again_what_the_peer_did_not_take_and_acks_go_between_frames() {
        let mut k = Kept::default();
        let frame = |n: usize| {
            let mut f = FrameHeader::new(FrameKind::Request, 1, 0, 1, n)
                .encode()
                .to_vec();
            f.extend(std::iter::repeat_n(7u8, n));
            f
        };
        let (a, b) = (frame(5), frame(300));
        let mut stream = a.clone();
        stream.extend_from_slice(&b);
        // Frame boundaries in pieces of any size.
        let mut pos = 0;
        let mut boundaries = vec![];
        while pos < stream.len() {
            let piece = &stream[pos..(pos + 7).min(stream.len())];
            let mut off = 0;
            while off < piece.len() {
                let n = k.local.step(&piece[off..]);
                off += n;
                if k.local.at_frame() {
                    boundaries.push(pos + off);
                }
            }
            k.keep(piece);
            pos += piece.len();
        }
        assert_eq!(boundaries, vec![a.len(), stream.len()]);
        assert_eq!(k.since(a.len() as u64).unwrap(), b);
        k.acknowledged(a.len() as u64);
        assert_eq!(k.since(a.len() as u64 + 10).unwrap(), b[10..].to_vec());
        assert!(matches!(
            k.since(0),
            Err(resend::ResumeError::Dropped { .. })
        ));
        assert!(matches!(
            k.since(stream.len() as u64 + 1),
            Err(resend::ResumeError::Ahead { .. })
        ));
        assert!(k.since(stream.len() as u64).unwrap().is_empty());
    }

    #[test]
    fn the_peers_acknowledgements_are_taken_out_of_a_kept_stream() {
        let mut p = Pump::kept();
        p.kept.as_mut().unwrap().keep(&[1; 100]);
        let mut stream = resend::ack_frame(60).to_vec();
        let reply = FrameHeader::new(FrameKind::Reply, 1, 0, 1, 2).encode();
        stream.extend_from_slice(&reply);
        stream.extend_from_slice(b"ok");
        p.take_peer(&stream, &mut unchanged);
        assert_eq!(
            p.to_local,
            [&reply[..], b"ok"].concat(),
            "the ack goes no further"
        );
        let k = p.kept_stream().unwrap();
        assert_eq!(k.taken, stream.len() as u64, "every byte taken is counted");
        assert_eq!(k.base, 60, "what the peer acknowledged is dropped");
    }
}
