//! Session opening: the guest's `Hello` and the host's `Welcome`.
//!
//! A guest's first frame must be a `Hello` (kind 1, channel 0, call id 0). The host
//! answers with a `Welcome` or an `Error` frame and closes. Which VM a session belongs
//! to is decided by the host from the listener the connection arrived on, never from
//! anything in the `Hello`.

use crate::codec::{DecodeError, Reader, Writer};

/// "HIRA" in little-endian byte order.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HIRA");
/// The protocol version this build speaks.
pub const VERSION: u16 = 8;
/// Longest process name a guest may report.
pub const MAX_PROCESS_NAME: usize = 256;

/// Cuts `s` to at most `max` bytes at a character boundary.
fn truncate_utf8(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

/// Decodes a name: invalid UTF-8 is replaced, and the result is kept within `max`
/// bytes so that it encodes again.
fn decode_name(b: &[u8], max: usize) -> String {
    truncate_utf8(String::from_utf8_lossy(b).into_owned(), max)
}

/// Which API a session remotes: the number its description declares
/// (`protocol/api/<name>.api`, first line `api NAME NUMBER`). The wire knows no API;
/// the daemon admits the numbers of the descriptions it was built with
/// (`hira-apis-registry`) and the API server those it has a backend for. 0 names none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ApiId(pub u8);

impl std::fmt::Display for ApiId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "API {}", self.0)
    }
}

impl TryFrom<u8> for ApiId {
    type Error = DecodeError;

    fn try_from(v: u8) -> Result<Self, DecodeError> {
        match v {
            0 => Err(DecodeError::BadValue {
                what: "API",
                value: 0,
            }),
            v => Ok(ApiId(v)),
        }
    }
}

/// The first frame of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub magic: u32,
    pub version: u16,
    pub api: ApiId,
    /// The guest process id, for logs only.
    pub pid: u32,
    /// The guest process name, for logs only.
    pub process_name: String,
    /// Size of the shared data window the guest passes along (0 for none). On a Unix
    /// socket the window's memfd travels with this frame as `SCM_RIGHTS`.
    pub window_len: u64,
    /// The guest asks for a slot of its VM's shared window (ivshmem), having no
    /// descriptor to pass (vsock).
    pub vm_window: bool,
    /// Where the session's window starts in the descriptor passed along: set by the
    /// host daemon for the API server, 0 from guests.
    pub window_offset: u64,
    /// The guest asks for the data plane on shared-memory rings straight to its API
    /// server (see `ring`): host-local, in a memfd the API server creates; in a VM,
    /// at the end of the session's slot of the VM's shared window.
    pub rings: bool,
    /// For a VM session on rings: where the ring region starts in the descriptor
    /// passed along. Set by the daemon for the API server, 0 from guests.
    pub ring_offset: u64,
    /// A guest whose session was suspended (moved off its daemon) resumes it with
    /// the token its `Welcome` gave; its window and, host-local, its ring region and
    /// eventfds travel with this frame again, in that order.
    pub resume: Option<Token>,
    /// The guest keeps what it sends until acknowledged and counts what it takes in
    /// (see `resend`), so that a relayed session outlives its connection being cut.
    pub resend: bool,
    /// A guest reconnecting after its connection was cut: the bytes of whole frames
    /// it took in since the `Welcome` (see `resend`).
    pub taken: u64,
}

/// A session's resume token: a secret the daemon gives the guest in its `Welcome`.
pub type Token = [u8; 16];

/// Why a `Hello` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HelloError {
    #[error("bad magic {0:#x}")]
    BadMagic(u32),
    #[error("protocol version {0} is not supported (this host speaks {VERSION})")]
    UnsupportedVersion(u16),
    #[error("malformed hello")]
    Decode(#[from] DecodeError),
}

