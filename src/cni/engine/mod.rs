//! The CNI engine: runs network plugin chains exactly as a libcni-based
//! runtime would, and keeps crash-safe attachment records.
//!
//! - ADD runs each network's plugins in order, chaining `prevResult`; DEL
//!   runs them in reverse with the recorded result; CHECK (0.4.0+) and
//!   STATUS / GC (1.1.0+) follow libcni's version gates.
//! - Each plugin runs at the newest version both it (per its cached VERSION
//!   answer) and the network support, so a 1.1.0 list runs plugins that
//!   stop at 1.0.0; results are converted between versions as they flow.
//! - Before any plugin runs, the attachment is recorded in the state
//!   directory; the record is updated as each network succeeds, and DEL
//!   works from the record alone. A failed ADD rolls back what it added.
//!   A damaged record is moved aside, never fatal: DEL then falls back to
//!   the configured networks.
//! - A network hot-plugged through `/delegate` is an attachment of its own
//!   in the record, naming the runtime's attachment it joined; the DEL of
//!   that attachment, and GC, take it along (`hotplug.rs`).
//! - A container multus attached, which has no record, is DELed, CHECKed
//!   and GCed from multus's caches in its `cniDir` ([`multus_cache`], `multus.rs`),
//!   and shown from them.
//! - Calls for one container are serialized, within this daemon and with
//!   any other plexusd on the same stateDir (a lock file per container).
//!   GC deletes stale attachments one container at a time; only its last
//!   phase, the plugins' own GC, excludes every other call.
//! - Every plugin's process group is noted in the state directory while it
//!   runs; before a container's plugins run, groups that an earlier
//!   (crashed) daemon left running for it are killed.
//!
//! - No plugin ever runs in the host's network namespace (plexusd's or
//!   PID 1's): ADD, CHECK and DEL check `CNI_NETNS` before anything runs,
//!   and GC checks each recorded namespace (see [`netns`]).
//!
//! - The engine runs plugins and keeps records through the traits of
//!   [`backends`](crate::cni::backends) ([`exec::Runner`] and [`state::Store`](crate::cni::state::Store) in the daemon), so
//!   its logic is unit-tested with scripted plugins and records in memory.
//!
//! This module knows nothing about HTTP, the shim or Kubernetes.

mod add;
mod chain;
mod check;
mod cleanup;
#[cfg(test)]
mod crash_tests;
mod del;
mod error;
mod fault;
mod gc;
mod hotplug;
mod lock;
mod multus;
mod plan;
mod reclaim;
mod recover;
#[cfg(test)]
mod tests;
mod tracked;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::RwLock;

use crate::api::code;
use crate::api::Command;
use crate::cni::backends::{PluginRunner, Records};
use crate::cni::exec::{Group, Runner};
use crate::cni::multus_cache::{self, Caches};
use crate::cni::state::{Locks, Markers, State, Store};
use crate::cni::{confdir, exec, netns, show};
use crate::metrics::Metrics;
use crate::netconf::{self, NetworkList};

pub use error::{Error, ErrorKind};
pub use gc::Live;
use lock::Loaded;
pub use reclaim::Reclaimed;

/// Plugin search path when `binDir` is not set: containerd's and CRI-O's
/// default, then Debian's.
pub const DEFAULT_BIN_DIRS: &[&str] = &["/opt/cni/bin", "/usr/lib/cni"];

/// Where networks named by `clusterNetwork` are looked up (multus's default).
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/multus/net.d";

/// Where attachment records live.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/plexus";

/// How long one plugin may run.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Kills a plugin group an earlier daemon left ([`exec::kill_stale_group`];
/// unit tests put a fake in its place).
type KillGroup = fn(Group, Duration, Duration) -> std::io::Result<bool>;

/// The engine's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub bin_dirs: Vec<PathBuf>,
    pub conf_dir: PathBuf,
    pub state_dir: PathBuf,
    pub plugin_timeout: Duration,
    /// The device-info directory: a network's `CNIDeviceInfoFile` that
    /// lies directly in its `cni/` is removed after the network's DEL.
    pub device_info_dir: PathBuf,
    /// multus's `cniDir`: the caches of containers multus attached.
    pub cni_dir: PathBuf,
    /// What happens to an attachment whose DEL fails.
    pub cleanup: CleanupPolicy,
    /// The plugin spawner's socket (`pluginSpawner`): plugins are started
    /// there, outside plexusd's sandbox; `None` starts them here.
    pub plugin_spawner: Option<PathBuf>,
}

/// What happens to an attachment whose DEL fails (docs/records.md,
/// "Pending cleanup").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupPolicy {
    /// How many of the runtime's DELs of an attachment are answered with
    /// their error; a later one that fails too is answered with success,
    /// and plexusd retries alone (`delErrorsReported`).
    pub errors_reported: u32,
    /// The wait before plexusd's own first retry, doubled after each
    /// failure up to 64 times it (`cleanupRetryInterval`).
    pub retry_interval: Duration,
    /// Failures in a row with the same error, while the container's
    /// network namespace is gone, after which plexusd gives up
    /// (`cleanupGiveUpAfter`).
    pub give_up_after: u32,
}

