//! NetworkAttachmentDefinition -> delegate configuration, as multus builds
//! it (`getKubernetesDelegate`, the NAD client's `GetCNIConfig`,
//! `LoadDelegateNetConf`), and the namespaceIsolation rule.
//!
//! Pure functions: the NAD arrives as its namespace, name and `spec.config`
//! string; a NAD without `spec.config` names a file in confDir, which the
//! caller looks up with the loader it passes in (the engine's confDir
//! lookup, which reads files: the caller runs it off the async threads).
//!
//! Deliberate differences from multus, each turning a panic or a confusing
//! later failure into a clear error, or keeping data multus loses:
//! - `"plugins": []`, a plugin that is not an object, `args` or `args.cni`
//!   that is not an object are errors (multus panics on each);
//! - `"name": null` gets the NAD name like a missing name (multus keeps the
//!   null and runs the network nameless);
//! - the config is always handed on re-serialised with sorted keys (multus
//!   keeps the NAD's bytes when it changed nothing); key order carries no
//!   meaning in a CNI configuration;
//! - numbers are kept exactly (multus round-trips them through float64 when
//!   it edits the config, so integers above 2^53 change).

use std::path::Path;

use serde_json::{Map, Value};

use super::annotation::Selection;
use crate::json;
use crate::netconf::{ConfigError, NetworkList};

/// The delegate configuration of one NAD.
#[derive(Debug, Clone, PartialEq)]
pub struct NadDelegate {
    /// `<namespace>/<nadName>`: network-status `name`, events, device-info
    /// file names. The CNI network name stays the config's `name`.
    pub display_name: String,
    /// The configuration: a single plugin, or a list when `is_list`.
    pub config: Map<String, Value>,
    /// The top-level `type` was empty: `config` is a conflist.
    pub is_list: bool,
}

impl NadDelegate {
    /// The CNI network name (the config's `name`).
    pub fn network_name(&self) -> &str {
        self.config
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The configuration as the engine loads it, with the engine's own
    /// checks (cniVersion, name and type rules).
    pub fn network_list(&self) -> Result<NetworkList, ConfigError> {
        NetworkList::from_value(
            Path::new(&self.display_name),
            Value::Object(self.config.clone()),
            !self.is_list,
        )
    }

    /// Puts a device the NAD's `resourceName` allocated into the config
    /// as `deviceID` and `pciBusID` (into every plugin of a list), as
    /// multus does.
    pub fn inject_device_id(&mut self, device_id: &str) {
        let set = |m: &mut Map<String, Value>| {
            m.insert("deviceID".into(), device_id.into());
            m.insert("pciBusID".into(), device_id.into());
        };
        if self.is_list {
            if let Some(Value::Array(plugins)) = self.config.get_mut("plugins") {
                plugins
                    .iter_mut()
                    .filter_map(Value::as_object_mut)
                    .for_each(set);
            }
        } else {
            set(&mut self.config);
        }
    }
}

/// Why a NAD gives no delegate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot find a network-attachment-definition ({name}) in namespace ({namespace}): {why}"
    )]
    NotFound {
        namespace: String,
        name: String,
        why: String,
    },
    #[error("network-attachment-definition {display}: spec.config: {why}")]
    Spec { display: String, why: String },
    #[error(
        "network-attachment-definition {display}: no spec.config and no file in confDir: {source}"
    )]
    File {
        display: String,
        #[source]
        source: ConfigError,
    },
    #[error("namespace isolation enabled, annotation violates permission, pod is in namespace {pod_namespace} but refers to target namespace {target_namespace}")]
    Isolation {
        pod_namespace: String,
        target_namespace: String,
    },
}

/// The namespaces a pod may reach across under namespaceIsolation when
/// the configuration names none.
pub const DEFAULT_GLOBAL_NAMESPACES: &[&str] = &["default"];

/// Reads multus's `globalNamespaces` (a comma list, items trimmed); an
/// empty value means [`DEFAULT_GLOBAL_NAMESPACES`].
pub fn parse_global_namespaces(raw: &str) -> Vec<String> {
    if raw.is_empty() {
        return DEFAULT_GLOBAL_NAMESPACES
            .iter()
            .map(|s| s.to_string())
            .collect();
    }
    raw.split(',').map(|s| s.trim().to_string()).collect()
}

/// multus's namespaceIsolation: with `isolation` on, a pod may use a NAD of
/// another namespace only if that namespace is in `global_namespaces`.
/// Applies to `k8s.v1.cni.cncf.io/networks` entries only (not the
/// default-network annotation, nor clusterNetwork/defaultNetworks).
pub fn check_namespace_isolation(
    isolation: bool,
    pod_namespace: &str,
    target_namespace: &str,
    global_namespaces: &[String],
) -> Result<(), Error> {
    if !isolation
        || pod_namespace == target_namespace
        || global_namespaces.iter().any(|g| g == target_namespace)
    {
        return Ok(());
    }
    Err(Error::Isolation {
        pod_namespace: pod_namespace.to_string(),
        target_namespace: target_namespace.to_string(),
    })
}

