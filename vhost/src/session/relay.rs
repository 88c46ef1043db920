//! Frames a session relays: the guest's to its API server after checks, and back.

use std::io::{BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use hira_protocol::api::Description;
use hira_protocol::frame::{self, HEADER_LEN, SPAN_LEN};
use hira_protocol::handshake::{
    DOORBELL, TEARDOWN_REPORT, TeardownPayload, Welcome, error_code, migrate,
};
use hira_protocol::resend::{self};
use hira_protocol::{FrameHeader, FrameKind, unix};
use log::{debug, info, warn};

use super::{
    Context, GuestOut, RELAY_CHUNK, RESET_GRACE, SessionError, SessionStats, WHOLE_FRAME,
    error_frame, send_error,
};
use crate::migrate::mover::{Mover, answer_door, drained};

/// Where the relay thread passes a migration's answer (its opcode and payload).
pub(crate) type AnswerTo = std::sync::mpsc::Sender<(u16, Vec<u8>)>;

/// What the relay thread and a migration share: where the migration's answers go,
/// and the API server to go on with once the old one has closed.
#[derive(Debug, Default)]
pub(crate) struct RelayLink {
    pub(crate) answers: Mutex<Option<AnswerTo>>,
    /// Where a relayed session's snapshot pieces go.
    pub(crate) snapshot: Mutex<Option<std::fs::File>>,
    pub(crate) next: Mutex<Option<UnixStream>>,
    /// The session was suspended: its API server's end is no news to the guest.
    pub(crate) quiet: std::sync::atomic::AtomicBool,
    /// A new guest connection replaced one that a device reset cut.
    pub(crate) reattached: std::sync::atomic::AtomicBool,
}

/// Copies replies and notifications to the guest until the API server closes; then
/// tells the guest its session is over. Returns the API server's teardown report,
/// which is for the daemon and never reaches the guest. Once the guest is gone, the
/// API server's frames are read and dropped, so that the report still arrives. A
/// migration's answers go to the migration; when a migrated session's old API server
/// closes, the relay goes on with the new one.
pub(crate) fn relay_to_guest(
    server: UnixStream,
    guest: &Mutex<GuestOut>,
    link: &RelayLink,
) -> Option<TeardownPayload> {
    let mut server = BufReader::with_capacity(RELAY_CHUNK, server);
    let mut buf = vec![0u8; RELAY_CHUNK];
    let mut report = None;
    let mut guest_gone = false;
    loop {
        let mut hb = [0u8; HEADER_LEN];
        if server.read_exact(&mut hb).is_err() {
            let next = link.next.lock().unwrap_or_else(|e| e.into_inner()).take();
            match next {
                Some(s) => {
                    server = BufReader::with_capacity(RELAY_CHUNK, s);
                    continue;
                }
                None => break,
            }
        }
        let Ok(h) = FrameHeader::decode(&hb) else {
            warn!("API server sent a malformed frame; ending the session");
            break;
        };
        if h.kind == FrameKind::Notify && h.opcode == TEARDOWN_REPORT {
            let mut p = vec![0u8; h.len as usize];
            if server.read_exact(&mut p).is_err() {
                break;
            }
            report = TeardownPayload::decode(&p).ok();
            continue;
        }
        if h.kind == FrameKind::Notify && h.opcode == migrate::DATA {
            if h.len as usize > migrate::DATA_PIECE {
                warn!("API server sent an oversized snapshot piece; ending the session");
                break;
            }
            let mut p = vec![0u8; h.len as usize];
            if server.read_exact(&mut p).is_err() {
                break;
            }
            if let Some(f) = &mut *link.snapshot.lock().unwrap_or_else(|e| e.into_inner()) {
                let _ = f.write_all(&p);
            }
            continue;
        }
        if h.kind == FrameKind::Notify && matches!(h.opcode, migrate::CAPTURED | migrate::FAILED) {
            // The snapshot is whole (or will not come): the memfd stays the migration's.
            link.snapshot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            let mut p = vec![0u8; (h.len as usize).min(64 * 1024)];
            if h.len as usize > p.len() || server.read_exact(&mut p).is_err() {
                break;
            }
            if let Some(tx) = &*link.answers.lock().unwrap_or_else(|e| e.into_inner()) {
                let _ = tx.send((h.opcode, p));
            }
            continue;
        }
        if guest_gone
            && link
                .reattached
                .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            guest_gone = false;
        }
        if guest_gone {
            if skip(&mut server, h.len as usize, &mut buf).is_err() {
                break;
            }
            continue;
        }
        if forward(
            &mut server,
            &mut *guest_lock(guest),
            &hb,
            &[],
            h.len as usize,
            &mut buf,
        )
        .is_err()
        {
            guest_gone = true;
        }
    }
    if !guest_gone && !link.quiet.load(std::sync::atomic::Ordering::Acquire) {
        send_error(
            guest,
            None,
            error_code::SERVER_GONE,
            "the API server has exited",
        );
    }
    let _ = guest_lock(guest)
        .get_ref()
        .shutdown(std::net::Shutdown::Both);
    report
}

