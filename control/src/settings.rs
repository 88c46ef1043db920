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
}

impl SettingError {
    /// The setting an error is about, as the config file names it.
    pub fn key(&self) -> &'static str {
        match self {
            SettingError::Size(_) => "mem_quota",
            SettingError::Share(_) => "share",
            SettingError::MaxSessions(_) => "max_sessions",
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
}
