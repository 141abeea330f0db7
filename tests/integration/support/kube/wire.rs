//! The API server's wire format: replies and `Status` errors, watch
//! streams, request paths and their query strings, metadata-only views,
//! field selectors and JSON merge patches.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame};
use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::{NADS, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES};

pub(super) type Reply = Response<ReplyBody>;

/// A whole body, or a watch stream.
pub(super) enum ReplyBody {
    Full(Full<Bytes>),
    Stream(mpsc::UnboundedReceiver<Bytes>),
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ReplyBody::Full(f) => Pin::new(f).poll_frame(cx),
            ReplyBody::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }
}

pub(super) fn reply(status: u16, body: &Value) -> Reply {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(ReplyBody::Full(Full::new(Bytes::from(body.to_string()))))
        .expect("response")
}

/// A 200-style reply whose JSON body is already text.
pub(super) fn reply_text(status: u16, body: String) -> Reply {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(ReplyBody::Full(Full::new(Bytes::from(body))))
        .expect("response")
}

pub(super) fn status_object(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

pub(super) fn error(code: u16, reason: &str, message: &str) -> Reply {
    reply(code, &status_object(code, reason, message))
}

pub(super) fn reason_for(code: u16) -> &'static str {
    match code {
        401 => "Unauthorized",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

pub(super) fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Percent-decoding enough for field selectors (`%3D`, `%2C`, `+`).
pub(super) fn decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a request path names.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) resource: &'static str,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) status: bool,
}

/// The namespace of `/api/v1/namespaces/<ns>/events`, where core/v1
/// Events are posted.
pub(super) fn events_namespace(path: &str) -> Option<&str> {
    match path
        .trim_matches('/')
        .split('/')
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["api", "v1", "namespaces", ns, "events"] => {
            let start = path.find(ns)?;
            Some(&path[start..start + ns.len()])
        }
        _ => None,
    }
}

pub(super) fn route(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (rest, resources): (&[&str], &[&'static str]) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => (rest, &[PODS]),
        ["apis", "k8s.cni.cncf.io", "v1", rest @ ..] => (rest, &[NADS]),
        ["apis", "resource.k8s.io", "v1", rest @ ..] => (rest, &[RESOURCE_CLAIMS, RESOURCE_SLICES]),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let resource = *resources.iter().find(|r| rest.first() == Some(*r))?;
    // ResourceSlices are cluster-scoped, ResourceClaims namespaced.
    if (resource == RESOURCE_SLICES && namespace.is_some())
        || (resource == RESOURCE_CLAIMS && namespace.is_none() && rest.len() > 1)
    {
        return None;
    }
    let (name, status) = match rest {
        [_] => (None, false),
        [_, name] => (Some(name.to_string()), false),
        [_, name, "status"] if resource == PODS => (Some(name.to_string()), true),
        _ => return None,
    };
    Some(Target {
        resource,
        namespace,
        name,
        status,
    })
}

/// Whether the client asked for metadata only (PartialObjectMetadata).
pub(super) fn metadata_only(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

pub(super) fn as_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object["metadata"].clone(),
    })
}

pub(super) fn selected(object: &Value, field_selector: Option<&str>) -> bool {
    selected_by(
        |field| match field {
            "spec.nodeName" => object["spec"]["nodeName"].as_str().map(str::to_string),
            "spec.driver" => object["spec"]["driver"].as_str().map(str::to_string),
            "metadata.name" => object["metadata"]["name"].as_str().map(str::to_string),
            "metadata.namespace" => object["metadata"]["namespace"].as_str().map(str::to_string),
            _ => None,
        },
        field_selector,
    )
}

/// Whether an object whose selectable fields `value_of` gives passes the
/// field selector.
pub(super) fn selected_by(
    value_of: impl Fn(&str) -> Option<String>,
    field_selector: Option<&str>,
) -> bool {
    let Some(sel) = field_selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    sel.split(',').all(|term| {
        let (field, want, negate) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, v, false)
        } else {
            return false;
        };
        let have = value_of(field).unwrap_or_default();
        (have == want) != negate
    })
}

/// A list's `continue` token as the API server makes it: base64 (URL
/// alphabet, no padding) of `{"v":"meta.k8s.io/v1","rv":..,"start":..}`,
/// where `start` is the key after the last one listed
/// (`<namespace>/<name>\0`).
pub(super) fn continue_token(rv: u64, namespace: &str, name: &str) -> String {
    use base64::Engine;
    let inner = json!({
        "v": "meta.k8s.io/v1",
        "rv": rv,
        "start": format!("{namespace}/{name}\u{0}"),
    });
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(inner.to_string())
}

/// A `continue` token's resourceVersion and where the page starts
/// (namespace, name: the first key not below it).
pub(super) fn parse_continue(token: &str) -> Option<(u64, (String, String))> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    if v["v"] != "meta.k8s.io/v1" {
        return None;
    }
    let rv = v["rv"].as_u64()?;
    let (namespace, name) = v["start"].as_str()?.split_once('/')?;
    Some((rv, (namespace.to_string(), name.to_string())))
}

/// RFC 7386 JSON merge patch.
pub(super) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

pub(super) fn stream_reply(rx: mpsc::UnboundedReceiver<Bytes>) -> Reply {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(ReplyBody::Stream(rx))
        .expect("response")
}
