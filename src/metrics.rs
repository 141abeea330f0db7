//! Prometheus metrics: the registry and typed handles handed to modules.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of a finished request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    pub command: &'static str,
    pub outcome: &'static str,
}

/// Labels of a latency observation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub endpoint: &'static str,
    pub command: &'static str,
}

/// Why a request was turned away.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    pub reason: &'static str,
}

/// Labels of one plugin call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: String,
    pub command: &'static str,
    pub outcome: &'static str,
}

/// The multus metric, kept for dashboards built on it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MultusLabels {
    pub handler: &'static str,
    pub code: String,
    pub method: &'static str,
}

/// What became of an attachment whose DEL failed (see docs/records.md,
/// "Pending cleanup").
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CleanupLabels {
    /// `handed_over` (the runtime's DEL was answered with success, plexusd
    /// retries alone), `retry_failed`, `done` (a later DEL succeeded),
    /// `given_up` or `reclaimed` (a container the runtime forgot, deleted
    /// by reconcile).
    pub outcome: &'static str,
}

/// Every metric family of the daemon.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<LatencyLabels, Histogram>,
    pub in_flight: Gauge,
    pub queued: Gauge,
    /// Requests waiting for their container's turn (another call for the
    /// same container is in progress); they hold no processing slot.
    pub waiting_turn: Gauge,
    pub rejected: Family<RejectLabels, Counter>,
    pub connections_open: Gauge,
    /// The cap on open connections in effect (after fitting it to the
    /// descriptor limit).
    pub connections_limit: Gauge,
    pub connections_evicted: Counter,
    pub accept_errors: Counter,
    /// Bytes of request bodies held between their reading and the start
    /// of their work.
    pub body_bytes: Gauge,
    pub multus_requests: Family<MultusLabels, Counter>,
    pub plugin_calls: Family<PluginLabels, Histogram>,
    /// Containers with an attachment whose DEL failed and is retried.
    pub cleanups_pending: Gauge,
    pub cleanups: Family<CleanupLabels, Counter>,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 17,
    ))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut metrics = Self {
            registry: Registry::default(),
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            in_flight: Gauge::default(),
            queued: Gauge::default(),
            waiting_turn: Gauge::default(),
            rejected: Family::default(),
            connections_open: Gauge::default(),
            connections_limit: Gauge::default(),
            connections_evicted: Counter::default(),
            accept_errors: Counter::default(),
            body_bytes: Gauge::default(),
            multus_requests: Family::default(),
            plugin_calls: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            cleanups_pending: Gauge::default(),
            cleanups: Family::default(),
        };
        let mut registry = Registry::default();
        metrics.register_plexus(registry.sub_registry_with_prefix("plexus"));
        // The multus metric, under multus's own name.
        registry.sub_registry_with_prefix("multus_server").register(
            "request",
            "Counter of HTTP requests",
            metrics.multus_requests.clone(),
        );
        metrics.registry = registry;
        metrics
    }

    /// Registers the daemon's own families (in the order they are
    /// rendered).
    fn register_plexus(&self, registry: &mut Registry) {
        registry.register(
            "cleanups_pending",
            "Containers with an attachment whose DEL failed and that plexusd retries",
            self.cleanups_pending.clone(),
        );
        registry.register(
            "cleanups",
            "Attachments whose DEL failed, by what became of them",
            self.cleanups.clone(),
        );
        registry.register(
            "requests",
            "Requests answered, by endpoint, CNI command and outcome",
            self.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a request's arrival to its answer",
            self.latency.clone(),
        );
        registry.register(
            "requests_in_flight",
            "CNI operations being processed, counted until their plugins finish even when the client has gone",
            self.in_flight.clone(),
        );
        registry.register(
            "requests_queued",
            "CNI requests waiting for a processing slot",
            self.queued.clone(),
        );
        registry.register(
            "requests_waiting_turn",
            "CNI requests waiting, without a processing slot, for another call for the same container (or GC) to finish",
            self.waiting_turn.clone(),
        );
        registry.register(
            "requests_rejected",
            "Requests turned away, by reason",
            self.rejected.clone(),
        );
        registry.register(
            "connections_open",
            "Client connections currently open",
            self.connections_open.clone(),
        );
        registry.register(
            "connections_limit",
            "Client connections served at most at once (maxConnections, lowered to fit the descriptor limit)",
            self.connections_limit.clone(),
        );
        registry.register(
            "connections_evicted",
            "Connections closed before sending a request, to make room at the connection cap",
            self.connections_evicted.clone(),
        );
        registry.register(
            "accept_errors",
            "Failed accept() calls on the listening sockets",
            self.accept_errors.clone(),
        );
        registry.register(
            "request_body_bytes",
            "Bytes of request bodies held between their reading and the start of their work",
            self.body_bytes.clone(),
        );
        registry.register(
            "plugin_duration_seconds",
            "Run time of each CNI plugin call, by plugin, command and outcome",
            self.plugin_calls.clone(),
        );
    }

    /// The registry in the Prometheus/OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_should_list_every_family() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels {
                endpoint: "/cni",
                command: "ADD",
                outcome: "success",
            })
            .inc();
        let text = m.render();
        for name in [
            "plexus_requests_total{endpoint=\"/cni\",command=\"ADD\",outcome=\"success\"} 1",
            "plexus_requests_in_flight",
            "plexus_requests_queued",
            "plexus_requests_waiting_turn",
            "plexus_connections_open",
            "plexus_request_duration_seconds",
            "plexus_requests_rejected",
            "plexus_connections_limit",
            "plexus_connections_evicted_total",
            "plexus_accept_errors_total",
            "plexus_request_body_bytes",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
