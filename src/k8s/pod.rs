//! Which pod a CNI call is for: the `K8S_POD_*` keys a Kubernetes runtime
//! puts in `CNI_ARGS` (containerd and CRI-O both do).

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
