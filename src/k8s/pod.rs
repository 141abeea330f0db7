//! Which pod a CNI call is for: the `K8S_POD_*` keys a Kubernetes runtime
//! puts in `CNI_ARGS` (containerd and CRI-O both do); and a pod as the
//! cache and the GET of a missing pod read it ([`PodMeta`]).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use super::cache::{Slim, Texts};
use super::PodInfo;
use crate::selection::pod::POD_ANNOTATIONS;

/// The annotation that tells a static pod's mirror object
/// ([`PodInfo::is_static`]).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

/// The annotations a pod is decoded with: those pod planning reads and
/// the static pod marker.
const KEPT_ANNOTATIONS: [&str; POD_ANNOTATIONS.len() + 1] = {
    let mut kept = [CONFIG_SOURCE_ANNOTATION; POD_ANNOTATIONS.len() + 1];
    let mut i = 0;
    while i < POD_ANNOTATIONS.len() {
        kept[i] = POD_ANNOTATIONS[i];
        i += 1;
    }
    kept
};

/// A pod's metadata, asked for as `PartialObjectMetadata` (the API server
/// sends no spec or status) and decoded down to name, namespace, uid,
/// resourceVersion and the annotations Plexus reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PodMeta {
    #[serde(default, deserialize_with = "metadata")]
    pub metadata: ObjectMeta,
}

fn metadata<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    super::slim::decode_meta(d, &KEPT_ANNOTATIONS)
}

/// `kube::Resource` for a type that holds a core/v1 pod (or its
/// metadata) in `metadata`; `metadata_api` asks for metadata only.
macro_rules! pod_resource {
    ($ty:ty, metadata_api: $meta:expr) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn metadata_api() -> bool {
                $meta
            }

            fn kind(_: &()) -> Cow<'_, str> {
                "Pod".into()
            }

            fn group(_: &()) -> Cow<'_, str> {
                "".into()
            }

            fn version(_: &()) -> Cow<'_, str> {
                "v1".into()
            }

            fn plural(_: &()) -> Cow<'_, str> {
                "pods".into()
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

// Requests for a pod's metadata ask for metadata only.
pod_resource!(PodMeta, metadata_api: true);

impl Slim for PodMeta {
    type Value = PodInfo;

    fn key(&self) -> (&str, &str) {
        (
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    fn into_value(self, _: &mut Texts) -> PodInfo {
        PodInfo::from_meta(self.metadata)
    }

    fn release(_: PodInfo, _: &mut Texts) {}
}

/// A whole pod as the API server sends it (a PATCH of its status answers
/// with it, a LIST of the node's pods lists them), decoded down to its
/// metadata and its resource claims: the rest of the object (spec,
/// containers, volumes, status) is skipped unread.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct SlimPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<SlimPodSpec>,
    #[serde(default)]
    pub status: Option<SlimPodStatus>,
}

/// `spec.resourceClaims`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodSpec {
    #[serde(default)]
    pub resource_claims: Option<Vec<PodClaim>>,
}

/// `status.resourceClaimStatuses`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodStatus {
    #[serde(default)]
    pub resource_claim_statuses: Option<Vec<PodClaim>>,
}

/// One of a pod's claims (spec) or the claim made for it (status): its
/// name in the pod and the ResourceClaim's, when known.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodClaim {
    pub name: String,
    #[serde(default)]
    pub resource_claim_name: Option<String>,
}

pod_resource!(SlimPod, metadata_api: false);

