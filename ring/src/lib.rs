//! The ends of the data plane's rings (layout and region: `hira_protocol::ring`): a
//! producer and a consumer per ring and side, and how they wait for each other.
//!
//! Wake-ups are adaptive: a side that finds its ring empty (or full) spins for a
//! while, then announces that it sleeps, checks once more, and sleeps on its eventfd
//! and on a liveness descriptor (its socket to the daemon), so that the end of the
//! peer wakes it too. An idle session costs no CPU. How long a side spins it learns:
//! a spin that ends in sleep anyway halves the next, one that pays doubles it, and
//! below a few microseconds a side stops spinning but for an occasional probe (on a
//! host with more busy sessions than CPUs, a spin only keeps the peer from the CPU).
//! Before it sleeps a side yields its CPU a few times: on a busy host the peer is
//! often runnable and waiting for a CPU. A side yields between looks from the start
//! of its next wait when it has just woken its peer (the woken thread is often
//! queued on the waker's own CPU) or when its last wait ended only after its CPU
//! went to another thread (the peer shares its CPU).

use std::io::{Error, ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

pub use hira_protocol::ring::{
    DEFAULT_CAPACITY, EVENTFDS, MAX_CAPACITY, Region, Which, doorbell_frame, region_len,
    valid_capacity,
};
use hira_protocol::ring::{is_control, is_doorbell};

/// Creates the [`EVENTFDS`] eventfds that go with a region (non-blocking, close on exec).
pub fn eventfds() -> std::io::Result<Vec<OwnedFd>> {
    (0..EVENTFDS)
        .map(|_| {
            // SAFETY: eventfd with valid flags; the result is checked.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(Error::last_os_error());
            }
            // SAFETY: eventfd just returned this descriptor to this process.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .collect()
}

/// Rings an eventfd. Never blocks: the descriptor is non-blocking, and a counter
/// near overflow already means "wake up".
fn ring_bell(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to a descriptor this side holds.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Why a sleep ended.
#[derive(Debug, PartialEq, Eq)]
enum Woke {
    /// The peer rang (or nothing: look again).
    Bell,
    /// `live` has data and is still open: for the API server, a message from the
    /// daemon (see [`Signal::Eventfds`]).
    LiveData,
    /// `live` hung up (or its peer shut its writing side) or failed.
    LiveEnd,
}

/// What `live` says without waiting.
fn look_at_live(live: RawFd) -> Woke {
    let mut fds = [libc::pollfd {
        fd: live,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }];
    // SAFETY: one valid pollfd; a zero timeout never blocks.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) };
    live_state(n, fds[0].revents)
}

fn live_state(n: i32, revents: i16) -> Woke {
    if n <= 0 || revents == 0 {
        Woke::Bell
    } else if revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        Woke::LiveEnd
    } else {
        Woke::LiveData
    }
}

/// Sleeps until `bell` rings or `live` becomes readable (or hangs up).
fn sleep_on(bell: RawFd, live: RawFd) -> std::io::Result<Woke> {
    let mut fds = [
        libc::pollfd {
            fd: bell,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: live,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds; no timeout, no signal mask.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, std::ptr::null(), std::ptr::null()) };
        if n < 0 {
            let e = Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[0].revents != 0 {
            take_rings(bell);
        }
        return Ok(live_state(1, fds[1].revents));
    }
}

/// Resets a non-blocking eventfd that was rung.
fn take_rings(bell: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a local from a non-blocking eventfd.
    unsafe { libc::read(bell, (&mut v as *mut u64).cast(), 8) };
}

/// How one end of a ring wakes its peer and sleeps.
#[derive(Debug)]
enum Signal {
    /// Host-local: eventfds. `live` (the socket to the daemon) hung up means the
    /// session is over; readable means the same on the guest's side, and on the API
    /// server's (`control`) that the daemon has a message for it (a migration's
    /// quiesce), which the consumer reports as [`ErrorKind::WouldBlock`] for the
    /// caller to read.
    Eventfds {
        own: OwnedFd,
        peer: OwnedFd,
        live: RawFd,
        control: bool,
    },
    /// Inside a VM no descriptor is shared with the host: a producer wakes a sleeping
    /// consumer with a doorbell frame on its socket (vsock for the guest, the socket
    /// to the daemon for the API server; the daemon relays doorbells and nothing
    /// else), a consumer sleeps until one arrives, and a producer that finds the ring
    /// full polls it on a short timer (full rings are rare). Anything else on the
    /// socket, or its end, means the session is over.
    Doorbells { socket: RawFd, control: bool },
}

/// How long a waiting side polls without giving up its CPU; after this, until its
/// spin budget runs out, it yields between looks.
const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(20);

/// How long a waiting side gives its peer to take what it sent before it concludes
/// that the peer is not running and yields between looks from then on.
const PICKUP: Duration = Duration::from_micros(2);

/// Yields the CPU; whether another thread ran meanwhile (the yield took longer than
/// one that finds nothing else to run; docs/tuning.md).
fn give_cpu() -> bool {
    let start = Instant::now();
    std::thread::yield_now();
    start.elapsed() >= GAVE_AWAY
}

/// How long a yield that handed the CPU to another thread takes at least.
const GAVE_AWAY: Duration = Duration::from_micros(2);

/// How many times a waiting side yields its CPU, after its spin and before it sleeps.
const YIELDS_BEFORE_SLEEP: u32 = 4;

/// How long a producer in a VM session sleeps between looks at a full ring.
const FULL_RING_POLL: Duration = Duration::from_micros(200);

/// What the next frame on a doorbell socket is, without waiting.
enum Pending {
    Nothing,
    Doorbell,
    /// A message from the daemon to the API server (a migration's), left for the
    /// caller to read.
    Control,
    /// The end of the session: the socket closed, or the daemon's error frame, which
    /// is left for the caller to read.
    End,
}

/// Looks at what waits on `socket`; consumes it if it is a doorbell and `consume`.
fn pending(socket: RawFd, consume: bool) -> std::io::Result<Pending> {
    let mut b = [0u8; hira_protocol::frame::HEADER_LEN];
    loop {
        // SAFETY: peeks at most `b.len()` bytes into a local buffer, without waiting.
        let n = unsafe {
            libc::recv(
                socket,
                b.as_mut_ptr().cast(),
                b.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = Error::last_os_error();
            return match e.kind() {
                ErrorKind::WouldBlock => Ok(Pending::Nothing),
                ErrorKind::Interrupted => continue,
                _ => Ok(Pending::End),
            };
        }
        if n == 0 {
            return Ok(Pending::End);
        }
        if (n as usize) < b.len() {
            // Part of a frame: the rest is on its way.
            std::hint::spin_loop();
            continue;
        }
        return Ok(if is_doorbell(&b) {
            if consume {
                // SAFETY: consumes the header just peeked into a local buffer.
                unsafe { libc::recv(socket, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
            }
            Pending::Doorbell
        } else if is_control(&b) {
            Pending::Control
        } else {
            Pending::End
        });
    }
}

/// Waits until `socket` is readable.
fn wait_readable(socket: RawFd) -> std::io::Result<()> {
    let mut fds = [libc::pollfd {
        fd: socket,
        events: libc::POLLIN,
        revents: 0,
    }];
    loop {
        // SAFETY: one valid pollfd; no timeout, no signal mask.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 1, std::ptr::null(), std::ptr::null()) };
        if n >= 0 {
            return Ok(());
        }
        let e = Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What both ends of one ring share.
#[derive(Debug)]
struct End {
    region: Arc<Region>,
    which: Which,
    signal: Signal,
    /// Whether this end produces (else consumes).
    producer: bool,
    /// Longest spin before sleeping (the caller's choice).
    spin: Duration,
    /// How long spinning has paid lately.
    learnt: Learnt,
    /// Whether this side woke its sleeping peer since it last waited (shared by the
    /// side's two ends; this process's own note, not in the shared mapping).
    woke_peer: Arc<AtomicBool>,
}

/// The spin an end has learnt is worth it: halved each time a spin ends in sleep
/// anyway (the peer was slow, or is waiting for this CPU on an oversubscribed host),
/// doubled each time a spin succeeds; no spin once halving goes below [`PROBE_NS`],
/// except a probe every [`PROBE_EVERY`]th wait, so that an end whose peer becomes
/// quick learns to spin again.
#[derive(Debug)]
struct Learnt {
    /// The spin, in nanoseconds (zero: none).
    ns: std::cell::Cell<u64>,
    /// Waits since spinning stopped.
    waits: std::cell::Cell<u32>,
    /// Whether the last wait ended only after this side's CPU went to another
    /// thread: the next wait yields from its start.
    yield_first: std::cell::Cell<bool>,
    /// How many times this end slept (diagnostics).
    sleeps: std::cell::Cell<u64>,
    /// How many waits stopped polling early because the peer was off its CPU
    /// (diagnostics).
    handed: std::cell::Cell<u64>,
}

impl Learnt {
    fn new() -> Learnt {
        Learnt {
            ns: std::cell::Cell::new(MAX_LEARNT_NS),
            waits: std::cell::Cell::new(0),
            yield_first: std::cell::Cell::new(false),
            sleeps: std::cell::Cell::new(0),
            handed: std::cell::Cell::new(0),
        }
    }

    /// The spin for the next wait, at most `cap`.
    fn budget(&self, cap: Duration) -> Duration {
        let mut ns = self.ns.get();
        if ns == 0 {
            let waits = self.waits.get().wrapping_add(1);
            self.waits.set(waits);
            if waits.is_multiple_of(PROBE_EVERY) {
                ns = PROBE_NS;
            }
        }
        cap.min(Duration::from_nanos(ns))
    }

    /// Learns from a spin of `budget` that ended with what it waited for, or not.
    fn spun(&self, budget: Duration, paid: bool) {
        let ns = budget.as_nanos().min(u128::from(MAX_LEARNT_NS)) as u64;
        if paid {
            self.ns.set((ns * 2).clamp(PROBE_NS, MAX_LEARNT_NS));
        } else if ns > 0 {
            // Below a probe's length a spin is all cost.
            let halved = ns / 2;
            self.ns.set(if halved < PROBE_NS { 0 } else { halved });
        }
    }
}

/// Upper bound of what an end learns to spin.
const MAX_LEARNT_NS: u64 = 10_000_000;

/// The spin of a probe by an end that stopped spinning, and the shortest it learns:
/// longer than a synchronous call's round trip on an idle host (docs/tuning.md), so
/// a quick peer answers within it.
const PROBE_NS: u64 = 4_000;

/// How often an end that stopped spinning probes (one wait in this many): a probe
/// that fails costs [`PROBE_NS`], a sixteenth of that per wait.
const PROBE_EVERY: u32 = 16;

impl End {
    fn head(&self) -> &AtomicU64 {
        self.region.head(self.which)
    }

    fn tail(&self) -> &AtomicU64 {
        self.region.tail(self.which)
    }

    fn consumer_sleeping(&self) -> &AtomicU32 {
        self.region.consumer_sleeping(self.which)
    }

    fn producer_sleeping(&self) -> &AtomicU32 {
        self.region.producer_sleeping(self.which)
    }

    fn consumer_waiting(&self) -> &AtomicU32 {
        self.region.consumer_waiting(self.which)
    }

    fn data(&self) -> *mut u8 {
        self.region.data(self.which)
    }

    /// Wakes the peer, which announced that it sleeps.
    fn ring_peer(&self) {
        match &self.signal {
            Signal::Eventfds { peer, .. } => {
                ring_bell(peer.as_raw_fd());
                // Host-local: the peer's thread and this one share the scheduler.
                self.woke_peer.store(true, Ordering::Relaxed);
            }
            Signal::Doorbells { socket, .. } if self.producer => {
                let b = doorbell_frame();
                // SAFETY: sends a local 24-byte buffer without blocking or SIGPIPE; a
                // full or closed socket drops the doorbell, and the session's end
                // wakes the peer instead.
                unsafe {
                    libc::send(
                        *socket,
                        b.as_ptr().cast(),
                        b.len(),
                        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                    )
                };
            }
            // A producer in a VM polls a full ring; no doorbell for space.
            Signal::Doorbells { .. } => {}
        }
    }

    /// The eventfd the peer rings for this end once it announced that it sleeps
    /// (host-local rings only).
    fn bell(&self) -> Option<RawFd> {
        match &self.signal {
            Signal::Eventfds { own, .. } => Some(own.as_raw_fd()),
            Signal::Doorbells { .. } => None,
        }
    }

    /// Announces through `flag` that this end sleeps (see [`Consumer::will_sleep`]).
    fn announce(&self, flag: &AtomicU32) {
        flag.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Ends an announcement through `flag` and takes the bell's rings.
    fn settle(&self, flag: &AtomicU32) {
        flag.store(0, Ordering::Relaxed);
        if let Some(bell) = self.bell() {
            take_rings(bell);
        }
    }

    /// Sleeps until the peer may have moved, or the daemon has a message for this
    /// side.
    fn sleep(&self) -> std::io::Result<Woke> {
        match &self.signal {
            Signal::Eventfds {
                own, live, control, ..
            } => match sleep_on(own.as_raw_fd(), *live)? {
                Woke::LiveData if !*control => Ok(Woke::LiveEnd),
                Woke::LiveData if self.producer => {
                    // The message is for the consumer to read; this side only waits
                    // for space, looking again shortly.
                    std::thread::sleep(FULL_RING_POLL);
                    Ok(Woke::Bell)
                }
                w => Ok(w),
            },
            Signal::Doorbells { socket, .. } if self.producer => {
                // The doorbells on the socket are the consumer's: only look.
                std::thread::sleep(FULL_RING_POLL);
                Ok(match pending(*socket, false)? {
                    Pending::End => Woke::LiveEnd,
                    _ => Woke::Bell,
                })
            }
            Signal::Doorbells { socket, control } => loop {
                match pending(*socket, true)? {
                    Pending::Doorbell => return Ok(Woke::Bell),
                    Pending::Control if *control => return Ok(Woke::LiveData),
                    Pending::End | Pending::Control => return Ok(Woke::LiveEnd),
                    Pending::Nothing => wait_readable(*socket)?,
                }
            },
        }
    }

    /// For a consumer: whether its peer waits for what this side last sent it on the
    /// other ring (the guest's request, the API server's reply) and has still not
    /// taken it. A peer that waits on a CPU takes a message within a microsecond, so
    /// one that has not is waiting for a CPU, often this one (on a host with more
    /// busy threads than CPUs): polling without yielding would only keep it waiting.
    /// A peer busy with an earlier message (a call it executes) is not waiting, and
    /// this side polls as before. The words are the peer's to write; a peer that lies
    /// about them only changes when its own session yields.
    fn peer_not_running(&self) -> bool {
        if self.producer {
            return false;
        }
        let other = match self.which {
            Which::Submission => Which::Completion,
            Which::Completion => Which::Submission,
        };
        let head = self.region.head(other).load(Ordering::Relaxed);
        let tail = self.region.tail(other).load(Ordering::Relaxed);
        let waiting = self.region.consumer_waiting(other).load(Ordering::Relaxed);
        tail < head && waiting != 0
    }

    /// For the API server's consumer: whether the daemon has a message waiting.
    fn daemon_calls(&self) -> bool {
        match &self.signal {
            Signal::Eventfds {
                live,
                control: true,
                ..
            } if !self.producer => look_at_live(*live) == Woke::LiveData,
            Signal::Doorbells {
                socket,
                control: true,
            } if !self.producer => matches!(pending(*socket, true), Ok(Pending::Control)),
            _ => false,
        }
    }

    /// Waits until `ready` holds: spins, then announces sleep through `flag`, checks
    /// again, and sleeps. Fails with `BrokenPipe` once the session is over.
    fn wait(
        &self,
        flag: &AtomicU32,
        ready: &dyn Fn() -> std::io::Result<bool>,
    ) -> std::io::Result<()> {
        if self.producer {
            return self.wait_for(flag, ready);
        }
        // For the peer's `peer_not_running`: a hint, not a synchronisation.
        self.consumer_waiting().store(1, Ordering::Relaxed);
        let r = self.wait_for(flag, ready);
        self.consumer_waiting().store(0, Ordering::Relaxed);
        r
    }

    fn wait_for(
        &self,
        flag: &AtomicU32,
        ready: &dyn Fn() -> std::io::Result<bool>,
    ) -> std::io::Result<()> {
        let start = Instant::now();
        let budget = self.learnt.budget(self.spin);
        // Polling without yielding would keep a peer that shares this side's CPU
        // waiting for exactly what this side waits for: a peer it just woke (the
        // scheduler often puts it on the waker's CPU), or one that answered the last
        // wait only after this side gave its CPU away.
        let woke_peer = self.woke_peer.swap(false, Ordering::Relaxed);
        let mut yield_after = if woke_peer || self.learnt.yield_first.get() {
            Duration::ZERO
        } else {
            SPIN_BEFORE_YIELD
        };
        // Whether the last yield handed the CPU to another thread.
        let mut gave = false;
        loop {
            let spun = start.elapsed();
            if spun >= budget {
                break;
            }
            if ready()? {
                self.learnt.spun(budget, true);
                self.learnt.yield_first.set(gave);
                return Ok(());
            }
            if spun >= PICKUP && spun < yield_after && self.peer_not_running() {
                // The peer waits for a CPU: yield between looks from now on.
                yield_after = Duration::ZERO;
                self.learnt.handed.set(self.learnt.handed.get() + 1);
            }
            if spun < yield_after {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            } else {
                // Still polling, but giving the CPU to anything runnable (the device's
                // own threads on a CPU implementation, the peer on a busy host). A
                // peer that keeps this side spinning must not hide the daemon's
                // messages.
                if self.daemon_calls() {
                    return Err(daemon_message());
                }
                gave = give_cpu();
            }
        }
        self.learnt.spun(budget, false);
        // On a host with more busy threads than CPUs the peer is often runnable but
        // waiting for a CPU: a few yields hand it this one for the cost of a context
        // switch, where a sleep and its wake-up cost a system call each side and an
        // interrupt to another CPU. Where nothing else is runnable, a yield returns at
        // once and costs a system call.
        for _ in 0..YIELDS_BEFORE_SLEEP {
            let gave = give_cpu();
            if ready()? {
                self.learnt.yield_first.set(gave);
                return Ok(());
            }
        }
        loop {
            flag.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if ready()? {
                flag.store(0, Ordering::Relaxed);
                return Ok(());
            }
            self.learnt.sleeps.set(self.learnt.sleeps.get() + 1);
            let woke = self.sleep()?;
            flag.store(0, Ordering::Relaxed);
            if ready()? {
                return Ok(());
            }
            match woke {
                Woke::LiveEnd => {
                    return Err(Error::new(ErrorKind::BrokenPipe, "the session is over"));
                }
                Woke::LiveData => return Err(daemon_message()),
                Woke::Bell => {}
            }
        }
    }
}

/// What the API server's consumer returns when the daemon has a message for it.
fn daemon_message() -> Error {
    Error::new(ErrorKind::WouldBlock, "the daemon has a message")
}

fn corrupt(what: &str) -> Error {
    Error::new(ErrorKind::InvalidData, format!("corrupt ring: {what}"))
}

/// The writing end of a ring.
#[derive(Debug)]
pub struct Producer {
    end: End,
    /// Bytes produced so far: this side's own count, never read back from the region.
    head: u64,
}

/// The reading end of a ring.
#[derive(Debug)]
pub struct Consumer {
    end: End,
    /// Bytes consumed so far: this side's own count.
    tail: u64,
}

/// The two ends one side holds.
#[derive(Debug)]
pub struct Ends {
    pub producer: Producer,
    pub consumer: Consumer,
}

/// The guest's ends of a region: it produces submissions and consumes completions.
/// `fds` are the [`EVENTFDS`] eventfds in their order; `live` is the guest's socket
/// to the daemon.
pub fn guest_ends(region: Arc<Region>, fds: Vec<OwnedFd>, live: RawFd) -> std::io::Result<Ends> {
    let [p_peer, p_own, c_own, c_peer] = eventfd_array(fds)?;
    Ok(ends(
        region,
        Which::Submission,
        Which::Completion,
        Signal::Eventfds {
            own: p_own,
            peer: p_peer,
            live,
            control: false,
        },
        Signal::Eventfds {
            own: c_own,
            peer: c_peer,
            live,
            control: false,
        },
    ))
}

/// The API server's ends: it consumes submissions and produces completions. `live`
/// is its socket to the daemon.
pub fn server_ends(region: Arc<Region>, fds: Vec<OwnedFd>, live: RawFd) -> std::io::Result<Ends> {
    let [c_own, c_peer, p_peer, p_own] = eventfd_array(fds)?;
    Ok(ends(
        region,
        Which::Completion,
        Which::Submission,
        Signal::Eventfds {
            own: p_own,
            peer: p_peer,
            live,
            control: true,
        },
        Signal::Eventfds {
            own: c_own,
            peer: c_peer,
            live,
            control: true,
        },
    ))
}

/// Fresh host-local rings for a host end (an API server, or a VM host's pump for a
/// session placed elsewhere): its ends, `live` its socket to whoever ends the
/// session, and the region and eventfds to hand the guest.
pub fn new_server_rings(live: RawFd) -> std::io::Result<(Ends, OwnedFd, Vec<OwnedFd>)> {
    let (region, region_fd) = Region::create(DEFAULT_CAPACITY)?;
    let bells = eventfds()?;
    let ours = bells
        .iter()
        .map(OwnedFd::try_clone)
        .collect::<std::io::Result<Vec<_>>>()?;
    let ends = server_ends(Arc::new(region), ours, live)?;
    Ok((ends, region_fd, bells))
}

/// A host end's rings as the guest hands them back (its region first, then its
/// eventfds), for a session that moved: both sides go on from the positions the
/// region holds. The region is mapped only sealed against shrinking.
pub fn adopt_server_rings(fds: Vec<OwnedFd>, live: RawFd) -> std::io::Result<Ends> {
    let mut it = fds.into_iter();
    let region_fd = it
        .next()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "adopted rings without a region"))?;
    let region = Region::map(&region_fd, DEFAULT_CAPACITY)?;
    server_ends(Arc::new(region), it.collect(), live)
}

/// A VM guest's ends: doorbell frames on its vsock `socket` (see [`Signal`]).
pub fn guest_ends_vm(region: Arc<Region>, socket: RawFd) -> Ends {
    let signal = || Signal::Doorbells {
        socket,
        control: false,
    };
    ends(
        region,
        Which::Submission,
        Which::Completion,
        signal(),
        signal(),
    )
}

/// The API server's ends for a VM guest: doorbell frames on its socket to the
/// daemon, which relays them.
pub fn server_ends_vm(region: Arc<Region>, socket: RawFd) -> Ends {
    let signal = || Signal::Doorbells {
        socket,
        control: true,
    };
    ends(
        region,
        Which::Completion,
        Which::Submission,
        signal(),
        signal(),
    )
}

fn eventfd_array(fds: Vec<OwnedFd>) -> std::io::Result<[OwnedFd; EVENTFDS]> {
    let n = fds.len();
    fds.try_into().map_err(|_| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("{n} eventfds, {EVENTFDS} expected"),
        )
    })
}

fn ends(region: Arc<Region>, produce: Which, consume: Which, p: Signal, c: Signal) -> Ends {
    let woke_peer = Arc::new(AtomicBool::new(false));
    let producer = End {
        region: region.clone(),
        which: produce,
        signal: p,
        producer: true,
        spin: Duration::ZERO,
        learnt: Learnt::new(),
        woke_peer: woke_peer.clone(),
    };
    let consumer = End {
        region,
        which: consume,
        signal: c,
        producer: false,
        spin: Duration::ZERO,
        learnt: Learnt::new(),
        woke_peer,
    };
    // Each side's position starts where the region says: zero for a fresh region.
    Ends {
        producer: Producer {
            head: producer.head().load(Ordering::Acquire),
            end: producer,
        },
        consumer: Consumer {
            tail: consumer.tail().load(Ordering::Acquire),
            end: consumer,
        },
    }
}

impl Producer {
    /// How long to spin waiting for space before sleeping.
    pub fn set_spin(&mut self, spin: Duration) {
        self.end.spin = spin;
    }

    /// How many times this end has slept waiting for its peer (diagnostics).
    pub fn sleeps(&self) -> u64 {
        self.end.learnt.sleeps.get()
    }

    /// Free bytes, from the peer's tail, checked.
    fn free(&self) -> std::io::Result<usize> {
        let cap = self.end.region.capacity() as u64;
        let tail = self.end.tail().load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > cap {
            return Err(corrupt("consumer index out of range"));
        }
        Ok((cap - used) as usize)
    }
}

impl Producer {
    /// Whether there is room for at least one byte, without waiting.
    pub fn has_room(&self) -> std::io::Result<bool> {
        Ok(self.free()? > 0)
    }

    /// As [`Consumer::will_sleep`], for room: says whether there is some already.
    pub fn will_sleep(&self) -> std::io::Result<bool> {
        self.end.announce(self.end.producer_sleeping());
        self.has_room()
    }

    /// Ends [`Producer::will_sleep`]'s announcement.
    pub fn awake(&self) {
        self.end.settle(self.end.producer_sleeping());
    }

    /// The eventfd the consumer rings for a producer that announced it sleeps.
    pub fn bell(&self) -> Option<RawFd> {
        self.end.bell()
    }

    /// Writes what fits without waiting: `WouldBlock` when nothing does.
    pub fn try_write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = buf.len().min(self.free()?);
        if n == 0 {
            return Err(Error::from(ErrorKind::WouldBlock));
        }
        self.put(&buf[..n], self.head);
        self.publish(n);
        Ok(n)
    }

    /// Waits for at least one free byte; returns how many are free.
    fn wait_for_space(&mut self) -> std::io::Result<usize> {
        let free = self.free()?;
        if free > 0 {
            return Ok(free);
        }
        let end = &self.end;
        let head = self.head;
        let cap = end.region.capacity() as u64;
        end.wait(end.producer_sleeping(), &|| {
            let used = head.wrapping_sub(end.tail().load(Ordering::Acquire));
            if used > cap {
                return Err(corrupt("consumer index out of range"));
            }
            Ok(used < cap)
        })?;
        self.free()
    }

    /// Copies `bytes` (which fit the free space) after what was produced, without
    /// publishing them.
    fn put(&mut self, bytes: &[u8], at_head: u64) {
        let cap = self.end.region.capacity();
        let at = (at_head % cap as u64) as usize;
        let first = bytes.len().min(cap - at);
        let data = self.end.data();
        // SAFETY: both pieces lie inside this ring's data (`at + first <= cap`,
        // `len - first <= at`), in free space the consumer does not read until `head`
        // moves past it.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), data.add(at), first);
            std::ptr::copy_nonoverlapping(bytes.as_ptr().add(first), data, bytes.len() - first);
        }
    }

    /// Makes `n` more bytes visible to the consumer and wakes it if it sleeps.
    fn publish(&mut self, n: usize) {
        self.head = self.head.wrapping_add(n as u64);
        self.end.head().store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.end.consumer_sleeping().load(Ordering::Relaxed) != 0 {
            self.end.ring_peer();
        }
    }
}

impl Write for Producer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.wait_for_space()?;
        self.try_write(buf)
    }

    /// Copies as much of `bufs` as fits and publishes it at once, so that a frame's
    /// header and body wake the consumer once.
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Ok(0);
        }
        let mut room = self.wait_for_space()?;
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(room);
            self.put(&b[..take], self.head.wrapping_add(n as u64));
            n += take;
            room -= take;
            if room == 0 {
                break;
            }
        }
        self.publish(n);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Consumer {
    /// How long to spin waiting for data before sleeping.
    pub fn set_spin(&mut self, spin: Duration) {
        self.end.spin = spin;
    }

    /// How many times this end has slept waiting for its peer (diagnostics).
    pub fn sleeps(&self) -> u64 {
        self.end.learnt.sleeps.get()
    }

    /// For a caller that waits on more than this ring (a forwarder that also waits
    /// for a network connection) and polls itself: announces that this end sleeps,
    /// so that the producer rings [`Consumer::bell`], and says whether bytes came
    /// meanwhile (then the caller does not sleep). [`Consumer::awake`] ends the
    /// announcement, whether the caller slept or not.
    pub fn will_sleep(&self) -> std::io::Result<bool> {
        self.end.announce(self.end.consumer_sleeping());
        self.ready()
    }

    /// Ends [`Consumer::will_sleep`]'s announcement.
    pub fn awake(&self) {
        self.end.settle(self.end.consumer_sleeping());
    }

    /// The eventfd the producer rings for a consumer that announced it sleeps
    /// (`None` for a VM's rings, whose doorbells come on a socket).
    pub fn bell(&self) -> Option<RawFd> {
        self.end.bell()
    }

    /// Reads what is there without waiting: `WouldBlock` when nothing is.
    pub fn try_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !buf.is_empty() && self.available()? == 0 {
            return Err(Error::from(ErrorKind::WouldBlock));
        }
        self.read(buf)
    }

    /// Bytes ready to read, from the peer's head, checked.
    fn available(&self) -> std::io::Result<usize> {
        let cap = self.end.region.capacity() as u64;
        let head = self.end.head().load(Ordering::Acquire);
        let avail = head.wrapping_sub(self.tail);
        if avail > cap {
            return Err(corrupt("producer index out of range"));
        }
        Ok(avail as usize)
    }

    /// Whether bytes are ready, without waiting.
    pub fn ready(&self) -> std::io::Result<bool> {
        Ok(self.available()? > 0)
    }
}

