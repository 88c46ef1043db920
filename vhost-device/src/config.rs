//! Daemon configuration.

use std::path::PathBuf;
use std::str::FromStr;

/// Default host-local listener (matches the guest driver's default `HIRA_SOCKET`).
pub const DEFAULT_LOCAL_SOCKET: &str = "/run/hira/local.sock";

/// Errors in a listener or VM spec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("empty listener path")]
    EmptyPath,
    #[error("VM name {0:?} must be 1-64 characters of letters, digits, '-', '_' or '.'")]
    BadVmName(String),
    #[error("`{0}` is not KEY=VALUE")]
    NotKeyValue(String),
    #[error("unknown VM setting `{0}` (known: name, socket, hybrid, cid, window, window-mb)")]
    UnknownKey(String),
    #[error("VM setting `{0}` given twice")]
    DuplicateKey(String),
    #[error("VM spec lacks `{0}`")]
    Missing(&'static str),
    #[error("CID {0:?} must be a number from 3 to 4294967294 (0-2 are reserved)")]
    BadCid(String),
    #[error("window-mb {0:?} must be a number of MiB from 4 to 65536")]
    BadWindowSize(String),
    #[error("a data window (`window=`) needs the vhost-user transport (`socket=`)")]
    WindowNeedsVhostUser,
    #[error(
        "give exactly one of `socket=` (QEMU vhost-user) and `hybrid=` (cloud-hypervisor, Firecracker)"
    )]
    Transport,
}

/// A host-local listener: a Unix socket whose connections belong to one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalListener {
    pub vm: String,
    pub path: PathBuf,
}

impl Default for LocalListener {
    fn default() -> Self {
        LocalListener {
            vm: "local".into(),
            path: PathBuf::from(DEFAULT_LOCAL_SOCKET),
        }
    }
}

fn valid_vm_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

impl FromStr for LocalListener {
    type Err = ConfigError;

    /// Parses `[VM=]PATH`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let (vm, path) = match s.split_once('=') {
            Some((vm, path)) => (vm.to_string(), path),
            None => ("local".to_string(), s),
        };
        if !valid_vm_name(&vm) {
            return Err(ConfigError::BadVmName(vm));
        }
        if path.is_empty() {
            return Err(ConfigError::EmptyPath);
        }
        Ok(LocalListener {
            vm,
            path: PathBuf::from(path),
        })
    }
}

/// How a VM's vsock device reaches the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmTransport {
    /// Hira serves the vhost-user vsock device on this socket (QEMU's
    /// `vhost-user-vsock-pci`).
    VhostUser(PathBuf),
    /// The hypervisor's own hybrid vsock (cloud-hypervisor, Firecracker, started with
    /// `--vsock cid=N,socket=PATH`): guest connections to the Hira port arrive as Unix
    /// connections on `PATH_<port>`.
    Hybrid(PathBuf),
}

/// A VM the daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    pub name: String,
    pub cid: u32,
    pub transport: VmTransport,
    /// The VM's shared data window (ivshmem) file and size, for vhost-user VMs.
    pub window: Option<(PathBuf, u64)>,
}

impl VmSpec {
    /// For a hybrid-vsock VM, the Unix socket the hypervisor forwards guests to.
    pub fn listener(&self) -> Option<LocalListener> {
        let VmTransport::Hybrid(path) = &self.transport else {
            return None;
        };
        let mut p = path.clone().into_os_string();
        p.push(format!("_{}", crate::vsock::HIRA_PORT));
        Some(LocalListener {
            vm: self.name.clone(),
            path: PathBuf::from(p),
        })
    }
}

impl FromStr for VmSpec {
    type Err = ConfigError;

    /// Parses `name=NAME,socket=PATH,cid=N` or `name=NAME,hybrid=PATH,cid=N`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let (mut name, mut hybrid, mut socket, mut cid, mut window, mut window_mb) =
            (None, None, None, None, None, None);
        for kv in s.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ConfigError::NotKeyValue(kv.to_string()))?;
            let slot = match k {
                "name" => &mut name,
                "hybrid" => &mut hybrid,
                "socket" => &mut socket,
                "cid" => &mut cid,
                "window" => &mut window,
                "window-mb" => &mut window_mb,
                other => return Err(ConfigError::UnknownKey(other.to_string())),
            };
            if slot.replace(v.to_string()).is_some() {
                return Err(ConfigError::DuplicateKey(k.to_string()));
            }
        }
        let name = name.ok_or(ConfigError::Missing("name"))?;
        if !valid_vm_name(&name) {
            return Err(ConfigError::BadVmName(name));
        }
        let transport = match (socket, hybrid) {
            (Some(p), None) if !p.is_empty() => VmTransport::VhostUser(PathBuf::from(p)),
            (None, Some(p)) if !p.is_empty() => VmTransport::Hybrid(PathBuf::from(p)),
            (Some(_), None) | (None, Some(_)) => return Err(ConfigError::EmptyPath),
            _ => return Err(ConfigError::Transport),
        };
        let cid_text = cid.ok_or(ConfigError::Missing("cid"))?;
        let cid = cid_text
            .parse::<u32>()
            .ok()
            .filter(|c| (3..u32::MAX).contains(c))
            .ok_or(ConfigError::BadCid(cid_text))?;
        let window = match (window, window_mb) {
            (None, None) => None,
            (None, Some(_)) => return Err(ConfigError::Missing("window")),
            (Some(p), mb) => {
                if p.is_empty() {
                    return Err(ConfigError::EmptyPath);
                }
                if matches!(transport, VmTransport::Hybrid(_)) {
                    return Err(ConfigError::WindowNeedsVhostUser);
                }
                let mb_text = mb.unwrap_or_else(|| "64".into());
                let mb = mb_text
                    .parse::<u64>()
                    .ok()
                    .filter(|m| (4..=65536).contains(m))
                    .ok_or(ConfigError::BadWindowSize(mb_text))?;
                Some((PathBuf::from(p), mb << 20))
            }
        };
        Ok(VmSpec {
            name,
            cid,
            transport,
            window,
        })
    }
}

