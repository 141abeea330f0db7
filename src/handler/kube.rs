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
use crate::k8s::devices::{self, Devices};
use crate::k8s::{self, status, PodInfo, PodRef};
use crate::netconf::{self, Invocation, NetworkList};
use crate::result;
use crate::selection::{self, annotation, nad, runtime_config};
use crate::server::{Failure, FailureKind, Reply};

/// One network of a pod's ADD: how the engine runs it, the name
/// network-status shows and its selection element's `default-route`.
struct PodNetwork {
    planned: Planned,
    display_name: String,
    default_route: Option<Vec<IpAddr>>,
    /// The device plugin's device-info file to copy to the network's
    /// before its plugin runs (`dp` → `cni`).
    copy_device_info: Option<(PathBuf, PathBuf)>,
}

/// A NAD's network as [`Networks::nad_network`] resolves it.
struct NadNetwork {
    list: NetworkList,
    display_name: String,
    /// The NAD's `resourceName` and the device it took, if any.
    device: Option<(String, String)>,
}

/// The pod's devices (from the kubelet), asked for at most once per ADD
/// and only when a network names a resource.
struct PodDevices<'a> {
    pod: &'a PodInfo,
    devices: Option<Devices>,
}

impl PodDevices<'_> {
    async fn take(&mut self, k: &Kubernetes, resource: &str) -> Result<Option<String>, Failure> {
        if self.devices.is_none() {
            let found = k
                .source
                .devices()
                .pod_devices(&self.pod.namespace, &self.pod.name, &self.pod.uid)
                .await
                .map_err(|e| {
                    let msg = format!(
                        "pod {}/{}: the devices of resource {resource:?}: {e}",
                        self.pod.namespace, self.pod.name
                    );
                    match e {
                        devices::Error::Timeout { .. } | devices::Error::Connect { .. } => {
                            unavailable(format!("{msg}; try again later"))
                        }
                        _ => Failure::new(FailureKind::Failed, code::INTERNAL, msg),
                    }
                })?;
            self.devices = Some(found);
        }
        Ok(self.devices.as_mut().and_then(|d| d.take(resource)))
    }
}

fn unavailable(msg: impl Into<String>) -> Failure {
    Failure::new(FailureKind::Unavailable, code::TRY_AGAIN_LATER, msg)
}

fn bad_config(msg: impl Into<String>) -> Failure {
    Failure::new(FailureKind::Failed, code::INVALID_NETWORK_CONFIG, msg)
}

