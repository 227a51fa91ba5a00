//! One long-lived TCP connection whose every line is echoed back: what a test keeps open
//! across a change (a policy edit, a restart) to prove an established flow survives it.

use super::netns::Ns;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

/// Accepts one connection on `bind` inside `ns` and echoes its lines until it closes. Join
/// the handle after dropping the client.
pub fn line_echo_server(ns: &Ns, bind: SocketAddr) -> JoinHandle<()> {
    let listener = ns.enter(move || TcpListener::bind(bind).expect("bind the echo server"));
    std::thread::spawn(move || {
        let (conn, _) = listener.accept().expect("accept");
        let mut reader = BufReader::new(conn.try_clone().expect("clone the connection"));
        let mut writer = conn;
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if writer.write_all(line.as_bytes()).is_err() {
                return;
            }
            line.clear();
        }
    })
}

/// The client side: a connection from `ns` to a [`line_echo_server`].
pub struct EchoConn {
    conn: TcpStream,
}

impl EchoConn {
    /// Connects from inside `ns`; panics if the connection is not established in `timeout`.
    pub fn connect(ns: &Ns, dst: SocketAddr, timeout: Duration) -> EchoConn {
        let conn = ns.enter(move || {
            TcpStream::connect_timeout(&dst, timeout)
                .unwrap_or_else(|e| panic!("connect to {dst}: {e}"))
        });
        conn.set_read_timeout(Some(timeout)).unwrap();
        EchoConn { conn }
    }

    /// Sends `msg` as a line and returns the line that came back (an error: nothing came
    /// back within the timeout, or the connection was cut).
    pub fn roundtrip(&mut self, msg: &str) -> io::Result<String> {
        self.conn.write_all(format!("{msg}\n").as_bytes())?;
        let mut reader = BufReader::new(self.conn.try_clone()?);
        let mut got = String::new();
        reader.read_line(&mut got)?;
        Ok(got.trim().to_string())
    }
}
