//! daemon-config.json -> validated settings, one `Config` per module.
//!
//! The file uses the multus `daemon-config.json` schema plus Plexus keys.
//! Parsing happens in two stages: the file is read as a JSON object, then
//! every key is checked on its own so that *all* problems are reported at
//! once, each naming the file, the key and what is wrong.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::{
    activation, api, cni, device_info, duration, json, k8s, limit, logging, readiness_file,
    selection, server, trust,
};

/// Where the daemon looks for its configuration by default.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/plexus/daemon-config.json";
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Where `metricsPort` listens by default: this host only. multus listens
/// on all addresses; metrics name containers and load, so exposing them
/// to the network is a choice to make explicitly.
pub const DEFAULT_METRICS_BIND_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Keys of the multus schema that Plexus accepts without complaint even
/// where it does not act on them (yet); anything else gets a warning.
const KNOWN_KEYS: &[&str] = &[
    // Plexus and multus server keys handled here.
    "socketDir",
    "connectionLimit",
    "queueTimeout",
    "maxConnections",
    "readTimeout",
    "bodyBudgetBytes",
    "shutdownTimeout",
    "idleTimeout",
    "logLevel",
    "logFile",
    "logToStderr",
    "metricsPort",
    "metricsBindAddress",
    // Engine and network keys.
    "binDir",
    "confDir",
    "cniDir",
    "stateDir",
    "pluginTimeout",
    "pluginSpawner",
    "delErrorsReported",
    "cleanupRetryInterval",
    "cleanupGiveUpAfter",
    "clusterNetwork",
    "defaultNetworks",
    "delegates",
    "systemNamespaces",
    "multusNamespace",
    "namespaceIsolation",
    "globalNamespaces",
    "auxiliaryCNIChainName",
    "retryDeleteOnError",
    "readinessindicatorfile",
    "readinessIndicatorTimeout",
    "kubeconfig",
    "nodeName",
    "kubernetesSyncTimeout",
    "kubernetesRequestTimeout",
    "podEvents",
    "podResourcesSocket",
    "deviceCheckpointFile",
    "deviceInfoDir",
    "runtimeConfig",
    "capabilities",
    // multus generator and deployment keys.
    "chrootDir",
    "enablePprof",
    "perNodeCertificate",
    "multusConfigFile",
    "multusAutoconfigDir",
    "cniConfigDir",
    "multusMasterCNI",
    "cniVersion",
    "forceCNIVersion",
    "overrideNetworkName",
    "daemonSocketDir",
    "type",
    "name",
    "logOptions",
];

/// The known key nearest to `key`, when one is near enough to be what
/// was meant: the same but for case, or a few letters off (a typo such
/// as `conectionLimit`).
pub fn nearest_known_key(key: &str) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    KNOWN_KEYS
        .iter()
        .map(|k| (edit_distance(&lower, &k.to_ascii_lowercase()), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 5) && *d < k.len() / 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(up + 1)
                .min(row[j] + 1);
            diagonal = up;
        }
    }
    row[b.len()]
}

/// One problem with the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    /// The offending key; empty when the whole file is at fault.
    pub key: String,
    pub why: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file.display(), self.why)
        } else {
            write!(
                f,
                "{}: key {:?}: {}",
                self.file.display(),
                self.key,
                self.why
            )
        }
    }
}

/// Every problem found in one configuration file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    pub problems: Vec<Problem>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "invalid configuration ({n} problem{})",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Settings of the daemon's lifecycle (stop, idle exit, metrics port).
///
/// Defined here rather than in `daemon`: the configuration depends only on
/// the leaf modules whose settings it builds, never on the module that
/// wires them together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    /// How long open connections and CNI work in flight may take to finish
    /// after a stop request.
    pub shutdown_timeout: Duration,
    /// Exit after this long without connections, requests or CNI work
    /// (off: `None`).
    pub idle_timeout: Option<Duration>,
    /// TCP port for `/metrics` besides the unix socket (off: `None`).
    pub metrics_port: Option<u16>,
    /// Address the metrics port listens on.
    pub metrics_bind_address: IpAddr,
}

