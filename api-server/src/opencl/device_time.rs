//! Device time and the VM's scheduling decision, where commands reach the device.
//!
//! **Measuring.** Every command queue is created with profiling on, whatever the guest
//! asked for, so that each kernel's device time comes from the host's own timestamps
//! (`CL_PROFILING_COMMAND_START`/`END`) without serialising anything, added to the
//! session's usage page, where the daemon's scheduler finds them. For an in-order
//! queue, a sweep of the gate thread (every millisecond while commands complete, up
//! to [`SWEEP_BACKOFF`] apart while none does, and for [`LINGER`] after the last)
//! reads each queue's oldest commands until the first not
//! complete, and notes when that one started running (a call that waited for
//! commands, `clFinish` or `clWaitForEvents`, sweeps before it answers, so what the
//! guest sees complete is accounted): no host callback per command, which cost a
//! program launching thousands of short kernels dearly (docs/tuning.md). For an out-of-order queue, a completion callback reads
//! them, and a callback on `CL_RUNNING` records when each command started. Either
//! way the device time of commands still running is known at any moment (reports and
//! metrics move smoothly rather than in steps of whole kernels). The guest sees the queue it asked for: `CL_QUEUE_PROPERTIES`
//! without the forced bit, `CL_QUEUE_PROPERTIES_ARRAY` as it gave it, and
//! `CL_PROFILING_INFO_NOT_AVAILABLE` for the events of a queue it made without
//! profiling. Where the host cannot give timestamps, the time from enqueue to
//! completion is charged instead (an upper bound; logged once).
//!
//! **Enforcing.** Before a measured command is enqueued, the VM's decision is read from
//! its page (one atomic load). `Run`: enqueued as is. `Hold` or `Delay`: enqueued behind
//! a gate, a user event of the server's own added to its wait list, which a gate thread
//! completes when the decision turns to `Run` (or the delay has passed). The command
//! waits on the device, not in this process: the session's other calls, other
//! sessions and the daemon go on, and the guest sees a command that takes longer,
//! as on a busy device.
//!
//! **Bounded backlog.** A session keeps at most [`BACKLOG_NS`] of device work (or two
//! of its commands, if they are longer) enqueued on the device and not finished,
//! estimated at its recent mean command length (the bound itself until one is
//! measured); further commands wait behind a gate that opens as earlier ones finish
//! (each completion wakes the gate thread). A device runs what it was given, mostly
//! in order, so without this a guest that floods its queue puts all of it ahead of
//! another VM's next command, whatever the policy decides later; with it, another
//! VM's command waits for at most the bound plus one command. The device never idles
//! for it: the gate opens while the session still has work running. A session whose
//! enqueued commands cannot run (they wait on its own user events) and that makes no
//! progress for [`STALL`] gets its next command through anyway, so no program that
//! enqueues work it completes later can deadlock.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cl3::OpenCl;
use hira_protocol::usage::{Gate, monotonic_ns};
use log::warn;
use opencl_sys::{cl_command_queue, cl_event, cl_int};

use crate::account::Account;

use opencl_sys::CL_QUEUE_ON_DEVICE;
pub use opencl_sys::CL_QUEUE_PROFILING_ENABLE;
/// The key of a queue's properties in a property list (whose words are 64-bit).
pub const CL_QUEUE_PROPERTIES: u64 = opencl_sys::CL_QUEUE_PROPERTIES as u64;
use opencl_sys::CL_COMPLETE;
use opencl_sys::CL_EVENT_COMMAND_QUEUE;
use opencl_sys::CL_PROFILING_COMMAND_END;
use opencl_sys::CL_PROFILING_COMMAND_START;
use opencl_sys::CL_QUEUE_CONTEXT;
pub use opencl_sys::CL_QUEUE_PROPERTIES_ARRAY;
/// How often held commands, and commands of in-order queues not yet accounted, are
/// looked at.
const GATE_POLL: Duration = Duration::from_millis(1);
/// How long the gate thread goes on looking after the last such command.
const LINGER: Duration = Duration::from_millis(20);
/// Longest pause between two sweeps while commands are pending and none completes.
const SWEEP_BACKOFF: Duration = Duration::from_millis(8);
/// Most device work (estimated) a session keeps enqueued and not finished, unless
/// two of its commands are longer.
pub const BACKLOG_NS: u64 = 20_000_000;
/// A session with commands waiting for backlog room and none finishing for this long
/// gets its next command through.
pub const STALL: Duration = Duration::from_millis(40);

