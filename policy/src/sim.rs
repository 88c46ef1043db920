//! A simulated device for testing the policies: VMs submit commands of fixed lengths
//! back to back (one outstanding each, as `clFinish` after each launch would), the
//! device runs one command at a time in arrival order, and the scheduler decides at
//! each tick from what the device reported, exactly as the daemon does.

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;

use super::*;

const MS: Nanos = 1_000_000;
const STEP: Nanos = 50_000;
const TICK: Nanos = 2 * MS;

/// One simulated VM's workload.
#[derive(Debug, Clone)]
struct Load {
    name: String,
    share: u32,
    /// Length of each command.
    len: Nanos,
    /// Busy only in `[from, until)`.
    from: Nanos,
    until: Nanos,
    /// Host-side work between commands (the VM has nothing for the device meanwhile).
    think: Nanos,
}

impl Load {
    fn new(name: &str, share: u32, len: Nanos) -> Load {
        Load {
            name: name.into(),
            share,
            len,
            from: 0,
            until: Nanos::MAX,
            think: 0,
        }
    }
}

#[derive(Debug, Default)]
struct VmSim {
    /// A command waiting to be admitted (held or delayed): since when.
    pending: Option<Nanos>,
    /// A command admitted to the device queue or running.
    in_device: bool,
    /// When the last command finished.
    finished: Nanos,
    /// Commands finished since the last tick.
    done: u64,
    done_ns: Nanos,
}

/// Device time per VM in each window of `window` ns.
struct Trace {
    window: Nanos,
    per_window: Vec<BTreeMap<String, Nanos>>,
}

impl Trace {
    fn add(&mut self, t: Nanos, vm: &str, ns: Nanos) {
        let i = (t / self.window) as usize;
        while self.per_window.len() <= i {
            self.per_window.push(BTreeMap::new());
        }
        *self.per_window[i].entry(vm.to_string()).or_default() += ns;
    }

    /// |t1 - t2| / (t1 + t2) per window for two VMs (windows where both ran).
    fn unfairness(&self, a: &str, b: &str, skip: usize) -> Vec<f64> {
        self.per_window
            .iter()
            .skip(skip)
            .filter_map(|w| {
                let (x, y) = (*w.get(a)? as f64, *w.get(b)? as f64);
                Some((x - y).abs() / (x + y))
            })
            .collect()
    }

    fn total(&self, vm: &str, skip: usize) -> Nanos {
        self.per_window
            .iter()
            .skip(skip)
            .map(|w| w.get(vm).copied().unwrap_or(0))
            .sum()
    }
}

/// Runs `loads` for `duration` under `sched` on a device that runs one command at a
/// time (a GPU); device time is traced per `window`.
fn simulate(sched: &mut dyn Scheduler, loads: &[Load], duration: Nanos, window: Nanos) -> Trace {
    simulate_on(sched, loads, duration, window, false)
}

/// As [`simulate`]; with `shared`, every admitted command runs at once, each at
/// 1/k of the speed with k running, and is charged its wall time (a CPU device whose
/// cores the host's scheduler time-slices).
fn simulate_on(
    sched: &mut dyn Scheduler,
    loads: &[Load],
    duration: Nanos,
    window: Nanos,
    shared: bool,
) -> Trace {
    for l in loads {
        sched.set_share(&l.name, l.share);
    }
    let mut vms: BTreeMap<String, VmSim> = loads
        .iter()
        .map(|l| (l.name.clone(), VmSim::default()))
        .collect();
    let mut decisions: BTreeMap<String, Decision> = BTreeMap::new();
    // Device queue: (vm, remaining ns); the front runs.
    let mut device: VecDeque<(String, Nanos)> = VecDeque::new();
    let mut trace = Trace {
        window,
        per_window: Vec::new(),
    };
    let mut t = 0;
    while t < duration {
        // The device runs the front command for one step, or all of them sharing it.
        let running = if shared {
            device.len()
        } else {
            device.len().min(1)
        };
        let mut finished = Vec::new();
        for (i, (vm, left)) in device.iter_mut().enumerate().take(running) {
            let run = (STEP / running as Nanos).max(1).min(*left);
            *left -= run;
            // Charged the wall time it occupied the device.
            trace.add(t, vm, STEP);
            let v = vms.get_mut(vm.as_str()).unwrap();
            v.done_ns += STEP;
            if *left == 0 {
                v.in_device = false;
                v.finished = t;
                v.done += 1;
                finished.push(i);
            }
        }
        for i in finished.into_iter().rev() {
            device.remove(i);
        }
        // Submissions and admissions (a VM resubmits as soon as its command finished).
        for l in loads {
            let v = vms.get_mut(&l.name).unwrap();
            let active = t >= l.from && t < l.until;
            let thought = t >= v.finished + l.think;
            if active && thought && !v.in_device && v.pending.is_none() {
                v.pending = Some(t);
            }
            if let Some(since) = v.pending {
                let admit = match decisions.get(&l.name).copied().unwrap_or(Decision::Run) {
                    Decision::Run => true,
                    Decision::Hold => false,
                    Decision::Delay(d) => t >= since + d,
                };
                if admit {
                    v.pending = None;
                    v.in_device = true;
                    device.push_back((l.name.clone(), l.len));
                }
            }
        }
        t += STEP;
        if t % TICK == 0 {
            let reports = vms
                .iter_mut()
                .map(|(n, v)| {
                    let r = Report {
                        device_ns: std::mem::take(&mut v.done_ns),
                        in_flight: u64::from(v.in_device) + u64::from(v.pending.is_some()),
                        held: u64::from(v.pending.is_some()),
                        finished: std::mem::take(&mut v.done),
                    };
                    (n.clone(), r)
                })
                .collect();
            decisions = sched.tick(t, &reports);
        }
    }
    trace
}

fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty());
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn two_lengths(share_long: u32) -> Vec<Load> {
    vec![
        Load::new("long", share_long, 100 * MS),
        Load::new("short", 1, MS),
    ]
}

#[test]
fn fifo_lets_long_commands_take_the_device() {
    let t = simulate(
        &mut Fifo::default(),
        &two_lengths(1),
        10_000 * MS,
        1000 * MS,
    );
    let u = median(t.unfairness("long", "short", 1));
    assert!(
        u > 0.9,
        "FIFO unfairness {u}: the baseline the policies must beat"
    );
}

#[test]
fn wfq_shares_equally_between_long_and_short_commands() {
    let t = simulate(&mut Wfq::default(), &two_lengths(1), 20_000 * MS, 1000 * MS);
    let u = t.unfairness("long", "short", 1);
    assert!(median(u.clone()) < 0.1, "median unfairness {u:?}");
    let (a, b) = (t.total("long", 1) as f64, t.total("short", 1) as f64);
    assert!((a / b - 1.0).abs() < 0.05, "long {a} short {b}");
    // Work-conserving: the device never idles while someone has work.
    assert!(a + b > 0.97 * 19_000.0 * MS as f64, "utilisation {}", a + b);
}

#[test]
fn wfq_shares_a_time_sliced_device_too() {
    // Both kernels run at once, each charged its wall time: a VM with long kernels
    // must not look "behind" while one of them runs.
    for (share_short, want) in [(1u32, 1.0), (3, 3.0)] {
        let loads = vec![
            Load::new("long", 1, 100 * MS),
            Load::new("short", share_short, MS),
        ];
        let t = simulate_on(&mut Wfq::default(), &loads, 20_000 * MS, 1000 * MS, true);
        let (a, b) = (t.total("long", 1) as f64, t.total("short", 1) as f64);
        assert!(
            (b / a / want - 1.0).abs() < 0.15,
            "share {share_short}: short {b} long {a}"
        );
    }
}

#[test]
fn wfq_honours_a_three_to_one_share() {
    let t = simulate(&mut Wfq::default(), &two_lengths(3), 20_000 * MS, 1000 * MS);
    let (a, b) = (t.total("long", 1) as f64, t.total("short", 1) as f64);
    assert!(
        (a / b - 3.0).abs() < 0.3,
        "long {a} short {b}: ratio {}",
        a / b
    );
}

#[test]
fn wfq_gives_a_lone_vm_the_whole_device_and_no_credit_for_idling() {
    let mut loads = two_lengths(1);
    // "short" sleeps for the first 5 s, then works.
    loads[1].from = 5_000 * MS;
    let t = simulate(&mut Wfq::default(), &loads, 15_000 * MS, 1000 * MS);
    let alone: Nanos = (0..5)
        .map(|w| t.per_window[w].get("long").copied().unwrap_or(0))
        .sum();
    assert!(alone > 4_950 * MS, "alone it had {alone} ns of 5 s");
    // Once both are busy, neither is starved in any second (no banked credit).
    for w in 6..15 {
        let s = t.per_window[w].get("short").copied().unwrap_or(0);
        let l = t.per_window[w].get("long").copied().unwrap_or(0);
        assert!(
            s > 300 * MS && l > 300 * MS,
            "window {w}: short {s} long {l}"
        );
    }
}

