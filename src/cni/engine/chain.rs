//! libcni's chain mechanics: locating a network's plugins and the version
//! each runs at, each plugin's stdin (name, version, `prevResult`, the
//! capability arguments it declared), running a list forward for ADD and in
//! reverse for DEL, and reading what a plugin printed.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::fault::Step;
use super::{Engine, Error, ErrorKind};
use crate::api::{code, Command};
use crate::cni::exec;
use crate::cni::exec::{CallEnv, Gate, Plugin};
use crate::cni::state::{Delegate, Record};
use crate::netconf::{at_least, negotiate, Invocation, NetworkList};
use crate::{netconf, result};

/// A network's plugins, located, each with the version it runs at.
pub(super) struct LocatedPlugins {
    pub(super) plugins: Vec<(Plugin, String)>,
}

/// The plugin types of every network in `record`, once each.
pub(super) fn recorded_types(record: &Record) -> Vec<String> {
    let mut types: Vec<String> = Vec::new();
    for d in record.attachments.iter().flat_map(|a| &a.delegates) {
        let Ok(list) = recorded_list(d) else {
            continue;
        };
        for i in 0..list.plugins.len() {
            let kind = list.plugin_type(i);
            if !types.iter().any(|t| t == kind) {
                types.push(kind.to_string());
            }
        }
    }
    types
}

/// The network configuration a delegate was added with, from its record.
pub(super) fn recorded_list(d: &Delegate) -> Result<NetworkList, netconf::ConfigError> {
    NetworkList::from_value(
        &PathBuf::from(format!("<record of network {}>", d.name)),
        d.config.clone(),
        false,
    )
}

/// The capability arguments of `cap_args` that some plugin of `lists`
/// declares (`"capabilities": {"<key>": true}`): the only ones libcni
/// passes to plugins, hence the only ones DEL can need.
pub(super) fn declared_capabilities<'a>(
    lists: impl Iterator<Item = &'a NetworkList>,
    mut cap_args: Map<String, Value>,
) -> Map<String, Value> {
    let declared: BTreeSet<&str> = lists
        .flat_map(|l| l.plugins.iter())
        .filter_map(|p| p.get("capabilities").and_then(Value::as_object))
        .flat_map(|caps| caps.iter())
        .filter(|(_, on)| on.as_bool() == Some(true))
        .map(|(k, _)| k.as_str())
        .collect();
    cap_args.retain(|k, _| declared.contains(k.as_str()));
    cap_args
}

/// A network's own capability arguments as recorded: those its plugins
/// declare, plus its device-info file whether declared or not, so that
/// DEL can remove the file (plugins are still given only what they
/// declare).
pub(super) fn recorded_capabilities(
    list: &NetworkList,
    own: Map<String, Value>,
) -> Map<String, Value> {
    let file = own.get("CNIDeviceInfoFile").cloned();
    let mut kept = declared_capabilities(std::iter::once(list), own);
    if let Some(file) = file {
        kept.insert("CNIDeviceInfoFile".into(), file);
    }
    kept
}

/// A plugin's config object with `name` and `cniVersion` set from the list.
pub(super) fn stdin_object(list: &NetworkList, i: usize, version: &str) -> Map<String, Value> {
    let mut m = list.plugins.get(i).cloned().unwrap_or_default();
    m.insert("name".into(), Value::String(list.name.clone()));
    m.insert("cniVersion".into(), Value::String(version.to_string()));
    m
}

/// The stdin of plugin `i` for ADD/DEL/CHECK/STATUS, as libcni builds it:
/// `name` and `cniVersion` from the list, `prevResult` when given, and
/// `runtimeConfig` with the capabilities the plugin declared true and the
/// runtime supplied. Keys come out sorted (serde_json's map), like Go's.
pub(super) fn stdin_for(
    list: &NetworkList,
    i: usize,
    version: &str,
    command: Command,
    prev: Option<Value>,
    cap_args: &Map<String, Value>,
) -> Vec<u8> {
    let mut m = stdin_object(list, i, version);
    if command.has_attachment() {
        if let Some(p) = prev {
            m.insert("prevResult".into(), p);
        }
        let wanted: Map<String, Value> = m
            .get("capabilities")
            .and_then(Value::as_object)
            .map(|caps| {
                caps.iter()
                    .filter(|(_, on)| on.as_bool() == Some(true))
                    .filter_map(|(k, _)| cap_args.get(k).map(|v| (k.clone(), v.clone())))
                    .collect()
            })
            .unwrap_or_default();
        if !wanted.is_empty() {
            m.insert("runtimeConfig".into(), Value::Object(wanted));
        }
    }
    // A map of JSON values always serialises.
    serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
}

/// A result converted to `version` for a plugin's prevResult; `None` (and
/// a log line) when it cannot be.
pub(super) fn convert_for(result: &Value, version: &str) -> Option<Value> {
    match result::convert(result, version) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(cause = %e, "prevResult left out");
            None
        }
    }
}