fn api_failure(pod: &PodRef, e: k8s::Error) -> Failure {
    let msg = format!("pod {}/{}: {e}", pod.namespace, pod.name);
    let mut chain = String::new();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        chain.push_str(&format!(": {s}"));
        source = s.source();
    }
    match e {
        k8s::Error::UidMismatch { .. } => {
            Failure::new(FailureKind::Failed, code::INVALID_ENVIRONMENT, msg)
        }
        e if e.is_transient() => unavailable(format!("{msg}{chain}; try again later")),
        _ => Failure::new(FailureKind::Failed, code::INTERNAL, format!("{msg}{chain}")),
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
            return Err(unavailable(
                "the Kubernetes caches (pods, NetworkAttachmentDefinitions) have not synced \
                 yet; try again later",
            ));
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
        let mut networks = self
            .pod_networks(k, cfg, inv, pod_ref, &pod, &cap_args)
            .await?;
        if let Some(mut aux) = self
            .aux_network(cfg, config, networks.len())
            .await
            .map_err(failure)?
        {
            aux.cni_args = networks.first().and_then(|n| n.planned.cni_args.clone());
            networks.push(PodNetwork {
                display_name: aux.list.name.clone(),
                planned: aux,
                default_route: None,
                copy_device_info: None,
            });
        }
        // Before anything runs: an ECMP request fails the ADD.
        let requests: Vec<Option<&[IpAddr]>> = networks
            .iter()
            .map(|n| n.default_route.as_deref())
            .collect();
        let marks = default_route::plan(&requests)
            .map_err(|e| bad_config(format!("pod {}/{}: {e}", pod_ref.namespace, pod_ref.name)))?;
        let display: Vec<String> = networks.iter().map(|n| n.display_name.clone()).collect();
        let copies: Vec<(PathBuf, PathBuf)> = networks
            .iter()
            .filter_map(|n| n.copy_device_info.clone())
            .collect();
        if !copies.is_empty() {
            copy_device_info(copies).await;
        }
        let info_files: Vec<Option<PathBuf>> = networks
            .iter()
            .map(|n| device_info_file(k.source.device_info_dir(), &n.planned))
            .collect();
        let planned: Vec<Planned> = networks.into_iter().map(|n| n.planned).collect();
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
        }
        let primary = added
            .iter()
            .find(|a| a.primary)
            .or_else(|| added.first())
            .ok_or_else(|| {
                Failure::new(
                    FailureKind::Internal,
                    code::INTERNAL,
                    "ADD produced no result",
                )
            })?;
        let out = result::convert(&primary.result, result::LATEST)
            .map_err(|e| Failure::new(FailureKind::Failed, e.code(), e.to_string()))?;
        Ok(Reply::Result(out))
    }

    /// The pod's networks in multus's order: the cluster network (or the
    /// default-network annotation's NAD in its place), defaultNetworks
    /// (not for pods in systemNamespaces), then the networks annotation.
    async fn pod_networks(
        &self,
        k: &Kubernetes,
        cfg: &selection::Config,
        inv: &Invocation,
        pod_ref: &PodRef,
        pod: &PodInfo,
        cap_args: &Map<String, Value>,
    ) -> Result<Vec<PodNetwork>, Failure> {
        // The CNI_ARGS multus gives every network of a pod (the runtime's
        // other keys are not passed on), plus an element's legacy MAC=/IP=.
        let args_for = |legacy: Vec<(String, String)>| {
            let mut pairs = vec![
                ("IgnoreUnknown".to_string(), "true".to_string()),
                ("K8S_POD_NAMESPACE".to_string(), pod_ref.namespace.clone()),
                ("K8S_POD_NAME".to_string(), pod_ref.name.clone()),
                (
                    "K8S_POD_INFRA_CONTAINER_ID".to_string(),
                    pod_ref.infra_container_id.clone().unwrap_or_default(),
                ),
                (
                    "K8S_POD_UID".to_string(),
                    pod_ref.uid.clone().unwrap_or_else(|| pod.uid.clone()),
                ),
            ];
            pairs.extend(legacy);
            pairs
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(";")
        };
        let annotation = |key: &str| pod.annotations.get(key).map(String::as_str);
        let requested = annotation::parse_networks_annotation(
            annotation(annotation::NETWORKS_ANNOTATION),
            &pod.namespace,
        )
        .map_err(|e| bad_config(format!("pod {}/{}: {e}", pod.namespace, pod.name)))?;
        let default_network = annotation::parse_default_network_annotation(
            annotation(annotation::DEFAULT_NETWORK_ANNOTATION),
            &cfg.multus_namespace,
        )
        .map_err(|e| bad_config(format!("pod {}/{}: {e}", pod.namespace, pod.name)))?;
        let mut for_pod = cfg.clone();
        if cfg.system_namespaces.contains(&pod.namespace) {
            for_pod.default_networks.clear();
        }
        let elements: Vec<selection::Element> = requested
            .iter()
            .map(annotation::Selection::element)
            .collect();
        let selected = selection::select(&for_pod, &inv.ifname, &elements)
            .map_err(|e| bad_config(e.to_string()))?;
        // clusterNetwork and defaultNetworks, or the delegates.
        let configured = for_pod.configured_count();
        let mut devices = PodDevices { pod, devices: None };
        let info_dir = k.source.device_info_dir();
        let mut out = Vec::with_capacity(selected.len());
        for (i, s) in selected.into_iter().enumerate() {
            let network = if let Some(sel) = default_network.as_ref().filter(|_| i == 0) {
                // Replaces the cluster network; not subject to isolation.
                let n = self.nad_network(k, cfg, sel, &mut devices).await?;
                let mut planned = Planned::new(n.list, s.ifname, true);
                planned.cni_args = Some(args_for(Vec::new()));
                PodNetwork {
                    planned,
                    display_name: n.display_name,
                    default_route: sel.default_route.clone(),
                    copy_device_info: None,
                }
            } else if i < configured {
                // clusterNetwork and defaultNetworks: a NAD of that name
                // in multusNamespace, else a network in confDir (or a
                // path); or an inline delegate.
                let n = self.configured_network(k, cfg, &s, &mut devices).await?;
                let primary = s.is_primary();
                let mut planned = Planned::new(n.list, s.ifname, primary);
                planned.cni_args = Some(args_for(Vec::new()));
                PodNetwork {
                    planned,
                    display_name: n.display_name,
                    default_route: None,
                    copy_device_info: None,
                }
            } else {
                let sel = &requested[i - configured];
                nad::check_namespace_isolation(
                    cfg.namespace_isolation,
                    &pod.namespace,
                    &sel.namespace,
                    &cfg.global_namespaces,
                )
                .map_err(|e| bad_config(e.to_string()))?;
                let n = self.nad_network(k, cfg, sel, &mut devices).await?;
                let mut planned = Planned::new(n.list, s.ifname, false);
                planned.cni_args = Some(args_for(runtime_config::legacy_cni_args(sel)));
                let rc = runtime_config::runtime_config(
                    sel,
                    cap_args,
                    runtime_config::RuntimeInherit::Multus,
                    &runtime_config::AttachmentFacts {
                        container_id: &inv.container_id,
                        ifname: &planned.ifname,
                        allocated_device: n.device.as_ref().map(|(_, id)| id.as_str()),
                        device_info_dir: info_dir,
                    },
                );
                // As multus: a device the resource gave has the device
                // plugin's device-info file copied to the network's.
                let copy_device_info = n.device.as_ref().and_then(|(resource, id)| {
                    let to = rc.get("CNIDeviceInfoFile")?.as_str()?;
                    Some((
                        device_info::dp_file(info_dir, resource, id),
                        PathBuf::from(to),
                    ))
                });
                planned.capability_args = Some(rc);
                PodNetwork {
                    planned,
                    display_name: n.display_name,
                    default_route: sel.default_route.clone(),
                    copy_device_info,
                }
            };
            out.push(network);
        }
        Ok(out)
    }

    /// A NAD's network: its `spec.config`, or the confDir network of its
    /// name when the spec is empty.
    async fn nad_network(
        &self,
        k: &Kubernetes,
        cfg: &selection::Config,
        sel: &annotation::Selection,
        devices: &mut PodDevices<'_>,
    ) -> Result<NadNetwork, Failure> {
        let Some(found) = k.source.nad(&sel.namespace, &sel.name) else {
            return Err(bad_config(
                nad::Error::NotFound {
                    namespace: sel.namespace.clone(),
                    name: sel.name.clone(),
                    why: "no such NetworkAttachmentDefinition".into(),
                }
                .to_string(),
            ));
        };
        let spec = found.config().map(str::to_string);
        // The confDir fallback reads files: done here, asynchronously,
        // and handed to the pure resolution.
        let file = match &spec {
            Some(_) => None,
            None if !sel.name.contains('/') => Some(self.load_network(cfg, &sel.name).await),
            None => None,
        };
        let delegate = nad::delegate_for_selection(sel, spec.as_deref(), move |_| match file {
            Some(Ok(list)) => Ok(list),
            Some(Err(e)) => Err(netconf::ConfigError::File {
                file: "confDir".into(),
                why: e.msg,
            }),
            None => Err(netconf::ConfigError::File {
                file: "confDir".into(),
                why: "no file was looked up".into(),
            }),
        })
        .map_err(|e| bad_config(e.to_string()))?;
        let mut delegate = delegate;
        // As multus: each NAD naming a resource takes the pod's next
        // device of it, in network order; none left, none given.
        let mut device = None;
        if let Some(resource) = found.resource_name().filter(|r| !r.is_empty()) {
            if let Some(id) = devices.take(k, resource).await? {
                delegate.inject_device_id(&id);
                device = Some((resource.to_string(), id));
            }
        }
        let list = delegate
            .network_list()
            .map_err(|e| bad_config(format!("{}: {e}", delegate.display_name)))?;
        Ok(NadNetwork {
            list,
            display_name: delegate.display_name,
            device,
        })
    }

    /// clusterNetwork or a defaultNetworks entry: a NAD of that name in
    /// multusNamespace, else a network name in confDir or a path.
    async fn configured_network(
        &self,
        k: &Kubernetes,
        cfg: &selection::Config,
        selected: &selection::Selected,
        devices: &mut PodDevices<'_>,
    ) -> Result<NadNetwork, Failure> {
        let name = &selected.network;
        let ns = &cfg.multus_namespace;
        if selected.inline.is_none() && !name.contains('/') && k.source.nad(ns, name).is_some() {
            let sel = annotation::Selection {
                name: name.to_string(),
                namespace: ns.clone(),
                ..Default::default()
            };
            return self.nad_network(k, cfg, &sel, devices).await;
        }
        let list = self.load_selected(cfg, selected).await.map_err(failure)?;
        let display_name = list.name.clone();
        Ok(NadNetwork {
            list,
            display_name,
            device: None,
        })
    }
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
