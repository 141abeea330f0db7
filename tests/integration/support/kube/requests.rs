//! Answering one request of the fake API server: lists, gets, patches and
//! watches, with the failures and stalls a test asked for.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use super::wire::{
    as_metadata, decode, error, merge_patch, metadata_only, query_param, reason_for, reply, route,
    selected, status_object, stream_reply, Reply, Target,
};
use super::{kind_of, Event, Logged, State, WatchMsg, PODS};

pub(super) async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    mut stalled: watch::Receiver<bool>,
) -> Result<Reply, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let content_type = header("content-type");
    let accept = header("accept");
    let authorization = header("authorization");
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes().to_vec(),
        Err(_) => return Ok(error(400, "BadRequest", "cannot read the body")),
    };
    let logged = Logged {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        accept: accept.clone(),
        body: body.clone(),
        at: std::time::Instant::now(),
    };
    let is_watch = logged.is_watch();
    let is_list =
        method == Method::GET && !is_watch && route(&path).is_some_and(|t| t.name.is_none());
    let (injected, list_delay, authorized) = {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.log.push(logged);
        let authorized = s
            .required_token
            .as_ref()
            .is_none_or(|t| authorization.as_deref() == Some(format!("Bearer {t}").as_str()));
        (s.injected(&path), s.list_delay, authorized)
    };
    if !authorized {
        return Ok(error(401, "Unauthorized", "Unauthorized"));
    }
    if is_list && !list_delay.is_zero() {
        tokio::time::sleep(list_delay).await;
    }
    // A stalled server answers nothing until released (or the client
    // gives up and closes).
    while *stalled.borrow_and_update() {
        if stalled.changed().await.is_err() {
            break;
        }
    }
    if let Some(code) = injected {
        return Ok(error(code, reason_for(code), "injected failure"));
    }
    let Some(target) = route(&path) else {
        return Ok(error(
            404,
            "NotFound",
            &format!("the server could not find the requested resource ({path})"),
        ));
    };
    let meta = metadata_only(accept.as_deref());
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    match (method, target.name.clone()) {
        (Method::GET, Some(name)) => {
            let ns = target.namespace.clone().unwrap_or_default();
            match s.objects.get(&(target.resource, ns, name.clone())) {
                Some(o) => {
                    let o = if meta {
                        as_metadata(o)
                    } else {
                        s.full(target.resource, o)
                    };
                    Ok(reply(200, &o))
                }
                None => Ok(error(
                    404,
                    "NotFound",
                    &format!("{} \"{name}\" not found", target.resource),
                )),
            }
        }
        (Method::GET, None) if is_watch => Ok(start_watch(&mut s, &target, &query, meta)),
        (Method::GET, None) => {
            let field_selector = query_param(&query, "fieldSelector").map(decode);
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|((r, ns, _), _)| {
                    *r == target.resource && target.namespace.as_ref().is_none_or(|want| want == ns)
                })
                .map(|(_, o)| o)
                .filter(|o| selected(o, field_selector.as_deref()))
                .map(|o| if meta { as_metadata(o) } else { o.clone() })
                .collect();
            let (kind, api_version) = kind_of(target.resource);
            let (kind, api_version) = if meta {
                ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1")
            } else {
                (format!("{kind}List"), api_version)
            };
            Ok(reply(
                200,
                &json!({
                    "kind": kind,
                    "apiVersion": api_version,
                    "metadata": {"resourceVersion": s.rv.to_string()},
                    "items": items,
                }),
            ))
        }
        (Method::PATCH, Some(name)) if target.status => {
            let ns = target.namespace.clone().unwrap_or_default();
            let ct = content_type.unwrap_or_default();
            if !ct.starts_with("application/merge-patch+json")
                && !ct.starts_with("application/strategic-merge-patch+json")
            {
                return Ok(error(
                    415,
                    "UnsupportedMediaType",
                    &format!("the body of the request was in an unknown format: {ct}"),
                ));
            }
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return Ok(error(400, "BadRequest", "the patch is not JSON"));
            };
            let key = (PODS, ns.clone(), name.clone());
            let Some(mut pod) = s.objects.get(&key).cloned() else {
                return Ok(error(
                    404,
                    "NotFound",
                    &format!("pods \"{name}\" not found"),
                ));
            };
            // uid is immutable: a patch naming another uid is invalid
            // (what guards a write against a pod recreated under the name).
            if let Some(uid) = patch["metadata"]["uid"].as_str() {
                if pod["metadata"]["uid"].as_str() != Some(uid) {
                    return Ok(error(
                        422,
                        "Invalid",
                        &format!(
                            "Pod \"{name}\" is invalid: metadata.uid: Invalid value: \"{uid}\": field is immutable"
                        ),
                    ));
                }
            }
            merge_patch(&mut pod, &patch);
            s.put(PODS, &ns, &name, pod);
            let stored = s.objects.get(&key).cloned().unwrap_or_default();
            Ok(reply(200, &s.full(PODS, &stored)))
        }
        _ => Ok(error(
            405,
            "MethodNotAllowed",
            "not supported by this server",
        )),
    }
}

