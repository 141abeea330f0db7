//! Devices from Dynamic Resource Allocation (`resource.k8s.io/v1`,
//! Kubernetes 1.34 and later) for NetworkAttachmentDefinitions with a
//! `k8s.v1.cni.cncf.io/resourceName`, as multus reads them: a DRA driver
//! that hands out network devices (SR-IOV virtual functions, say) publishes
//! each device in a ResourceSlice with two attributes,
//! `k8s.cni.cncf.io/deviceID` (what the CNI plugin gets as its device ID)
//! and `k8s.cni.cncf.io/resourceName` (which NADs it serves); a pod's
//! ResourceClaims say which devices the pod was given.
//!
//! - The claims of a pod: one LIST of the ResourceClaims of the pod's
//!   namespace, bounded by `kubernetesRequestTimeout`, keeping those whose
//!   `status.reservedFor` names the pod's uid (the kubelet runs a pod only
//!   once every claim of it is reserved for it, so at ADD time these are
//!   exactly the pod's claims, whether from a template or named in the
//!   spec). Made only when a NAD of the pod names a resource the kubelet's
//!   device plugins did not provide: a node without DRA never asks. A
//!   node's own identity may not LIST claims (the Node authorizer grants a
//!   node `get` of the claims its pods reference, nothing more): when the
//!   LIST is refused, the pod is read from a LIST of this node's pods in
//!   its namespace and each claim it names is read with a GET.
//! - The devices' attributes: a watch of this node's ResourceSlices
//!   (`spec.nodeName=<node>`), started on the first pod that needs it and
//!   kept; per device, only the two attributes. Devices without a
//!   `deviceID` (a GPU in the same claim) are not CNI's and are skipped, as
//!   are devices without a `resourceName` (no NAD can name them).
//! - An API server without `resource.k8s.io/v1` (404) has no claims.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer};
use tokio::sync::{watch, OnceCell};
use tokio_util::sync::CancellationToken;

use super::cache::{Cache, Feeder, Slim, Texts};
use super::pod::SlimPod as Pod;
use super::WatchErrors;
use crate::selection::pod::DeviceIds;

/// The device attribute holding the device ID a CNI plugin gets.
pub const DEVICE_ID_ATTRIBUTE: &str = "k8s.cni.cncf.io/deviceID";
/// The device attribute a NAD's `resourceName` is matched against.
pub const RESOURCE_NAME_ATTRIBUTE: &str = "k8s.cni.cncf.io/resourceName";
/// The name under which the slice watch's errors are kept and logged.
const SLICES: &str = "resourceslices";

/// Why a pod's DRA devices cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot list the ResourceClaims of namespace {namespace} (resource.k8s.io/v1)")]
    Claims {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "the ResourceClaims of namespace {namespace} (resource.k8s.io/v1) were not listed within {}",
        crate::duration::format(*.after)
    )]
    ClaimsTimeout { namespace: String, after: Duration },
    #[error(
        "this node's ResourceSlices (resource.k8s.io/v1) were not listed within {}{}",
        crate::duration::format(*.after),
        .cause.as_ref().map(|c| format!(" (last error: {c})")).unwrap_or_default()
    )]
    Slices {
        after: Duration,
        cause: Option<String>,
    },
}

impl Error {
    /// Worth trying again later: a timeout, or an outage or throttling.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Claims {
                source: kube::Error::Api(status),
                ..
            } => matches!(status.code, 429 | 500 | 502 | 503 | 504),
            Error::Claims { .. } => true,
            Error::ClaimsTimeout { .. } | Error::Slices { .. } => true,
        }
    }
}

/// A ResourceClaim, decoded only as far as read here.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResourceClaim {
    #[serde(default, deserialize_with = "plain_metadata")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    status: Option<ClaimStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimStatus {
    #[serde(default)]
    allocation: Option<Allocation>,
    #[serde(default)]
    reserved_for: Vec<Consumer>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Allocation {
    #[serde(default)]
    devices: Option<DeviceAllocation>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct DeviceAllocation {
    #[serde(default)]
    results: Vec<AllocatedDevice>,
}

/// One device allocated to a claim: `<driver>/<pool>/<device>`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct AllocatedDevice {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub device: String,
}

