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
    #[error("unknown VM setting `{0}` (known: name, hybrid, cid)")]
    UnknownKey(String),
    #[error("VM setting `{0}` given twice")]
    DuplicateKey(String),
    #[error("VM spec lacks `{0}`")]
    Missing(&'static str),
    #[error("CID {0:?} must be a number from 3 to 4294967294 (0-2 are reserved)")]
    BadCid(String),
    #[error(
        "the vhost-user transport (`socket=`) is not available yet; use `hybrid=` (cloud-hypervisor, Firecracker)"
    )]
    VhostUserNotYet,
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

/// A VM served over its hypervisor's hybrid vsock (cloud-hypervisor, Firecracker):
/// guest connections to the Hira port on the host CID arrive as Unix connections on
/// `<vsock socket>_<port>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    pub name: String,
    pub cid: u32,
    /// The VM's vsock socket as given to the hypervisor (`--vsock cid=N,socket=PATH`).
    pub hybrid: PathBuf,
}

impl VmSpec {
    /// The Unix socket the hypervisor forwards guest connections to.
    pub fn listener(&self) -> LocalListener {
        let mut p = self.hybrid.clone().into_os_string();
        p.push(format!("_{}", crate::vsock::HIRA_PORT));
        LocalListener {
            vm: self.name.clone(),
            path: PathBuf::from(p),
        }
    }
}

impl FromStr for VmSpec {
    type Err = ConfigError;

    /// Parses `name=NAME,hybrid=PATH,cid=N`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let (mut name, mut hybrid, mut cid) = (None, None, None);
        for kv in s.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ConfigError::NotKeyValue(kv.to_string()))?;
            let slot = match k {
                "name" => &mut name,
                "hybrid" => &mut hybrid,
                "cid" => &mut cid,
                "socket" => return Err(ConfigError::VhostUserNotYet),
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
        let hybrid = hybrid.ok_or(ConfigError::Missing("hybrid"))?;
        if hybrid.is_empty() {
            return Err(ConfigError::EmptyPath);
        }
        let cid_text = cid.ok_or(ConfigError::Missing("cid"))?;
        let cid = cid_text
            .parse::<u32>()
            .ok()
            .filter(|c| (3..u32::MAX).contains(c))
            .ok_or(ConfigError::BadCid(cid_text))?;
        Ok(VmSpec {
            name,
            cid,
            hybrid: PathBuf::from(hybrid),
        })
    }
}

/// The daemon's validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listeners: Vec<LocalListener>,
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
        assert_eq!(v.listener().path, PathBuf::from("/run/ch/vm2.vsock_5571"));
        assert_eq!(v.listener().vm, "vm2");
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
    fn vhost_user_socket_says_it_is_not_available_yet() {
        assert_eq!(
            "name=a,socket=/x,cid=3".parse::<VmSpec>(),
            Err(ConfigError::VhostUserNotYet)
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
