//! The request handler that joins the server to the CNI engine: turns a
//! wire request into a validated invocation, picks the networks, runs the
//! engine and answers ADD with the 1.1.0 result (the shim converts it to
//! its own config's version, as multus-shim does).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::api::Command;
use crate::api::{self, code};
use crate::cni::{self, Engine, ErrorKind, Planned};
use crate::k8s;
use crate::netconf::{self, Invalid, Invocation, NetworkList};

mod call_log;
mod delegate;
mod kube;
use crate::readiness_file::Indicator;
use crate::result;
use crate::selection::{self, overlay::Overlay};
use crate::server::{Failure, FailureKind, Handler, Readiness, Reply};

/// Serves `/cni` with the engine, the static network configuration and,
/// when configured, the Kubernetes source.
#[derive(Debug, Clone)]
pub struct Networks {
    engine: Arc<Engine>,
    /// The daemon's networks and the keys a call's configuration may set.
    selection: Arc<Overlay>,
    kubernetes: Option<Arc<Kubernetes>>,
    /// The readiness indicator file ADD, STATUS and GC wait for.
    readiness_file: Option<Indicator>,
}

/// The Kubernetes source and how long start-up waits for it.
#[derive(Debug)]
struct Kubernetes {
    source: k8s::Source,
    /// Until then, unsynced caches mean "starting"; after, "degraded".
    settle_by: Instant,
    /// The longest an ADD waits for unsynced caches (`queueTimeout`, the
    /// wait a call accepts for admission), and never past `settle_by`.
    add_wait: Duration,
}

impl Kubernetes {
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

    /// The last watch error, as a suffix for readiness texts.
    pub(super) fn cause(&self) -> String {
        self.source
            .watch_error()
            .map(|e| format!(" (last error: {e})"))
            .unwrap_or_default()
    }
}

impl Networks {
    pub fn new(
        engine: Arc<Engine>,
        selection: Overlay,
        kubernetes: Option<k8s::Source>,
        sync_timeout: Duration,
        queue_timeout: Duration,
    ) -> Self {
        Self {
            engine,
            selection: Arc::new(selection),
            readiness_file: None,
            kubernetes: kubernetes.map(|source| {
                Arc::new(Kubernetes {
                    source,
                    settle_by: Instant::now() + sync_timeout,
                    add_wait: queue_timeout,
                })
            }),
        }
    }

    /// Makes ADD, STATUS and GC wait for the readiness indicator file.
    pub fn with_readiness_file(mut self, indicator: Indicator) -> Self {
        self.readiness_file = Some(indicator);
        self
    }

    /// Loads every network of the daemon's configuration and locates its
    /// plugins, so that a broken setup shows in the log at start-up
    /// rather than on the first ADD. Networks are still looked up on
    /// every call (files may appear or change later; unchanged files are
    /// not read again), so this only warns; it returns the problems found.
    pub async fn preflight(&self) -> Vec<String> {
        self.preflight_problems()
            .await
            .into_iter()
            .map(|p| p.msg)
            .collect()
    }

    /// [`Networks::preflight`]'s problems, each saying whether the network
    /// itself could not be loaded or its plugins are at fault.
    pub async fn preflight_problems(&self) -> Vec<PreflightProblem> {
        let mut problems = Vec::new();
        let cfg = self.selection.base();
        if !cfg.has_networks() {
            return problems;
        }
        for list in self.configured_lists(cfg).await {
            match list {
                Ok(list) => {
                    if let Err(e) = self.engine.check_plugins(&list).await {
                        problems.push(PreflightProblem {
                            loaded: true,
                            msg: e.msg,
                        });
                    }
                }
                Err(e) => problems.push(PreflightProblem {
                    loaded: false,
                    msg: e.msg,
                }),
            }
        }
        problems
    }
}

impl Networks {
    /// The plugin types (each plugin's `type` and its IPAM's) of every
    /// configured network that loads, by network name.
    pub async fn configured_plugin_types(&self) -> Vec<(String, Vec<String>)> {
        let cfg = self.selection.base();
        if !cfg.has_networks() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for list in self.configured_lists(cfg).await.into_iter().flatten() {
            let mut types = Vec::new();
            for plugin in &list.plugins {
                let named = [
                    plugin.get("type"),
                    plugin.get("ipam").and_then(|i| i.get("type")),
                ];
                for t in named.into_iter().flatten().filter_map(|t| t.as_str()) {
                    if !types.iter().any(|k| k == t) {
                        types.push(t.to_string());
                    }
                }
            }
            out.push((list.name.clone(), types));
        }
        out
    }
}

