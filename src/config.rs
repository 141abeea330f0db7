//! daemon-config.json -> validated settings, one `Config` per module.
//!
//! The file uses the multus `daemon-config.json` schema plus Plexus keys,
//! every one described once in [`KEYS`] (`keys.rs`). Parsing happens in
//! two stages: the file is read as a JSON object, then every key is read
//! by its kind (`fields.rs`) so that *all* problems are reported at once,
//! each naming the file, the key and what is wrong; then each module's
//! `Config` is built from the checked values.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::{
    activation, api, cni, k8s, limit, logging, readiness_file, reconcile, selection, server, trust,
};

mod fields;
mod keys;

use fields::Fields;
pub use keys::{key, nearest_known_key, Key, Kind, Role, Unset, KEYS};
use keys::{Raw, NAMES};

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
    /// Reconciling the records with the runtime's sandboxes.
    pub reconcile: reconcile::Config,
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
        let obj = json_object(path, text)?;
        let mut f = Fields::new(path, &obj);
        let raw = Raw::read(&mut f);
        raw.check_auxiliary_chain(&mut f);
        let mut problems = f.problems;
        if !problems.is_empty() {
            // In the order of the keys, as they are read.
            problems.sort_by_key(|p| KEYS.iter().position(|k| k.name == p.key));
            return Err(Error { problems });
        }
        Ok(Config {
            path: path.to_path_buf(),
            activation: activation::Config {
                socket_dir: raw.socket_dir.clone(),
            },
            limit: raw.limit(),
            server: raw.server(),
            logging: raw.logging(),
            lifecycle: raw.lifecycle(),
            cni: raw.cni(),
            selection: raw.selection(&obj),
            readiness_file: raw.readiness_file(),
            kubernetes: raw.kubernetes(),
            reconcile: raw.reconcile(),
            unknown_keys: obj.keys().filter(|k| key(k).is_none()).cloned().collect(),
        })
    }
}

