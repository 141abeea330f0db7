//! The Kubernetes source: this node's pods (metadata only) and every
//! NetworkAttachmentDefinition, kept in watch-fed caches, plus the one
//! write an ADD makes (the pod's `network-status` annotation).
//!
//! Optional: without a `kubeconfig` and outside a cluster there is no
//! source, and Plexus serves static networks only.
//!
//! - Credentials: the `kubeconfig` file named in daemon-config.json, else
//!   the in-cluster service account (when `KUBERNETES_SERVICE_HOST` is set);
//!   read again when their files change and after a 401 ([`client`]), so
//!   a rotated client certificate or token needs no restart.
//! - Pods: `spec.nodeName=<node>` only (lists, watches), as
//!   `PartialObjectMetadata`: a node never receives the cluster's pods,
//!   nor their specs. Kept per pod: namespace, name, uid and the
//!   annotations Plexus reads ([`pod::PodMeta`]).
//! - NADs: all namespaces (selection may name any namespace). Kept per
//!   NAD: namespace, name, `spec.config` and the `resourceName`
//!   annotation, a config text shared by the NADs that have the same
//!   ([`nad::CachedNad`]); about 100 bytes plus the config.
//! - Objects are decoded only that far ([`slim`]): `managedFields`,
//!   labels and other annotations are skipped while reading.
//! - Lists are paged (kube-runtime's watcher, 500 objects a page, as
//!   client-go); caches re-list on `410 Gone` and back off on errors; a
//!   re-list replaces a cache's contents when it is complete
//!   ([`cache`]). [`Source::synced`] says when both have listed once;
//!   [`Source::watch_error`] says why not, with the whole chain of causes
//!   (a refused certificate, 401 Unauthorized).
//! - A pod the cache does not hold yet (a fresh pod racing the watch) costs
//!   one GET, bounded by `requestTimeout`, never a failure for a slow cache.
//! - Pod planning (`selection::pod`) reads the NADs, the kubelet's
//!   devices and those of the pod's ResourceClaims ([`dra`]) through
//!   [`Source`]'s [`Cluster`] implementation.
//! - Nothing here is needed for DEL: DEL runs from the attachment records.

mod cache;
pub mod client;
pub mod devices;
pub mod dra;
pub mod events;
mod nad;
mod pod;
pub mod publish;
pub mod refusal;
mod slim;
pub mod status;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use pod::SlimPod;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use cache::{Cache, Feeder, Slim};
pub use nad::{CachedNad, NetworkAttachmentDefinition};
pub use pod::{Incomplete, PodMeta, PodRef, CONFIG_SOURCE_ANNOTATION};

use crate::selection::pod::{self as planning, Cluster, DeviceIds, DevicesError, Nad};

/// The pod annotation Plexus writes after an ADD.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";

/// How long start-up waits for the caches before serving anyway.
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of one API request (and of connecting).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the in-cluster service account token lives.
const IN_CLUSTER_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Settings of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// A kubeconfig file; `None`: the in-cluster service account, if any.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name, as the pods' `spec.nodeName` holds it.
    pub node_name: String,
    /// How long start-up waits for both caches before it reports ready
    /// anyway (and says so).
    pub sync_timeout: Duration,
    /// Bound of each single request (the pod GET, the status patch) and
    /// of connecting.
    pub request_timeout: Duration,
    /// Where the devices of NADs with a `resourceName` are looked up.
    pub devices: devices::DeviceSource,
    /// The device-info directory (`dp/` and `cni/` under it).
    pub device_info_dir: PathBuf,
    /// Whether ADDs post pod events (`podEvents`).
    pub pod_events: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot use the in-cluster service account")]
    InCluster(#[source] kube::config::InClusterError),
    #[error("cannot create the Kubernetes client")]
    Client(#[source] kube::Error),
    #[error("the Kubernetes API did not answer within {}", crate::duration::format(*.0))]
    Timeout(Duration),
    #[error("the Kubernetes API refused the request")]
    Api(#[source] kube::Error),
    #[error(
        "pod {namespace}/{name} was recreated: the runtime asked for uid {expected}, \
         the API has {found}"
    )]
    UidMismatch {
        namespace: String,
        name: String,
        expected: String,
        found: String,
    },
}

impl Error {
    /// The API answered 404: the object does not exist (any more).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api(kube::Error::Api(status)) if status.code == 404)
    }

    /// Worth trying again later (outage, timeout, throttling), as opposed
    /// to a refusal that will not change.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Timeout(_) => true,
            Error::Api(kube::Error::Api(status)) => {
                matches!(status.code, 429 | 500 | 502 | 503 | 504)
            }
            Error::Api(_) => true,
            _ => false,
        }
    }
}

