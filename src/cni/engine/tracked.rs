//! What the retry task knows of a container whose record holds pending
//! cleanups, taken from the record as written: when the next retry is due,
//! the pod, and the causes (docs/records.md, "Pending cleanup").

use crate::cni::state::{Attachment, Cleanup, Record};

/// What the retry task knows of a container with a pending cleanup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Tracked {
    /// When its next retry is due (unix ms).
    pub(super) due: u64,
    /// Its pod (`K8S_POD_UID`, else `K8S_POD_NAMESPACE/K8S_POD_NAME`), if
    /// the runtime named one.
    pub(super) pod: Option<String>,
    /// The first failure of its newest pending cleanup (unix ms).
    pub(super) since: u64,
    /// The last error of each pending cleanup, without the container's
    /// own name (see [`cause`]).
    pub(super) causes: Vec<String>,
}

impl Tracked {
    /// What the retry task needs of `record`; `None` when nothing of it
    /// waits for a retry (a record without failed DELs, most of them).
    pub(super) fn of(record: &Record) -> Option<Self> {
        let pending: Vec<(&Attachment, &Cleanup)> = record
            .attachments
            .iter()
            .filter_map(|a| a.cleanup.as_ref().map(|c| (a, c)))
            .collect();
        let due = pending.iter().map(|(_, c)| c.next_attempt_ms).min()?;
        Some(Self {
            due,
            pod: pending.iter().find_map(|(a, _)| pod_of(&a.cni_args)),
            since: pending
                .iter()
                .map(|(_, c)| c.first_failure_ms)
                .max()
                .unwrap_or(0),
            causes: pending
                .iter()
                .map(|(_, c)| cause(&c.last_error).to_string())
                .collect(),
        })
    }
}

/// The pod a container belongs to, from its `CNI_ARGS`.
pub(super) fn pod_of(cni_args: &str) -> Option<String> {
    let pairs = crate::netconf::parse_args(cni_args).ok()?;
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    if let Some(uid) = get("K8S_POD_UID") {
        return Some(uid.to_string());
    }
    Some(format!(
        "{}/{}",
        get("K8S_POD_NAMESPACE")?,
        get("K8S_POD_NAME")?
    ))
}

/// A DEL's error without what names the container (the joined errors'
/// preamble): the same failure of two containers reads the same.
pub(super) fn cause(error: &str) -> &str {
    error
        .split_once(" error(s): ")
        .map_or(error, |(_, rest)| rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_should_be_told_by_uid_else_by_namespace_and_name() {
        let k8s = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=u-1";
        assert_eq!(pod_of(k8s).as_deref(), Some("u-1"));
        assert_eq!(
            pod_of("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web").as_deref(),
            Some("ns/web")
        );
        assert_eq!(pod_of("K8S_POD_NAME=web"), None);
        assert_eq!(pod_of("IgnoreUnknown=1;K8S_POD_UID="), None);
        assert_eq!(pod_of(""), None);
    }

    #[test]
    fn causes_should_not_name_the_container() {
        let a = r#"DEL of container "a" ifname "eth0" failed with 1 error(s): DEL network "mv": Link not found"#;
        let b = r#"DEL of the rollback failed with 1 error(s): DEL network "mv": Link not found"#;
        assert_eq!(cause(a), cause(b));
        assert_eq!(cause("plain"), "plain");
    }
}