impl Hello {
    pub fn new(api: ApiId, pid: u32, process_name: &str, window_len: u64) -> Self {
        let name = truncate_utf8(process_name.to_owned(), MAX_PROCESS_NAME);
        Hello {
            magic: MAGIC,
            version: VERSION,
            api,
            pid,
            process_name: name,
            window_len,
            vm_window: false,
            window_offset: 0,
            rings: false,
            ring_offset: 0,
            resume: None,
            resend: false,
            taken: 0,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.magic)
            .u16(self.version)
            .u8(self.api.0)
            .u32(self.pid)
            .bytes(self.process_name.as_bytes())
            .u64(self.window_len)
            .u8(u8::from(self.vm_window))
            .u64(self.window_offset)
            .u8(u8::from(self.rings))
            .u64(self.ring_offset);
        match &self.resume {
            Some(t) => w.u8(1).raw(t),
            None => w.u8(0),
        };
        w.u8(u8::from(self.resend)).u64(self.taken);
        w.into_vec()
    }

    /// Decodes a hello; the magic and version are checked first so that a peer from
    /// another protocol generation gets a precise error.
    pub fn decode(payload: &[u8]) -> Result<Self, HelloError> {
        let mut r = Reader::new(payload);
        let magic = r.u32()?;
        if magic != MAGIC {
            return Err(HelloError::BadMagic(magic));
        }
        let version = r.u16()?;
        if version != VERSION {
            return Err(HelloError::UnsupportedVersion(version));
        }
        let api = ApiId::try_from(r.u8()?)?;
        let pid = r.u32()?;
        let name = r.bytes(MAX_PROCESS_NAME)?;
        let window_len = r.u64()?;
        let vm_window = r.flag()?;
        let window_offset = r.u64()?;
        let rings = r.flag()?;
        let ring_offset = r.u64()?;
        let resume = if r.flag()? {
            Some(token(&mut r)?)
        } else {
            None
        };
        let resend = r.flag()?;
        let taken = r.u64()?;
        r.finish()?;
        Ok(Hello {
            magic,
            version,
            api,
            pid,
            process_name: decode_name(name, MAX_PROCESS_NAME),
            window_len,
            vm_window,
            window_offset,
            rings,
            ring_offset,
            resume,
            resend,
            taken,
        })
    }
}

fn token(r: &mut Reader<'_>) -> Result<Token, DecodeError> {
    let mut t = [0u8; 16];
    for b in &mut t {
        *b = r.u8()?;
    }
    Ok(t)
}

/// The host's acceptance of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Welcome {
    pub version: u16,
    /// Host-assigned session number, for logs on both sides.
    pub session: u64,
    /// The VM the host placed this session in.
    pub vm_name: String,
    /// Size of the data window the host accepted (0: the guest must send inline).
    pub window_len: u64,
    /// For a VM window: where the session's slot starts in the shared region.
    pub window_offset: u64,
    /// Capacity of each data-plane ring, when the host set them up (0: frames travel
    /// on the socket). The ring region and its eventfds come with this frame as
    /// `SCM_RIGHTS`, region first (see `ring`); in a VM the region lies at
    /// `ring_offset` of the shared window instead.
    pub ring_capacity: u64,
    /// For a VM session on rings: where the ring region starts in the VM's shared
    /// window.
    pub ring_offset: u64,
    /// The token that resumes this session after it was suspended (all zero: it
    /// cannot be).
    pub token: Token,
    /// The session's frames are relayed and both ends keep what they send until
    /// acknowledged (see `resend`): it outlives its connection being cut.
    pub resend: bool,
    /// To a guest reconnecting after a cut: the bytes of whole frames the host took in
    /// from it; the guest sends again what follows.
    pub taken: u64,
}

