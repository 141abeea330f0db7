//! The NetworkAttachmentDefinition resource (`k8s.cni.cncf.io/v1`), as the
//! de-facto standard defines it: metadata and an optional `spec.config`
//! string holding a CNI configuration (or nothing, naming a file in
//! `confDir` by the NAD's name).
//!
//! Decoded only as far as pod planning reads it ([`Nad`]): name,
//! namespace, resourceVersion, the `resourceName` annotation and
//! `spec.config`; the cache keeps a [`CachedNad`] of it.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use super::cache::{Slim, Texts};
use crate::selection::pod::{Nad, RESOURCE_NAME_ANNOTATION};

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct NetworkAttachmentDefinition {
    #[serde(default, deserialize_with = "metadata")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<Spec>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Spec {
    /// A CNI configuration (single plugin or list) as JSON text; empty or
    /// absent: the file in `confDir` whose network name is the NAD's name.
    #[serde(default)]
    pub config: Option<String>,
}

/// The annotations a NAD is decoded with.
const KEPT_ANNOTATIONS: &[&str] = &[RESOURCE_NAME_ANNOTATION];

fn metadata<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    super::slim::decode_meta(d, KEPT_ANNOTATIONS)
}

/// What the cache keeps of a NAD (besides its namespace and name): the
/// texts pod planning reads, shared with the NADs that have the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedNad {
    /// `spec.config` as given, when it is not empty.
    config: Option<Arc<str>>,
    resource_name: Option<Arc<str>>,
}

impl CachedNad {
    /// The NAD as pod planning reads it.
    pub fn to_nad(&self) -> Nad {
        Nad {
            config: self.config.as_deref().map(str::to_string),
            resource_name: self.resource_name.as_deref().map(str::to_string),
        }
    }
}

impl Slim for NetworkAttachmentDefinition {
    type Value = CachedNad;

    fn key(&self) -> (&str, &str) {
        (
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    fn into_value(self, texts: &mut Texts) -> CachedNad {
        CachedNad {
            config: self.config().map(|c| texts.share(c)),
            resource_name: self.resource_name().map(|r| texts.share(r)),
        }
    }

    fn release(value: CachedNad, texts: &mut Texts) {
        for t in [value.config, value.resource_name].into_iter().flatten() {
            texts.release(t);
        }
    }
}

impl NetworkAttachmentDefinition {
    /// `spec.config`, when it is not empty.
    pub fn config(&self) -> Option<&str> {
        self.spec
            .as_ref()
            .and_then(|s| s.config.as_deref())
            .filter(|c| !c.trim().is_empty())
    }

    /// The NAD's `k8s.v1.cni.cncf.io/resourceName` annotation.
    pub fn resource_name(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(RESOURCE_NAME_ANNOTATION)
            .map(String::as_str)
    }
}

impl kube::Resource for NetworkAttachmentDefinition {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "NetworkAttachmentDefinition".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "k8s.cni.cncf.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "network-attachment-definitions".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn the_resource_path_should_be_the_crds() {
        assert_eq!(
            NetworkAttachmentDefinition::url_path(&(), Some("ns1")),
            "/apis/k8s.cni.cncf.io/v1/namespaces/ns1/network-attachment-definitions"
        );
    }

    #[test]
    fn empty_and_missing_configs_should_be_none() {
        let parse = |v: serde_json::Value| -> NetworkAttachmentDefinition {
            serde_json::from_value(v).unwrap()
        };
        assert_eq!(
            parse(serde_json::json!({"metadata": {"name": "a"}})).config(),
            None
        );
        assert_eq!(
            parse(serde_json::json!({"metadata": {}, "spec": {"config": "  "}})).config(),
            None
        );
        assert_eq!(
            parse(serde_json::json!({"metadata": {}, "spec": {"config": "{}"}})).config(),
            Some("{}")
        );
    }

    /// What selection and network-status read of a NAD is all that is
    /// decoded and kept: not its managedFields, labels or other
    /// annotations.
    #[test]
    fn a_nad_should_be_decoded_and_kept_slim() {
        let config = "{ \"cniVersion\": \"0.3.1\", \"type\": \"macvlan\" }\n";
        let nad: NetworkAttachmentDefinition = serde_json::from_value(serde_json::json!({
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {
                "name": "net", "namespace": "ns", "uid": "u", "resourceVersion": "9",
                "generation": 2, "labels": {"team": "a"},
                "annotations": {
                    "k8s.v1.cni.cncf.io/resourceName": "example.com/vf",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\": true}",
                },
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:config": {}}}}],
            },
            "spec": {"config": config, "other": 1},
        }))
        .unwrap();
        assert_eq!(
            nad.metadata,
            ObjectMeta {
                name: Some("net".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some("9".into()),
                annotations: Some(
                    [(
                        RESOURCE_NAME_ANNOTATION.to_string(),
                        "example.com/vf".to_string()
                    )]
                    .into()
                ),
                ..ObjectMeta::default()
            }
        );
        let mut texts = Texts::default();
        assert_eq!(nad.key(), ("ns", "net"));
        let kept = nad.into_value(&mut texts);
        assert_eq!(
            kept.to_nad(),
            Nad {
                config: Some(config.to_string()),
                resource_name: Some("example.com/vf".into()),
            }
        );
        // Two pointers: nothing else of the object is there to hold.
        assert_eq!(
            std::mem::size_of::<CachedNad>(),
            2 * std::mem::size_of::<Arc<str>>()
        );
    }
}
