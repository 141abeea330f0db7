//! The network configurations of a call, as selection asks for them: the
//! engine owns the confDir lookups (and their cache) and the auxiliary
//! chain's files, the call's configuration the confDir, the inline
//! delegates and the `cniVersion` the auxiliary chain runs at.

use serde_json::{Map, Value};

use super::CniHandler;
use crate::api::code;
use crate::cni::{self, ErrorKind};
use crate::netconf::{ConfigError, NetworkList};
use crate::result;
use crate::selection::{self, pod};

/// One call's network configurations ([`pod::Configs`]).
pub(super) struct CallConfigs<'a> {
    handler: &'a CniHandler,
    cfg: &'a selection::Config,
    /// The call's network configuration.
    config: &'a Map<String, Value>,
}

impl pod::Configs for CallConfigs<'_> {
    type Error = cni::Error;

    async fn load_network(&self, name: &str) -> Result<NetworkList, ConfigError> {
        self.handler
            .load_network(self.cfg, name)
            .await
            .map_err(|e| ConfigError::File {
                file: "confDir".into(),
                why: e.msg,
            })
    }

    async fn load_selected(&self, s: &selection::Selected) -> Result<NetworkList, cni::Error> {
        match s.inline {
            Some(i) => inline_network(self.cfg, i),
            None => self.handler.load_network(self.cfg, &s.network).await,
        }
    }

    /// The chain next to the cluster network (a path then), at the call's
    /// `cniVersion`.
    async fn auxiliary_chain(&self, name: &str) -> Result<Option<NetworkList>, cni::Error> {
        let version = self
            .config
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or(result::LATEST);
        self.handler
            .engine
            .aux_chain(&self.cfg.cluster_network, name, version)
            .await
    }
}

/// No cluster: outside Kubernetes there are no NADs, and pod planning
/// asks for devices only for a NAD's network.
pub(super) struct NoCluster;

impl pod::Cluster for NoCluster {
    fn network_attachment(&self, _namespace: &str, _name: &str) -> Option<pod::Nad> {
        None
    }

    async fn pod_devices(&self, _pod: &pod::Pod<'_>) -> Result<pod::DeviceIds, pod::DevicesError> {
        Ok(pod::DeviceIds::new())
    }

    async fn pod_claim_devices(
        &self,
        _pod: &pod::Pod<'_>,
    ) -> Result<pod::DeviceIds, pod::DevicesError> {
        Ok(pod::DeviceIds::new())
    }
}

impl CniHandler {
    /// The network configurations of a call under `cfg` with `config`.
    pub(super) fn configs<'a>(
        &'a self,
        cfg: &'a selection::Config,
        config: &'a Map<String, Value>,
    ) -> CallConfigs<'a> {
        CallConfigs {
            handler: self,
            cfg,
            config,
        }
    }

    /// Every network of `cfg` attached before the requested ones:
    /// clusterNetwork and defaultNetworks, or the delegates.
    pub(super) async fn configured_lists(
        &self,
        cfg: &selection::Config,
    ) -> Vec<Result<NetworkList, cni::Error>> {
        if cfg.cluster_network.is_empty() {
            return (0..cfg.delegates.len())
                .map(|i| inline_network(cfg, i))
                .collect();
        }
        let mut out = Vec::with_capacity(1 + cfg.default_networks.len());
        for name in std::iter::once(&cfg.cluster_network).chain(&cfg.default_networks) {
            out.push(self.load_network(cfg, name).await);
        }
        out
    }

    /// A network by name (from the call's confDir, else the daemon's) or
    /// path.
    pub(super) async fn load_network(
        &self,
        cfg: &selection::Config,
        network: &str,
    ) -> Result<NetworkList, cni::Error> {
        match &cfg.conf_dir {
            Some(dir) => self.engine.load_in(dir, network).await,
            None => self.engine.load(network).await,
        }
    }
}

/// The `i`th of multus's inline network configurations (`delegates`):
/// a list when it has `plugins`, else a single plugin.
fn inline_network(cfg: &selection::Config, i: usize) -> Result<NetworkList, cni::Error> {
    let invalid =
        |why: String| cni::Error::new(ErrorKind::Invalid, code::INVALID_NETWORK_CONFIG, why);
    let value = cfg
        .delegates
        .get(i)
        .ok_or_else(|| invalid(format!("delegates[{i}]: no such delegate")))?;
    let single = value.get("plugins").is_none();
    let label = format!("delegates[{i}]");
    NetworkList::from_value(std::path::Path::new(&label), value.clone(), single)
        .map_err(|e| invalid(e.to_string()))
}
