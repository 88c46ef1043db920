//! Per-call statistics (`HIRA_STATS=1`): for each API function the application called,
//! how often, how long it took in total and on average, how many bytes crossed to
//! the host and back (frames and data), and of those the object data a map brought
//! in and an unmap sent back. Printed to stderr when the process exits (`HIRA_STATS=PATH`
//! writes them to PATH instead).
//!
//! Only the application's own calls count: a call the shim makes while serving
//! another (a read issued by `clEnqueueMapBuffer`) is accounted to the outer call.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::Write;
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

/// Whether statistics are collected: `HIRA_STATS` is set to anything but `0`.
static SETTING: LazyLock<Option<String>> =
    LazyLock::new(|| hira_guest_driver::settings::settings().stats.clone());

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    calls: u64,
    nanos: u128,
    sent: u64,
    received: u64,
    /// Object data a map brought into the guest, and an unmap sent back.
    data_in: u64,
    data_out: u64,
}

static TABLE: LazyLock<Mutex<HashMap<&'static str, Entry>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

thread_local! {
    /// The application-facing function this thread is inside, if any.
    static CURRENT: Cell<Option<&'static str>> = const { Cell::new(None) };
}

fn enabled() -> bool {
    SETTING.is_some()
}

/// Times one API entry point; only the outermost one on a thread is recorded.
pub(crate) fn timed<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    if !enabled() || CURRENT.with(|c| c.get().is_some()) {
        return f();
    }
    CURRENT.with(|c| c.set(Some(name)));
    let t0 = Instant::now();
    let out = f();
    let dt = t0.elapsed().as_nanos();
    CURRENT.with(|c| c.set(None));
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let e = t.entry(name).or_default();
    e.calls += 1;
    e.nanos += dt;
    out
}

/// Adds to the current application call's entry with `add`.
fn count(add: impl FnOnce(&mut Entry)) {
    if !enabled() {
        return;
    }
    let Some(name) = CURRENT.with(Cell::get) else {
        return;
    };
    add(TABLE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(name)
        .or_default());
}

/// Counts bytes moved for the current application call.
pub(crate) fn bytes(sent: usize, received: usize) {
    count(|e| {
        e.sent += sent as u64;
        e.received += received as u64;
    });
}

/// Counts object data moved for the current application call: `into_guest` bytes a
/// map brought in, `to_host` bytes an unmap sent back.
pub(crate) fn data(into_guest: usize, to_host: usize) {
    count(|e| {
        e.data_in += into_guest as u64;
        e.data_out += to_host as u64;
    });
}

/// The report, one line per function, busiest first, then a totals line.
fn report() -> String {
    let t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rows: Vec<(&&str, &Entry)> = t.iter().collect();
    rows.sort_by(|a, b| b.1.nanos.cmp(&a.1.nanos).then(a.0.cmp(b.0)));
    let mut s = format!(
        "hira-stats: {:<36} {:>10} {:>12} {:>10} {:>14} {:>14} {:>14} {:>14}\n",
        "function",
        "calls",
        "total ms",
        "mean us",
        "bytes sent",
        "bytes recv",
        "data in",
        "data out"
    );
    let (mut calls, mut sent, mut received) = (0u64, 0u64, 0u64);
    for (name, e) in rows {
        calls += e.calls;
        sent += e.sent;
        received += e.received;
        s.push_str(&format!(
            "hira-stats: {:<36} {:>10} {:>12.3} {:>10.2} {:>14} {:>14} {:>14} {:>14}\n",
            name,
            e.calls,
            e.nanos as f64 / 1e6,
            e.nanos as f64 / 1e3 / e.calls.max(1) as f64,
            e.sent,
            e.received,
            e.data_in,
            e.data_out
        ));
    }
    let round_trips =
        hira_guest_driver::conn::ROUND_TRIPS.load(std::sync::atomic::Ordering::Relaxed);
    // Which calls waited for the host, the shim's own included (a query it makes
    // to answer another): what a GPU host across a network makes visible.
    let by_op = hira_guest_driver::conn::round_trips_by_opcode();
    if !by_op.is_empty() {
        let names: Vec<String> = by_op
            .iter()
            .map(|(op, n)| {
                let name = hira_apis_opencl::op_info(*op).map_or("?", |o| o.name);
                format!("{name}={n}")
            })
            .collect();
        s.push_str(&format!(
            "hira-stats: round trips by call: {}\n",
            names.join(" ")
        ));
    }
    s.push_str(&format!(
        "hira-stats: total calls={calls} bytes_sent={sent} bytes_received={received} round_trips={round_trips}\n"
    ));
    s
}

extern "C" fn print_at_exit() {
    let Some(setting) = SETTING.as_deref() else {
        return;
    };
    let text = report();
    if setting == "1" {
        let _ = std::io::stderr().write_all(text.as_bytes());
    } else if let Err(e) = std::fs::write(setting, text) {
        eprintln!("hira: cannot write statistics to {setting}: {e}");
    }
}

/// Runs `print_at_exit` when the library is unloaded or the process exits.
#[used]
#[unsafe(link_section = ".fini_array")]
static PRINT_AT_EXIT: extern "C" fn() = print_at_exit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_totals_every_function() {
        {
            let mut t = TABLE.lock().unwrap();
            t.insert(
                "clFinish",
                Entry {
                    calls: 2,
                    nanos: 4000,
                    sent: 16,
                    received: 8,
                    ..Entry::default()
                },
            );
            t.insert(
                "clEnqueueWriteBuffer",
                Entry {
                    calls: 1,
                    nanos: 9000,
                    sent: 4096,
                    received: 4,
                    data_in: 0,
                    data_out: 4000,
                },
            );
        }
        let r = report();
        assert!(
            r.lines().nth(1).unwrap().contains("clEnqueueWriteBuffer"),
            "busiest first:\n{r}"
        );
        assert!(
            r.lines().nth(1).unwrap().ends_with(" 0           4000"),
            "data columns last:\n{r}"
        );
        assert!(
            r.contains("hira-stats: total calls=3 bytes_sent=4112 bytes_received=12 round_trips="),
            "{r}"
        );
    }
}
