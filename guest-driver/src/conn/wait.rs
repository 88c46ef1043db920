//! Waiting for a call's reply: leader/follower demultiplexing of the frames that come
//! back, spinning before sleeping, and what arrives meanwhile.

use super::*;

impl Connection {
    /// Waits for what `want` names (a reply or a notification: `Some(frame)`; a
    /// condition: `None`). Whoever is not waiting on a reader becomes the reader, if
    /// `may_read` allows.
    pub(super) fn wait_for(
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
                Ok(f) if resend::is_ack(&f.header) => {
                    if let Some(n) = resend::ack_count(&f.payload) {
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
}
