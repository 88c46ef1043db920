//! Hira's sharing policy: how much of the device each VM may use.
//!
//! Pure logic, no I/O and no clock: the daemon feeds a [`Scheduler`] what each VM's
//! API servers measured (device time of finished commands, commands in flight or held)
//! at each tick, and writes the [`Decision`] for each VM where that VM's API servers
//! enforce it, at the point where commands reach the device. Times are nanoseconds on
//! any monotonic clock the caller chooses.
//!
//! Three policies, all charged in measured device time and all work-conserving (a VM
//! is only ever held back while another VM has work for the device):
//!
//! - [`Wfq`]: weighted fair queuing by virtual time. Each VM's virtual time is its
//!   device time divided by its share; a VM whose virtual time runs more than a
//!   quantum ahead of the furthest-behind busy VM is held until that VM catches up. A
//!   VM that was idle re-enters at the others' virtual time, so idleness earns no
//!   credit. Device time is known only when a command finishes, so a command already
//!   dispatched is charged in advance at the VM's recent mean command length (and the
//!   advance replaced by the measurement when it finishes): a VM running a 100 ms
//!   kernel is not counted as behind while it runs. Nothing to tune but the quantum.
//! - [`FixedRate`]: the HIRA design's fixed-rate control: a VM using more than its share
//!   of recent device time (a sliding window) while others are busy has each of its
//!   commands delayed by a fixed time (default 50 ms). It needs tuning: a delay much
//!   shorter than the VM's commands changes little, a much longer one idles the VM.
//! - [`Aimd`]: the HIRA design's feedback control: each VM has an allowed rate (a
//!   fraction of device time) with a token bucket; over its share under contention the
//!   rate is cut multiplicatively, otherwise it grows additively back to the whole
//!   device.

use std::collections::BTreeMap;

/// Nanoseconds.
pub type Nanos = u64;

/// What a VM's commands may do until the next decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Reach the device at once.
    Run,
    /// Wait until a later decision says `Run`.
    Hold,
    /// Each command waits this long before it reaches the device.
    Delay(Nanos),
}

/// What the API servers of one VM reported since the last tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Device time of commands that finished since the last report.
    pub device_ns: Nanos,
    /// Commands on the device or queued for it now (enqueued, not finished).
    pub in_flight: u64,
    /// Commands held back by an earlier decision now.
    pub held: u64,
    /// Commands that finished since the last report (their time is in `device_ns`).
    pub finished: u64,
}

impl Report {
    /// Whether the VM had work for the device in the interval: something finished,
    /// or something is in flight or held now. (A VM that launches and waits for each
    /// command is momentarily idle between them; that is not idleness.)
    pub fn busy(&self) -> bool {
        self.device_ns > 0 || self.waiting()
    }

    /// Whether the VM has commands for the device now.
    pub fn waiting(&self) -> bool {
        self.in_flight > 0 || self.held > 0
    }

    /// Commands on the device (or queued for it) and not held.
    pub fn dispatched(&self) -> u64 {
        self.in_flight.saturating_sub(self.held)
    }
}

/// A sharing policy over VMs named by `String`.
pub trait Scheduler: Send {
    /// Sets a VM's share (its weight against the other VMs; at least 1). A VM not yet
    /// known joins with it.
    fn set_share(&mut self, vm: &str, share: u32);
    /// Forgets a VM.
    fn remove(&mut self, vm: &str);
    /// Takes this tick's report of every VM that has one (VMs not named reported
    /// nothing) and decides for every known VM.
    fn tick(
        &mut self,
        now: Nanos,
        reports: &BTreeMap<String, Report>,
    ) -> BTreeMap<String, Decision>;
    /// Short name, for logs and the control socket.
    fn name(&self) -> &'static str;
}

/// Which policy, for configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    #[default]
    Wfq,
    FixedRate,
    Aimd,
    /// First come, first served: every VM always runs (for comparison).
    Fifo,
}

/// A policy's name that names none.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {0:?} (known: wfq, fixed-rate, aimd, fifo)")]
pub struct UnknownPolicy(pub String);

impl std::str::FromStr for Kind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Kind, UnknownPolicy> {
        match s {
            "wfq" => Ok(Kind::Wfq),
            "fixed-rate" => Ok(Kind::FixedRate),
            "aimd" => Ok(Kind::Aimd),
            "fifo" => Ok(Kind::Fifo),
            other => Err(UnknownPolicy(other.to_string())),
        }
    }
}

