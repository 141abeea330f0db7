//! CNI spec types: network configuration lists, the call a runtime makes,
//! and their validation.
//!
//! Everything here is pure: reading configuration files is
//! [`crate::cni::confdir`]'s job. These types are shared by selection (what a
//! selected network turns into) and the engine (what it runs).

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::api::{code, Command};
use crate::result;

/// Longest container id accepted, in bytes. Every file name the engine
/// derives from an id must stay under NAME_MAX (255): the longest is a
/// temporary file, `.<id>.<pid>.<seq>.tmp` (record and marker writes, pid up
/// to 10 digits, seq up to 20), that is id + 37 = 237 bytes; then the marker
/// `<id>.<pgid>` (id + 11), the record `<id>.json` and the lock `<id>.lock`
/// (id + 5) and the damaged records' directory `damaged/<id>`. Runtimes use
/// 64 hex digits.
pub const MAX_CONTAINER_ID: usize = 200;
/// NAME_MAX minus the longest suffix and prefix put around an id.
const _: () = assert!(MAX_CONTAINER_ID + 37 <= 255);

// The engine runs every command but VERSION (answered by the shim);
// [`Invocation::from_env`] refuses that one.

/// A validation failure: CNI code plus message (and optional details).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl Invalid {
    fn env(msg: impl Into<String>) -> Self {
        Self {
            code: code::INVALID_ENVIRONMENT,
            msg: msg.into(),
            details: String::new(),
        }
    }

    fn details(mut self, d: impl Into<String>) -> Self {
        self.details = d.into();
        self
    }
}

/// One CNI call as the runtime made it, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// `CNI_ARGS` exactly as received (after validation).
    pub args: String,
    /// `CNI_ARGS` split into pairs, in order.
    pub arg_pairs: Vec<(String, String)>,
}

impl Invocation {
    /// Validates the CNI environment of one call per the spec and libcni's
    /// rules. ADD and CHECK need all of id, netns and ifname; DEL needs id
    /// and ifname (a missing netns is normal there); STATUS and GC need
    /// none of them.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, Invalid> {
        let raw = get("CNI_COMMAND").unwrap_or_default();
        validate_env_value("CNI_COMMAND", &raw)?;
        if raw.is_empty() {
            return Err(Invalid::env("required env variable CNI_COMMAND is missing"));
        }
        let command = Command::parse(&raw)
            .filter(|c| *c != Command::Version)
            .ok_or_else(|| Invalid::env(format!("unknown CNI_COMMAND: {raw}")))?;
        let container_id = get("CNI_CONTAINERID").unwrap_or_default();
        let netns = get("CNI_NETNS").unwrap_or_default();
        let ifname = get("CNI_IFNAME").unwrap_or_default();
        let args = get("CNI_ARGS").unwrap_or_default();
        // A NUL cannot reach a plugin's environment at all, and no other
        // control character belongs in these values; refused before any
        // of them is used (a file name, a plugin's environment, a record).
        for (key, value) in [
            ("CNI_CONTAINERID", &container_id),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", &ifname),
            ("CNI_ARGS", &args),
        ] {
            validate_env_value(key, value)?;
        }
        let arg_pairs = parse_args(&args)?;
        if command.has_attachment() {
            let mut missing = Vec::new();
            if container_id.is_empty() {
                missing.push("CNI_CONTAINERID");
            }
            if ifname.is_empty() {
                missing.push("CNI_IFNAME");
            }
            if netns.is_empty() && command != Command::Del {
                missing.push("CNI_NETNS");
            }
            if !missing.is_empty() {
                return Err(Invalid::env(format!(
                    "required env variables [{}] missing",
                    missing.join(" ")
                )));
            }
            validate_container_id(&container_id)?;
            validate_ifname(&ifname)?;
            if !netns.is_empty() && !netns.starts_with('/') {
                return Err(Invalid::env(format!(
                    "CNI_NETNS must be an absolute path, got {netns:?}"
                )));
            }
        }
        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args,
            arg_pairs,
        })
    }
}

use crate::names::is_valid_name;