impl Read for Consumer {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut avail = self.available()?;
        if avail == 0 {
            let end = &self.end;
            let tail = self.tail;
            let cap = end.region.capacity() as u64;
            end.wait(end.consumer_sleeping(), &|| {
                let avail = end.head().load(Ordering::Acquire).wrapping_sub(tail);
                if avail > cap {
                    return Err(corrupt("producer index out of range"));
                }
                Ok(avail > 0)
            })?;
            avail = self.available()?;
        }
        let cap = self.end.region.capacity();
        let n = buf.len().min(avail);
        let at = (self.tail % cap as u64) as usize;
        let first = n.min(cap - at);
        let data = self.end.data();
        // SAFETY: both pieces lie inside this ring's data; the bytes are copied out
        // once and only then looked at (the peer may change them at any time).
        unsafe {
            std::ptr::copy_nonoverlapping(data.add(at), buf.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(data, buf.as_mut_ptr().add(first), n - first);
        }
        self.tail = self.tail.wrapping_add(n as u64);
        self.end.tail().store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.end.producer_sleeping().load(Ordering::Relaxed) != 0 {
            self.end.ring_peer();
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn dup_all(fds: &[OwnedFd]) -> Vec<OwnedFd> {
        fds.iter().map(|f| f.try_clone().unwrap()).collect()
    }

    /// A guest's and a server's ends of one fresh region, and the two "daemon"
    /// sockets whose closing ends the session.
    fn pair(capacity: usize) -> (Ends, Ends, UnixStream, UnixStream) {
        let (region, fd) = Region::create(capacity).unwrap();
        let fds = eventfds().unwrap();
        let peer_region = Arc::new(Region::map(&fd, capacity).unwrap());
        let (gl, gd) = UnixStream::pair().unwrap();
        let (sl, sd) = UnixStream::pair().unwrap();
        let guest = guest_ends(peer_region, dup_all(&fds), gl.as_raw_fd()).unwrap();
        let server = server_ends(Arc::new(region), fds, sl.as_raw_fd()).unwrap();
        std::mem::forget(gl);
        std::mem::forget(sl);
        (guest, server, gd, sd)
    }

    /// A consumer says while it waits, and only then.
    #[test]
    fn a_consumer_says_while_it_waits() {
        let (mut g, mut s, _gd, _sd) = pair(4096);
        let waiting = |s: &Ends| s.consumer.end.consumer_waiting().load(Ordering::Relaxed);
        assert_eq!(waiting(&s), 0);
        let t = std::thread::spawn(move || {
            let mut b = [0u8; 1];
            s.consumer.read_exact(&mut b).unwrap();
            s
        });
        // The guest sees the server's word through its own mapping.
        while g.producer.end.consumer_waiting().load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        g.producer.write_all(&[7]).unwrap();
        let s = t.join().unwrap();
        assert_eq!(waiting(&s), 0, "no longer waiting once it read");
    }

    /// What a peer waits for and has not taken says it is off its CPU; a peer busy
    /// with an earlier message, or one that took it, does not.
    #[test]
    fn a_waiting_peer_that_has_not_taken_a_message_is_not_running() {
        let (mut g, mut s, _gd, _sd) = pair(4096);
        let server_waits = |on: u32| g_word(&s).store(on, Ordering::Relaxed);
        fn g_word(s: &Ends) -> &AtomicU32 {
            s.consumer.end.consumer_waiting()
        }
        // Nothing sent: nothing untaken.
        server_waits(1);
        assert!(!g.consumer.end.peer_not_running());
        g.producer.write_all(&[7]).unwrap();
        assert!(
            g.consumer.end.peer_not_running(),
            "untaken, and the server waits"
        );
        server_waits(0);
        assert!(
            !g.consumer.end.peer_not_running(),
            "the server is busy, not waiting"
        );
        server_waits(1);
        s.consumer.read_exact(&mut [0u8; 1]).unwrap();
        g_word(&s).store(1, Ordering::Relaxed);
        assert!(!g.consumer.end.peer_not_running(), "taken");
        // The same the other way: a reply the guest waits for and has not taken.
        g.consumer
            .end
            .consumer_waiting()
            .store(1, Ordering::Relaxed);
        s.producer.write_all(&[9]).unwrap();
        assert!(s.consumer.end.peer_not_running());
        // A producer never asks.
        assert!(!g.producer.end.peer_not_running());
    }

    #[test]
    fn frames_cross_in_both_directions_and_wrap() {
        let (mut g, mut s, _gd, _sd) = pair(4096);
        let t = std::thread::spawn(move || {
            let mut buf = vec![0u8; 3000];
            for i in 0..200u32 {
                s.consumer.read_exact(&mut buf).unwrap();
                assert!(buf.iter().all(|&b| b == i as u8), "request {i}");
                s.producer.write_all(&i.to_le_bytes()).unwrap();
            }
        });
        for i in 0..200u32 {
            g.producer.write_all(&vec![i as u8; 3000]).unwrap();
            let mut r = [0u8; 4];
            g.consumer.read_exact(&mut r).unwrap();
            assert_eq!(u32::from_le_bytes(r), i);
        }
        t.join().unwrap();
    }

    #[test]
    fn a_write_larger_than_the_ring_streams_through() {
        let (mut g, mut s, _gd, _sd) = pair(4096);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let expect = data.clone();
        let t = std::thread::spawn(move || g.producer.write_all(&data).unwrap());
        let mut got = vec![0u8; expect.len()];
        s.consumer.read_exact(&mut got).unwrap();
        t.join().unwrap();
        assert_eq!(got, expect);
    }

    #[test]
    fn a_corrupt_index_fails_the_reader_and_the_writer() {
        let (g, mut s, _gd, _sd) = pair(4096);
        // A hostile guest moves the submission head far beyond the capacity.
        g.producer.end.head().store(1 << 40, Ordering::Release);
        let e = s.consumer.read(&mut [0u8; 16]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        // ... or moves the completion tail past what the server produced.
        g.consumer.end.tail().store(12345, Ordering::Release);
        let e = s.producer.write(&[1, 2, 3]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
    }

    #[test]
    fn a_spin_that_never_pays_stops_and_a_probe_that_pays_learns_again() {
        let cap = Duration::from_micros(50);
        let l = Learnt::new();
        assert_eq!(l.budget(cap), cap);
        // 50, 25, 12.5 and 6.25 µs spins that end in sleep: the next would be under
        // a probe's length, so there is none.
        for _ in 0..4 {
            let b = l.budget(cap);
            assert!(!b.is_zero());
            l.spun(b, false);
        }
        let budgets: Vec<Duration> = (0..PROBE_EVERY * 2).map(|_| l.budget(cap)).collect();
        let probes: Vec<usize> = (0..budgets.len())
            .filter(|&i| !budgets[i].is_zero())
            .collect();
        assert_eq!(
            probes,
            [PROBE_EVERY as usize - 1, 2 * PROBE_EVERY as usize - 1]
        );
        assert_eq!(budgets[probes[0]], Duration::from_nanos(PROBE_NS));
        // A probe that pays: the spin doubles with each success up to the cap.
        l.spun(Duration::from_nanos(PROBE_NS), true);
        let mut seen = vec![];
        for _ in 0..4 {
            let b = l.budget(cap);
            seen.push(b.as_micros());
            l.spun(b, true);
        }
        assert_eq!(seen, [8, 16, 32, 50]);
    }

    /// The CPUs the calling thread may run on.
    fn affinity() -> libc::cpu_set_t {
        // SAFETY: a system call that fills a local set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
                0
            );
            set
        }
    }

    /// Lets the calling thread run on `set` only.
    fn set_affinity(set: &libc::cpu_set_t) {
        // SAFETY: a system call that reads a local set.
        let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(set), set) };
        assert_eq!(r, 0);
    }