/// A configured network that will not work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightProblem {
    /// The network was loaded (its plugins are at fault); else it could
    /// not be found or read.
    pub loaded: bool,
    pub msg: String,
}

impl Handler for Networks {
    fn readiness(&self) -> Readiness {
        if let Some(why) = self.readiness_file.as_ref().and_then(Indicator::not_ready) {
            return Readiness::NotReady(why);
        }
        let Some(k) = &self.kubernetes else {
            return Readiness::Ready;
        };
        if k.source.synced() {
            Readiness::Ready
        } else if Instant::now() < k.settle_by {
            Readiness::Starting(format!(
                "waiting for the Kubernetes caches (this node's pods and the \
                 NetworkAttachmentDefinitions) to sync{}",
                k.cause()
            ))
        } else {
            Readiness::Degraded(format!(
                "the Kubernetes caches have not synced; calls that need them are \
                 answered with code 11 (try again later){}",
                k.cause()
            ))
        }
    }

    async fn settle(&self) {
        if let Some(k) = &self.kubernetes {
            let left = k.settle_by.saturating_duration_since(Instant::now());
            if !k.source.wait_synced(left).await {
                tracing::warn!(
                    waited = %crate::duration::format(left),
                    cause = %k.source.watch_error().unwrap_or_default(),
                    "the Kubernetes caches did not sync in time; serving anyway"
                );
            }
        }
    }

    async fn cni(&self, request: api::Request) -> Result<Reply, Failure> {
        // The server already runs this in a task of its own that outlives
        // the client's connection.
        let meta = call_log::Meta::of(&request, false);
        call_log::logged(meta, self.serve(request)).await
    }

    async fn delegate(&self, request: api::Request) -> Result<Reply, Failure> {
        let meta = call_log::Meta::of(&request, true);
        call_log::logged(meta, self.serve_delegate(request)).await
    }

    async fn attachments(&self, container_id: String) -> Result<Option<Value>, Failure> {
        self.engine
            .attachments(&container_id)
            .await
            .map_err(failure)
    }
}

