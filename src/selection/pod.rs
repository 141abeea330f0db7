//! A Kubernetes pod's networks, planned as multus plans them: the cluster
//! network (or, in its place, the NAD the default-network annotation
//! names), the default networks (not for pods in systemNamespaces), then
//! the networks annotation's, each resolved to its configuration, its
//! CNI_ARGS and its capability arguments.
//!
//! Planning only decides. What it needs of the cluster (NADs, the devices
//! the kubelet gave the pod) it asks through [`Cluster`], which
//! `k8s::Source` implements; what it needs of network configurations
//! (confDir networks, paths, inline delegates) through [`Configs`], which
//! the handler implements with the engine's loader. The plan is data
//! ([`Plan`]): the networks in order, each with its interface, its
//! configuration, CNI_ARGS and capability arguments, the default route its
//! element asks for and the device-info file to copy to it, then multus's
//! auxiliary chain. The caller has it carried out and writes
//! network-status.
//!
//! [`configured`] resolves, the same way but for no pod, the networks
//! every pod gets (what STATUS asks).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::annotation::{self, Selection};
use super::runtime_config::{self, AttachmentFacts, RuntimeInherit};
use super::{nad, Config, Element, Origin, Selected};
use crate::netconf::{ConfigError, NetworkList};

/// A NetworkAttachmentDefinition, as planning reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nad {
    /// `spec.config` when it is not empty; `None`: the confDir network of
    /// the NAD's name.
    pub config: Option<String>,
    /// The `k8s.v1.cni.cncf.io/resourceName` annotation.
    pub resource_name: Option<String>,
}

/// Every pod annotation planning reads ([`Pod::annotations`] needs no
/// others): a cache of pods may keep these and drop the rest.
pub const POD_ANNOTATIONS: [&str; 2] = [
    annotation::NETWORKS_ANNOTATION,
    annotation::DEFAULT_NETWORK_ANNOTATION,
];

/// The NAD annotation naming the device plugin resource a network's
/// devices come from ([`Nad::resource_name`]).
pub const RESOURCE_NAME_ANNOTATION: &str = "k8s.v1.cni.cncf.io/resourceName";

/// The devices the kubelet gave a pod: device IDs by resource name.
pub type DeviceIds = BTreeMap<String, Vec<String>>;

/// Why the devices of a pod cannot be had.
#[derive(Debug)]
pub struct DevicesError {
    /// Asking again later may work (the kubelet did not answer in time or
    /// took no connection), as opposed to an answer that cannot be used.
    pub transient: bool,
    pub error: Box<dyn std::error::Error + Send + Sync>,
}

impl fmt::Display for DevicesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for DevicesError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

// `async fn` in a public trait cannot promise `Send` futures to `dyn`
// users. These traits are only used generically, where the implementer's
// futures (and whether they are `Send`) are known.

/// What planning asks of the cluster.
#[allow(async_fn_in_trait)]
pub trait Cluster {
    /// The NAD `namespace/name`, if there is one.
    fn network_attachment(&self, namespace: &str, name: &str) -> Option<Nad>;

    /// Why no NAD can be read at all, if that is so (the API refuses
    /// their list to this identity): said when a pod names one.
    fn network_attachments_unreadable(&self) -> Option<String> {
        None
    }