pub(crate) fn guest_lock(g: &Mutex<GuestOut>) -> std::sync::MutexGuard<'_, GuestOut> {
    g.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forwards a frame whose header (and spans) were read already and whose remaining
/// `n` body bytes are still in `from`. A frame that fits the buffer leaves in a single
/// write, so the receiver wakes once for it.
pub(crate) fn forward(
    from: &mut impl Read,
    to: &mut impl Write,
    head: &[u8],
    spans: &[u8],
    n: usize,
    buf: &mut [u8],
) -> std::io::Result<()> {
    if n <= buf.len() {
        from.read_exact(&mut buf[..n])?;
        return frame::write_parts(to, &[head, spans, &buf[..n]]);
    }
    frame::write_parts(to, &[head, spans])?;
    copy_exact(from, to, n, buf)
}

/// Copies exactly `n` bytes.
pub(crate) fn copy_exact(
    from: &mut impl Read,
    to: &mut impl Write,
    mut n: usize,
    buf: &mut [u8],
) -> std::io::Result<()> {
    while n > 0 {
        let chunk = n.min(buf.len());
        from.read_exact(&mut buf[..chunk])?;
        to.write_all(&buf[..chunk])?;
        n -= chunk;
    }
    Ok(())
}

/// Discards exactly `n` bytes.
pub(crate) fn skip(from: &mut impl Read, mut n: usize, buf: &mut [u8]) -> std::io::Result<()> {
    while n > 0 {
        let chunk = n.min(buf.len());
        from.read_exact(&mut buf[..chunk])?;
        n -= chunk;
    }
    Ok(())
}

/// Waits until the guest has something to read (or hung up), carrying out the
/// migrations asked for meanwhile. False once the session was suspended (it is over
/// here).
pub(crate) fn guest_or_door(
    guest: &UnixStream,
    door: &crate::migrate::Door,
    m: &mut Mover<'_>,
) -> Result<bool, SessionError> {
    loop {
        let limit = m
            .draining
            .as_ref()
            .map(|(_, until)| until.saturating_duration_since(std::time::Instant::now()));
        let (ready, rung) = crate::migrate::wait_either(guest, &door.rung, limit)?;
        let asked = rung || (!ready && limit.is_some());
        if asked && answer_door(door, m) {
            return Ok(false);
        }
        if ready {
            return Ok(true);
        }
    }
}

