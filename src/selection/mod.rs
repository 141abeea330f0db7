//! Network selection: which networks a container gets, in which order, and
//! with which interface names, following multus's rules.
//!
//! The order is the cluster network first (attached as the runtime's
//! `CNI_IFNAME`, its result is the one the runtime receives), then the
//! default networks, then the networks the caller asked for. The network at
//! list position `i` is named `net<i>` unless it requests a name, so names
//! stay stable when DEL recomputes them. Duplicate interface names are
//! rejected before anything runs.
//!
//! Selection only decides; it does not load configurations or talk to
//! Kubernetes. The requested networks come from a CNI_ARGS key
//! ([`take_from_args`]) or a pod's annotations ([`annotation`]); [`pod`]
//! plans a pod's networks and asks for what it needs (NADs, the kubelet's
//! devices, network configurations) through lookup traits, which `k8s`
//! and the handler implement.

pub mod annotation;
pub mod nad;
pub mod overlay;
pub mod pod;
pub mod runtime_config;

use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

use crate::names::{check_ifname, is_valid_name};

/// The CNI_ARGS key a caller uses to ask for networks per call. Plexus
/// consumes it: it is never passed on to the plugins.
pub const ARGS_KEY: &str = "PLEXUS_NETWORKS";

/// Most networks one container may get, all sources together. Each costs
/// plugin runs and a record update, so an unbounded list would let one
/// call hold a slot for as long as it likes; real pods use a handful.
pub const MAX_NETWORKS: usize = 64;

/// One requested network: `name`, `namespace/name`, with `@ifname`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    pub namespace: Option<String>,
    pub name: String,
    pub interface: Option<String>,
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(ns) = &self.namespace {
            write!(f, "{ns}/")?;
        }
        f.write_str(&self.name)?;
        if let Some(i) = &self.interface {
            write!(f, "@{i}")?;
        }
        Ok(())
    }
}

/// Why a selection is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{ARGS_KEY}: invalid network {item:?}: {why}")]
    Malformed { item: String, why: String },
    #[error("interface name {ifname:?} is used by both {first} and {second}")]
    Collision {
        ifname: String,
        first: String,
        second: String,
    },
    #[error("{count} networks selected; at most {MAX_NETWORKS} are allowed per container")]
    TooMany { count: usize },
    #[error("network {network}: requested interface {ifname:?} is invalid: {why}")]
    BadInterface {
        network: String,
        ifname: String,
        why: String,
    },
}

/// Parses the comma form of the multus networks annotation
/// (`a, ns/b, c@net5`). Whitespace around items is ignored; an empty value
/// selects nothing.
pub fn parse_networks(value: &str) -> Result<Vec<Element>, Error> {
    let mut out = Vec::new();
    for raw in value.split(',') {
        let item = raw.trim();
        if item.is_empty() {
            if value.trim().is_empty() {
                continue;
            }
            return Err(Error::Malformed {
                item: raw.to_string(),
                why: "empty item".into(),
            });
        }
        let bad = |why: &str| Error::Malformed {
            item: item.to_string(),
            why: why.to_string(),
        };
        let (path, interface) = match item.split_once('@') {
            Some((p, i)) if !i.contains('@') => (p, Some(i.to_string())),
            Some(_) => return Err(bad("more than one '@'")),
            None => (item, None),
        };
        let (namespace, name) = match path.split_once('/') {
            Some((ns, n)) if !n.contains('/') => (Some(ns.to_string()), n.to_string()),
            Some(_) => return Err(bad("more than one '/'")),
            None => (None, path.to_string()),
        };
        if let Some(ns) = &namespace {
            if !is_valid_name(ns) {
                return Err(bad("the namespace must match [a-zA-Z0-9][a-zA-Z0-9_.-]*"));
            }
        }
        if !is_valid_name(&name) {
            return Err(bad(
                "the network name must match [a-zA-Z0-9][a-zA-Z0-9_.-]*",
            ));
        }
        if let Some(i) = &interface {
            if let Err(e) = check_ifname(i) {
                return Err(bad(&format!("interface {i:?}: {e}")));
            }
        }
        out.push(Element {
            namespace,
            name,
            interface,
        });
    }
    Ok(out)
}