/// The session's device work enqueued and not finished, as estimated.
#[derive(Debug, Default)]
pub struct Backlog {
    /// Estimated device time of the commands enqueued and not finished, in ns.
    charged: AtomicU64,
    /// How many commands that is.
    commands: AtomicU64,
    /// Recent mean device time of one command, in ns (0: none measured yet).
    mean: AtomicU64,
    /// When a command last finished or was let through (`monotonic_ns`).
    progress: AtomicU64,
    /// Commands of the session running on the device now.
    running: AtomicU64,
}

impl Backlog {
    /// What the next command is estimated to take.
    fn estimate(&self) -> u64 {
        match self.mean.load(Ordering::Relaxed) {
            0 => BACKLOG_NS,
            m => m,
        }
    }

    /// Whether one more command may go to the device now.
    pub fn room(&self) -> bool {
        let mean = self.mean.load(Ordering::Relaxed);
        let cap = BACKLOG_NS.max(mean.saturating_mul(2));
        self.commands.load(Ordering::Relaxed) == 0
            || self
                .charged
                .load(Ordering::Relaxed)
                .saturating_add(self.estimate())
                <= cap
    }

    /// Charges one command going to the device; `slot` remembers what, unless the
    /// command finished already (then nothing is charged).
    fn charge(&self, slot: &AtomicU64) {
        let est = self.estimate().max(1);
        if slot
            .compare_exchange(0, est, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.charged.fetch_add(est, Ordering::Relaxed);
            self.commands.fetch_add(1, Ordering::Relaxed);
        }
        self.progress.store(monotonic_ns(), Ordering::Relaxed);
    }

    /// A command finished after `ns` of device time; gives back what it was charged.
    fn finished(&self, slot: &AtomicU64, ns: u64) {
        let est = slot.swap(u64::MAX, Ordering::AcqRel);
        if est != 0 && est != u64::MAX {
            self.charged.fetch_sub(est, Ordering::Relaxed);
            self.commands.fetch_sub(1, Ordering::Relaxed);
        }
        let old = self.mean.load(Ordering::Relaxed);
        let mean = if old == 0 {
            ns
        } else {
            (old * 7 + ns * 3) / 10
        };
        self.mean.store(mean.max(1), Ordering::Relaxed);
        self.progress.store(monotonic_ns(), Ordering::Relaxed);
    }

    /// Whether nothing of the session runs and nothing has moved for [`STALL`].
    fn stalled(&self) -> bool {
        self.running.load(Ordering::Relaxed) == 0
            && monotonic_ns().saturating_sub(self.progress.load(Ordering::Relaxed))
                >= STALL.as_nanos() as u64
    }
}

/// What the guest asked of a queue.
#[derive(Debug, Clone)]
struct QueueInfo {
    profiling: bool,
    /// Its commands run one after another (no out-of-order execution).
    in_order: bool,
    /// The property list as the guest gave it (`clCreateCommandQueueWithProperties`).
    properties: Option<Vec<u64>>,
}

/// A command held back: its gate, since when, when a delay ends, and where its
/// backlog charge goes.
#[derive(Debug)]
struct Held {
    gate: usize,
    since: Instant,
    until: Option<Instant>,
    slot: Option<Arc<AtomicU64>>,
}

/// The gates of held commands, the session's backlog, and the signal that wakes the
/// gate thread.
#[derive(Debug, Default)]
struct Gates {
    held: Mutex<Vec<Held>>,
    wake: Condvar,
    backlog: Backlog,
    /// Commands of in-order queues not yet accounted, by queue.
    batches: Mutex<HashMap<usize, Batch>>,
    /// The gate thread waits for a signal (not polling).
    asleep: AtomicBool,
}

/// The session's device-time measurement and enforcement.
pub struct DeviceTime {
    rt: &'static OpenCl,
    account: Arc<Account>,
    queues: Mutex<HashMap<usize, QueueInfo>>,
    gates: Arc<Gates>,
    gate_thread: OnceLock<()>,
}

impl std::fmt::Debug for DeviceTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTime").finish_non_exhaustive()
    }
}

/// What a completion callback needs.
struct Measure {
    rt: &'static OpenCl,
    account: Arc<Account>,
    enqueued: Instant,
    /// When the command started running (CLOCK_MONOTONIC ns; 0: not yet, MAX: over).
    start: Arc<AtomicU64>,
    /// Its backlog charge (0: not yet let through, MAX: finished).
    slot: Arc<AtomicU64>,
    gates: Arc<Gates>,
}