/// The validated configuration, split by the module that uses it.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this came from (or the default path when it was absent).
    pub path: PathBuf,
    pub activation: activation::Config,
    pub limit: limit::Config,
    pub server: server::Config,
    pub logging: logging::Config,
    pub lifecycle: Lifecycle,
    pub cni: cni::Config,
    /// The networks: the file's, and which keys a call's network
    /// configuration may set (multus's overlay).
    pub selection: selection::overlay::Overlay,
    /// The readiness indicator file CNI calls wait for, if any.
    pub readiness_file: Option<readiness_file::Config>,
    /// The Kubernetes source's settings; whether there is a source at all
    /// is [`k8s::Config::enabled`].
    pub kubernetes: k8s::Config,
    /// Keys that are neither Plexus nor multus keys (probably typos).
    pub unknown_keys: Vec<String>,
}

impl Config {
    /// Reads and validates `path`. A missing file is an error unless
    /// `missing_ok` (the default path on a host without a config file).
    pub fn load(path: &Path, missing_ok: bool) -> Result<Self> {
        let problem = |why: String| Error {
            problems: vec![Problem {
                file: path.to_path_buf(),
                key: String::new(),
                why,
            }],
        };
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && missing_ok => {
                return Self::from_json(path, b"{}");
            }
            Err(e) => return Err(problem(format!("cannot read the file: {e}"))),
        };
        Self::from_json(path, &text)
    }

    /// Validates the JSON text of a configuration file named `path`.
    pub fn from_json(path: &Path, text: &[u8]) -> Result<Self> {
        let value: Value = serde_json::from_slice(text).map_err(|e| Error {
            problems: vec![Problem {
                file: path.to_path_buf(),
                key: String::new(),
                why: format!("not valid JSON: {e}"),
            }],
        })?;
        let Value::Object(raw) = value else {
            return Err(Error {
                problems: vec![Problem {
                    file: path.to_path_buf(),
                    key: String::new(),
                    why: "the top level must be a JSON object".into(),
                }],
            });
        };
        let mut f = Fields {
            file: path,
            obj: &raw,
            problems: Vec::new(),
        };

        let socket_dir = f
            .path("socketDir")
            .unwrap_or_else(|| PathBuf::from(api::DEFAULT_SOCKET_DIR));
        let connection_limit = f
            .positive("connectionLimit")
            .or_else(|| Some(crate::limit::default_connection_limit()));
        let queue_timeout = f.duration("queueTimeout").unwrap_or(DEFAULT_QUEUE_TIMEOUT);
        let max_connections = f
            .positive("maxConnections")
            .unwrap_or(NonZeroUsize::new(DEFAULT_MAX_CONNECTIONS).unwrap_or(NonZeroUsize::MIN));
        let read_timeout = f
            .nonzero_duration("readTimeout")
            .unwrap_or(DEFAULT_READ_TIMEOUT);
        // Never below one largest body, or such a request could never run.
        let body_budget_bytes = f
            .positive("bodyBudgetBytes")
            .map(|n| n.get().max(api::MAX_BODY_BYTES))
            .unwrap_or(server::DEFAULT_BODY_BUDGET_BYTES);
        let shutdown_timeout = f
            .duration("shutdownTimeout")
            .unwrap_or(DEFAULT_SHUTDOWN_TIMEOUT);
        let idle_timeout = f.duration("idleTimeout").filter(|d| !d.is_zero());
        let level = f.log_level("logLevel").unwrap_or(logging::Level::Info);
        let log_file = f.path("logFile");
        let log_to_stderr = f.bool("logToStderr").unwrap_or(log_file.is_none());
        let metrics_port = f.port("metricsPort");
        let metrics_bind_address = f
            .ip_addr("metricsBindAddress")
            .unwrap_or(DEFAULT_METRICS_BIND_ADDRESS);
        let bin_dirs = f
            .search_path("binDir")
            .unwrap_or_else(|| cni::DEFAULT_BIN_DIRS.iter().map(PathBuf::from).collect());
        let plugin_spawner = f.path("pluginSpawner");
        let cleanup = {
            let d = cni::CleanupPolicy::default();
            cni::CleanupPolicy {
                errors_reported: f.count("delErrorsReported").unwrap_or(d.errors_reported),
                retry_interval: f
                    .nonzero_duration("cleanupRetryInterval")
                    .unwrap_or(d.retry_interval),
                give_up_after: f
                    .positive("cleanupGiveUpAfter")
                    .map_or(d.give_up_after, |n| {
                        u32::try_from(n.get()).unwrap_or(u32::MAX)
                    }),
            }
        };
        let conf_dir = f
            .path("confDir")
            .unwrap_or_else(|| PathBuf::from(cni::DEFAULT_CONF_DIR));
        let state_dir = f
            .path("stateDir")
            .unwrap_or_else(|| PathBuf::from(cni::DEFAULT_STATE_DIR));
        let plugin_timeout = f
            .nonzero_duration("pluginTimeout")
            .unwrap_or(cni::DEFAULT_PLUGIN_TIMEOUT);
        let cluster_network = f
            .string("clusterNetwork")
            .filter(|s| !s.is_empty())
            .map(|s| f.network_ref(s));
        let default_networks: Vec<String> = f
            .string_list("defaultNetworks")
            .unwrap_or_default()
            .into_iter()
            .map(|s| f.network_ref(s))
            .collect();
        let delegates = f.delegates("delegates");
        let auxiliary_chain = f.string("auxiliaryCNIChainName").filter(|s| !s.is_empty());
        if let Some(name) = &auxiliary_chain {
            if !cni::confdir::is_plugin_dir_name(name) {
                f.problem(
                    "auxiliaryCNIChainName",
                    format!("{name:?} cannot name a plugin directory"),
                );
            }
            // multus fails every ADD for this; here it is found at start
            // (without clusterNetwork here, on each call that names one).
            if cluster_network.as_deref().is_some_and(|c| !c.contains('/'))
                || (cluster_network.is_none() && !delegates.is_empty())
            {
                f.problem(
                    "auxiliaryCNIChainName",
                    "needs clusterNetwork to be a path (the chain's plugins are in \
                     <directory of clusterNetwork>/<auxiliaryCNIChainName>/*.conf)",
                );
            }
        }
        // multus's cache directory: read (and cleaned) for the containers
        // multus attached; plexusd keeps its own records in stateDir.
        let cni_dir = f
            .path("cniDir")
            .unwrap_or_else(|| PathBuf::from(cni::multus_cache::DEFAULT_CNI_DIR));
        let multus_namespace = f
            .string("multusNamespace")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| selection::DEFAULT_MULTUS_NAMESPACE.into());
        let system_namespaces = f
            .string_list("systemNamespaces")
            .unwrap_or_else(|| vec![selection::DEFAULT_MULTUS_NAMESPACE.into()]);
        let namespace_isolation = f.bool("namespaceIsolation").unwrap_or(false);
        let global_namespaces = selection::nad::parse_global_namespaces(
            &f.string("globalNamespaces").unwrap_or_default(),
        );
        let readiness_path = f.path("readinessindicatorfile");
        let readiness_timeout = f
            .duration("readinessIndicatorTimeout")
            .unwrap_or(readiness_file::DEFAULT_TIMEOUT);
        let kubeconfig = f.path("kubeconfig");
        let node_name = match f.string("nodeName").filter(|s| !s.is_empty()) {
            Some(n) => {
                if !k8s::is_valid_node_name(&n) {
                    f.problem(
                        "nodeName",
                        format!("{n:?} is not a Kubernetes node name (a lowercase DNS subdomain)"),
                    );
                }
                n
            }
            None => k8s::host_node_name(),
        };
        let pod_events = f.bool("podEvents").unwrap_or(true);
        let kubernetes_sync_timeout = f
            .duration("kubernetesSyncTimeout")
            .unwrap_or(k8s::DEFAULT_SYNC_TIMEOUT);
        let kubernetes_request_timeout = f
            .nonzero_duration("kubernetesRequestTimeout")
            .unwrap_or(k8s::DEFAULT_REQUEST_TIMEOUT);
        let pod_resources_socket = f
            .path("podResourcesSocket")
            .unwrap_or_else(|| k8s::devices::DEFAULT_POD_RESOURCES_SOCKET.into());
        let device_checkpoint = f
            .path("deviceCheckpointFile")
            .unwrap_or_else(|| k8s::devices::DEFAULT_CHECKPOINT_FILE.into());
        let device_info_dir = f
            .path("deviceInfoDir")
            .unwrap_or_else(|| device_info::DEFAULT_DIR.into());

        // A call's network configuration may set the network keys this
        // file leaves unset (multus's overlay).
        let set_here = |key: &str| match raw.get(key) {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        let selection = selection::overlay::Overlay::new(
            selection::Config {
                cluster_network: cluster_network.unwrap_or_default(),
                delegates,
                default_networks,
                multus_namespace,
                system_namespaces,
                namespace_isolation,
                global_namespaces,
                auxiliary_chain,
                conf_dir: None,
            },
            set_here,
        );
        let unknown_keys = raw
            .keys()
            .filter(|k| !KNOWN_KEYS.contains(&k.as_str()))
            .cloned()
            .collect();
        if !f.problems.is_empty() {
            return Err(Error {
                problems: f.problems,
            });
        }
        Ok(Config {
            path: path.to_path_buf(),
            activation: activation::Config { socket_dir },
            limit: limit::Config {
                connection_limit,
                queue_timeout,
                max_connections,
            },
            server: server::Config {
                read_timeout,
                max_body_bytes: api::MAX_BODY_BYTES,
                body_budget_bytes,
            },
            logging: logging::Config {
                level,
                file: log_file,
                to_stderr: log_to_stderr,
            },
            lifecycle: Lifecycle {
                shutdown_timeout,
                idle_timeout,
                metrics_port,
                metrics_bind_address,
            },
            cni: cni::Config {
                bin_dirs,
                conf_dir,
                state_dir,
                plugin_timeout,
                device_info_dir: device_info_dir.clone(),
                cni_dir,
                cleanup,
                plugin_spawner,
            },
            selection,
            readiness_file: readiness_path.map(|path| readiness_file::Config {
                path,
                timeout: readiness_timeout,
            }),
            kubernetes: k8s::Config {
                kubeconfig,
                node_name,
                sync_timeout: kubernetes_sync_timeout,
                request_timeout: kubernetes_request_timeout,
                devices: k8s::devices::DeviceSource {
                    socket: pod_resources_socket,
                    checkpoint: device_checkpoint,
                    timeout: kubernetes_request_timeout,
                },
                device_info_dir,
                pod_events,
            },
            unknown_keys,
        })
    }
}