/// The pod a call names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID`; `None` when the runtime did not send one (older
    /// runtimes), `Some("")` when it sent an empty one: then no uid check.
    pub uid: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`, passed on to the plugins.
    pub infra_container_id: Option<String>,
}

/// Why a call's pod keys are unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "required CNI variable missing: K8S_POD_NAMESPACE={namespace:?}, K8S_POD_NAME={name:?} \
     (a call for a pod needs both)"
)]
pub struct Incomplete {
    pub namespace: String,
    pub name: String,
}

impl PodRef {
    /// The pod named by the call's `CNI_ARGS` pairs. `Ok(None)`: neither
    /// `K8S_POD_NAMESPACE` nor `K8S_POD_NAME` is there, so the call is not
    /// for a Kubernetes pod (a container of podman, say) and gets the
    /// static networks. One of them missing or empty is an error, as in
    /// multus.
    pub fn from_args(pairs: &[(String, String)]) -> Result<Option<Self>, Incomplete> {
        let get = |key: &str| {
            pairs
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let namespace = get("K8S_POD_NAMESPACE");
        let name = get("K8S_POD_NAME");
        match (namespace, name) {
            (None, None) => Ok(None),
            (Some(namespace), Some(name)) if !namespace.is_empty() && !name.is_empty() => {
                Ok(Some(Self {
                    namespace,
                    name,
                    uid: get("K8S_POD_UID"),
                    infra_container_id: get("K8S_POD_INFRA_CONTAINER_ID"),
                }))
            }
            (namespace, name) => Err(Incomplete {
                namespace: namespace.unwrap_or_default(),
                name: name.unwrap_or_default(),
            }),
        }
    }

    /// The uid to check the pod against, if any.
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref().filter(|u| !u.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn pods_should_be_asked_for_as_metadata_and_kept_slim() {
        assert_eq!(PodMeta::url_path(&(), None), "/api/v1/pods");
        assert!(PodMeta::metadata_api());
        let pod: PodMeta = serde_json::from_value(serde_json::json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "5",
                "labels": {"app": "x"},
                "annotations": {
                    "k8s.v1.cni.cncf.io/networks": "net1",
                    "v1.multus-cni.io/default-network": "ns/def",
                    "kubernetes.io/config.source": "file",
                    "kubernetes.io/config.seen": "2025-01-01T00:00:00Z",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                },
                "managedFields": [{"manager": "kubelet"}],
                "ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}],
            },
        }))
        .unwrap();
        let info = pod.into_value(&mut Texts::default());
        assert_eq!(
            (
                info.namespace.as_str(),
                info.name.as_str(),
                info.uid.as_str()
            ),
            ("ns", "p", "u")
        );
        let kept: Vec<&str> = info.annotations.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "k8s.v1.cni.cncf.io/networks",
                "kubernetes.io/config.source",
                "v1.multus-cni.io/default-network"
            ]
        );
        assert!(info.is_static());
    }

    fn pairs(text: &str) -> Vec<(String, String)> {
        text.split(';')
            .filter(|s| !s.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    #[test]
    fn containerds_args_should_name_the_pod_in_any_order() {
        let p = PodRef::from_args(&pairs(
            "K8S_POD_UID=u-1;IgnoreUnknown=1;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_NAMESPACE=prod",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            p,
            PodRef {
                namespace: "prod".into(),
                name: "web-0".into(),
                uid: Some("u-1".into()),
                infra_container_id: Some("abc".into()),
            }
        );
        assert_eq!(p.uid(), Some("u-1"));
    }

    #[test]
    fn calls_without_pod_keys_should_not_be_pod_calls() {
        assert_eq!(PodRef::from_args(&pairs("IgnoreUnknown=1")), Ok(None));
        assert_eq!(PodRef::from_args(&[]), Ok(None));
    }

    #[test]
    fn half_a_pod_should_be_an_error_naming_both_keys() {
        for args in [
            "K8S_POD_NAMESPACE=ns",
            "K8S_POD_NAME=p",
            "K8S_POD_NAMESPACE=;K8S_POD_NAME=p",
            "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=",
        ] {
            let e = PodRef::from_args(&pairs(args)).unwrap_err();
            assert!(e.to_string().contains("K8S_POD_NAMESPACE"), "{args}: {e}");
        }
    }

    #[test]
    fn an_empty_uid_should_mean_no_uid_check() {
        let p = PodRef::from_args(&pairs("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID="))
            .unwrap()
            .unwrap();
        assert_eq!(p.uid, Some(String::new()));
        assert_eq!(p.uid(), None);
    }
}