/// What the running callback needs.
struct Running {
    account: Arc<Account>,
    start: Arc<AtomicU64>,
    gates: Arc<Gates>,
}

use opencl_sys::CL_RUNNING;

unsafe extern "C" fn running(_event: cl_event, status: cl_int, data: *mut c_void) {
    // SAFETY: `data` is the box leaked in `DeviceTime::enqueued`, passed to exactly one
    // callback (called on CL_RUNNING, or on an abnormal end).
    let r = unsafe { Box::from_raw(data.cast::<Running>()) };
    if status != CL_RUNNING {
        return;
    }
    let now = monotonic_ns().max(1);
    // Only if the command has not finished already.
    if r.start
        .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        r.account.running(now, 1);
        r.gates.backlog.running.fetch_add(1, Ordering::Relaxed);
    }
}

static NO_TIMESTAMPS: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn measured(event: cl_event, status: cl_int, data: *mut c_void) {
    // SAFETY: `data` is the box leaked in `DeviceTime::measure`, passed to exactly one
    // callback.
    let m = unsafe { Box::from_raw(data.cast::<Measure>()) };
    m.finished(event, status);
}

/// A command of an in-order queue whose completion is still to be accounted.
struct Unharvested {
    event: usize,
    measure: Measure,
}

impl std::fmt::Debug for Unharvested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unharvested")
            .field("event", &self.event)
            .finish_non_exhaustive()
    }
}

/// Accounts the commands of in-order queues that have completed (each queue's
/// oldest first: it runs them in order, so the first one not complete ends the
/// sweep) and notes when the oldest of each started running. Returns whether any
/// command is still pending, and whether any completed or started.
fn sweep(rt: &OpenCl, gates: &Gates) -> (bool, bool) {
    let mut done = Vec::new();
    let mut started = false;
    let pending = {
        let mut batches = gates.batches.lock().unwrap_or_else(|e| e.into_inner());
        for batch in batches.values_mut() {
            while let Some(u) = batch.front() {
                match status_of(rt, u.event as cl_event) {
                    Some(st) if st <= CL_COMPLETE => {
                        done.extend(batch.pop_front().map(|u| (u, st)));
                    }
                    Some(CL_RUNNING) => {
                        started |= u.measure.started();
                        break;
                    }
                    _ => break,
                }
            }
        }
        batches.retain(|_, b| !b.is_empty());
        !batches.is_empty()
    };
    let progressed = started || !done.is_empty();
    for (u, st) in done {
        u.measure.finished(u.event as cl_event, st);
        rt.clReleaseEvent(u.event as cl_event);
    }
    (pending, progressed)
}

/// The commands of one in-order queue not yet accounted, oldest first.
type Batch = std::collections::VecDeque<Unharvested>;

/// The execution status of `event`, if the host tells it.
fn status_of(rt: &OpenCl, event: cl_event) -> Option<cl_int> {
    use opencl_sys::CL_EVENT_COMMAND_EXECUTION_STATUS;
    crate::opencl::queues::info_value(|n, p, r| {
        rt.clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, n, p, r)
    })
}

impl Measure {
    /// The command has started running (noted once: true the first time).
    fn started(&self) -> bool {
        let now = monotonic_ns().max(1);
        let first = self
            .start
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if first {
            self.account.running(now, 1);
            self.gates.backlog.running.fetch_add(1, Ordering::Relaxed);
        }
        first
    }

    /// The command of `event` ended with `status`: its device time is accounted and
    /// its backlog charge given back.
    fn finished(&self, event: cl_event, status: cl_int) {
        let m = self;
        let stamp = |param: u32| {
            let mut t: u64 = 0;
            (m.rt.clGetEventProfilingInfo(
                event,
                param,
                size_of::<u64>(),
                (&mut t as *mut u64).cast(),
                std::ptr::null_mut(),
            ) == Some(0))
            .then_some(t)
        };
        let ns = match (
            stamp(CL_PROFILING_COMMAND_START),
            stamp(CL_PROFILING_COMMAND_END),
        ) {
            (Some(start), Some(end)) if end >= start => end - start,
            _ => {
                if status == CL_COMPLETE && !NO_TIMESTAMPS.swap(true, Ordering::Relaxed) {
                    warn!(
                        "the host gives no profiling timestamps; charging enqueue-to-completion time"
                    );
                }
                m.enqueued.elapsed().as_nanos() as u64
            }
        };
        let started = m.start.swap(u64::MAX, Ordering::AcqRel);
        if started != 0 && started != u64::MAX {
            m.account.running(started, -1);
            m.gates.backlog.running.fetch_sub(1, Ordering::Relaxed);
        }
        m.account.device_time(ns);
        m.account.in_flight(-1);
        m.gates.backlog.finished(&m.slot, ns);
        // A held command may have room now (no wake-up when none is held: this runs
        // on the path of a clFinish too).
        let held = !m
            .gates
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if held {
            m.gates.wake.notify_one();
        }
    }
}

