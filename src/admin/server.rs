//! The admin HTTP server (hyper 1, HTTP/1.1): `/healthz`, `/readyz`, `/metrics`, `/ruleset`,
//! on loopback; and the metrics-only server (`/metrics`), which may face the network.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tracing::info;

use super::AdminState;
use crate::listener::{Limits, http};
use crate::task::{OnExit, Task, once};

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// Everything: the agent's state (`/ruleset`, `/readyz`) is for the node's admin only.
    Admin,
    /// `/metrics` only, safe to expose to the network (kube-proxy's `:10249`).
    Metrics,
}

/// Binds `addr` for `surface`; returns the bound address (port 0 picks one) and the task
/// that serves it (vital: an admin server that is gone leaves the node's admin blind).
pub async fn listen(
    addr: SocketAddr,
    state: Arc<AdminState>,
    surface: Surface,
) -> std::io::Result<(SocketAddr, impl Task)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    match surface {
        Surface::Admin => {
            info!("admin server on http://{local} (/healthz /readyz /metrics /ruleset)")
        }
        Surface::Metrics => info!("metrics server on http://{local}/metrics"),
    }
    let name = match surface {
        Surface::Admin => "admin-server",
        Surface::Metrics => "metrics-server",
    };
    let limits = match surface {
        Surface::Admin => Limits::ADMIN,
        Surface::Metrics => Limits::METRICS,
    };
    let handler = move |req| respond(state.clone(), surface, req);
    let serve = async move {
        http::serve(name, listener, limits, limits.gate(), handler).await;
    };
    Ok((local, once(name, OnExit::Vital, serve)))
}

async fn respond(
    state: Arc<AdminState>,
    surface: Surface,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    let path = req.uri().path();
    if surface == Surface::Metrics && path != "/metrics" {
        return text(StatusCode::NOT_FOUND, "try /metrics\n".into());
    }
    match path {
        "/healthz" => match state.alive() {
            Ok(()) => text(StatusCode::OK, "ok\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("dead: {why}\n")),
        },
        "/readyz" => {
            let repairs = format!(
                "drift repairs: {}\n{}{}",
                state.drift_repairs(),
                state.leadership(),
                state.environment_warnings()
            );
            match state.ready() {
                Ok(()) => text(StatusCode::OK, format!("ready\n{repairs}")),
                Err(reason) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("degraded: {}\n{repairs}", crate::text::one_line(&reason)),
                ),
            }
        }
        "/metrics" => {
            let mut r = text(StatusCode::OK, state.metrics.encode());
            r.headers_mut().insert(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
                    .parse()
                    .expect("valid header"),
            );
            r
        }
        "/ruleset" => match state.ruleset() {
            Some(t) => text(StatusCode::OK, t),
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "# nothing applied yet\n".into(),
            ),
        },
        "/explain" => explain(state, req.uri().query().unwrap_or_default().to_string()).await,
        _ => text(
            StatusCode::NOT_FOUND,
            "try /healthz /readyz /metrics /ruleset /explain\n".into(),
        ),
    }
}

/// `/explain` on a blocking thread: a trace waits for packets for seconds.
async fn explain(state: Arc<AdminState>, query: String) -> Response<Full<Bytes>> {
    use super::ExplainRefused;
    let answer = tokio::task::spawn_blocking(move || state.explain(&query)).await;
    let refused = |code, e: &str| text(code, format!("{}\n", crate::text::one_line(e)));
    match answer {
        Ok(Ok(Some(report))) => text(StatusCode::OK, report),
        Ok(Ok(None)) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "nothing applied yet\n".into(),
        ),
        Ok(Err(ExplainRefused::Bad(e))) => refused(StatusCode::BAD_REQUEST, &e),
        Ok(Err(ExplainRefused::Busy)) => refused(
            StatusCode::CONFLICT,
            "a trace is already running; try again after it",
        ),
        Ok(Err(ExplainRefused::Failed(e))) => refused(StatusCode::INTERNAL_SERVER_ERROR, &e),
        Err(e) => refused(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}
