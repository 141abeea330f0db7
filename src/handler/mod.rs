//! The request handler that joins the server to the other parts: turns a
//! wire request into a validated invocation, has its networks planned
//! (`selection`), has the engine carry the plan out (`cni`), has what the
//! pod is to learn published (`k8s`), and answers ADD with the 1.1.0
//! result (the shim converts it to its own config's version, as
//! multus-shim does).
//!
//! - `kube.rs`: ADD for a pod; `plan.rs`: plans as the engine carries them
//!   out, and an ADD's answer; `status.rs`: STATUS; `delegate.rs`:
//!   `/delegate` (hot-plug).
//! - `configs.rs`: a call's network configurations as selection asks for
//!   them; `source.rs`: the Kubernetes source and its start-up window;
//!   `failure.rs`: each part's error as the answer's; `call_log.rs`: one
//!   log line per call.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::api::{self, code, Command};
use crate::cni::{self, plan::Plan, Engine};
use crate::k8s::{self, publish::Pending};
use crate::netconf::{self, Invalid, Invocation};
use crate::readiness_file::Indicator;
use crate::selection::{self, overlay::Overlay};
use crate::server::{Failure, FailureKind, Handler, Readiness, Reply};

mod call_log;
mod configs;
mod delegate;
mod failure;
mod kube;
mod plan;
mod source;
mod status;

use crate::op_thread::OpThreads;
use failure::{bad_config, bad_env, failure};
use source::Kubernetes;

/// Serves `/cni` and `/delegate` with the engine, the static network
/// configuration and, when configured, the Kubernetes source: the
/// server's [`Handler`] for CNI calls.
#[derive(Debug, Clone)]
pub struct CniHandler {
    engine: Arc<Engine>,
    /// The daemon's networks and the keys a call's configuration may set.
    selection: Arc<Overlay>,
    kubernetes: Option<Arc<Kubernetes>>,
    /// The readiness indicator file ADD, STATUS and GC wait for.
    readiness_file: Option<Indicator>,
    /// The runtime GC asks which sandboxes exist (it never sweeps theirs).
    runtime: Option<Runtime>,
    /// The bound on CNI calls that run on threads of their own.
    ops: OpThreads,
}

/// The runtime's CRI socket, the bound of one call to it, and how young a
/// record must be for GC to keep it unasked (`reconcileGrace`).
#[derive(Debug, Clone)]
struct Runtime {
    socket: std::path::PathBuf,
    timeout: Duration,
    grace: Duration,
}

