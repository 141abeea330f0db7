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
//! - Calls for one container are serialized; GC excludes every other call.
//!
//! This module knows nothing about HTTP, the shim or Kubernetes.

pub mod exec;
pub mod record;
pub mod types;

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{OwnedMutexGuard, RwLock};

use self::exec::{CallEnv, ExecError, Plugin, Runner};
use self::record::{Attachment, Delegate, Durability, Record, State, Store};
use self::types::{at_least, code, negotiate, Command, Invocation, NetworkList};
use crate::metrics::Metrics;
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

/// The engine's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub bin_dirs: Vec<PathBuf>,
    pub conf_dir: PathBuf,
    pub state_dir: PathBuf,
    pub plugin_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bin_dirs: DEFAULT_BIN_DIRS.iter().map(PathBuf::from).collect(),
            conf_dir: PathBuf::from(DEFAULT_CONF_DIR),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            plugin_timeout: DEFAULT_PLUGIN_TIMEOUT,
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
    fn new(kind: ErrorKind, code: u32, msg: impl Into<String>) -> Self {
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

    fn config(e: types::ConfigError) -> Self {
        Self::new(
            ErrorKind::Invalid,
            code::INVALID_NETWORK_CONFIG,
            e.to_string(),
        )
    }

    fn record(e: record::Error) -> Self {
        Self::new(ErrorKind::Internal, code::IO_FAILURE, e.to_string())
    }

    fn plugin(command: Command, network: &str, e: ExecError) -> Self {
        Self::new(
            ErrorKind::Failed,
            e.code(),
            format!("{command} network {network:?}: {e}"),
        )
        .details(e.details())
    }

    /// Several errors as one: the first one's code, every message.
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
}

/// A network's plugins, located, each with the version it runs at.
struct Prepared {
    plugins: Vec<(Plugin, String)>,
}