/// The delegate for a NAD from its `spec.config` (non-empty).
///
/// `spec.config` must be a JSON object. A missing or empty `name` becomes
/// the NAD's name. An empty top-level `type` makes it a list whose
/// `plugins[0].type` must be set. `cni_args` (the element's `cni-args`) is
/// merged into `args.cni` (of every plugin of a list); the element's keys
/// win over keys already there.
pub fn delegate_from_spec(
    namespace: &str,
    nad_name: &str,
    spec_config: &str,
    cni_args: Option<&Map<String, Value>>,
) -> Result<NadDelegate, Error> {
    let display = format!("{namespace}/{nad_name}");
    let bad = |why: String| Error::Spec {
        display: display.clone(),
        why,
    };
    let doc: Value =
        serde_json::from_str(spec_config).map_err(|e| bad(format!("failed to unmarshal: {e}")))?;
    let Value::Object(mut config) = doc else {
        return Err(bad("must be a JSON object".into()));
    };
    match config.get("name") {
        None | Some(Value::Null) => {
            config.insert("name".into(), nad_name.into());
        }
        Some(Value::String(s)) if s.is_empty() => {
            config.insert("name".into(), nad_name.into());
        }
        Some(Value::String(_)) => {}
        Some(other) => {
            return Err(bad(format!(
                "\"name\" must be a string, found {}",
                json::kind(other)
            )))
        }
    }
    let is_list = match config.get("type") {
        None | Some(Value::Null) => true,
        Some(Value::String(t)) => t.is_empty(),
        Some(other) => {
            return Err(bad(format!(
                "\"type\" must be a string, found {}",
                json::kind(other)
            )))
        }
    };
    if is_list {
        check_list(&config).map_err(bad)?;
    }
    let mut delegate = NadDelegate {
        display_name: display.clone(),
        config,
        is_list,
    };
    if let Some(args) = cni_args {
        merge_cni_args(&mut delegate, args).map_err(bad)?;
    }
    Ok(delegate)
}

fn check_list(config: &Map<String, Value>) -> Result<(), String> {
    let plugins = match config.get("plugins") {
        None | Some(Value::Null) => {
            return Err("the delegate must have the 'type' or 'plugins' field".into())
        }
        Some(Value::Array(p)) => p,
        Some(other) => {
            return Err(format!(
                "\"plugins\" must be a list, found {}",
                json::kind(other)
            ))
        }
    };
    let Some(first) = plugins.first() else {
        return Err("\"plugins\" is empty".into());
    };
    for (i, p) in plugins.iter().enumerate() {
        if !p.is_object() {
            return Err(format!(
                "plugins[{i}] must be an object, found {}",
                json::kind(p)
            ));
        }
    }
    match first.get("type") {
        Some(Value::String(t)) if !t.is_empty() => Ok(()),
        _ => Err("a plugin delegate must have the 'type' field (plugins[0].type)".into()),
    }
}

fn merge_into(plugin: &mut Map<String, Value>, args: &Map<String, Value>) -> Result<(), String> {
    let outer = plugin
        .entry("args")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(outer) = outer else {
        return Err(format!(
            "\"args\" must be an object to take cni-args, found {}",
            json::kind(outer)
        ));
    };
    let cni = outer
        .entry("cni")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(cni) = cni else {
        return Err(format!(
            "\"args.cni\" must be an object to take cni-args, found {}",
            json::kind(cni)
        ));
    };
    for (k, v) in args {
        cni.insert(k.clone(), v.clone());
    }
    Ok(())
}

fn merge_cni_args(d: &mut NadDelegate, args: &Map<String, Value>) -> Result<(), String> {
    if !d.is_list {
        return merge_into(&mut d.config, args);
    }
    if let Some(Value::Array(plugins)) = d.config.get_mut("plugins") {
        for (i, p) in plugins.iter_mut().enumerate() {
            if let Value::Object(p) = p {
                merge_into(p, args).map_err(|e| format!("plugins[{i}]: {e}"))?;
            }
        }
    }
    Ok(())
}

/// The delegate for a NAD: from `spec.config`, or, when it is absent or
/// empty, from the confDir file whose network `name` equals the NAD name,
/// which `load_file` finds (the caller passes the engine's confDir lookup,
/// already done). The element's `cni-args` are merged either way. A file's
/// network comes back in list form (`is_list`), whatever the file's
/// extension: the engine runs both forms as a list.
///
/// Differs from multus: the file search (confdir's) skips unreadable files
/// and names them in its error, where multus stops at the first file that
/// does not parse.
pub fn delegate_for_nad(
    namespace: &str,
    nad_name: &str,
    spec_config: Option<&str>,
    cni_args: Option<&Map<String, Value>>,
    load_file: impl FnOnce(&str) -> Result<NetworkList, ConfigError>,
) -> Result<NadDelegate, Error> {
    match spec_config {
        Some(text) if !text.is_empty() => delegate_from_spec(namespace, nad_name, text, cni_args),
        _ => {
            let display = format!("{namespace}/{nad_name}");
            // The loader reads a name with a `/` as a path; a NAD name
            // never holds one, so such a name must not reach it.
            if nad_name.is_empty() || nad_name.contains('/') {
                return Err(Error::Spec {
                    display,
                    why: "not a NetworkAttachmentDefinition name; no confDir file is looked up"
                        .into(),
                });
            }
            let list = load_file(nad_name).map_err(|source| Error::File {
                display: display.clone(),
                source,
            })?;
            let Value::Object(config) = list.to_value() else {
                return Err(Error::Spec {
                    display,
                    why: "the file did not give a JSON object".into(),
                });
            };
            let mut delegate = NadDelegate {
                display_name: display.clone(),
                config,
                is_list: true,
            };
            if let Some(args) = cni_args {
                merge_cni_args(&mut delegate, args).map_err(|why| Error::Spec { display, why })?;
            }
            Ok(delegate)
        }
    }
}

/// [`delegate_for_nad`] for a parsed selection element: its namespace,
/// name and `cni-args`.
pub fn delegate_for_selection(
    sel: &Selection,
    spec_config: Option<&str>,
    load_file: impl FnOnce(&str) -> Result<NetworkList, ConfigError>,
) -> Result<NadDelegate, Error> {
    delegate_for_nad(
        &sel.namespace,
        &sel.name,
        spec_config,
        sel.cni_args.as_ref(),
        load_file,
    )
}

#[cfg(test)]
#[path = "nad_tests.rs"]
mod tests;
