//! A steady datagram stream through the lab, for measuring outages: a sender in one netns
//! sends a numbered UDP datagram every interval, a sink in another records when each arrived
//! and from which source address. The gap of an outage is read from the arrivals, so the
//! figure is what an application at the far end saw, not what the agent believes it did.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Ns;

/// One received datagram.
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    pub at: Instant,
    pub src: IpAddr,
    pub seq: u64,
}

/// Records every datagram that reaches a UDP port of a netns.
pub struct DatagramSink {
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DatagramSink {
    /// Listens on `bind` inside `ns` until dropped.
    pub fn start(ns: &Ns, bind: SocketAddr) -> DatagramSink {
        let socket = ns
            .enter(|| UdpSocket::bind(bind))
            .unwrap_or_else(|e| panic!("bind {bind} in {}: {e}", ns.name()));
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (arrivals.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !s.load(Ordering::Relaxed) {
                if let Ok((n, from)) = socket.recv_from(&mut buf) {
                    let at = Instant::now();
                    let seq = buf[..n.min(8)]
                        .try_into()
                        .map(u64::from_be_bytes)
                        .unwrap_or(u64::MAX);
                    a.lock().unwrap().push(Arrival {
                        at,
                        src: from.ip(),
                        seq,
                    });
                }
            }
        });
        DatagramSink {
            arrivals,
            stop,
            thread: Some(thread),
        }
    }

    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }

    /// How many datagrams came from each source address after `since` (for failure messages).
    pub fn sources_since(&self, since: Instant) -> std::collections::BTreeMap<IpAddr, usize> {
        let mut out = std::collections::BTreeMap::new();
        for a in self
            .arrivals
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.at > since)
        {
            *out.entry(a.src).or_insert(0) += 1;
        }
        out
    }

    /// The time of the last arrival from `src`, if any.
    pub fn last_from(&self, src: IpAddr) -> Option<Instant> {
        let arrivals = self.arrivals.lock().unwrap();
        arrivals.iter().rev().find(|a| a.src == src).map(|a| a.at)
    }

    /// The first datagram from `src` that arrived at or after `since`.
    pub fn first_from(&self, src: IpAddr, since: Instant) -> Option<Instant> {
        let arrivals = self.arrivals.lock().unwrap();
        arrivals
            .iter()
            .find(|a| a.src == src && a.at >= since)
            .map(|a| a.at)
    }

    /// What the stream looked like from `since` on, counting only datagrams from `src` as
    /// the service: see [`Outage`].
    pub fn outage(&self, src: IpAddr, since: Instant) -> Outage {
        outage(&self.arrivals(), src, since)
    }
}

impl Drop for DatagramSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The stream seen from an instant on (an event such as a node failure).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outage {
    /// The longest time between two consecutive datagrams from the expected source, counted
    /// from the last one before the event (the gap that contains the event; with a
    /// datagram every 10 ms, an undisturbed stream reads about 10 ms). `None` if none came
    /// back after the event.
    pub gap: Option<Duration>,
    /// Datagrams from any other source after the event: traffic that left without the
    /// expected source address (must be 0 for a fail-closed move).
    pub leaked: usize,
    /// Datagrams from the expected source after the event.
    pub delivered: usize,
}

fn outage(arrivals: &[Arrival], src: IpAddr, since: Instant) -> Outage {
    let mut last = arrivals
        .iter()
        .filter(|a| a.src == src && a.at <= since)
        .map(|a| a.at)
        .next_back()
        .unwrap_or(since);
    let mut gap = None::<Duration>;
    let (mut leaked, mut delivered) = (0, 0);
    for a in arrivals.iter().filter(|a| a.at > since) {
        if a.src != src {
            leaked += 1;
            continue;
        }
        delivered += 1;
        let d = a.at - last;
        gap = Some(gap.map_or(d, |g| g.max(d)));
        last = a.at;
    }
    Outage {
        gap,
        leaked,
        delivered,
    }
}

/// Sends a numbered datagram to `dst` every `interval` from a netns until dropped (on a
/// fixed schedule: a late send does not shift the next ones).
pub struct DatagramSender {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DatagramSender {
    pub fn start(ns: &Ns, dst: SocketAddr, interval: Duration) -> DatagramSender {
        DatagramSender::spawn(ns, dst, interval, false)
    }

    /// Like [`start`](Self::start), each datagram from a new socket: a new flow (conntrack
    /// entry) each time, so a NAT change shows on the next datagram instead of only on new
    /// connections.
    pub fn start_new_flows(ns: &Ns, dst: SocketAddr, interval: Duration) -> DatagramSender {
        DatagramSender::spawn(ns, dst, interval, true)
    }

    fn spawn(ns: &Ns, dst: SocketAddr, interval: Duration, new_flows: bool) -> DatagramSender {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = ns.spawn(move || {
            let mut socket = UdpSocket::bind("0.0.0.0:0").expect("bind sender");
            let start = Instant::now();
            let mut seq: u64 = 0;
            while !s.load(Ordering::Relaxed) {
                if new_flows && seq > 0 {
                    socket = UdpSocket::bind("0.0.0.0:0").expect("bind sender");
                }
                // Errors (no route, EPERM from a drop rule) are part of what is measured.
                let _ = socket.send_to(&seq.to_be_bytes(), dst);
                seq += 1;
                let next = start + interval * (seq as u32);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        DatagramSender {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for DatagramSender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_spans_the_event_and_other_sources_count_as_leaks() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let eip: IpAddr = "192.168.50.200".parse().unwrap();
        let node: IpAddr = "192.168.50.11".parse().unwrap();
        let arrivals: Vec<Arrival> = [(0, eip), (10, eip), (20, eip), (300, node), (500, eip)]
            .into_iter()
            .enumerate()
            .map(|(i, (t, src))| Arrival {
                at: ms(t),
                src,
                seq: i as u64,
            })
            .chain([(510, eip)].into_iter().map(|(t, src)| Arrival {
                at: ms(t),
                src,
                seq: 9,
            }))
            .collect();
        let o = outage(&arrivals, eip, ms(25));
        assert_eq!(o.gap, Some(Duration::from_millis(480)));
        assert_eq!((o.leaked, o.delivered), (1, 2));
        assert_eq!(outage(&arrivals, eip, ms(600)).gap, None);
    }
}
