//! `plexusd generate-config`: the runtime's CNI configuration for the
//! shim, generated from the node's primary network configuration the way
//! multus's auto configuration does it (`multusConfigFile: "auto"`), but as
//! a one-shot command that `plexus-config.path` runs on every change of the
//! configuration directory.
//!
//! One run: find the primary configuration (the first `.conf`/`.conflist`
//! by name in `multusAutoconfigDir`, or `multusMasterCNI`), render the file
//! multus would write with `type` set to the shim, and replace
//! `<cniConfigDir>/00-plexus.conf` atomically, only when its bytes change.
//! What multus does differently, on purpose:
//!
//! - a primary that cannot be read or parsed leaves the last good file in
//!   place and fails the run (multus writes an empty file);
//! - the file is never deleted (multus deletes it when its daemon stops);
//! - configurations of a thick plugin (type `plexus-shim`, `multus-shim`,
//!   `multus`) are never taken as the primary: that would send the cluster
//!   network back into the daemon;
//! - without a `cniVersion` in the daemon configuration, the primary's is
//!   used (multus refuses to start);
//! - capabilities follow the primary as it is now (multus only adds them).
//!
//! Everything here blocks; the command runs outside the daemon.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::{result, trust};

/// Where the primary configuration is looked for when
/// `multusAutoconfigDir` is not set (multus has no default and fails).
pub const DEFAULT_AUTOCONFIG_DIR: &str = "/etc/cni/net.d";
/// Where the generated file goes when `cniConfigDir` is not set (as multus).
pub const DEFAULT_CNI_CONFIG_DIR: &str = "/etc/cni/net.d";
/// The generated file's name: first by name, so the runtime picks it, and
/// `.conf` because, like multus's `00-multus.conf`, it is one plugin's
/// configuration, not a list.
pub const OUTPUT_NAME: &str = "00-plexus.conf";
/// Files whose name starts with this are never a primary (ours, and the
/// shipped example `00-plexus.conflist`), as multus skips `00-multus*`.
pub const OWN_PREFIX: &str = "00-plexus";
/// The shim's plugin name (`/usr/lib/cni/plexus-shim`).
pub const SHIM_TYPE: &str = "plexus-shim";
/// The network name multus writes: kept, so the runtime's cached results
/// of containers attached under multus (libcni keys them by network name)
/// still match after a node switches to Plexus.
pub const DEFAULT_NETWORK_NAME: &str = "multus-cni-network";
/// Plugin types that forward to a thick-plugin daemon.
pub const THICK_TYPES: &[&str] = &[SHIM_TYPE, "multus-shim", "multus"];
/// The generated file's mode: multus writes 0600 (nothing in it is for
/// other users; the runtime reads it as root).
pub const OUTPUT_MODE: u32 = 0o600;
/// Extensions multus accepts for a primary (libcni's `.json` is not one).
const EXTENSIONS: &[&str] = &["conf", "conflist"];
/// How often one run renders again when the primary changed under it.
const MAX_ROUNDS: usize = 5;

/// The daemon-config.json keys copied into the generated file as they are,
/// with the JSON type each must have.
const COPIED: &[(&str, Kind)] = &[
    ("binDir", Kind::String),
    ("logFile", Kind::String),
    ("logLevel", Kind::String),
    ("logToStderr", Kind::Bool),
    ("logOptions", Kind::Object),
    ("namespaceIsolation", Kind::Bool),
    ("globalNamespaces", Kind::String),
    ("cniDir", Kind::String),
    ("auxiliaryCNIChainName", Kind::String),
    ("daemonSocketDir", Kind::String),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Bool,
    Object,
}

/// What can stop a run. Nothing is written when any of these happens.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: key {key:?}: {why}", file.display())]
    Config {
        file: PathBuf,
        key: String,
        why: String,
    },
    #[error("{}: cannot read the file: {source}", file.display())]
    ReadConfig {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "no primary CNI configuration in {}: it has no .conf or .conflist file{}",
        dir.display(),
        skipped_note(skipped)
    )]
    NoPrimary { dir: PathBuf, skipped: Vec<PathBuf> },
    #[error("cannot list {}: {source}", dir.display())]
    ListDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("primary CNI configuration {}: {why}; the last generated file is left as it was", path.display())]
    Primary { path: PathBuf, why: String },
    #[error(
        "the readiness indicator file {} does not exist (readinessindicatorfile); \
         nothing is written until it does",
        path.display()
    )]
    NotReady { path: PathBuf },
    #[error("refusing to write in {}: {source}", dir.display())]
    Untrusted {
        dir: PathBuf,
        #[source]
        source: trust::Untrusted,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn skipped_note(skipped: &[PathBuf]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let names: Vec<String> = skipped.iter().map(|p| p.display().to_string()).collect();
    format!(
        " but thick-plugin configurations, which are never a primary ({})",
        names.join(", ")
    )
}

impl Error {
    /// Whether the daemon configuration itself is at fault.
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Config { .. } | Error::ReadConfig { .. })
    }
}

