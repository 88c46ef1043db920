//! Device time of CUDA kernels and the VM's scheduling decision, where launches
//! reach the device.
//!
//! **Measuring.** Each launch is bracketed by two timing events of the API server's
//! own, recorded on the launch's stream; when the second has completed, the time
//! between them is the kernel's device time, added to the session's usage page
//! where the daemon's scheduler finds it. Completed launches are swept after every
//! call of the session (a call that synchronises is followed by one), so what the
//! guest has seen complete is accounted; the launch counts as running from when it
//! was launched until then.
//!
//! **Enforcing.** Before a launch the VM's decision is read from its page (one atomic
//! load). `Run`: launched at once. `Hold`: the launch waits in the API server until the
//! decision changes, polled every [`GATE_POLL`]; `Delay(ns)`: it waits that long. The
//! guest's calling thread waits with it (its other threads and other sessions go on),
//! as behind a busy device. Unlike OpenCL's gates, which wait on the device, a held
//! CUDA launch waits before the host call: the driver API has no user events.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hira_protocol::usage::{Gate, monotonic_ns};

use super::Driver;
use crate::account::Account;

thread_local! {
    /// This thread was told a moment ago that its launch would not be held.
    static ADMITTED: Cell<bool> = const { Cell::new(false) };
}

/// How often a held launch looks at the decision again.
pub const GATE_POLL: Duration = Duration::from_millis(1);

/// Timing events kept for reuse per context (a launch takes two and its sweep gives
/// them back), so that a launch costs two event records rather than two creations,
/// two records and two destructions.
const SPARE_PER_CONTEXT: usize = 64;

/// A launch whose device time is not yet known.
struct Launch {
    /// The context its events belong to.
    ctx: usize,
    start: *mut c_void,
    end: *mut c_void,
    /// When it was launched (monotonic ns): running from then.
    launched: u64,
}

// SAFETY: event handles are plain driver handles, usable from any thread.
unsafe impl Send for Launch {}

/// The session's launches in flight, and its account.
pub struct DeviceTime {
    account: Arc<Account>,
    pending: Mutex<Vec<Launch>>,
    /// Timing events to reuse, by context.
    spare: Mutex<HashMap<usize, Vec<usize>>>,
    /// The guest is gone: a held launch waits no more.
    closing: AtomicBool,
}

/// Events bracketing one launch, made before it, and when it was handed to the
/// driver.
pub struct Bracket {
    ctx: usize,
    start: *mut c_void,
    end: *mut c_void,
    launched: u64,
}

impl DeviceTime {
    pub fn new(account: Arc<Account>) -> Self {
        DeviceTime {
            account,
            pending: Mutex::new(Vec::new()),
            spare: Mutex::new(HashMap::new()),
            closing: AtomicBool::new(false),
        }
    }

    /// Whether a launch now would wait for the VM's decision, asked by the reading
    /// thread before it runs a launch itself. When it would not, the next launch
    /// this thread admits goes through whatever the decision is by then: the reader
    /// runs it at once, and a decision that turned to `Hold` in between must not
    /// hold it there, where the reader could no longer see its guest go (a held
    /// launch waits on a worker thread, see `may_wait_on_guest`).
    pub fn would_hold(&self) -> bool {
        let hold = self.account.gate() != Gate::Run;
        ADMITTED.set(!hold);
        hold
    }

    /// The guest is gone: launches held now, and later ones, go through (the
    /// session is ending).
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Waits until the VM's decision lets a launch through.
    pub fn admit(&self) {
        if ADMITTED.replace(false) {
            return;
        }
        // The common case costs one atomic load.
        if self.account.gate() == Gate::Run {
            return;
        }
        let held_since = Instant::now();
        self.account.held(1);
        while !self.closing.load(Ordering::Acquire) {
            match self.account.gate() {
                Gate::Run => break,
                Gate::Hold => std::thread::sleep(GATE_POLL),
                Gate::Delay(ns) => {
                    std::thread::sleep(Duration::from_nanos(ns));
                    break;
                }
            }
        }
        self.account.held(-1);
        self.account
            .held_for(u64::try_from(held_since.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }

    /// A timing event of context `ctx` (current): a spare one, else a new one.
    fn take(&self, d: &Driver, ctx: usize) -> Option<*mut c_void> {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&ctx)
            .and_then(Vec::pop);
        if let Some(e) = spare {
            return Some(e as *mut c_void);
        }
        let create = d.cuEventCreate?;
        let mut e: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer to an event handle; flags 0 (timing on).
        (unsafe { create((&mut e as *mut *mut c_void).cast(), 0) } == 0).then_some(e)
    }

    /// Gives events of context `ctx` back for reuse (destroyed beyond the spares
    /// kept).
    fn give(&self, d: &Driver, ctx: usize, events: &[*mut c_void]) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        let kept = spare.entry(ctx).or_default();
        for &e in events.iter().filter(|e| !e.is_null()) {
            if kept.len() < SPARE_PER_CONTEXT {
                kept.push(e as usize);
            } else {
                destroy(d, &[e]);
            }
        }
    }

