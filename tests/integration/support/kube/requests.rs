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

use super::authn::Identity;
use super::wire::{
    as_metadata, continue_token, decode, error, events_namespace, merge_patch, metadata_only,
    parse_continue, query_param, reason_for, reply, reply_text, route, selected, selected_by,
    status_object, stream_reply, Reply, Target,
};
use super::{kind_of, Counters, Event, Logged, State, TrafficCounters, WatchMsg, PODS};

pub(super) async fn handle(
    req: Request<Incoming>,
    state: Arc<Mutex<State>>,
    stalled: watch::Receiver<bool>,
    peer: Option<Arc<Identity>>,
) -> Result<Reply, Infallible> {
    let mut logged_at = None;
    let answer = answer(req, &state, stalled, peer.as_deref(), &mut logged_at).await;
    if let Some(i) = logged_at {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = s.log.get_mut(i) {
            r.answered = Some(std::time::Instant::now());
        }
    }
    answer
}

/// The answer to `req`; `logged_at` is set to the request's place in the
/// log.
async fn answer(
    req: Request<Incoming>,
    state: &Mutex<State>,
    mut stalled: watch::Receiver<bool>,
    peer: Option<&Identity>,
    logged_at: &mut Option<usize>,
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
        answered: None,
    };
    let is_watch = logged.is_watch();
    let is_list =
        method == Method::GET && !is_watch && route(&path).is_some_and(|t| t.name.is_none());
    let (injected, list_delay, access) = {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.log.push(logged);
        *logged_at = Some(s.log.len() - 1);
        let access = match s.authn.authenticate(peer, authorization.as_deref()) {
            Err(()) => Err(error(401, "Unauthorized", "Unauthorized")),
            Ok(identity) => s
                .authz
                .authorize(&s, identity.as_ref(), method.as_str(), &path, &query)
                .map_err(|refused| refused.reply()),
        };
        (s.injected(&path), s.list_delay, access)
    };
    if let Err(refused) = access {
        return Ok(refused);
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
    if method == Method::POST {
        if let Some(ns) = events_namespace(&path) {
            return Ok(post_event(state, ns, content_type.as_deref(), &body));
        }
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
            match s.get(target.resource, &ns, &name) {
                Some(o) => {
                    let o = if meta {
                        as_metadata(&o)
                    } else {
                        s.full(target.resource, &o)
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
        (Method::GET, None) => Ok(list(&s, &target, &query, meta)),
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
            let Some(mut pod) = s.get(PODS, &ns, &name) else {
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

/// A core/v1 Event created as the API server creates it: the namespace of
/// the path, a uid, a resourceVersion and a creation time added; 201.
fn post_event(state: &Mutex<State>, ns: &str, content_type: Option<&str>, body: &[u8]) -> Reply {
    if !content_type.is_some_and(|ct| ct.starts_with("application/json")) {
        return error(415, "UnsupportedMediaType", "events are taken as JSON only");
    }
    let Ok(mut event) = serde_json::from_slice::<Value>(body) else {
        return error(400, "BadRequest", "the event is not JSON");
    };
    if event["kind"] != "Event" || event["apiVersion"] != "v1" {
        return error(400, "BadRequest", "not a v1 Event");
    }
    if event["metadata"]["namespace"]
        .as_str()
        .is_some_and(|n| n != ns)
    {
        return error(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        );
    }
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    s.rv += 1;
    let rv = s.rv;
    event["metadata"]["namespace"] = ns.into();
    event["metadata"]["uid"] = format!("event-uid-{rv}").into();
    event["metadata"]["resourceVersion"] = rv.to_string().into();
    event["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z".into();
    s.pod_events.push(event.clone());
    reply(201, &event)
}

/// Where a listed object comes from.
enum Item<'a> {
    Stored(&'a Value),
    MadeUp(usize),
}

/// A list (one page of it with `limit`), as JSON text: the stored objects
/// and the made-up ones merged in the API server's order (namespace,
/// name), from where the `continue` token says.
fn list(s: &State, target: &Target, query: &str, meta: bool) -> Reply {
    let resource = target.resource;
    let field_selector = query_param(query, "fieldSelector").map(decode);
    let limit = query_param(query, "limit")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let (rv, start) = match query_param(query, "continue").map(decode) {
        None => (s.rv, (String::new(), String::new())),
        Some(token) if token.is_empty() => (s.rv, (String::new(), String::new())),
        Some(token) => match parse_continue(&token) {
            Some((rv, _)) if rv < s.oldest_rv => {
                return error(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list \
                     result. You can start a new list without the continue parameter.",
                )
            }
            Some(found) => found,
            None => return error(400, "BadRequest", "invalid continue token"),
        },
    };
    let start = match &target.namespace {
        Some(ns) if *ns > start.0 => (ns.clone(), String::new()),
        _ => start,
    };
    let in_namespace = |ns: &str| target.namespace.as_deref().is_none_or(|want| want == ns);
    let mut stored = s
        .objects
        .range((resource, start.0.clone(), start.1.clone())..)
        .take_while(|((r, ns, _), _)| *r == resource && in_namespace(ns))
        .map(|((_, ns, name), o)| ((ns.as_str(), name.as_str()), o))
        .peekable();
    let bulk = s.bulk.as_ref();
    let count = bulk.map_or(0, |b| b.count(resource));
    let mut next_made_up = bulk.map_or(0, |b| b.lower_bound(resource, &start.0, &start.1));
    let made_up_key = |i: &mut usize| -> Option<(String, String)> {
        let b = bulk?;
        while *i < count {
            let key = b.key(resource, *i);
            if !in_namespace(&key.0) {
                return None;
            }
            if !s
                .overridden
                .contains(&(resource, key.0.clone(), key.1.clone()))
            {
                return Some(key);
            }
            *i += 1;
        }
        None
    };
    let mut items: Vec<String> = Vec::new();
    let mut last: Option<(String, String)> = None;
    let mut more = false;
    loop {
        let made_up = made_up_key(&mut next_made_up);
        let (key, item) = match (stored.peek(), made_up) {
            (None, None) => break,
            (Some((k, o)), m)
                if m.as_ref()
                    .is_none_or(|m| *k <= (m.0.as_str(), m.1.as_str())) =>
            {
                let k = (k.0.to_string(), k.1.to_string());
                let item = Item::Stored(o);
                stored.next();
                (k, item)
            }
            (_, Some(m)) => {
                let item = Item::MadeUp(next_made_up);
                next_made_up += 1;
                (m, item)
            }
            (_, None) => break,
        };
        if limit.is_some_and(|l| items.len() >= l) {
            more = true;
            break;
        }
        let wanted = match &item {
            Item::Stored(o) => selected(o, field_selector.as_deref()),
            Item::MadeUp(i) => bulk.is_some_and(|b| {
                let f = b.fields(resource, *i);
                selected_by(
                    |field| match field {
                        "metadata.name" => Some(f.name.clone()),
                        "metadata.namespace" => Some(f.namespace.clone()),
                        "spec.nodeName" => f.node.clone(),
                        _ => None,
                    },
                    field_selector.as_deref(),
                )
            }),
        };
        if wanted {
            items.push(match item {
                Item::Stored(o) if meta => as_metadata(o).to_string(),
                Item::Stored(o) => o.to_string(),
                Item::MadeUp(i) => bulk
                    .map(|b| b.render(resource, i, meta))
                    .unwrap_or_default(),
            });
        }
        last = Some(key);
    }
    let (kind, api_version) = kind_of(resource);
    let (kind, api_version) = if meta {
        ("PartialObjectMetadataList".to_string(), "meta.k8s.io/v1")
    } else {
        (format!("{kind}List"), api_version)
    };
    let continued = match (more, &last) {
        (true, Some((ns, name))) => format!(r#","continue":"{}""#, continue_token(rv, ns, name)),
        _ => String::new(),
    };
    let size: usize = items.iter().map(|i| i.len() + 1).sum();
    let mut body = String::with_capacity(size + 200);
    body.push_str(&format!(
        r#"{{"kind":"{kind}","apiVersion":"{api_version}","metadata":{{"resourceVersion":"{rv}"{continued}}},"items":["#
    ));
    for (n, i) in items.iter().enumerate() {
        if n > 0 {
            body.push(',');
        }
        body.push_str(i);
    }
    body.push_str("]}");
    let c = s.traffic.of(resource);
    Counters::add(&c.lists, 1);
    Counters::add(&c.list_items, items.len());
    Counters::add(&c.list_bytes, body.len());
    reply_text(200, body)
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
    let tx = WatchOut {
        tx,
        traffic: s.traffic.clone(),
        resource,
    };
    Counters::add(&s.traffic.of(resource).watches, 1);
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
        let _ = tx.send(expired(from, s.oldest_rv), false);
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
        let _ = tx.send(line(e.kind, shape(e)), false);
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
                    tx.send(line(e.kind, shape(&e)), false)
                }
                WatchMsg::Bookmark if bookmarks => {
                    let (kind, api_version) = kind_of(resource);
                    let (kind, api_version) = if meta {
                        ("PartialObjectMetadata", "meta.k8s.io/v1")
                    } else {
                        (kind, api_version)
                    };
                    tx.send(
                        line(
                            "BOOKMARK",
                            json!({
                                "kind": kind,
                                "apiVersion": api_version,
                                "metadata": {"resourceVersion": last_rv.to_string()},
                            }),
                        ),
                        true,
                    )
                }
                WatchMsg::Bookmark => continue,
                WatchMsg::Expire => {
                    let _ = tx.send(expired(last_rv, last_rv + 1), false);
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

/// A watch stream's sending end, counting what it sends.
struct WatchOut {
    tx: mpsc::UnboundedSender<Bytes>,
    traffic: Arc<TrafficCounters>,
    resource: &'static str,
}

impl WatchOut {
    fn send(&self, line: Bytes, bookmark: bool) -> Result<(), ()> {
        let c = self.traffic.of(self.resource);
        let n = line.len();
        self.tx.send(line).map_err(|_| ())?;
        Counters::add(&c.watch_bytes, n);
        Counters::add(
            if bookmark {
                &c.watch_bookmarks
            } else {
                &c.watch_events
            },
            1,
        );
        Ok(())
    }
}