/// The generator's keys of daemon-config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Where the primary configuration is (`multusAutoconfigDir`).
    pub autoconfig_dir: PathBuf,
    /// Where the generated file goes (`cniConfigDir`).
    pub cni_config_dir: PathBuf,
    /// The primary's file name, when not discovered (`multusMasterCNI`).
    pub master_cni: Option<String>,
    /// `cniVersion`; `None`: the primary's.
    pub cni_version: Option<String>,
    /// Name the network after the primary (`overrideNetworkName`).
    pub override_network_name: bool,
    /// `capabilities`: the seed the primary's capabilities are added to.
    pub capabilities: Map<String, Value>,
    /// `readinessindicatorfile`: nothing is written while it is missing.
    pub readiness_file: Option<PathBuf>,
    /// The keys copied verbatim (present and not empty).
    pub copied: Map<String, Value>,
}

impl Settings {
    /// Reads the generator's keys from `file`. A missing file counts as
    /// `{}` when `missing_ok` (the default path on a host without one).
    pub fn load(file: &Path, missing_ok: bool) -> Result<Self, Error> {
        match fs::read(file) {
            Ok(text) => Self::from_json(file, &text),
            Err(e) if e.kind() == io::ErrorKind::NotFound && missing_ok => {
                Self::from_json(file, b"{}")
            }
            Err(source) => Err(Error::ReadConfig {
                file: file.to_path_buf(),
                source,
            }),
        }
    }

    /// The generator's keys of the JSON text of `file`. Relative
    /// directories are taken relative to the file's directory, as
    /// everywhere in the daemon configuration.
    pub fn from_json(file: &Path, text: &[u8]) -> Result<Self, Error> {
        let keys = Keys::parse(file, text)?;
        let autoconfig_dir = keys.dir("multusAutoconfigDir", DEFAULT_AUTOCONFIG_DIR)?;
        let cni_config_dir = keys.dir("cniConfigDir", DEFAULT_CNI_CONFIG_DIR)?;
        let master_cni = keys.string("multusMasterCNI")?;
        if let Some(name) = &master_cni {
            if name.contains('/') || name == "." || name == ".." {
                return Err(keys.bad(
                    "multusMasterCNI",
                    format!("{name:?} must be a file name in multusAutoconfigDir"),
                ));
            }
        }
        let cni_version = keys.string("cniVersion")?;
        if let Some(v) = &cni_version {
            if result::compare(v, v).is_none() {
                return Err(keys.bad(
                    "cniVersion",
                    format!("{v:?} is not a version such as \"1.0.0\""),
                ));
            }
        }
        Ok(Settings {
            autoconfig_dir,
            cni_config_dir,
            master_cni,
            cni_version,
            override_network_name: keys.flag("overrideNetworkName")?,
            capabilities: keys.capabilities()?,
            readiness_file: keys
                .string("readinessindicatorfile")?
                .map(|p| resolve(file, &p)),
            copied: keys.copied()?,
        })
    }

    /// `<cniConfigDir>/00-plexus.conf`.
    pub fn output_path(&self) -> PathBuf {
        self.cni_config_dir.join(OUTPUT_NAME)
    }
}

/// The top-level object of a daemon configuration file, read key by key.
struct Keys<'a> {
    file: &'a Path,
    obj: Map<String, Value>,
}

impl<'a> Keys<'a> {
    /// The JSON text of `file`, which must be an object.
    fn parse(file: &'a Path, text: &[u8]) -> Result<Self, Error> {
        let no_object = |why: String| Error::Config {
            file: file.to_path_buf(),
            key: String::new(),
            why,
        };
        match serde_json::from_slice::<Value>(text) {
            Ok(Value::Object(obj)) => Ok(Keys { file, obj }),
            Ok(_) => Err(no_object("the top level must be a JSON object".into())),
            Err(e) => Err(no_object(format!("not valid JSON: {e}"))),
        }
    }