/// `CNI_ARGS` as key/value pairs, in order.
pub type ArgPairs = Vec<(String, String)>;

/// Splits `CNI_ARGS` pairs into the requested networks and the pairs that
/// go on to the plugins (everything but [`ARGS_KEY`]).
pub fn take_from_args(pairs: &[(String, String)]) -> Result<(Vec<Element>, ArgPairs), Error> {
    let mut networks = Vec::new();
    let mut rest = Vec::new();
    for (k, v) in pairs {
        if k == ARGS_KEY {
            // Counting commas first keeps a huge value from being parsed.
            let count = networks.len() + v.matches(',').count() + 1;
            if count > MAX_NETWORKS {
                return Err(Error::TooMany { count });
            }
            networks.extend(parse_networks(v)?);
        } else {
            rest.push((k.clone(), v.clone()));
        }
    }
    Ok((networks, rest))
}

/// The static part of the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// The cluster network: a network name or a path; empty when none is
    /// configured (then `delegates` name the networks, or there are none).
    pub cluster_network: String,
    /// multus's inline network configurations (`delegates`), used only
    /// when `cluster_network` is empty: the first is the cluster network,
    /// the others follow it, and `default_networks` are not attached.
    pub delegates: Vec<Value>,
    /// Networks attached to every container after the cluster network.
    pub default_networks: Vec<String>,
    /// Where NADs named by clusterNetwork, defaultNetworks and the
    /// default-network annotation live (`multusNamespace`).
    pub multus_namespace: String,
    /// Pods in these namespaces get no defaultNetworks
    /// (`systemNamespaces`).
    pub system_namespaces: Vec<String>,
    /// Whether a pod may name NADs of other namespaces only in
    /// `global_namespaces` (`namespaceIsolation`).
    pub namespace_isolation: bool,
    pub global_namespaces: Vec<String>,
    /// multus's auxiliary CNI chain (`auxiliaryCNIChainName`), run after
    /// every other network of an ADD; `cluster_network` is then a path.
    pub auxiliary_chain: Option<String>,
    /// Where network names are looked up (`confDir`) when a call's
    /// configuration says; `None`: the daemon's.
    pub conf_dir: Option<PathBuf>,
}

/// multus's default `multusNamespace` and `systemNamespaces`.
pub const DEFAULT_MULTUS_NAMESPACE: &str = "kube-system";

impl Config {
    /// Static networks with multus's defaults for the Kubernetes keys.
    pub fn new(cluster_network: impl Into<String>, default_networks: Vec<String>) -> Self {
        Self {
            cluster_network: cluster_network.into(),
            default_networks,
            multus_namespace: DEFAULT_MULTUS_NAMESPACE.into(),
            system_namespaces: vec![DEFAULT_MULTUS_NAMESPACE.into()],
            namespace_isolation: false,
            global_namespaces: nad::parse_global_namespaces(""),
            auxiliary_chain: None,
            delegates: Vec::new(),
            conf_dir: None,
        }
    }

    /// Whether any network is configured: a cluster network or delegates.
    pub fn has_networks(&self) -> bool {
        !self.cluster_network.is_empty() || !self.delegates.is_empty()
    }

    /// The networks attached before the requested ones, in order:
    /// clusterNetwork and defaultNetworks, or the delegates.
    /// Matches the order [`select`] gives.
    pub fn configured_count(&self) -> usize {
        if self.cluster_network.is_empty() && !self.delegates.is_empty() {
            self.delegates.len()
        } else {
            1 + self.default_networks.len()
        }
    }
}