/// What selection needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Those the pod has of the annotations pod planning reads
    /// (`selection::pod::POD_ANNOTATIONS`) and of
    /// [`CONFIG_SOURCE_ANNOTATION`]; no others.
    pub annotations: BTreeMap<String, String>,
}

impl PodInfo {
    /// From metadata decoded by [`PodMeta`] (other annotations already
    /// left out).
    fn from_meta(meta: kube::core::ObjectMeta) -> Self {
        Self {
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
            uid: meta.uid.unwrap_or_default(),
            annotations: meta.annotations.unwrap_or_default(),
        }
    }

    /// A static pod (from a manifest file on the node) has a mirror object
    /// in the API with a uid of its own; the runtime's uid never matches.
    pub fn is_static(&self) -> bool {
        self.annotations
            .get(CONFIG_SOURCE_ANNOTATION)
            .is_some_and(|s| s != "api")
    }
}

/// The caches and the client. Dropping it stops the watches.
pub struct Source {
    /// Every call goes through it: credentials re-read when their files
    /// change and after a 401 ([`client`]).
    client: kube::Client,
    reloading: client::Reloading,
    config: Config,
    pods: Arc<Cache<PodInfo>>,
    nads: Arc<Cache<CachedNad>>,
    /// Where each cache stands: listed once, or its list refused
    /// (403); any number of tasks may look or wait.
    pods_synced: watch::Receiver<Listed>,
    nads_synced: watch::Receiver<Listed>,
    /// The last error of each cache's watch (with its whole chain of
    /// causes) until that watch recovers.
    errors: WatchErrors,
    stop: CancellationToken,
    events: events::Poster,
    /// Devices from Dynamic Resource Allocation.
    dra: dra::Dra,
}

/// Where a cache stands with its first full list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Listed {
    /// Not listed yet (starting, or the API is failing).
    Not,
    /// Listed once: kept up to date from then on.
    Done,
    /// Not listed yet, and the API refused the list to this identity
    /// (403): it will not change by waiting, only by a new rule (the
    /// watch keeps trying, and lists when one is added).
    Refused(String),
}

impl Listed {
    fn done(&self) -> bool {
        matches!(self, Listed::Done)
    }

    /// Done, or refused: waiting would not change it.
    fn settled(&self) -> bool {
        !matches!(self, Listed::Not)
    }
}

/// Whether a watch error is the API refusing this identity (403).
fn is_forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 403,
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

/// Cache name -> the last error of its watch, while it is failing.
type WatchErrors = Arc<Mutex<BTreeMap<&'static str, String>>>;

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("config", &self.config)
            .field("synced", &self.synced())
            .finish_non_exhaustive()
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Config {
    /// Whether there is a Kubernetes source at all: a `kubeconfig`, or the
    /// in-cluster environment (`KUBERNETES_SERVICE_HOST` and a service
    /// account token). Otherwise Plexus serves static networks only.
    pub fn enabled(&self) -> bool {
        self.kubeconfig.is_some()
            || (std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
                && std::path::Path::new(IN_CLUSTER_TOKEN).exists())
    }
}

