//! Daemon configuration.

use std::path::PathBuf;
use std::str::FromStr;

/// Default host-local listener (matches the guest driver's default `HIRA_SOCKET`).
pub const DEFAULT_LOCAL_SOCKET: &str = "/run/hira/local.sock";

/// Errors in a listener spec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("empty listener path")]
    EmptyPath,
    #[error("VM name {0:?} must be 1-64 characters of letters, digits, '-', '_' or '.'")]
    BadVmName(String),
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
    fn empty_path_is_rejected() {
        assert_eq!("vm=".parse::<LocalListener>(), Err(ConfigError::EmptyPath));
    }
}