pub fn validate_container_id(id: &str) -> Result<(), Invalid> {
    if id.is_empty() {
        return Err(Invalid::env(
            "required env variables [CNI_CONTAINERID] missing",
        ));
    }
    if id.len() > MAX_CONTAINER_ID {
        return Err(Invalid::env(format!(
            "CNI_CONTAINERID is {} bytes long; at most {MAX_CONTAINER_ID} are allowed",
            id.len()
        )));
    }
    if !is_valid_name(id) {
        return Err(Invalid::env("invalid characters in containerID").details(id.to_string()));
    }
    Ok(())
}

/// Whether `id` is a container id the engine accepts (see
/// [`validate_container_id`]).
pub fn is_valid_container_id(id: &str) -> bool {
    validate_container_id(id).is_ok()
}

/// Refuses a request's environment if any name or value holds a control
/// character (see [`validate_env_value`]), whether or not the engine reads
/// that variable.
pub fn validate_env<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<(), Invalid> {
    for (key, value) in env {
        if key.chars().any(char::is_control) {
            return Err(Invalid::env(format!(
                "the environment variable name {key:?} contains control characters"
            )));
        }
        validate_env_value(key, value)?;
    }
    Ok(())
}

/// Refuses a CNI environment value holding a NUL or any other control
/// character (C0, DEL, C1): none of them means anything in a CNI variable,
/// and a NUL would make every later use of the value fail (the plugin's
/// environment cannot hold it).
pub fn validate_env_value(key: &str, value: &str) -> Result<(), Invalid> {
    match value.char_indices().find(|(_, c)| c.is_control()) {
        None => Ok(()),
        Some((at, c)) => Err(Invalid::env(format!(
            "{key} contains the control character {c:?} at byte {at}"
        ))
        .details(format!("{value:?}"))),
    }
}

/// Interface names, per [`crate::names::check_ifname`].
pub fn validate_ifname(name: &str) -> Result<(), Invalid> {
    crate::names::check_ifname(name).map_err(|e| Invalid::env(e.why).details(e.details))
}

/// Splits `CNI_ARGS` (`K=V;K2=V2`). Every pair must have exactly one `=`
/// and a non-empty key; empty segments (a trailing `;`) are skipped.
pub fn parse_args(args: &str) -> Result<Vec<(String, String)>, Invalid> {
    let mut pairs = Vec::new();
    for item in args.split(';') {
        if item.is_empty() {
            continue;
        }
        let mut parts = item.split('=');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(k), Some(v), None) if !k.trim().is_empty() => {
                pairs.push((k.trim().to_string(), v.trim().to_string()))
            }
            _ => {
                return Err(Invalid::env(format!(
                    "CNI_ARGS: invalid pair {item:?}: expected KEY=VALUE"
                )))
            }
        }
    }
    Ok(pairs)
}

/// Why a network configuration could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {why}")]
    File { file: PathBuf, why: String },
    #[error("{file}: key {key:?}: {why}")]
    Field {
        file: PathBuf,
        key: String,
        why: String,
    },
    #[error("network {name:?} not found in {dir}{}", skipped_note(.skipped))]
    NotFound {
        name: String,
        dir: PathBuf,
        skipped: Vec<String>,
    },
}

fn skipped_note(skipped: &[String]) -> String {
    if skipped.is_empty() {
        String::new()
    } else {
        format!(" (unreadable files there: {})", skipped.join("; "))
    }
}

/// A network configuration list, as loaded from a `.conflist`, or from a
/// single-plugin `.conf`/`.json` turned into a one-plugin list.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkList {
    pub name: String,
    pub cni_version: String,
    /// `cniVersions` (CNI 1.1.0): further versions the list supports.
    pub cni_versions: Vec<String>,
    pub disable_check: bool,
    pub disable_gc: bool,
    /// Plugin objects, raw: unknown keys pass through unchanged.
    pub plugins: Vec<Map<String, Value>>,
}

