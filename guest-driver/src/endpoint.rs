//! Finding the host end of the transport.
//!
//! `HIRA_SOCKET` names a host-local Unix socket. Without it, a guest inside a VM (its
//! `/dev/vsock` reports a CID above 2) connects over AF_VSOCK to the host (CID 2) on
//! the Hira port, `HIRA_VSOCK_PORT` or 5571; otherwise, and if that fails, the default
//! Unix socket is used.

use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// The Hira port on the host CID.
pub const VSOCK_PORT: u32 = 5571;
/// The host's CID.
pub const HOST_CID: u32 = 2;

/// Where the host is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Vsock { cid: u32, port: u32 },
}

/// This machine's vsock CID, if it has a vsock device.
pub fn local_cid() -> Option<u32> {
    const IOCTL_VM_SOCKETS_GET_LOCAL_CID: libc::c_ulong = 0x7b9;
    let dev = std::fs::File::open("/dev/vsock").ok()?;
    let mut cid: u32 = 0;
    // SAFETY: this ioctl writes one u32 to the pointer, which points to a local.
    let r = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            IOCTL_VM_SOCKETS_GET_LOCAL_CID,
            &mut cid as *mut u32,
        )
    };
    (r == 0).then_some(cid)
}

/// The endpoints to try, in order.
pub fn endpoints() -> Vec<Endpoint> {
    let s = crate::settings::settings();
    if let Some(p) = &s.socket {
        return vec![Endpoint::Unix(p.clone())];
    }
    let mut v = Vec::new();
    if local_cid().is_some_and(|c| c > HOST_CID) {
        let port = s.vsock_port;
        v.push(Endpoint::Vsock {
            cid: HOST_CID,
            port,
        });
    }
    v.push(Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET)));
    v
}

/// Unix socket of the host-local listener when `HIRA_SOCKET` is not set.
pub const DEFAULT_SOCKET: &str = "/run/hira/local.sock";

/// Bytes of shared data window to offer the host: `HIRA_WINDOW_MB` (0 disables the
/// window and sends everything inline), default 256 MiB. The memfd takes memory only
/// for the pages transfers have touched.
pub fn window_len() -> u64 {
    crate::settings::settings().window_len
}

/// Transfers of at least this many bytes go through the window when one is mapped:
/// `HIRA_INLINE_MAX` bytes, default 64 KiB.
pub fn inline_max() -> usize {
    crate::settings::settings().inline_max
}

/// How long a thread waiting for a reply polls before it sleeps: `HIRA_SPIN_US`
/// microseconds, default 1000 (0 disables spinning). Only calls that recently came
/// back within twice this spin at all, so a call that waits long for the device
/// sleeps at once; one that waits a little (a blocking read behind a short kernel)
/// is seen without a wake-up, which costs tens of microseconds on virtual CPUs.
pub fn spin() -> std::time::Duration {
    crate::settings::settings().spin
}

/// Whether a host-local guest asks for the shared-memory data plane (rings straight
/// to its API server): `HIRA_RINGS=0` keeps every frame on the socket, relayed by the
/// daemon (for comparison and diagnosis). Default on.
pub fn rings() -> bool {
    crate::settings::settings().rings
}