    /// Every device the kubelet gave `pod`, by resource. Planning asks
    /// at most once per ADD, and only when a network names a resource.
    async fn pod_devices(&self, pod: &Pod<'_>) -> Result<DeviceIds, DevicesError>;

    /// The devices of `pod`'s ResourceClaims (Dynamic Resource
    /// Allocation), by the resource name their driver published. Planning
    /// asks at most once per ADD, and only when a network names a
    /// resource of which [`Cluster::pod_devices`] had no device left.
    async fn pod_claim_devices(&self, pod: &Pod<'_>) -> Result<DeviceIds, DevicesError>;
}

/// What planning asks of the network configurations.
#[allow(async_fn_in_trait)]
pub trait Configs {
    /// Why a configured network cannot be loaded; planning hands it back
    /// as it is ([`Error::Load`]).
    type Error;

    /// The confDir network `name`, for a NAD without `spec.config`.
    async fn load_network(&self, name: &str) -> Result<NetworkList, ConfigError>;

    /// A configured network (the cluster network or a default network):
    /// by name or path, or an inline delegate.
    async fn load_selected(&self, selected: &Selected) -> Result<NetworkList, Self::Error>;

    /// multus's auxiliary chain `name` (`auxiliaryCNIChainName`) beside the
    /// cluster network; `None` when it has no plugins.
    async fn auxiliary_chain(&self, name: &str) -> Result<Option<NetworkList>, Self::Error>;
}

/// The pod of an ADD, as the API holds it.
#[derive(Debug, Clone, Copy)]
pub struct Pod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The uid the API holds (the kubelet's checkpoint is keyed by it).
    pub uid: &'a str,
    /// At least those of [`POD_ANNOTATIONS`] the pod has.
    pub annotations: &'a BTreeMap<String, String>,
}

impl Pod<'_> {
    fn annotation(&self, key: &str) -> Option<&str> {
        // A cache of pods keeps only these: one read here that is not
        // listed would see nothing there.
        debug_assert!(
            POD_ANNOTATIONS.contains(&key),
            "{key} is not in POD_ANNOTATIONS"
        );
        self.annotations.get(key).map(String::as_str)
    }

    fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One ADD for a pod.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub pod: Pod<'a>,
    /// The runtime's `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// The runtime's `CNI_IFNAME`: the cluster network's interface.
    pub ifname: &'a str,
    /// `K8S_POD_UID` as the runtime sent it; `None`: the pod's uid is
    /// passed on.
    pub runtime_uid: Option<&'a str>,
    /// `K8S_POD_INFRA_CONTAINER_ID`; `None`: passed on empty.
    pub infra_container_id: Option<&'a str>,
    /// The call's `runtimeConfig`, which the annotation's networks are
    /// offered as well (as multus does).
    pub capability_args: &'a Map<String, Value>,
    /// The device-info directory (`dp/` and `cni/` under it).
    pub device_info_dir: &'a Path,
}

/// One planned network of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    pub list: NetworkList,
    pub ifname: String,
    /// The cluster network: its result goes back to the runtime.
    pub primary: bool,
    /// The network's `CNI_ARGS`: multus's pod keys, then an element's
    /// legacy `MAC=`/`IP=`.
    pub cni_args: String,
    /// The network's own capability arguments (the annotation's networks);
    /// `None`: the call's `runtimeConfig`.
    pub capability_args: Option<Map<String, Value>>,
    /// What network-status shows: `<namespace>/<nad>`, or the network
    /// name of a configured network that is no NAD.
    pub display_name: String,
    /// The selection element's `default-route`.
    pub default_route: Option<Vec<IpAddr>>,
    /// The device plugin's device-info file to copy to the network's
    /// before its plugins run (`dp/…` → `cni/…`).
    pub copy_device_info: Option<(PathBuf, PathBuf)>,
}

/// A pod's ADD, planned: everything that runs, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The pod's networks, in multus's order.
    pub networks: Vec<Network>,
    /// multus's auxiliary chain, run after them: interface `net<N>` (`N`
    /// the number of networks), the pod's CNI_ARGS, the call's capability
    /// arguments, shown by its network name (its result shows no
    /// interface, so it has no network-status entry).
    pub auxiliary: Option<Network>,
}

/// Why a pod's networks cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum Error<E> {
    /// An annotation of the pod cannot be used.
    #[error("pod {pod}: {source}")]
    Annotation {
        pod: String,
        source: annotation::Error,
    },
    /// The networks cannot be ordered and named.
    #[error(transparent)]
    Select(#[from] super::Error),
    /// A NAD is missing, out of the pod's reach or unusable.
    #[error(transparent)]
    Nad(#[from] nad::Error),
    /// A NAD's configuration is not one the engine runs.
    #[error("{display}: {source}")]
    Config {
        display: String,
        source: ConfigError,
    },
    /// The devices of the pod cannot be had.
    #[error("pod {pod}: the devices of resource {resource:?}: {source}")]
    Devices {
        pod: String,
        resource: String,
        source: DevicesError,
    },
    /// A configured network cannot be loaded.
    #[error("{0}")]
    Load(E),
}

impl<E> Error<E> {
    /// Asking again later may work: the kubelet did not answer.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Devices { source, .. } if source.transient)
    }
}