/// A scheduler of `kind` with default parameters.
pub fn new(kind: Kind) -> Box<dyn Scheduler> {
    match kind {
        Kind::Wfq => Box::new(Wfq::default()),
        Kind::FixedRate => Box::new(FixedRate::default()),
        Kind::Aimd => Box::new(Aimd::default()),
        Kind::Fifo => Box::new(Fifo::default()),
    }
}

fn share_of(share: u32) -> u64 {
    u64::from(share.max(1))
}

/// Weighted fair queuing by virtual time.
#[derive(Debug)]
pub struct Wfq {
    /// How far (in device time at share 1) a VM may run ahead of the furthest-behind
    /// busy VM before it is held.
    pub quantum: Nanos,
    /// How long a VM counts as busy after it last had work for the device.
    pub grace: Nanos,
    vms: BTreeMap<String, WfqVm>,
    /// The system's virtual time (scaled as `WfqVm::vtime`).
    system: u128,
}

#[derive(Debug, Default)]
struct WfqVm {
    share: u32,
    /// Device time / share, in ns (kept as u128 scaled by 1000 for precision).
    vtime: u128,
    busy: bool,
    /// Recent mean device time of one command, in ns.
    mean_ns: f64,
    /// Commands dispatched and not finished now.
    dispatched: u64,
    /// When it last had work for the device.
    last_active: Option<Nanos>,
}

impl WfqVm {
    /// Virtual time with dispatched commands charged in advance at the mean length.
    fn ahead(&self) -> u128 {
        let advance = self.dispatched as f64 * self.mean_ns * 1000.0 / f64::from(self.share.max(1));
        self.vtime + advance as u128
    }
}

impl Default for Wfq {
    fn default() -> Self {
        Wfq {
            quantum: 20_000_000,
            grace: 3_000_000,
            vms: BTreeMap::new(),
            system: 0,
        }
    }
}

impl Wfq {
    /// A VM's virtual time in ns (for tests and reports).
    pub fn vtime(&self, vm: &str) -> Option<u128> {
        self.vms.get(vm).map(|v| v.vtime / 1000)
    }

    /// The system's virtual time follows the furthest-behind busy VM, never back.
    fn follow_busy(&mut self) {
        if let Some(min) = self.vms.values().filter(|v| v.busy).map(|v| v.vtime).min() {
            self.system = self.system.max(min);
        }
    }
}

impl Scheduler for Wfq {
    fn set_share(&mut self, vm: &str, share: u32) {
        self.vms.entry(vm.to_string()).or_default().share = share.max(1);
    }

    fn remove(&mut self, vm: &str) {
        self.vms.remove(vm);
    }

    fn tick(
        &mut self,
        now: Nanos,
        reports: &BTreeMap<String, Report>,
    ) -> BTreeMap<String, Decision> {
        for (name, r) in reports {
            let v = self.vms.entry(name.clone()).or_insert_with(|| WfqVm {
                share: 1,
                ..WfqVm::default()
            });
            if r.busy() {
                v.last_active = Some(now);
            }
            v.vtime += u128::from(r.device_ns) * 1000 / u128::from(share_of(v.share));
            if r.finished > 0 {
                let mean = r.device_ns as f64 / r.finished as f64;
                v.mean_ns = if v.mean_ns == 0.0 {
                    mean
                } else {
                    0.7 * v.mean_ns + 0.3 * mean
                };
            }
            v.dispatched = r.dispatched();
        }
        // The work the VMs busy until now report in this tick ran before any VM that
        // becomes busy in it could compete: the system's virtual time takes it in
        // first, or a VM's burst of finished commands reported in the tick in which
        // another VM turns up would count as a lead over that VM.
        self.follow_busy();
        // A VM that becomes busy starts at the system's virtual time: no credit for
        // the time it had nothing for the device. Busy is "active within the grace
        // period": a VM that launches and waits for each command is briefly idle
        // between them, and that is not idleness.
        let grace = self.grace;
        for v in self.vms.values_mut() {
            let busy = v
                .last_active
                .is_some_and(|t| now.saturating_sub(t) <= grace);
            if busy && !v.busy {
                v.vtime = v.vtime.max(self.system);
            }
            v.busy = busy;
        }
        self.follow_busy();
        // A VM is held while one that is further behind by more than a quantum is busy:
        // the device never idles for long for the sake of a VM that has nothing for
        // it. An idle VM that is ahead is held at its next command.
        let waiting: Vec<u128> = self
            .vms
            .values()
            .filter(|v| v.busy)
            .map(WfqVm::ahead)
            .collect();
        let quantum = u128::from(self.quantum) * 1000;
        self.vms
            .iter()
            .map(|(n, v)| {
                let d = if waiting.iter().any(|&w| w + quantum < v.ahead()) {
                    Decision::Hold
                } else {
                    Decision::Run
                };
                (n.clone(), d)
            })
            .collect()
    }

