//! Decoding an object's `metadata` down to what the caches keep: name,
//! namespace, uid, resourceVersion (the watch resumes from it) and the few
//! annotations asked for. Everything else (`managedFields`, labels, owner
//! references, kubectl's `last-applied-configuration`, which repeats the
//! whole object) is skipped while the JSON is read and never allocated:
//! at 100,000 objects that is most of a list's decoding cost.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

/// Decodes `metadata`, keeping only the annotations named in `keep`.
pub fn decode_meta<'de, D: Deserializer<'de>>(
    d: D,
    keep: &'static [&'static str],
) -> Result<ObjectMeta, D::Error> {
    d.deserialize_option(Meta { keep })
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    Name,
    Namespace,
    Uid,
    ResourceVersion,
    Annotations,
    #[serde(other)]
    Other,
}

struct Meta {
    keep: &'static [&'static str],
}

impl<'de> Visitor<'de> for Meta {
    type Value = ObjectMeta;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("object metadata")
    }

    fn visit_none<E: de::Error>(self) -> Result<ObjectMeta, E> {
        Ok(ObjectMeta::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<ObjectMeta, E> {
        Ok(ObjectMeta::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<ObjectMeta, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ObjectMeta, A::Error> {
        let mut meta = ObjectMeta::default();
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Name => meta.name = map.next_value()?,
                Field::Namespace => meta.namespace = map.next_value()?,
                Field::Uid => meta.uid = map.next_value()?,
                Field::ResourceVersion => meta.resource_version = map.next_value()?,
                Field::Annotations => {
                    let kept = map.next_value_seed(Annotations { keep: self.keep })?;
                    meta.annotations = (!kept.is_empty()).then_some(kept);
                }
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(meta)
    }
}

/// The annotations named in `keep`, the others skipped.
struct Annotations {
    keep: &'static [&'static str],
}

impl<'de> DeserializeSeed<'de> for Annotations {
    type Value = BTreeMap<String, String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Annotations {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of annotations")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = BTreeMap::new();
        while let Some(key) = map.next_key_seed(Pick { keep: self.keep })? {
            match key {
                Some(key) => {
                    kept.insert(key.to_string(), map.next_value::<String>()?);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(kept)
    }
}

/// A map key: which of `keep` it is, if any (without allocating it).
struct Pick {
    keep: &'static [&'static str],
}

impl<'de> DeserializeSeed<'de> for Pick {
    type Value = Option<&'static str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Pick {
    type Value = Option<&'static str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an annotation name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.keep.iter().copied().find(|k| *k == key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Object {
        #[serde(deserialize_with = "keep_a")]
        metadata: ObjectMeta,
    }

    fn keep_a<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
        decode_meta(d, &["a"])
    }

    fn meta(json: &str) -> ObjectMeta {
        serde_json::from_str::<Object>(json).unwrap().metadata
    }

    #[test]
    fn metadata_should_keep_identity_and_the_named_annotations_only() {
        let m = meta(
            r#"{"metadata": {"name": "n", "namespace": "ns", "uid": "u",
                "resourceVersion": "7", "labels": {"x": "y"}, "generation": 3,
                "annotations": {"b": "no", "a": "yes", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
                "ownerReferences": [{"kind": "ReplicaSet"}]}}"#,
        );
        assert_eq!(
            m,
            ObjectMeta {
                name: Some("n".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some("7".into()),
                annotations: Some([("a".to_string(), "yes".to_string())].into()),
                ..ObjectMeta::default()
            }
        );
    }

    #[test]
    fn escaped_keys_null_and_missing_parts_should_decode() {
        let m = meta(r#"{"metadata": {"annotations": {"\u0061": "escaped"}, "name": null}}"#);
        assert_eq!(m.annotations.unwrap()["a"], "escaped");
        assert_eq!(m.name, None);
        assert_eq!(
            meta(r#"{"metadata": {"annotations": null}}"#),
            ObjectMeta::default()
        );
        assert_eq!(meta(r#"{"metadata": null}"#), ObjectMeta::default());
        assert_eq!(
            meta(r#"{"metadata": {"annotations": {"b": "1"}}}"#).annotations,
            None
        );
    }
}