/// The daemon's validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listeners: Vec<LocalListener>,
    /// VMs whose vsock device Hira serves over vhost-user.
    pub vhost_user_vms: Vec<VmSpec>,
    /// The API-server executable.
    pub api_server: PathBuf,
    /// Host platform name filter passed to API servers.
    pub platform: Option<String>,
    /// Largest data window accepted from a guest, in bytes.
    pub max_window: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_path_belongs_to_local_vm() {
        let l: LocalListener = "/tmp/a.sock".parse().unwrap();
        assert_eq!(l.vm, "local");
        assert_eq!(l.path, PathBuf::from("/tmp/a.sock"));
    }

    #[test]
    fn named_vm_is_parsed() {
        let l: LocalListener = "vm1=/tmp/b.sock".parse().unwrap();
        assert_eq!(l.vm, "vm1");
    }

    #[test]
    fn vm_name_with_slash_is_rejected() {
        assert_eq!(
            "a/b=/tmp/x".parse::<LocalListener>(),
            Err(ConfigError::BadVmName("a/b".into()))
        );
    }

    #[test]
    fn hybrid_vm_listens_on_the_port_suffixed_socket() {
        let v: VmSpec = "name=vm2,hybrid=/run/ch/vm2.vsock,cid=4".parse().unwrap();
        assert_eq!(v.cid, 4);
        let l = v.listener().unwrap();
        assert_eq!(l.path, PathBuf::from("/run/ch/vm2.vsock_5571"));
        assert_eq!(l.vm, "vm2");
    }

    #[test]
    fn reserved_cid_is_rejected() {
        assert_eq!(
            "name=a,hybrid=/x,cid=2".parse::<VmSpec>(),
            Err(ConfigError::BadCid("2".into()))
        );
    }

    #[test]
    fn unknown_vm_setting_is_named() {
        assert_eq!(
            "name=a,hybrid=/x,cid=3,shares=2".parse::<VmSpec>(),
            Err(ConfigError::UnknownKey("shares".into()))
        );
    }

    #[test]
    fn repeated_vm_setting_is_rejected() {
        assert_eq!(
            "name=a,name=b,hybrid=/x,cid=3".parse::<VmSpec>(),
            Err(ConfigError::DuplicateKey("name".into()))
        );
    }

    #[test]
    fn vhost_user_vm_has_no_unix_listener() {
        let v: VmSpec = "name=q,socket=/run/hira/q.sock,cid=3".parse().unwrap();
        assert_eq!(
            v.transport,
            VmTransport::VhostUser(PathBuf::from("/run/hira/q.sock"))
        );
        assert!(v.listener().is_none());
    }

    #[test]
    fn window_defaults_to_64_mib() {
        let v: VmSpec = "name=q,socket=/s,cid=3,window=/dev/shm/q".parse().unwrap();
        assert_eq!(v.window, Some((PathBuf::from("/dev/shm/q"), 64 << 20)));
    }

    #[test]
    fn window_on_a_hybrid_vm_is_rejected() {
        assert_eq!(
            "name=q,hybrid=/s,cid=3,window=/w".parse::<VmSpec>(),
            Err(ConfigError::WindowNeedsVhostUser)
        );
    }

    #[test]
    fn tiny_window_is_rejected() {
        assert_eq!(
            "name=q,socket=/s,cid=3,window=/w,window-mb=1".parse::<VmSpec>(),
            Err(ConfigError::BadWindowSize("1".into()))
        );
    }

    #[test]
    fn both_transports_at_once_are_rejected() {
        assert_eq!(
            "name=a,socket=/x,hybrid=/y,cid=3".parse::<VmSpec>(),
            Err(ConfigError::Transport)
        );
        assert_eq!(
            "name=a,cid=3".parse::<VmSpec>(),
            Err(ConfigError::Transport)
        );
    }

    #[test]
    fn missing_cid_is_named() {
        assert_eq!(
            "name=a,hybrid=/x".parse::<VmSpec>(),
            Err(ConfigError::Missing("cid"))
        );
    }

    #[test]
    fn empty_path_is_rejected() {
        assert_eq!("vm=".parse::<LocalListener>(), Err(ConfigError::EmptyPath));
    }
}
