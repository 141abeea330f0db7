//! Reconciling plexusd's records with the container runtime's pod
//! sandboxes: the networks of a sandbox the runtime has forgotten (a DEL
//! that never came: a runtime that lost its metadata, a sandbox removed by
//! hand, a runtime that never sends GC) are deleted by plexusd itself, so
//! that their addresses are given back.
//!
//! After start and every `reconcileInterval`, one round: the runtime's
//! sandboxes are listed over its CRI socket ([`crate::cri`]), every record
//! is read, and [`decision::decide`] says which containers go (its rules
//! are there). Each of those is deleted through the engine
//! ([`Engine::reclaim`]), under the container's locks, where the same
//! check is made again on the record as it is then. Each reclaimed
//! container is logged at info, naming its pod; each round's summary at
//! debug.
//!
//! It reads the records directly (read-only, [`Store::at`]); only the
//! engine writes them.

pub mod decision;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::cni::engine::Reclaimed;
use crate::cni::state::{Record, Store};
use crate::cni::Engine;
use decision::{Answer, Candidate, Memory, Pod, Round};

/// The default grace period: longer than any runtime takes to come back
/// after a restart and list its sandboxes again, and than a sandbox's ADD
/// may take (plugins get 2 min by default), with room to spare; short
/// enough that a node with a /26 of pod addresses (60 pods) churning a
/// pod a minute does not run out before the addresses come back.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(600);
/// The default interval: a round costs one CRI call and a read of every
/// record; every 5 min keeps that unnoticeable while a forgotten address
/// comes back at most grace + interval after it was forgotten.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
/// The bound of one CRI call, at most (it is the interval when shorter,
/// at least [`MIN_CALL_TIMEOUT`]).
pub const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The runtime's CRI socket, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Socket {
    /// The first of [`crate::cri::DEFAULT_SOCKETS`] that exists when the
    /// daemon starts.
    Detect,
    /// None: reconciling is off.
    Off,
    At(PathBuf),
}

/// Reconciling's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub socket: Socket,
    /// `reconcile`: whether rounds run at all.
    pub enabled: bool,
    pub grace: Duration,
    pub interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            socket: Socket::Detect,
            enabled: true,
            grace: DEFAULT_GRACE,
            interval: DEFAULT_INTERVAL,
        }
    }
}

impl Config {
    /// The socket to ask, when reconciling is on; why not, else.
    /// Blocking (it looks for the default sockets).
    pub fn socket_to_use(&self) -> Result<PathBuf, &'static str> {
        if !self.enabled {
            return Err("reconcile is false");
        }
        match &self.socket {
            Socket::Off => Err("criSocket is \"\""),
            Socket::At(p) => Ok(p.clone()),
            Socket::Detect => {
                crate::cri::detect().ok_or("criSocket is not set and no runtime socket was found")
            }
        }
    }

    /// The bound of one CRI call.
    pub fn call_timeout(&self) -> Duration {
        self.interval.clamp(MIN_CALL_TIMEOUT, MAX_CALL_TIMEOUT)
    }
}

/// Runs rounds on `engine`'s records (in `state_dir`) against the runtime
/// at `socket`, the first at once, then every interval; never returns.
pub async fn run(engine: Arc<Engine>, config: Config, socket: PathBuf, state_dir: PathBuf) {
    let mut memory = Memory::default();
    let mut ticks = tokio::time::interval(config.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        round(&engine, &config, &socket, &state_dir, &mut memory).await;
    }
}

/// One round (see the module documentation).
async fn round(
    engine: &Engine,
    config: &Config,
    socket: &Path,
    state_dir: &Path,
    memory: &mut Memory,
) {
    let answer = match crate::cri::list_sandboxes(socket, config.call_timeout()).await {
        Ok(l) => Answer::Listed {
            ids: l.sandboxes.into_iter().map(|s| s.id).collect(),
            runtime_age: l.runtime_age,
        },
        Err(e @ crate::cri::Error::Timeout { .. }) => {
            Answer::Unanswered(crate::causes::chain(&e).to_string())
        }
        Err(e) => Answer::Failed(crate::causes::chain(&e).to_string()),
    };
    // Records are read only for a round that may act.
    let mut probe = memory.clone();
    if let Some(skip) = decision::trust(&mut probe, Instant::now(), &answer, config.grace) {
        *memory = probe;
        tracing::debug!(why = %skip, "reconcile round: nothing done");
        return;
    }
    let dir = state_dir.to_path_buf();
    let candidates = tokio::task::spawn_blocking(move || candidates(&dir))
        .await
        .unwrap_or_default();
    let decided = decision::decide(memory, Instant::now(), &answer, &candidates, config.grace);
    let (Round::Act { reclaim, kept }, Answer::Listed { ids, .. }) = (decided, &answer) else {
        return;
    };
    let mut done = 0;
    for id in &reclaim {
        let Some(c) = candidates.iter().find(|c| &c.id == id) else {
            continue;
        };
        if reclaim_one(engine, config, state_dir, ids, c).await {
            done += 1;
        }
    }
    let mut why_kept: std::collections::BTreeMap<&str, usize> = Default::default();
    for (_, why) in &kept {
        *why_kept.entry(why.as_str()).or_default() += 1;
    }
    tracing::debug!(
        sandboxes = ids.len(),
        records = candidates.len(),
        reclaimed = done,
        kept = ?why_kept,
        "reconcile round"
    );
}