/// An object a claim is reserved for (`resourceClaimConsumerReference`).
#[derive(Debug, Clone, Default, Deserialize)]
struct Consumer {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    uid: String,
}

impl ResourceClaim {
    /// The devices allocated to the claim when it is reserved for the pod
    /// of uid `pod_uid`; none otherwise.
    pub fn devices_for(&self, pod_uid: &str) -> &[AllocatedDevice] {
        let Some(status) = &self.status else {
            return &[];
        };
        let reserved = status
            .reserved_for
            .iter()
            .any(|c| c.resource == "pods" && !pod_uid.is_empty() && c.uid == pod_uid);
        match (&status.allocation, reserved) {
            (Some(Allocation { devices: Some(d) }), true) => &d.results,
            _ => &[],
        }
    }
}

/// A ResourceSlice, decoded down to the devices CNI can use.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResourceSlice {
    #[serde(default, deserialize_with = "plain_metadata")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: SliceSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct SliceSpec {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    pool: Pool,
    #[serde(default)]
    devices: Vec<SliceDevice>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Pool {
    #[serde(default)]
    name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct SliceDevice {
    #[serde(default)]
    name: String,
    #[serde(default, deserialize_with = "cni_attributes")]
    attributes: CniAttributes,
}

/// The two attributes read of a device; its others are skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct CniAttributes {
    device_id: Option<String>,
    resource_name: Option<String>,
}

/// A device attribute: one of `string`, `int`, `bool`, `version`.
#[derive(Deserialize)]
struct Attribute {
    #[serde(default)]
    string: Option<String>,
}

fn cni_attributes<'de, D: Deserializer<'de>>(d: D) -> Result<CniAttributes, D::Error> {
    let map: Option<BTreeMap<String, Attribute>> = Option::deserialize(d)?;
    let mut map = map.unwrap_or_default();
    let mut take = |key: &str| map.remove(key).and_then(|a| a.string);
    Ok(CniAttributes {
        device_id: take(DEVICE_ID_ATTRIBUTE),
        resource_name: take(RESOURCE_NAME_ATTRIBUTE),
    })
}

fn plain_metadata<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    super::slim::decode_meta(d, &[])
}

/// What the cache keeps of a slice: its CNI devices, with `deviceID` and
/// `resourceName` both set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceDevices {
    driver: Box<str>,
    pool: Box<str>,
    /// (device name, device ID, resource name).
    devices: Vec<(Box<str>, Box<str>, Box<str>)>,
}

impl SliceDevices {
    fn find(&self, d: &AllocatedDevice) -> Option<(&str, &str)> {
        if *self.driver != d.driver || *self.pool != d.pool {
            return None;
        }
        self.devices
            .iter()
            .find(|(name, _, _)| **name == d.device)
            .map(|(_, id, resource)| (&**id, &**resource))
    }
}

impl Slim for ResourceSlice {
    type Value = SliceDevices;

    fn key(&self) -> (&str, &str) {
        ("", self.metadata.name.as_deref().unwrap_or_default())
    }

    fn into_value(self, _: &mut Texts) -> SliceDevices {
        SliceDevices {
            driver: self.spec.driver.into(),
            pool: self.spec.pool.name.into(),
            devices: self
                .spec
                .devices
                .into_iter()
                .filter_map(|d| match d.attributes {
                    CniAttributes {
                        device_id: Some(id),
                        resource_name: Some(resource),
                    } if !id.is_empty() && !resource.is_empty() => {
                        Some((d.name.into(), id.into(), resource.into()))
                    }
                    _ => None,
                })
                .collect(),
        }
    }

    fn release(_: SliceDevices, _: &mut Texts) {}
}

