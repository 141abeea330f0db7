//! ADD for a Kubernetes pod: its networks come from the static
//! configuration, its annotations and the NetworkAttachmentDefinitions
//! (through the same selection as static calls), and after the plugins ran
//! the pod's `network-status` annotation is written with one API call.

use std::net::IpAddr;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::{failure, Kubernetes, Networks};
use crate::api::code;
use crate::cni::default_route::{self, Marks};
use crate::cni::{self, Planned};
use crate::device_info;
use crate::k8s::{self, status, PodInfo, PodRef};
use crate::netconf::{ConfigError, Invocation, NetworkList};
use crate::result;
use crate::selection::{self, pod};
use crate::server::{Failure, FailureKind, Reply};

fn unavailable(msg: impl Into<String>) -> Failure {
    Failure::new(FailureKind::Unavailable, code::TRY_AGAIN_LATER, msg)
}

fn bad_config(msg: impl Into<String>) -> Failure {
    Failure::new(FailureKind::Failed, code::INVALID_NETWORK_CONFIG, msg)
}

fn api_failure(pod: &PodRef, e: k8s::Error) -> Failure {
    let prefix = format!("pod {}/{}", pod.namespace, pod.name);
    let msg = format!("{prefix}: {}", crate::causes::chain(&e));
    match e {
        k8s::Error::UidMismatch { .. } => Failure::new(
            FailureKind::Failed,
            code::INVALID_ENVIRONMENT,
            format!("{prefix}: {e}"),
        ),
        e if e.is_transient() => unavailable(format!("{msg}; try again later")),
        _ => Failure::new(FailureKind::Failed, code::INTERNAL, msg),
    }
}

/// A pod's networks that cannot be planned: a kubelet that did not answer
/// is worth a retry, one whose answer is unusable is not; a configured
/// network keeps the engine's error; everything else is the pod's or a
/// NAD's configuration.
fn plan_failure(e: pod::Error<cni::Error>) -> Failure {
    match e {
        pod::Error::Load(e) => failure(e),
        e if e.is_transient() => unavailable(format!("{e}; try again later")),
        e @ pod::Error::Devices { .. } => {
            Failure::new(FailureKind::Failed, code::INTERNAL, e.to_string())
        }
        e => bad_config(e.to_string()),
    }
}

/// The engine's network configurations for one call, as pod planning asks
/// for them: the engine owns the confDir lookups (and their cache), the
/// call's configuration the confDir and the inline delegates.
struct CallConfigs<'a> {
    networks: &'a Networks,
    cfg: &'a selection::Config,
}

impl pod::Configs for CallConfigs<'_> {
    type Error = cni::Error;

    async fn load_network(&self, name: &str) -> Result<NetworkList, ConfigError> {
        self.networks
            .load_network(self.cfg, name)
            .await
            .map_err(|e| ConfigError::File {
                file: "confDir".into(),
                why: e.msg,
            })
    }

    async fn load_selected(&self, s: &selection::Selected) -> Result<NetworkList, cni::Error> {
        self.networks.load_selected(self.cfg, s).await
    }
}