/// Parses a plugin's ADD output leniently (libcni's rules): a missing
/// `cniVersion` is the version the plugin was called with.
fn parse_result(out: &[u8], version: &str) -> Result<Value, String> {
    if out.iter().all(|b| b.is_ascii_whitespace()) {
        return Err("it printed nothing on success".into());
    }
    let value: Value = serde_json::from_slice(out).map_err(|e| format!("not JSON: {e}"))?;
    let parsed = result::Success::from_value_or(&value, version).map_err(|e| e.to_string())?;
    if !result::is_supported(&parsed.cni_version) {
        return Err(format!(
            "result version {:?} is not supported",
            parsed.cni_version
        ));
    }
    Ok(parsed.to_value())
}

impl Engine {
    pub(super) async fn find(&self, name: &str) -> Result<Plugin, exec::Error> {
        let runner = self.runner.clone();
        let name = name.to_string();
        match crate::op_thread::off_runtime(move || runner.find(&name)).await {
            Ok(r) => r,
            Err(e) => Err(exec::Error::Io {
                plugin: String::new(),
                path: PathBuf::new(),
                what: "looking up the plugin",
                source: std::io::Error::other(e),
            }),
        }
    }

    /// The version to run `plugin` at for a network with `candidates`.
    async fn version_for(
        &self,
        list: &NetworkList,
        candidates: &[String],
        plugin: &Plugin,
    ) -> Result<String, Error> {
        match self.runner.versions(plugin).await {
            Some(supported) => negotiate(candidates, &supported).ok_or_else(|| {
                Error::new(
                    ErrorKind::Invalid,
                    code::INCOMPATIBLE_VERSION,
                    format!(
                        "network {:?}: plugin {:?} supports CNI versions [{}], none of which fits the network's [{}]",
                        list.name,
                        plugin.name,
                        supported.join(", "),
                        candidates.join(", ")
                    ),
                )
            }),
            None => Ok(candidates[0].clone()),
        }
    }

    fn candidates(list: &NetworkList) -> Result<Vec<String>, Error> {
        let c = list.candidate_versions();
        if c.is_empty() {
            return Err(Error::new(
                ErrorKind::Invalid,
                code::INCOMPATIBLE_VERSION,
                format!(
                    "network {:?}: cniVersion {:?} is not supported; use one of [{}]",
                    list.name,
                    list.cni_version,
                    result::SUPPORTED.join(", ")
                ),
            ));
        }
        Ok(c)
    }

    /// Locates every plugin of `list` and picks its version.
    pub(super) async fn prepare(
        &self,
        list: &NetworkList,
        command: Command,
    ) -> Result<LocatedPlugins, Error> {
        self.prepare_with(list, command, &[]).await
    }

    /// [`Engine::prepare`] taking the plugins in `found` as located (in
    /// this call, by [`Engine::lock_op_with`]).
    pub(super) async fn prepare_with(
        &self,
        list: &NetworkList,
        command: Command,
        found: &[Plugin],
    ) -> Result<LocatedPlugins, Error> {
        self.fault(Step::Prepare)?;
        let candidates = Self::candidates(list)?;
        let mut plugins = Vec::with_capacity(list.plugins.len());
        for i in 0..list.plugins.len() {
            let kind = list.plugin_type(i);
            let located = match found.iter().find(|p| p.name == kind) {
                Some(p) => Ok(p.clone()),
                None => self.find(kind).await,
            };
            let plugin = located.map_err(|e| {
                let mut err = Error::plugin(command, &list.name, e);
                err.kind = ErrorKind::Invalid;
                err
            })?;
            let version = self.version_for(list, &candidates, &plugin).await?;
            plugins.push((plugin, version));
        }
        Ok(LocatedPlugins { plugins })
    }

    /// The environment of one network's plugins: the call's, with the
    /// network's own `CNI_ARGS` when it has them.
    pub(super) fn call_env(
        &self,
        command: Command,
        inv: &Invocation,
        ifname: &str,
        netns: &str,
        own_args: Option<&str>,
    ) -> CallEnv {
        CallEnv {
            command: command.as_str(),
            container_id: inv.container_id.clone(),
            netns: netns.to_string(),
            ifname: ifname.to_string(),
            args: own_args.unwrap_or(&inv.args).to_string(),
        }
    }

    /// Whether every plugin of `list` is installed and speaks a version
    /// the list can run at.
    pub async fn check_plugins(&self, list: &NetworkList) -> Result<(), Error> {
        self.prepare(list, Command::Add).await.map(|_| ())
    }

