//! **Test infrastructure, not part of Hira**: a TCP relay that adds a fixed one-way
//! delay to every byte, in both directions, standing in for the network distance
//! between a VM host and a GPU host.
//!
//! This machine's kernel has no `sch_netem` (`tc ... netem` answers "Specified qdisc
//! kind is unknown"), so the delay is added here instead: each direction has a reader
//! that stamps every chunk it reads with the time it is due and a writer that sends it
//! then. Chunks are not held behind each other, so the relay adds latency and keeps
//! the link's bandwidth, as a longer wire would. Where a kernel has netem, tests and
//! benchmarks can add the delay with it instead (`tc qdisc add dev IF root netem delay
//! 50us`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bytes read at once.
const CHUNK: usize = 64 * 1024;

/// The connections a relay carries, to cut them all at once (both ends see their
/// socket close, as when a middlebox drops its state).
#[derive(Debug, Clone, Default)]
pub struct Connections(std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>);

impl Connections {
    /// Cuts every connection carried so far.
    pub fn cut(&self) {
        for s in self.0.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn carry(&self, s: &TcpStream) {
        if let Ok(c) = s.try_clone() {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(c);
        }
    }
}

/// Relays every connection accepted on `listener` to `to`, each byte `one_way` late,
/// until the listener fails. Runs on the calling thread; each connection gets four.
pub fn serve(listener: &TcpListener, to: SocketAddr, one_way: Duration) {
    serve_with(listener, to, one_way, &Connections::default());
}

/// As [`serve`], each connection's two sockets kept in `carried`.
pub fn serve_with(
    listener: &TcpListener,
    to: SocketAddr,
    one_way: Duration,
    carried: &Connections,
) {
    for accepted in listener.incoming() {
        let Ok(near) = accepted else { return };
        let Ok(far) = TcpStream::connect(to) else {
            continue;
        };
        let _ = near.set_nodelay(true);
        let _ = far.set_nodelay(true);
        carried.carry(&near);
        carried.carry(&far);
        let (Ok(near2), Ok(far2)) = (near.try_clone(), far.try_clone()) else {
            continue;
        };
        direction(near, far, one_way);
        direction(far2, near2, one_way);
    }
}

/// Copies `from` to `to`, each chunk `delay` after it arrived; shuts `to` for writing
/// once `from` ends.
fn direction(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        precise_sleeps();
        while let Ok((due, bytes)) = rx.recv() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Asks the kernel to wake this thread's sleeps on time (the default slack of 50 µs
/// would add as much to each delay).
fn precise_sleeps() {
    // SAFETY: PR_SET_TIMERSLACK changes only this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_arrive_whole_in_order_and_late_by_the_delay() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = vec![0u8; 4096];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => s.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let relay = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay_addr = relay.local_addr().unwrap();
        let delay = Duration::from_millis(20);
        std::thread::spawn(move || serve(&relay, echo_addr, delay));
        let mut c = TcpStream::connect(relay_addr).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let t0 = Instant::now();
        let writer = {
            let mut c = c.try_clone().unwrap();
            let data = data.clone();
            std::thread::spawn(move || c.write_all(&data).unwrap())
        };
        let mut back = vec![0u8; data.len()];
        c.read_exact(&mut back).unwrap();
        writer.join().unwrap();
        assert_eq!(back, data);
        // There and back: at least twice the one-way delay.
        assert!(t0.elapsed() >= 2 * delay, "{:?}", t0.elapsed());
    }
}