    /// The error for a bad `key`.
    fn bad(&self, key: &str, why: String) -> Error {
        Error::Config {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            why,
        }
    }

    /// A string key; `None` when absent, null or empty.
    fn string(&self, key: &str) -> Result<Option<String>, Error> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.bad(key, format!("must be a string, found {other}"))),
        }
    }

    /// A directory key, relative to the file's directory; `default` when
    /// not set.
    fn dir(&self, key: &str, default: &str) -> Result<PathBuf, Error> {
        Ok(match self.string(key)? {
            Some(d) => resolve(self.file, &d),
            None => PathBuf::from(default),
        })
    }

    /// A true/false key; false when absent or null.
    fn flag(&self, key: &str) -> Result<bool, Error> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.bad(key, format!("must be true or false, found {other}"))),
        }
    }

    /// `capabilities`: an object of true/false values.
    fn capabilities(&self) -> Result<Map<String, Value>, Error> {
        match self.obj.get("capabilities") {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(caps)) => match caps.iter().find(|(_, v)| !v.is_boolean()) {
                Some((k, v)) => Err(self.bad(
                    "capabilities",
                    format!("{k:?} must be true or false, found {v}"),
                )),
                None => Ok(caps.clone()),
            },
            Some(other) => Err(self.bad(
                "capabilities",
                format!("must be an object of true/false values, found {other}"),
            )),
        }
    }

    /// The [`COPIED`] keys that are set, each checked for its JSON type.
    /// Empty strings and false are left out, as multus leaves them out.
    fn copied(&self) -> Result<Map<String, Value>, Error> {
        let mut copied = Map::new();
        for &(key, kind) in COPIED {
            let Some(v) = self.obj.get(key) else { continue };
            let set = match (kind, v) {
                (_, Value::Null) => continue,
                (Kind::String, Value::String(s)) => !s.is_empty(),
                (Kind::Bool, Value::Bool(b)) => *b,
                (Kind::Object, Value::Object(_)) => true,
                _ => {
                    let want = match kind {
                        Kind::String => "a string",
                        Kind::Bool => "true or false",
                        Kind::Object => "an object",
                    };
                    return Err(self.bad(key, format!("must be {want}, found {v}")));
                }
            };
            if set {
                copied.insert(key.to_string(), v.clone());
            }
        }
        Ok(copied)
    }
}

/// `p` relative to the directory of `file` (made absolute first, so that
/// the generated `clusterNetwork` is an absolute path).
fn resolve(file: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    let file = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
    match file.parent() {
        Some(dir) if !path.is_absolute() && !dir.as_os_str().is_empty() => dir.join(path),
        _ => path.to_path_buf(),
    }
}

/// The primary configuration: its path and its JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct Primary {
    pub path: PathBuf,
    pub config: Map<String, Value>,
    /// Thick-plugin configurations passed over on the way to it.
    pub skipped: Vec<PathBuf>,
}

/// Reads and parses one configuration file.
fn read_config(path: &Path) -> Result<Map<String, Value>, Error> {
    let primary_error = |why: String| Error::Primary {
        path: path.to_path_buf(),
        why,
    };
    let text = fs::read(path).map_err(|e| primary_error(format!("cannot read it: {e}")))?;
    match serde_json::from_slice::<Value>(&text) {
        Ok(Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(primary_error("it is not a JSON object".into())),
        Err(e) => Err(primary_error(format!("not valid JSON: {e}"))),
    }
}

/// Whether `config` (a single configuration or a list) runs a thick
/// plugin's shim.
pub fn is_thick_plugin(config: &Map<String, Value>) -> bool {
    let thick = |c: &Value| {
        c.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| THICK_TYPES.contains(&t))
    };
    if config
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| THICK_TYPES.contains(&t))
    {
        return true;
    }
    config
        .get("plugins")
        .and_then(Value::as_array)
        .is_some_and(|plugins| plugins.iter().any(thick))
}

/// The candidates for the primary in `dir`, by name: regular files (or
/// links to them) ending in `.conf` or `.conflist`, except `00-plexus*`.
pub fn candidates(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let entries = fs::read_dir(dir).map_err(|source| Error::ListDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| {
            !name.starts_with(OWN_PREFIX)
                && Path::new(name)
                    .extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| EXTENSIONS.contains(&e))
        })
        .collect();
    names.sort();
    Ok(names
        .into_iter()
        .map(|n| dir.join(n))
        .filter(|p| p.is_file())
        .collect())
}