impl NetworkList {
    /// Parses the text of a configuration file. `single` selects the
    /// single-plugin form (`.conf`/`.json`); a single-plugin file that
    /// holds a `plugins` list is read as a list anyway.
    pub fn parse(file: &Path, text: &[u8], single: bool) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_slice(text).map_err(|e| ConfigError::File {
            file: file.to_path_buf(),
            why: format!("not valid JSON: {e}"),
        })?;
        Self::from_value(file, value, single)
    }

    /// Builds a list from a parsed document (see [`NetworkList::parse`]).
    pub fn from_value(file: &Path, value: Value, single: bool) -> Result<Self, ConfigError> {
        let Value::Object(obj) = value else {
            return Err(ConfigError::File {
                file: file.to_path_buf(),
                why: "the top level must be a JSON object".into(),
            });
        };
        Self::from_object(&obj, single).map_err(|bad| ConfigError::Field {
            file: file.to_path_buf(),
            key: bad.key,
            why: bad.why,
        })
    }

    /// Builds a list from the top-level object, key by key in the order
    /// they are checked: the first bad one is reported.
    fn from_object(obj: &Map<String, Value>, single: bool) -> Result<Self, BadKey> {
        let name = list_name(obj.get("name"))?;
        let cni_version = list_version(obj.get("cniVersion"))?;
        let cni_versions = more_versions(obj.get("cniVersions"))?;
        let disable_check = flag(obj, "disableCheck")?;
        let disable_gc = flag(obj, "disableGC")?;
        // A single-plugin file is its own one plugin.
        let inline = single && !obj.contains_key("plugins");
        let plugins = if inline {
            vec![obj.clone()]
        } else {
            plugin_objects(obj.get("plugins"))?
        };
        for (i, p) in plugins.iter().enumerate() {
            let key = if inline {
                "type".to_string()
            } else {
                format!("plugins[{i}].type")
            };
            check_plugin_type(key, p.get("type"))?;
        }
        Ok(Self {
            name,
            cni_version,
            cni_versions,
            disable_check,
            disable_gc,
            plugins,
        })
    }

    /// The list in conflist form, as recorded for DEL.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("cniVersion".into(), Value::String(self.cni_version.clone()));
        if !self.cni_versions.is_empty() {
            m.insert(
                "cniVersions".into(),
                Value::Array(
                    self.cni_versions
                        .iter()
                        .cloned()
                        .map(Value::String)
                        .collect(),
                ),
            );
        }
        m.insert("name".into(), Value::String(self.name.clone()));
        if self.disable_check {
            m.insert("disableCheck".into(), Value::Bool(true));
        }
        if self.disable_gc {
            m.insert("disableGC".into(), Value::Bool(true));
        }
        m.insert(
            "plugins".into(),
            Value::Array(self.plugins.iter().cloned().map(Value::Object).collect()),
        );
        Value::Object(m)
    }

    /// The plugin type of plugin `i`.
    pub fn plugin_type(&self, i: usize) -> &str {
        self.plugins
            .get(i)
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The versions the list may be run at, newest first: `cniVersion` plus
    /// `cniVersions`, limited to what the engine can convert.
    pub fn candidate_versions(&self) -> Vec<String> {
        let mut all: Vec<String> = std::iter::once(self.cni_version.clone())
            .chain(self.cni_versions.iter().cloned())
            .filter(|v| result::is_supported(v))
            .collect();
        all.sort_by(|a, b| result::compare(b, a).unwrap_or(Ordering::Equal));
        all.dedup();
        all
    }

    /// The version libcni would pick: the newest candidate.
    pub fn version(&self) -> Option<String> {
        self.candidate_versions().into_iter().next()
    }
}

/// A bad key of a network configuration, before the file is named.
struct BadKey {
    key: String,
    why: String,
}

fn bad(key: impl Into<String>, why: impl Into<String>) -> BadKey {
    BadKey {
        key: key.into(),
        why: why.into(),
    }
}

/// `name`: a valid network name.
fn list_name(found: Option<&Value>) -> Result<String, BadKey> {
    match found {
        Some(Value::String(s)) if is_valid_name(s) => Ok(s.clone()),
        Some(Value::String(s)) if s.is_empty() => Err(bad("name", "missing network name")),
        Some(Value::String(s)) => Err(bad(
            "name",
            format!("invalid characters found in network name {s:?}"),
        )),
        None | Some(Value::Null) => Err(bad("name", "missing network name")),
        Some(other) => Err(bad("name", format!("must be a string, found {other}"))),
    }
}

