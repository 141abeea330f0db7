//! The Kubernetes source as the handler holds it: the caches, what
//! publishes pods' network-status and events, and the start-up window in
//! which unsynced caches mean "starting" and an ADD waits for them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::failure::unavailable;
use crate::k8s::{self, publish::Publisher};
use crate::server::{Failure, Readiness};

#[derive(Debug)]
pub(super) struct Kubernetes {
    pub(super) source: Arc<k8s::Source>,
    pub(super) publisher: Publisher,
    /// Until then, unsynced caches mean "starting"; after, "degraded".
    settle_by: Instant,
    /// The longest an ADD waits for unsynced caches (`queueTimeout`, the
    /// wait a call accepts for admission), and never past `settle_by`.
    add_wait: Duration,
}

impl Kubernetes {
    pub(super) fn new(source: k8s::Source, sync_timeout: Duration, add_wait: Duration) -> Self {
        let source = Arc::new(source);
        Self {
            publisher: Publisher::new(source.clone()),
            source,
            settle_by: Instant::now() + sync_timeout,
            add_wait,
        }
    }

    /// How long an ADD arriving now may wait for the caches: until the
    /// start-up window (`kubernetesSyncTimeout` from the start) closes, at
    /// most `queueTimeout`. After the window, not at all: the caches
    /// missed their start, an outage that waiting calls would only pile
    /// up behind.
    fn add_wait_now(&self) -> Duration {
        self.settle_by
            .saturating_duration_since(Instant::now())
            .min(self.add_wait)
    }

    /// The last watch error and a credentials file that cannot be read,
    /// as a suffix for readiness texts.
    fn cause(&self) -> String {
        let mut cause = self
            .source
            .watch_error()
            .map(|e| format!(" (last error: {e})"))
            .unwrap_or_default();
        if let Some(c) = self.credentials() {
            cause.push_str(&format!("; {c}"));
        }
        cause
    }

    /// A credentials file that cannot be read again (the credentials read
    /// before are used meanwhile), naming the file.
    fn credentials(&self) -> Option<String> {
        self.source
            .credentials_error()
            .map(|p| format!("Kubernetes credentials: {p}"))
    }

    /// For the ADD of `container_id`: the caches have synced. A cold
    /// daemon (started by the first call after a reboot) gets pods before
    /// its caches have listed: it waits for them, bounded, rather than
    /// send every pod into the runtime's back-off.
    pub(super) async fn synced_for_add(&self, container_id: &str) -> Result<(), Failure> {
        if self.source.synced() {
            return Ok(());
        }
        let started = Instant::now();
        let synced = self.source.wait_synced(self.add_wait_now()).await;
        let waited = crate::duration::format(started.elapsed());
        if !synced {
            return Err(unavailable(format!(
                "the Kubernetes caches (pods, NetworkAttachmentDefinitions) have not synced \
                 (waited {waited}){}; try again later",
                self.cause()
            )));
        }
        tracing::info!(container_id, waited = %waited, "ADD waited for the Kubernetes caches to sync");
        Ok(())
    }

    pub(super) fn readiness(&self) -> Readiness {
        if self.source.synced() {
            // Serving, with what will fail once the old credentials expire.
            match self.credentials() {
                Some(c) => Readiness::Degraded(c),
                None => Readiness::Ready,
            }
        } else if Instant::now() < self.settle_by {
            Readiness::Starting(format!(
                "waiting for the Kubernetes caches (this node's pods and the \
                 NetworkAttachmentDefinitions) to sync{}",
                self.cause()
            ))
        } else {
            Readiness::Degraded(format!(
                "the Kubernetes caches have not synced; calls that need them are \
                 answered with code 11 (try again later){}",
                self.cause()
            ))
        }
    }

    /// Waits for the caches until the start-up window closes.
    pub(super) async fn settle(&self) {
        let left = self.settle_by.saturating_duration_since(Instant::now());
        if !self.source.wait_synced(left).await {
            tracing::warn!(
                waited = %crate::duration::format(left),
                cause = %self.source.watch_error().unwrap_or_default(),
                "the Kubernetes caches did not sync in time; serving anyway"
            );
        }
    }
}