/// Plans the networks of `request`'s pod under `config`, in multus's
/// order, then the auxiliary chain, every one resolved before anything
/// runs.
pub async fn plan<C: Cluster, N: Configs>(
    config: &Config,
    request: &Request<'_>,
    cluster: &C,
    configs: &N,
) -> Result<Plan, Error<N::Error>> {
    let pod = &request.pod;
    let unusable = |source| Error::Annotation {
        pod: pod.display(),
        source,
    };
    let requested = annotation::parse_networks_annotation(
        pod.annotation(annotation::NETWORKS_ANNOTATION),
        pod.namespace,
    )
    .map_err(unusable)?;
    let default_network = annotation::parse_default_network_annotation(
        pod.annotation(annotation::DEFAULT_NETWORK_ANNOTATION),
        &config.multus_namespace,
    )
    .map_err(unusable)?;
    let mut for_pod = Cow::Borrowed(config);
    if config.system_namespaces.iter().any(|n| n == pod.namespace) {
        for_pod.to_mut().default_networks.clear();
    }
    let elements: Vec<Element> = requested.iter().map(Selection::element).collect();
    let selected = super::select(&for_pod, request.ifname, &elements)?;
    let mut planner = Planner {
        config,
        request,
        cluster,
        configs,
        devices: None,
    };
    let mut out = Vec::with_capacity(selected.len());
    for s in selected {
        let network = match (s.origin, &default_network) {
            // Replaces the cluster network; not subject to isolation.
            (Origin::Cluster, Some(sel)) => {
                let nad = planner.find_nad(sel)?;
                let n = planner.nad_network(sel, &nad).await?;
                Network {
                    default_route: sel.default_route.clone(),
                    ..Network::new(s, n, planner.cni_args(Vec::new()))
                }
            }
            (Origin::Cluster | Origin::Default, _) => planner.configured(s).await?,
            (Origin::Requested(i), _) => planner.requested(s, &requested[i]).await?,
        };
        out.push(network);
    }
    let auxiliary = planner.auxiliary(out.len()).await?;
    Ok(Plan {
        networks: out,
        auxiliary,
    })
}

/// The networks every pod gets, the cluster network and the default
/// networks (or the delegates), each by its name and as [`plan`] resolves
/// it for a pod (a NAD of that name in multusNamespace, else confDir), but
/// with no device taken: what STATUS asks.
pub async fn configured<C: Cluster, N: Configs>(
    config: &Config,
    cluster: &C,
    configs: &N,
) -> Result<Vec<(String, Result<NetworkList, Error<N::Error>>)>, super::Error> {
    // The interface names do not matter here.
    let selected = super::select(config, "eth0", &[])?;
    let mut out = Vec::with_capacity(selected.len());
    for s in selected {
        let list = match configured_nad(config, cluster, &s) {
            Some((sel, nad)) => nad_delegate(configs, &sel, &nad)
                .await
                .and_then(|d| d.network_list().map_err(|source| config_error(&d, source))),
            None => configs.load_selected(&s).await.map_err(Error::Load),
        };
        out.push((s.network, list));
    }
    Ok(out)
}

/// The NAD in multusNamespace a configured network names, if there is one
/// (not for a path or an inline delegate), with the selection that names
/// it.
fn configured_nad<C: Cluster>(
    config: &Config,
    cluster: &C,
    s: &Selected,
) -> Option<(Selection, Nad)> {
    if s.inline.is_some() || s.network.contains('/') {
        return None;
    }
    let ns = &config.multus_namespace;
    let nad = cluster.network_attachment(ns, &s.network)?;
    let sel = Selection {
        name: s.network.clone(),
        namespace: ns.clone(),
        ..Selection::default()
    };
    Some((sel, nad))
}

/// A NAD's delegate: its `spec.config`, or the confDir network of its name
/// when the spec is empty.
async fn nad_delegate<N: Configs>(
    configs: &N,
    sel: &Selection,
    nad: &Nad,
) -> Result<nad::NadDelegate, Error<N::Error>> {
    // The confDir fallback reads files: looked up here, asynchronously,
    // and handed to the pure resolution.
    let file = match &nad.config {
        None if !sel.name.contains('/') => Some(configs.load_network(&sel.name).await),
        _ => None,
    };
    let delegate = nad::delegate_for_selection(sel, nad.config.as_deref(), move |_| {
        file.unwrap_or_else(|| {
            Err(ConfigError::File {
                file: "confDir".into(),
                why: "no file was looked up".into(),
            })
        })
    })?;
    Ok(delegate)
}