impl DeviceTime {
    pub fn new(rt: &'static OpenCl, account: Arc<Account>) -> Self {
        DeviceTime {
            rt,
            account,
            queues: Mutex::default(),
            gates: Arc::default(),
            gate_thread: OnceLock::new(),
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<usize, QueueInfo>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host properties for a queue the guest asked for with `props`: profiling on
    /// (not for on-device queues, which have no events of their own to time).
    pub fn host_properties(props: u64) -> u64 {
        if props & CL_QUEUE_ON_DEVICE != 0 {
            props
        } else {
            props | CL_QUEUE_PROFILING_ENABLE
        }
    }

    /// The host property list for the guest's (zero-terminated, key-value pairs), and
    /// whether the guest asked for profiling.
    pub fn host_property_list(guest: &[u64]) -> (Vec<u64>, bool) {
        let pairs: Vec<(u64, u64)> = guest
            .chunks_exact(2)
            .take_while(|p| p[0] != 0)
            .map(|p| (p[0], p[1]))
            .collect();
        let asked = pairs
            .iter()
            .find(|(k, _)| *k == CL_QUEUE_PROPERTIES)
            .map_or(0, |&(_, v)| v);
        let mut host: Vec<u64> = Vec::with_capacity(guest.len() + 2);
        let mut seen = false;
        for (k, v) in &pairs {
            if *k == CL_QUEUE_PROPERTIES && !seen {
                seen = true;
                host.extend([*k, Self::host_properties(*v)]);
            } else {
                host.extend([*k, *v]);
            }
        }
        if !seen {
            host.extend([CL_QUEUE_PROPERTIES, Self::host_properties(0)]);
        }
        host.push(0);
        (host, asked & CL_QUEUE_PROFILING_ENABLE != 0)
    }

    /// Records what the guest asked of a new queue.
    pub fn queue_created(&self, queue: cl_command_queue, profiling: bool, list: Option<Vec<u64>>) {
        const OUT_OF_ORDER: u64 = 1;
        let host: Option<u64> = crate::opencl::queues::info_value(|n, p, r| {
            self.rt
                .clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES as u32, n, p, r)
        });
        self.queues().insert(
            queue as usize,
            QueueInfo {
                profiling,
                in_order: host.is_some_and(|p| p & OUT_OF_ORDER == 0),
                properties: list,
            },
        );
    }

    /// Accounts now what completed of the in-order queues' commands: a call that
    /// waited for commands does so before it answers, so that their device time is
    /// in the VM's usage before the guest can see them complete (as it was with a
    /// completion callback per command).
    pub fn sweep_now(&self) {
        sweep(self.rt, &self.gates);
    }

    fn in_order(&self, queue: cl_command_queue) -> bool {
        self.queues()
            .get(&(queue as usize))
            .is_some_and(|q| q.in_order)
    }

    /// Whether the guest asked for profiling on `queue` (queues the server never saw
    /// created are the host's business).
    pub fn guest_profiling(&self, queue: cl_command_queue) -> bool {
        self.queues()
            .get(&(queue as usize))
            .is_none_or(|q| q.profiling)
    }

    /// Whether the events of `event`'s queue may be profiled as the guest sees it.
    pub fn event_profiling(&self, event: cl_event) -> bool {
        let mut queue: cl_command_queue = std::ptr::null_mut();
        let found = self.rt.clGetEventInfo(
            event,
            CL_EVENT_COMMAND_QUEUE,
            size_of::<cl_command_queue>(),
            (&mut queue as *mut cl_command_queue).cast(),
            std::ptr::null_mut(),
        ) == Some(0);
        !found || queue.is_null() || self.guest_profiling(queue)
    }

    /// Rewrites a queue-info answer to what the guest asked for.
    pub fn guest_queue_info(&self, queue: cl_command_queue, param: u32, value: &mut Vec<u8>) {
        let q = self.queues().get(&(queue as usize)).cloned();
        let Some(q) = q else { return };
        if u64::from(param) == CL_QUEUE_PROPERTIES && value.len() == 8 && !q.profiling {
            let v = u64::from_le_bytes(value[..8].try_into().unwrap_or_default());
            value.copy_from_slice(&(v & !CL_QUEUE_PROFILING_ENABLE).to_le_bytes());
        }
        if param == CL_QUEUE_PROPERTIES_ARRAY {
            *value = q
                .properties
                .as_deref()
                .unwrap_or_default()
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect();
        }
    }

    /// The gate a command on `queue` must wait behind now, if the VM's decision holds
    /// or delays it or the session's backlog is full.
    pub fn admit(&self, queue: cl_command_queue) -> Option<HeldGate> {
        let until = match self.account.gate() {
            // Commands already waiting go first.
            Gate::Run
                if self.gates.backlog.room()
                    && self
                        .gates
                        .held
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_empty() =>
            {
                return None;
            }
            Gate::Run | Gate::Hold => None,
            Gate::Delay(ns) => Some(Instant::now() + Duration::from_nanos(ns)),
        };
        let mut context: *mut c_void = std::ptr::null_mut();
        let ok = self.rt.clGetCommandQueueInfo(
            queue,
            CL_QUEUE_CONTEXT,
            size_of::<*mut c_void>(),
            (&mut context as *mut *mut c_void).cast(),
            std::ptr::null_mut(),
        ) == Some(0);
        let mut err: cl_int = 0;
        let gate = if ok {
            self.rt.clCreateUserEvent(context.cast(), &mut err)
        } else {
            None
        };
        match gate {
            Some(event) if !event.is_null() && err == 0 => Some(HeldGate { event, until }),
            _ => {
                warn!("cannot make a gate ({err}); the command runs at once");
                None
            }
        }
    }

    /// After a measured command's host call: its gate starts waiting for the decision
    /// to change, and its event is timed (`own`: the server's, released here).
    pub fn enqueued(
        &self,
        queue: cl_command_queue,
        status: cl_int,
        gate: Option<HeldGate>,
        event: cl_event,
        own: bool,
    ) {
        if status != 0 {
            if let Some(g) = gate {
                self.rt.clReleaseEvent(g.event);
            }
            return;
        }
        // Where the command's backlog charge is kept (none for a command without an
        // event: nothing would give it back).
        let slot = (!event.is_null()).then(|| Arc::new(AtomicU64::new(0)));
        match (gate, &slot) {
            (Some(g), _) => {
                self.account.held(1);
                self.start_gate_thread();
                self.gates
                    .held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Held {
                        gate: g.event as usize,
                        since: Instant::now(),
                        until: g.until,
                        slot: slot.clone(),
                    });
                self.gates.wake.notify_one();
            }
            (None, Some(slot)) => self.gates.backlog.charge(slot),
            (None, None) => {}
        }
        let Some(slot) = slot else { return };
        self.account.in_flight(1);
        let start = Arc::new(AtomicU64::new(0));
        let measure = Measure {
            rt: self.rt,
            account: self.account.clone(),
            enqueued: Instant::now(),
            start: start.clone(),
            slot: slot.clone(),
            gates: self.gates.clone(),
        };
        if self.in_order(queue) {
            // Accounted by the gate thread's sweeps: no callbacks per command.
            if !own {
                self.rt.clRetainEvent(event);
            }
            self.gates
                .batches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(queue as usize)
                .or_default()
                .push_back(Unharvested {
                    event: event as usize,
                    measure,
                });
            self.start_gate_thread();
            if self.gates.asleep.load(Ordering::SeqCst) {
                let _held = self.gates.held.lock().unwrap_or_else(|e| e.into_inner());
                self.gates.wake.notify_one();
            }
            return;
        }
        let r = Box::into_raw(Box::new(Running {
            account: self.account.clone(),
            start: start.clone(),
            gates: self.gates.clone(),
        }));
        if self
            .rt
            .clSetEventCallback(event, CL_RUNNING, Some(running), r.cast())
            != Some(0)
        {
            // SAFETY: the callback was not registered, so this is the only owner.
            drop(unsafe { Box::from_raw(r) });
        }
        let m = Box::into_raw(Box::new(measure));
        let registered = self
            .rt
            .clSetEventCallback(event, CL_COMPLETE, Some(measured), m.cast());
        if registered != Some(0) {
            // SAFETY: the callback was not registered, so this is the only owner.
            drop(unsafe { Box::from_raw(m) });
            self.account.in_flight(-1);
            // Never finishes as far as this server knows: charged nothing.
            self.gates.backlog.finished(&slot, 0);
        }
        if own {
            self.rt.clReleaseEvent(event);
        }
    }

