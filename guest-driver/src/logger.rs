//! The guest libraries' own logger: lines on standard error, as `HIRA_LOG` says.
//!
//! A shim lives inside an application that may install a logger of its own, so each
//! shim installs this private one for its copy of `log` (every shim library links its
//! own) and never the application's.

use std::sync::OnceLock;

use log::LevelFilter;

/// The level `HIRA_LOG` names: `error`, `warn`, `info`, `debug`, `trace` or `off`;
/// `None` for anything else.
pub fn parse_level(text: &str) -> Option<LevelFilter> {
    match text {
        "off" => Some(LevelFilter::Off),
        "error" => Some(LevelFilter::Error),
        "warn" => Some(LevelFilter::Warn),
        "info" => Some(LevelFilter::Info),
        "debug" => Some(LevelFilter::Debug),
        "trace" => Some(LevelFilter::Trace),
        _ => None,
    }
}

struct Stderr {
    name: &'static str,
}

impl log::Log for Stderr {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!(
                "{}[{}] {}: {}",
                self.name,
                std::process::id(),
                r.level(),
                r.args()
            );
        }
    }

    fn flush(&self) {}
}

/// Installs the logger once, its lines headed by `name` and the process id, at the
/// level `HIRA_LOG` names (warnings when unset; a value it does not name is said once,
/// and warnings it is). Later calls do nothing.
pub fn init(name: &'static str) {
    static LOGGER: OnceLock<Stderr> = OnceLock::new();
    if LOGGER.get().is_some() {
        return;
    }
    let logger = LOGGER.get_or_init(|| Stderr { name });
    let text = std::env::var("HIRA_LOG").ok();
    let level = text.as_deref().map_or(Some(LevelFilter::Warn), parse_level);
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level.unwrap_or(LevelFilter::Warn));
        if level.is_none() {
            log::warn!(
                "HIRA_LOG={:?} names no level (off, error, warn, info, debug, trace); warnings it is",
                text.unwrap_or_default()
            );
        }
        for p in &crate::settings::settings().problems {
            log::warn!("{p}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_hira_log_documents_reads_and_nothing_else() {
        assert_eq!(parse_level("off"), Some(LevelFilter::Off));
        assert_eq!(parse_level("debug"), Some(LevelFilter::Debug));
        assert_eq!(parse_level("trace"), Some(LevelFilter::Trace));
        assert_eq!(parse_level("Debug"), None);
        assert_eq!(parse_level(""), None);
    }
}
