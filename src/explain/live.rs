//! `agent explain --live`: asks a running agent's admin endpoint (`/explain`, on loopback
//! by default) to explain the packet against the tables it applied. A plain HTTP/1.0 GET
//! over a socket with timeouts: one request, one answer.

use super::request::Request;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read (a report of 64 paths through a large table fits many times over).
const MAX_ANSWER: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("admin endpoint {0}: {1}")]
    Io(SocketAddr, std::io::Error),
    #[error("admin endpoint {0} answered {1}: {2}")]
    Status(SocketAddr, String, String),
    #[error("admin endpoint {0}: not an HTTP answer")]
    Malformed(SocketAddr),
}

/// The agent's report (text, or JSON with `json`).
pub fn ask(admin: SocketAddr, req: &Request, json: bool) -> Result<String, LiveError> {
    let io = |e| LiveError::Io(admin, e);
    let mut stream = TcpStream::connect_timeout(&admin, TIMEOUT).map_err(io)?;
    // A trace answers once it is over.
    let wait = TIMEOUT + Duration::from_secs(req.trace.map_or(0, |t| t.seconds));
    stream.set_read_timeout(Some(wait)).map_err(io)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    let format = if json { "&format=json" } else { "" };
    let path = format!("/explain?{}{format}", req.to_query_string());
    let request = format!("GET {path} HTTP/1.0\r\nHost: {admin}\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut answer = Vec::new();
    stream
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .map_err(io)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or(LiveError::Malformed(admin))?;
    let status = head.lines().next().unwrap_or_default();
    let code = status
        .split(' ')
        .nth(1)
        .ok_or(LiveError::Malformed(admin))?;
    if code != "200" {
        let body = crate::text::one_line(body.trim()).into_owned();
        return Err(LiveError::Status(admin, code.to_string(), body));
    }
    Ok(body.to_string())
}