impl Welcome {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u16(self.version)
            .u64(self.session)
            .bytes(self.vm_name.as_bytes())
            .u64(self.window_len)
            .u64(self.window_offset)
            .u64(self.ring_capacity)
            .u64(self.ring_offset)
            .raw(&self.token)
            .u8(u8::from(self.resend))
            .u64(self.taken);
        w.into_vec()
    }

    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let version = r.u16()?;
        let session = r.u64()?;
        let vm_name = decode_name(r.bytes(MAX_PROCESS_NAME)?, MAX_PROCESS_NAME);
        let window_len = r.u64()?;
        let window_offset = r.u64()?;
        let ring_capacity = r.u64()?;
        let ring_offset = r.u64()?;
        let token = token(&mut r)?;
        let resend = r.flag()?;
        let taken = r.u64()?;
        r.finish()?;
        Ok(Welcome {
            version,
            session,
            vm_name,
            window_len,
            window_offset,
            ring_capacity,
            ring_offset,
            token,
            resend,
            taken,
        })
    }
}

/// Payload of an `Error` frame: a code and a message for logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorPayload {
    pub code: u32,
    pub message: String,
}

/// Codes carried in `Error` frames.
pub mod error_code {
    /// The frame or its payload could not be decoded.
    pub const MALFORMED: u32 = 1;
    /// The opcode names no function of the session's API.
    pub const UNKNOWN_OPCODE: u32 = 2;
    /// The handshake was refused.
    pub const HANDSHAKE: u32 = 3;
    /// The session's API server is gone.
    pub const SERVER_GONE: u32 = 4;
    /// A span names bytes outside the session's data window.
    pub const BAD_SPAN: u32 = 5;
    /// Policy refused the call (quota).
    pub const POLICY: u32 = 6;
    /// The session was suspended: the guest reconnects with its resume token, to the
    /// endpoint the message names (empty: the one it used), where a daemon resumes it.
    pub const MOVED: u32 = 7;
}

impl ErrorPayload {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.code).bytes(self.message.as_bytes());
        w.into_vec()
    }

    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let code = r.u32()?;
        let message = String::from_utf8_lossy(r.bytes(4096)?).into_owned();
        r.finish()?;
        Ok(ErrorPayload { code, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips() {
        let h = Hello::new(ApiId(1), 42, "vecadd", 1 << 20);
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn wrong_version_is_named() {
        let mut h = Hello::new(ApiId(1), 1, "x", 0);
        h.version = 9;
        assert_eq!(
            Hello::decode(&h.encode()),
            Err(HelloError::UnsupportedVersion(9))
        );
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let mut h = Hello::new(ApiId(1), 1, "x", 0);
        h.magic = 7;
        assert_eq!(Hello::decode(&h.encode()), Err(HelloError::BadMagic(7)));
    }

    #[test]
    fn api_zero_is_rejected_and_others_are_left_to_the_daemon() {
        let mut b = Hello::new(ApiId(1), 1, "x", 0).encode();
        b[6] = 0;
        assert!(matches!(Hello::decode(&b), Err(HelloError::Decode(_))));
        b[6] = 9;
        assert_eq!(Hello::decode(&b).unwrap().api, ApiId(9));
    }

    #[test]
    fn long_multibyte_process_name_is_cut_at_a_character_boundary() {
        let h = Hello::new(ApiId(1), 1, &"é".repeat(200), 0);
        assert!(h.process_name.len() <= MAX_PROCESS_NAME);
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn invalid_utf8_name_still_re_encodes() {
        let mut b = Hello::new(ApiId(1), 1, "", 0).encode();
        // Replace the empty name with 250 bytes of invalid UTF-8.
        let at = 4 + 2 + 1 + 4;
        b.splice(
            at..at + 4,
            250u32.to_le_bytes().into_iter().chain([0xFF; 250]),
        );
        let h = Hello::decode(&b).unwrap();
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn a_resuming_hello_round_trips() {
        let mut h = Hello::new(ApiId(1), 1, "x", 4096);
        h.resume = Some([9; 16]);
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn welcome_round_trips() {
        let w = Welcome {
            version: VERSION,
            session: 5,
            vm_name: "vm1".into(),
            window_len: 0,
            window_offset: 4096,
            ring_capacity: 1 << 20,
            ring_offset: 8192,
            token: [7; 16],
            resend: true,
            taken: 99,
        };
        assert_eq!(Welcome::decode(&w.encode()), Ok(w));
    }
}

/// Opcode of the `Notify` frame an API server sends the daemon (never the guest) as
/// its last frame: what it released when the session ended.
pub const TEARDOWN_REPORT: u16 = 0xFFFF;

/// The payload of a [`TEARDOWN_REPORT`] frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TeardownPayload {
    /// Host objects released on the guest's behalf.
    pub released: u64,
    /// Releases the host refused.
    pub failed: u64,
}

impl TeardownPayload {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(self.released).u64(self.failed);
        w.into_vec()
    }

    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let released = r.u64()?;
        let failed = r.u64()?;
        r.finish()?;
        Ok(TeardownPayload { released, failed })
    }
}

/// Opcode of the `Notify` frame an API server sends the guest when a call forwarded
/// without a reply failed: the guest reports it at the next call that can (the
/// calls an API's description marks `reports`). Sent on the failed call's channel
/// before anything that channel runs next.
pub const ASYNC_FAILURE: u16 = 0xFFFE;

/// Opcode of the empty `Notify` frame that wakes the peer of a VM session's
/// shared-memory rings (see `ring`): the only frame the guest and its API server send
/// each other on the session's connection while on rings, and the only one the daemon
/// relays then (the API server's teardown report and migration messages go to the
/// daemon itself). It shares its value with [`OUTPUT_DONE`], which never travels on
/// that connection while on rings, and always has a payload.
pub const DOORBELL: u16 = 0xFFFD;

/// The payload of an [`ASYNC_FAILURE`] frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncFailure {
    /// The call that failed.
    pub opcode: u16,
    /// Its status in the API's own codes.
    pub status: i32,
}

impl AsyncFailure {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u16(self.opcode).i32(self.status);
        w.into_vec()
    }

    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let opcode = r.u16()?;
        let status = r.i32()?;
        r.finish()?;
        Ok(AsyncFailure { opcode, status })
    }
}

