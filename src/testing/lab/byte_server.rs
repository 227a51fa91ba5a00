//! What the connection-setup benches measure against: a server that writes one byte per
//! connection and closes, on a blocking accept loop (the lab's polling servers would dominate
//! the numbers), and a client loop that times sequential connections to it.

use super::netns::Ns;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Serves `bind` inside `ns`: one byte per connection, then close. The thread lives until
/// the process exits.
pub fn byte_server(ns: &Ns, bind: &str) {
    let bind = bind.to_string();
    let listener = ns.enter(move || TcpListener::bind(&bind).expect("bind the byte server"));
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            let _ = c.write_all(b"x");
        }
    });
}

/// `n` sequential TCP connections from `ns` to `dst` (connect, read the byte, close), each
/// timed. Panics when one is refused or times out (1 s): a bench measures allowed paths.
pub fn connect_times(ns: &Ns, dst: &str, n: usize) -> Vec<Duration> {
    let dst: SocketAddr = dst.parse().expect("a socket address");
    ns.enter(move || {
        (0..n)
            .map(|_| {
                let t = Instant::now();
                let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(1))
                    .unwrap_or_else(|e| panic!("connect to {dst}: {e}"));
                let mut buf = [0u8; 1];
                s.read_exact(&mut buf).expect("the byte");
                t.elapsed()
            })
            .collect()
    })
}
