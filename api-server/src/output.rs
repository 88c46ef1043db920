//! What the host's library prints while it serves the session: a kernel's `printf`,
//! a compiler's diagnostics, a driver's warnings. Natively these land on the
//! application's own standard output and error; here they would land on the API
//! server's, which is the daemon's log.
//!
//! So at start the API server keeps its original standard error for its own log
//! lines ([`log_sink`]) and points descriptors 1 and 2 at two files in memory
//! ([`HostOutput::capture`]). A thread reads them as they fill and frees what it read,
//! so a library that prints without end never blocks nor fills the host's memory, and
//! keeps what it reads within the session's [`Bound`]: a rate (a token
//! bucket) and a buffer. The excess is dropped and counted on the usage page (the
//! daemon reports it), and the guest is told once, on its standard error.
//!
//! What was kept goes to the guest in [`HOST_OUTPUT`] frames written before the next
//! frame of the session ([`crate::server::FrameWriter`]): before the reply to the call
//! that made the library print, or to the call that observed the command complete
//! (those that may wait for the device read the files once more first, since the
//! library wrote before it reported the command complete). The guest writes the bytes
//! to its descriptor 1 or 2 before the call returns, so they go where the
//! application's output goes at that moment, in the order the native library's
//! would.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hira_protocol::handshake::{HOST_OUTPUT, HostOutput as OutputFrame, OutputStream};
use hira_protocol::usage::UsagePage;

pub use hira_protocol::{
    DEFAULT_OUTPUT_BUFFER as DEFAULT_BUFFER, DEFAULT_OUTPUT_RATE as DEFAULT_RATE,
};
/// Largest output payload per frame.
const FRAME_CHUNK: usize = 64 * 1024;
/// Bytes read from a file at a time.
const READ_CHUNK: usize = 64 * 1024;

/// How much host output one session may send its guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// Bytes per second, sustained.
    pub rate: u64,
    /// Bytes held at once, and the burst above the rate.
    pub buffer: u64,
}

impl Default for Bound {
    fn default() -> Self {
        Bound {
            rate: DEFAULT_RATE,
            buffer: DEFAULT_BUFFER,
        }
    }
}

/// A duplicate of the process's standard error as it was at start, for the API
/// server's own log lines (and panics), which stay in the daemon's log once
/// descriptor 2 carries the host library's output to the guest.
pub fn log_sink() -> std::io::Result<File> {
    // SAFETY: F_DUPFD_CLOEXEC only duplicates descriptor 2 (invalid: an error).
    let fd = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The bytes kept for the guest, the bucket and the counts.
#[derive(Debug)]
struct Kept {
    bound: Bound,
    chunks: VecDeque<(OutputStream, Vec<u8>)>,
    /// Bytes in `chunks` (the notice excluded).
    held: u64,
    tokens: f64,
    refilled: Instant,
    /// The guest was told that output is being dropped.
    told: bool,
    /// Where the next read of each file starts.
    read_at: [u64; 2],
}

impl Kept {
    fn new(bound: Bound, now: Instant) -> Self {
        Kept {
            bound,
            chunks: VecDeque::new(),
            held: 0,
            tokens: bound.buffer as f64,
            refilled: now,
            told: false,
            read_at: [0; 2],
        }
    }

    /// Keeps what of `data` the bound allows at `now`; returns the bytes dropped.
    fn admit(&mut self, stream: OutputStream, data: &[u8], now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens =
            (self.tokens + elapsed * self.bound.rate as f64).min(self.bound.buffer as f64);
        let room = (self.tokens as u64).min(self.bound.buffer - self.held);
        let mut take = room.min(data.len() as u64) as usize;
        if take < data.len() {
            // Whole lines only: a line cut short would run into the next output.
            take = data[..take]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1);
        }
        if take > 0 {
            self.push(stream, &data[..take]);
            self.held += take as u64;
            self.tokens -= take as f64;
        }
        let dropped = (data.len() - take) as u64;
        if dropped > 0 && !self.told {
            self.told = true;
            let notice = format!(
                "hira: the host printed more for this program than its session may send \
                 ({} bytes a second, {} at once); the rest is dropped and counted \
                 (hira-ctl list)\n",
                self.bound.rate, self.bound.buffer
            );
            self.chunks
                .push_back((OutputStream::Stderr, notice.into_bytes()));
        }
        dropped
    }

    fn push(&mut self, stream: OutputStream, data: &[u8]) {
        match self.chunks.back_mut() {
            Some((s, v)) if *s == stream && v.len() + data.len() <= FRAME_CHUNK => {
                v.extend_from_slice(data);
            }
            _ => self.chunks.push_back((stream, data.to_vec())),
        }
    }

    /// Everything kept, in order; the buffer empties.
    fn take(&mut self) -> (VecDeque<(OutputStream, Vec<u8>)>, u64) {
        let held = std::mem::take(&mut self.held);
        (std::mem::take(&mut self.chunks), held)
    }
}