impl Default for CleanupPolicy {
    fn default() -> Self {
        Self {
            errors_reported: 2,
            retry_interval: Duration::from_secs(10),
            give_up_after: 5,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bin_dirs: DEFAULT_BIN_DIRS.iter().map(PathBuf::from).collect(),
            conf_dir: PathBuf::from(DEFAULT_CONF_DIR),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            plugin_timeout: DEFAULT_PLUGIN_TIMEOUT,
            device_info_dir: PathBuf::from(crate::device_info::DEFAULT_DIR),
            cni_dir: PathBuf::from(multus_cache::DEFAULT_CNI_DIR),
            cleanup: CleanupPolicy::default(),
            plugin_spawner: None,
        }
    }
}

/// One network to attach in an ADD.
#[derive(Debug, Clone)]
pub struct Planned {
    pub list: NetworkList,
    pub ifname: String,
    /// Whether the runtime gets this network's result.
    pub primary: bool,
    /// This network's own capability arguments (a selection element's
    /// ips, mac, portMappings...), in place of the call's; `None`: the
    /// call's `runtimeConfig`.
    pub capability_args: Option<Map<String, Value>>,
    /// This network's own `CNI_ARGS` (what multus gives a pod's networks),
    /// in place of the call's; `None`: the call's.
    pub cni_args: Option<String>,
}

impl Planned {
    /// A network with the call's capability arguments.
    pub fn new(list: NetworkList, ifname: impl Into<String>, primary: bool) -> Self {
        Self {
            list,
            ifname: ifname.into(),
            primary,
            capability_args: None,
            cni_args: None,
        }
    }
}

/// One network an ADD attached, in the order they ran.
#[derive(Debug, Clone, PartialEq)]
pub struct AddedNetwork {
    /// The network's (CNI) name.
    pub name: String,
    pub ifname: String,
    pub primary: bool,
    /// Its final result, in the version its plugins ran at.
    pub result: Value,
}

impl AddedNetwork {
    /// The network whose result the runtime receives: the primary one,
    /// else the first that ran. None at all is the engine's own fault.
    pub fn primary(added: &[AddedNetwork]) -> Result<&AddedNetwork, Error> {
        added
            .iter()
            .find(|a| a.primary)
            .or_else(|| added.first())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Internal,
                    code::INTERNAL,
                    "ADD produced no result",
                )
            })
    }
}

/// The engine: shared by every request.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    runner: Arc<dyn PluginRunner>,
    store: Arc<dyn Records>,
    locks: Arc<Locks>,
    markers: Arc<Markers>,
    kill_group: KillGroup,
    /// multus's caches (see [`multus_cache`]).
    multus: Arc<Caches>,
    /// Network configurations read earlier, re-read when their files change.
    confs: Arc<confdir::Cache>,
    containers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Every operation on a container takes it shared; only the plugins'
    /// GC phase takes it exclusively (see [`Engine::gc`]).
    gc_lock: RwLock<()>,
    /// Woken each time an operation lets go of its share of `gc_lock`.
    gc_released: tokio::sync::Notify,
    /// Containers with a pending cleanup, each with when its next retry
    /// is due (see [`Engine::retry_cleanups`]).
    cleanups: Mutex<BTreeMap<String, tracked::Tracked>>,
    metrics: Option<Arc<Metrics>>,
    /// Steps a unit test made fail (see [`fault`]).
    #[cfg(test)]
    faults: fault::Armed,
}

/// [`netns::check`] for `command` as an engine error (code 4), logged.
/// Blocking.
fn check_netns_now(command: Command, path: &str) -> Result<(), Error> {
    netns::check(path, command == Command::Del)
        .map(|_| ())
        .map_err(|e| {
            tracing::warn!(command = %command, netns = path, cause = %e, "refused CNI_NETNS");
            Error::new(
                ErrorKind::Invalid,
                code::INVALID_ENVIRONMENT,
                format!("{command}: {e}"),
            )
        })
}

/// Runs blocking file work off the async runtime: in place when the call
/// runs on a thread of its own ([`crate::op_thread`]), else on the blocking
/// pool.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    crate::op_thread::off_runtime(f).await.map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            code::INTERNAL,
            format!("a blocking task failed: {e}"),
        )
    })
}

impl Engine {
    /// Creates the engine and the state directory, then cleans up after
    /// crashed predecessors (see `Engine::recover`). Blocking; the only
    /// thread it may start is the one that empties the record spares a
    /// dead predecessor left (see `Spares::emptied`), after the listening
    /// sockets' variables were taken from the environment.
    pub fn new(config: Config, metrics: Option<Arc<Metrics>>) -> Result<Self, Error> {
        Self::build(config, metrics, exec::kill_stale_group)
    }

