//! A small Kubernetes API server for tests: pods,
//! NetworkAttachmentDefinitions, ResourceClaims and ResourceSlices, served
//! in the real wire format.
//!
//! What it speaks, as the real API server does:
//! - lists with `metadata.resourceVersion`, full objects or, when the
//!   client asks with `Accept: application/json;as=PartialObjectMetadataList;
//!   g=meta.k8s.io;v=v1`, metadata only;
//! - pages: `limit=N` answers at most N items and, when more remain,
//!   `metadata.continue`, an opaque token (base64 of the API server's
//!   `{"v":"meta.k8s.io/v1","rv":..,"start":..}`) that the next request
//!   passes as `continue`; every page carries the first page's
//!   resourceVersion, and a token older than the kept history is 410
//!   `Expired`. Unlike etcd, a later page shows the objects as they are
//!   now, not as they were at the first page: changes in between reach
//!   the client again through its watch from that resourceVersion;
//! - `fieldSelector=spec.nodeName=<node>` and `metadata.name=<name>` on pods,
//!   `spec.nodeName` and `spec.driver` on ResourceSlices;
//! - watches (`watch=true`, `resourceVersion`, `allowWatchBookmarks`,
//!   `timeoutSeconds`) as a chunked stream of `{"type":..,"object":..}`
//!   lines, with `BOOKMARK` events and, for a resourceVersion older than the
//!   oldest event kept, an `ERROR` event carrying a 410 `Expired` Status;
//! - GET of one object, 404 as a `NotFound` Status;
//! - JSON merge patch and strategic merge patch (for metadata the same) of
//!   `pods/<name>/status`, answering the patched pod; a patch changing
//!   `metadata.uid` is 422 Invalid (the field is immutable);
//! - errors as `Status` objects.
//!
//! Tests steer it: add, change and delete objects; fill it with a large
//! cluster made up on demand ([`BulkSpec`]: 100,000 objects cost a few
//! integers); count what it sent ([`FakeApi::nad_traffic`]); fail the next requests
//! with a status; stall requests; expire watches; go down (connections
//! refused) and come back on the same port; and read the log of requests
//! to count API calls.
//!
//! Here: the server, its state and the steering; `requests`: answering one
//! request; `wire`: the wire format's pieces; `bulk`: the made-up cluster;
//! `dra`: ResourceClaims and ResourceSlices (resource.k8s.io/v1).

use std::collections::{BTreeMap, HashSet};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

mod authn;
mod authz;
mod bulk;
mod dra;
mod requests;
mod tls;
mod wire;

pub use authn::Identity;
pub use authz::{cluster_role_bindings_in, cluster_roles_in, Authorization, ClusterRole, Subject};
use bulk::Bulk;
pub use bulk::{BulkConfigs, BulkSpec};
pub use dra::SliceDevice;

use requests::handle;

use wire::query_param;

/// The node the tests' daemons serve.
pub const NODE: &str = "node-1";
/// The pod annotation plexusd writes after an ADD.
pub const NETWORK_STATUS: &str = plexus::k8s::NETWORK_STATUS_ANNOTATION;

/// `CNI_ARGS` as a Kubernetes runtime sends them for pod `ns/name`.
pub fn pod_args(ns: &str, name: &str, uid: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID={uid}"
    )
}

/// Pods: core group.
const PODS: &str = "pods";
/// NetworkAttachmentDefinitions: k8s.cni.cncf.io/v1.
const NADS: &str = "network-attachment-definitions";
/// ResourceClaims (namespaced) and ResourceSlices (cluster-scoped):
/// resource.k8s.io/v1.
const RESOURCE_CLAIMS: &str = "resourceclaims";
const RESOURCE_SLICES: &str = "resourceslices";
/// Events kept for watches; older resourceVersions get 410 Gone.
const HISTORY: usize = 1000;