macro_rules! resource_k8s_io {
    ($t:ty, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $t {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }

            fn group(_: &()) -> Cow<'_, str> {
                "resource.k8s.io".into()
            }

            fn version(_: &()) -> Cow<'_, str> {
                "v1".into()
            }

            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

resource_k8s_io!(
    ResourceClaim,
    "ResourceClaim",
    "resourceclaims",
    k8s_openapi::NamespaceResourceScope
);
resource_k8s_io!(
    ResourceSlice,
    "ResourceSlice",
    "resourceslices",
    k8s_openapi::ClusterResourceScope
);

/// This node's ResourceSlices, watched from the first pod that needs them.
struct Slices {
    cache: Arc<Cache<SliceDevices>>,
    synced: watch::Receiver<super::Listed>,
    errors: WatchErrors,
}

/// The DRA side of the Kubernetes source.
pub(super) struct Dra {
    client: kube::Client,
    node_name: String,
    request_timeout: Duration,
    stop: CancellationToken,
    slices: OnceCell<Slices>,
}

impl Dra {
    pub(super) fn new(
        client: kube::Client,
        node_name: String,
        request_timeout: Duration,
        stop: CancellationToken,
    ) -> Self {
        Self {
            client,
            node_name,
            request_timeout,
            stop,
            slices: OnceCell::new(),
        }
    }

    /// The DRA devices of pod `namespace`/(uid `uid`) by resource name:
    /// one LIST of the namespace's claims; then, if any is reserved for the
    /// pod, their devices' attributes from the slice cache.
    pub(super) async fn pod_devices(&self, namespace: &str, uid: &str) -> Result<DeviceIds, Error> {
        let claims = self.claims(namespace, uid).await?;
        let allocated: Vec<&AllocatedDevice> =
            claims.iter().flat_map(|c| c.devices_for(uid)).collect();
        if allocated.is_empty() {
            return Ok(DeviceIds::new());
        }
        let slices = self.slices().await?;
        let mut out = DeviceIds::new();
        for d in allocated {
            let found = slices.cache.find_map(|s| {
                s.find(d)
                    .map(|(id, resource)| (id.to_string(), resource.to_string()))
            });
            match found {
                Some((id, resource)) => out.entry(resource).or_default().push(id),
                None => tracing::debug!(
                    driver = %d.driver, pool = %d.pool, device = %d.device,
                    "a device of the pod's claims has no CNI attributes in this node's ResourceSlices; skipped"
                ),
            }
        }
        Ok(out)
    }

