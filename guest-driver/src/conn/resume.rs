//! Keeping a session across a lost connection: holding calls, reconnecting with the
//! session's token, and resuming a suspended session where its daemon says.

use super::*;

impl Connection {
    /// A relayed session is about to be suspended: sends the last frame of this
    /// connection (`DRAINED`), after any frame being written, and holds every later
    /// one until the session resumes, so that the host's capture misses none.
    pub(super) fn pause(&self) {
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
    pub(super) fn unpause(&self) {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        self.paused.store(false, Ordering::Release);
        self.unpaused.notify_all();
    }

    /// Resumes the session after the host suspended it: connects again (to `to`, or
    /// where it first connected) with its token, window, ring region and eventfds,
    /// until a daemon that holds the session takes it or the time runs out. The new
    /// socket takes the old one's descriptor numbers, which the rings watch; the
    /// rings go on from where they were.
    pub(super) fn resume_session(&self, to: &str, after_reset: bool) -> Result<(), TransportError> {
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
                        ws.enable(if welcome.resend {
                            resend::GUEST_KEEPS
                        } else {
                            0
                        });
                        self.keeps.store(welcome.resend, Ordering::Release);
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
            let b = hira_ring::doorbell_frame();
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
    pub(super) fn reconnect(&self, seen: u64) -> Result<(), TransportError> {
        let _one = self.reconnecting.lock().unwrap_or_else(|e| e.into_inner());
        if self.generation.load(Ordering::Acquire) != seen || self.dead().is_some() {
            return Ok(());
        }
        self.resume_session("", true)
    }

    /// Counts a frame taken in from a kept stream and acknowledges the stream every
    /// `resend::ACK_EVERY` bytes, unless a writer holds the socket or it has no room
    /// now (a writer acknowledges after its next frame: the reader never waits for the
    /// host to read, which may be waiting for this end to read), or the session is
    /// suspending (nothing may follow `DRAINED`).
    pub(super) fn took(&self, f: &Frame) {
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
    pub(super) fn acknowledge(&self, w: &mut Tx) {
        let taken = self.taken.load(Ordering::Acquire);
        if taken - self.ack_sent.load(Ordering::Acquire) < resend::ACK_EVERY
            || self.paused.load(Ordering::Acquire)
        {
            return;
        }
        if let Tx::Stream(ws) = w
            && (ws.is_broken() || unix::writable_now(ws.get_ref().raw_fd()))
        {
            let _ = std::io::Write::write_all(ws, &resend::ack_frame(taken));
            self.ack_sent.store(taken, Ordering::Release);
        }
    }

    pub(super) fn try_resume(
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
                hl.resend = true;
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
    pub(super) fn outlives_resets(&self) -> bool {
        self.resume
            .as_ref()
            .is_some_and(|k| k.vm_rings || self.keeps.load(Ordering::Acquire))
    }
}