impl Networks {
    /// ADD for `pod`: a pod that is gone gets multus's placeholder result
    /// and nothing else; otherwise its networks are attached and its
    /// `network-status` written.
    pub(super) async fn add_for_pod(
        &self,
        k: &Kubernetes,
        cfg: &selection::Config,
        inv: &Invocation,
        pod_ref: &PodRef,
        config: &Map<String, Value>,
    ) -> Result<Reply, Failure> {
        let cap_args = super::capability_args(config);
        if !k.source.synced() {
            // A cold daemon (started by the first call after a reboot)
            // gets pods before its caches have listed: wait for them,
            // bounded, rather than send every pod into the runtime's
            // back-off.
            let bound = k.add_wait_now();
            let started = std::time::Instant::now();
            let synced = k.source.wait_synced(bound).await;
            let waited = crate::duration::format(started.elapsed());
            if !synced {
                return Err(unavailable(format!(
                    "the Kubernetes caches (pods, NetworkAttachmentDefinitions) have not synced \
                     (waited {waited}){}; try again later",
                    k.cause()
                )));
            }
            tracing::info!(container_id = %inv.container_id, waited = %waited, "ADD waited for the Kubernetes caches to sync");
        }
        let pod = match k
            .source
            .pod(&pod_ref.namespace, &pod_ref.name, pod_ref.uid())
            .await
        {
            Ok(Some(p)) => p,
            Ok(None) => {
                // As multus: the pod is gone, so its sandbox is about to
                // go too; nothing is attached and nothing recorded.
                tracing::info!(namespace = %pod_ref.namespace, pod = %pod_ref.name, container_id = %inv.container_id, "the pod does not exist: nothing attached");
                let placeholder = status::pod_missing_result(&inv.ifname, &inv.netns);
                let value = serde_json::to_value(&placeholder).map_err(|e| {
                    Failure::new(FailureKind::Internal, code::INTERNAL, e.to_string())
                })?;
                return Ok(Reply::Result(value));
            }
            Err(e) => return Err(api_failure(pod_ref, e)),
        };
        let request = pod::Request {
            pod: pod::Pod {
                namespace: &pod.namespace,
                name: &pod.name,
                uid: &pod.uid,
                annotations: &pod.annotations,
            },
            container_id: &inv.container_id,
            ifname: &inv.ifname,
            runtime_uid: pod_ref.uid.as_deref(),
            infra_container_id: pod_ref.infra_container_id.as_deref(),
            capability_args: &cap_args,
            device_info_dir: k.source.device_info_dir(),
        };
        let configs = CallConfigs {
            networks: self,
            cfg,
        };
        let networks = match pod::plan(cfg, &request, &k.source, &configs).await {
            Ok(n) => n,
            Err(e) => {
                if matches!(e, pod::Error::Nad(selection::nad::Error::NotFound { .. })) {
                    k.source.pod_event(
                        &pod,
                        k8s::events::REASON_NO_NETWORK,
                        k8s::events::Kind::Warning,
                        e.to_string(),
                    );
                }
                return Err(plan_failure(e));
            }
        };
        let aux = self
            .aux_network(cfg, config, networks.len())
            .await
            .map_err(failure)?;
        // Before anything runs: an ECMP request fails the ADD (the
        // auxiliary chain requests no default route).
        let requests: Vec<Option<&[IpAddr]>> = networks
            .iter()
            .map(|n| n.default_route.as_deref())
            .chain(aux.as_ref().map(|_| None))
            .collect();
        let marks = default_route::plan(&requests)
            .map_err(|e| bad_config(format!("pod {}/{}: {e}", pod_ref.namespace, pod_ref.name)))?;
        let mut display: Vec<String> = networks.iter().map(|n| n.display_name.clone()).collect();
        let copies: Vec<(PathBuf, PathBuf)> = networks
            .iter()
            .filter_map(|n| n.copy_device_info.clone())
            .collect();
        let mut planned: Vec<Planned> = networks.into_iter().map(planned).collect();
        if let Some(mut aux) = aux {
            aux.cni_args = planned.first().and_then(|n| n.cni_args.clone());
            display.push(aux.list.name.clone());
            planned.push(aux);
        }
        if !copies.is_empty() {
            copy_device_info(copies).await;
        }
        let info_files: Vec<Option<PathBuf>> = planned
            .iter()
            .map(|p| device_info_file(k.source.device_info_dir(), p))
            .collect();
        let added = self
            .engine
            .add_networks(inv, cap_args, planned)
            .await
            .map_err(failure)?;
        let device_info = load_device_info(info_files).await;
        if let Some(marks) = marks {
            set_default_routes(inv, &marks, &added).await?;
        }
        let mut entries = Vec::new();
        for (a, name) in added.iter().zip(&display) {
            super::call_log::note(name, &a.ifname, &a.result);
        }
        for ((a, name), info) in added.iter().zip(&display).zip(&device_info) {
            match status::entries_from_value(name, &a.result, a.primary, info.as_ref()) {
                Ok(e) => entries.extend(e),
                Err(e) => {
                    tracing::warn!(network = %name, cause = %e, "a result cannot be shown in network-status")
                }
            }
        }
        // As multus: nothing to show leaves the annotation as it was.
        if !entries.is_empty() {
            self.write_status(k, &pod, status::annotation(&entries))
                .await
                .map_err(|e| api_failure(pod_ref, e))?;
            // One event for the whole ADD, in the background.
            k.source.pod_event(
                &pod,
                k8s::events::REASON_ADDED,
                k8s::events::Kind::Normal,
                k8s::events::added_message(&entries),
            );
        }
        let primary = cni::AddedNetwork::primary(&added).map_err(failure)?;
        let out = result::convert(&primary.result, result::LATEST)
            .map_err(|e| Failure::new(FailureKind::Failed, e.code(), e.to_string()))?;
        Ok(Reply::Result(out))
    }
}

/// A planned network as the engine runs it.
fn planned(n: pod::Network) -> Planned {
    let mut planned = Planned::new(n.list, n.ifname, n.primary);
    planned.cni_args = Some(n.cni_args);
    planned.capability_args = n.capability_args;
    planned
}