    /// The claims that may be the pod's: the namespace's, from one LIST;
    /// when that LIST is refused (403: a node's own identity may `get` the
    /// claims of its pods but never `list` them), those the pod names, each
    /// from a GET ([`Dra::claims_of_pod`]). When that finds none, the
    /// refusal stands: it is what the operator must see.
    async fn claims(&self, namespace: &str, uid: &str) -> Result<Vec<ResourceClaim>, Error> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default();
        match self.bounded(namespace, api.list(&params)).await? {
            // No resource.k8s.io/v1 on this API server: no claims.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                match self.claims_of_pod(namespace, uid).await {
                    Ok(claims) if !claims.is_empty() => Ok(claims),
                    // Nothing to show for the refusal: it is the answer.
                    found => {
                        if let Err(e) = found {
                            tracing::debug!(namespace, cause = %crate::causes::chain(&e), "the pod's ResourceClaims could not be read one by one either");
                        }
                        Err(Error::Claims {
                            namespace: namespace.to_string(),
                            source: kube::Error::Api(status),
                        })
                    }
                }
            }
            Err(source) => Err(Error::Claims {
                namespace: namespace.to_string(),
                source,
            }),
            Ok(list) => Ok(list.items),
        }
    }

    /// The claims pod `namespace`/(uid `uid`) names, as a node's identity
    /// may read them: the pod from a LIST of this node's pods in the
    /// namespace (`spec.nodeName=<node>`, which the Node authorizer
    /// allows), then a GET of each claim of its `spec.resourceClaims`
    /// (by `resourceClaimName`, or the name `status.resourceClaimStatuses`
    /// gives a claim made from a template).
    async fn claims_of_pod(&self, namespace: &str, uid: &str) -> Result<Vec<ResourceClaim>, Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node_name));
        let listed = self
            .bounded(namespace, pods.list(&params))
            .await?
            .map_err(|source| Error::Claims {
                namespace: namespace.to_string(),
                source,
            })?;
        let Some(pod) = listed
            .items
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
        else {
            return Ok(Vec::new());
        };
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let mut claims = Vec::new();
        for name in claim_names(&pod) {
            match self.bounded(namespace, api.get_opt(&name)).await? {
                Ok(Some(c)) => claims.push(c),
                Ok(None) => {}
                Err(source) => {
                    return Err(Error::Claims {
                        namespace: namespace.to_string(),
                        source,
                    })
                }
            }
        }
        Ok(claims)
    }

    /// `call` within `kubernetesRequestTimeout`.
    async fn bounded<T>(
        &self,
        namespace: &str,
        call: impl std::future::Future<Output = T>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.request_timeout, call)
            .await
            .map_err(|_| Error::ClaimsTimeout {
                namespace: namespace.to_string(),
                after: self.request_timeout,
            })
    }

    /// The slice cache, started on first use and synced (waited for at
    /// most `kubernetesRequestTimeout`).
    async fn slices(&self) -> Result<&Slices, Error> {
        let slices = self
            .slices
            .get_or_init(|| async {
                let cache = Arc::new(Cache::default());
                let api: Api<ResourceSlice> = Api::all(self.client.clone());
                let config =
                    watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
                let errors = WatchErrors::default();
                let synced = super::spawn_watch(
                    SLICES,
                    watcher(api, config),
                    Feeder::new(cache.clone()),
                    &errors,
                    &self.stop,
                );
                Slices {
                    cache,
                    synced,
                    errors,
                }
            })
            .await;
        let mut synced = slices.synced.clone();
        let _ =
            tokio::time::timeout(self.request_timeout, synced.wait_for(super::Listed::done)).await;
        if slices.synced.borrow().done() {
            return Ok(slices);
        }
        let cause = slices
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(SLICES)
            .cloned();
        Err(Error::Slices {
            after: self.request_timeout,
            cause,
        })
    }
}