    /// A context ended (destroyed, or the primary one released or reset): its
    /// events went with it, so none is reused.
    pub(crate) fn contexts_changed(&self) {
        self.spare.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Records the start event of a launch on `stream`, in context `ctx`, current.
    pub(crate) fn before(
        &self,
        d: &Driver,
        ctx: *mut c_void,
        stream: *mut c_void,
    ) -> Option<Bracket> {
        let record = d.cuEventRecord?;
        let ctx = ctx as usize;
        let start = self.take(d, ctx);
        let end = self.take(d, ctx);
        let made = match (start, end) {
            // SAFETY: an event of the current context and the launch's stream.
            (Some(s), Some(_)) => unsafe { record(s, stream) == 0 },
            _ => false,
        };
        let (start, end) = (
            start.unwrap_or(std::ptr::null_mut()),
            end.unwrap_or(std::ptr::null_mut()),
        );
        if made {
            // From now the launch counts as in flight and running (a driver may run
            // it before the launch call returns) until its end event completes.
            let launched = monotonic_ns();
            self.account.in_flight(1);
            self.account.running(launched, 1);
            Some(Bracket {
                ctx,
                start,
                end,
                launched,
            })
        } else {
            self.give(d, ctx, &[start, end]);
            None
        }
    }

    /// After a launch: its end event is recorded and the launch counted as running
    /// until the event completes.
    pub(crate) fn after(
        &self,
        d: &Driver,
        b: Option<Bracket>,
        stream: *mut c_void,
        launched: bool,
    ) {
        let Some(b) = b else { return };
        let recorded = launched
            && d.cuEventRecord
                // SAFETY: an event of ours and the launch's stream.
                .is_some_and(|record| unsafe { record(b.end, stream) } == 0);
        if !recorded {
            // A launch that failed, or whose end cannot be timed, is taken back.
            self.account.running(b.launched, -1);
            self.account.in_flight(-1);
            self.give(d, b.ctx, &[b.start, b.end]);
            return;
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Launch {
                ctx: b.ctx,
                start: b.start,
                end: b.end,
                launched: b.launched,
            });
    }

    /// Accounts the launches that have completed (all of them with `wait`).
    pub(crate) fn sweep(&self, d: &Driver, wait: bool) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.is_empty() {
            return;
        }
        let (Some(query), Some(elapsed), Some(sync)) =
            (d.cuEventQuery, d.cuEventElapsedTime, d.cuEventSynchronize)
        else {
            return;
        };
        let mut ended = Vec::new();
        pending.retain(|l| {
            let done = if wait {
                // SAFETY: an event of ours, not yet destroyed.
                unsafe { sync(l.end) == 0 }
            } else {
                // SAFETY: as above.
                unsafe { query(l.end) == 0 }
            };
            if !done {
                return true;
            }
            let mut ms = 0f32;
            // SAFETY: two completed timing events of ours and an out-pointer.
            let ns = if unsafe { elapsed(&mut ms, l.start, l.end) } == 0 {
                (f64::from(ms.max(0.0)) * 1e6) as u64
            } else {
                monotonic_ns().saturating_sub(l.launched)
            };
            self.account.device_time(ns);
            self.account.running(l.launched, -1);
            self.account.in_flight(-1);
            ended.push((l.ctx, l.start, l.end));
            false
        });
        drop(pending);
        for (ctx, start, end) in ended {
            self.give(d, ctx, &[start, end]);
        }
    }
}

fn destroy(d: &Driver, events: &[*mut c_void]) {
    let Some(f) = d.cuEventDestroy_v2 else { return };
    for &e in events.iter().filter(|e| !e.is_null()) {
        // SAFETY: an event this module made.
        unsafe { f(e) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hira_protocol::usage::{UsagePage, VmPage};

    /// The daemon's ends of a VM's page and a session's usage page, and the API
    /// server's device time on them.
    fn held_vm() -> (VmPage, UsagePage, DeviceTime) {
        let (vm, fd) = VmPage::create().unwrap();
        let (usage, ufd) = UsagePage::create().unwrap();
        let account = Account::new(
            Some(VmPage::map(&fd).unwrap()),
            Some(Arc::new(UsagePage::map(&ufd).unwrap())),
        );
        (vm, usage, DeviceTime::new(Arc::new(account)))
    }

    /// The reader was told its launch would run: it runs, though the decision
    /// turned to `Hold` before the launch reached `admit`; and only that launch.
    #[test]
    fn a_launch_admitted_at_dispatch_is_not_held_on_the_reading_thread() {
        use std::sync::mpsc::channel;
        let (daemon, usage, dt) = held_vm();
        let dt = Arc::new(dt);
        let (asked_tx, asked) = channel();
        let (turned, turned_rx) = channel::<()>();
        let (done_tx, done) = channel();
        let reader = {
            let dt = dt.clone();
            std::thread::spawn(move || {
                asked_tx.send(dt.would_hold()).unwrap();
                turned_rx.recv().unwrap();
                dt.admit();
                done_tx.send(ADMITTED.get()).unwrap();
            })
        };
        assert!(!asked.recv().unwrap(), "the decision is Run when asked");
        daemon.set_gate(Gate::Hold);
        turned.send(()).unwrap();
        // A hang here is the bug: let the launch go and fail.
        let left = done.recv_timeout(Duration::from_secs(60));
        dt.close();
        reader.join().unwrap();
        assert_eq!(
            left,
            Ok(false),
            "admitted at once, and the admission used up"
        );
        assert_eq!(usage.read().held, 0, "never held");
    }

    /// A launch asked about while the decision holds waits until the decision
    /// changes.
    #[test]
    fn a_held_launch_waits_for_the_decision() {
        let (daemon, usage, dt) = held_vm();
        daemon.set_gate(Gate::Hold);
        assert!(dt.would_hold());
        let dt = Arc::new(dt);
        let waiting = {
            let dt = dt.clone();
            std::thread::spawn(move || dt.admit())
        };
        // Held, as the session's page says, until the decision changes.
        while usage.read().held != 1 {
            std::thread::yield_now();
        }
        assert!(!waiting.is_finished(), "held while the decision holds");
        daemon.set_gate(Gate::Run);
        waiting.join().unwrap();
        assert_eq!(usage.read().held, 0);
    }
}