    fn start_gate_thread(&self) {
        self.gate_thread.get_or_init(|| {
            let (rt, account, gates) = (self.rt, self.account.clone(), self.gates.clone());
            let spawned = std::thread::Builder::new()
                .name("gates".into())
                .spawn(move || gate_loop(rt, &account, &gates));
            if let Err(e) = spawned {
                warn!("cannot start the gate thread ({e}); held commands open at teardown");
            }
        });
    }

    /// Opens every gate (the session ends: nothing may wait for a decision any more).
    pub fn open_all(&self) {
        let mut l = self.gates.held.lock().unwrap_or_else(|e| e.into_inner());
        for h in l.drain(..) {
            open(self.rt, &self.account, &self.gates.backlog, &h);
        }
    }
}

/// A gate made for one command.
#[derive(Debug)]
pub struct HeldGate {
    pub event: cl_event,
    until: Option<Instant>,
}

fn open(rt: &OpenCl, account: &Account, backlog: &Backlog, h: &Held) {
    if let Some(slot) = &h.slot {
        backlog.charge(slot);
    }
    let g = h.gate as cl_event;
    rt.clSetUserEventStatus(g, CL_COMPLETE);
    rt.clReleaseEvent(g);
    account.held_for(h.since.elapsed().as_nanos() as u64);
    account.held(-1);
}

