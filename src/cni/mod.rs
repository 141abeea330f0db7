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
//!   and GCed from multus's caches in its `cniDir` ([`multus_cache`]).
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
//!   [`parts`] ([`exec::Runner`] and [`state::Store`] in the daemon), so
//!   its logic is unit-tested with scripted plugins and records in memory.
//!
//! This module knows nothing about HTTP, the shim or Kubernetes.

pub mod confdir;
#[cfg(test)]
mod engine_tests;
pub mod exec;
mod hotplug;
pub mod multus_cache;
pub mod netns;
pub mod parts;
pub mod show;
pub mod state;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{OwnedMutexGuard, RwLock, RwLockReadGuard};

use self::exec::{CallEnv, Gate, Group, Plugin, Runner};
use self::multus_cache::{Caches, Multus};
use self::parts::{PluginRunner, Records};
use self::state::{
    Attachment, Delegate, Durability, Held, Locks, MarkerState, Markers, Record, Released, State,
    Store,
};
use crate::api::code;
use crate::api::Command;
use crate::metrics::Metrics;
use crate::netconf::{self, at_least, negotiate, Invocation, NetworkList};
use crate::result;

/// Plugin search path when `binDir` is not set: containerd's and CRI-O's
/// default, then Debian's.
pub const DEFAULT_BIN_DIRS: &[&str] = &["/opt/cni/bin", "/usr/lib/cni"];
/// Where networks named by `clusterNetwork` are looked up (multus's default).
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/multus/net.d";
/// Where attachment records live.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/plexus";
/// How long one plugin may run.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a plugin group left by an earlier daemon may take to die after
/// SIGKILL before the call gives up ("try again later").
const STALE_GROUP_WAIT: Duration = Duration::from_secs(5);

/// Kills a plugin group an earlier daemon left ([`exec::kill_stale_group`];
/// unit tests put a fake in its place).
type KillGroup = fn(Group, Duration) -> std::io::Result<bool>;

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
        }
    }
}

/// What kind of failure an [`Error`] is, for the caller's status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The call or a network configuration is invalid: nothing ran.
    Invalid,
    /// A plugin failed, or the operation could not complete.
    Failed,
    /// The daemon's own state could not be read or written.
    Internal,
}

/// A failed engine operation, as a CNI error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl Error {
    pub fn new(kind: ErrorKind, code: u32, msg: impl Into<String>) -> Self {
        Self {
            kind,
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    fn details(mut self, d: impl Into<String>) -> Self {
        self.details = d.into();
        self
    }

    fn config(e: netconf::ConfigError) -> Self {
        Self::new(
            ErrorKind::Invalid,
            code::INVALID_NETWORK_CONFIG,
            e.to_string(),
        )
    }

    fn record(e: state::Error) -> Self {
        Self::new(ErrorKind::Internal, code::IO_FAILURE, e.to_string())
    }

    fn multus(e: multus_cache::Error) -> Self {
        Self::new(ErrorKind::Internal, code::IO_FAILURE, e.to_string())
    }

    fn plugin(command: Command, network: &str, e: exec::Error) -> Self {
        Self::new(
            ErrorKind::Failed,
            e.code(),
            format!("{command} network {network:?}: {e}"),
        )
        .details(e.details())
    }

    /// Several errors as one: the first one's code, every message.
    /// `Ok` when `errors` is empty, else all of them as one [`Error::join`].
    fn all_ok(
        command: Command,
        what: impl FnOnce() -> String,
        errors: Vec<Error>,
    ) -> Result<(), Self> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Self::join(command, &what(), errors))
        }
    }

    /// [`Error::all_ok`] for the DEL of the attachment `inv` names.
    fn dels_ok(inv: &Invocation, errors: Vec<Error>) -> Result<(), Self> {
        Self::all_ok(
            Command::Del,
            || format!("container {:?} ifname {:?}", inv.container_id, inv.ifname),
            errors,
        )
    }

    fn join(command: Command, what: &str, errors: Vec<Error>) -> Self {
        let first = errors.first().map(|e| e.code).unwrap_or(code::INTERNAL);
        let n = errors.len();
        let all: Vec<String> = errors
            .iter()
            .map(|e| {
                if e.details.is_empty() {
                    e.msg.clone()
                } else {
                    format!("{} ({})", e.msg, e.details)
                }
            })
            .collect();
        Self::new(
            ErrorKind::Failed,
            first,
            format!(
                "{command} of {what} failed with {n} error(s): {}",
                all.join("; ")
            ),
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

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

/// A network's plugins, located, each with the version it runs at.
struct Prepared {
    plugins: Vec<(Plugin, String)>,
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
}

/// Everything one operation on a container holds. Taken in the order
/// gc, gc_file, container, file (the GC phase takes gc then gc_file and no
/// container), so two operations, or two daemons, never wait on each other
/// in a cycle; released in the reverse order by [`Engine::unlock`].
struct OpLock<'a> {
    /// `locks/<id>.lock`, flock'ed: excludes other daemons on this stateDir.
    file: Held,
    /// Cheap ordering of this daemon's own calls in front of the flock.
    container: ContainerLock<'a>,
    /// `locks/.gc.lock`, shared: another daemon's plugin GC waits for us.
    gc_file: Held,
    gc: RwLockReadGuard<'a, ()>,
}

/// An ADD whose networks were all added, before the record's last write.
struct AddPending {
    record: Record,
    /// The attachment the ADD made (one delegate per network).
    slot: usize,
}

impl AddPending {
    /// Every network's result, in order.
    fn added(&self) -> Vec<AddedNetwork> {
        self.record.attachments[self.slot]
            .delegates
            .iter()
            .filter_map(|d| {
                Some(AddedNetwork {
                    name: d.name.clone(),
                    ifname: d.ifname.clone(),
                    primary: d.primary,
                    result: d.result.clone()?,
                })
            })
            .collect()
    }
}

/// A container's record as an operation sees it.
struct Loaded {
    record: Option<Record>,
    /// The record was damaged and has just been moved aside.
    set_aside: bool,
    /// Plugins located in the same trip to the blocking pool (see
    /// [`Engine::lock_op_with`]); the others are looked up when needed.
    found: Vec<Plugin>,
    /// For a DEL of a container without a record, what else decides what
    /// it does, read in the same trip (see [`Engine::lock_op_with`]).
    unrecorded: Option<Unrecorded>,
}

/// A container without a record of its own: multus's delegate cache for
/// it, and whether a damaged record of it was ever set aside.
struct Unrecorded {
    multus: Multus,
    was_set_aside: bool,
}

/// Holds one container's lock; forgets the lock when nobody else waits.
struct ContainerLock<'a> {
    engine: &'a Engine,
    id: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for ContainerLock<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self
            .engine
            .containers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if map.get(&self.id).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&self.id);
        }
    }
}

impl Engine {
    /// Creates the engine and the state directory, then cleans up after
    /// crashed predecessors (see `Engine::recover`). Blocking, and it
    /// starts no thread (it runs before the listener is taken).
    pub fn new(config: Config, metrics: Option<Arc<Metrics>>) -> Result<Self, Error> {
        Self::build(config, metrics, exec::kill_stale_group)
    }

    fn build(
        config: Config,
        metrics: Option<Arc<Metrics>>,
        kill_group: KillGroup,
    ) -> Result<Self, Error> {
        let store = Store::open(&config.state_dir).map_err(Error::record)?;
        let markers = Arc::new(Markers::new());
        let runner = Runner::new(config.bin_dirs.clone(), config.plugin_timeout, metrics)
            .with_journal(markers.clone());
        Self::assemble(
            config,
            Arc::new(runner),
            Arc::new(store),
            markers,
            kill_group,
        )
    }