/// Opcode of the `Notify` frame an API server sends the guest when a deferred output
/// (a non-blocking read, whose request named a guest-chosen token) has completed on the
/// host. Sent before the reply to any synchronous call that could observe the
/// command complete, and before any event callback of the command's event.
pub const OUTPUT_DONE: u16 = 0xFFFD;

/// The payload of an [`OUTPUT_DONE`] frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputDone {
    /// The token the guest put in the request.
    pub token: u64,
    /// The command's execution status: 0 when it completed, else the API's error.
    pub status: i32,
    /// The output bytes when they travel in the frame; `None` when they were written
    /// to the data window the request named, or when the command failed.
    pub data: Option<Vec<u8>>,
}

impl OutputDone {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(self.token).i32(self.status);
        match &self.data {
            Some(d) => w.u8(1).bytes(d),
            None => w.u8(0),
        };
        w.into_vec()
    }

    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let token = r.u64()?;
        let status = r.i32()?;
        let data = match r.u8()? {
            0 => None,
            _ => Some(r.bytes(crate::frame::MAX_FRAME_BODY)?.to_vec()),
        };
        r.finish()?;
        Ok(OutputDone {
            token,
            status,
            data,
        })
    }
}

/// Opcode of the `Notify` frame an API server sends the guest with what the host's
/// library printed while serving the session: a kernel's `printf`, a compiler's
/// diagnostics. Sent before the reply to any synchronous call (and before any
/// callback), so that the guest writes it where the application's own descriptor
/// points at that moment, before the call returns, as the library would natively.
pub const HOST_OUTPUT: u16 = 0xFFFB;

/// Which of the application's descriptors a [`HostOutput`] goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// Standard output (descriptor 1).
    Stdout = 1,
    /// Standard error (descriptor 2).
    Stderr = 2,
}

impl OutputStream {
    /// The descriptor number the stream has in every process.
    pub fn fd(self) -> i32 {
        self as i32
    }
}

/// The payload of a [`HOST_OUTPUT`] frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostOutput {
    pub stream: OutputStream,
    pub data: Vec<u8>,
}