/// One request the server received. Its `Debug` (in failure messages)
/// shows the body as text and how long ago the request arrived.
#[derive(Clone)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: Option<String>,
    pub accept: Option<String>,
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: std::time::Instant,
    /// When its answer (a whole body, or a watch's headers) was ready.
    pub answered: Option<std::time::Instant>,
}

impl Logged {
    pub fn is_watch(&self) -> bool {
        query_param(&self.query, "watch").is_some_and(|v| v == "true" || v == "1")
    }

    /// A POST of a core/v1 Event.
    pub fn is_event_post(&self) -> bool {
        self.method == "POST" && wire::events_namespace(&self.path).is_some()
    }
}

impl std::fmt::Debug for Logged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logged")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("query", &self.query)
            .field("content_type", &self.content_type)
            .field("accept", &self.accept)
            .field("body", &String::from_utf8_lossy(&self.body))
            .field("age", &self.at.elapsed())
            .finish()
    }
}

/// What the server sent for one resource: lists (pages) and watches.
#[derive(Debug, Default)]
struct Counters {
    lists: AtomicU64,
    list_items: AtomicU64,
    list_bytes: AtomicU64,
    watches: AtomicU64,
    /// ADDED, MODIFIED, DELETED and ERROR lines (not BOOKMARKs).
    watch_events: AtomicU64,
    watch_bookmarks: AtomicU64,
    /// Every line of every watch stream, bookmarks included.
    watch_bytes: AtomicU64,
}

/// A reading of [`Counters`]: bodies' bytes as sent, before any chunked
/// framing or TCP.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// List requests answered 200 (each page counts).
    pub lists: u64,
    pub list_items: u64,
    pub list_bytes: u64,
    /// Watches opened.
    pub watches: u64,
    pub watch_events: u64,
    pub watch_bookmarks: u64,
    pub watch_bytes: u64,
}

impl Counters {
    fn read(&self) -> Traffic {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Traffic {
            lists: r(&self.lists),
            list_items: r(&self.list_items),
            list_bytes: r(&self.list_bytes),
            watches: r(&self.watches),
            watch_events: r(&self.watch_events),
            watch_bookmarks: r(&self.watch_bookmarks),
            watch_bytes: r(&self.watch_bytes),
        }
    }

    fn add(a: &AtomicU64, n: usize) {
        a.fetch_add(n as u64, Ordering::Relaxed);
    }
}

impl std::ops::Sub for Traffic {
    type Output = Traffic;

    fn sub(self, o: Traffic) -> Traffic {
        Traffic {
            lists: self.lists - o.lists,
            list_items: self.list_items - o.list_items,
            list_bytes: self.list_bytes - o.list_bytes,
            watches: self.watches - o.watches,
            watch_events: self.watch_events - o.watch_events,
            watch_bookmarks: self.watch_bookmarks - o.watch_bookmarks,
            watch_bytes: self.watch_bytes - o.watch_bytes,
        }
    }
}

/// Both resources' counters, shared with the watch streams' tasks.
#[derive(Debug, Default)]
struct TrafficCounters {
    pods: Counters,
    nads: Counters,
    /// Every other resource.
    other: Counters,
}

impl TrafficCounters {
    fn of(&self, resource: &str) -> &Counters {
        match resource {
            PODS => &self.pods,
            NADS => &self.nads,
            _ => &self.other,
        }
    }
}

/// A failure a test asks for.
#[derive(Debug, Clone)]
struct Injected {
    /// Requests whose path contains this fail.
    path_contains: String,
    status: u16,
    remaining: usize,
}