/// Waits until a guest whose frames travel on rings closes its socket (it has
/// nothing to send there: anything it does send ends the session), carrying out the
/// migrations asked for meanwhile.
pub(crate) fn serve_on_rings(
    guest: &mut UnixStream,
    door: &crate::migrate::Door,
    m: &mut Mover<'_>,
) -> Result<(), SessionError> {
    if !guest_or_door(guest, door, m)? {
        return Ok(());
    }
    let mut b = [0u8; 1];
    match guest.read(&mut b) {
        Ok(0) => Ok(()),
        Ok(_) => Err(SessionError::Handshake(
            "the guest sent on its socket while on rings".into(),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Acknowledges the guest's stream every `resend::ACK_EVERY` bytes taken in, unless
/// the relay to the guest holds its end or it has no room now (the relay may wait
/// for the guest to read, which may wait for this side to read): the next frame
/// tries again.
pub(crate) fn acknowledge(m: &mut Mover<'_>) {
    if m.taken - m.ack_sent < resend::ACK_EVERY {
        return;
    }
    let mut g = match m.guest_w.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    // Only if it leaves at once: this side must not wait for the guest to read.
    if g.is_broken() || unix::writable_now(g.get_ref().as_raw_fd()) {
        let _ = g.write_all(&resend::ack_frame(m.taken));
        m.ack_sent = m.taken;
    }
}

/// Checks and forwards the guest's commands (on a VM's rings: its doorbells) until
/// it disconnects or breaks framing; between two of them, carries out the
/// migrations asked for (a relayed session's API server gets the capture in its
/// stream, after every frame forwarded before).
///
/// A session whose stream both ends keep (`Mover::resend`) reads each frame whole
/// before forwarding it and counts it taken; its connection failing between two
/// frames, or within one not forwarded yet, ends this as the guest closing would (the
/// caller tells a cut from that).
pub(crate) fn relay_to_server(
    guest: &mut BufReader<UnixStream>,
    door: &crate::migrate::Door,
    m: &mut Mover<'_>,
    window_len: u64,
    doorbells_only: bool,
    api: &'static Description,
    stats: &mut SessionStats,
) -> Result<(), SessionError> {
    let guest_w = m.guest_w;
    let keeps = m.resend;
    let mut buf = vec![0u8; RELAY_CHUNK];
    let mut whole: Vec<u8> = Vec::new();
    // A read from the guest that fails: the end of its connection, or an error.
    let ended = |e: std::io::Error| -> Result<(), SessionError> {
        if keeps || e.kind() == std::io::ErrorKind::UnexpectedEof {
            Ok(())
        } else {
            Err(e.into())
        }
    };
    loop {
        if guest.buffer().is_empty() && !guest_or_door(guest.get_ref(), door, m)? {
            return Ok(());
        }
        let mut hb = [0u8; HEADER_LEN];
        if let Err(e) = guest.read_exact(&mut hb) {
            return ended(e);
        }
        let h = match FrameHeader::decode(&hb) {
            Ok(h) => h,
            Err(e) => {
                // Framing is lost; nothing after this can be trusted.
                send_error(guest_w, None, error_code::MALFORMED, &e.to_string());
                return Err(SessionError::Handshake(format!(
                    "malformed frame header: {e}"
                )));
            }
        };
        let frame_len = (HEADER_LEN + h.len as usize) as u64;
        if doorbells_only {
            // A VM session on rings: its frames travel in shared memory; the socket
            // carries only doorbells, which have no body to copy.
            if h.kind == FrameKind::Notify && h.opcode == DOORBELL && h.len == 0 {
                forward(guest, &mut &*m.server, &hb, &[], 0, &mut buf)?;
                continue;
            }
            let m = "a guest on rings may only ring the doorbell on its socket";
            send_error(guest_w, None, error_code::MALFORMED, m);
            return Err(SessionError::Handshake(m.into()));
        }
        if keeps && resend::is_ack(&h) {
            let mut p = [0u8; 8];
            if let Err(e) = guest.read_exact(&mut p) {
                return ended(e);
            }
            if let Some(n) = resend::ack_count(&p) {
                m.guest_acked
                    .fetch_max(n, std::sync::atomic::Ordering::AcqRel);
            }
            m.taken += frame_len;
            acknowledge(m);
            continue;
        }
        if h.kind == FrameKind::Notify && h.opcode == migrate::DRAINED && h.len == 0 {
            m.taken += frame_len;
            // The guest's last frame before a suspension (ignored otherwise).
            if drained(door, m) {
                return Ok(());
            }
            continue;
        }
        let span_bytes = h.span_count as usize * SPAN_LEN;
        let mut spans = vec![0u8; span_bytes];
        if let Err(e) = guest.read_exact(&mut spans) {
            return ended(e);
        }
        let rest = h.len as usize - span_bytes;
        let verdict = if h.kind != FrameKind::Request {
            Err((
                error_code::MALFORMED,
                format!("guests may only send requests, not {:?}", h.kind),
            ))
        } else {
            match api.op(h.opcode) {
                None => Err((
                    error_code::UNKNOWN_OPCODE,
                    format!("opcode {} names no function", h.opcode),
                )),
                Some(op) if h.no_reply() && !op.may_async => Err((
                    error_code::MALFORMED,
                    format!("{} may not be forwarded asynchronously", op.name),
                )),
                Some(op) => frame::decode_spans(&spans, h.span_count as usize, window_len)
                    .map(|_| op.name)
                    .map_err(|e| (error_code::BAD_SPAN, e.to_string())),
            }
        };
        if let Err((code, message)) = verdict {
            debug!("rejected frame: {message}");
            stats.rejected += 1;
            if let Err(e) = skip(guest, rest, &mut buf) {
                return ended(e);
            }
            if !h.no_reply() {
                send_error(guest_w, Some(&h), code, &message);
            }
            m.taken += frame_len;
            continue;
        }
        if !keeps {
            forward(guest, &mut &*m.server, &hb, &spans, rest, &mut buf)?;
            continue;
        }
        if rest <= WHOLE_FRAME {
            let body: &mut [u8] = if rest <= buf.len() {
                &mut buf[..rest]
            } else {
                whole.resize(rest, 0);
                &mut whole[..]
            };
            if let Err(e) = guest.read_exact(body) {
                return ended(e);
            }
            frame::write_parts(&mut &*m.server, &[&hb, &spans, body])?;
            if whole.len() > RELAY_CHUNK {
                whole = Vec::new();
            }
        } else {
            // Too large to hold: forwarded as it comes. A cut in its middle leaves
            // part of it with the API server, so then the session cannot go on.
            forward(guest, &mut &*m.server, &hb, &spans, rest, &mut buf)?;
        }
        m.taken += frame_len;
        acknowledge(m);
    }
}

/// How a relayed session's frames go.
pub(crate) struct Relayed {
    /// The session's data window, which spans must lie in.
    pub window_len: u64,
    /// On a VM's rings: the guest only rings doorbells on its connection.
    pub rings: bool,
    pub vm_rings: bool,
    pub api: &'static Description,
}

/// Relays the guest's frames until it leaves or breaks framing. A session on a VM's
/// rings, or whose stream both ends keep, outlives a device reset cutting its
/// connection: it waits for its guest to connect again with its token, checks what
/// the guest says it took, tells it what to send again and goes on.
pub(crate) fn relay_until_end(
    guest: &UnixStream,
    door: &crate::migrate::Door,
    m: &mut Mover<'_>,
    welcome: &mut Welcome,
    how: Relayed,
    stats: &mut SessionStats,
    ctx: &Context<'_>,
) -> Result<(), SessionError> {
    let mut guest_r = BufReader::with_capacity(RELAY_CHUNK, guest.try_clone()?);
    let (id, vm, queue, life) = (ctx.id, ctx.vm, ctx.queue, ctx.life);
    loop {
        let resets = queue.resets();
        let r = relay_to_server(
            &mut guest_r,
            door,
            m,
            how.window_len,
            how.rings,
            how.api,
            stats,
        );
        // On rings in the VM's window the session lives on in shared
        // memory when a device reset cuts its connection (not when the
        // guest closes it), and so does a relayed one whose stream both
        // ends keep: it waits for the guest to connect again.
        let cut = (how.vm_rings || m.resend)
            && r.is_ok()
            && m.child.is_some()
            && queue.resets() != resets;
        if !cut {
            break r;
        }
        info!(
            "VM {vm:?} session {id}: connection cut by a device reset; waiting {RESET_GRACE:?} for its guest"
        );
        let Some((back, taken)) = life.await_reattach(m.token, vm, RESET_GRACE) else {
            info!("VM {vm:?} session {id}: its guest did not come back");
            break r;
        };
        {
            let mut g = m.guest_w.lock().unwrap_or_else(|e| e.into_inner());
            *g.get_mut() = back.try_clone()?;
            if let Err(e) = g.check(taken).map_err(|e| e.to_string()) {
                let f = error_frame(None, error_code::HANDSHAKE, &e);
                let _ = g.get_mut().write_all(&f);
                info!("VM {vm:?} session {id}: its guest cannot go on: {e}");
                break r;
            }
            // A relayed guest learns what to send again; this end sends
            // again what the guest did not take.
            welcome.taken = m.taken;
            let w = welcome.encode();
            let wh = FrameHeader::new(FrameKind::Welcome, 0, 0, 0, w.len());
            unix::send_frame_with_fds(g.get_mut(), &wh, &w, &[])?;
            if m.resend {
                let _ = g.resume(taken);
                info!(
                    "VM {vm:?} session {id}: relayed stream goes on: {} bytes sent again to the guest, which sends again what followed byte {}",
                    g.sent() - taken,
                    m.taken
                );
            }
        }
        m.link
            .reattached
            .store(true, std::sync::atomic::Ordering::Release);
        life.reconnections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        guest_r = BufReader::with_capacity(RELAY_CHUNK, back);
        info!("VM {vm:?} session {id}: its guest reconnected");
    }
}
