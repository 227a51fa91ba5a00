//! `coordination.k8s.io/v1` Leases with the API server's optimistic concurrency: create
//! (`POST`, `409 AlreadyExists` if the name is taken) and replace (`PUT`, `409 Conflict` when
//! `metadata.resourceVersion` is not the stored one). Reads and watches are the generic ones.

use hyper::{Method, Response, StatusCode};
use serde_json::Value;

use super::shared::{Body, Shared, full, status};
use super::store::{Key, Resource, key_of};

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
    let refused = match method {
        Method::POST if name.is_none() => create_refused(stored.as_ref(), &key, &mut body),
        Method::PUT if name.as_deref() == Some(key.1.as_str()) => {
            replace_refused(stored.as_ref(), &key, &body)
        }
        _ => {
            return full(
                StatusCode::METHOD_NOT_ALLOWED,
                status(405, "MethodNotAllowed", format!("{method} lease")),
            );
        }
    };
    if let Some(refused) = refused {
        return refused.respond(&mut state);
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

/// Why a write of a lease was refused.
enum Refused {
    /// `409` (counted in `lease_conflicts`), with the API server's reason and message.
    Conflict(&'static str, String),
    NotFound(String),
}

impl Refused {
    fn respond(self, state: &mut super::store::State) -> Response<Body> {
        match self {
            Refused::Conflict(reason, message) => {
                state.lease_conflicts += 1;
                full(StatusCode::CONFLICT, status(409, reason, message))
            }
            Refused::NotFound(message) => {
                full(StatusCode::NOT_FOUND, status(404, "NotFound", message))
            }
        }
    }
}

/// A create (`POST`): refused if the name is taken; the client's resourceVersion is dropped.
fn create_refused(stored: Option<&Value>, key: &Key, body: &mut Value) -> Option<Refused> {
    if stored.is_some() {
        let message = format!("leases.coordination.k8s.io \"{}\" already exists", key.1);
        return Some(Refused::Conflict("AlreadyExists", message));
    }
    body["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    None
}

/// A replace (`PUT`): refused if there is no such lease, or if the client's resourceVersion
/// is not the stored one.
fn replace_refused(stored: Option<&Value>, key: &Key, body: &Value) -> Option<Refused> {
    let Some(stored) = stored else {
        return Some(Refused::NotFound(format!(
            "lease {}/{} not found",
            key.0, key.1
        )));
    };
    let want = &body["metadata"]["resourceVersion"];
    if !want.is_null() && *want != stored["metadata"]["resourceVersion"] {
        let message = format!(
            "Operation cannot be fulfilled on leases.coordination.k8s.io \"{}\": the object \
             has been modified; please apply your changes to the latest version and try again",
            key.1
        );
        return Some(Refused::Conflict("Conflict", message));
    }
    None
}