/// Deletes the networks of container `c` through the engine, the rules
/// checked again under its locks; whether it was reclaimed.
async fn reclaim_one(
    engine: &Engine,
    config: &Config,
    state_dir: &Path,
    listed: &HashSet<String>,
    c: &Candidate,
) -> bool {
    let pod = c
        .pod
        .as_ref()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .unwrap_or_default();
    let grace = config.grace;
    let dir = state_dir.to_path_buf();
    let still = |record: Record| async move {
        let checked = tokio::task::spawn_blocking(move || candidate(&dir, record)).await;
        matches!(checked, Ok(Some(now)) if decision::verdict(&now, listed, grace).is_none())
    };
    let why = "the runtime no longer knows the sandbox and its network namespace is gone";
    match engine.reclaim(&c.id, why, still).await {
        Ok(Reclaimed::Done) => {
            tracing::info!(container_id = %c.id, pod, "the runtime forgot this pod's sandbox: its networks are deleted and their addresses given back");
            true
        }
        Ok(Reclaimed::Pending(cause)) => {
            tracing::info!(container_id = %c.id, pod, cause, "the runtime forgot this pod's sandbox: its networks' DEL failed; they stay pending cleanups, retried");
            true
        }
        Ok(Reclaimed::Kept) | Ok(Reclaimed::Gone) => {
            tracing::debug!(container_id = %c.id, pod, "a forgotten sandbox changed before its DEL; kept");
            false
        }
        Err(e) => {
            tracing::warn!(container_id = %c.id, pod, cause = %e, "cannot delete the networks of a forgotten sandbox");
            false
        }
    }
}

/// What is known of every container recorded in `state_dir` (a damaged
/// or unreadable record is left out: it is kept). Blocking.
fn candidates(state_dir: &Path) -> Vec<Candidate> {
    let store = Store::at(state_dir);
    let Ok(ids) = store.list() else {
        return Vec::new();
    };
    ids.iter()
        .filter_map(|id| store.load(id).ok().flatten())
        .filter_map(|r| candidate(state_dir, r))
        .collect()
}

/// What is known of the container of `record`: its pod, whether its
/// network namespaces are gone, its record file's age; `None` when that
/// file cannot be examined. Blocking.
fn candidate(state_dir: &Path, record: Record) -> Option<Candidate> {
    let file = Store::at(state_dir)
        .dir()
        .join(format!("{}.json", record.container_id));
    let written = std::fs::symlink_metadata(file).ok()?.modified().ok()?;
    let age = SystemTime::now()
        .duration_since(written)
        .unwrap_or_default();
    let pod = record
        .runtime_attachment()
        .and_then(|a| pod_of(&a.cni_args));
    let netns_gone =
        !record.attachments.is_empty() && record.attachments.iter().all(|a| netns_gone(&a.netns));
    Some(Candidate {
        id: record.container_id,
        pod,
        netns_gone,
        age,
    })
}

/// The Kubernetes pod `cni_args` name (`K8S_POD_NAMESPACE` and
/// `K8S_POD_NAME`, both non-empty).
pub fn pod_of(cni_args: &str) -> Option<Pod> {
    let pairs = crate::netconf::parse_args(cni_args).ok()?;
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    Some(Pod {
        namespace: get("K8S_POD_NAMESPACE")?,
        name: get("K8S_POD_NAME")?,
    })
}

/// Whether the network namespace at `path` is gone: nothing is there, or
/// what is there is no namespace file (an unmounted leftover). Any doubt
/// (an empty path, a file that cannot be examined) is "not gone".
/// Blocking.
pub fn netns_gone(path: &str) -> bool {
    if path.is_empty() {
        return false;
    }
    match nix::sys::statfs::statfs(Path::new(path)) {
        Ok(fs) => fs.filesystem_type().0 != crate::cni::netns::NSFS_MAGIC,
        Err(nix::errno::Errno::ENOENT) | Err(nix::errno::Errno::ENOTDIR) => true,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pods_named_in_full_should_count_as_kubernetes_pods() {
        let p =
            pod_of("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;K8S_POD_UID=u").unwrap();
        assert_eq!((p.namespace.as_str(), p.name.as_str()), ("ns", "web"));
        assert_eq!(pod_of("IgnoreUnknown=1"), None);
        assert_eq!(pod_of("K8S_POD_NAME=web"), None);
        assert_eq!(pod_of("K8S_POD_NAMESPACE=;K8S_POD_NAME=web"), None);
        assert_eq!(pod_of(""), None);
    }

    #[test]
    fn a_namespace_should_be_gone_only_when_nothing_or_no_namespace_is_there() {
        let dir = tempfile::tempdir().unwrap();
        assert!(netns_gone(&dir.path().join("none").to_string_lossy()));
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(netns_gone(&file.to_string_lossy()));
        assert!(!netns_gone("/proc/self/ns/net"));
        assert!(!netns_gone(""));
    }

    #[test]
    fn the_call_timeout_should_follow_the_interval_within_bounds() {
        let c = |s| Config {
            interval: Duration::from_millis(s),
            ..Config::default()
        };
        assert_eq!(c(100).call_timeout(), MIN_CALL_TIMEOUT);
        assert_eq!(c(3000).call_timeout(), Duration::from_secs(3));
        assert_eq!(Config::default().call_timeout(), MAX_CALL_TIMEOUT);
    }
}