/// Where one of the library's standard streams goes: a file of this process's, which
/// the library appends to through descriptor 1 or 2 and this process reads from its
/// own offset.
///
/// A file rather than a pipe: the kernel serialises writes to one open file, so two
/// of the library's threads writing at once (PoCL writes each work-group's `printf`
/// buffer, up to 16 MiB, in one `write`) never interleave, as they do not natively
/// on a terminal or a file, where a pipe would mix them once it fills.
#[derive(Debug)]
struct Sink {
    stream: OutputStream,
    file: OwnedFd,
}

/// The session's host output: the two files and what was read from them and kept.
#[derive(Debug)]
pub struct HostOutput {
    sinks: [Sink; 2],
    /// Wakes the reading thread when a file is written (`None`: it looks every
    /// [`LOOK_EVERY`]).
    watch: Option<OwnedFd>,
    kept: Mutex<Kept>,
    /// Something is kept: the next frame to the guest takes it along.
    pending: AtomicBool,
    usage: Option<Arc<UsagePage>>,
}

/// How often the reading thread looks at the files where the kernel cannot tell it
/// of writes.
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

fn last_error<T>() -> std::io::Result<T> {
    Err(std::io::Error::last_os_error())
}

/// A file with no name, in memory: on `/dev/shm` (tmpfs, where inotify sees its
/// writes), else a memfd (where it does not).
fn unnamed_file() -> std::io::Result<(OwnedFd, bool)> {
    // SAFETY: a constant path; the result is checked.
    let fd = unsafe {
        libc::open(
            c"/dev/shm".as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd >= 0 {
        // SAFETY: just opened, owned by nothing else.
        return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, true));
    }
    Ok((hira_protocol::shm::memfd(c"hira-host-output", 0, 0)?, false))
}

/// An inotify descriptor watching `files` for writes.
fn watch(files: &[&OwnedFd]) -> std::io::Result<OwnedFd> {
    // SAFETY: plain flags; the result is checked.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    if fd < 0 {
        return last_error();
    }
    // SAFETY: just created, owned by nothing else.
    let watch = unsafe { OwnedFd::from_raw_fd(fd) };
    for f in files {
        let path =
            std::ffi::CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap_or_default();
        // SAFETY: `path` is a valid C string; `watch` is open.
        if unsafe { libc::inotify_add_watch(watch.as_raw_fd(), path.as_ptr(), libc::IN_MODIFY) } < 0
        {
            return last_error();
        }
    }
    Ok(watch)
}

impl HostOutput {
    /// Points descriptors 1 and 2 at files this process reads, within `bound`. Call
    /// once, before the host library is loaded and after [`log_sink`] kept the
    /// original standard error; then [`HostOutput::start`].
    pub fn capture(bound: Bound, usage: Option<Arc<UsagePage>>) -> std::io::Result<Arc<Self>> {
        let (out, out_watchable) = unnamed_file()?;
        let (err, err_watchable) = unnamed_file()?;
        for (from, to) in [(&out, 1), (&err, 2)] {
            // SAFETY: dup2 onto the standard descriptors, which this process owns; it
            // clears close-on-exec on the copy, as a standard descriptor has it.
            if unsafe { libc::dup2(from.as_raw_fd(), to) } < 0 {
                return last_error();
            }
        }
        let watch = if out_watchable && err_watchable {
            watch(&[&out, &err])
                .inspect_err(|e| log::warn!("host output: looked at every {LOOK_EVERY:?}: {e}"))
                .ok()
        } else {
            None
        };
        Ok(Arc::new(HostOutput {
            sinks: [
                Sink {
                    stream: OutputStream::Stdout,
                    file: out,
                },
                Sink {
                    stream: OutputStream::Stderr,
                    file: err,
                },
            ],
            watch,
            kept: Mutex::new(Kept::new(bound, Instant::now())),
            pending: AtomicBool::new(false),
            usage,
        }))
    }