impl Networks {
    async fn serve(&self, request: api::Request) -> Result<Reply, Failure> {
        let invalid = |i: Invalid| {
            Failure::new(FailureKind::InvalidRequest, i.code, i.msg).with_details(i.details)
        };
        netconf::validate_env(request.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(invalid)?;
        let mut inv = Invocation::from_env(|k| request.env.get(k).cloned()).map_err(invalid)?;
        // PLEXUS_NETWORKS is ours: the plugins never see it (host-local,
        // for one, rejects unknown CNI_ARGS keys).
        let (requested, rest) = selection::take_from_args(&inv.arg_pairs).map_err(|e| {
            Failure::new(
                FailureKind::InvalidRequest,
                code::INVALID_ENVIRONMENT,
                e.to_string(),
            )
        })?;
        if rest.len() != inv.arg_pairs.len() {
            inv.args = rest
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(";");
            inv.arg_pairs = rest;
        }
        let config = parse_config(&request.config)?;
        // multus's overlay: the call's configuration may name networks
        // the daemon's leaves open.
        let cfg = self.selection.effective(&config).map_err(|e| {
            Failure::new(
                FailureKind::Failed,
                code::INVALID_NETWORK_CONFIG,
                e.to_string(),
            )
        })?;
        if matches!(inv.command, Command::Add | Command::Status | Command::Gc) {
            self.wait_for_readiness_file().await?;
        }
        match inv.command {
            Command::Add if self.kubernetes.is_some() => {
                let pod = k8s::PodRef::from_args(&inv.arg_pairs).map_err(|e| {
                    Failure::new(
                        FailureKind::InvalidRequest,
                        code::INVALID_ENVIRONMENT,
                        e.to_string(),
                    )
                })?;
                match (&self.kubernetes, pod) {
                    (Some(k), Some(pod)) => self.add_for_pod(k, &cfg, &inv, &pod, &config).await,
                    // Not a pod: the static networks.
                    _ => self.add_static(&cfg, &inv, &config, &requested).await,
                }
            }
            Command::Add => self.add_static(&cfg, &inv, &config, &requested).await,
            Command::Del => {
                let cap_args = capability_args(&config);
                // Called only when the container's record was damaged:
                // the networks a runtime without records would DEL.
                let configured = || self.plan(&cfg, &inv.ifname, &requested, &config);
                self.engine
                    .del(&inv, cap_args, configured)
                    .await
                    .map_err(failure)?;
                Ok(Reply::Done)
            }
            Command::Check => {
                self.engine.check(&inv).await.map_err(failure)?;
                Ok(Reply::Done)
            }
            Command::Status => {
                let list = self.cluster(&cfg).await?;
                self.engine.status(&list).await.map_err(failure)?;
                Ok(Reply::Done)
            }
            Command::Gc => {
                let valid = valid_attachments(&config)?;
                let mut lists = Vec::new();
                for list in self.configured_lists(&cfg).await {
                    lists.push(list.map_err(failure)?);
                }
                self.engine.gc(&valid, &lists).await.map_err(failure)?;
                Ok(Reply::Done)
            }
            // Refused by Invocation::from_env already; the plugin answers it.
            Command::Version => Err(Failure::new(
                FailureKind::InvalidRequest,
                code::INVALID_ENVIRONMENT,
                "VERSION is answered by the CNI plugin, not by the daemon",
            )),
        }
    }

    /// Waits (bounded) for the readiness indicator file, if one is
    /// configured; code 11 when it does not appear in time.
    async fn wait_for_readiness_file(&self) -> Result<(), Failure> {
        let Some(indicator) = &self.readiness_file else {
            return Ok(());
        };
        if indicator.wait().await {
            return Ok(());
        }
        Err(Failure::new(
            FailureKind::Unavailable,
            code::TRY_AGAIN_LATER,
            format!(
                "the readiness indicator file {} did not appear within {}; try again later",
                indicator.path().display(),
                crate::duration::format(indicator.timeout())
            ),
        ))
    }

    /// ADD of the static networks (and those the call asks for).
    async fn add_static(
        &self,
        cfg: &selection::Config,
        inv: &Invocation,
        config: &Map<String, Value>,
        requested: &[selection::Element],
    ) -> Result<Reply, Failure> {
        let planned = self
            .plan(cfg, &inv.ifname, requested, config)
            .await
            .map_err(failure)?;
        let added = self
            .engine
            .add_networks(inv, capability_args(config), planned)
            .await
            .map_err(failure)?;
        for a in &added {
            call_log::note(&a.name, &a.ifname, &a.result);
        }
        let res = &cni::AddedNetwork::primary(&added).map_err(failure)?.result;
        // Always the newest version, whatever the caller's config says:
        // multus-shim decodes the answer as 1.x and converts it itself,
        // and so does plexus-shim.
        let out = result::convert(res, result::LATEST)
            .map_err(|e| Failure::new(FailureKind::Failed, e.code(), e.to_string()))?;
        Ok(Reply::Result(out))
    }

    /// The networks a call for `ifname` gets (see [`selection::select`]),
    /// every one loaded before anything runs.
    async fn plan(
        &self,
        cfg: &selection::Config,
        ifname: &str,
        requested: &[selection::Element],
        config: &Map<String, Value>,
    ) -> Result<Vec<Planned>, cni::Error> {
        let selected = selection::select(cfg, ifname, requested).map_err(|e| {
            cni::Error::new(
                ErrorKind::Invalid,
                code::INVALID_NETWORK_CONFIG,
                e.to_string(),
            )
        })?;
        let mut planned = Vec::with_capacity(selected.len());
        for s in selected {
            let primary = s.is_primary();
            planned.push(Planned::new(
                self.load_selected(cfg, &s).await?,
                s.ifname,
                primary,
            ));
        }
        if let Some(aux) = self.aux_network(cfg, config, planned.len()).await? {
            planned.push(aux);
        }
        Ok(planned)
    }

    /// multus's auxiliary CNI chain as the last network of an ADD, when
    /// one is configured and has plugins: interface `net<position>`, the
    /// call's `cniVersion`, the call's capability arguments, no
    /// network-status entry (passthru shows no interface).
    async fn aux_network(
        &self,
        cfg: &selection::Config,
        config: &Map<String, Value>,
        position: usize,
    ) -> Result<Option<Planned>, cni::Error> {
        let Some(name) = &cfg.auxiliary_chain else {
            return Ok(None);
        };
        let version = config
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or(result::LATEST);
        let list = self
            .engine
            .aux_chain(&cfg.cluster_network, name, version)
            .await?;
        Ok(list.map(|l| Planned::new(l, format!("net{position}"), false)))
    }

    /// The cluster network: clusterNetwork, else the first delegate.
    async fn cluster(&self, cfg: &selection::Config) -> Result<NetworkList, Failure> {
        if cfg.cluster_network.is_empty() {
            return inline_network(cfg, 0).map_err(failure);
        }
        self.load_network(cfg, &cfg.cluster_network)
            .await
            .map_err(failure)
    }

    /// Every network of `cfg` attached before the requested ones:
    /// clusterNetwork and defaultNetworks, or the delegates.
    async fn configured_lists(
        &self,
        cfg: &selection::Config,
    ) -> Vec<Result<NetworkList, cni::Error>> {
        if cfg.cluster_network.is_empty() {
            return (0..cfg.delegates.len())
                .map(|i| inline_network(cfg, i))
                .collect();
        }
        let mut out = Vec::with_capacity(1 + cfg.default_networks.len());
        for name in std::iter::once(&cfg.cluster_network).chain(&cfg.default_networks) {
            out.push(self.load_network(cfg, name).await);
        }
        out
    }

    /// A selected network's configuration.
    async fn load_selected(
        &self,
        cfg: &selection::Config,
        s: &selection::Selected,
    ) -> Result<NetworkList, cni::Error> {
        match s.inline {
            Some(i) => inline_network(cfg, i),
            None => self.load_network(cfg, &s.network).await,
        }
    }

    /// A network by name (from the call's confDir, else the daemon's) or
    /// path.
    async fn load_network(
        &self,
        cfg: &selection::Config,
        network: &str,
    ) -> Result<NetworkList, cni::Error> {
        match &cfg.conf_dir {
            Some(dir) => self.engine.load_in(dir, network).await,
            None => self.engine.load(network).await,
        }
    }
}

/// The `i`th of multus's inline network configurations (`delegates`):
/// a list when it has `plugins`, else a single plugin.
fn inline_network(cfg: &selection::Config, i: usize) -> Result<NetworkList, cni::Error> {
    let invalid =
        |why: String| cni::Error::new(ErrorKind::Invalid, code::INVALID_NETWORK_CONFIG, why);
    let value = cfg
        .delegates
        .get(i)
        .ok_or_else(|| invalid(format!("delegates[{i}]: no such delegate")))?;
    let single = value.get("plugins").is_none();
    let label = format!("delegates[{i}]");
    NetworkList::from_value(std::path::Path::new(&label), value.clone(), single)
        .map_err(|e| invalid(e.to_string()))
}

/// The runtime's capability arguments (`runtimeConfig`), none when absent.
fn capability_args(config: &Map<String, Value>) -> Map<String, Value> {
    config
        .get("runtimeConfig")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

#[doc(hidden)]
pub fn parse_config(bytes: &[u8]) -> Result<Map<String, Value>, Failure> {
    if bytes.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Failure::new(
            FailureKind::InvalidRequest,
            code::DECODING_FAILURE,
            "the request's network configuration is not a JSON object",
        )),
        Err(e) => Err(Failure::new(
            FailureKind::InvalidRequest,
            code::DECODING_FAILURE,
            format!("the request's network configuration is not valid JSON: {e}"),
        )),
    }
}

