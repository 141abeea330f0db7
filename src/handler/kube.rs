//! ADD for a Kubernetes pod, joined from the parts: the pod from the
//! caches (`k8s`), its plan (`selection::pod`), the plan carried out
//! (`cni`), what the pod learns of it published (`k8s::publish`).

use serde_json::{Map, Value};

use super::failure::{api_failure, bad_config, failure, internal, plan_failure};
use super::source::Kubernetes;
use super::{plan, CniHandler};
use crate::k8s::{status, PodRef};
use crate::netconf::Invocation;
use crate::selection::{self, pod};
use crate::server::{Failure, Reply};

impl CniHandler {
    /// ADD for `pod_ref`: a pod that is gone gets multus's placeholder
    /// result and nothing else; otherwise its plan is carried out and its
    /// `network-status` written.
    pub(super) async fn add_for_pod(
        &self,
        k: &Kubernetes,
        cfg: &selection::Config,
        inv: &Invocation,
        pod_ref: &PodRef,
        config: &Map<String, Value>,
    ) -> Result<Reply, Failure> {
        k.synced_for_add(&inv.container_id).await?;
        let found = k
            .source
            .pod(&pod_ref.namespace, &pod_ref.name, pod_ref.uid());
        let Some(pod) = found.await.map_err(|e| api_failure(pod_ref, e))? else {
            return gone(inv, pod_ref);
        };
        let cap_args = super::capability_args(config);
        let request = pod::Request {
            pod: pod::Pod {
                namespace: &pod.namespace,
                name: &pod.name,
                uid: &pod.uid,
                annotations: &pod.annotations,
            },
            container_id: &inv.container_id,
            ifname: &inv.ifname,
            runtime_uid: pod_ref.uid.as_deref(),
            infra_container_id: pod_ref.infra_container_id.as_deref(),
            capability_args: &cap_args,
            device_info_dir: k.source.device_info_dir(),
        };
        let configs = self.configs(cfg, config);
        let planned = match pod::plan(cfg, &request, k.source.as_ref(), &configs).await {
            Ok(p) => p,
            Err(e) => {
                if matches!(e, pod::Error::Nad(selection::nad::Error::NotFound { .. })) {
                    k.publisher.no_network(&pod, &e.to_string());
                }
                return Err(plan_failure(e));
            }
        };
        // Before anything runs: an ECMP request fails the ADD.
        let plan = plan::of_pod(planned)
            .map_err(|e| bad_config(format!("pod {}/{}: {e}", pod.namespace, pod.name)))?;
        let attached = self
            .engine
            .carry_out(inv, cap_args, plan)
            .await
            .map_err(failure)?;
        // A refusal that will not change fails the ADD; the attachment
        // stays recorded, so the runtime's DEL removes it.
        k.publisher
            .added(&pod, &plan::shown(&attached))
            .await
            .map_err(|e| api_failure(pod_ref, e))?;
        plan::answer(&attached)
    }
}

/// As multus: the pod is gone, so its sandbox is about to go too; nothing
/// is attached and nothing recorded.
fn gone(inv: &Invocation, pod_ref: &PodRef) -> Result<Reply, Failure> {
    tracing::info!(namespace = %pod_ref.namespace, pod = %pod_ref.name, container_id = %inv.container_id, "the pod does not exist: nothing attached");
    let placeholder = status::pod_missing_result(&inv.ifname, &inv.netns);
    let value = serde_json::to_value(&placeholder).map_err(|e| internal(e.to_string()))?;
    Ok(Reply::Result(value))
}