    /// Starts the thread that reads the files as they fill. Called once the sandbox
    /// is entered, which the thread then shares (seccomp and Landlock hold per
    /// thread).
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let reader = self.clone();
        std::thread::Builder::new()
            .name("host-output".into())
            .spawn(move || reader.read_forever())?;
        Ok(())
    }

    /// Waits for a write to either file and reads what it added, for the life of the
    /// process (the files are its own descriptors 1 and 2).
    fn read_forever(&self) {
        let mut events = [0u8; 4096];
        loop {
            let mut fds = [libc::pollfd {
                fd: self.watch.as_ref().map_or(-1, AsRawFd::as_raw_fd),
                events: libc::POLLIN,
                revents: 0,
            }];
            let every = libc::timespec {
                tv_sec: 0,
                tv_nsec: LOOK_EVERY.as_nanos() as libc::c_long,
            };
            let timeout = if self.watch.is_some() {
                std::ptr::null()
            } else {
                &every
            };
            // SAFETY: one valid pollfd entry (a negative fd is ignored); `timeout` is
            // null or points at `every`, which outlives the call.
            let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 1, timeout, std::ptr::null()) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                log::warn!(
                    "host output: cannot wait for writes: {}",
                    std::io::Error::last_os_error()
                );
                return;
            }
            if let Some(w) = &self.watch {
                // SAFETY: `events` is valid for its length; `w` is open, non-blocking.
                while unsafe { libc::read(w.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) }
                    > 0
                {}
            }
            // A write may be under way: whole lines only, the rest at the next look.
            self.read_files(false);
        }
    }

    /// Reads what the files hold now into the buffer, within the bound. Called by the
    /// reading thread, and after a call that may have made the library print (it
    /// wrote before the call returned, or before it reported the command complete).
    pub fn collect(&self) {
        // Whatever the library keeps in the C library's stream buffers goes first.
        // SAFETY: fflush(NULL) flushes every open output stream of the C library.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        self.read_files(true);
    }

    /// Reads from where the last read ended to the end of each file (`whole`) or to
    /// its last complete line, and frees the file's pages read.
    fn read_files(&self, whole: bool) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        for (i, sink) in self.sinks.iter().enumerate() {
            let start = kept.read_at[i];
            loop {
                let at = kept.read_at[i];
                // SAFETY: `buf` is valid for its length; the file is open.
                let n = unsafe {
                    libc::pread(
                        sink.file.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        at as libc::off_t,
                    )
                };
                if n <= 0 {
                    break;
                }
                let got = &buf[..n as usize];
                // Pieces end at a line's end, so that a line is kept or dropped whole;
                // at a call's end (`whole`) the rest of the file goes too, and so does
                // a buffer with no line's end in it.
                let full = got.len() == buf.len();
                let take = match got.iter().rposition(|&b| b == b'\n') {
                    _ if whole && !full => got.len(),
                    Some(p) => p + 1,
                    None if full => got.len(),
                    None => 0,
                };
                if take == 0 {
                    break;
                }
                kept.read_at[i] += take as u64;
                let dropped = kept.admit(sink.stream, &got[..take], Instant::now());
                if dropped > 0
                    && let Some(u) = &self.usage
                {
                    u.output(0, dropped);
                }
            }
            // The pages read go back to the host (the offset goes on growing).
            let page = 4096;
            let (from, to) = (start / page * page, kept.read_at[i] / page * page);
            if to > from {
                // SAFETY: punches a hole in a file this process owns; the bytes in it
                // were read.
                unsafe {
                    libc::fallocate(
                        sink.file.as_raw_fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        from as libc::off_t,
                        (to - from) as libc::off_t,
                    )
                };
            }
        }
        if !kept.chunks.is_empty() {
            self.pending.store(true, Ordering::Release);
        }
    }

    /// Writes everything kept as frames with `write_frame` (the session's frame
    /// writer, under its lock) and empties the buffer. Cheap when nothing is kept.
    pub fn flush(&self, mut write_frame: impl FnMut(u16, &[u8])) {
        // Every frame of the session asks: a plain load when nothing is kept.
        if !self.pending.load(Ordering::Acquire) || !self.pending.swap(false, Ordering::AcqRel) {
            return;
        }
        let (chunks, held) = self.kept.lock().unwrap_or_else(|e| e.into_inner()).take();
        for (stream, data) in chunks {
            for piece in data.chunks(FRAME_CHUNK) {
                let frame = OutputFrame {
                    stream,
                    data: piece.to_vec(),
                };
                write_frame(HOST_OUTPUT, &frame.encode());
            }
        }
        if let Some(u) = &self.usage {
            u.output(held, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_bucket_keeps_a_burst_then_the_rate_and_tells_once() {
        let t0 = Instant::now();
        let bound = Bound {
            rate: 1000,
            buffer: 4000,
        };
        let mut k = Kept::new(bound, t0);
        assert_eq!(k.admit(OutputStream::Stdout, &lines(3000), t0), 0);
        // 1000 bytes of room left in the buffer and the bucket.
        assert_eq!(k.admit(OutputStream::Stdout, &lines(1500), t0), 500);
        let (chunks, held) = k.take();
        assert_eq!(held, 4000);
        assert_eq!(chunks.len(), 2, "the kept bytes, then the notice");
        assert_eq!(chunks[0].1.len(), 4000);
        assert_eq!(chunks[1].0, OutputStream::Stderr);
        assert!(String::from_utf8_lossy(&chunks[1].1).contains("dropped"));
        // The buffer is empty, the bucket too: half a second later, 500 bytes.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(k.admit(OutputStream::Stderr, &lines(800), t1), 300);
        let (chunks, held) = k.take();
        assert_eq!(held, 500);
        assert_eq!(chunks.len(), 1, "told once only");
        // A long pause refills up to the buffer, no more.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(k.admit(OutputStream::Stdout, &lines(5000), t2), 1000);
    }

    /// `n` bytes of 10-byte lines.
    fn lines(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| if i % 10 == 9 { b'\n' } else { b'x' })
            .collect()
    }

    #[test]
    fn what_is_dropped_is_whole_lines() {
        let t0 = Instant::now();
        let mut k = Kept::new(
            Bound {
                rate: 1000,
                buffer: 25,
            },
            t0,
        );
        assert_eq!(k.admit(OutputStream::Stdout, &lines(40), t0), 20);
        // A line longer than the room left goes whole.
        assert_eq!(k.admit(OutputStream::Stdout, b"abcdefghij", t0), 10);
        let (chunks, held) = k.take();
        assert_eq!((held, chunks[0].1.len()), (20, 20));
        assert!(chunks[0].1.ends_with(b"\n"));
    }

    #[test]
    fn the_buffer_bounds_what_waits_for_the_guest() {
        let t0 = Instant::now();
        let bound = Bound {
            rate: 1 << 30,
            buffer: 100,
        };
        let mut k = Kept::new(bound, t0);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(k.admit(OutputStream::Stdout, &lines(80), t1), 0);
        assert_eq!(k.admit(OutputStream::Stderr, &lines(80), t1), 60);
        let (chunks, held) = k.take();
        assert_eq!(held, 100);
        assert_eq!(
            chunks
                .iter()
                .map(|(s, d)| (*s, d.len()))
                .collect::<Vec<_>>()[..2],
            [(OutputStream::Stdout, 80), (OutputStream::Stderr, 20)]
        );
        let t2 = t1 + Duration::from_millis(1);
        assert_eq!(
            k.admit(OutputStream::Stdout, &lines(100), t2),
            0,
            "room again"
        );
    }

    #[test]
    fn output_of_one_stream_keeps_its_order_across_frames() {
        let t0 = Instant::now();
        let mut k = Kept::new(
            Bound {
                rate: 1 << 30,
                buffer: 1 << 30,
            },
            t0,
        );
        let big: Vec<u8> = (0..FRAME_CHUNK as u32 * 2 + 7).map(|i| i as u8).collect();
        k.admit(OutputStream::Stdout, &big[..10], t0);
        k.admit(OutputStream::Stdout, &big[10..], t0);
        let (chunks, _) = k.take();
        let joined: Vec<u8> = chunks.into_iter().flat_map(|(_, d)| d).collect();
        assert_eq!(joined, big);
    }
}
