//! A steady stream of new TCP connections from inside a netns: every attempt is a fresh
//! connect with a short timeout, started on a fixed schedule and counted, so that a test can
//! prove a verdict (e.g. an EgressFirewall deny) never lapses while the agent works.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::netns::Ns;

/// What a stream saw so far.
#[derive(Clone, Debug, Default)]
pub struct StreamTally {
    /// Connections started.
    pub attempts: u64,
    /// Handshakes that completed (the SYN got through and was answered): time since the
    /// stream started and what the server sent (or why nothing was read).
    pub connected: Vec<(Duration, String)>,
    /// Answered with a RST (ECONNREFUSED / ECONNRESET).
    pub refused: u64,
    /// ICMP unreachable or a local EPERM/EACCES.
    pub unreachable: u64,
    /// No answer within the timeout (a `drop`).
    pub timeouts: u64,
    /// Local errors that say nothing about the path (e.g. out of ports): the first few.
    pub errors: Vec<String>,
    /// Count of local errors.
    pub error_count: u64,
    /// How long the stream has run.
    pub elapsed: Duration,
}

impl StreamTally {
    /// Attempts that really tested the path (started and not failed locally).
    pub fn effective_attempts(&self) -> u64 {
        self.attempts - self.error_count
    }

    /// Completed handshakes whose attempt ended in `[from, to)` (times since the start).
    pub fn connected_between(&self, from: Duration, to: Duration) -> usize {
        self.connected
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .count()
    }

    /// One line for test output.
    pub fn summary(&self) -> String {
        format!(
            "{} attempts in {:.1} s ({:.0}/s): {} connected, {} refused, {} unreachable, \
             {} timed out, {} local errors",
            self.attempts,
            self.elapsed.as_secs_f64(),
            self.attempts as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.connected.len(),
            self.refused,
            self.unreachable,
            self.timeouts,
            self.error_count
        )
    }
}

/// Connection stream threads inside a netns; stops and joins on drop.
pub struct ConnStream {
    started: Instant,
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<StreamTally>>,
    threads: Vec<JoinHandle<()>>,
}

impl ConnStream {
    /// When the first attempt was scheduled; `StreamTally` times are relative to it.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// A copy of the counts so far.
    pub fn tally(&self) -> StreamTally {
        let mut t = lock(&self.tally).clone();
        t.elapsed = self.started.elapsed();
        t
    }

    /// Stops the stream, waits for the attempts in flight and returns the final counts.
    pub fn stop(mut self) -> StreamTally {
        self.halt();
        self.tally()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ConnStream {
    fn drop(&mut self) {
        self.halt();
    }
}

impl Ns {
    /// Starts `per_second` new TCP connections per second from this netns to `dst`, each
    /// given `timeout` to complete its handshake (keep it well under 1 s so that a dropped
    /// SYN is never retransmitted into a later moment). Enough threads run so that
    /// attempts that time out do not slow the rate.
    pub fn tcp_stream(&self, dst: SocketAddr, per_second: u32, timeout: Duration) -> ConnStream {
        assert!(per_second > 0, "a stream needs a rate");
        let interval = Duration::from_secs(1) / per_second;
        // Each thread waits for its own attempt, so it needs a slot longer than the timeout.
        let threads = (timeout.as_secs_f64() / interval.as_secs_f64()).ceil() as u32 + 1;
        let period = interval * threads;
        let started = Instant::now() + Duration::from_millis(50);
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(StreamTally::default()));
        let handles = (0..threads)
            .map(|i| {
                let (stop, tally) = (stop.clone(), tally.clone());
                let first = started + interval * i;
                self.spawn(move || {
                    stream_thread(dst, first, period, timeout, started, &stop, &tally)
                })
            })
            .collect();
        ConnStream {
            started,
            stop,
            tally,
            threads: handles,
        }
    }
}

fn stream_thread(
    dst: SocketAddr,
    first: Instant,
    period: Duration,
    timeout: Duration,
    started: Instant,
    stop: &AtomicBool,
    tally: &Mutex<StreamTally>,
) {
    let mut next = first;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += period;
        // Fell behind (a loaded machine): skip slots instead of bursting.
        let now = Instant::now();
        while next < now {
            next += period;
        }
        lock(tally).attempts += 1;
        let result = TcpStream::connect_timeout(&dst, timeout);
        let at = started.elapsed();
        let mut t = lock(tally);
        match result {
            Ok(mut conn) => {
                drop(t);
                let reply = read_reply(&mut conn);
                lock(tally).connected.push((at, reply));
            }
            Err(e) => classify(&mut t, e),
        }
    }
}

fn read_reply(conn: &mut TcpStream) -> String {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(300)));
    let mut text = String::new();
    match conn.read_to_string(&mut text) {
        Ok(_) => text.trim_end().to_string(),
        Err(e) => format!("{} (then read error: {e})", text.trim_end()),
    }
}

fn classify(t: &mut StreamTally, e: io::Error) {
    use nix::errno::Errno as E;
    match e.raw_os_error().map(E::from_raw) {
        Some(E::ECONNREFUSED | E::ECONNRESET) => t.refused += 1,
        Some(E::EHOSTUNREACH | E::ENETUNREACH | E::EPERM | E::EACCES) => t.unreachable += 1,
        Some(E::EINPROGRESS | E::EAGAIN | E::ETIMEDOUT) => t.timeouts += 1,
        _ if e.kind() == io::ErrorKind::TimedOut => t.timeouts += 1,
        _ => {
            t.error_count += 1;
            if t.errors.len() < 5 {
                t.errors.push(e.to_string());
            }
        }
    }
}

fn lock(m: &Mutex<StreamTally>) -> std::sync::MutexGuard<'_, StreamTally> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