fn config_error<E>(delegate: &nad::NadDelegate, source: ConfigError) -> Error<E> {
    Error::Config {
        display: delegate.display_name.clone(),
        source,
    }
}

/// A NAD's network, resolved.
struct NadNetwork {
    list: NetworkList,
    display_name: String,
    /// The NAD's `resourceName` and the device it took, if any.
    device: Option<(String, String)>,
}

struct Planner<'a, C, N> {
    config: &'a Config,
    request: &'a Request<'a>,
    cluster: &'a C,
    configs: &'a N,
    /// The pod's devices, asked of the cluster when a network first
    /// needs one.
    devices: Option<Devices>,
}

impl Network {
    /// `s` as `n` resolved it, with the call's capability arguments.
    fn new(s: Selected, n: NadNetwork, cni_args: String) -> Self {
        Self {
            primary: s.is_primary(),
            list: n.list,
            ifname: s.ifname,
            cni_args,
            capability_args: None,
            display_name: n.display_name,
            default_route: None,
            copy_device_info: None,
        }
    }
}

impl<C: Cluster, N: Configs> Planner<'_, C, N> {
    /// The CNI_ARGS multus gives every network of a pod (the runtime's
    /// other keys are not passed on), then `legacy`.
    fn cni_args(&self, legacy: Vec<(String, String)>) -> String {
        let r = self.request;
        let mut pairs = runtime_config::pod_args(
            r.pod.namespace,
            r.pod.name,
            r.infra_container_id.unwrap_or_default(),
            r.runtime_uid.unwrap_or(r.pod.uid),
        );
        pairs.extend(legacy);
        runtime_config::args_text(&pairs)
    }

    /// clusterNetwork or a defaultNetworks entry: a NAD of that name in
    /// multusNamespace, else a network name in confDir or a path; or an
    /// inline delegate.
    async fn configured(&mut self, s: Selected) -> Result<Network, Error<N::Error>> {
        let n = match configured_nad(self.config, self.cluster, &s) {
            Some((sel, nad)) => self.nad_network(&sel, &nad).await?,
            None => {
                let list = self.configs.load_selected(&s).await.map_err(Error::Load)?;
                NadNetwork {
                    display_name: list.name.clone(),
                    list,
                    device: None,
                }
            }
        };
        Ok(Network::new(s, n, self.cni_args(Vec::new())))
    }

    /// A network of the networks annotation, with the element's
    /// capability arguments and legacy CNI_ARGS.
    async fn requested(
        &mut self,
        s: Selected,
        sel: &Selection,
    ) -> Result<Network, Error<N::Error>> {
        let (config, request) = (self.config, self.request);
        nad::check_namespace_isolation(
            config.namespace_isolation,
            request.pod.namespace,
            &sel.namespace,
            &config.global_namespaces,
        )?;
        let nad = self.find_nad(sel)?;
        let n = self.nad_network(sel, &nad).await?;
        let info_dir = request.device_info_dir;
        let rc = runtime_config::runtime_config(
            sel,
            request.capability_args,
            RuntimeInherit::Multus,
            &AttachmentFacts {
                container_id: request.container_id,
                ifname: &s.ifname,
                allocated_device: n.device.as_ref().map(|(_, id)| id.as_str()),
                device_info_dir: info_dir,
            },
        );
        // As multus: a device the resource gave has the device plugin's
        // device-info file copied to the network's.
        let copy_device_info = n.device.as_ref().and_then(|(resource, id)| {
            let to = rc.get("CNIDeviceInfoFile")?.as_str()?;
            Some((
                crate::device_info::dp_file(info_dir, resource, id),
                PathBuf::from(to),
            ))
        });
        let cni_args = self.cni_args(runtime_config::legacy_cni_args(sel));
        Ok(Network {
            capability_args: Some(rc),
            default_route: sel.default_route.clone(),
            copy_device_info,
            ..Network::new(s, n, cni_args)
        })
    }

    /// multus's auxiliary chain, when one is configured and has plugins,
    /// as the network after the `position` others.
    async fn auxiliary(&self, position: usize) -> Result<Option<Network>, Error<N::Error>> {
        let Some(name) = &self.config.auxiliary_chain else {
            return Ok(None);
        };
        let Some(list) = self
            .configs
            .auxiliary_chain(name)
            .await
            .map_err(Error::Load)?
        else {
            return Ok(None);
        };
        Ok(Some(Network {
            display_name: list.name.clone(),
            list,
            ifname: format!("net{position}"),
            primary: false,
            cni_args: self.cni_args(Vec::new()),
            capability_args: None,
            default_route: None,
            copy_device_info: None,
        }))
    }

    fn find_nad(&self, sel: &Selection) -> Result<Nad, nad::Error> {
        self.cluster
            .network_attachment(&sel.namespace, &sel.name)
            .ok_or_else(|| nad::Error::NotFound {
                namespace: sel.namespace.clone(),
                name: sel.name.clone(),
                why: match self.cluster.network_attachments_unreadable() {
                    Some(why) => format!(
                        "the NetworkAttachmentDefinitions cannot be read: {why} (README: \
                         \"The identity plexusd uses\")"
                    ),
                    None => "no such NetworkAttachmentDefinition".into(),
                },
            })
    }

    /// A NAD's network: its `spec.config`, or the confDir network of its
    /// name when the spec is empty; with the pod's next device of its
    /// `resourceName`, if it names one.
    async fn nad_network(
        &mut self,
        sel: &Selection,
        nad: &Nad,
    ) -> Result<NadNetwork, Error<N::Error>> {
        let mut delegate = nad_delegate(self.configs, sel, nad).await?;
        // As multus: each NAD naming a resource takes the pod's next
        // device of it, in network order; none left, none given.
        let mut device = None;
        if let Some(resource) = nad.resource_name.as_deref().filter(|r| !r.is_empty()) {
            if let Some(id) = self.take_device(resource).await? {
                delegate.inject_device_id(&id);
                device = Some((resource.to_string(), id));
            }
        }
        let list = delegate
            .network_list()
            .map_err(|source| config_error(&delegate, source))?;
        Ok(NadNetwork {
            list,
            display_name: delegate.display_name,
            device,
        })
    }

    /// The pod's next device of `resource`: of those the kubelet gave
    /// (asked on the first call), then of those of the pod's claims
    /// (asked on the first call that finds none left).
    async fn take_device(&mut self, resource: &str) -> Result<Option<String>, Error<N::Error>> {
        let pod = self.request.pod;
        let failed = |source| Error::Devices {
            pod: pod.display(),
            resource: resource.to_string(),
            source,
        };
        let devices = match &mut self.devices {
            Some(d) => d,
            None => {
                let ids = self.cluster.pod_devices(&pod).await.map_err(failed)?;
                self.devices.insert(Devices::new(ids))
            }
        };
        if let Some(id) = devices.take(resource) {
            return Ok(Some(id));
        }
        if devices.claims_asked {
            return Ok(None);
        }
        devices.claims_asked = true;
        let more = self.cluster.pod_claim_devices(&pod).await.map_err(failed)?;
        devices.add(more);
        Ok(devices.take(resource))
    }
}