/// Which paths [`Config::check_paths`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathScope {
    /// `socketDir` (only written when the daemon binds the socket itself).
    pub socket_dir: bool,
}

impl Config {
    /// Checks that no user but root can write the directories the daemon
    /// writes (see [`trust`] for the rule): `socketDir` (per `scope`),
    /// `stateDir` and multus's `cniDir` (DEL acts on multus's caches; a
    /// call's configuration may name networks even when this file names
    /// none), and `logFile`'s directory. Every problem is reported, each
    /// naming its key. Blocking.
    pub fn check_paths(&self, scope: PathScope) -> Result<()> {
        let mut problems = Vec::new();
        let mut check = |key: &str, result: std::result::Result<(), trust::Untrusted>| {
            if let Err(e) = result {
                let mut why = format!("refusing to use it: {}", crate::causes::chain(&e));
                why.push_str(
                    "; every directory on the way to a path plexusd writes must be owned by \
                     root and writable only by root (a sticky directory such as /tmp may be \
                     writable by others above it), and symlinks on the way must be root's",
                );
                problems.push(Problem {
                    file: self.path.clone(),
                    key: key.to_string(),
                    why,
                });
            }
        };
        if scope.socket_dir {
            check("socketDir", trust::check_dir(&self.activation.socket_dir));
        }
        // The records live in `attachments/` below it (cni::record).
        check(
            "stateDir",
            trust::check_dir(&self.cni.state_dir.join("attachments")),
        );
        // Its caches name the configurations DEL runs, and DEL removes and
        // moves files there.
        check("cniDir", trust::check_dir(&self.cni.cni_dir));
        if let Some(file) = &self.logging.file {
            check("logFile", trust::check_file(file));
        }
        if let Some(file) = &self.kubernetes.kubeconfig {
            check("kubeconfig", trust::check_trusted_input(file));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error { problems })
        }
    }
}