/// A VM's device time can arrive in a burst (a real CUDA driver's launches are timed
/// when the stream is next synchronised): a burst reported in the very tick in which
/// another VM first has work ran before that VM competed, and is no lead over it.
#[test]
fn wfq_counts_no_lead_for_work_reported_as_another_vm_turns_up() {
    let report = |device_ns, in_flight, finished| Report {
        device_ns,
        in_flight,
        held: 0,
        finished,
    };
    let mut w = Wfq::default();
    let mut now = 0;
    let mut tick = |w: &mut Wfq, reports: &[(&str, Report)]| {
        now += 2 * MS;
        let r: BTreeMap<String, Report> =
            reports.iter().map(|(n, r)| (n.to_string(), *r)).collect();
        w.tick(now, &r)
    };
    // "ahead" alone has 80 launches in flight for a few ticks, nothing timed yet.
    for _ in 0..5 {
        tick(
            &mut w,
            &[("ahead", report(0, 80, 0)), ("behind", Report::default())],
        );
    }
    // Their 240 ms arrive together, in the tick in which "behind" first has work.
    let d = tick(
        &mut w,
        &[
            ("ahead", report(240 * MS, 0, 80)),
            ("behind", report(0, 1, 0)),
        ],
    );
    assert_eq!(d["ahead"], Decision::Run, "{w:?}");
    assert_eq!(w.vtime("behind"), w.vtime("ahead"));
    // From there on a lead counts: one more long launch puts it a quantum ahead.
    let d = tick(
        &mut w,
        &[
            ("ahead", report(30 * MS, 0, 1)),
            ("behind", report(0, 1, 0)),
        ],
    );
    assert_eq!(d["ahead"], Decision::Hold);
    assert_eq!(d["behind"], Decision::Run);
}

#[test]
fn wfq_does_not_hold_a_vm_for_one_that_mostly_computes_on_the_host() {
    let mut loads = two_lengths(1);
    // "short" needs the device 1 ms in every 50.
    loads[1].think = 49 * MS;
    let t = simulate(&mut Wfq::default(), &loads, 10_000 * MS, 1000 * MS);
    let (a, b) = (t.total("long", 1), t.total("short", 1));
    // The device does not preempt: each of its commands may wait for one long command
    // (100 ms) and a tick (2 ms), so each cycle takes at most 49 + 100 + 2 + 1 ms.
    assert!(b >= 9_000 / 152 * MS, "the sparse VM ran {b} ns");
    // After each of its commands the sparse VM counts as busy for the grace period
    // (3 ms) and up to a tick (2 ms), in which the other may be held: at most 5 ms of
    // each cycle of at least 50 ms.
    assert!(
        a + b > 9_000 * MS / 50 * 45,
        "the device idled: {} ns of 9 s used",
        a + b
    );
}

#[test]
fn rate_control_modes_cut_the_long_vms_excess() {
    for s in [
        &mut FixedRate::default() as &mut dyn Scheduler,
        &mut Aimd::default(),
    ] {
        let name = s.name();
        let t = simulate(s, &two_lengths(1), 20_000 * MS, 1000 * MS);
        let (a, b) = (t.total("long", 2) as f64, t.total("short", 2) as f64);
        let share = a / (a + b);
        assert!(
            share < 0.75,
            "{name}: long VM still has {share:.2} of the device"
        );
        assert!(
            a + b > 0.9 * 18_000.0 * MS as f64,
            "{name}: utilisation {}",
            a + b
        );
    }
}

#[test]
fn policies_parse_and_construct() {
    for k in ["wfq", "fixed-rate", "aimd", "fifo"] {
        assert_eq!(new(k.parse().unwrap()).name(), k);
    }
    assert!("lottery".parse::<Kind>().is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any shares and command lengths: each busy VM gets its share of the device within
    /// tolerance, and the device stays busy.
    #[test]
    fn wfq_honours_any_shares(
        vms in proptest::collection::vec((1u32..6, 1u64..60), 2..5),
    ) {
        let loads: Vec<Load> = vms
            .iter()
            .enumerate()
            .map(|(i, &(share, len))| Load::new(&format!("vm{i}"), share, len * MS))
            .collect();
        let t = simulate(&mut Wfq::default(), &loads, 20_000 * MS, 1000 * MS);
        let total_share: u32 = loads.iter().map(|l| l.share).sum();
        let used: Vec<f64> = loads.iter().map(|l| t.total(&l.name, 2) as f64).collect();
        let all: f64 = used.iter().sum();
        prop_assert!(all > 0.95 * 18_000.0 * MS as f64, "utilisation {}", all);
        for (l, u) in loads.iter().zip(&used) {
            let want = f64::from(l.share) / f64::from(total_share);
            let got = u / all;
            prop_assert!((got - want).abs() < 0.06, "{}: share {} len {} got {:.3} want {:.3}",
                l.name, l.share, l.len / MS, got, want);
        }
    }
}