/// The names of the ResourceClaims a pod uses: those its spec names, and
/// those made for it from templates (named in its status; not yet made
/// when missing there).
fn claim_names(pod: &Pod) -> Vec<String> {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .unwrap_or_default();
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| match &c.resource_claim_name {
            Some(name) => Some(name.clone()),
            None => statuses
                .iter()
                .find(|s| s.name == c.name)
                .and_then(|s| s.resource_claim_name.clone()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use serde_json::json;

    #[test]
    fn paths_should_be_resource_k8s_io_v1() {
        assert_eq!(
            ResourceClaim::url_path(&(), Some("ns1")),
            "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims"
        );
        assert_eq!(
            ResourceSlice::url_path(&(), None),
            "/apis/resource.k8s.io/v1/resourceslices"
        );
    }

    fn claim(reserved_for: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "p-nic-x7k2q", "namespace": "ns1", "uid": "c1",
                         "annotations": {"resource.kubernetes.io/pod-claim-name": "nic"}},
            "spec": {"devices": {"requests": [{"name": "vf", "exactly": {"deviceClassName": "sriov"}}]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "vf", "driver": "sriov.example.com", "pool": "node-1", "device": "vf-3"},
                            {"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0", "adminAccess": false}
                        ],
                        "config": []
                    },
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]},
                    "allocationTimestamp": "2026-11-30T10:00:00Z"
                },
                "reservedFor": reserved_for,
                "devices": [{"driver": "sriov.example.com", "pool": "node-1", "device": "vf-3",
                             "networkData": {"interfaceName": "ens1f0v3"}}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_should_give_its_devices_only_to_a_pod_it_is_reserved_for() {
        let c = claim(json!([{"resource": "pods", "name": "p", "uid": "uid-p"}]));
        let devices: Vec<&str> = c
            .devices_for("uid-p")
            .iter()
            .map(|d| d.device.as_str())
            .collect();
        assert_eq!(devices, ["vf-3", "gpu-0"]);
        assert_eq!(c.devices_for("uid-q"), &[]);
        assert_eq!(c.devices_for(""), &[]);
        let other_kind = claim(
            json!([{"apiGroup": "apps", "resource": "deployments", "name": "p", "uid": "uid-p"}]),
        );
        assert_eq!(other_kind.devices_for("uid-p"), &[]);
        let unallocated: ResourceClaim =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "status": {"reservedFor": [{"resource": "pods", "uid": "uid-p"}]}}))
                .unwrap();
        assert_eq!(unallocated.devices_for("uid-p"), &[]);
    }

    #[test]
    fn a_pods_claims_should_be_those_its_spec_names_or_its_status_gives() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns1", "uid": "uid-p"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "nic", "resourceClaimTemplateName": "nic-template"},
                {"name": "shared", "resourceClaimName": "shared-vfs"},
                {"name": "pending", "resourceClaimTemplateName": "t"}
            ]},
            "status": {"resourceClaimStatuses": [
                {"name": "nic", "resourceClaimName": "p-nic-7xk2q"},
                {"name": "pending"}
            ]}
        }))
        .unwrap();
        assert_eq!(claim_names(&pod), ["p-nic-7xk2q", "shared-vfs"]);
        assert!(claim_names(&Pod::default()).is_empty());
    }

    #[test]
    fn a_slice_should_keep_only_devices_with_both_cni_attributes() {
        let slice: ResourceSlice = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "node-1-sriov-abcde", "ownerReferences": [{"kind": "Node", "name": "node-1"}]},
            "spec": {
                "driver": "sriov.example.com",
                "nodeName": "node-1",
                "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "vf-3", "attributes": {
                        "k8s.cni.cncf.io/deviceID": {"string": "0000:3b:02.3"},
                        "k8s.cni.cncf.io/resourceName": {"string": "example.com/vf"},
                        "sriov.example.com/pfName": {"string": "ens1f0"},
                        "sriov.example.com/numa": {"int": 0}},
                     "capacity": {"bandwidth": {"value": "10G"}}},
                    {"name": "vf-4", "attributes": {"k8s.cni.cncf.io/deviceID": {"string": "0000:3b:02.4"}}},
                    {"name": "vf-5", "attributes": {"k8s.cni.cncf.io/resourceName": {"string": "example.com/vf"}}},
                    {"name": "vf-6", "attributes": {"k8s.cni.cncf.io/deviceID": {"int": 6},
                        "k8s.cni.cncf.io/resourceName": {"string": "example.com/vf"}}},
                    {"name": "vf-7"}
                ]
            }
        }))
        .unwrap();
        assert_eq!(slice.key(), ("", "node-1-sriov-abcde"));
        let kept = slice.into_value(&mut Texts::default());
        assert_eq!(
            kept.devices,
            vec![(
                "vf-3".into(),
                "0000:3b:02.3".into(),
                "example.com/vf".into()
            )]
        );
        let at = |driver: &str, pool: &str, device: &str| AllocatedDevice {
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
        };
        assert_eq!(
            kept.find(&at("sriov.example.com", "node-1", "vf-3")),
            Some(("0000:3b:02.3", "example.com/vf"))
        );
        assert_eq!(kept.find(&at("sriov.example.com", "node-2", "vf-3")), None);
        assert_eq!(kept.find(&at("other.example.com", "node-1", "vf-3")), None);
        assert_eq!(kept.find(&at("sriov.example.com", "node-1", "vf-4")), None);
    }
}
