//! What Kubernetes learns of a pod's ADD: once its networks are attached,
//! the pod's network-status annotation and one `AddedInterface` event;
//! when it names a NetworkAttachmentDefinition that does not exist, a
//! `NoNetworkFound` warning.
//!
//! The annotation is written in the call's path. Unlike multus, an API
//! server that is away or slow does not fail the pod: its networks are
//! attached, so the ADD succeeds and the write is retried in the
//! background (about 30 s, then given up with a warning). A pod that is
//! gone is left alone; a refusal that will not change (a pod recreated
//! under the name, missing permissions) is the caller's error.
//!
//! Events are posted in the background. All background work (retries and
//! events) is tracked: [`Publisher::finish`] lets a drain wait for it,
//! bounded, and says what it leaves behind, and for which pods; once a
//! drain begins, a retry waiting for its next attempt makes it at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::events::{self, Kind};
use super::status;
use super::{Error, PodInfo, Source};
use crate::device_info::DeviceInfo;

/// Attempts of a network-status write the API server could not take at
/// ADD time, and the pause before the first of them (doubling after each).
const STATUS_RETRIES: u32 = 6;
const STATUS_RETRY_FIRST: Duration = Duration::from_millis(500);

/// One network an ADD attached, as network-status shows it.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    /// `<namespace>/<nad>`, or the network's name.
    pub name: &'a str,
    /// Its CNI result (any version).
    pub result: &'a Value,
    /// The cluster network.
    pub primary: bool,
    pub device_info: Option<&'a DeviceInfo>,
}

/// The background work a drain leaves behind, each as
/// `<what> of <namespace>/<pod>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    pub work: Vec<String>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.work.is_empty()
    }
}

/// Publishes what pods' ADDs did; shared by every call.
#[derive(Debug)]
pub struct Publisher {
    source: Arc<Source>,
    tasks: TaskTracker,
    /// The background work running, by id: what it is, for which pod.
    running: Arc<Mutex<BTreeMap<u64, String>>>,
    next: AtomicU64,
    /// Cancelled when a drain begins.
    hurry: CancellationToken,
}

/// Takes a piece of background work off the list when it ends, however.
struct Done(Arc<Mutex<BTreeMap<u64, String>>>, u64);

impl Drop for Done {
    fn drop(&mut self) {
        lock(&self.0).remove(&self.1);
    }
}

fn lock(m: &Mutex<BTreeMap<u64, String>>) -> std::sync::MutexGuard<'_, BTreeMap<u64, String>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Publisher {
    pub fn new(source: Arc<Source>) -> Self {
        Self {
            source,
            tasks: TaskTracker::new(),
            running: Arc::default(),
            next: AtomicU64::new(0),
            hurry: CancellationToken::new(),
        }
    }

    /// After an ADD attached `networks` (in order) to `pod`: writes its
    /// network-status (see the module's rules), then posts the event in
    /// the background. As multus, nothing to show leaves the annotation
    /// as it was.
    pub async fn added(&self, pod: &PodInfo, networks: &[Shown<'_>]) -> Result<(), Error> {
        let mut entries = Vec::new();
        for n in networks {
            match status::entries_from_value(n.name, n.result, n.primary, n.device_info) {
                Ok(e) => entries.extend(e),
                Err(e) => {
                    tracing::warn!(network = %n.name, cause = %e, "a result cannot be shown in network-status")
                }
            }
        }
        if entries.is_empty() {
            return Ok(());
        }
        self.write_status(pod, status::annotation(&entries)).await?;
        let message = events::added_message(&entries);
        self.event(pod, events::REASON_ADDED, Kind::Normal, &message);
        Ok(())
    }

    /// The ADD of `pod` names a NAD that does not exist (`message` says
    /// which): a warning event, in the background.
    pub fn no_network(&self, pod: &PodInfo, message: &str) {
        self.event(pod, events::REASON_NO_NETWORK, Kind::Warning, message);
    }

    /// For a drain: waits, at most `within`, for the background work to
    /// end, each retry waiting for its next attempt making it at once.
    /// What is left goes on while the runtime lives; it is logged (how
    /// many, for which pods) and returned.
    pub async fn finish(&self, within: Duration) -> Pending {
        self.hurry.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(within, self.tasks.wait()).await;
        let work: Vec<String> = lock(&self.running).values().cloned().collect();
        if !work.is_empty() {
            tracing::warn!(pending = work.len(), work = ?work, "writes to Kubernetes still pending: handed over unfinished");
        }
        Pending { work }
    }

    async fn write_status(&self, pod: &PodInfo, text: String) -> Result<(), Error> {
        match self.source.set_network_status(pod, &text).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => {
                tracing::info!(namespace = %pod.namespace, pod = %pod.name, "the pod is gone; network-status not written");
                Ok(())
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(namespace = %pod.namespace, pod = %pod.name, cause = %e, "cannot write network-status now; the networks are attached and the write is retried in the background");
                let (source, hurry) = (self.source.clone(), self.hurry.clone());
                let what = format!("network-status of {}/{}", pod.namespace, pod.name);
                let pod = pod.clone();
                self.spawn(what, async move {
                    retry_status(&source, &pod, &text, &hurry).await;
                });
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn event(&self, pod: &PodInfo, reason: &str, kind: Kind, message: &str) {
        if let Some(post) = self.source.event_post(pod, reason, kind, message) {
            self.spawn(
                format!("{reason} event of {}/{}", pod.namespace, pod.name),
                post,
            );
        }
    }

    /// Runs `work` in the background, tracked, listed as `what` until it
    /// ends.
    fn spawn(&self, what: String, work: impl Future<Output = ()> + Send + 'static) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.running).insert(id, what);
        let done = Done(self.running.clone(), id);
        self.tasks.spawn(async move {
            let _done = done;
            work.await;
        });
    }
}

/// Retries a network-status write: [`STATUS_RETRIES`] attempts, the
/// pauses doubling from [`STATUS_RETRY_FIRST`]; once `hurry` is
/// cancelled, the pause it interrupts ends at once.
async fn retry_status(source: &Source, pod: &PodInfo, text: &str, hurry: &CancellationToken) {
    let mut pause = STATUS_RETRY_FIRST;
    let mut hurried = hurry.is_cancelled();
    for attempt in 1..=STATUS_RETRIES {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = hurry.cancelled(), if !hurried => hurried = true,
        }
        pause *= 2;
        match source.set_network_status(pod, text).await {
            Ok(()) => {
                tracing::info!(namespace = %pod.namespace, pod = %pod.name, attempt, "network-status written");
                return;
            }
            Err(e) if e.is_transient() => continue,
            Err(e) => {
                tracing::warn!(namespace = %pod.namespace, pod = %pod.name, cause = %e, "network-status not written");
                return;
            }
        }
    }
    tracing::warn!(namespace = %pod.namespace, pod = %pod.name, attempts = STATUS_RETRIES + 1, "network-status not written: the Kubernetes API did not take it");
}