/// Finds the primary configuration: `multusMasterCNI`, or the first
/// candidate by name that is not a thick plugin's. A candidate that cannot
/// be read or parsed stops the search (it may be the primary, half
/// written): the caller keeps the last good file.
pub fn find_primary(settings: &Settings) -> Result<Primary, Error> {
    if let Some(name) = &settings.master_cni {
        let path = settings.autoconfig_dir.join(name);
        let config = read_config(&path)?;
        if is_thick_plugin(&config) {
            return Err(Error::Primary {
                path,
                why: "it is a thick plugin's configuration (multusMasterCNI must name the \
                      network the shim's calls are for)"
                    .into(),
            });
        }
        return Ok(Primary {
            path,
            config,
            skipped: Vec::new(),
        });
    }
    let mut skipped = Vec::new();
    for path in candidates(&settings.autoconfig_dir)? {
        let config = read_config(&path)?;
        if is_thick_plugin(&config) {
            skipped.push(path);
            continue;
        }
        return Ok(Primary {
            path,
            config,
            skipped,
        });
    }
    Err(Error::NoPrimary {
        dir: settings.autoconfig_dir.clone(),
        skipped,
    })
}

/// The generated file's bytes: compact JSON in the key order of multus's
/// `00-multus.conf`, empty values left out except `cniVersion`, `name` and
/// `type`, and no final newline (multus writes none).
pub fn render(settings: &Settings, primary: &Primary) -> Result<Vec<u8>, Error> {
    let version = generated_version(settings, primary)?;
    let name = network_name(settings, primary)?;
    let capabilities = capabilities(settings, primary);
    let copied = |key: &str| settings.copied.get(key).cloned();
    let fields: Vec<(&str, Option<Value>)> = vec![
        ("binDir", copied("binDir")),
        (
            "capabilities",
            (!capabilities.is_empty()).then_some(Value::Object(capabilities)),
        ),
        ("cniVersion", Some(Value::String(version))),
        ("logFile", copied("logFile")),
        ("logLevel", copied("logLevel")),
        ("logToStderr", copied("logToStderr")),
        ("logOptions", copied("logOptions")),
        ("name", Some(Value::String(name))),
        (
            "clusterNetwork",
            Some(Value::String(primary.path.to_string_lossy().into_owned())),
        ),
        ("namespaceIsolation", copied("namespaceIsolation")),
        ("globalNamespaces", copied("globalNamespaces")),
        ("type", Some(Value::String(SHIM_TYPE.into()))),
        ("cniDir", copied("cniDir")),
        ("auxiliaryCNIChainName", copied("auxiliaryCNIChainName")),
        ("daemonSocketDir", copied("daemonSocketDir")),
        (
            "overrideNetworkName",
            settings.override_network_name.then_some(Value::Bool(true)),
        ),
    ];
    Ok(compact_object(fields))
}

impl Primary {
    /// The error for something wrong with the primary configuration.
    fn error(&self, why: String) -> Error {
        Error::Primary {
            path: self.path.clone(),
            why,
        }
    }
}

/// The generated file's `cniVersion`: the daemon configuration's, else the
/// primary's. From 0.4.0 on, the primary must be 0.4.0 or newer (multus's
/// check).
fn generated_version(settings: &Settings, primary: &Primary) -> Result<String, Error> {
    let primary_version = match primary.config.get("cniVersion") {
        None | Some(Value::Null) => None,
        Some(Value::String(v)) => Some(v.as_str()),
        Some(other) => return Err(primary.error(format!("cniVersion {other} is not a string"))),
    };
    let version = match (&settings.cni_version, primary_version) {
        (Some(ours), _) => ours.clone(),
        (None, Some(theirs)) if result::compare(theirs, theirs).is_some() => theirs.to_string(),
        (None, Some(theirs)) => {
            return Err(primary.error(format!(
                "cniVersion {theirs:?} is not a version such as \"1.0.0\""
            )))
        }
        (None, None) => {
            return Err(primary
                .error("it has no cniVersion, and neither has the daemon configuration".into()))
        }
    };
    if result::compare(&version, "0.4.0").is_some_and(|o| o.is_ge()) {
        let new_enough = primary_version
            .and_then(|v| result::compare(v, "0.4.0"))
            .is_some_and(|o| o.is_ge());
        if !new_enough {
            return Err(primary.error(format!(
                "its cniVersion {} is older than 0.4.0 while the generated file's is {version}",
                primary_version.unwrap_or("(none)")
            )));
        }
    }
    Ok(version)
}