/// Opens gates in order as the VM's decision and the session's backlog allow,
/// polling while any is shut (and woken by each completion).
fn gate_loop(rt: &'static OpenCl, account: &Account, gates: &Gates) {
    let mut idle_since: Option<Instant> = None;
    // While nothing completes (a command waits on a user event, or runs long),
    // sweeps slow down, up to `SWEEP_BACKOFF`; held commands keep `GATE_POLL`.
    let mut poll = GATE_POLL;
    let mut list = gates.held.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        drop(list);
        let (pending, progressed) = sweep(rt, gates);
        poll = if progressed {
            GATE_POLL
        } else {
            (poll * 2).min(SWEEP_BACKOFF)
        };
        list = gates.held.lock().unwrap_or_else(|e| e.into_inner());
        if list.is_empty() && !pending {
            // Sweeping goes on a while after the last command, so that a stream
            // of short commands does not wake this thread for each one.
            let idle = *idle_since.get_or_insert_with(Instant::now);
            if idle.elapsed() >= LINGER {
                gates.asleep.store(true, Ordering::SeqCst);
                // A command enqueued before `asleep` showed sent no signal.
                let empty = gates
                    .batches
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_empty();
                if empty {
                    list = gates.wake.wait(list).unwrap_or_else(|e| e.into_inner());
                }
                gates.asleep.store(false, Ordering::SeqCst);
                idle_since = None;
                continue;
            }
        } else {
            idle_since = None;
        }
        let gate = account.gate();
        let now = Instant::now();
        let mut opened = 0;
        for h in list.iter() {
            let allowed = match h.until {
                Some(t) => now >= t,
                None => gate != Gate::Hold,
            };
            // In order: a command that may not go yet keeps the later ones waiting.
            let room = gates.backlog.room() || gates.backlog.stalled();
            if !allowed || !room {
                break;
            }
            open(rt, account, &gates.backlog, h);
            opened += 1;
        }
        list.drain(..opened);
        let wait = if list.is_empty() { poll } else { GATE_POLL };
        list = gates
            .wake
            .wait_timeout(list, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_get_profiling_and_the_guest_keeps_its_list() {
        assert_eq!(DeviceTime::host_properties(0), CL_QUEUE_PROFILING_ENABLE);
        assert_eq!(
            DeviceTime::host_properties(CL_QUEUE_ON_DEVICE),
            CL_QUEUE_ON_DEVICE
        );
        let (host, asked) = DeviceTime::host_property_list(&[0]);
        assert_eq!(
            (host, asked),
            (
                vec![CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0],
                false
            )
        );
        let (host, asked) =
            DeviceTime::host_property_list(&[CL_QUEUE_PROPERTIES, 1, 0x1094, 64, 0]);
        assert_eq!(host, vec![CL_QUEUE_PROPERTIES, 3, 0x1094, 64, 0]);
        assert!(!asked);
        let (_, asked) = DeviceTime::host_property_list(&[CL_QUEUE_PROPERTIES, 2, 0]);
        assert!(asked);
    }
}