impl HostOutput {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(self.stream as u8).bytes(&self.data);
        w.into_vec()
    }

    pub fn decode(payload: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(payload);
        let stream = match r.u8()? {
            1 => OutputStream::Stdout,
            2 => OutputStream::Stderr,
            v => {
                return Err(DecodeError::BadValue {
                    what: "output stream",
                    value: u64::from(v),
                });
            }
        };
        let data = r.bytes(crate::frame::MAX_FRAME_BODY)?.to_vec();
        r.finish()?;
        Ok(HostOutput { stream, data })
    }
}

#[cfg(test)]
mod output_done_tests {
    use super::*;

    #[test]
    fn output_done_round_trips_with_and_without_data() {
        for data in [None, Some(vec![1u8, 2, 3])] {
            let o = OutputDone {
                token: 7,
                status: -14,
                data,
            };
            assert_eq!(OutputDone::decode(&o.encode()), Ok(o));
        }
        assert!(OutputDone::decode(&[0u8; 5]).is_err());
    }

    #[test]
    fn host_output_round_trips_and_names_only_two_streams() {
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let o = HostOutput {
                stream,
                data: b"kernel says 40\n".to_vec(),
            };
            assert_eq!(HostOutput::decode(&o.encode()), Ok(o));
        }
        let mut bad = HostOutput {
            stream: OutputStream::Stdout,
            data: vec![1],
        }
        .encode();
        bad[0] = 3;
        assert!(HostOutput::decode(&bad).is_err());
        assert!(HostOutput::decode(&[]).is_err());
    }
}

/// Migration between the daemon and an API server, as `Notify` frames on the socket
/// between them (never seen by a guest). A migration of a session runs:
///
/// 1. daemon → source server: [`migrate::CAPTURE`], with a memfd. The server stops
///    reading the guest's input, lets what it read finish (the device drained), writes
///    the session's snapshot into the memfd and answers [`migrate::CAPTURED`] (a `u64`
///    length) or [`migrate::FAILED`] (a message) and waits.
/// 2. daemon → new server: [`migrate::ADOPT`], with the memfd and the guest's ring
///    region and eventfds, then the session's `Hello`; the new server restores the
///    snapshot and answers `Welcome`, or `Error` if it cannot.
/// 3. daemon → source: [`migrate::COMMIT`] (the source exits without releasing
///    anything: its objects now live in the new server) or [`migrate::ABORT`] (it goes
///    on serving where it stopped).
///
/// A session whose frames the daemon relays gets these in its stream of frames, at
/// a frame boundary (the daemon forwards nothing else meanwhile), and `CAPTURE` there
/// carries no memfd: the API server sends the snapshot back in [`migrate::DATA`]
/// frames before `CAPTURED`.
pub mod migrate {
    pub const CAPTURE: u16 = 0xFFF0;
    pub const CAPTURED: u16 = 0xFFF1;
    pub const FAILED: u16 = 0xFFF2;
    pub const ADOPT: u16 = 0xFFF3;
    pub const COMMIT: u16 = 0xFFF4;
    pub const ABORT: u16 = 0xFFF5;
    /// A piece of the snapshot, in order (relayed sessions).
    pub const DATA: u16 = 0xFFF6;
    /// Largest piece.
    pub const DATA_PIECE: usize = 1 << 20;

    /// Daemon → guest of a relayed session about to be suspended: send nothing more
    /// after a [`DRAINED`] notification (calls wait until the session resumes, or
    /// until [`RESUMED`]). Every frame before `DRAINED` reaches the API server that
    /// is captured, so none is lost with the connection.
    pub const SUSPENDING: u16 = 0xFFF7;
    /// Guest → daemon: the last frame on this connection before the session resumes.
    pub const DRAINED: u16 = 0xFFF8;
    /// Daemon → guest: the suspension was abandoned; go on sending here.
    pub const RESUMED: u16 = 0xFFF9;
}
