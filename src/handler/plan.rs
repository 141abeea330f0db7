//! Plans as the engine carries them out ([`Plan`]): a pod's from pod
//! planning, a plain container's from the configured networks and those
//! the call asks for; and an ADD's answer from what its plan attached.

use serde_json::{Map, Value};

use super::{call_log, failure::failure, CniHandler};
use crate::api::code;
use crate::cni::default_route::Ecmp;
use crate::cni::plan::{self, Attached, Plan};
use crate::cni::{self, ErrorKind, Planned};
use crate::k8s::publish::Shown;
use crate::result;
use crate::selection::{self, pod, pod::Configs};
use crate::server::{Failure, FailureKind, Reply};

/// A pod's plan: its networks, then the auxiliary chain.
pub(super) fn of_pod(planned: pod::Plan) -> Result<Plan, Ecmp> {
    let networks = planned
        .networks
        .into_iter()
        .chain(planned.auxiliary)
        .map(|n| {
            let mut planned = Planned::new(n.list, n.ifname, n.primary);
            planned.cni_args = Some(n.cni_args);
            planned.capability_args = n.capability_args;
            plan::Network {
                planned,
                shown_as: n.display_name,
                default_route: n.default_route,
                copy_device_info: n.copy_device_info,
            }
        })
        .collect();
    Plan::new(networks)
}

impl CniHandler {
    /// The networks a call for `ifname` gets (see [`selection::select`]),
    /// every one loaded before anything runs, then the auxiliary chain
    /// (interface `net<N>`, the call's CNI_ARGS and capability arguments).
    pub(super) async fn plan(
        &self,
        cfg: &selection::Config,
        ifname: &str,
        requested: &[selection::Element],
        config: &Map<String, Value>,
    ) -> Result<Vec<Planned>, cni::Error> {
        let selected = selection::select(cfg, ifname, requested).map_err(|e| {
            cni::Error::new(
                ErrorKind::Invalid,
                code::INVALID_NETWORK_CONFIG,
                e.to_string(),
            )
        })?;
        let configs = self.configs(cfg, config);
        let mut planned = Vec::with_capacity(selected.len() + 1);
        for s in selected {
            let list = configs.load_selected(&s).await?;
            let primary = s.is_primary();
            planned.push(Planned::new(list, s.ifname, primary));
        }
        if let Some(name) = &cfg.auxiliary_chain {
            if let Some(list) = configs.auxiliary_chain(name).await? {
                let ifname = format!("net{}", planned.len());
                planned.push(Planned::new(list, ifname, false));
            }
        }
        Ok(planned)
    }
}

/// The answer to an ADD that attached `attached`: the runtime's network's
/// result, always in the newest version whatever the caller's config says
/// (multus-shim decodes the answer as 1.x and converts it itself, and so
/// does plexus-shim). Each network is noted for the call's log line.
pub(super) fn answer(attached: &[Attached]) -> Result<Reply, Failure> {
    for a in attached {
        call_log::note(&a.shown_as, &a.network.ifname, &a.network.result);
    }
    let primary = Attached::primary(attached).map_err(failure)?;
    let out = result::convert(&primary.network.result, result::LATEST)
        .map_err(|e| Failure::new(FailureKind::Failed, e.code(), e.to_string()))?;
    Ok(Reply::Result(out))
}

/// What a pod is shown of the networks its ADD attached (network-status).
pub(super) fn shown(attached: &[Attached]) -> Vec<Shown<'_>> {
    attached
        .iter()
        .map(|a| Shown {
            name: &a.shown_as,
            result: &a.network.result,
            primary: a.network.primary,
            device_info: a.device_info.as_ref(),
        })
        .collect()
}