    fn build(
        config: Config,
        metrics: Option<Arc<Metrics>>,
        kill_group: KillGroup,
    ) -> Result<Self, Error> {
        let store = Store::open(&config.state_dir).map_err(Error::state)?;
        let markers = Arc::new(Markers::new());
        let runner = Runner::new(
            config.bin_dirs.clone(),
            config.plugin_timeout,
            metrics.clone(),
        )
        .with_spawner(config.plugin_spawner.clone())
        .with_journal(markers.clone());
        let mut engine = Self::assemble(
            config,
            Arc::new(runner),
            Arc::new(store),
            markers,
            kill_group,
        )?;
        engine.metrics = metrics;
        Ok(engine)
    }

    /// An engine with the plugin runner and record store given (tests use
    /// scripted plugins and an in-memory store; see [`backends`](crate::cni::backends)). The
    /// container locks are still files under `config.state_dir`, created
    /// here. `runner` is not given the engine's plugin journal, so the
    /// groups of the plugins it runs are not noted for crash recovery:
    /// the daemon uses [`Engine::new`]. Blocking, like [`Engine::new`].
    pub fn with_backends(
        config: Config,
        runner: Arc<dyn PluginRunner>,
        store: Arc<dyn Records>,
    ) -> Result<Self, Error> {
        Self::assemble(
            config,
            runner,
            store,
            Arc::new(Markers::new()),
            exec::kill_stale_group,
        )
    }

    fn assemble(
        config: Config,
        runner: Arc<dyn PluginRunner>,
        store: Arc<dyn Records>,
        markers: Arc<Markers>,
        kill_group: KillGroup,
    ) -> Result<Self, Error> {
        let locks = Locks::open(&config.state_dir).map_err(Error::state)?;
        let engine = Self {
            runner,
            store,
            locks: Arc::new(locks),
            markers,
            kill_group,
            multus: Arc::new(Caches::new(&config.cni_dir)),
            confs: Arc::new(confdir::Cache::new()),
            config,
            containers: Mutex::new(HashMap::new()),
            gc_lock: RwLock::new(()),
            gc_released: tokio::sync::Notify::new(),
            cleanups: Mutex::new(BTreeMap::new()),
            metrics: None,
            #[cfg(test)]
            faults: fault::Armed::default(),
        };
        engine.recover();
        Ok(engine)
    }

    /// Refuses a `CNI_NETNS` that is the host's network namespace, or, but
    /// for DEL, not a network namespace at all (see [`netns::check`]). An
    /// empty one (DEL only) names no namespace and passes.
    async fn check_netns(&self, command: Command, path: &str) -> Result<(), Error> {
        self.fault(fault::Step::Netns)?;
        if path.is_empty() {
            return Ok(());
        }
        let owned = path.to_string();
        blocking(move || check_netns_now(command, &owned)).await?
    }

    /// Loads a network by name (from `confDir`) or path.
    pub async fn load(&self, network: &str) -> Result<NetworkList, Error> {
        self.load_in(&self.config.conf_dir, network).await
    }

    /// Loads a network by name from `conf_dir`, or by path. The files are
    /// read again only when they changed since the last load of the same
    /// network (see [`confdir::Cache`]).
    pub async fn load_in(&self, conf_dir: &Path, network: &str) -> Result<NetworkList, Error> {
        let confs = self.confs.clone();
        let dir = conf_dir.to_path_buf();
        let network = network.to_string();
        blocking(move || confs.load(&dir, &network))
            .await?
            .map_err(Error::config)
    }

    /// multus's auxiliary chain `name` next to `cluster_network` (see
    /// [`confdir::aux_chain`]); `None` when it has no plugins.
    pub async fn aux_chain(
        &self,
        cluster_network: &str,
        name: &str,
        cni_version: &str,
    ) -> Result<Option<NetworkList>, Error> {
        let (c, n, v) = (
            cluster_network.to_string(),
            name.to_string(),
            cni_version.to_string(),
        );
        blocking(move || confdir::aux_chain(&c, &n, &v))
            .await?
            .map_err(Error::config)
    }

    /// What is known of `container_id` (see [`show::lookup`]): its
    /// record, else what multus cached for it (marked as such); `None`
    /// when neither knows it, or the id is not a valid container id. A
    /// damaged record or cache is reported as such. Reads only, without a
    /// lock, on the blocking pool.
    pub async fn attachments(&self, container_id: &str) -> Result<Option<Value>, Error> {
        if !netconf::is_valid_container_id(container_id) {
            return Ok(None);
        }
        let store = self.store.clone();
        let caches = self.multus.clone();
        let cid = container_id.to_string();
        blocking(move || show::lookup(store.as_ref(), &caches, &cid, None))
            .await?
            .map(|shown| shown.map(|s| s.summary))
            .map_err(Error::state)
    }
}