/// The generated network's name: multus's, or the primary's when
/// `overrideNetworkName` asks for it.
fn network_name(settings: &Settings, primary: &Primary) -> Result<String, Error> {
    if !settings.override_network_name {
        return Ok(DEFAULT_NETWORK_NAME.to_string());
    }
    match primary.config.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => Err(primary.error("it has no name, which overrideNetworkName asks for".into())),
    }
}

/// The daemon configuration's `capabilities` plus every capability the
/// primary (each of its plugins, for a list) enables.
fn capabilities(settings: &Settings, primary: &Primary) -> Map<String, Value> {
    let mut capabilities = settings.capabilities.clone();
    let mut add = |caps: Option<&Value>| {
        if let Some(Value::Object(caps)) = caps {
            for (k, v) in caps {
                if v == &Value::Bool(true) {
                    capabilities.insert(k.clone(), Value::Bool(true));
                }
            }
        }
    };
    match primary.config.get("plugins") {
        Some(Value::Array(plugins)) => plugins.iter().for_each(|p| add(p.get("capabilities"))),
        _ => add(primary.config.get("capabilities")),
    }
    capabilities
}

/// A compact JSON object of the fields that have a value, in their order.
fn compact_object(fields: Vec<(&str, Option<Value>)>) -> Vec<u8> {
    let mut out = String::from("{");
    for (key, value) in fields {
        let Some(value) = value else { continue };
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(&Value::String(key.to_string()).to_string());
        out.push(':');
        out.push_str(&value.to_string());
    }
    out.push('}');
    out.into_bytes()
}

/// Replaces `path` with `bytes` unless it already holds exactly them:
/// a temporary file in the same directory (hidden, so path units ignore
/// it), fsync, rename over `path`, fsync of the directory. A reader sees
/// the whole old file or the whole new one. Whether it wrote.
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<bool, Error> {
    let err = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    match fs::read(path) {
        Ok(old) if old == bytes => return Ok(false),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    // A leftover of a killed run that had this pid.
    let _ = fs::remove_file(&tmp);
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(OUTPUT_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        // The umask may have taken bits away; never added any.
        f.set_permissions(fs::Permissions::from_mode(OUTPUT_MODE))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(err(e));
    }
    Ok(true)
}

/// What one run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub output: PathBuf,
    pub primary: PathBuf,
    /// Thick-plugin configurations passed over.
    pub skipped: Vec<PathBuf>,
    /// Whether the file was replaced (false: it already held this).
    pub written: bool,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.written { "wrote" } else { "unchanged:" };
        write!(
            f,
            "{what} {} (primary: {})",
            self.output.display(),
            self.primary.display()
        )?;
        for s in &self.skipped {
            write!(
                f,
                "; skipped the thick-plugin configuration {}",
                s.display()
            )?;
        }
        Ok(())
    }
}

