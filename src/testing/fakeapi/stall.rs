//! Silent stalls: a connection that stays open but on which the server neither reads nor
//! writes any more. The kernel still acknowledges what the client sends (so it is not a packet
//! drop at the TCP level: TCP keepalive cannot see it), nothing is closed or reset, and the
//! client only learns of it by noticing that no data arrives: the hardest partition to detect.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

#[derive(Default)]
pub struct Stalls {
    open: Mutex<Vec<Weak<AtomicBool>>>,
    new: AtomicBool,
}

impl Stalls {
    /// A connection that can be stalled (stalled from the start while `stall_new` is on).
    pub fn wrap(&self, stream: TcpStream) -> Stallable {
        let flag = Arc::new(AtomicBool::new(self.new.load(Ordering::SeqCst)));
        let mut open = self.open.lock().unwrap();
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&flag));
        Stallable {
            stream,
            stalled: flag,
        }
    }

    pub fn stall_open(&self) {
        for flag in self.open.lock().unwrap().iter().filter_map(Weak::upgrade) {
            flag.store(true, Ordering::SeqCst);
        }
    }

    pub fn stall_new(&self, on: bool) {
        self.new.store(on, Ordering::SeqCst);
    }
}

/// A server connection whose reads and writes never complete once stalled. The socket stays
/// open until the server task is dropped (stop or drop of the fake).
pub struct Stallable {
    stream: TcpStream,
    stalled: Arc<AtomicBool>,
}

impl Stallable {
    fn stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }
}

impl AsyncRead for Stallable {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.stalled() {
            return Poll::Pending;
        }
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stallable {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.stalled() {
            return Poll::Pending;
        }
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.stalled() {
            return Poll::Pending;
        }
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.stalled() {
            return Poll::Pending;
        }
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