/// A lowercase RFC 1123 DNS subdomain of at most 253 bytes, as Kubernetes
/// requires of node names.
pub fn is_valid_node_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// This host's node name as the kubelet derives it by default: the host
/// name, lowercased.
pub fn host_node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// The client's settings, from the kubeconfig or the in-cluster service
/// account, with `requestTimeout` for connecting and writing; no request
/// is made. What start-up needs before it can watch anything, and what
/// `--check-config` checks.
pub async fn client_config(config: &Config) -> Result<kube::Config, Error> {
    let mut client_config = match &config.kubeconfig {
        Some(path) => {
            let p = path.clone();
            let kubeconfig =
                tokio::task::spawn_blocking(move || kube::config::Kubeconfig::read_from(&p))
                    .await
                    .map_err(|e| Error::Client(kube::Error::Service(Box::new(e))))?
                    .map_err(|source| Error::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        None => kube::Config::incluster().map_err(Error::InCluster)?,
    };
    client_config.connect_timeout = Some(config.request_timeout);
    client_config.write_timeout = Some(config.request_timeout);
    Ok(client_config)
}

impl Source {
    /// Builds the client and starts both watches on the current runtime.
    /// Does not wait for anything: see [`Source::wait_synced`].
    pub async fn start(config: Config) -> Result<Self, Error> {
        let refusals = Arc::new(refusal::Refusals::default());
        let reloading = client::Reloading::start(&config, refusals).await?;
        let client = reloading.client();
        let stop = CancellationToken::new();

        let pods = Arc::new(Cache::default());
        let pod_api: Api<PodMeta> = Api::all(client.clone());
        let pod_watch = watcher(pod_api, pod_watch_config(&config.node_name));
        let errors = WatchErrors::default();
        let pods_synced = spawn_watch("pods", pod_watch, Feeder::new(pods.clone()), &errors, &stop);

        let nads = Arc::new(Cache::default());
        let nad_api: Api<NetworkAttachmentDefinition> = Api::all(client.clone());
        let nad_watch = watcher(nad_api, watcher::Config::default());
        let nads_synced = spawn_watch(
            "network-attachment-definitions",
            nad_watch,
            Feeder::new(nads.clone()),
            &errors,
            &stop,
        );

        let dra = dra::Dra::new(
            client.clone(),
            config.node_name.clone(),
            config.request_timeout,
            stop.clone(),
        );
        Ok(Self {
            dra,
            client,
            reloading,
            config,
            pods,
            nads,
            pods_synced,
            nads_synced,
            errors,
            stop,
            events: events::Poster::default(),
        })
    }

    /// Why the watches are failing right now (each failing cache's last
    /// error with its causes), if they are.
    pub fn watch_error(&self) -> Option<String> {
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if errors.is_empty() {
            return None;
        }
        Some(
            errors
                .iter()
                .map(|(cache, e)| format!("{cache}: {e}"))
                .collect::<Vec<_>>()
                .join("; "),
        )
    }

    /// Why the credentials' files could not be read again (one missing,
    /// unreadable or invalid), naming the file, while that lasts; the
    /// credentials read before are used meanwhile.
    pub fn credentials_error(&self) -> Option<String> {
        self.reloading.problem()
    }

    /// The device-info directory.
    pub fn device_info_dir(&self) -> &std::path::Path {
        &self.config.device_info_dir
    }

    /// Both caches have listed once, or the NADs' list was refused to
    /// this identity: a node's own identity may read its pods but no
    /// NetworkAttachmentDefinition, and its pods that name none are
    /// served (see [`Source::nads_refused`]).
    pub fn synced(&self) -> bool {
        self.pods_synced.borrow().done() && self.nads_synced.borrow().settled()
    }

    /// Why the NetworkAttachmentDefinitions cannot be read, while the API
    /// refuses their list to this identity and they were never listed.
    pub fn nads_refused(&self) -> Option<String> {
        match &*self.nads_synced.borrow() {
            Listed::Refused(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Waits until [`Source::synced`], at most `timeout`; whether it is.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let mut pods = self.pods_synced.clone();
        let mut nads = self.nads_synced.clone();
        let both = async {
            let _ = pods.wait_for(Listed::done).await;
            let _ = nads.wait_for(Listed::settled).await;
        };
        let _ = tokio::time::timeout(timeout, both).await;
        self.synced()
    }

    /// The pod, from the cache, else from one bounded GET (a pod created
    /// moments ago may not have reached the cache). `Ok(None)`: no such
    /// pod. With `uid`, a pod of that name with another uid (deleted and
    /// recreated) is [`Error::UidMismatch`], unless it is a static pod.
    pub async fn pod(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Option<PodInfo>, Error> {
        let pod = match self.cached_pod(namespace, name) {
            Some(p) if uid.is_none_or(|u| u.is_empty() || u == p.uid) => return Ok(Some(p)),
            // The cache may lag behind a recreation: ask the API.
            _ => self.get_pod(namespace, name).await?,
        };
        match (pod, uid) {
            (Some(p), Some(u)) if !u.is_empty() && u != p.uid && !p.is_static() => {
                Err(Error::UidMismatch {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    expected: u.to_string(),
                    found: p.uid,
                })
            }
            (p, _) => Ok(p),
        }
    }

    /// The pod as the cache holds it, without asking the API.
    pub fn cached_pod(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        self.pods.get(namespace, name, PodInfo::clone)
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<PodInfo>, Error> {
        let api: Api<PodMeta> = Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(self.config.request_timeout, api.get_opt(name)).await {
            Err(_) => Err(Error::Timeout(self.config.request_timeout)),
            Ok(Err(e)) => Err(Error::Api(e)),
            Ok(Ok(p)) => Ok(p.map(|p| PodInfo::from_meta(p.metadata))),
        }
    }

    /// A NetworkAttachmentDefinition from the cache, as pod planning
    /// reads it.
    pub fn nad(&self, namespace: &str, name: &str) -> Option<Nad> {
        self.nads.get(namespace, name, CachedNad::to_nad)
    }

    /// How many pods and NADs the caches hold.
    pub fn cached(&self) -> (usize, usize) {
        (self.pods.len(), self.nads.len())
    }

    /// Writes the pod's `network-status` annotation: one merge patch of
    /// its status subresource. The patch carries the pod's uid, so the API
    /// server refuses it (422, uid is immutable) for a pod recreated under
    /// the same name since the caller looked.
    pub async fn set_network_status(&self, pod: &PodInfo, status: &str) -> Result<(), Error> {
        let api: Api<SlimPod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let patch = serde_json::json!({
            "metadata": {
                "uid": pod.uid,
                "annotations": { NETWORK_STATUS_ANNOTATION: status },
            }
        });
        let params = PatchParams::default();
        let patch = Patch::Merge(&patch);
        let call = api.patch_status(&pod.name, &params, &patch);
        match tokio::time::timeout(self.config.request_timeout, call).await {
            Err(_) => Err(Error::Timeout(self.config.request_timeout)),
            Ok(Err(e)) => Err(Error::Api(e)),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// Pod planning's view of the cluster: the NAD cache and the kubelet's
/// devices, both of which this source owns.
impl Cluster for Source {
    fn network_attachment(&self, namespace: &str, name: &str) -> Option<Nad> {
        self.nad(namespace, name)
    }

    fn network_attachments_unreadable(&self) -> Option<String> {
        self.nads_refused()
    }

    async fn pod_devices(&self, pod: &planning::Pod<'_>) -> Result<DeviceIds, DevicesError> {
        self.config
            .devices
            .pod_devices(pod.namespace, pod.name, pod.uid)
            .await
            .map_err(|e| DevicesError {
                transient: e.is_transient(),
                error: Box::new(e),
            })
    }

    async fn pod_claim_devices(&self, pod: &planning::Pod<'_>) -> Result<DeviceIds, DevicesError> {
        self.dra
            .pod_devices(pod.namespace, pod.uid)
            .await
            .map_err(|e| DevicesError {
                transient: e.is_transient(),
                error: Box::new(e),
            })
    }
}

/// Process-wide, for a daemon with a Kubernetes source, before it starts:
/// keeps the list pages' large buffers out of the heap the caches live in
/// (see [`crate::memory::keep_large_buffers_off_the_heap`]). Changes the allocator's
/// settings for the whole process.
pub fn tune_allocator_for_lists() {
    crate::memory::keep_large_buffers_off_the_heap();
}

/// The pods' watch: this node's only, selected by the API server (lists
/// and watches alike).
fn pod_watch_config(node_name: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("spec.nodeName={node_name}"))
}

/// Runs a watch into a cache until `stop`; the receiver turns true (and a
/// line is logged) when the cache has its first full list. Errors are
/// logged (at most one line per distinct error in a row) and retried with
/// backoff.
fn spawn_watch<K>(
    what: &'static str,
    stream: impl futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    mut feeder: Feeder<K>,
    errors: &WatchErrors,
    stop: &CancellationToken,
) -> watch::Receiver<Listed>
where
    K: Slim + Send + 'static,
    K::Value: Send + Sync + 'static,
{
    let stop = stop.clone();
    let (synced_tx, synced) = watch::channel(Listed::Not);
    let errors = errors.clone();
    tokio::spawn(async move {
        let mut last_error: Option<String> = None;
        let events = stream.default_backoff();
        tokio::pin!(events);
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = events.next() => n,
            };
            match next {
                None => return,
                Some(Ok(event)) => {
                    // Sent before every (re)list, also one about to fail:
                    // not a sign of recovery.
                    let init = matches!(event, watcher::Event::Init);
                    if feeder.apply(event) {
                        crate::memory::release_free_memory();
                        if !synced_tx.borrow().done() {
                            synced_tx.send_replace(Listed::Done);
                            tracing::info!(
                                cache = what,
                                objects = feeder.len(),
                                "Kubernetes cache synced"
                            );
                        }
                    }
                    if !init && last_error.take().is_some() {
                        errors
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(what);
                        tracing::info!(cache = what, "Kubernetes watch recovered");
                    }
                }
                Some(Err(e)) => {
                    // The whole chain: "client error (Connect)" alone does
                    // not say that a certificate was refused.
                    let text = crate::causes::chain(&e);
                    if is_forbidden(&e) && !synced_tx.borrow().done() {
                        synced_tx.send_replace(Listed::Refused(text.clone()));
                    }
                    if last_error.as_deref() != Some(text.as_str()) {
                        tracing::warn!(cache = what, cause = %text, "Kubernetes watch failed; retrying with backoff");
                        errors
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(what, text.clone());
                    }
                    last_error = Some(text);
                }
            }
        }
    });
    synced
}

#[cfg(test)]
mod tests {
    #[test]
    fn pods_should_be_selected_by_this_node_in_lists_and_watches() {
        let c = super::pod_watch_config("node-a");
        assert_eq!(c.field_selector.as_deref(), Some("spec.nodeName=node-a"));
        assert_eq!(c.label_selector, None);
    }
}
