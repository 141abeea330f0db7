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
use crate::cni::types::{self, Invalid, Invocation};
use crate::cni::{self, Engine, ErrorKind, Planned};
use crate::k8s;

mod delegate;
mod kube;
mod routes_in_pod;
use crate::result;
use crate::selection;
use crate::server::{Failure, FailureKind, Handler, Readiness, Reply};

/// Answers every CNI request with "no networks are configured" until the
/// engine is configured.
#[derive(Debug, Default)]
pub struct Unconfigured;

impl Handler for Unconfigured {
    async fn cni(&self, _request: api::Request) -> Result<Reply, Failure> {
        Err(Failure::new(
            FailureKind::Failed,
            code::INVALID_NETWORK_CONFIG,
            "no networks are configured: set clusterNetwork in the daemon configuration",
        ))
    }

    async fn delegate(&self, request: api::Request) -> Result<Reply, Failure> {
        self.cni(request).await
    }
}

/// Serves `/cni` with the engine, the static network configuration and,
/// when configured, the Kubernetes source.
#[derive(Debug, Clone)]
pub struct Networks {
    engine: Arc<Engine>,
    selection: Arc<selection::Config>,
    kubernetes: Option<Arc<Kubernetes>>,
}

/// The Kubernetes source and how long start-up waits for it.
#[derive(Debug)]
struct Kubernetes {
    source: k8s::Source,
    /// Until then, unsynced caches mean "starting"; after, "degraded".
    settle_by: Instant,
}

impl Networks {
    pub fn new(
        engine: Arc<Engine>,
        selection: selection::Config,
        kubernetes: Option<k8s::Source>,
        sync_timeout: Duration,
    ) -> Self {
        Self {
            engine,
            selection: Arc::new(selection),
            kubernetes: kubernetes.map(|source| {
                Arc::new(Kubernetes {
                    source,
                    settle_by: Instant::now() + sync_timeout,
                })
            }),
        }
    }

    /// Loads every configured network and locates its plugins, so that a
    /// broken setup shows in the log at start-up rather than on the first
    /// ADD. Networks are still read on every call (files may appear
    /// later), so this only warns; it returns the problems found.
    pub async fn preflight(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let names = std::iter::once(&self.selection.cluster_network)
            .chain(self.selection.default_networks.iter());
        for name in names {
            match self.engine.load(name).await {
                Ok(list) => {
                    if let Err(e) = self.engine.check_plugins(&list).await {
                        problems.push(e.msg);
                    }
                }
                Err(e) => problems.push(e.msg),
            }
        }
        problems
    }
}

impl Handler for Networks {
    fn readiness(&self) -> Readiness {
        let Some(k) = &self.kubernetes else {
            return Readiness::Ready;
        };
        if k.source.synced() {
            Readiness::Ready
        } else if Instant::now() < k.settle_by {
            Readiness::Starting(
                "waiting for the Kubernetes caches (this node's pods and the \
                 NetworkAttachmentDefinitions) to sync"
                    .into(),
            )
        } else {
            Readiness::Degraded(
                "the Kubernetes caches have not synced; calls that need them are \
                 answered with code 11 (try again later)"
                    .into(),
            )
        }
    }

    async fn settle(&self) {
        if let Some(k) = &self.kubernetes {
            let left = k.settle_by.saturating_duration_since(Instant::now());
            if !k.source.wait_synced(left).await {
                tracing::warn!(
                    waited = %crate::duration::format(left),
                    "the Kubernetes caches did not sync in time; serving anyway"
                );
            }
        }
    }

    async fn cni(&self, request: api::Request) -> Result<Reply, Failure> {
        // The server already runs this in a task of its own that outlives
        // the client's connection.
        self.serve(request).await
    }

    async fn delegate(&self, request: api::Request) -> Result<Reply, Failure> {
        self.serve_delegate(request).await
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
        types::validate_env(request.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
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
                    (Some(k), Some(pod)) => self.add_for_pod(k, &inv, &pod, &config).await,
                    // Not a pod: the static networks.
                    _ => self.add_static(&inv, &config, &requested).await,
                }
            }
            Command::Add => self.add_static(&inv, &config, &requested).await,
            Command::Del => {
                let cap_args = capability_args(&config);
                // Called only when the container's record was damaged:
                // the networks a runtime without records would DEL.
                let configured = || self.plan(&inv.ifname, &requested, &config);
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
                let list = self.cluster().await?;
                self.engine.status(&list).await.map_err(failure)?;
                Ok(Reply::Done)
            }
            Command::Gc => {
                let valid = valid_attachments(&config)?;
                let mut lists = vec![self.cluster().await?];
                for net in &self.selection.default_networks {
                    lists.push(self.engine.load(net).await.map_err(failure)?);
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

    /// ADD of the static networks (and those the call asks for).
    async fn add_static(
        &self,
        inv: &Invocation,
        config: &Map<String, Value>,
        requested: &[selection::Element],
    ) -> Result<Reply, Failure> {
        let planned = self
            .plan(&inv.ifname, requested, config)
            .await
            .map_err(failure)?;
        let res = self
            .engine
            .add(inv, capability_args(config), planned)
            .await
            .map_err(failure)?;
        // Always the newest version, whatever the caller's config says:
        // multus-shim decodes the answer as 1.x and converts it itself,
        // and so does plexus-shim.
        let out = result::convert(&res, result::LATEST)
            .map_err(|e| Failure::new(FailureKind::Failed, e.code(), e.to_string()))?;
        Ok(Reply::Result(out))
    }

    /// The networks a call for `ifname` gets (see [`selection::select`]),
    /// every one loaded before anything runs.
    async fn plan(
        &self,
        ifname: &str,
        requested: &[selection::Element],
        config: &Map<String, Value>,
    ) -> Result<Vec<Planned>, cni::Error> {
        let selected = selection::select(&self.selection, ifname, requested).map_err(|e| {
            cni::Error::new(
                ErrorKind::Invalid,
                code::INVALID_NETWORK_CONFIG,
                e.to_string(),
            )
        })?;
        let mut planned = Vec::with_capacity(selected.len());
        for s in selected {
            planned.push(Planned::new(
                self.engine.load(&s.network).await?,
                s.ifname,
                s.primary,
            ));
        }
        if let Some(aux) = self.aux_network(config, planned.len()).await? {
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
        config: &Map<String, Value>,
        position: usize,
    ) -> Result<Option<Planned>, cni::Error> {
        let Some(name) = &self.selection.auxiliary_chain else {
            return Ok(None);
        };
        let version = config
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or(result::LATEST);
        let list = self
            .engine
            .aux_chain(&self.selection.cluster_network, name, version)
            .await?;
        Ok(list.map(|l| Planned::new(l, format!("net{position}"), false)))
    }

    async fn cluster(&self) -> Result<cni::types::NetworkList, Failure> {
        self.engine
            .load(&self.selection.cluster_network)
            .await
            .map_err(failure)
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

fn failure(e: cni::Error) -> Failure {
    let kind = match e.kind {
        ErrorKind::Invalid => FailureKind::InvalidRequest,
        ErrorKind::Failed => FailureKind::Failed,
        ErrorKind::Internal => FailureKind::Internal,
    };
    Failure::new(kind, e.code, e.msg).with_details(e.details)
}
