//! The NetworkAttachmentDefinition resource (`k8s.cni.cncf.io/v1`), as the
//! de-facto standard defines it: metadata and an optional `spec.config`
//! string holding a CNI configuration (or nothing, naming a file in
//! `confDir` by the NAD's name).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkAttachmentDefinition {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Spec>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// A CNI configuration (single plugin or list) as JSON text; empty or
    /// absent: the file in `confDir` whose network name is the NAD's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
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
            .get("k8s.v1.cni.cncf.io/resourceName")
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
}