fn start_watch(s: &mut State, target: &Target, query: &str, meta: bool) -> Reply {
    let from: u64 = query_param(query, "resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(s.rv);
    let bookmarks = query_param(query, "allowWatchBookmarks") == Some("true");
    let field_selector = query_param(query, "fieldSelector").map(decode);
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let resource = target.resource;
    let namespace = target.namespace.clone();
    let line = move |kind: &str, object: Value| {
        let mut l = json!({"type": kind, "object": object}).to_string();
        l.push('\n');
        Bytes::from(l)
    };
    let expired = move |from: u64, oldest: u64| {
        line(
            "ERROR",
            status_object(
                410,
                "Expired",
                &format!("too old resource version: {from} ({oldest})"),
            ),
        )
    };
    if from + 1 < s.oldest_rv && from != 0 {
        let _ = tx.send(expired(from, s.oldest_rv));
        return stream_reply(rx);
    }
    let wanted = {
        let namespace = namespace.clone();
        let field_selector = field_selector.clone();
        move |e: &Event| {
            e.resource == resource
                && namespace
                    .as_ref()
                    .is_none_or(|ns| e.object["metadata"]["namespace"].as_str() == Some(ns))
                && selected(&e.object, field_selector.as_deref())
        }
    };
    let shape = move |e: &Event| {
        let (kind, api_version) = kind_of(e.resource);
        if meta {
            as_metadata(&e.object)
        } else {
            let mut o = e.object.clone();
            o["kind"] = json!(kind);
            o["apiVersion"] = json!(api_version);
            o
        }
    };
    // History after `from`, but none of what is held, then live events
    // (the held ones once released).
    let held_from = s.held.as_ref().and_then(|h| h.first()).map(|e| e.rv);
    let history = |e: &&Event| e.rv > from && held_from.is_none_or(|h| e.rv < h);
    for e in s.events.iter().filter(history).filter(|e| wanted(e)) {
        let _ = tx.send(line(e.kind, shape(e)));
    }
    let (wtx, mut wrx) = mpsc::unbounded_channel::<WatchMsg>();
    s.watchers.push(wtx);
    let rv_now = held_from.map_or(s.rv, |h| h - 1);
    tokio::spawn(async move {
        let mut last_rv = rv_now.max(from);
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let msg = match deadline {
                Some(d) => match tokio::time::timeout_at(d, wrx.recv()).await {
                    Ok(m) => m,
                    Err(_) => return,
                },
                None => wrx.recv().await,
            };
            let Some(msg) = msg else { return };
            let sent = match msg {
                WatchMsg::Event(e) => {
                    last_rv = last_rv.max(e.rv);
                    if !wanted(&e) {
                        continue;
                    }
                    tx.send(line(e.kind, shape(&e)))
                }
                WatchMsg::Bookmark if bookmarks => {
                    let (kind, api_version) = kind_of(resource);
                    let (kind, api_version) = if meta {
                        ("PartialObjectMetadata", "meta.k8s.io/v1")
                    } else {
                        (kind, api_version)
                    };
                    tx.send(line(
                        "BOOKMARK",
                        json!({
                            "kind": kind,
                            "apiVersion": api_version,
                            "metadata": {"resourceVersion": last_rv.to_string()},
                        }),
                    ))
                }
                WatchMsg::Bookmark => continue,
                WatchMsg::Expire => {
                    let _ = tx.send(expired(last_rv, last_rv + 1));
                    return;
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
    stream_reply(rx)
}
