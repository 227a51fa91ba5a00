//! HTTP/1 serving under a listener's [`Limits`]: the admin and metrics servers, kube-proxy's
//! proxy health and the `healthCheckNodePort`s.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::debug;

use super::{Limits, SourceGate, accept_loop};

/// Serves `listener` forever: each admitted connection (see [`SourceGate`]) gets `handler`
/// for every request, until it is idle for `limits.header_timeout` or has lived
/// `limits.lifetime`.
pub async fn serve<H, Fut>(
    name: &str,
    listener: TcpListener,
    limits: Limits,
    gate: SourceGate,
    handler: H,
) -> !
where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    accept_loop(name, &listener, |stream, peer| {
        let Some(ticket) = gate.admit(peer.ip().to_canonical()) else {
            debug!("{name}: connection from {peer} over the caps: closed");
            return;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _ticket = ticket;
            let service = service_fn(move |req| {
                let answer = handler(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.lifetime, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!("connection from {peer}: {e}"),
                Err(_) => debug!("connection from {peer}: closed after {:?}", limits.lifetime),
            }
        });
    })
    .await
}
