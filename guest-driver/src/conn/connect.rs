//! Opening a session: the hello, the host's welcome, the data window and rings.

use super::*;

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
                hl.resend = true;
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
                    let region = hira_ring::Region::map(&region, capacity)
                        .map_err(|e| bad(e.to_string()))?;
                    hira_ring::guest_ends(
                        std::sync::Arc::new(region),
                        fds.collect(),
                        stream.raw_fd(),
                    )
                    .map_err(|e| bad(e.to_string()))?
                }
                Stream::Vsock(_) => {
                    let bar = crate::window::ivshmem_bar()
                        .ok_or_else(|| bad("no ivshmem device".into()))?;
                    let region =
                        hira_ring::Region::map_at(&bar, welcome.ring_offset, capacity, false)
                            .map_err(|e| bad(e.to_string()))?;
                    hira_ring::guest_ends_vm(std::sync::Arc::new(region), stream.raw_fd())
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
            let mut tx = Resending::plain(clone()?);
            if welcome.resend {
                tx.enable(resend::GUEST_KEEPS);
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
            keeps: AtomicBool::new(welcome.resend),
            session: AtomicU64::new(welcome.session),
            taken: AtomicU64::new(0),
            ack_sent: AtomicU64::new(0),
            host_acked,
            generation: AtomicU64::new(0),
            reconnecting: Mutex::new(()),
            welcome,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use hira_protocol::handshake::ApiId;

    use super::*;

    /// A daemon on a fresh socket that takes one hello and answers with `kind` and
    /// `payload`; returns the socket's path and the hello it took.
    fn daemon(
        kind: FrameKind,
        payload: Vec<u8>,
    ) -> (
        tempfile::TempDir,
        std::path::PathBuf,
        std::thread::JoinHandle<Hello>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let l = UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let (h, p, _) = unix::recv_frame_with_fds(&mut s).unwrap();
            assert_eq!(h.kind, FrameKind::Hello);
            let hello = Hello::decode(&p).unwrap();
            let answer = FrameHeader::new(kind, 0, 0, 0, payload.len());
            unix::send_frame_with_fd(&mut s, &answer, &payload, None).unwrap();
            hello
        });
        (dir, path, t)
    }

    const API: ApiId = ApiId(1);

    #[test]
    fn a_refusal_brings_the_hosts_reason_and_a_stray_answer_is_malformed() {
        let why = ErrorPayload {
            code: 3,
            message: "no such API".into(),
        };
        let (_d, path, t) = daemon(FrameKind::Error, why.encode());
        let e = Connection::connect(&Endpoint::Unix(path), API, 0).unwrap_err();
        assert!(
            matches!(&e, TransportError::Refused(m) if m == "no such API"),
            "{e}"
        );
        let hello = t.join().unwrap();
        assert_eq!((hello.api, hello.window_len, hello.rings), (API, 0, false));

        let (_d, path, t) = daemon(FrameKind::Reply, vec![1, 2, 3]);
        let e = Connection::connect(&Endpoint::Unix(path), API, 0).unwrap_err();
        assert!(matches!(e, TransportError::Malformed(_)), "{e}");
        t.join().unwrap();
    }

    #[test]
    fn endpoints_are_tried_in_order_and_the_last_failure_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let nobody = dir.path().join("nobody");
        let e = Connection::connect_any(&[Endpoint::Unix(nobody.clone())], API, 0).unwrap_err();
        assert!(
            matches!(&e, TransportError::Connect { path, .. } if path == &nobody.display().to_string()),
            "{e}"
        );
        let why = ErrorPayload {
            code: 3,
            message: "full".into(),
        };
        let (_d, path, t) = daemon(FrameKind::Error, why.encode());
        let e = Connection::connect_any(&[Endpoint::Unix(nobody), Endpoint::Unix(path)], API, 0)
            .unwrap_err();
        assert!(
            matches!(&e, TransportError::Refused(m) if m == "full"),
            "{e}"
        );
        t.join().unwrap();
        assert!(Connection::connect_any(&[], API, 0).is_err());
    }
}
