//! multus's per-call overlay: the network configuration a runtime hands
//! the shim (e.g. an unchanged `00-multus.conf`) may name the networks
//! itself; keys set in daemon-config.json win, the others come from the
//! call's configuration.
//!
//! Only the network selection keys ([`REQUEST_KEYS`]) are taken from a
//! call. Everything else (plugin search path, state and cache
//! directories, socket, logging, limits) stays the daemon's: see
//! docs/shim.md for why each one.
//!
//! The common case costs a handful of map look-ups: when a call carries
//! none of the keys daemon-config.json leaves open, the daemon's
//! [`Config`] is shared as it is; a new one is built only for calls that
//! change it.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::{nad, Config, DEFAULT_MULTUS_NAMESPACE};

/// The keys a call's network configuration may supply, when
/// daemon-config.json does not set them.
pub const REQUEST_KEYS: &[&str] = &[
    "clusterNetwork",
    "delegates",
    "defaultNetworks",
    "systemNamespaces",
    "multusNamespace",
    "namespaceIsolation",
    "globalNamespaces",
    "confDir",
    "auxiliaryCNIChainName",
];

/// multus's words for a configuration that names no network.
pub const NO_NETWORKS: &str = "at least one delegate/clusterNetwork must be specified";

/// Why a call's configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Neither daemon-config.json nor the call names a cluster network.
    NoNetworks,
    /// Keys of the call's configuration with the wrong shape, each with
    /// what is wrong.
    Invalid(Vec<(String, String)>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoNetworks => write!(
                f,
                "no networks are configured: {NO_NETWORKS} (set clusterNetwork in the \
                 daemon configuration, or clusterNetwork or delegates in the network \
                 configuration the runtime passes to the plugin)"
            ),
            Error::Invalid(problems) => {
                f.write_str("the call's network configuration")?;
                for (i, (key, why)) in problems.iter().enumerate() {
                    let sep = if i == 0 { ": " } else { "; " };
                    write!(f, "{sep}key {key:?}: {why}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Error {}

/// The daemon's selection configuration and the keys a call may set.
#[derive(Debug, Clone)]
pub struct Overlay {
    base: Arc<Config>,
    /// [`REQUEST_KEYS`] that daemon-config.json leaves unset.
    open: Vec<&'static str>,
}

impl Overlay {
    /// `base` is the daemon's configuration; `set_by_daemon` says which
    /// keys daemon-config.json sets (those a call cannot change).
    pub fn new(base: Config, set_by_daemon: impl Fn(&str) -> bool) -> Self {
        let open = REQUEST_KEYS
            .iter()
            .copied()
            .filter(|k| !set_by_daemon(k))
            // multus ignores delegates when clusterNetwork is set.
            .filter(|k| *k != "delegates" || base.cluster_network.is_empty())
            .collect();
        Self {
            base: Arc::new(base),
            open,
        }
    }

    /// The daemon's own configuration.
    pub fn base(&self) -> &Arc<Config> {
        &self.base
    }

    /// The keys a call may set.
    pub fn open_keys(&self) -> &[&'static str] {
        &self.open
    }

    /// The configuration one call runs with: the daemon's, shared, unless
    /// the call sets a key the daemon leaves open.
    pub fn effective(&self, call: &Map<String, Value>) -> Result<Arc<Config>, Error> {
        let touched = self
            .open
            .iter()
            .any(|k| call.get(*k).is_some_and(|v| !v.is_null()));
        if !touched {
            if !self.base.has_networks() {
                return Err(Error::NoNetworks);
            }
            return Ok(self.base.clone());
        }
        let mut config = (*self.base).clone();
        let mut problems = Vec::new();
        for key in &self.open {
            let Some(value) = call.get(*key).filter(|v| !v.is_null()) else {
                continue;
            };
            if let Err(why) = apply(&mut config, key, value) {
                problems.push((key.to_string(), why));
            }
        }
        if let Some(name) = &config.auxiliary_chain {
            if !config.cluster_network.contains('/') {
                problems.push((
                    "auxiliaryCNIChainName".into(),
                    format!(
                        "{name:?} needs clusterNetwork to be a path (the chain's plugins are \
                         in <directory of clusterNetwork>/{name}/*.conf)"
                    ),
                ));
            }
        }
        if !problems.is_empty() {
            return Err(Error::Invalid(problems));
        }
        if !config.has_networks() {
            return Err(Error::NoNetworks);
        }
        Ok(Arc::new(config))
    }
}

/// Sets `key` of `config` from a call's `value`.
fn apply(config: &mut Config, key: &str, value: &Value) -> Result<(), String> {
    match key {
        "clusterNetwork" => {
            let s = string(value)?;
            if !s.is_empty() {
                config.cluster_network = s.to_string();
            }
        }
        "delegates" => {
            let Value::Array(items) = value else {
                return Err(format!(
                    "must be a list of network configurations, found {}",
                    crate::json::kind(value)
                ));
            };
            if let Some((i, other)) = items.iter().enumerate().find(|(_, d)| !d.is_object()) {
                return Err(format!(
                    "item {i} must be a network configuration (a JSON object), found {}",
                    crate::json::kind(other)
                ));
            }
            config.delegates = items.clone();
        }
        "defaultNetworks" => config.default_networks = string_list(value)?,
        "systemNamespaces" => config.system_namespaces = string_list(value)?,
        "multusNamespace" => {
            let s = string(value)?;
            config.multus_namespace = if s.is_empty() {
                DEFAULT_MULTUS_NAMESPACE.into()
            } else {
                s.to_string()
            };
        }
        "namespaceIsolation" => {
            config.namespace_isolation = value.as_bool().ok_or_else(|| {
                format!("must be true or false, found {}", crate::json::kind(value))
            })?;
        }
        "globalNamespaces" => {
            config.global_namespaces = nad::parse_global_namespaces(string(value)?);
        }
        "confDir" => {
            let s = string(value)?;
            let path = PathBuf::from(s);
            if !path.is_absolute() {
                return Err(format!("{s:?} must be an absolute path"));
            }
            config.conf_dir = Some(path);
        }
        "auxiliaryCNIChainName" => {
            // It names a plugin directory; libcni's rule for those is the
            // spec's rule for network names.
            let s = string(value)?;
            if s.is_empty() {
                config.auxiliary_chain = None;
            } else if crate::names::is_valid_name(s) {
                config.auxiliary_chain = Some(s.to_string());
            } else {
                return Err(format!("{s:?} cannot name a plugin directory"));
            }
        }
        _ => {}
    }
    Ok(())
}

fn string(value: &Value) -> Result<&str, String> {
    value
        .as_str()
        .ok_or_else(|| format!("must be a string, found {}", crate::json::kind(value)))
}

fn string_list(value: &Value) -> Result<Vec<String>, String> {
    let Value::Array(items) = value else {
        return Err(format!(
            "must be a list of strings, found {}",
            crate::json::kind(value)
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            other => Err(format!(
                "item {i} must be a non-empty string, found {}",
                crate::json::kind(other)
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn overlay(base: Config, daemon_keys: &[&str]) -> Overlay {
        Overlay::new(base, |k| daemon_keys.contains(&k))
    }

    #[test]
    fn a_call_without_open_keys_should_share_the_daemons_config() {
        let o = overlay(Config::new("cluster", vec![]), &["clusterNetwork"]);
        let c = o
            .effective(&call(
                json!({"cniVersion": "1.0.0", "clusterNetwork": "other"}),
            ))
            .unwrap();
        assert!(
            Arc::ptr_eq(&c, o.base()),
            "the daemon's key wins, nothing built"
        );
        assert_eq!(c.cluster_network, "cluster");
    }

    #[test]
    fn open_keys_should_come_from_the_call() {
        let o = overlay(Config::default(), &[]);
        let c = o
            .effective(&call(json!({
                "clusterNetwork": "/etc/cni/net.d/10-a.conflist",
                "defaultNetworks": ["b"],
                "multusNamespace": "",
                "namespaceIsolation": true,
                "globalNamespaces": "x,y",
                "confDir": "/etc/cni/multus/net.d",
                "auxiliaryCNIChainName": "aux",
                "binDir": "/tmp/evil",
            })))
            .unwrap();
        assert_eq!(c.cluster_network, "/etc/cni/net.d/10-a.conflist");
        assert_eq!(c.default_networks, ["b"]);
        assert_eq!(c.multus_namespace, DEFAULT_MULTUS_NAMESPACE);
        assert!(c.namespace_isolation);
        assert_eq!(c.global_namespaces, ["x", "y"]);
        assert_eq!(
            c.conf_dir.as_deref(),
            Some(std::path::Path::new("/etc/cni/multus/net.d"))
        );
        assert_eq!(c.auxiliary_chain.as_deref(), Some("aux"));
    }

    #[test]
    fn no_cluster_network_anywhere_should_be_multus_error() {
        let o = overlay(Config::default(), &[]);
        for c in [
            json!({}),
            json!({"clusterNetwork": ""}),
            json!({"delegates": []}),
        ] {
            let e = o.effective(&call(c)).unwrap_err();
            assert_eq!(e, Error::NoNetworks);
            assert!(e.to_string().contains(NO_NETWORKS));
        }
    }

    #[test]
    fn delegates_should_count_only_without_cluster_network() {
        let o = overlay(Config::default(), &[]);
        let c = o
            .effective(&call(
                json!({"delegates": [{"name": "a", "type": "bridge"}]}),
            ))
            .unwrap();
        assert!(c.has_networks());
        assert_eq!(c.delegates.len(), 1);
        let o = overlay(Config::new("cluster", vec![]), &["clusterNetwork"]);
        assert!(!o.open_keys().contains(&"delegates"));
    }

    #[test]
    fn wrong_shapes_should_each_be_named() {
        let o = overlay(Config::default(), &[]);
        let e = o
            .effective(&call(json!({
                "clusterNetwork": 3,
                "delegates": ["x"],
                "confDir": "relative",
                "namespaceIsolation": "yes",
            })))
            .unwrap_err();
        let Error::Invalid(p) = &e else { panic!("{e}") };
        let keys: Vec<_> = p.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "clusterNetwork",
                "delegates",
                "namespaceIsolation",
                "confDir"
            ]
        );
        let e = o
            .effective(&call(
                json!({"clusterNetwork": "flannel", "auxiliaryCNIChainName": "aux"}),
            ))
            .unwrap_err();
        assert!(e.to_string().contains("auxiliaryCNIChainName"), "{e}");
    }
}
