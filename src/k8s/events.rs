//! Pod events, as `kubectl describe pod` shows them: one `AddedInterface`
//! event per ADD listing every interface, network and address (multus
//! posts one per network), and a `NoNetworkFound` warning when a pod names
//! a NetworkAttachmentDefinition that does not exist. Posted in the
//! background (by [`super::publish::Publisher`], which tracks them), at
//! most [`IN_FLIGHT`] at once (more are dropped, with a debug line), each
//! bounded by the request timeout: an event never delays or fails a call.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::core::ObjectMeta;
use tokio::sync::Semaphore;

use super::status::NetworkStatus;
use super::{Error, PodInfo, Source};

/// Events being posted at once.
pub const IN_FLIGHT: usize = 8;
/// The component events name as their source.
pub const COMPONENT: &str = "plexus";
pub const REASON_ADDED: &str = "AddedInterface";
pub const REASON_NO_NETWORK: &str = "NoNetworkFound";

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Normal => "Normal",
            Kind::Warning => "Warning",
        }
    }
}

/// The message of an ADD's event: `Add <ifname> [<ips>] from <network>`
/// per interface, as multus words each of its events, joined with `; `.
pub fn added_message(entries: &[NetworkStatus]) -> String {
    entries
        .iter()
        .filter(|e| !e.interface.is_empty())
        .map(|e| format!("Add {} [{}] from {}", e.interface, e.ips.join(" "), e.name))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The Event object for `pod` on `node`, named as client-go names them
/// (`<pod>.<nanoseconds in hex>`).
pub fn event(pod: &PodInfo, node: &str, reason: &str, kind: Kind, message: &str) -> Event {
    let now = now();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", pod.name, now.1)),
            namespace: Some(pod.namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(kind.as_str().into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node.into()),
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(Time(now.0)),
        last_timestamp: Some(Time(now.0)),
        count: Some(1),
        ..Default::default()
    }
}

/// Now, and as nanoseconds since the epoch.
fn now() -> (k8s_openapi::jiff::Timestamp, u128) {
    let t = k8s_openapi::jiff::Timestamp::now();
    let nanos = u128::try_from(t.as_nanosecond()).unwrap_or(0);
    (t, nanos)
}

/// Bounds the events posted at once.
#[derive(Debug, Clone)]
pub struct Poster {
    slots: Arc<Semaphore>,
}

impl Default for Poster {
    fn default() -> Self {
        Self {
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
        }
    }
}

impl Source {
    /// The post of an event about `pod`, to run in the background; `None`
    /// when events are off, or when [`IN_FLIGHT`] are being posted already
    /// (this one is dropped, with a debug line).
    pub(super) fn event_post(
        &self,
        pod: &PodInfo,
        reason: &str,
        kind: Kind,
        message: &str,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        if !self.config.pod_events {
            return None;
        }
        let Ok(slot) = self.events.slots.clone().try_acquire_owned() else {
            tracing::debug!(namespace = %pod.namespace, pod = %pod.name, reason, "too many pod events being posted; this one is dropped");
            return None;
        };
        let ev = event(pod, &self.config.node_name, reason, kind, message);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &pod.namespace);
        let timeout = self.config.request_timeout;
        let (namespace, name) = (pod.namespace.clone(), pod.name.clone());
        Some(async move {
            let _slot = slot;
            let posted = match tokio::time::timeout(
                timeout,
                api.create(&PostParams::default(), &ev),
            )
            .await
            {
                Err(_) => Err(Error::Timeout(timeout)),
                Ok(Err(e)) => Err(Error::Api(e)),
                Ok(Ok(_)) => Ok(()),
            };
            if let Err(e) = posted {
                tracing::debug!(namespace = %namespace, pod = %name, cause = %e, "pod event not posted");
            }
        })
    }
}