    fn name(&self) -> &'static str {
        "wfq"
    }
}

/// Device time each VM used in a sliding window of recent ticks.
#[derive(Debug, Default)]
struct Window {
    /// (tick time, device time) per VM, oldest first.
    samples: BTreeMap<String, std::collections::VecDeque<(Nanos, Nanos)>>,
}

impl Window {
    fn add(&mut self, now: Nanos, span: Nanos, reports: &BTreeMap<String, Report>) {
        for (n, r) in reports {
            self.samples
                .entry(n.clone())
                .or_default()
                .push_back((now, r.device_ns));
        }
        for q in self.samples.values_mut() {
            while q
                .front()
                .is_some_and(|&(t, _)| now.saturating_sub(t) > span)
            {
                q.pop_front();
            }
        }
    }

    fn used(&self, vm: &str) -> Nanos {
        self.samples
            .get(vm)
            .map_or(0, |q| q.iter().map(|&(_, d)| d).sum())
    }
}

/// Each VM's share of recent device time against what it is entitled to among the
/// busy VMs: `Some(used / entitled)` when another VM is busy, `None` otherwise.
fn overuse(
    vm: &str,
    shares: &BTreeMap<String, u32>,
    window: &Window,
    reports: &BTreeMap<String, Report>,
) -> Option<f64> {
    let busy = |n: &str| reports.get(n).is_some_and(Report::busy);
    if !shares.keys().any(|n| n != vm && busy(n)) {
        return None;
    }
    let total_share: u64 = shares
        .iter()
        .filter(|(n, _)| busy(n) || n.as_str() == vm)
        .map(|(_, &s)| share_of(s))
        .sum();
    let total_used: Nanos = shares.keys().map(|n| window.used(n)).sum();
    if total_used == 0 {
        return None;
    }
    let entitled = share_of(shares[vm]) as f64 / total_share as f64;
    let used = window.used(vm) as f64 / total_used as f64;
    Some(used / entitled)
}

/// Fixed-rate control: a VM over its share under contention has every command delayed
/// by `delay`.
#[derive(Debug)]
pub struct FixedRate {
    pub delay: Nanos,
    /// The sliding window shares are measured over.
    pub window: Nanos,
    shares: BTreeMap<String, u32>,
    recent: Window,
}

impl Default for FixedRate {
    fn default() -> Self {
        FixedRate {
            delay: 50_000_000,
            window: 500_000_000,
            shares: BTreeMap::new(),
            recent: Window::default(),
        }
    }
}

impl Scheduler for FixedRate {
    fn set_share(&mut self, vm: &str, share: u32) {
        self.shares.insert(vm.to_string(), share.max(1));
    }

    fn remove(&mut self, vm: &str) {
        self.shares.remove(vm);
        self.recent.samples.remove(vm);
    }

    fn tick(
        &mut self,
        now: Nanos,
        reports: &BTreeMap<String, Report>,
    ) -> BTreeMap<String, Decision> {
        for n in reports.keys() {
            self.shares.entry(n.clone()).or_insert(1);
        }
        self.recent.add(now, self.window, reports);
        self.shares
            .keys()
            .map(|n| {
                let d = match overuse(n, &self.shares, &self.recent, reports) {
                    Some(o) if o > 1.05 => Decision::Delay(self.delay),
                    _ => Decision::Run,
                };
                (n.clone(), d)
            })
            .collect()
    }

    fn name(&self) -> &'static str {
        "fixed-rate"
    }
}