/// `cniVersion`: a version string, required.
fn list_version(found: Option<&Value>) -> Result<String, BadKey> {
    match found {
        Some(Value::String(s)) if result::compare(s, s).is_some() => Ok(s.clone()),
        Some(Value::String(s)) => Err(bad("cniVersion", format!("not a version: {s:?}"))),
        None | Some(Value::Null) => Err(bad("cniVersion", "missing; set e.g. \"1.0.0\"")),
        Some(other) => Err(bad(
            "cniVersion",
            format!("must be a string, found {other}"),
        )),
    }
}

/// `cniVersions` (CNI 1.1.0): a list of version strings, optional.
fn more_versions(found: Option<&Value>) -> Result<Vec<String>, BadKey> {
    match found {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) if result::compare(s, s).is_some() => Ok(s.clone()),
                other => Err(bad("cniVersions", format!("not a version: {other}"))),
            })
            .collect(),
        Some(other) => Err(bad(
            "cniVersions",
            format!("must be a list of version strings, found {other}"),
        )),
    }
}

/// A boolean key such as `disableCheck`: false when absent; the strings
/// "true" and "false" (any case) count too.
fn flag(obj: &Map<String, Value>, key: &str) -> Result<bool, BadKey> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(bad(key, format!("must be true or false, found {other}"))),
    }
}

/// `plugins` of a conflist: a non-empty list of objects.
fn plugin_objects(found: Option<&Value>) -> Result<Vec<Map<String, Value>>, BadKey> {
    match found {
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                Value::Object(m) => Ok(m.clone()),
                other => Err(bad(
                    format!("plugins[{i}]"),
                    format!("must be an object, found {other}"),
                )),
            })
            .collect(),
        Some(Value::Array(_)) => Err(bad("plugins", "must list at least one plugin")),
        None | Some(Value::Null) => {
            Err(bad("plugins", "missing: a .conflist needs a plugins list"))
        }
        Some(other) => Err(bad("plugins", format!("must be a list, found {other}"))),
    }
}

/// A plugin's `type` (named `key` in errors): a plugin name (no path),
/// and not a thick-plugin shim.
fn check_plugin_type(key: String, found: Option<&Value>) -> Result<(), BadKey> {
    match found {
        Some(Value::String(t)) if SHIM_TYPES.contains(&t.as_str()) => Err(bad(
            key,
            format!(
                "{t:?} is a thick-plugin shim, not a delegate: running it would make the daemon call itself"
            ),
        )),
        Some(Value::String(t)) if !t.is_empty() && !t.contains('/') && t != "." && t != ".." => {
            Ok(())
        }
        Some(Value::String(t)) if t.is_empty() => Err(bad(key, "must not be empty")),
        Some(Value::String(t)) => Err(bad(
            key,
            format!("must be a plugin name, not a path: {t:?}"),
        )),
        None | Some(Value::Null) => Err(bad(key, "missing plugin type")),
        Some(other) => Err(bad(key, format!("must be a string, found {other}"))),
    }
}

/// Picks the version to run one plugin at: the newest version both the
/// list and the plugin support; failing that, the newest version the plugin
/// supports that is not newer than the list's newest (so a 1.1.0 list runs
/// plugins that stop at 1.0.0). `None` when nothing fits.
pub fn negotiate(candidates: &[String], plugin_supports: &[String]) -> Option<String> {
    let newest = candidates.first()?;
    if let Some(v) = candidates.iter().find(|v| plugin_supports.contains(v)) {
        return Some(v.clone());
    }
    plugin_supports
        .iter()
        .filter(|v| result::is_supported(v))
        .filter(|v| result::compare(v, newest) != Some(Ordering::Greater))
        .max_by(|a, b| result::compare(a, b).unwrap_or(Ordering::Equal))
        .cloned()
}

/// Whether `v` is at least `min` (malformed versions are not).
pub fn at_least(v: &str, min: &str) -> bool {
    matches!(
        result::compare(v, min),
        Some(Ordering::Greater | Ordering::Equal)
    )
}

/// Plugin types that are thick-plugin shims: run as a delegate, one
/// forwards the call back to a daemon (this one, when it serves the
/// multus socket too), which then waits on itself.
const SHIM_TYPES: &[&str] = &["plexus-shim", "multus-shim"];

#[cfg(test)]
#[path = "netconf_tests.rs"]
mod tests;