/// The runtime's valid attachments for GC: `cni.dev/valid-attachments`
/// (or the older `cni.dev/attachments`); `null` means none. A GC without
/// either key is refused, since it would delete every attachment.
#[doc(hidden)]
pub fn valid_attachments(
    config: &Map<String, Value>,
) -> Result<BTreeSet<(String, String)>, Failure> {
    let bad = |why: String| {
        Failure::new(
            FailureKind::InvalidRequest,
            code::INVALID_NETWORK_CONFIG,
            why,
        )
    };
    let value = match (
        config.get("cni.dev/valid-attachments"),
        config.get("cni.dev/attachments"),
    ) {
        (Some(v), _) | (None, Some(v)) => v,
        (None, None) => {
            return Err(bad(
                "GC needs cni.dev/valid-attachments in the network configuration".into(),
            ))
        }
    };
    let mut set = BTreeSet::new();
    match value {
        Value::Null => {}
        Value::Array(items) => {
            for item in items {
                let id = item.get("containerID").and_then(Value::as_str);
                let ifname = item.get("ifname").and_then(Value::as_str);
                match (id, ifname) {
                    (Some(id), Some(ifname)) => {
                        set.insert((id.to_string(), ifname.to_string()));
                    }
                    _ => {
                        return Err(bad(format!(
                            "cni.dev/valid-attachments: entry {item} needs containerID and ifname"
                        )))
                    }
                }
            }
        }
        other => {
            return Err(bad(format!(
                "cni.dev/valid-attachments must be a list, found {other}"
            )))
        }
    }
    Ok(set)
}

fn failure(e: cni::Error) -> Failure {
    let kind = match e.kind {
        ErrorKind::Invalid => FailureKind::InvalidRequest,
        ErrorKind::Failed => FailureKind::Failed,
        ErrorKind::Internal => FailureKind::Internal,
    };
    Failure::new(kind, e.code, e.msg).with_details(e.details)
}