impl CniHandler {
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
            runtime: None,
            ops: OpThreads::default(),
            kubernetes: kubernetes
                .map(|source| Arc::new(Kubernetes::new(source, sync_timeout, queue_timeout))),
        }
    }

    /// Makes GC keep the containers the runtime at CRI `socket` lists,
    /// and those whose record is younger than `grace` (see [`cni::Live`]);
    /// `timeout` bounds the CRI call.
    pub fn with_runtime(
        mut self,
        socket: std::path::PathBuf,
        timeout: Duration,
        grace: Duration,
    ) -> Self {
        self.runtime = Some(Runtime {
            socket,
            timeout,
            grace,
        });
        self
    }

    /// What GC must keep, when the runtime's CRI socket is known (nothing
    /// otherwise); a runtime that cannot be asked fails GC with "try
    /// again later": sweeping without knowing could take a live pod's
    /// networks.
    async fn live_containers(&self) -> Result<cni::Live, Failure> {
        let Some(rt) = &self.runtime else {
            return Ok(cni::Live::default());
        };
        match crate::cri::list_sandboxes(&rt.socket, rt.timeout).await {
            Ok(listing) => Ok(cni::Live {
                ids: listing.sandboxes.into_iter().map(|s| s.id).collect(),
                grace: Some(rt.grace),
            }),
            Err(e) => Err(Failure::new(
                FailureKind::Failed,
                code::TRY_AGAIN_LATER,
                format!(
                    "GC swept nothing: the runtime's sandboxes could not be listed at {}: {}",
                    rt.socket.display(),
                    crate::causes::chain(&e)
                ),
            )),
        }
    }

    /// Makes ADD, STATUS and GC wait for the readiness indicator file.
    pub fn with_readiness_file(mut self, indicator: Indicator) -> Self {
        self.readiness_file = Some(indicator);
        self
    }

    /// For a drain, once no call is served any more: waits, at most
    /// `within`, for what Kubernetes is still to learn of earlier ADDs
    /// (network-status writes being retried, events being posted); what
    /// is left is logged (how many, for which pods) and returned (see
    /// [`k8s::publish::Publisher::finish`]). Nothing without Kubernetes.
    pub async fn finish_publishing(&self, within: Duration) -> Pending {
        match &self.kubernetes {
            Some(k) => k.publisher.finish(within).await,
            None => Pending::default(),
        }
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

    /// [`CniHandler::preflight`]'s problems, each saying whether the
    /// network itself could not be loaded or its plugins are at fault.
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

impl Handler for CniHandler {
    fn readiness(&self) -> Readiness {
        if let Some(why) = self.readiness_file.as_ref().and_then(Indicator::not_ready) {
            return Readiness::NotReady(why);
        }
        match &self.kubernetes {
            Some(k) => k.readiness(),
            None => Readiness::Ready,
        }
    }

    async fn settle(&self) {
        if let Some(k) = &self.kubernetes {
            k.settle().await;
        }
    }

    async fn cni(&self, request: api::Request) -> Result<Reply, Failure> {
        // The server already runs this in a task of its own that outlives
        // the client's connection; the call itself runs on a thread of its
        // own when one is free (see `op_thread`).
        let meta = call_log::Meta::of(&request, false);
        let this = self.clone();
        self.ops
            .run(async move { call_log::logged(meta, this.serve(request)).await })
            .await
    }

    fn cut_off(&self) {
        self.ops.stop();
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

    async fn finish(&self, within: Duration) {
        self.finish_publishing(within).await;
    }
}

/// A `/cni` request, validated.
struct Call {
    inv: Invocation,
    /// The networks the call asks for (`PLEXUS_NETWORKS`).
    requested: Vec<selection::Element>,
    /// The call's network configuration.
    config: Map<String, Value>,
    /// The selection configuration in effect for it.
    cfg: Arc<selection::Config>,
}

impl CniHandler {
    async fn serve(&self, request: api::Request) -> Result<Reply, Failure> {
        let Call {
            inv,
            requested,
            config,
            cfg,
        } = self.call(&request)?;
        if matches!(inv.command, Command::Add | Command::Status | Command::Gc) {
            self.wait_for_readiness_file().await?;
        }
        match inv.command {
            Command::Add => match self.pod_of(&inv)? {
                Some((k, pod)) => self.add_for_pod(k, &cfg, &inv, &pod, &config).await,
                // Not a pod: the static networks.
                None => self.add_static(&cfg, &inv, &config, &requested).await,
            },
            Command::Del => self.del(&cfg, &inv, &config, &requested).await,
            Command::Check => {
                self.engine.check(&inv).await.map_err(failure)?;
                Ok(Reply::Done)
            }
            Command::Status => self.status(&cfg, &config).await,
            Command::Gc => {
                let valid = valid_attachments(&config)?;
                let live = self.live_containers().await?;
                let mut lists = Vec::new();
                for list in self.configured_lists(&cfg).await {
                    lists.push(list.map_err(failure)?);
                }
                // For every container the runtime still has, the plugins
                // keep what a DEL without a record would free, even when
                // its record cannot be read.
                let (cfg, requested, config) = (&*cfg, &requested[..], &config);
                let fallback = move |ifname: String| async move {
                    self.del_fallback(cfg, &ifname, requested, config).await
                };
                self.engine
                    .gc_keeping(&valid, &live, &lists, fallback)
                    .await
                    .map_err(failure)?;
                Ok(Reply::Done)
            }
            // Refused by Invocation::from_env already; the plugin answers it.
            Command::Version => Err(bad_env(
                "VERSION is answered by the CNI plugin, not by the daemon",
            )),
        }
    }

    /// The request as a call: its environment checked, `PLEXUS_NETWORKS`
    /// taken out of its CNI_ARGS (the plugins never see it: host-local,
    /// for one, rejects unknown keys), its configuration parsed and laid
    /// over the daemon's (multus's overlay: the call's configuration may
    /// name networks the daemon's leaves open).
    fn call(&self, request: &api::Request) -> Result<Call, Failure> {
        let invalid = |i: Invalid| {
            Failure::new(FailureKind::InvalidRequest, i.code, i.msg).with_details(i.details)
        };
        netconf::validate_env(request.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(invalid)?;
        let mut inv = Invocation::from_env(|k| request.env.get(k).cloned()).map_err(invalid)?;
        let (requested, rest) =
            selection::take_from_args(&inv.arg_pairs).map_err(|e| bad_env(e.to_string()))?;
        if rest.len() != inv.arg_pairs.len() {
            inv.args = rest
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(";");
            inv.arg_pairs = rest;
        }
        let config = parse_config(&request.config)?;
        let cfg = self
            .selection
            .effective(&config)
            .map_err(|e| bad_config(e.to_string()))?;
        Ok(Call {
            inv,
            requested,
            config,
            cfg,
        })
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
        Err(failure::unavailable(format!(
            "the readiness indicator file {} did not appear within {}; try again later",
            indicator.path().display(),
            crate::duration::format(indicator.timeout())
        )))
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
        // No selection element, so no default route asked: never ECMP.
        let plan = Plan::new(planned.into_iter().map(cni::plan::Network::new).collect())
            .map_err(|e| bad_config(e.to_string()))?;
        let attached = self
            .engine
            .carry_out(inv, capability_args(config), plan)
            .await
            .map_err(failure)?;
        plan::answer(&attached)
    }

    /// With a Kubernetes source, the pod the call's CNI_ARGS name, if
    /// any.
    fn pod_of(&self, inv: &Invocation) -> Result<Option<(&Kubernetes, k8s::PodRef)>, Failure> {
        let Some(k) = &self.kubernetes else {
            return Ok(None);
        };
        let pod = k8s::PodRef::from_args(&inv.arg_pairs).map_err(|e| bad_env(e.to_string()))?;
        Ok(pod.map(|p| (k.as_ref(), p)))
    }

    /// DEL of the attachment the call names, from its record; the networks
    /// it removed are noted for the call's log line, as they were recorded
    /// when the DEL found them.
    async fn del(
        &self,
        cfg: &selection::Config,
        inv: &Invocation,
        config: &Map<String, Value>,
        requested: &[selection::Element],
    ) -> Result<Reply, Failure> {
        // Called only when the container's record was damaged.
        let configured = || self.del_fallback(cfg, &inv.ifname, requested, config);
        let shown = self
            .engine
            .del_shown(inv, capability_args(config), configured)
            .await
            .map_err(failure)?;
        if let Some(shown) = shown {
            call_log::note_removed(&shown, &inv.ifname);
        }
        Ok(Reply::Done)
    }

    /// The networks a DEL of `ifname` runs when the container's record was
    /// damaged: those a runtime without records would DEL, the configured
    /// ones. GC lists their interfaces as valid for every container the
    /// runtime still has, so that the plugins' GC keeps what this DEL
    /// would free.
    async fn del_fallback(
        &self,
        cfg: &selection::Config,
        ifname: &str,
        requested: &[selection::Element],
        config: &Map<String, Value>,
    ) -> Result<Vec<cni::Planned>, cni::Error> {
        self.plan(cfg, ifname, requested, config).await
    }
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
