//! A VM's settings as operators write them (`64M`, `share=3`), read the same way by
//! the daemon's flags and config file and by `hira-ctl set`.

use std::ops::RangeInclusive;

/// A VM's share of device time: its weight against other VMs.
pub const SHARES: RangeInclusive<u32> = 1..=1000;
/// A VM's cap on sessions (API servers).
pub const MAX_SESSIONS: RangeInclusive<usize> = 1..=4096;

/// A setting that does not read as one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error(
        "size {0:?} must be a positive number of bytes, optionally with K, M, G or T (binary: 64M, 2G)"
    )]
    Size(String),
    #[error("share {0:?} must be a number from 1 to 1000")]
    Share(String),
    #[error("max-sessions {0:?} must be a number from 1 to 4096")]
    MaxSessions(String),
    #[error("VM setting `{0}` given twice")]
    Twice(String),
}

impl SettingError {
    /// The setting an error is about, as the config file names it.
    pub fn key(&self) -> &'static str {
        match self {
            SettingError::Size(_) => "mem_quota",
            SettingError::Share(_) => "share",
            SettingError::MaxSessions(_) => "max_sessions",
            SettingError::Twice(_) => "",
        }
    }
}

/// Parses a size in bytes: a number, optionally followed by K, M, G or T (powers of
/// 1024; `KiB`-style and `B` suffixes are accepted too). Zero is refused.
pub fn parse_size(text: &str) -> Result<u64, SettingError> {
    let bad = || SettingError::Size(text.to_string());
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => return Err(bad()),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).filter(|&b| b > 0).ok_or_else(bad)
}

/// Parses a VM's share of the device (its weight against other VMs): 1 to 1000.
pub fn parse_share(text: &str) -> Result<u32, SettingError> {
    text.parse::<u32>()
        .ok()
        .filter(|n| SHARES.contains(n))
        .ok_or_else(|| SettingError::Share(text.to_string()))
}

/// Parses a VM's cap on sessions (API servers): 1 to 4096.
pub fn parse_max_sessions(text: &str) -> Result<usize, SettingError> {
    text.parse::<usize>()
        .ok()
        .filter(|n| MAX_SESSIONS.contains(n))
        .ok_or_else(|| SettingError::MaxSessions(text.to_string()))
}

/// A VM's own limits and share: what `--local`, `--vm`, the config file's `[[local]]`
/// and `[[vm]]` and `hira-ctl` may set for it, read by one parser. `None`: not set
/// here (the daemon-wide default, or no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmSettings {
    /// Device memory its sessions may hold together, in bytes.
    pub mem_quota: Option<u64>,
    /// Its share of device time against other VMs.
    pub share: Option<u32>,
    /// Most sessions (API servers) it has at once.
    pub max_sessions: Option<usize>,
    /// Host memory its API servers may use together, in bytes (needs `--cgroup`).
    pub host_mem: Option<u64>,
}

impl VmSettings {
    /// The keys, as operators write them.
    pub const KEYS: [&str; 4] = ["mem-quota", "share", "max-sessions", "host-mem"];

    /// Takes `key=value` if `key` is one of [`VmSettings::KEYS`] (true), else leaves
    /// it (false). A key given twice, or a value that does not read, is an error.
    pub fn take(&mut self, key: &str, value: &str) -> Result<bool, SettingError> {
        fn once<T>(slot: &mut Option<T>, key: &str) -> Result<(), SettingError> {
            match slot {
                Some(_) => Err(SettingError::Twice(key.to_string())),
                None => Ok(()),
            }
        }
        match key {
            "mem-quota" => {
                once(&mut self.mem_quota, key)?;
                self.mem_quota = Some(parse_size(value)?);
            }
            "share" => {
                once(&mut self.share, key)?;
                self.share = Some(parse_share(value)?);
            }
            "max-sessions" => {
                once(&mut self.max_sessions, key)?;
                self.max_sessions = Some(parse_max_sessions(value)?);
            }
            "host-mem" => {
                once(&mut self.host_mem, key)?;
                self.host_mem = Some(parse_size(value)?);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Reads the settings given as (key, value) pairs; `None` values are not given.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, Option<String>)>,
    ) -> Result<VmSettings, SettingError> {
        let mut s = VmSettings::default();
        for (k, v) in pairs {
            if let Some(v) = v {
                s.take(k, &v)?;
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_shares_and_caps_read_as_operators_write_them() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["0", "", "M", "12X", "-1", "99999999999T"] {
            assert_eq!(parse_size(bad), Err(SettingError::Size(bad.into())));
        }
        assert_eq!(parse_share("1000"), Ok(1000));
        assert_eq!(parse_share("0").unwrap_err().key(), "share");
        assert_eq!(parse_max_sessions("4096"), Ok(4096));
        assert!(parse_max_sessions("4097").is_err());
    }

    #[test]
    fn a_vms_settings_are_taken_once_each_and_other_keys_left() {
        let mut s = VmSettings::default();
        assert_eq!(s.take("mem-quota", "1G"), Ok(true));
        assert_eq!(s.take("share", "3"), Ok(true));
        assert_eq!(s.take("cid", "3"), Ok(false));
        assert_eq!(
            s.take("share", "4"),
            Err(SettingError::Twice("share".into()))
        );
        assert_eq!(s.take("host-mem", "0"), Err(SettingError::Size("0".into())));
        assert_eq!(
            (s.mem_quota, s.share, s.host_mem),
            (Some(1 << 30), Some(3), None)
        );
        let f = VmSettings::from_pairs([("max-sessions", Some("8".into())), ("share", None)]);
        assert_eq!(f.unwrap().max_sessions, Some(8));
    }
}
