//! STATUS: whether the networks every pod gets can serve ADDs. The cluster
//! network and each default network (or each delegate) is resolved as
//! pod planning resolves it (in Kubernetes, a NAD of that name in
//! multusNamespace, else confDir) and its plugins asked (CNI 1.1.0 and
//! later); one that cannot be loaded or whose plugins say no makes STATUS
//! fail, naming it, since every new pod would fail on it.

use serde_json::{Map, Value};

use super::configs::NoCluster;
use super::failure::{bad_config, failure, plan_failure, unavailable};
use super::CniHandler;
use crate::selection::{self, pod};
use crate::server::{Failure, Reply};

impl CniHandler {
    pub(super) async fn status(
        &self,
        cfg: &selection::Config,
        config: &Map<String, Value>,
    ) -> Result<Reply, Failure> {
        let configs = self.configs(cfg, config);
        let networks = match &self.kubernetes {
            Some(k) => pod::configured(cfg, k.source.as_ref(), &configs).await,
            None => pod::configured(cfg, &NoCluster, &configs).await,
        }
        .map_err(|e| bad_config(e.to_string()))?;
        // A network that is no file may be a NAD the caches do not hold
        // yet.
        let unsynced = self.kubernetes.as_ref().is_some_and(|k| !k.source.synced());
        let mut not_ready: Vec<(String, Failure)> = Vec::new();
        for (name, list) in networks {
            let asked = match list {
                Ok(list) => self.engine.status(&list).await.map_err(failure),
                Err(pod::Error::Load(e)) if unsynced => Err(unavailable(format!(
                    "{}; the Kubernetes caches have not synced, so a \
                     NetworkAttachmentDefinition of that name is not known yet: try again later",
                    e.msg
                ))),
                Err(e) => Err(plan_failure(e)),
            };
            if let Err(f) = asked {
                not_ready.push((name, f));
            }
        }
        match not_ready_failure(not_ready) {
            None => Ok(Reply::Done),
            Some(f) => Err(f),
        }
    }
}

/// One failure for the networks that are not ready (each named, with its
/// error): the first one's kind, code and details.
fn not_ready_failure(not_ready: Vec<(String, Failure)>) -> Option<Failure> {
    let msg = not_ready
        .iter()
        .map(|(name, f)| format!("network {name:?} is not ready: {}", f.error.msg))
        .collect::<Vec<_>>()
        .join("; ");
    let (_, mut first) = not_ready.into_iter().next()?;
    first.error.msg = msg;
    Some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::code;
    use crate::server::FailureKind;

    #[test]
    fn every_network_not_ready_should_be_named_with_the_first_ones_code() {
        assert!(not_ready_failure(Vec::new()).is_none());
        let f = not_ready_failure(vec![
            (
                "extra".into(),
                Failure::new(
                    FailureKind::Failed,
                    code::INVALID_NETWORK_CONFIG,
                    "no such file",
                )
                .with_details("d"),
            ),
            ("more".into(), unavailable("later")),
        ])
        .unwrap();
        assert_eq!(f.error.code, code::INVALID_NETWORK_CONFIG);
        assert_eq!(f.error.details, "d");
        assert_eq!(
            f.error.msg,
            "network \"extra\" is not ready: no such file; network \"more\" is not ready: later"
        );
    }
}