/// A network's device-info file, when its capability arguments name one
/// in the device-info directory.
fn device_info_file(dir: &std::path::Path, planned: &Planned) -> Option<PathBuf> {
    let file = planned
        .capability_args
        .as_ref()?
        .get("CNIDeviceInfoFile")?
        .as_str()?;
    let path = PathBuf::from(file);
    device_info::is_cni_file(dir, &path).then_some(path)
}

/// Copies device plugins' device-info files to the networks' (before the
/// plugins run). As multus, a failure is only logged: the plugin may
/// write the file itself.
async fn copy_device_info(copies: Vec<(PathBuf, PathBuf)>) {
    let done = tokio::task::spawn_blocking(move || {
        for (from, to) in copies {
            if let Err(e) = device_info::copy_from_dp(&from, &to) {
                tracing::warn!(from = %from.display(), to = %to.display(), cause = %e, "cannot copy a device plugin's device-info file");
            }
        }
    })
    .await;
    if let Err(e) = done {
        tracing::warn!(cause = %e, "copying device-info files failed");
    }
}

/// The networks' device-info, read after the plugins ran (a plugin may
/// have written or completed the file).
async fn load_device_info(files: Vec<Option<PathBuf>>) -> Vec<Option<device_info::DeviceInfo>> {
    let n = files.len();
    if files.iter().all(Option::is_none) {
        return vec![None; n];
    }
    tokio::task::spawn_blocking(move || {
        files
            .iter()
            .map(|f| f.as_deref().and_then(device_info::load))
            .collect()
    })
    .await
    .unwrap_or_else(|_| vec![None; n])
}

/// multus's `default-route` handling after a pod's networks were attached
/// (see [`default_route`]): the default routes of every attached network
/// are removed in the pod and the requested ones added. The result given
/// to the runtime is not changed.
///
/// A failure fails the ADD without rollback, as in multus: the
/// attachments and their records stay, so the runtime's DEL (which follows
/// a failed ADD) runs every network's DEL from those records, which
/// removes the interfaces (and with them every route via them) and
/// releases the addresses; DEL itself never looks at routes.
async fn set_default_routes(
    inv: &Invocation,
    marks: &[Marks],
    added: &[cni::AddedNetwork],
) -> Result<(), Failure> {
    let actions = default_route::actions(marks.iter().zip(added).map(|(m, a)| {
        (
            m,
            a.ifname.as_str(),
            default_route::shows_attachment(&a.result),
        )
    }));
    if !actions.is_empty() {
        tracing::info!(container_id = %inv.container_id, netns = %inv.netns, changes = ?actions, "default-route: changing the pod's default routes");
    }
    default_route::apply(&inv.netns, actions, default_route::COMMAND_TIMEOUT)
        .await
        .map_err(|e| {
            tracing::warn!(container_id = %inv.container_id, cause = %e, "default-route handling failed; the attachments stay for the runtime's DEL");
            Failure::new(
                FailureKind::Failed,
                code::INTERNAL,
                format!("default-route: {e}"),
            )
        })
}

/// Attempts of a network-status write the API server could not take at
/// ADD time, and the pause before the first retry (doubling after each).
const STATUS_RETRIES: u32 = 6;
const STATUS_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(500);

impl Networks {
    /// Writes `text` as the pod's network-status. Unlike multus, an API
    /// server that is away or slow does not fail the pod: its networks
    /// are attached, so the ADD succeeds and the write is retried in the
    /// background (about 30 s, then given up with a warning). A pod that
    /// is gone is left alone. A refusal that will not change (a pod
    /// recreated under the name, missing permissions) fails the ADD; the
    /// attachment stays recorded, so the runtime's DEL removes it.
    async fn write_status(
        &self,
        k: &Kubernetes,
        pod: &PodInfo,
        text: String,
    ) -> Result<(), k8s::Error> {
        match k.source.set_network_status(pod, &text).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => {
                tracing::info!(namespace = %pod.namespace, pod = %pod.name, "the pod is gone; network-status not written");
                Ok(())
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(namespace = %pod.namespace, pod = %pod.name, cause = %e, "cannot write network-status now; the networks are attached and the write is retried in the background");
                if let Some(k) = self.kubernetes.clone() {
                    let pod = pod.clone();
                    tokio::spawn(async move { retry_status(&k, &pod, &text).await });
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

async fn retry_status(k: &Kubernetes, pod: &PodInfo, text: &str) {
    let mut pause = STATUS_RETRY_FIRST;
    for attempt in 1..=STATUS_RETRIES {
        tokio::time::sleep(pause).await;
        pause *= 2;
        match k.source.set_network_status(pod, text).await {
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