/// A pod's devices by resource name, handed out one at a time.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Devices {
    by_resource: BTreeMap<String, (Vec<String>, usize)>,
    /// Whether the pod's claims were asked for theirs.
    claims_asked: bool,
}

impl Devices {
    /// From resource name → device IDs; each list is sorted, so the same
    /// pod always gets the same assignment.
    fn new(map: DeviceIds) -> Self {
        Self {
            by_resource: map
                .into_iter()
                .map(|(k, mut ids)| {
                    ids.sort();
                    (k, (ids, 0))
                })
                .collect(),
            claims_asked: false,
        }
    }

    /// Adds the devices of the pod's claims: per resource, sorted, after
    /// those already there (some may have been handed out), none twice.
    fn add(&mut self, more: DeviceIds) {
        for (resource, mut ids) in more {
            ids.sort();
            ids.dedup();
            let (have, _) = self.by_resource.entry(resource).or_default();
            ids.retain(|id| !have.contains(id));
            have.extend(ids);
        }
    }

    /// The next unused device of `resource`; `None` when the pod has none
    /// left (as multus, the network then runs without a device ID).
    fn take(&mut self, resource: &str) -> Option<String> {
        let (ids, next) = self.by_resource.get_mut(resource)?;
        let id = ids.get(*next)?.clone();
        *next += 1;
        Some(id)
    }
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