/// The engine: shared by every request.
#[derive(Debug)]
pub struct Engine {
    config: Config,
    runner: Arc<Runner>,
    store: Arc<Store>,
    containers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// ADD/DEL/CHECK take it shared, GC exclusive (GC must not race them).
    gc_lock: RwLock<()>,
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
    /// Creates the engine; creates the state directory. Blocking.
    pub fn new(config: Config, metrics: Option<Arc<Metrics>>) -> Result<Self, Error> {
        let store = Store::open(&config.state_dir).map_err(Error::record)?;
        Ok(Self {
            runner: Arc::new(Runner::new(
                config.bin_dirs.clone(),
                config.plugin_timeout,
                metrics,
            )),
            store: Arc::new(store),
            config,
            containers: Mutex::new(HashMap::new()),
            gc_lock: RwLock::new(()),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Loads a network by name (from `confDir`) or path.
    pub async fn load(&self, network: &str) -> Result<NetworkList, Error> {
        let dir = self.config.conf_dir.clone();
        let network = network.to_string();
        blocking(move || types::load_network(&dir, &network))
            .await?
            .map_err(Error::config)
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

    async fn find(&self, name: &str) -> Result<Plugin, ExecError> {
        let runner = self.runner.clone();
        let name = name.to_string();
        match tokio::task::spawn_blocking(move || runner.find(&name)).await {
            Ok(r) => r,
            Err(e) => Err(ExecError::Io {
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
        let candidates = Self::candidates(list)?;
        let mut plugins = Vec::with_capacity(list.plugins.len());
        for i in 0..list.plugins.len() {
            let plugin = self.find(list.plugin_type(i)).await.map_err(|e| {
                let mut err = Error::plugin(command, &list.name, e);
                err.kind = ErrorKind::Invalid;
                err
            })?;
            let version = self.version_for(list, &candidates, &plugin).await?;
            plugins.push((plugin, version));
        }
        Ok(Prepared { plugins })
    }

    fn call_env(&self, command: Command, inv: &Invocation, ifname: &str, netns: &str) -> CallEnv {
        CallEnv {
            command: command.as_str(),
            container_id: inv.container_id.clone(),
            netns: netns.to_string(),
            ifname: ifname.to_string(),
            args: inv.args.clone(),
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
    ) -> Result<Value, (Error, Option<Value>)> {
        let mut prev: Option<Value> = None;
        for (i, (plugin, version)) in prepared.plugins.iter().enumerate() {
            let prev_here = prev.as_ref().and_then(|p| convert_for(p, version));
            let stdin = stdin_for(list, i, version, Command::Add, prev_here, cap_args);
            let out = match self.runner.run(plugin, env, stdin).await {
                Ok(out) => out,
                Err(e) => return Err((Error::plugin(Command::Add, &list.name, e), prev)),
            };
            let parsed = parse_result(&out, version).map_err(|reason| {
                let e = ExecError::InvalidResult {
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
    async fn del_chain(
        &self,
        list: &NetworkList,
        env: &CallEnv,
        cap_args: &Map<String, Value>,
        prev: Option<&Value>,
    ) -> Vec<Error> {
        let mut errors = Vec::new();
        let candidates = match Self::candidates(list) {
            Ok(c) => c,
            Err(e) => return vec![e],
        };
        for i in (0..list.plugins.len()).rev() {
            let plugin = match self.find(list.plugin_type(i)).await {
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
    ) -> Vec<Error> {
        let list = match recorded_list(d) {
            Ok(l) => l,
            Err(e) => return vec![Error::config(e)],
        };
        let env = self.call_env(Command::Del, inv, &d.ifname, netns);
        self.del_chain(&list, &env, &att.capability_args, prev)
            .await
    }

    async fn load_record(&self, id: &str) -> Result<Option<Record>, Error> {
        let store = self.store.clone();
        let id = id.to_string();
        blocking(move || store.load(&id))
            .await?
            .map_err(Error::record)
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
        let _gc = self.gc_lock.read().await;
        let _lock = self.lock_container(&inv.container_id).await;
        // Everything that can be checked before running anything is.
        let mut prepared = Vec::with_capacity(planned.len());
        for p in &planned {
            prepared.push(self.prepare(&p.list, Command::Add).await?);
        }
        let mut record = self
            .load_record(&inv.container_id)
            .await?
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
        record.attachments.push(Attachment {
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
                    result: None,
                })
                .collect(),
        });
        let slot = record.attachments.len() - 1;

        for (i, (p, prep)) in planned.iter().zip(&prepared).enumerate() {
            record.attachments[slot].delegates[i].state = State::Adding;
            if let Err(e) = self.save_record(&record, Durability::Synced).await {
                return Err(self.roll_back(inv, &mut record, slot, i, None, e).await);
            }
            let env = self.call_env(Command::Add, inv, &p.ifname, &inv.netns);
            match self.add_chain(&p.list, prep, &env, &cap_args).await {
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
        if let Err(e) = self.save_record(&record, Durability::Atomic).await {
            let last = planned.len().saturating_sub(1);
            return Err(self.roll_back(inv, &mut record, slot, last, None, e).await);
        }
        let delegates = &record.attachments[slot].delegates;
        delegates
            .iter()
            .find(|d| d.primary)
            .or_else(|| delegates.first())
            .and_then(|d| d.result.clone())
            .ok_or_else(|| Error::new(ErrorKind::Failed, code::INTERNAL, "ADD produced no result"))
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
            let errs = self.del_recorded(inv, &inv.netns, &att, d, prev).await;
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

    /// What is recorded for `container_id` (see [`record::summary`]);
    /// `None` when nothing is, or the id is not a valid container id.
    pub async fn attachments(&self, container_id: &str) -> Result<Option<Value>, Error> {
        if !types::is_valid_name(container_id) {
            return Ok(None);
        }
        let record = self.load_record(container_id).await?;
        Ok(record.as_ref().map(record::summary))
    }

    /// DEL: removes the attachment named by the call, from its record.
    /// Nothing recorded means nothing to do.
    pub async fn del(&self, inv: &Invocation) -> Result<(), Error> {
        let _gc = self.gc_lock.read().await;
        let _lock = self.lock_container(&inv.container_id).await;
        self.del_locked(inv, &inv.netns).await
    }

    async fn del_locked(&self, inv: &Invocation, netns: &str) -> Result<(), Error> {
        let Some(mut record) = self.load_record(&inv.container_id).await? else {
            return Ok(());
        };
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
                .del_recorded(&inv, netns, &att, d, d.result.as_ref())
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
        self.save_record(&record, Durability::Atomic).await?;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::join(
                Command::Del,
                &format!("container {:?} ifname {:?}", inv.container_id, inv.ifname),
                errors,
            ))
        }
    }

    /// CHECK: verifies every recorded network of the attachment with the
    /// recorded result, in order; the first failure is returned.
    pub async fn check(&self, inv: &Invocation) -> Result<(), Error> {
        let _gc = self.gc_lock.read().await;
        let _lock = self.lock_container(&inv.container_id).await;
        let record = self.load_record(&inv.container_id).await?;
        let Some(att) = record.as_ref().and_then(|r| r.attachment(&inv.ifname)) else {
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
            if d.state != State::Added {
                return Err(Error::new(
                    ErrorKind::Failed,
                    code::UNKNOWN_CONTAINER,
                    format!("network {:?}: its ADD did not complete", d.name),
                ));
            }
            let list = recorded_list(d).map_err(Error::config)?;
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
                continue;
            }
            let prepared = self.prepare(&list, Command::Check).await?;
            let env = self.call_env(Command::Check, inv, &d.ifname, &inv.netns);
            for (i, (plugin, version)) in prepared.plugins.iter().enumerate() {
                if !at_least(version, "0.4.0") {
                    continue;
                }
                let prev = d.result.as_ref().and_then(|r| convert_for(r, version));
                let stdin = stdin_for(
                    &list,
                    i,
                    version,
                    Command::Check,
                    prev,
                    &att.capability_args,
                );
                self.runner
                    .run(plugin, &env, stdin)
                    .await
                    .map_err(|e| Error::plugin(Command::Check, &list.name, e))?;
            }
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
    pub async fn gc(
        &self,
        valid: &BTreeSet<(String, String)>,
        lists: &[NetworkList],
    ) -> Result<(), Error> {
        let _gc = self.gc_lock.write().await;
        let store = self.store.clone();
        let ids = blocking(move || store.list())
            .await?
            .map_err(Error::record)?;
        let mut errors = Vec::new();
        let mut remaining: Vec<(String, String, String)> = Vec::new();
        for id in ids {
            let record = match self.load_record(&id).await {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            for att in &record.attachments {
                if valid.contains(&(id.clone(), att.ifname.clone())) {
                    for d in &att.delegates {
                        remaining.push((id.clone(), d.ifname.clone(), d.name.clone()));
                    }
                    continue;
                }
                let inv = Invocation {
                    command: Command::Del,
                    container_id: id.clone(),
                    netns: att.netns.clone(),
                    ifname: att.ifname.clone(),
                    args: att.cni_args.clone(),
                    arg_pairs: Vec::new(),
                };
                tracing::info!(container_id = %id, ifname = %att.ifname, "GC: deleting a stale attachment");
                if let Err(e) = self.del_locked(&inv, &att.netns).await {
                    errors.push(e);
                }
            }
        }
        for list in lists {
            if list.disable_gc || !list.version().is_some_and(|v| at_least(&v, "1.1.0")) {
                continue;
            }
            let attachments: Vec<Value> = remaining
                .iter()
                .filter(|(_, _, net)| *net == list.name)
                .map(|(c, i, _)| serde_json::json!({"containerID": c, "ifname": i}))
                .collect();
            let valid_value = if attachments.is_empty() {
                Value::Null
            } else {
                Value::Array(attachments)
            };
            let prepared = match self.prepare(list, Command::Gc).await {
                Ok(p) => p,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let env = CallEnv {
                command: Command::Gc.as_str(),
                ..CallEnv::default()
            };
            for (i, (plugin, version)) in prepared.plugins.iter().enumerate() {
                if !at_least(version, "1.1.0") {
                    continue;
                }
                let mut stdin = stdin_object(list, i, version);
                stdin.insert("cni.dev/valid-attachments".into(), valid_value.clone());
                stdin.insert("cni.dev/attachments".into(), valid_value.clone());
                let stdin = serde_json::to_vec(&Value::Object(stdin)).unwrap_or_default();
                if let Err(e) = self.runner.run(plugin, &env, stdin).await {
                    errors.push(Error::plugin(Command::Gc, &list.name, e));
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::join(Command::Gc, "stale attachments", errors))
        }
    }
}

/// The network configuration a delegate was added with, from its record.
fn recorded_list(d: &Delegate) -> Result<NetworkList, types::ConfigError> {
    NetworkList::from_value(
        &PathBuf::from(format!("<record of network {}>", d.name)),
        d.config.clone(),
        false,
    )
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