#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    resource: &'static str,
    kind: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct State {
    rv: u64,
    /// (resource, namespace, name) -> object.
    objects: BTreeMap<(&'static str, String, String), Value>,
    events: Vec<Event>,
    /// Events before this resourceVersion are gone (410 for watches).
    oldest_rv: u64,
    log: Vec<Logged>,
    injected: Vec<Injected>,
    /// Open watches, told about each new event.
    watchers: Vec<mpsc::UnboundedSender<WatchMsg>>,
    /// Some(events not yet sent to open watches) while watches are held.
    held: Option<Vec<Event>>,
    /// How long each list (a GET of a collection, not a watch) is held
    /// back before it is answered.
    list_delay: Duration,
    /// Who is calling (401 Unauthorized when nobody).
    authn: authn::Authn,
    /// What each caller may do (403 Forbidden otherwise).
    authz: authz::Authz,
    /// Objects made up on demand, under those in `objects`.
    bulk: Option<Bulk>,
    /// Made-up objects changed or deleted since: `objects` holds what is
    /// left of them.
    overridden: HashSet<(&'static str, String, String)>,
    traffic: Arc<TrafficCounters>,
    /// Event objects (core/v1) posted by clients.
    pod_events: Vec<Value>,
}

#[derive(Debug)]
enum WatchMsg {
    Event(Event),
    Bookmark,
    Expire,
}

/// The fake API server; stops on drop.
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    addr: SocketAddr,
    /// true: accepting connections; false: down (connections refused).
    up: watch::Sender<bool>,
    /// true: requests stall until set back to false.
    stalled: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Some: HTTPS, with this CA.
    pki: Option<Arc<tls::Pki>>,
}

/// How a kubeconfig for the HTTPS server authenticates (see
/// [`FakeApi::write_tls_kubeconfig`]).
#[derive(Debug, Clone, Copy)]
pub enum KubeAuth<'a> {
    /// `client-certificate` and `client-key` files (may be one file, as
    /// kubelet's `kubelet-client-current.pem`).
    ClientCert { cert: &'a Path, key: &'a Path },
    /// A `tokenFile`.
    TokenFile(&'a Path),
}

impl FakeApi {
    /// Serves plain HTTP.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Serves HTTPS with a CA of its own: a client certificate is
    /// optional at the TLS layer (tokens still work) and must be one the
    /// CA signed ([`FakeApi::issue_client_cert`]).
    pub fn start_tls() -> Self {
        Self::start_with(Some(Arc::new(tls::Pki::new())))
    }

    fn start_with(pki: Option<Arc<tls::Pki>>) -> Self {
        let std_listener = StdListener::bind("127.0.0.1:0").expect("bind the fake API server");
        let addr = std_listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State {
            rv: 100,
            oldest_rv: 100,
            ..State::default()
        }));
        let (up, up_rx) = watch::channel(true);
        let (stalled, stalled_rx) = watch::channel(false);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let thread = {
            let state = state.clone();
            let acceptor = pki.as_ref().map(|p| p.acceptor());
            std::thread::Builder::new()
                .name("fake-kube-api".into())
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    rt.block_on(serve(
                        std_listener,
                        addr,
                        acceptor,
                        state,
                        up_rx,
                        stalled_rx,
                        shutdown_rx,
                    ));
                })
                .expect("spawn the fake API server")
        };
        Self {
            state,
            addr,
            up,
            stalled,
            shutdown,
            thread: Some(thread),
            pki,
        }
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn url(&self) -> String {
        match self.pki {
            Some(_) => format!("https://{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    fn pki(&self) -> &tls::Pki {
        self.pki
            .as_deref()
            .expect("a fake API server started with start_tls")
    }

    /// The CA's certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.pki().ca_pem().to_string()
    }

    /// A client certificate signed by the server's CA for `identity`
    /// (user = CN, groups = O) and its key, PEM; the server takes it from
    /// now on until [`FakeApi::revoke_client_cert`].
    pub fn issue_client_cert(&self, identity: Identity) -> (String, String) {
        let (cert, key) = self.pki().issue(&identity);
        self.lock().authn.certs.insert(tls::der_of(&cert), identity);
        (cert, key)
    }

    /// Every request presenting `cert_pem` gets 401 Unauthorized from now
    /// on, also on connections opened before (the API server checks a
    /// certificate's validity on each request).
    pub fn revoke_client_cert(&self, cert_pem: &str) {
        let der = tls::der_of(cert_pem);
        let mut s = self.lock();
        s.authn.certs.remove(&der);
        s.authn.revoked_certs.insert(der);
    }

    /// A kubeconfig naming this HTTPS server, trusting its CA (written to
    /// `<path>-ca.crt`), user `node` authenticated by `auth`.
    pub fn write_tls_kubeconfig(&self, path: &Path, auth: KubeAuth<'_>) {
        let ca = path.with_file_name(format!(
            "{}-ca.crt",
            path.file_name().expect("a file name").to_string_lossy()
        ));
        std::fs::write(&ca, self.ca_pem()).expect("write the CA certificate");
        let user = match auth {
            KubeAuth::ClientCert { cert, key } => format!(
                "    client-certificate: {}\n    client-key: {}\n",
                cert.display(),
                key.display()
            ),
            KubeAuth::TokenFile(file) => format!("    tokenFile: {}\n", file.display()),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             \x20   certificate-authority: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: node\n\
             current-context: fake\nusers:\n- name: node\n  user:\n{user}",
            self.url(),
            ca.display()
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// A kubeconfig naming this server (plain HTTP, a bearer token).
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: node\n\
             current-context: fake\nusers:\n- name: node\n  user:\n    token: test-token\n",
            self.url()
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// Points a daemon config at this server: writes `<dir>/kubeconfig`
    /// and sets `kubeconfig`, `nodeName` ([`NODE`]) and
    /// `kubernetesRequestTimeout`.
    pub fn configure(
        &self,
        dir: &super::daemon::TestDir,
        config: &mut Value,
        request_timeout: &str,
    ) {
        let kubeconfig = dir.join("kubeconfig");
        self.write_kubeconfig(&kubeconfig);
        config["kubeconfig"] = json!(kubeconfig);
        config["nodeName"] = json!(NODE);
        config["kubernetesRequestTimeout"] = json!(request_timeout);
    }

    /// Starts plexusd (config `<dir>/d.json`) on `config` pointed at this
    /// server by [`FakeApi::configure`], and waits until it is ready.
    pub fn start_daemon(
        &self,
        dir: &super::daemon::TestDir,
        mut config: Value,
        request_timeout: &str,
    ) -> super::daemon::Daemon {
        self.configure(dir, &mut config, request_timeout);
        let mut daemon = super::daemon::Daemon::start(dir, "d", config);
        daemon.ready();
        daemon
    }

    /// The pod's network-status annotation, if it has one.
    pub fn network_status(&self, namespace: &str, name: &str) -> Option<String> {
        self.pod(namespace, name)?["metadata"]["annotations"][NETWORK_STATUS]
            .as_str()
            .map(str::to_string)
    }

    /// The network names in the pod's network-status annotation, in
    /// order; empty without one.
    pub fn network_status_names(&self, namespace: &str, name: &str) -> Vec<String> {
        let Some(text) = self.network_status(namespace, name) else {
            return Vec::new();
        };
        let status: Value = serde_json::from_str(&text).expect("network-status is JSON");
        status
            .as_array()
            .expect("network-status is a list")
            .iter()
            .map(|e| e["name"].as_str().expect("a name").to_string())
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds or replaces a pod; `annotations` as given.
    pub fn put_pod(&self, namespace: &str, name: &str, uid: &str, node: &str, annotations: Value) {
        let pod = json!({
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "annotations": annotations,
                "labels": {"app": name},
            },
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending"},
        });
        self.lock().put(PODS, namespace, name, pod);
    }

    /// Adds or replaces a NetworkAttachmentDefinition. `config` is the
    /// `spec.config` string (None: no spec at all).
    pub fn put_nad(&self, namespace: &str, name: &str, config: Option<&str>, annotations: Value) {
        let mut nad = json!({
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": format!("nad-{namespace}-{name}"),
                "annotations": annotations,
            },
        });
        if let Some(c) = config {
            nad["spec"] = json!({ "config": c });
        }
        self.lock().put(NADS, namespace, name, nad);
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        self.lock().delete(PODS, namespace, name)
    }

    pub fn delete_nad(&self, namespace: &str, name: &str) -> bool {
        self.lock().delete(NADS, namespace, name)
    }

    /// The stored pod, as a GET would return it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        let s = self.lock();
        s.get(PODS, namespace, name).map(|o| s.full(PODS, &o))
    }

    /// Adds a large cluster made up on demand (see [`BulkSpec`]), all at
    /// one new resourceVersion; objects put, changed or deleted by name
    /// later take precedence. Replaces an earlier fill.
    pub fn fill(&self, spec: BulkSpec) {
        let mut s = self.lock();
        let rv = s.next_rv();
        s.bulk = Some(Bulk::new(spec, rv));
        s.overridden.clear();
    }

    /// What the server sent of the NetworkAttachmentDefinitions so far.
    pub fn nad_traffic(&self) -> Traffic {
        self.lock().traffic.nads.read()
    }

    /// What the server sent of the pods so far.
    pub fn pod_traffic(&self) -> Traffic {
        self.lock().traffic.pods.read()
    }

    /// When the server first answered a request.
    pub fn first_answer(&self) -> Option<std::time::Instant> {
        self.lock().log.iter().filter_map(|r| r.answered).min()
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// Requests that are neither watches nor list/watch of the caches:
    /// what a single CNI call costs, without the pod events it posts in
    /// the background (see [`FakeApi::pod_events`]).
    pub fn calls_since(&self, mark: usize) -> Vec<Logged> {
        self.lock().log[mark..]
            .iter()
            .filter(|r| !r.is_watch() && !r.is_event_post())
            .cloned()
            .collect()
    }

    /// The Event objects posted so far, as stored (with the server's
    /// metadata).
    pub fn pod_events(&self) -> Vec<Value> {
        self.lock().pod_events.clone()
    }

    /// Position in the log, for [`FakeApi::calls_since`].
    pub fn mark(&self) -> usize {
        self.lock().log.len()
    }

    /// The next `count` requests whose path contains `path_contains` get
    /// `status` (a Status object).
    pub fn fail_next(&self, path_contains: &str, status: u16, count: usize) {
        self.lock().injected.push(Injected {
            path_contains: path_contains.to_string(),
            status,
            remaining: count,
        });
    }

    /// Forgets the failures asked for that have not happened yet.
    pub fn clear_failures(&self) {
        self.lock().injected.clear();
    }

    /// While true, every request waits before it is answered (watches
    /// already open keep streaming).
    pub fn stall(&self, on: bool) {
        let _ = self.stalled.send(on);
    }

    /// Ends every open watch with a 410 Expired event and forgets the
    /// history: clients must list again.
    pub fn expire_watches(&self) {
        let mut s = self.lock();
        s.oldest_rv = s.rv + 1;
        s.events.clear();
        s.broadcast(|| WatchMsg::Expire);
    }

    /// While true, watches get no events (a lagging watch: the client's
    /// cache goes stale), also those opened meanwhile: their history stops
    /// before the first held event. False sends what was held.
    pub fn hold_watches(&self, on: bool) {
        let mut s = self.lock();
        if on {
            s.held.get_or_insert_with(Vec::new);
        } else if let Some(held) = s.held.take() {
            for e in held {
                s.broadcast(|| WatchMsg::Event(e.clone()));
            }
        }
    }

    /// Every list from now on is answered `delay` late (a slow API server
    /// at a node's start); watches and single GETs are not delayed.
    pub fn delay_lists(&self, delay: Duration) {
        self.lock().list_delay = delay;
    }

    /// From now on only `token` is accepted: a client with another one
    /// gets 401 Unauthorized.
    pub fn require_token(&self, token: &str) {
        self.lock().authn.required_token = Some(token.to_string());
    }

    /// From now on bearer `token` stands for `identity` (the API server's
    /// token authenticator); once any token is accepted, a request with
    /// an unknown token and no known client certificate gets 401.
    pub fn accept_token(&self, token: &str, identity: Identity) {
        let mut s = self.lock();
        s.authn.identify = true;
        s.authn.tokens.insert(token.to_string(), identity);
    }

    /// From now on only what `authorization`'s authorizers allow is
    /// answered; anything else is 403 Forbidden as the API server words
    /// it (see [`Authorization`]). Before: everything is allowed.
    pub fn authorize(&self, authorization: Authorization) {
        self.lock().authz.enforced = Some(authorization);
    }

    /// `token` is refused (401) from now on, as after its expiry.
    pub fn revoke_token(&self, token: &str) {
        self.lock().authn.tokens.remove(token);
    }

    /// Sends a BOOKMARK on every open watch.
    pub fn bookmark(&self) {
        self.lock().broadcast(|| WatchMsg::Bookmark);
    }

    /// Open watches right now.
    pub fn watchers(&self) -> usize {
        let mut s = self.lock();
        s.watchers.retain(|w| !w.is_closed());
        s.watchers.len()
    }

    /// Down: the port refuses connections and open watches end. Up again:
    /// the same port serves.
    pub fn set_up(&self, up: bool) {
        if !up {
            self.lock().watchers.clear();
        }
        let _ = self.up.send(up);
        // Wait until the listener is really closed or open again.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(self.addr).is_ok() != up {
            assert!(
                std::time::Instant::now() < deadline,
                "the fake API server did not go {}",
                if up { "up" } else { "down" }
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        let _ = self.stalled.send(false);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl State {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// The index of a made-up object that nothing has overridden.
    fn bulk_index(&self, resource: &'static str, namespace: &str, name: &str) -> Option<usize> {
        let i = self.bulk.as_ref()?.find(resource, namespace, name)?;
        let key = (resource, namespace.to_string(), name.to_string());
        (!self.overridden.contains(&key)).then_some(i)
    }

    /// The object as stored (made up or not).
    fn get(&self, resource: &'static str, namespace: &str, name: &str) -> Option<Value> {
        let key = (resource, namespace.to_string(), name.to_string());
        if let Some(o) = self.objects.get(&key) {
            return Some(o.clone());
        }
        let i = self.bulk_index(resource, namespace, name)?;
        let text = self.bulk.as_ref()?.render(resource, i, false);
        serde_json::from_str(&text).ok()
    }

    fn put(&mut self, resource: &'static str, namespace: &str, name: &str, mut object: Value) {
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = (resource, namespace.to_string(), name.to_string());
        let kind = if self.objects.contains_key(&key)
            || self.bulk_index(resource, namespace, name).is_some()
        {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if self
            .bulk
            .as_ref()
            .and_then(|b| b.find(resource, namespace, name))
            .is_some()
        {
            self.overridden.insert(key.clone());
        }
        self.objects.insert(key, object.clone());
        self.record(rv, resource, kind, object);
    }

    fn delete(&mut self, resource: &'static str, namespace: &str, name: &str) -> bool {
        let key = (resource, namespace.to_string(), name.to_string());
        let object = match self.objects.remove(&key) {
            Some(o) => Some(o),
            None => {
                let made_up = self.get(resource, namespace, name);
                if made_up.is_some() {
                    self.overridden.insert(key.clone());
                }
                made_up
            }
        };
        let Some(mut object) = object else {
            return false;
        };
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(rv, resource, "DELETED", object);
        true
    }

    fn record(&mut self, rv: u64, resource: &'static str, kind: &'static str, object: Value) {
        let event = Event {
            rv,
            resource,
            kind,
            object,
        };
        self.events.push(event.clone());
        if self.events.len() > HISTORY {
            let drop_n = self.events.len() - HISTORY;
            self.events.drain(..drop_n);
            self.oldest_rv = self.events[0].rv;
        }
        match &mut self.held {
            Some(held) => held.push(event),
            None => self.broadcast(|| WatchMsg::Event(event.clone())),
        }
    }

    fn broadcast(&mut self, msg: impl Fn() -> WatchMsg) {
        self.watchers.retain(|w| w.send(msg()).is_ok());
    }

    /// An object with its kind and apiVersion, as GET answers it.
    fn full(&self, resource: &str, object: &Value) -> Value {
        let mut o = object.clone();
        let (kind, api_version) = kind_of(resource);
        o["kind"] = json!(kind);
        o["apiVersion"] = json!(api_version);
        o
    }

    fn injected(&mut self, path: &str) -> Option<u16> {
        let hit = self
            .injected
            .iter_mut()
            .find(|i| i.remaining > 0 && path.contains(&i.path_contains))?;
        hit.remaining -= 1;
        Some(hit.status)
    }
}

fn kind_of(resource: &str) -> (&'static str, &'static str) {
    match resource {
        PODS => ("Pod", "v1"),
        RESOURCE_CLAIMS => ("ResourceClaim", "resource.k8s.io/v1"),
        RESOURCE_SLICES => ("ResourceSlice", "resource.k8s.io/v1"),
        _ => ("NetworkAttachmentDefinition", "k8s.cni.cncf.io/v1"),
    }
}

async fn serve(
    std_listener: StdListener,
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<Mutex<State>>,
    mut up: watch::Receiver<bool>,
    stalled: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) {
    std_listener.set_nonblocking(true).expect("nonblocking");
    let mut listener = Some(tokio::net::TcpListener::from_std(std_listener).expect("listener"));
    loop {
        let accept = async {
            match &listener {
                Some(l) => l.accept().await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            changed = up.changed() => {
                if changed.is_err() {
                    return;
                }
                let want = *up.borrow_and_update();
                if want && listener.is_none() {
                    listener = Some(bind_again(addr).await);
                } else if !want {
                    listener = None;
                }
            }
            conn = accept => {
                let Some((stream, _)) = conn else { continue };
                let (state, stalled, down, tls) = (state.clone(), stalled.clone(), up.clone(), tls.clone());
                tokio::spawn(async move {
                    let Some(acceptor) = tls else {
                        return serve_connection(stream, None, state, stalled, down).await;
                    };
                    // A client certificate the CA did not sign fails here.
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let peer = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| c.to_vec());
                    serve_connection(stream, peer, state, stalled, down).await;
                });
            }
        }
    }
}

/// One connection, until it ends or the server goes down. `peer`: the
/// DER of the client certificate the connection presented, looked up on
/// each request (a revoked one gets 401).
async fn serve_connection<S>(
    stream: S,
    peer: Option<Vec<u8>>,
    state: Arc<Mutex<State>>,
    stalled: watch::Receiver<bool>,
    mut down: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let peer = peer.map(Arc::new);
    let service = hyper::service::service_fn(move |req| {
        let (state, stalled, peer) = (state.clone(), stalled.clone(), peer.clone());
        async move {
            let identity = match &peer {
                None => None,
                Some(der) => {
                    let verdict = state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .authn
                        .peer(der);
                    match verdict {
                        Err(()) => return Ok(wire::error(401, "Unauthorized", "Unauthorized")),
                        Ok(identity) => identity.map(Arc::new),
                    }
                }
            };
            handle(req, state, stalled, identity).await
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(conn);
    // Going down closes open connections too.
    loop {
        tokio::select! {
            _ = &mut conn => return,
            r = down.changed() => {
                if r.is_err() || !*down.borrow_and_update() {
                    return;
                }
            }
        }
    }
}

async fn bind_again(addr: SocketAddr) -> tokio::net::TcpListener {
    loop {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        let _ = socket.set_reuseaddr(true);
        if socket.bind(addr).is_ok() {
            if let Ok(l) = socket.listen(128) {
                return l;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