/// Typed access to the keys of one file, collecting problems.
struct Fields<'a> {
    file: &'a Path,
    obj: &'a Map<String, Value>,
    problems: Vec<Problem>,
}

impl Fields<'_> {
    fn problem(&mut self, key: &str, why: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            why: why.into(),
        });
    }

    /// The value of `key`, treating JSON null like an absent key.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn string(&mut self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                let why = format!("must be a string, found {}", json::kind(other));
                self.problem(key, why);
                None
            }
        }
    }

    fn path(&mut self, key: &str) -> Option<PathBuf> {
        let s = self.string(key)?;
        if s.is_empty() {
            self.problem(key, "must not be empty");
            return None;
        }
        Some(self.resolve(&s))
    }

    /// Relative paths are taken relative to the configuration file's
    /// directory, so a config and its network files can travel together.
    fn resolve(&self, p: &str) -> PathBuf {
        let path = Path::new(p);
        if path.is_absolute() {
            return path.to_path_buf();
        }
        match self.file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }

    /// A network reference: a name, or (with a '/') a path, resolved like
    /// other paths.
    fn network_ref(&self, s: String) -> String {
        if s.contains('/') {
            self.resolve(&s).to_string_lossy().into_owned()
        } else {
            s
        }
    }

    /// multus's inline network configurations: a list of JSON objects.
    fn delegates(&mut self, key: &str) -> Vec<Value> {
        let Some(v) = self.get(key) else {
            return Vec::new();
        };
        match v {
            Value::Array(items) if items.iter().all(Value::is_object) => items.clone(),
            other => {
                let why = format!(
                    "must be a list of network configurations (JSON objects), found {}",
                    json::kind(other)
                );
                self.problem(key, why);
                Vec::new()
            }
        }
    }

    /// A list of non-empty strings.
    fn string_list(&mut self, key: &str) -> Option<Vec<String>> {
        let v = self.get(key)?;
        let Value::Array(items) = v else {
            let why = format!("must be a list of strings, found {}", json::kind(v));
            self.problem(key, why);
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) if !s.is_empty() => out.push(s.clone()),
                other => {
                    let why = format!(
                        "item {i} must be a non-empty string, found {}",
                        json::kind(other)
                    );
                    self.problem(key, why);
                    return None;
                }
            }
        }
        Some(out)
    }

    /// A ':'-separated list of absolute directories.
    fn search_path(&mut self, key: &str) -> Option<Vec<PathBuf>> {
        let s = self.string(key)?;
        let dirs: Vec<PathBuf> = s
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| self.resolve(d))
            .collect();
        if dirs.is_empty() {
            self.problem(key, "must name at least one directory");
            return None;
        }
        Some(dirs)
    }

    fn bool(&mut self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                let why = format!("must be true or false, found {}", json::kind(other));
                self.problem(key, why);
                None
            }
        }
    }

    fn positive(&mut self, key: &str) -> Option<NonZeroUsize> {
        let v = self.get(key)?;
        match v.as_i64() {
            Some(n) if n > 0 => usize::try_from(n).ok().and_then(NonZeroUsize::new),
            Some(n) => {
                self.problem(key, format!("must be greater than 0, got {n}"));
                None
            }
            None => {
                let why = format!(
                    "must be a whole number greater than 0, found {}",
                    json::kind(v)
                );
                self.problem(key, why);
                None
            }
        }
    }

    /// A whole number from 0 to 1000000.
    fn count(&mut self, key: &str) -> Option<u32> {
        let v = self.get(key)?;
        match v.as_i64() {
            Some(n) if (0..=1_000_000).contains(&n) => u32::try_from(n).ok(),
            _ => {
                let why = format!(
                    "must be a whole number from 0 to 1000000, found {}",
                    json::kind(v)
                );
                self.problem(key, why);
                None
            }
        }
    }

    fn port(&mut self, key: &str) -> Option<u16> {
        let v = self.get(key)?;
        match v.as_i64() {
            Some(n) if (1..=65535).contains(&n) => u16::try_from(n).ok(),
            _ => {
                self.problem(
                    key,
                    format!("must be a TCP port from 1 to 65535, found {v}"),
                );
                None
            }
        }
    }

    fn ip_addr(&mut self, key: &str) -> Option<IpAddr> {
        let s = self.string(key)?;
        match s.trim().parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                self.problem(
                    key,
                    format!(
                        "{s:?} is not an IP address (such as \"127.0.0.1\", \"0.0.0.0\" or \"::\")"
                    ),
                );
                None
            }
        }
    }

    fn duration(&mut self, key: &str) -> Option<Duration> {
        let v = self.get(key)?;
        let Value::String(s) = v else {
            let why = format!(
                "must be a duration string such as \"10s\" or \"500ms\", found {}",
                json::kind(v)
            );
            self.problem(key, why);
            return None;
        };
        match duration::parse(s) {
            Ok(d) => Some(d),
            Err(why) => {
                self.problem(key, why);
                None
            }
        }
    }

    fn nonzero_duration(&mut self, key: &str) -> Option<Duration> {
        let d = self.duration(key)?;
        if d.is_zero() {
            self.problem(key, "must be longer than zero");
            return None;
        }
        Some(d)
    }

    fn log_level(&mut self, key: &str) -> Option<logging::Level> {
        let s = self.string(key)?;
        match logging::Level::parse(&s) {
            Some(l) => Some(l),
            None => {
                self.problem(
                    key,
                    format!(
                        "unknown level {s:?}; use one of trace, debug, verbose, info, warn, error, panic"
                    ),
                );
                None
            }
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