    /// Runs a network's ADD chain. On failure also returns the result the
    /// chain had reached (the rollback's prevResult).
    pub(super) async fn add_chain(
        &self,
        list: &NetworkList,
        located: &LocatedPlugins,
        env: &CallEnv,
        cap_args: &Map<String, Value>,
        mut gate: Option<Gate>,
    ) -> Result<Value, (Error, Option<Value>)> {
        let mut prev: Option<Value> = None;
        for (i, (plugin, version)) in located.plugins.iter().enumerate() {
            let prev_here = prev.as_ref().and_then(|p| convert_for(p, version));
            let stdin = stdin_for(list, i, version, Command::Add, prev_here, cap_args);
            let run = match gate.take() {
                Some(gate) => self.runner.run_gated(plugin, env, stdin, gate).await,
                None => self.runner.run(plugin, env, stdin).await,
            };
            let out = match run {
                Ok(out) => out,
                Err(e) => return Err((Error::plugin(Command::Add, &list.name, e), prev)),
            };
            let parsed = parse_result(&out, version).map_err(|reason| {
                let e = exec::Error::InvalidResult {
                    plugin: plugin.name.clone(),
                    path: plugin.path.clone(),
                    reason,
                    stdout: String::from_utf8_lossy(&out[..out.len().min(4096)]).into_owned(),
                };
                (Error::plugin(Command::Add, &list.name, e), prev.clone())
            })?;
            prev = Some(parsed);
        }
        prev.ok_or_else(|| {
            (
                Error::new(
                    ErrorKind::Invalid,
                    code::INVALID_NETWORK_CONFIG,
                    format!("network {:?} has no plugins", list.name),
                ),
                None,
            )
        })
    }

    /// Runs a network's DEL chain in reverse, past errors; returns them.
    /// Plugins in `found` are taken as located.
    pub(super) async fn del_chain(
        &self,
        list: &NetworkList,
        env: &CallEnv,
        cap_args: &Map<String, Value>,
        prev: Option<&Value>,
        found: &[Plugin],
    ) -> Vec<Error> {
        let mut errors = Vec::new();
        let candidates = match Self::candidates(list) {
            Ok(c) => c,
            Err(e) => return vec![e],
        };
        for i in (0..list.plugins.len()).rev() {
            let kind = list.plugin_type(i);
            let located = match found.iter().find(|p| p.name == kind) {
                Some(p) => Ok(p.clone()),
                None => self.find(kind).await,
            };
            let plugin = match located {
                Ok(p) => p,
                Err(e) => {
                    errors.push(Error::plugin(Command::Del, &list.name, e));
                    continue;
                }
            };
            let version = match self.version_for(list, &candidates, &plugin).await {
                Ok(v) => v,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            // libcni passes prevResult on DEL from 0.4.0 on.
            let prev_here = prev
                .filter(|_| at_least(&version, "0.4.0"))
                .and_then(|p| convert_for(p, &version));
            let stdin = stdin_for(list, i, &version, Command::Del, prev_here, cap_args);
            if let Err(e) = self.runner.run(&plugin, env, stdin).await {
                errors.push(Error::plugin(Command::Del, &list.name, e));
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    fn list() -> NetworkList {
        NetworkList::from_value(
            Path::new("t"),
            json!({"cniVersion":"1.0.0","name":"net","plugins":[
                {"type":"bridge","name":"ignored","cniVersion":"0.1.0"},
                {"type":"portmap","capabilities":{"portMappings":true,"mac":false}}
            ]}),
            false,
        )
        .unwrap()
    }

    #[test]
    fn stdin_should_carry_name_version_prev_and_declared_capabilities_only() {
        let caps = json!({"portMappings":[{"hostPort":8080}],"mac":"x","bandwidth":{}});
        let caps = caps.as_object().unwrap().clone();
        let prev = json!({"cniVersion":"1.0.0"});
        let first: Value =
            serde_json::from_slice(&stdin_for(&list(), 0, "1.0.0", Command::Add, None, &caps))
                .unwrap();
        assert_eq!(first["name"], "net");
        assert_eq!(first["cniVersion"], "1.0.0");
        assert!(first.get("prevResult").is_none());
        assert!(first.get("runtimeConfig").is_none());
        let second: Value = serde_json::from_slice(&stdin_for(
            &list(),
            1,
            "1.0.0",
            Command::Add,
            Some(prev.clone()),
            &caps,
        ))
        .unwrap();
        assert_eq!(second["prevResult"], prev);
        assert_eq!(
            second["runtimeConfig"],
            json!({"portMappings":[{"hostPort":8080}]})
        );
        let status: Value = serde_json::from_slice(&stdin_for(
            &list(),
            1,
            "1.1.0",
            Command::Status,
            Some(prev),
            &caps,
        ))
        .unwrap();
        assert!(status.get("prevResult").is_none() && status.get("runtimeConfig").is_none());
    }

    #[test]
    fn results_should_parse_leniently_but_not_accept_nothing() {
        assert!(parse_result(b"", "1.0.0").is_err());
        assert!(parse_result(b"garbage", "1.0.0").is_err());
        let v = parse_result(br#"{"ips":[{"address":"10.0.0.2/24"}]}"#, "1.0.0").unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
    }
}