/// One run: renders from the primary and writes when that changes the
/// file, then renders again and repeats while the result differs, so a
/// primary changed during the run is not missed (a path unit's trigger
/// during a run is merged into that run).
pub fn generate(settings: &Settings) -> Result<Report, Error> {
    if let Some(path) = &settings.readiness_file {
        if !path.exists() {
            return Err(Error::NotReady { path: path.clone() });
        }
    }
    trust::check_dir(&settings.cni_config_dir).map_err(|source| Error::Untrusted {
        dir: settings.cni_config_dir.clone(),
        source,
    })?;
    let output = settings.output_path();
    let mut written = false;
    let mut last: Option<Vec<u8>> = None;
    let mut primary = find_primary(settings)?;
    for _ in 0..MAX_ROUNDS {
        let bytes = render(settings, &primary)?;
        if last.as_ref() == Some(&bytes) {
            break;
        }
        written |= write_if_changed(&output, &bytes)?;
        last = Some(bytes);
        primary = find_primary(settings)?;
    }
    Ok(Report {
        output,
        primary: primary.path,
        skipped: primary.skipped,
        written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Settings {
        Settings::from_json(Path::new("/etc/plexus/daemon-config.json"), text.as_bytes()).unwrap()
    }

    fn primary(path: &str, config: Value) -> Primary {
        Primary {
            path: PathBuf::from(path),
            config: config.as_object().unwrap().clone(),
            skipped: Vec::new(),
        }
    }

    #[test]
    fn defaults_should_be_the_runtime_directory() {
        let s = settings("{}");
        assert_eq!(s.autoconfig_dir, Path::new(DEFAULT_AUTOCONFIG_DIR));
        assert_eq!(s.output_path(), Path::new("/etc/cni/net.d/00-plexus.conf"));
        let s = settings(r#"{"multusAutoconfigDir":"net.d","cniConfigDir":"/x"}"#);
        assert_eq!(s.autoconfig_dir, Path::new("/etc/plexus/net.d"));
        assert_eq!(s.output_path(), Path::new("/x/00-plexus.conf"));
    }

    #[test]
    fn wrong_types_should_name_the_key() {
        for (text, key) in [
            (r#"{"capabilities":{"portMappings":"yes"}}"#, "capabilities"),
            (r#"{"overrideNetworkName":1}"#, "overrideNetworkName"),
            (r#"{"multusMasterCNI":"../x.conf"}"#, "multusMasterCNI"),
            (r#"{"cniVersion":"one"}"#, "cniVersion"),
            (r#"{"logOptions":"big"}"#, "logOptions"),
        ] {
            let e = Settings::from_json(Path::new("/c.json"), text.as_bytes()).unwrap_err();
            assert!(
                matches!(&e, Error::Config { key: k, .. } if k == key),
                "{text}: {e}"
            );
            assert!(e.is_config());
        }
    }

    #[test]
    fn render_should_follow_multus_key_order_and_leave_out_empty_values() {
        let s = settings(
            r#"{"cniVersion":"0.3.1","logLevel":"verbose","logToStderr":true,"binDir":"",
                "namespaceIsolation":false,"capabilities":{"bandwidth":true},
                "daemonSocketDir":"/run/plexus","socketDir":"/run/plexus"}"#,
        );
        let p = primary(
            "/etc/cni/net.d/10-flannel.conflist",
            serde_json::json!({"cniVersion":"0.3.1","name":"cbr0","plugins":[
                {"type":"flannel"},{"type":"portmap","capabilities":{"portMappings":true,"x":false}}]}),
        );
        let out = String::from_utf8(render(&s, &p).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"capabilities":{"bandwidth":true,"portMappings":true},"cniVersion":"0.3.1","logLevel":"verbose","logToStderr":true,"name":"multus-cni-network","clusterNetwork":"/etc/cni/net.d/10-flannel.conflist","type":"plexus-shim","daemonSocketDir":"/run/plexus"}"#
        );
    }

    #[test]
    fn version_should_come_from_the_primary_unless_set_and_be_checked() {
        let p = |v: &str| {
            primary(
                "/n/10-a.conf",
                serde_json::json!({"cniVersion": v, "name": "a", "type": "bridge"}),
            )
        };
        let out = render(&settings("{}"), &p("1.0.0")).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .contains(r#""cniVersion":"1.0.0""#));
        let e = render(&settings(r#"{"cniVersion":"1.0.0"}"#), &p("0.3.1")).unwrap_err();
        assert!(e.to_string().contains("older than 0.4.0"), "{e}");
        let e = render(
            &settings("{}"),
            &primary("/n/a.conf", serde_json::json!({})),
        );
        assert!(e.is_err());
        let named = render(&settings(r#"{"overrideNetworkName":true}"#), &p("1.0.0")).unwrap();
        assert!(String::from_utf8(named)
            .unwrap()
            .ends_with(r#""name":"a","clusterNetwork":"/n/10-a.conf","type":"plexus-shim","overrideNetworkName":true}"#));
    }

    #[test]
    fn thick_plugin_configs_should_be_recognised() {
        let thick = |v: Value| is_thick_plugin(v.as_object().unwrap());
        assert!(thick(serde_json::json!({"type":"multus-shim"})));
        assert!(thick(
            serde_json::json!({"plugins":[{"type":"plexus-shim"}]})
        ));
        assert!(!thick(
            serde_json::json!({"plugins":[{"type":"bridge"},{"type":"portmap"}]})
        ));
    }
}
