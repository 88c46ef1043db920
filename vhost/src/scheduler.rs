//! The scheduler thread: the daemon's side of sharing device time.
//!
//! At each tick it reads what every VM's API servers measured (device time of
//! finished commands, commands in flight and held: the usage pages, no message), feeds
//! the configured `hira_policy` scheduler with each VM's share, and writes each VM's
//! decision into its page, where its API servers apply it as commands reach the
//! device. It never touches a frame and never waits on a session.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hira_policy::{Decision, Report};
use hira_protocol::usage::Gate;
use log::{info, warn};

use crate::vms::Vms;

/// How often decisions are made while any VM has a session.
pub const TICK: Duration = Duration::from_millis(2);
/// How often the thread looks for sessions while there are none.
const IDLE_TICK: Duration = Duration::from_millis(50);

/// Runs the scheduler until the daemon exits.
pub fn run(vms: Arc<Vms>, kind: hira_policy::Kind) {
    let mut sched = hira_policy::new(kind);
    info!(
        "scheduler: {} policy, a decision every {TICK:?}",
        sched.name()
    );
    let start = Instant::now();
    // Device time and finished commands each live session had reported at the last
    // tick.
    let mut seen: HashMap<(String, u64), (u64, u64)> = HashMap::new();
    loop {
        let all = vms.snapshot();
        let live = all.iter().any(|(_, q)| q.sessions() > 0);
        std::thread::sleep(if live { TICK } else { IDLE_TICK });
        let mut reports = BTreeMap::new();
        let mut still: HashMap<(String, u64), (u64, u64)> = HashMap::with_capacity(seen.len());
        for (name, q) in &all {
            sched.set_share(name, q.share());
            let mut r = Report::default();
            for (id, u) in q.live_usage() {
                let key = (name.clone(), id);
                let (ns, done) = seen.get(&key).copied().unwrap_or((0, 0));
                r.device_ns += u.device_ns.saturating_sub(ns);
                r.finished += u.finished.saturating_sub(done);
                r.in_flight += u.in_flight;
                r.held += u.held;
                still.insert(key, (u.device_ns, u.finished));
            }
            reports.insert(name.clone(), r);
        }
        seen = still;
        let now = start.elapsed().as_nanos() as u64;
        for (name, d) in sched.tick(now, &reports) {
            let gate = match d {
                Decision::Run => Gate::Run,
                Decision::Hold => Gate::Hold,
                Decision::Delay(ns) => Gate::Delay(ns),
            };
            if let Some(q) = vms.get(&name)
                && let Err(e) = q.set_gate(gate)
            {
                warn!("VM {name:?}: cannot publish its scheduling decision: {e}");
            }
        }
    }
}