/// The top-level object of the JSON text of `file`.
fn json_object(file: &Path, text: &[u8]) -> Result<Map<String, Value>> {
    let problem = |why: String| Error {
        problems: vec![Problem {
            file: file.to_path_buf(),
            key: String::new(),
            why,
        }],
    };
    match serde_json::from_slice(text) {
        Ok(Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(problem("the top level must be a JSON object".into())),
        Err(e) => Err(problem(format!("not valid JSON: {e}"))),
    }
}

/// Each module's settings from the keys, checked.
impl Raw {
    /// multus fails every ADD for this; here it is found at start
    /// (without clusterNetwork here, on each call that names one).
    fn check_auxiliary_chain(&self, f: &mut Fields<'_>) {
        if self.auxiliary_chain.is_none() {
            return;
        }
        let cluster = self.cluster_network.as_deref();
        if cluster.is_some_and(|c| !c.contains('/'))
            || (cluster.is_none() && !self.delegates.is_empty())
        {
            f.problem(
                NAMES.auxiliary_chain,
                "needs clusterNetwork to be a path (the chain's plugins are in \
                 <directory of clusterNetwork>/<auxiliaryCNIChainName>/*.conf)",
            );
        }
    }

    fn limit(&self) -> limit::Config {
        let connection_limit = self
            .connection_limit
            .and_then(NonZeroUsize::new)
            .unwrap_or_else(limit::default_connection_limit);
        limit::Config {
            connection_limit: Some(connection_limit),
            delete_limit: Some(NonZeroUsize::new(self.delete_limit).unwrap_or(NonZeroUsize::MIN)),
            queue_timeout: self.queue_timeout,
            max_connections: NonZeroUsize::new(self.max_connections).unwrap_or(NonZeroUsize::MIN),
        }
    }

    fn server(&self) -> server::Config {
        server::Config {
            read_timeout: self.read_timeout,
            max_body_bytes: api::MAX_BODY_BYTES,
            // Never below one largest body, or such a request could never
            // run.
            body_budget_bytes: self.body_budget_bytes.max(api::MAX_BODY_BYTES),
        }
    }

    fn logging(&self) -> logging::Config {
        logging::Config {
            level: self.log_level,
            file: self.log_file.clone(),
            to_stderr: self.log_to_stderr.unwrap_or(self.log_file.is_none()),
        }
    }

    fn lifecycle(&self) -> Lifecycle {
        Lifecycle {
            shutdown_timeout: self.shutdown_timeout,
            idle_timeout: self.idle_timeout.filter(|d| !d.is_zero()),
            metrics_port: self.metrics_port,
            metrics_bind_address: self.metrics_bind_address,
        }
    }

    fn cni(&self) -> cni::Config {
        cni::Config {
            bin_dirs: self.bin_dirs.clone(),
            conf_dir: self.conf_dir.clone(),
            state_dir: self.state_dir.clone(),
            plugin_timeout: self.plugin_timeout,
            device_info_dir: self.device_info_dir.clone(),
            // multus's cache directory: read (and cleaned) for the
            // containers multus attached; plexusd keeps its own records in
            // stateDir.
            cni_dir: self.cni_dir.clone(),
            cleanup: cni::CleanupPolicy {
                errors_reported: self.del_errors_reported,
                retry_interval: self.cleanup_retry_interval,
                give_up_after: u32::try_from(self.cleanup_give_up_after).unwrap_or(u32::MAX),
            },
            plugin_spawner: self.plugin_spawner.clone(),
        }
    }

    /// The file's networks; a call's network configuration may set the
    /// network keys the file (`obj`) leaves unset (multus's overlay).
    fn selection(&self, obj: &Map<String, Value>) -> selection::overlay::Overlay {
        let set_here = |key: &str| match obj.get(key) {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        let base = selection::Config {
            cluster_network: self.cluster_network.clone().unwrap_or_default(),
            delegates: self.delegates.clone(),
            default_networks: self.default_networks.clone(),
            multus_namespace: self.multus_namespace.clone(),
            system_namespaces: self.system_namespaces.clone(),
            namespace_isolation: self.namespace_isolation,
            global_namespaces: selection::nad::parse_global_namespaces(&self.global_namespaces),
            auxiliary_chain: self.auxiliary_chain.clone(),
            conf_dir: None,
        };
        selection::overlay::Overlay::new(base, set_here)
    }

    fn readiness_file(&self) -> Option<readiness_file::Config> {
        self.readiness_path
            .clone()
            .map(|path| readiness_file::Config {
                path,
                timeout: self.readiness_timeout,
            })
    }

    fn kubernetes(&self) -> k8s::Config {
        k8s::Config {
            kubeconfig: self.kubeconfig.clone(),
            node_name: self.node_name.clone().unwrap_or_else(k8s::host_node_name),
            sync_timeout: self.kubernetes_sync_timeout,
            request_timeout: self.kubernetes_request_timeout,
            devices: k8s::devices::DeviceSource {
                socket: self.pod_resources_socket.clone(),
                checkpoint: self.device_checkpoint.clone(),
                timeout: self.kubernetes_request_timeout,
            },
            device_info_dir: self.device_info_dir.clone(),
            pod_events: self.pod_events,
        }
    }
}

impl Raw {
    fn reconcile(&self) -> reconcile::Config {
        reconcile::Config {
            socket: match &self.cri_socket {
                None => reconcile::Socket::Detect,
                Some(None) => reconcile::Socket::Off,
                Some(Some(p)) => reconcile::Socket::At(p.clone()),
            },
            enabled: self.reconcile,
            grace: self.reconcile_grace,
            interval: self.reconcile_interval,
        }
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
            check(
                NAMES.socket_dir,
                trust::check_dir(&self.activation.socket_dir),
            );
        }
        // The records live in `attachments/` below it (cni::record).
        check(
            NAMES.state_dir,
            trust::check_dir(&self.cni.state_dir.join("attachments")),
        );
        // Its caches name the configurations DEL runs, and DEL removes and
        // moves files there.
        check(NAMES.cni_dir, trust::check_dir(&self.cni.cni_dir));
        if let Some(file) = &self.logging.file {
            check(NAMES.log_file, trust::check_file(file));
        }
        if let Some(file) = &self.kubernetes.kubeconfig {
            check(NAMES.kubeconfig, trust::check_trusted_input(file));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error { problems })
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