    /// An engine with the plugin runner and record store given (tests use
    /// scripted plugins and an in-memory store; see [`parts`]). The
    /// container locks are still files under `config.state_dir`, created
    /// here. `runner` is not given the engine's plugin journal, so the
    /// groups of the plugins it runs are not noted for crash recovery:
    /// the daemon uses [`Engine::new`]. Blocking, like [`Engine::new`].
    pub fn with_parts(
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
        let locks = Locks::open(&config.state_dir).map_err(Error::record)?;
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
        };
        engine.recover();
        Ok(engine)
    }

    /// At start-up, for every container no one holds the lock of (a live
    /// predecessor's running operations hold theirs and are left alone):
    /// kills the plugin groups a crashed daemon left running, removes the
    /// temporary files of writes it never finished, and removes lock files
    /// of containers without a record. Blocking.
    fn recover(&self) {
        // Every container with a lock file (its marker, if any, is in it)
        // or a leftover temporary file.
        let mut work: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for id in self.locks.ids() {
            work.entry(id).or_default();
        }
        for (id, path) in self.store.temp_files() {
            work.entry(id).or_default().push(path);
        }
        for (id, temps) in work {
            let held = match self.locks.try_lock(&id) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    tracing::info!(container_id = %id, "another plexusd is working on this container; its state is left alone");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(container_id = %id, cause = %e, "cannot lock the container at start-up");
                    continue;
                }
            };
            if let Err((pgid, e)) = clear_marker(&self.markers, self.kill_group, &id, &held) {
                tracing::error!(container_id = %id, pgid, cause = %e, "a plugin process group left by an earlier plexusd survived SIGKILL; calls for this container fail until it is gone");
            }
            for t in temps {
                if let Err(e) = std::fs::remove_file(&t) {
                    tracing::warn!(path = %t.display(), cause = %e, "cannot remove a leftover temporary file");
                }
            }
            if !self.store.exists(&id) {
                if let Err(e) = held.unlink() {
                    tracing::warn!(container_id = %id, cause = %e, "cannot remove a lock file");
                }
            }
        }
    }

    /// Refuses a `CNI_NETNS` that is the host's network namespace, or, but
    /// for DEL, not a network namespace at all (see [`netns::check`]). An
    /// empty one (DEL only) names no namespace and passes.
    async fn check_netns(&self, command: Command, path: &str) -> Result<(), Error> {
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

    /// Takes everything an operation on container `id` holds (see
    /// [`OpLock`]), then kills the plugin groups an earlier daemon left
    /// running for it, so none of them can act after this operation's
    /// plugins. Fails ("try again later") if one of them survives.
    ///
    /// One trip to the blocking pool does it all, each hand-off costing
    /// CPU on every call: the check of `netns` (for `command`, before any
    /// lock is taken, so a refused call leaves no lock file), the lock
    /// files, the marker scan and the record.
    async fn lock_op(
        &self,
        id: &str,
        netns: Option<(Command, &str)>,
    ) -> Result<(OpLock<'_>, Loaded), Error> {
        self.lock_op_with(id, netns, Vec::new(), false).await
    }

    /// [`Engine::lock_op`] that also, in the same trip and once the locks
    /// are held, locates `plugins` (by type; a plugin not found there is
    /// looked up again, and its error reported, by [`Engine::prepare`])
    /// and, for a DEL (`for_del`), the plugins of every recorded network,
    /// or, when the container has no record, reads multus's delegate
    /// cache for it and whether a record of it was set aside (a DEL needs
    /// both then; a damaged cache is left to [`Engine::load_multus`],
    /// which moves it aside).
    async fn lock_op_with(
        &self,
        id: &str,
        netns: Option<(Command, &str)>,
        plugins: Vec<String>,
        for_del: bool,
    ) -> Result<(OpLock<'_>, Loaded), Error> {
        let gc = self.gc_lock.read().await;
        let container = self.lock_container(id).await;
        let locks = self.locks.clone();
        let markers = self.markers.clone();
        let store = self.store.clone();
        let runner = self.runner.clone();
        let multus = self.multus.clone();
        let cid = id.to_string();
        let netns = netns
            .filter(|(_, path)| !path.is_empty())
            .map(|(command, path)| (command, path.to_string()));
        let (gc_file, file, stale, loaded, found, probed) =
            blocking(move || -> Result<_, Error> {
                if let Some((command, path)) = &netns {
                    check_netns_now(*command, path)?;
                }
                let gc_file = locks.gc_shared().map_err(Error::record)?;
                let file = locks.lock(&cid).map_err(Error::record)?;
                let stale = markers.of(&cid, &file).map_err(Error::record)?;
                let loaded = load_now(store.as_ref(), &cid).map_err(Error::record)?;
                // A DEL runs the plugins of what is recorded.
                let recorded = match (&loaded, for_del) {
                    ((Some(r), _), true) => recorded_types(r),
                    _ => Vec::new(),
                };
                let found: Vec<Plugin> = plugins
                    .iter()
                    .chain(&recorded)
                    .filter_map(|p| runner.find(p).ok())
                    .collect();
                let probed = match (&loaded, for_del) {
                    ((None, None), true) => {
                        let multus = match multus.load(&cid) {
                            Ok(Some(d)) => Some(Multus::Delegates(d)),
                            Ok(None) => Some(Multus::Nothing),
                            Err(_) => None,
                        };
                        multus.map(|multus| Unrecorded {
                            multus,
                            was_set_aside: store.was_set_aside(&cid),
                        })
                    }
                    _ => None,
                };
                Ok((gc_file, file, stale, loaded, found, probed))
            })
            .await??;
        let mut loaded = loaded_logged(id, loaded);
        loaded.found = found;
        loaded.unrecorded = probed;
        let file = match stale {
            None => file,
            Some(_) => {
                let markers = self.markers.clone();
                let kill = self.kill_group;
                let cid = id.to_string();
                let (file, cleared) = blocking(move || {
                    let r = clear_marker(&markers, kill, &cid, &file);
                    (file, r)
                })
                .await?;
                cleared.map_err(|(pgid, e)| {
                    Error::new(
                        ErrorKind::Failed,
                        code::TRY_AGAIN_LATER,
                        format!(
                            "container {id:?}: plugin process group {pgid}, left running by an earlier plexusd, survived SIGKILL for {}: {e}; try again later",
                            crate::duration::format(STALE_GROUP_WAIT)
                        ),
                    )
                })?;
                file
            }
        };
        // From here on the runner notes each plugin's group in it.
        self.markers.hold(id, &file);
        let lock = OpLock {
            file,
            container,
            gc_file,
            gc,
        };
        Ok((lock, loaded))
    }

    /// Releases an operation's locks. The container's lock file goes too
    /// when its record is gone: nobody can make a new record without the
    /// lock, and a waiter on the unlinked file starts over (state::Locks).
    async fn unlock(&self, id: &str, lock: OpLock<'_>) {
        // Nothing to write: only a trip that could not run fails.
        if let Err((e, _)) = self.unlock_after(id, lock, || Ok(())).await {
            tracing::error!(container_id = %id, cause = %e, "releasing the container's lock failed");
        }
    }

    /// The operation's last write of `record` ([`Durability::Atomic`])
    /// and its unlock, in one trip ([`Engine::unlock_after`]).
    async fn save_and_unlock<'a>(
        &'a self,
        id: &str,
        lock: OpLock<'a>,
        record: Record,
    ) -> Result<(), (Error, Option<OpLock<'a>>)> {
        let store = self.store.clone();
        self.unlock_after(id, lock, move || {
            store
                .save(&record, Durability::Atomic)
                .map_err(Error::record)
        })
        .await
    }

    /// Runs `work` on the blocking pool and, when it succeeds, releases
    /// the operation's locks in the same trip (as [`Engine::unlock`]):
    /// the last write of an operation and its unlock cost one hand-off.
    /// When `work` fails, the locks are handed back, still held, with its
    /// error; `None` in their place means they are released already (the
    /// trip could not run: the runtime is shutting down).
    async fn unlock_after<'a, T: Send + 'static>(
        &'a self,
        id: &str,
        lock: OpLock<'a>,
        work: impl FnOnce() -> Result<T, Error> + Send + 'static,
    ) -> Result<T, (Error, Option<OpLock<'a>>)> {
        let OpLock {
            file,
            container,
            gc_file,
            gc,
        } = lock;
        let marker = self.markers.release(id);
        let store = self.store.clone();
        let cid = id.to_string();
        let done = blocking(move || {
            let out =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Failed,
                        code::INTERNAL,
                        format!("container {cid:?}: the operation's last write panicked"),
                    ))
                });
            match out {
                Ok(v) => {
                    release_files(&store, &cid, marker, file, gc_file);
                    Ok(v)
                }
                Err(e) => Err((e, file, gc_file)),
            }
        })
        .await;
        match done {
            Ok(Ok(v)) => Ok(v),
            Ok(Err((e, file, gc_file))) => {
                self.markers.hold_marked(id, &file, marker);
                Err((
                    e,
                    Some(OpLock {
                        file,
                        container,
                        gc_file,
                        gc,
                    }),
                ))
            }
            Err(e) => Err((e, None)),
        }
    }

    async fn lock_container(&self, id: &str) -> ContainerLock<'_> {
        let mutex = {
            let mut map = self.containers.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(id.to_string()).or_default().clone()
        };
        let guard = mutex.lock_owned().await;
        ContainerLock {
            engine: self,
            id: id.to_string(),
            guard: Some(guard),
        }
    }

    async fn find(&self, name: &str) -> Result<Plugin, exec::Error> {
        let runner = self.runner.clone();
        let name = name.to_string();
        match tokio::task::spawn_blocking(move || runner.find(&name)).await {
            Ok(r) => r,
            Err(e) => Err(exec::Error::Io {
                plugin: String::new(),
                path: PathBuf::new(),
                what: "looking up the plugin",
                source: std::io::Error::other(e.to_string()),
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
    async fn prepare(&self, list: &NetworkList, command: Command) -> Result<Prepared, Error> {
        self.prepare_with(list, command, &[]).await
    }

    /// [`Engine::prepare`] taking the plugins in `found` as located (in
    /// this call, by [`Engine::lock_op_with`]).
    async fn prepare_with(
        &self,
        list: &NetworkList,
        command: Command,
        found: &[Plugin],
    ) -> Result<Prepared, Error> {
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
        Ok(Prepared { plugins })
    }

    /// The environment of one network's plugins: the call's, with the
    /// network's own `CNI_ARGS` when it has them.
    fn call_env(
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
    async fn add_chain(
        &self,
        list: &NetworkList,
        prepared: &Prepared,
        env: &CallEnv,
        cap_args: &Map<String, Value>,
        mut gate: Option<Gate>,
    ) -> Result<Value, (Error, Option<Value>)> {
        let mut prev: Option<Value> = None;
        for (i, (plugin, version)) in prepared.plugins.iter().enumerate() {
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
    async fn del_chain(
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

    /// DEL of one recorded network of attachment `att`, with the network
    /// config it was added with and `prev` as prevResult; the errors.
    async fn del_recorded(
        &self,
        inv: &Invocation,
        netns: &str,
        att: &Attachment,
        d: &Delegate,
        prev: Option<&Value>,
        found: &[Plugin],
    ) -> Vec<Error> {
        let list = match recorded_list(d) {
            Ok(l) => l,
            Err(e) => return vec![Error::config(e)],
        };
        let env = self.call_env(Command::Del, inv, &d.ifname, netns, d.cni_args.as_deref());
        let cap_args = d.capability_args_in(att);
        let errors = self.del_chain(&list, &env, cap_args, prev, found).await;
        if errors.is_empty() {
            self.remove_device_info(cap_args).await;
        }
        errors
    }

    /// After a network's DEL: its device-info file (the
    /// `CNIDeviceInfoFile` capability argument), when that names a file
    /// directly in the device-info directory's `cni/`; any other path is
    /// left alone.
    async fn remove_device_info(&self, cap_args: &Map<String, Value>) {
        let Some(file) = cap_args.get("CNIDeviceInfoFile").and_then(Value::as_str) else {
            return;
        };
        let path = PathBuf::from(file);
        if !crate::device_info::is_cni_file(&self.config.device_info_dir, &path) {
            return;
        }
        match tokio::fs::remove_file(&path).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), cause = %e, "cannot remove a device-info file")
            }
        }
    }

    /// The write of `record` with [`Durability::Synced`], as the gate of
    /// the first plugin it protects: the runner does it in the trip that
    /// spawns that plugin, while the plugin starts, and gives the plugin
    /// its configuration only once it is done. [`Synced::done`] tells how
    /// it went.
    fn save_synced_gate(&self, record: &Record) -> (Synced, Gate) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.store.clone();
        let record = record.clone();
        let work = Box::new(move || {
            let r = store
                .save(&record, Durability::Synced)
                .map_err(|e| e.to_string());
            let _ = tx.send(r.clone());
            r
        });
        (Synced(rx), work)
    }

    async fn save_record(&self, record: &Record, durability: Durability) -> Result<(), Error> {
        let store = self.store.clone();
        let record = record.clone();
        blocking(move || store.save(&record, durability))
            .await?
            .map_err(Error::record)
    }

    /// ADD: attaches `planned` networks to the container; returns the
    /// primary network's result.
    pub async fn add(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        planned: Vec<Planned>,
    ) -> Result<Value, Error> {
        let added = self.add_networks(inv, cap_args, planned).await?;
        added
            .iter()
            .find(|a| a.primary)
            .or_else(|| added.first())
            .map(|a| a.result.clone())
            .ok_or_else(|| Error::new(ErrorKind::Failed, code::INTERNAL, "ADD produced no result"))
    }

    /// [`Engine::add`], answering every network's result (for a status
    /// report of all of them), in order.
    pub async fn add_networks(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        planned: Vec<Planned>,
    ) -> Result<Vec<AddedNetwork>, Error> {
        // Before anything runs, so the rollback of a failed ADD, too, only
        // ever runs in a namespace that passed. The plugins are located
        // in the same trip to the blocking pool.
        let mut plugins: Vec<String> = Vec::new();
        for p in &planned {
            for i in 0..p.list.plugins.len() {
                let kind = p.list.plugin_type(i);
                if !plugins.iter().any(|k| k == kind) {
                    plugins.push(kind.to_string());
                }
            }
        }
        let (lock, loaded) = self
            .lock_op_with(
                &inv.container_id,
                Some((Command::Add, &inv.netns)),
                plugins,
                false,
            )
            .await?;
        let pending = match self.add_unsaved(inv, cap_args, planned, loaded, None).await {
            Ok(p) => p,
            Err(e) => {
                self.unlock(&inv.container_id, lock).await;
                return Err(e);
            }
        };
        let saved = self
            .save_and_unlock(&inv.container_id, lock, pending.record.clone())
            .await;
        match saved {
            Ok(()) => Ok(pending.added()),
            Err((e, Some(lock))) => {
                let out = self.roll_back_saved(inv, pending, e).await;
                self.unlock(&inv.container_id, lock).await;
                Err(out)
            }
            // Released already: the record still says the networks are
            // being added, and the runtime's DEL removes them.
            Err((e, None)) => Err(e),
        }
    }

    /// Adds `planned` under the container's lock taken with `loaded`, the
    /// record saved last.
    async fn add_locked(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        planned: Vec<Planned>,
        loaded: Loaded,
        hot_plugged_into: Option<String>,
    ) -> Result<Vec<AddedNetwork>, Error> {
        let pending = self
            .add_unsaved(inv, cap_args, planned, loaded, hot_plugged_into)
            .await?;
        if let Err(e) = self.save_record(&pending.record, Durability::Atomic).await {
            return Err(self.roll_back_saved(inv, pending, e).await);
        }
        Ok(pending.added())
    }

    /// Rolls back every network of an ADD whose last record write failed
    /// with `cause`.
    async fn roll_back_saved(&self, inv: &Invocation, pending: AddPending, cause: Error) -> Error {
        let AddPending { mut record, slot } = pending;
        let last = record.attachments[slot].delegates.len().saturating_sub(1);
        self.roll_back(inv, &mut record, slot, last, None, cause)
            .await
    }

    /// [`Engine::add_locked`] up to the record's last write, which is the
    /// caller's: every network added, its result in the record.
    async fn add_unsaved(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        planned: Vec<Planned>,
        loaded: Loaded,
        hot_plugged_into: Option<String>,
    ) -> Result<AddPending, Error> {
        // Everything that can be checked before running anything is.
        let mut prepared = Vec::with_capacity(planned.len());
        for p in &planned {
            prepared.push(
                self.prepare_with(&p.list, Command::Add, &loaded.found)
                    .await?,
            );
        }
        let mut record = loaded
            .record
            .unwrap_or_else(|| Record::new(&inv.container_id));
        if record.attachment(&inv.ifname).is_some() {
            return Err(Error::new(
                ErrorKind::Invalid,
                code::INVALID_ENVIRONMENT,
                format!(
                    "container {:?} already has an attachment on {:?}; DEL it before adding it again",
                    inv.container_id, inv.ifname
                ),
            ));
        }
        // Only what some plugin declared: nothing else reaches a plugin
        // (libcni's rule, see stdin_for), so nothing else is kept.
        let cap_args = declared_capabilities(planned.iter().map(|p| &p.list), cap_args);
        record.attachments.push(Attachment {
            hot_plugged_into,
            ifname: inv.ifname.clone(),
            netns: inv.netns.clone(),
            cni_args: inv.args.clone(),
            capability_args: cap_args.clone(),
            delegates: planned
                .iter()
                .map(|p| Delegate {
                    name: p.list.name.clone(),
                    ifname: p.ifname.clone(),
                    primary: p.primary,
                    state: State::Pending,
                    config: p.list.to_value(),
                    capability_args: p
                        .capability_args
                        .clone()
                        .map(|own| recorded_capabilities(&p.list, own)),
                    cni_args: p.cni_args.clone(),
                    result: None,
                })
                .collect(),
        });
        let slot = record.attachments.len() - 1;
        // A record read back on every call must stay small; refused before
        // anything ran, so there is nothing to roll back.
        let size = state::encoded_len(&record);
        if size > state::MAX_NEW_RECORD_BYTES {
            return Err(Error::new(
                ErrorKind::Invalid,
                code::INVALID_NETWORK_CONFIG,
                format!(
                    "container {:?}: the attachment record would be {size} bytes, more than the {} allowed; the network configurations or the capability arguments (runtimeConfig) they declare are too large",
                    inv.container_id,
                    state::MAX_NEW_RECORD_BYTES
                ),
            ));
        }

        for (i, (p, prep)) in planned.iter().zip(&prepared).enumerate() {
            record.attachments[slot].delegates[i].state = State::Adding;
            // The record must be on disk before this network's first
            // plugin reads its configuration; its write and syncs run
            // while that plugin starts (see docs/records.md).
            let (synced, gate) = self.save_synced_gate(&record);
            let env = self.call_env(
                Command::Add,
                inv,
                &p.ifname,
                &inv.netns,
                p.cni_args.as_deref(),
            );
            let args = record.attachments[slot].delegates[i]
                .capability_args
                .clone()
                .unwrap_or_else(|| cap_args.clone());
            let added = self.add_chain(&p.list, prep, &env, &args, Some(gate)).await;
            // Nothing writes the record again before its sync is done.
            if let Err(e) = synced.done().await {
                let partial = added.err().and_then(|(_, partial)| partial);
                return Err(self.roll_back(inv, &mut record, slot, i, partial, e).await);
            }
            match added {
                Ok(res) => {
                    let d = &mut record.attachments[slot].delegates[i];
                    d.state = State::Added;
                    d.result = Some(res);
                }
                Err((e, partial)) => {
                    return Err(self.roll_back(inv, &mut record, slot, i, partial, e).await);
                }
            }
        }
        Ok(AddPending { record, slot })
    }

    /// Undoes networks `0..=failed` of attachment `slot` after `cause`;
    /// drops the attachment from the record when that worked, keeps it
    /// (for the runtime's DEL) when it did not. Returns the error to report.
    async fn roll_back(
        &self,
        inv: &Invocation,
        record: &mut Record,
        slot: usize,
        failed: usize,
        partial: Option<Value>,
        cause: Error,
    ) -> Error {
        let att = record.attachments[slot].clone();
        let mut errors = Vec::new();
        for j in (0..=failed).rev() {
            let d = &att.delegates[j];
            if d.state == State::Pending {
                continue;
            }
            let prev = if j == failed && d.state != State::Added {
                partial.as_ref()
            } else {
                d.result.as_ref()
            };
            let errs = self.del_recorded(inv, &inv.netns, &att, d, prev, &[]).await;
            if errs.is_empty() {
                record.attachments[slot].delegates[j].state = State::Pending;
            }
            errors.extend(errs);
        }
        let mut cause = cause;
        if errors.is_empty() {
            record.attachments.remove(slot);
        } else {
            let e = Error::join(Command::Del, "the rollback", errors);
            tracing::warn!(container_id = %inv.container_id, cause = %e, "rollback after a failed ADD left errors; the attachment stays recorded for DEL");
            if !cause.details.is_empty() {
                cause.details.push_str("; ");
            }
            cause.details.push_str(&e.msg);
        }
        if let Err(e) = self.save_record(record, Durability::Atomic).await {
            tracing::error!(container_id = %inv.container_id, cause = %e, "cannot update the attachment record after a rollback");
        }
        cause
    }

    /// What is recorded for `container_id` (see [`show::summary`]);
    /// `None` when nothing is, or the id is not a valid container id.
    /// A damaged record is reported as such. Reads only, without a lock.
    pub async fn attachments(&self, container_id: &str) -> Result<Option<Value>, Error> {
        if !netconf::is_valid_container_id(container_id) {
            return Ok(None);
        }
        let store = self.store.clone();
        let cid = container_id.to_string();
        match blocking(move || store.load(&cid)).await? {
            Ok(record) => Ok(record.as_ref().map(show::summary)),
            Err(e) if e.is_damaged() => Ok(Some(show::damaged_summary(container_id, &e))),
            Err(e) => Err(Error::record(e)),
        }
    }

    /// DEL: removes the attachment named by the call, from its record.
    /// Nothing recorded means nothing to do, unless the container's record
    /// was damaged (now, or earlier and moved aside): then DEL runs the
    /// networks `fallback` supplies (the configured ones, with `cap_args`
    /// and the call's environment), as a runtime without records would.
    /// `fallback` is called only then, so a normal DEL loads no config.
    pub async fn del<F, Fut>(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        fallback: F,
    ) -> Result<(), Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Planned>, Error>>,
    {
        let (lock, loaded) = self
            .lock_op_with(
                &inv.container_id,
                Some((Command::Del, &inv.netns)),
                Vec::new(),
                true,
            )
            .await?;
        let (out, changed) = self.del_or_fall_back(inv, cap_args, fallback, loaded).await;
        let Some(record) = changed else {
            self.unlock(&inv.container_id, lock).await;
            return out;
        };
        // A failed write of what is left of the record is the DEL's error.
        match self.save_and_unlock(&inv.container_id, lock, record).await {
            Ok(()) => out,
            Err((e, lock)) => {
                if let Some(lock) = lock {
                    self.unlock(&inv.container_id, lock).await;
                }
                Err(e)
            }
        }
    }

    async fn del_or_fall_back<F, Fut>(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        fallback: F,
        loaded: Loaded,
    ) -> (Result<(), Error>, Option<Record>)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Planned>, Error>>,
    {
        let mut record = loaded
            .record
            .unwrap_or_else(|| Record::new(&inv.container_id));
        let hot_plugged = record.hot_plugged(&inv.ifname);
        if record.attachment(&inv.ifname).is_none() && hot_plugged.is_empty() {
            // A container multus attached before plexusd took over.
            let (multus, was_set_aside) = match loaded.unrecorded {
                Some(u) => (u.multus, Some(u.was_set_aside)),
                None => match self.load_multus(&inv.container_id).await {
                    Ok(m) => (m, None),
                    Err(e) => return (Err(e), None),
                },
            };
            if let Multus::Delegates(delegates) = &multus {
                tracing::info!(container_id = %inv.container_id, ifname = %inv.ifname, networks = delegates.len(), "no record of its own: DEL runs the networks multus cached for the container");
                let out = self
                    .del_multus(inv, &inv.netns, &inv.ifname, delegates, &cap_args)
                    .await;
                return (out, None);
            }
            let lost = loaded.set_aside
                || matches!(multus, Multus::SetAside)
                || match was_set_aside {
                    Some(known) => known,
                    None => {
                        let store = self.store.clone();
                        let cid = inv.container_id.clone();
                        match blocking(move || store.was_set_aside(&cid)).await {
                            Ok(known) => known,
                            Err(e) => return (Err(e), None),
                        }
                    }
                };
            if !lost {
                return (Ok(()), None);
            }
            let planned = match fallback().await {
                Ok(p) => p,
                Err(e) => return (Err(e), None),
            };
            let names: Vec<&str> = planned.iter().map(|p| p.list.name.as_str()).collect();
            tracing::warn!(container_id = %inv.container_id, ifname = %inv.ifname, networks = ?names, "the container's record was damaged: DEL runs the configured networks");
            // Recorded like an ADD that was cut short, so that whatever
            // fails here stays recorded for the next DEL.
            let cap_args = declared_capabilities(planned.iter().map(|p| &p.list), cap_args);
            record.attachments.push(Attachment {
                hot_plugged_into: None,
                ifname: inv.ifname.clone(),
                netns: inv.netns.clone(),
                cni_args: inv.args.clone(),
                capability_args: cap_args,
                delegates: planned
                    .into_iter()
                    .map(|p| Delegate {
                        name: p.list.name.clone(),
                        ifname: p.ifname,
                        primary: p.primary,
                        state: State::Adding,
                        config: p.list.to_value(),
                        capability_args: None,
                        cni_args: None,
                        result: None,
                    })
                    .collect(),
            });
        }
        // Networks hot-plugged into this attachment go first, newest first,
        // as a DEL undoes an ADD: nothing of them may outlive the pod.
        let mut errors = Vec::new();
        for ifname in hot_plugged.iter().rev() {
            let one = Invocation {
                ifname: ifname.clone(),
                ..inv.clone()
            };
            if let Err(e) = self
                .del_attachment_unsaved(&one, &inv.netns, &mut record, &loaded.found)
                .await
            {
                errors.push(e);
            }
        }
        if let Err(e) = self
            .del_attachment_unsaved(inv, &inv.netns, &mut record, &loaded.found)
            .await
        {
            errors.push(e);
        }
        let out = match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::join(
                Command::Del,
                &format!(
                    "container {:?} ifname {:?} and the networks hot-plugged into it",
                    inv.container_id, inv.ifname
                ),
                errors,
            )),
        };
        (out, Some(record))
    }

    /// DELs attachment `inv.ifname` of `record` (which must hold it) and
    /// saves what is left of the record: the networks whose DEL failed.
    async fn del_attachment(
        &self,
        inv: &Invocation,
        netns: &str,
        record: &mut Record,
    ) -> Result<(), Error> {
        let out = self.del_attachment_unsaved(inv, netns, record, &[]).await;
        self.save_record(record, Durability::Atomic).await?;
        out
    }

    /// [`Engine::del_attachment`] leaving the record's write to the
    /// caller; plugins in `found` are taken as located.
    async fn del_attachment_unsaved(
        &self,
        inv: &Invocation,
        netns: &str,
        record: &mut Record,
        found: &[Plugin],
    ) -> Result<(), Error> {
        let Some(att) = record.attachment(&inv.ifname).cloned() else {
            return Ok(());
        };
        let mut errors = Vec::new();
        let mut left = Vec::new();
        let inv = Invocation {
            args: if inv.args.is_empty() {
                att.cni_args.clone()
            } else {
                inv.args.clone()
            },
            ..inv.clone()
        };
        for d in att.delegates.iter().rev() {
            if d.state == State::Pending {
                continue;
            }
            let errs = self
                .del_recorded(&inv, netns, &att, d, d.result.as_ref(), found)
                .await;
            if !errs.is_empty() {
                left.push(d.clone());
            }
            errors.extend(errs);
        }
        left.reverse();
        if let Some(a) = record.attachment_mut(&inv.ifname) {
            a.delegates = left;
        }
        record.attachments.retain(|a| !a.delegates.is_empty());
        Error::dels_ok(&inv, errors)
    }

    /// CHECK: verifies every recorded network of the attachment with the
    /// recorded result, in order; the first failure is returned.
    pub async fn check(&self, inv: &Invocation) -> Result<(), Error> {
        let (lock, loaded) = self
            .lock_op(&inv.container_id, Some((Command::Check, &inv.netns)))
            .await?;
        let out = self.check_locked(inv, loaded).await;
        self.unlock(&inv.container_id, lock).await;
        out
    }

    async fn check_locked(&self, inv: &Invocation, loaded: Loaded) -> Result<(), Error> {
        let record = loaded.record;
        let Some(att) = record.as_ref().and_then(|r| r.attachment(&inv.ifname)) else {
            if let Multus::Delegates(delegates) = self.load_multus(&inv.container_id).await? {
                return self.check_multus(inv, &delegates).await;
            }
            return Err(Error::new(
                ErrorKind::Failed,
                code::UNKNOWN_CONTAINER,
                format!(
                    "container {:?} has no attachment on {:?}",
                    inv.container_id, inv.ifname
                ),
            ));
        };
        for d in &att.delegates {
            self.check_recorded(inv, att, d).await?;
        }
        Ok(())
    }

    /// CHECK of network `d` of attachment `att` with its recorded config
    /// and result; refused when its ADD did not complete.
    async fn check_recorded(
        &self,
        inv: &Invocation,
        att: &Attachment,
        d: &Delegate,
    ) -> Result<(), Error> {
        if d.state != State::Added {
            return Err(Error::new(
                ErrorKind::Failed,
                code::UNKNOWN_CONTAINER,
                format!("network {:?}: its ADD did not complete", d.name),
            ));
        }
        let list = recorded_list(d).map_err(Error::config)?;
        let env = self.call_env(
            Command::Check,
            inv,
            &d.ifname,
            &inv.netns,
            d.cni_args.as_deref(),
        );
        self.check_network(&list, &env, d.result.as_ref(), d.capability_args_in(att))
            .await
    }

    /// CHECK of one network: every plugin at 0.4.0 or later, with `result`
    /// as prevResult; nothing when the list disables CHECK.
    async fn check_network(
        &self,
        list: &NetworkList,
        env: &CallEnv,
        result: Option<&Value>,
        cap_args: &Map<String, Value>,
    ) -> Result<(), Error> {
        let version = list.version().unwrap_or_default();
        if !at_least(&version, "0.4.0") {
            return Err(Error::new(
                ErrorKind::Invalid,
                code::INCOMPATIBLE_VERSION,
                format!(
                    "network {:?}: configuration version {version:?} does not support the CHECK command",
                    list.name
                ),
            ));
        }
        if list.disable_check {
            return Ok(());
        }
        let prepared = self.prepare(list, Command::Check).await?;
        for (i, (plugin, version)) in prepared.plugins.iter().enumerate() {
            if !at_least(version, "0.4.0") {
                continue;
            }
            let prev = result.and_then(|r| convert_for(r, version));
            let stdin = stdin_for(list, i, version, Command::Check, prev, cap_args);
            self.runner
                .run(plugin, env, stdin)
                .await
                .map_err(|e| Error::plugin(Command::Check, &list.name, e))?;
        }
        Ok(())
    }

    /// STATUS: asks each plugin of `list` that speaks 1.1.0 whether it can
    /// serve ADDs; the first failure is returned. Lists older than 1.1.0
    /// succeed without running anything (libcni).
    pub async fn status(&self, list: &NetworkList) -> Result<(), Error> {
        if !list.version().is_some_and(|v| at_least(&v, "1.1.0")) {
            return Ok(());
        }
        let prepared = self.prepare(list, Command::Status).await?;
        let env = CallEnv {
            command: Command::Status.as_str(),
            ..CallEnv::default()
        };
        for (i, (plugin, version)) in prepared.plugins.iter().enumerate() {
            if !at_least(version, "1.1.0") {
                continue;
            }
            let stdin = stdin_for(list, i, version, Command::Status, None, &Map::new());
            self.runner
                .run(plugin, &env, stdin)
                .await
                .map_err(|e| Error::plugin(Command::Status, &list.name, e))?;
        }
        Ok(())
    }

    /// GC: DELs every recorded attachment whose (container id, ifname) is
    /// not in `valid`, then sends GC to the plugins of `lists` that speak
    /// 1.1.0 with the attachments still recorded. Errors are collected.
    ///
    /// The sweep locks one container at a time, only while its stale
    /// attachments are deleted: calls for other containers go on meanwhile.
    pub async fn gc(
        &self,
        valid: &BTreeSet<(String, String)>,
        lists: &[NetworkList],
    ) -> Result<(), Error> {
        let store = self.store.clone();
        let ids = blocking(move || store.list())
            .await?
            .map_err(Error::record)?;
        let mut errors = Vec::new();
        // Stale attachments whose DEL failed: the plugins' GC may free them.
        let mut failed = BTreeSet::new();
        for id in ids {
            // A look without the lock first: valid containers, most of
            // them, are never locked.
            let store = self.store.clone();
            let cid = id.clone();
            match blocking(move || store.load(&cid)).await? {
                Ok(None) => continue,
                Ok(Some(r)) if r.attachments.iter().all(|a| is_valid(&id, a, valid)) => continue,
                // Stale attachments, a damaged record or an unreadable one:
                // a second look under the lock decides.
                _ => {}
            }
            let (lock, loaded) = match self.lock_op(&id, None).await {
                Ok(l) => l,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            errors.extend(self.gc_container(&id, loaded, valid, &mut failed).await);
            self.unlock(&id, lock).await;
        }
        // The containers multus attached, the same way.
        let mut multus_failed = BTreeSet::new();
        errors.extend(self.gc_multus(valid, &mut multus_failed).await);
        errors.extend(self.gc_plugins(lists, &failed, &multus_failed).await);
        Error::all_ok(Command::Gc, || "stale attachments".into(), errors)
    }

    /// DELs the stale attachments of container `id`, locked by the caller,
    /// which loaded `loaded` under that lock (a damaged record was moved
    /// aside then, and is skipped).
    async fn gc_container(
        &self,
        id: &str,
        loaded: Loaded,
        valid: &BTreeSet<(String, String)>,
        failed: &mut BTreeSet<(String, String)>,
    ) -> Vec<Error> {
        let Some(mut record) = loaded.record else {
            return Vec::new();
        };
        // Hot-plugged networks before the attachments they joined, newest
        // first, as the runtime's DEL would.
        let (mut stale, own): (Vec<Attachment>, Vec<Attachment>) = record
            .attachments
            .iter()
            .filter(|a| !is_valid(id, a, valid))
            .cloned()
            .partition(|a| a.hot_plugged_into.is_some());
        stale.reverse();
        stale.extend(own);
        let mut errors = Vec::new();
        for att in stale {
            let inv = Invocation {
                command: Command::Del,
                container_id: id.to_string(),
                netns: att.netns.clone(),
                ifname: att.ifname.clone(),
                args: att.cni_args.clone(),
                arg_pairs: Vec::new(),
            };
            // The recorded namespace is checked again: it may be gone, but
            // it must not be (or have become) the host's.
            if let Err(e) = self.check_netns(Command::Del, &att.netns).await {
                failed.insert((id.to_string(), att.ifname.clone()));
                errors.push(e);
                continue;
            }
            tracing::info!(container_id = %id, ifname = %att.ifname, "GC: deleting a stale attachment");
            if let Err(e) = self.del_attachment(&inv, &att.netns, &mut record).await {
                failed.insert((id.to_string(), att.ifname.clone()));
                errors.push(e);
            }
        }
        errors
    }

    /// The last phase of GC: sends GC to every plugin of `lists` that
    /// speaks 1.1.0, with every recorded attachment but the `failed` stale
    /// ones as the valid attachments, and every attachment in multus's
    /// result cache but those of the `multus_failed` containers.
    async fn gc_plugins(
        &self,
        lists: &[NetworkList],
        failed: &BTreeSet<(String, String)>,
        multus_failed: &BTreeSet<String>,
    ) -> Vec<Error> {
        let mut errors = Vec::new();
        // Worked out before the exclusive lock: VERSION runs may be slow,
        // and with no plugin to run, nothing is locked at all.
        let mut work = Vec::new();
        for list in lists {
            if list.disable_gc || !list.version().is_some_and(|v| at_least(&v, "1.1.0")) {
                continue;
            }
            match self.prepare(list, Command::Gc).await {
                Ok(p) => {
                    let plugins: Vec<(usize, Plugin, String)> = p
                        .plugins
                        .into_iter()
                        .enumerate()
                        .filter(|(_, (_, v))| at_least(v, "1.1.0"))
                        .map(|(i, (p, v))| (i, p, v))
                        .collect();
                    if !plugins.is_empty() {
                        work.push((list, plugins));
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if work.is_empty() {
            return errors;
        }
        // Exclusive, and only around this phase. A plugin told to GC frees
        // whatever is missing from the valid list, so the list must hold
        // every attachment whose ADD has started: otherwise an ADD running
        // now could lose the address it just reserved. Every operation
        // holds gc_lock (this daemon) and .gc.lock (any daemon on this
        // stateDir) shared from before it records its attachment until its
        // plugins are done; holding both exclusively, no ADD runs, and each
        // one that ran is in the records read below.
        let _gc = self.gc_lock.write().await;
        let locks = self.locks.clone();
        let _gc_file = match blocking(move || locks.gc_exclusive()).await {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                errors.push(Error::record(e));
                return errors;
            }
            Err(e) => {
                errors.push(e);
                return errors;
            }
        };
        let store = self.store.clone();
        let multus = self.multus.clone();
        let records = blocking(move || -> Result<_, Error> {
            let mut out = Vec::new();
            for id in store.list().map_err(Error::record)? {
                // A damaged record names nothing that could be kept.
                if let Ok(Some(r)) = store.load(&id) {
                    out.push(r);
                }
            }
            // Not one cache may be missed: a plugin frees what is not listed.
            let cached = multus.results().map_err(Error::multus)?;
            Ok((out, cached))
        })
        .await;
        let (records, multus_cached) = match records {
            Ok(Ok(r)) => r,
            Ok(Err(e)) | Err(e) => {
                errors.push(e);
                return errors;
            }
        };
        let env = CallEnv {
            command: Command::Gc.as_str(),
            ..CallEnv::default()
        };
        for (list, plugins) in work {
            let attachments: Vec<Value> = records
                .iter()
                .flat_map(|r| {
                    r.attachments
                        .iter()
                        .filter(|a| !failed.contains(&(r.container_id.clone(), a.ifname.clone())))
                        .flat_map(|a| a.delegates.iter())
                        .filter(|d| d.name == list.name)
                        .map(|d| serde_json::json!({"containerID": r.container_id, "ifname": d.ifname}))
                })
                .chain(
                    multus_cached
                        .iter()
                        .filter(|c| c.network == list.name && !multus_failed.contains(&c.container_id))
                        .map(|c| serde_json::json!({"containerID": c.container_id, "ifname": c.ifname})),
                )
                .collect();
            let valid_value = if attachments.is_empty() {
                Value::Null
            } else {
                Value::Array(attachments)
            };
            for (i, plugin, version) in plugins {
                let mut stdin = stdin_object(list, i, &version);
                stdin.insert("cni.dev/valid-attachments".into(), valid_value.clone());
                stdin.insert("cni.dev/attachments".into(), valid_value.clone());
                let stdin = serde_json::to_vec(&Value::Object(stdin)).unwrap_or_default();
                if let Err(e) = self.runner.run(&plugin, &env, stdin).await {
                    errors.push(Error::plugin(Command::Gc, &list.name, e));
                }
            }
        }
        errors
    }
}

/// Kills the group each marker of container `id` names and removes the
/// marker; stops at the first group that survives (its marker stays) and
/// Kills the plugin group an earlier holder of `held` (the lock of
/// container `id`) noted in it and left running, and empties the marker.
/// A group that survives keeps its marker and is the error. Blocking.
fn clear_marker(
    markers: &Markers,
    kill: KillGroup,
    id: &str,
    held: &Held,
) -> Result<(), (i32, std::io::Error)> {
    let marker = match markers.of(id, held) {
        Ok(Some(m)) => m,
        Ok(None) => return Ok(()),
        Err(e) => {
            tracing::warn!(container_id = %id, cause = %e, "cannot read the plugin marker");
            return Ok(());
        }
    };
    match marker.state {
        MarkerState::Running(group) => match kill(group, STALE_GROUP_WAIT) {
            Ok(true) => {
                tracing::warn!(container_id = %id, pgid = group.pgid, "killed plugins an earlier plexusd left running")
            }
            Ok(false) => {
                tracing::info!(container_id = %id, pgid = group.pgid, "plugins of an earlier plexusd had already exited")
            }
            Err(e) => return Err((group.pgid, e)),
        },
        MarkerState::EarlierBoot => {
            tracing::info!(container_id = %id, path = %marker.path.display(), "removing a plugin marker from an earlier boot")
        }
        MarkerState::Unreadable => {
            tracing::warn!(container_id = %id, path = %marker.path.display(), "removing an unreadable plugin marker; its processes, if any, cannot be identified")
        }
    }
    if let Err(e) = markers.clear(held) {
        tracing::warn!(container_id = %id, cause = %e, "cannot empty a plugin marker");
    }
    Ok(())
}

/// Whether GC keeps attachment `att` of container `id`: the runtime lists
/// it, or, for a network hot-plugged into one, the attachment it joined.
/// Blocking: gives up a container's lock files. Its lock file goes too
/// when its record is gone: nobody can make a new record without the lock,
/// and a waiter on the unlinked file starts over (state::Locks); else the
/// marker of a reaped plugin is emptied first.
fn release_files(store: &Arc<dyn Records>, id: &str, marker: Released, file: Held, gc_file: Held) {
    if store.exists(id) {
        marker.settle(&file);
        drop(file);
    } else if let Err(e) = file.unlink() {
        tracing::warn!(container_id = %id, cause = %e, "cannot remove a lock file");
    }
    drop(gc_file);
}

fn is_valid(id: &str, att: &Attachment, valid: &BTreeSet<(String, String)>) -> bool {
    let listed = |ifname: &str| valid.contains(&(id.to_string(), ifname.to_string()));
    listed(&att.ifname) || att.hot_plugged_into.as_deref().is_some_and(listed)
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

/// A damaged record moved aside: why, and where it went.
type SetAside = (state::Error, PathBuf);

/// The record of `id` (the caller holds its lock); a damaged one is moved
/// aside (bytes kept). Blocking.
fn load_now(
    store: &dyn Records,
    id: &str,
) -> Result<(Option<Record>, Option<SetAside>), state::Error> {
    match store.load(id) {
        Ok(r) => Ok((r, None)),
        Err(e) if e.is_damaged() => {
            let to = store.set_aside(id)?;
            Ok((None, Some((e, to))))
        }
        Err(e) => Err(e),
    }
}

/// [`load_now`]'s answer, with a damaged record logged by container id.
fn loaded_logged(id: &str, (record, moved): (Option<Record>, Option<SetAside>)) -> Loaded {
    if let Some((why, to)) = &moved {
        tracing::error!(container_id = %id, cause = %why, moved_to = %to.display(), "damaged attachment record moved aside; the container is treated as having no record");
    }
    Loaded {
        record,
        set_aside: moved.is_some(),
        found: Vec::new(),
        unrecorded: None,
    }
}

/// The network configuration a delegate was added with, from its record.
/// The plugin types of every network in `record`, once each.
fn recorded_types(record: &Record) -> Vec<String> {
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

fn recorded_list(d: &Delegate) -> Result<NetworkList, netconf::ConfigError> {
    NetworkList::from_value(
        &PathBuf::from(format!("<record of network {}>", d.name)),
        d.config.clone(),
        false,
    )
}

/// The capability arguments of `cap_args` that some plugin of `lists`
/// declares (`"capabilities": {"<key>": true}`): the only ones libcni
/// passes to plugins, hence the only ones DEL can need.
fn declared_capabilities<'a>(
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
fn recorded_capabilities(list: &NetworkList, own: Map<String, Value>) -> Map<String, Value> {
    let file = own.get("CNIDeviceInfoFile").cloned();
    let mut kept = declared_capabilities(std::iter::once(list), own);
    if let Some(file) = file {
        kept.insert("CNIDeviceInfoFile".into(), file);
    }
    kept
}

/// A synced record write in progress (see [`Engine::save_synced_gate`]).
struct Synced(tokio::sync::oneshot::Receiver<Result<(), String>>);

impl Synced {
    /// Waits for the write to be on disk; an error when it failed or never
    /// ran.
    async fn done(self) -> Result<(), Error> {
        let outcome = self
            .0
            .await
            .unwrap_or_else(|_| Err("the record write was lost".into()));
        outcome.map_err(|why| {
            Error::new(
                ErrorKind::Internal,
                code::IO_FAILURE,
                format!("cannot write the attachment record: {why}"),
            )
        })
    }
}

/// Runs blocking file work off the async runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            code::INTERNAL,
            format!("a blocking task failed: {e}"),
        )
    })
}

/// A plugin's config object with `name` and `cniVersion` set from the list.
fn stdin_object(list: &NetworkList, i: usize, version: &str) -> Map<String, Value> {
    let mut m = list.plugins.get(i).cloned().unwrap_or_default();
    m.insert("name".into(), Value::String(list.name.clone()));
    m.insert("cniVersion".into(), Value::String(version.to_string()));
    m
}

/// The stdin of plugin `i` for ADD/DEL/CHECK/STATUS, as libcni builds it:
/// `name` and `cniVersion` from the list, `prevResult` when given, and
/// `runtimeConfig` with the capabilities the plugin declared true and the
/// runtime supplied. Keys come out sorted (serde_json's map), like Go's.
fn stdin_for(
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
fn convert_for(result: &Value, version: &str) -> Option<Value> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Groups the fake killer was asked to kill; pgids are unique per test.
    static KILLED: Mutex<Vec<Group>> = Mutex::new(Vec::new());
    /// The pgid the fake killer cannot kill.
    const SURVIVOR: i32 = 999_001;

    fn fake_kill(group: Group, _wait: Duration) -> std::io::Result<bool> {
        KILLED.lock().unwrap().push(group);
        if group.pgid == SURVIVOR {
            return Err(std::io::Error::other("members still alive"));
        }
        Ok(true)
    }

    fn killed(pgid: i32) -> Vec<Group> {
        let all = KILLED.lock().unwrap();
        all.iter().filter(|g| g.pgid == pgid).copied().collect()
    }

    fn engine_config(state: &Path) -> Config {
        Config {
            bin_dirs: Vec::new(),
            conf_dir: state.join("conf"),
            state_dir: state.to_path_buf(),
            plugin_timeout: Duration::from_secs(5),
            device_info_dir: state.join("devinfo"),
            cni_dir: state.join("multus"),
        }
    }

    /// Writes a marker as the runner would for a group of this boot: into
    /// the container's lock file, as a daemon that died holding it left it.
    fn marker(state: &Path, id: &str, pgid: i32, start_time: u64) -> PathBuf {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        let dir = state.join("locks");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{id}.lock"));
        std::fs::write(&path, format!("{pgid} {start_time} {}\n", boot.trim())).unwrap();
        path
    }

    /// Whether the marker in a lock file was emptied (or the file is gone).
    fn cleared(path: &Path) -> bool {
        std::fs::metadata(path)
            .map(|m| m.len() == 0)
            .unwrap_or(true)
    }

    fn del_call(id: &str) -> Invocation {
        Invocation {
            command: Command::Del,
            container_id: id.into(),
            netns: String::new(),
            ifname: "eth0".into(),
            args: String::new(),
            arg_pairs: Vec::new(),
        }
    }

    #[tokio::test]
    async fn stale_groups_should_be_killed_before_a_call_and_a_survivor_should_fail_it() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::build(engine_config(dir.path()), None, fake_kill).unwrap();
        let m = marker(dir.path(), "c1", 999_002, 42);
        let no_fallback = || async { Ok::<_, Error>(Vec::new()) };
        engine
            .del(&del_call("c1"), Map::new(), no_fallback)
            .await
            .unwrap();
        assert_eq!(
            killed(999_002),
            vec![Group {
                pgid: 999_002,
                start_time: 42
            }]
        );
        assert!(cleared(&m), "the marker of a killed group stayed");

        let m = marker(dir.path(), "c2", SURVIVOR, 7);
        let e = engine
            .del(&del_call("c2"), Map::new(), no_fallback)
            .await
            .unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
        assert!(
            e.msg.contains("c2") && e.msg.contains(&SURVIVOR.to_string()),
            "{e}"
        );
        assert!(!cleared(&m), "the marker of a surviving group was removed");
        // Nothing is left locked: the lock file of a container without a
        // record is gone, and the next call is not stuck.
        assert!(!dir.path().join("locks/c1.lock").exists());
        assert!(engine.locks.try_lock("c2").unwrap().is_some());
    }

    #[test]
    fn start_up_should_clean_up_only_containers_nobody_holds() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::open(dir.path()).unwrap();
        let store = Store::open(dir.path()).unwrap();
        let free = marker(dir.path(), "free", 999_003, 1);
        let busy = marker(dir.path(), "busy", 999_004, 1);
        let free_tmp = store.dir().join(".free.1.2.tmp");
        let busy_tmp = store.dir().join(".busy.1.2.tmp");
        std::fs::write(&free_tmp, "x").unwrap();
        std::fs::write(&busy_tmp, "x").unwrap();
        // A live predecessor working on "busy" holds its lock.
        let held = locks.lock("busy").unwrap();
        drop(locks.lock("orphan").unwrap());

        let _engine = Engine::build(engine_config(dir.path()), None, fake_kill).unwrap();
        assert_eq!(killed(999_003).len(), 1);
        assert!(cleared(&free) && !free_tmp.exists());
        assert!(
            killed(999_004).is_empty(),
            "a held container's plugins were killed"
        );
        assert!(!cleared(&busy) && busy_tmp.exists());
        // Lock files of containers without a record go, unless held.
        assert!(!dir.path().join("locks/orphan.lock").exists());
        assert!(!dir.path().join("locks/free.lock").exists());
        assert!(held.path().exists());
    }

    #[tokio::test]
    async fn del_should_load_configs_only_for_a_container_whose_record_was_lost() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::build(engine_config(dir.path()), None, fake_kill).unwrap();
        let called = AtomicBool::new(false);
        let fallback = || async {
            called.store(true, Ordering::SeqCst);
            Ok::<_, Error>(Vec::new())
        };
        engine
            .del(&del_call("never-added"), Map::new(), fallback)
            .await
            .unwrap();
        assert!(
            !called.load(Ordering::SeqCst),
            "a DEL of nothing loaded configs"
        );

        let store = Store::at(dir.path());
        std::fs::write(store.dir().join("lost.json"), b"{garbage").unwrap();
        engine
            .del(&del_call("lost"), Map::new(), fallback)
            .await
            .unwrap();
        assert!(called.swap(false, Ordering::SeqCst));
        assert!(store.was_set_aside("lost"));
        // Later DELs (another ifname, a retry) still fall back.
        engine
            .del(&del_call("lost"), Map::new(), fallback)
            .await
            .unwrap();
        assert!(called.load(Ordering::SeqCst));
    }

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