    /// Pins the calling thread to `cpu`.
    fn pin(cpu: usize) {
        // SAFETY: an all-zero `cpu_set_t` is the empty set, and `cpu` is below
        // CPU_SETSIZE (it came from `CPU_ISSET`).
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            set
        };
        set_affinity(&set);
    }

    /// `rounds` one-byte calls and replies between a guest and a server thread that
    /// share one CPU, as many busy threads on few CPUs do; `note` sees the guest's
    /// ends after each reply.
    fn ping_pong_on_one_cpu(
        spin: Duration,
        rounds: u32,
        mut note: impl FnMut(&Ends),
    ) -> (Ends, Ends) {
        let (mut g, mut s, gd, sd) = pair(4096);
        for e in [&mut g, &mut s] {
            e.producer.set_spin(spin);
            e.consumer.set_spin(spin);
        }
        // The test's own thread is pinned only for the exchange.
        let before = affinity();
        let cpu = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `c` is below CPU_SETSIZE.
            .find(|&c| unsafe { libc::CPU_ISSET(c, &before) })
            .unwrap();
        let t = std::thread::spawn(move || {
            pin(cpu);
            let mut b = [0u8; 1];
            for _ in 0..rounds {
                s.consumer.read_exact(&mut b).unwrap();
                s.producer.write_all(&b).unwrap();
            }
            s
        });
        pin(cpu);
        for i in 0..rounds {
            let mut b = [i as u8];
            g.producer.write_all(&b).unwrap();
            g.consumer.read_exact(&mut b).unwrap();
            assert_eq!(b, [i as u8]);
            note(&g);
        }
        set_affinity(&before);
        drop((gd, sd));
        (g, t.join().unwrap())
    }

    #[test]
    fn sides_sharing_a_cpu_hand_it_over_instead_of_sleeping() {
        // No spin at all: every wait that is not answered in its yields sleeps.
        let rounds = 2000;
        let (g, s) = ping_pong_on_one_cpu(Duration::ZERO, rounds, |_| {});
        let sleeps = g.consumer.sleeps() + s.consumer.sleeps();
        // Each side waits once per round; a wait that slept every time would be
        // 2 * rounds.
        assert!(
            sleeps < u64::from(rounds) / 2,
            "{sleeps} sleeps in {rounds} rounds"
        );
    }

    #[test]
    fn a_side_whose_peer_shares_its_cpu_learns_to_yield_first() {
        // A long spin: without learning, each wait would poll without yielding for
        // SPIN_BEFORE_YIELD while its peer waits for the CPU.
        let rounds = 500;
        let mut first = 0;
        let (g, _) = ping_pong_on_one_cpu(Duration::from_millis(1), rounds, |g| {
            first += u32::from(g.consumer.end.learnt.yield_first.get());
        });
        // Either it yields from the start, or it finds its peer waiting for the CPU
        // (its request untaken) and yields from then on.
        let handed = g.consumer.end.learnt.handed.get();
        assert!(
            u64::from(first) + handed > u64::from(rounds) / 2,
            "{first} of {rounds} waits learnt to yield first, {handed} found the peer off its CPU"
        );
    }

    #[test]
    fn a_reader_whose_writer_answers_only_after_it_sleeps_stops_spinning() {
        let (mut g, mut s, _gd, _sd) = pair(4096);
        s.consumer.set_spin(Duration::from_micros(50));
        let rounds = 8u64;
        let t = std::thread::spawn(move || {
            for _ in 0..rounds {
                s.consumer.read_exact(&mut [0u8; 1]).unwrap();
            }
            s
        });
        for i in 0..rounds {
            // The byte goes only once the reader announces sleep (its spin over),
            // and the next round starts once it has read it.
            while g.producer.end.consumer_sleeping().load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            g.producer.write_all(&[i as u8]).unwrap();
            while g.producer.end.tail().load(Ordering::Acquire) < i + 1 {
                std::thread::yield_now();
            }
        }
        let s = t.join().unwrap();
        assert_eq!(s.consumer.end.learnt.ns.get(), 0);
        assert!(
            s.consumer
                .end
                .learnt
                .budget(Duration::from_micros(50))
                .is_zero()
        );
    }

    #[test]
    fn a_writer_notes_that_it_woke_its_peer_and_its_next_wait_takes_the_note() {
        let (mut g, mut s, _gd, _sd) = pair(4096);
        // The server does not sleep: a write leaves no note.
        g.producer.write_all(&[1]).unwrap();
        assert!(!g.producer.end.woke_peer.load(Ordering::Relaxed));
        s.consumer.read_exact(&mut [0u8; 1]).unwrap();
        let t = std::thread::spawn(move || {
            s.consumer.read_exact(&mut [0u8; 1]).unwrap();
            // The reply goes once the guest sleeps, so that the guest waits for it.
            while s.producer.end.consumer_sleeping().load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            s.producer.write_all(&[3]).unwrap();
        });
        while g.producer.end.consumer_sleeping().load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        g.producer.write_all(&[2]).unwrap();
        assert!(g.producer.end.woke_peer.load(Ordering::Relaxed));
        // The guest's wait for the reply takes the note (it yields at once).
        let mut r = [0u8; 1];
        g.consumer.read_exact(&mut r).unwrap();
        assert_eq!(r, [3]);
        t.join().unwrap();
        assert!(!g.consumer.end.woke_peer.load(Ordering::Relaxed));
    }

    #[test]
    fn a_sleeping_reader_wakes_when_its_session_ends() {
        let (_g, mut s, _gd, sd) = pair(4096);
        let t = std::thread::spawn(move || s.consumer.read(&mut [0u8; 8]));
        drop(sd);
        let e = t.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BrokenPipe);
    }

    /// A guest's and a server's ends in VM mode, their doorbell sockets connected
    /// directly (in Hira the daemon relays between them).
    fn vm_pair(capacity: usize) -> (Ends, Ends, UnixStream, UnixStream) {
        let (region, fd) = Region::create(capacity).unwrap();
        let peer_region = Arc::new(Region::map_at(&fd, 0, capacity, false).unwrap());
        let (g, s) = UnixStream::pair().unwrap();
        let guest = guest_ends_vm(peer_region, g.as_raw_fd());
        let server = server_ends_vm(Arc::new(region), s.as_raw_fd());
        (guest, server, g, s)
    }

    #[test]
    fn in_a_vm_doorbells_and_polling_carry_frames_both_ways() {
        let (mut g, mut s, _gs, _ss) = vm_pair(4096);
        let t = std::thread::spawn(move || {
            let mut buf = vec![0u8; 10_000];
            for i in 0..50u32 {
                s.consumer.read_exact(&mut buf).unwrap();
                assert!(buf.iter().all(|&b| b == i as u8), "request {i}");
                // Replies larger than the ring: the server polls for space.
                s.producer.write_all(&vec![!(i as u8); 9000]).unwrap();
            }
        });
        for i in 0..50u32 {
            g.producer.write_all(&vec![i as u8; 10_000]).unwrap();
            let mut r = vec![0u8; 9000];
            g.consumer.read_exact(&mut r).unwrap();
            assert!(r.iter().all(|&b| b == !(i as u8)), "reply {i}");
        }
        t.join().unwrap();
    }

    #[test]
    fn in_a_vm_a_sleeping_reader_wakes_at_the_end_and_leaves_the_last_word() {
        let (_g, mut s, gs, ss) = vm_pair(4096);
        let t = std::thread::spawn(move || {
            let r = s.consumer.read(&mut [0u8; 8]);
            (r, ss)
        });
        // The daemon's error frame: not a doorbell, so the session is over, and the
        // frame stays on the socket for the caller to read.
        let err = hira_protocol::frame::FrameHeader::new(
            hira_protocol::frame::FrameKind::Error,
            0,
            0,
            0,
            0,
        );
        (&gs).write_all(&err.encode()).unwrap();
        let (r, mut ss) = t.join().unwrap();
        assert_eq!(r.unwrap_err().kind(), ErrorKind::BrokenPipe);
        let mut b = [0u8; hira_protocol::frame::HEADER_LEN];
        ss.read_exact(&mut b).unwrap();
        assert_eq!(b, err.encode());
    }

    #[test]
    fn a_region_that_can_shrink_or_is_too_small_is_refused() {
        // SAFETY: plain memfd without sealing, owned by the test.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: memfd_create just returned this descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: resizing a descriptor the test owns.
        unsafe { libc::ftruncate(fd.as_raw_fd(), region_len(4096) as libc::off_t) };
        assert!(Region::map(&fd, 4096).is_err());
        let (_r, sealed) = Region::create(4096).unwrap();
        assert!(Region::map(&sealed, 8192).is_err());
        assert!(Region::create(1000).is_err());
    }

    /// Whether `fd` is readable now.
    fn rung(fd: RawFd) -> bool {
        let mut p = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one valid pollfd; a zero timeout never blocks.
        unsafe { libc::poll(p.as_mut_ptr(), 1, 0) == 1 }
    }

    #[test]
    fn a_caller_that_polls_itself_is_rung_for_data_and_for_room() {
        let (mut guest, mut server, _gd, _sd) = pair(4096);
        let mut buf = [0u8; 8192];
        // Nothing yet: a try fails at once, and an announced sleep is rung for.
        let e = server.consumer.try_read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        let bell = server.consumer.bell().unwrap();
        assert!(!server.consumer.will_sleep().unwrap());
        assert!(!rung(bell));
        guest.producer.write_all(b"request").unwrap();
        assert!(rung(bell), "the producer rang the announced sleeper");
        server.consumer.awake();
        assert!(!rung(bell), "awake takes the rings");
        assert_eq!(server.consumer.try_read(&mut buf).unwrap(), 7);
        // Data there before the announcement: the caller must not sleep.
        guest.producer.write_all(b"x").unwrap();
        assert!(server.consumer.will_sleep().unwrap());
        server.consumer.awake();
        assert_eq!(server.consumer.try_read(&mut buf).unwrap(), 1);
        // A full ring takes what fits, then nothing; room is rung for.
        assert_eq!(server.producer.try_write(&buf).unwrap(), 4096);
        let e = server.producer.try_write(&buf).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        let room = server.producer.bell().unwrap();
        assert!(!server.producer.will_sleep().unwrap());
        let mut got = [0u8; 100];
        guest.consumer.read_exact(&mut got).unwrap();
        assert!(
            rung(room),
            "the consumer rang the producer waiting for room"
        );
        server.producer.awake();
        assert!(server.producer.has_room().unwrap());
    }
}