/// The name a `delegates` entry shows (its `name`, else its position).
pub fn delegate_name(delegates: &[Value], i: usize) -> String {
    delegates
        .get(i)
        .and_then(|d| d.get("name"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("delegates[{i}]"))
}

/// Where a selected network comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The cluster network (`clusterNetwork`, or the first delegate): its
    /// result goes back to the runtime.
    Cluster,
    /// A network every container gets after the cluster network: a
    /// `defaultNetworks` entry, or a delegate after the first.
    Default,
    /// The requested element at this position of [`select`]'s `requested`.
    Requested(usize),
}

/// One network to attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// A network name (or, for configured networks, a path).
    pub network: String,
    /// The namespace a caller qualified the name with, if any.
    pub namespace: Option<String>,
    pub ifname: String,
    pub origin: Origin,
    /// The position in [`Config::delegates`] of an inline network.
    pub inline: Option<usize>,
}

impl Selected {
    /// The cluster network: its result goes back to the runtime.
    pub fn is_primary(&self) -> bool {
        self.origin == Origin::Cluster
    }

    fn label(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("network {ns}/{}", self.network),
            None => format!("network {}", self.network),
        }
    }
}

/// Orders the networks of one container and names their interfaces.
/// Without a cluster network the `delegates` take its place and that of
/// the default networks, as in multus. Each network says where it came
/// from ([`Selected::origin`]), so callers need no position arithmetic.
pub fn select(
    config: &Config,
    runtime_ifname: &str,
    requested: &[Element],
) -> Result<Vec<Selected>, Error> {
    let count = config.configured_count() + requested.len();
    if count > MAX_NETWORKS {
        return Err(Error::TooMany { count });
    }
    let mut out: Vec<Selected> = Vec::with_capacity(count);
    if config.cluster_network.is_empty() && !config.delegates.is_empty() {
        for i in 0..config.delegates.len() {
            out.push(Selected {
                network: delegate_name(&config.delegates, i),
                namespace: None,
                ifname: if i == 0 {
                    runtime_ifname.to_string()
                } else {
                    format!("net{i}")
                },
                origin: if i == 0 {
                    Origin::Cluster
                } else {
                    Origin::Default
                },
                inline: Some(i),
            });
        }
    } else {
        out.push(Selected {
            network: config.cluster_network.clone(),
            namespace: None,
            ifname: runtime_ifname.to_string(),
            origin: Origin::Cluster,
            inline: None,
        });
        for net in &config.default_networks {
            let i = out.len();
            out.push(Selected {
                network: net.clone(),
                namespace: None,
                ifname: format!("net{i}"),
                origin: Origin::Default,
                inline: None,
            });
        }
    }
    for (r, e) in requested.iter().enumerate() {
        let i = out.len();
        let ifname = e.interface.clone().unwrap_or_else(|| format!("net{i}"));
        out.push(Selected {
            network: e.name.clone(),
            namespace: e.namespace.clone(),
            ifname,
            origin: Origin::Requested(r),
            inline: None,
        });
    }
    let mut seen: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(out.len());
    for (i, s) in out.iter().enumerate() {
        if let Err(e) = check_ifname(&s.ifname) {
            return Err(Error::BadInterface {
                network: s.label(),
                ifname: s.ifname.clone(),
                why: e.to_string(),
            });
        }
        if let Some(&first) = seen.get(s.ifname.as_str()) {
            return Err(Error::Collision {
                ifname: s.ifname.clone(),
                first: out[first].label(),
                second: s.label(),
            });
        }
        seen.insert(&s.ifname, i);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn el(ns: Option<&str>, name: &str, i: Option<&str>) -> Element {
        Element {
            namespace: ns.map(String::from),
            name: name.into(),
            interface: i.map(String::from),
        }
    }

    #[test]
    fn comma_form_should_parse_every_shape() {
        assert_eq!(
            parse_networks(" a , ns/b,c@fast0, ns/d@x ").unwrap(),
            vec![
                el(None, "a", None),
                el(Some("ns"), "b", None),
                el(None, "c", Some("fast0")),
                el(Some("ns"), "d", Some("x")),
            ]
        );
        assert!(parse_networks("").unwrap().is_empty());
    }

    #[test]
    fn malformed_values_should_be_refused() {
        for bad in [
            "a,,b",
            "a/b/c",
            "a@b@c",
            "_a",
            "a@",
            "a@this-name-is-too-long",
            "a@x/y",
            "/a",
        ] {
            assert!(parse_networks(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn interfaces_should_be_numbered_by_position() {
        let config = Config::new("cluster", vec!["d1".into()]);
        let req = parse_networks("x, y@fast0, z").unwrap();
        let s = select(&config, "eth0", &req).unwrap();
        let names: Vec<_> = s.iter().map(|s| s.ifname.as_str()).collect();
        assert_eq!(names, ["eth0", "net1", "net2", "fast0", "net4"]);
        assert!(s[0].is_primary() && !s[1].is_primary());
        let origins: Vec<_> = s.iter().map(|s| s.origin).collect();
        assert_eq!(
            origins,
            [
                Origin::Cluster,
                Origin::Default,
                Origin::Requested(0),
                Origin::Requested(1),
                Origin::Requested(2),
            ]
        );
    }

    #[test]
    fn delegates_should_take_the_place_of_cluster_and_default_networks() {
        let mut config = Config::new("", vec!["d1".into()]);
        config.delegates = vec![
            serde_json::json!({"name": "a", "type": "bridge"}),
            serde_json::json!({"type": "macvlan"}),
        ];
        let req = parse_networks("x").unwrap();
        let s = select(&config, "eth0", &req).unwrap();
        let got: Vec<_> = s
            .iter()
            .map(|s| (s.network.as_str(), s.ifname.as_str(), s.origin, s.inline))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "eth0", Origin::Cluster, Some(0)),
                ("delegates[1]", "net1", Origin::Default, Some(1)),
                ("x", "net2", Origin::Requested(0), None),
            ]
        );
        assert_eq!(config.configured_count(), 2);
        config.cluster_network = "cluster".into();
        assert_eq!(config.configured_count(), 2);
        let s = select(&config, "eth0", &req).unwrap();
        assert_eq!(s[0].network, "cluster");
        assert_eq!(s[1].network, "d1");
        assert!(s.iter().all(|s| s.inline.is_none()));
    }

    #[test]
    fn collisions_should_be_rejected() {
        let config = Config::new("cluster", vec![]);
        let req = parse_networks("a@eth0").unwrap();
        let e = select(&config, "eth0", &req).unwrap_err();
        assert!(matches!(e, Error::Collision { .. }), "{e}");
        let req = parse_networks("a, b@net1").unwrap();
        assert!(select(&config, "eth0", &req).is_err());
    }

    #[test]
    fn too_many_networks_should_be_refused_before_parsing() {
        let config = Config::new("cluster", vec!["d1".into()]);
        let many = (0..MAX_NETWORKS - 2)
            .map(|i| format!("n{i}"))
            .collect::<Vec<_>>()
            .join(",");
        let req = parse_networks(&many).unwrap();
        assert_eq!(select(&config, "eth0", &req).unwrap().len(), MAX_NETWORKS);
        let req = parse_networks(&format!("{many},one-more")).unwrap();
        assert!(matches!(
            select(&config, "eth0", &req),
            Err(Error::TooMany { count }) if count == MAX_NETWORKS + 1
        ));
        // 5,000 entries are refused without parsing one of them.
        let huge = vec!["_bad"; 5_000].join(",");
        let pairs = vec![(ARGS_KEY.to_string(), huge)];
        assert!(matches!(
            take_from_args(&pairs),
            Err(Error::TooMany { count: 5_000 })
        ));
    }

    #[test]
    fn the_key_should_be_taken_out_of_cni_args() {
        let pairs = vec![
            ("IgnoreUnknown".to_string(), "1".to_string()),
            (ARGS_KEY.to_string(), "a,b".to_string()),
        ];
        let (nets, rest) = take_from_args(&pairs).unwrap();
        assert_eq!(nets.len(), 2);
        assert_eq!(rest, vec![("IgnoreUnknown".to_string(), "1".to_string())]);
    }
}