/// Additive-increase, multiplicative-decrease rate control with a token bucket.
#[derive(Debug)]
pub struct Aimd {
    /// Added to a VM's allowed rate (fraction of device time) per tick when it is not
    /// over its share.
    pub increase: f64,
    /// Factor on the rate when it is.
    pub decrease: f64,
    /// Lowest allowed rate.
    pub floor: f64,
    /// Most device time a VM may bank.
    pub burst: Nanos,
    pub window: Nanos,
    vms: BTreeMap<String, AimdVm>,
    recent: Window,
    last: Option<Nanos>,
}

#[derive(Debug)]
struct AimdVm {
    share: u32,
    rate: f64,
    tokens: f64,
}

impl Default for Aimd {
    fn default() -> Self {
        Aimd {
            increase: 0.05,
            decrease: 0.5,
            floor: 0.02,
            burst: 50_000_000,
            window: 500_000_000,
            vms: BTreeMap::new(),
            recent: Window::default(),
            last: None,
        }
    }
}

impl Aimd {
    /// A VM's allowed rate now (for tests and reports).
    pub fn rate(&self, vm: &str) -> Option<f64> {
        self.vms.get(vm).map(|v| v.rate)
    }
}

impl Scheduler for Aimd {
    fn set_share(&mut self, vm: &str, share: u32) {
        self.vms
            .entry(vm.to_string())
            .or_insert(AimdVm {
                share: 1,
                rate: 1.0,
                tokens: 0.0,
            })
            .share = share.max(1);
    }

    fn remove(&mut self, vm: &str) {
        self.vms.remove(vm);
        self.recent.samples.remove(vm);
    }

    fn tick(
        &mut self,
        now: Nanos,
        reports: &BTreeMap<String, Report>,
    ) -> BTreeMap<String, Decision> {
        for n in reports.keys() {
            if !self.vms.contains_key(n) {
                self.set_share(n, 1);
            }
        }
        let dt = self.last.map_or(0, |l| now.saturating_sub(l)) as f64;
        self.last = Some(now);
        self.recent.add(now, self.window, reports);
        let shares: BTreeMap<String, u32> =
            self.vms.iter().map(|(n, v)| (n.clone(), v.share)).collect();
        let mut out = BTreeMap::new();
        for (n, v) in &mut self.vms {
            let r = reports.get(n).copied().unwrap_or_default();
            match overuse(n, &shares, &self.recent, reports) {
                Some(o) if o > 1.05 => v.rate = (v.rate * self.decrease).max(self.floor),
                _ => v.rate = (v.rate + self.increase).min(1.0),
            }
            v.tokens = (v.tokens + v.rate * dt - r.device_ns as f64).min(self.burst as f64);
            let contended = shares
                .keys()
                .any(|m| m != n && reports.get(m).is_some_and(Report::busy));
            let d = if v.tokens < 0.0 && contended {
                Decision::Hold
            } else {
                if !contended {
                    v.tokens = v.tokens.max(0.0);
                }
                Decision::Run
            };
            out.insert(n.clone(), d);
        }
        // Work-conserving: the device never idles because every busy VM is held; the
        // one closest to its allowance runs.
        let busy: Vec<&String> = out
            .keys()
            .filter(|n| reports.get(*n).is_some_and(Report::busy))
            .collect();
        if !busy.is_empty() && busy.iter().all(|n| out[*n] == Decision::Hold) {
            let best = busy
                .iter()
                .max_by(|a, b| self.vms[**a].tokens.total_cmp(&self.vms[**b].tokens))
                .map(|n| (*n).clone());
            if let Some(n) = best {
                out.insert(n, Decision::Run);
            }
        }
        out
    }

    fn name(&self) -> &'static str {
        "aimd"
    }
}

/// Every VM always runs.
#[derive(Debug, Default)]
pub struct Fifo {
    vms: BTreeMap<String, ()>,
}

impl Scheduler for Fifo {
    fn set_share(&mut self, vm: &str, _share: u32) {
        self.vms.insert(vm.to_string(), ());
    }

    fn remove(&mut self, vm: &str) {
        self.vms.remove(vm);
    }

    fn tick(
        &mut self,
        _now: Nanos,
        reports: &BTreeMap<String, Report>,
    ) -> BTreeMap<String, Decision> {
        for n in reports.keys() {
            self.vms.insert(n.clone(), ());
        }
        self.vms
            .keys()
            .map(|n| (n.clone(), Decision::Run))
            .collect()
    }

    fn name(&self) -> &'static str {
        "fifo"
    }
}

#[cfg(test)]
mod sim;
