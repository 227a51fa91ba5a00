//! `coordination.k8s.io/v1` Leases with the API server's optimistic concurrency: create
//! (`POST`, `409 AlreadyExists` if the name is taken) and replace (`PUT`, `409 Conflict` when
//! `metadata.resourceVersion` is not the stored one). Reads and watches are the generic ones.

use hyper::{Method, Response, StatusCode};
use serde_json::Value;

use super::shared::{Body, Shared, full, status};
use super::store::{Resource, key_of};

/// Handles a write to `leases`; the caller has recorded it.
pub fn write(
    shared: &Shared,
    method: Method,
    namespace: Option<String>,
    name: Option<String>,
    mut body: Value,
) -> Response<Body> {
    let resource = Resource::by_kind("Lease");
    let namespace = namespace.unwrap_or_else(|| "default".into());
    if body["metadata"]["namespace"].is_null() {
        body["metadata"]["namespace"] = Value::String(namespace.clone());
    }
    body["apiVersion"] = Value::String("coordination.k8s.io/v1".into());
    body["kind"] = Value::String("Lease".into());
    let key = key_of(resource, &body);
    let mut state = shared.state();
    let stored = state
        .objects
        .get(&resource)
        .and_then(|m| m.get(&key))
        .cloned();
    let reject = |state: &mut super::store::State, code: u16, reason: &str, message: String| {
        state.lease_conflicts += 1;
        let status_code = StatusCode::from_u16(code).expect("status code");
        full(status_code, status(code, reason, message))
    };
    match method {
        Method::POST if name.is_none() => {
            if stored.is_some() {
                return reject(
                    &mut state,
                    409,
                    "AlreadyExists",
                    format!("leases.coordination.k8s.io \"{}\" already exists", key.1),
                );
            }
            body["metadata"]
                .as_object_mut()
                .map(|m| m.remove("resourceVersion"));
        }
        Method::PUT if name.as_deref() == Some(key.1.as_str()) => {
            let Some(stored) = stored else {
                return full(
                    StatusCode::NOT_FOUND,
                    status(
                        404,
                        "NotFound",
                        format!("lease {}/{} not found", key.0, key.1),
                    ),
                );
            };
            let want = &body["metadata"]["resourceVersion"];
            if !want.is_null() && *want != stored["metadata"]["resourceVersion"] {
                return reject(
                    &mut state,
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on leases.coordination.k8s.io \"{}\": \
                         the object has been modified; please apply your changes to the \
                         latest version and try again",
                        key.1
                    ),
                );
            }
        }
        _ => {
            return full(
                StatusCode::METHOD_NOT_ALLOWED,
                status(405, "MethodNotAllowed", format!("{method} lease")),
            );
        }
    }
    let created = method == Method::POST;
    let ev = state.put(body);
    drop(state);
    let obj = ev.object.clone();
    shared.publish(ev);
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    full(code, obj)
}
