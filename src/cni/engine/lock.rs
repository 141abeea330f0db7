//! The lifecycle of one operation on a container: the locks it takes (in
//! one order, so two operations or two daemons never wait in a cycle), the
//! plugin groups an earlier daemon left that it kills first, the record as
//! it loads it, the synced write its first plugin waits for, and the last
//! write that shares the unlock's trip to the blocking pool.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedMutexGuard, RwLockReadGuard};

use super::chain::recorded_types;
use super::multus::Multus;
use super::{blocking, check_netns_now, Engine, Error, ErrorKind, KillGroup};
use crate::api::{code, Command};
use crate::cni::exec::{Gate, Plugin};
use crate::cni::parts::Records;
use crate::cni::state;
use crate::cni::state::{Durability, Held, MarkerState, Markers, Record, Released};

/// How long a plugin group left by an earlier daemon may take to die after
/// SIGKILL before the call gives up ("try again later").
const STALE_GROUP_WAIT: Duration = Duration::from_secs(5);

/// Everything one operation on a container holds. Taken in the order
/// gc, gc_file, container, file (the GC phase takes gc then gc_file and no
/// container), so two operations, or two daemons, never wait on each other
/// in a cycle; released in the reverse order by [`Engine::unlock`].
pub(super) struct OpLock<'a> {
    /// `locks/<id>.lock`, flock'ed: excludes other daemons on this stateDir.
    pub(super) file: Held,
    /// Cheap ordering of this daemon's own calls in front of the flock.
    pub(super) container: ContainerLock<'a>,
    /// `locks/.gc.lock`, shared: another daemon's plugin GC waits for us.
    pub(super) gc_file: Held,
    pub(super) gc: GcShared<'a>,
}

/// An operation's share of this daemon's GC lock. GC's plugin phase waits
/// until it can take the lock exclusively without queueing for it (a
/// queued writer would make every new operation wait behind it, and so
/// behind a hung ADD): each share that goes wakes it to try again.
pub(super) struct GcShared<'a> {
    guard: Option<RwLockReadGuard<'a, ()>>,
    released: &'a Notify,
}

impl<'a> GcShared<'a> {
    pub(super) fn new(guard: RwLockReadGuard<'a, ()>, released: &'a Notify) -> Self {
        Self {
            guard: Some(guard),
            released,
        }
    }
}

impl Drop for GcShared<'_> {
    fn drop(&mut self) {
        // Released before the wake-up, so the woken GC can take it.
        drop(self.guard.take());
        self.released.notify_waiters();
    }
}

/// A container's record as an operation sees it.
pub(super) struct Loaded {
    pub(super) record: Option<Record>,
    /// The record was damaged and has just been moved aside.
    pub(super) set_aside: bool,
    /// Plugins located in the same trip to the blocking pool (see
    /// [`Engine::lock_op_with`]); the others are looked up when needed.
    pub(super) found: Vec<Plugin>,
    /// For a DEL of a container without a record, what else decides what
    /// it does, read in the same trip (see [`Engine::lock_op_with`]).
    pub(super) unrecorded: Option<Unrecorded>,
}

/// A container without a record of its own: multus's delegate cache for
/// it, and whether a damaged record of it was ever set aside.
pub(super) struct Unrecorded {
    pub(super) multus: Multus,
    pub(super) was_set_aside: bool,
}

/// Holds one container's lock; forgets the lock when nobody else waits.
pub(super) struct ContainerLock<'a> {
    pub(super) engine: &'a Engine,
    pub(super) id: String,
    pub(super) guard: Option<OwnedMutexGuard<()>>,
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

/// Kills the group each marker of container `id` names and removes the
/// marker; stops at the first group that survives (its marker stays) and
/// Kills the plugin group an earlier holder of `held` (the lock of
/// container `id`) noted in it and left running, and empties the marker.
/// A group that survives keeps its marker and is the error. Blocking.
pub(super) fn clear_marker(
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

/// A damaged record moved aside: why, and where it went.
pub(super) type SetAside = (state::Error, PathBuf);

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

/// A synced record write in progress (see [`Engine::save_synced_gate`]).
pub(super) struct Synced(tokio::sync::oneshot::Receiver<Result<(), String>>);

impl Synced {
    /// Waits for the write to be on disk; an error when it failed or never
    /// ran.
    pub(super) async fn done(self) -> Result<(), Error> {
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

impl Engine {
    /// Takes everything an operation on container `id` holds (see
    /// [`OpLock`]), then kills the plugin groups an earlier daemon left
    /// running for it, so none of them can act after this operation's
    /// plugins. Fails ("try again later") if one of them survives.
    ///
    /// One trip to the blocking pool does it all, each hand-off costing
    /// CPU on every call: the check of `netns` (for `command`, before any
    /// lock is taken, so a refused call leaves no lock file), the lock
    /// files, the marker scan and the record.
    pub(super) async fn lock_op(
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
    pub(super) async fn lock_op_with(
        &self,
        id: &str,
        netns: Option<(Command, &str)>,
        plugins: Vec<String>,
        for_del: bool,
    ) -> Result<(OpLock<'_>, Loaded), Error> {
        let gc = GcShared::new(self.gc_lock.read().await, &self.gc_released);
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
                let gc_file = locks.gc_shared().map_err(Error::state)?;
                let file = locks.lock(&cid).map_err(Error::state)?;
                let stale = markers.of(&cid, &file).map_err(Error::state)?;
                let loaded = load_now(store.as_ref(), &cid).map_err(Error::state)?;
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
    pub(super) async fn unlock(&self, id: &str, lock: OpLock<'_>) {
        // Nothing to write: only a trip that could not run fails.
        if let Err((e, _)) = self.unlock_after(id, lock, || Ok(())).await {
            tracing::error!(container_id = %id, cause = %e, "releasing the container's lock failed");
        }
    }

    /// The operation's last write of `record` ([`Durability::Atomic`])
    /// and its unlock, in one trip ([`Engine::unlock_after`]).
    pub(super) async fn save_and_unlock<'a>(
        &'a self,
        id: &str,
        lock: OpLock<'a>,
        record: Record,
    ) -> Result<(), (Error, Option<OpLock<'a>>)> {
        let store = self.store.clone();
        self.unlock_after(id, lock, move || {
            store
                .save(&record, Durability::Atomic)
                .map_err(Error::state)
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

    /// The write of `record` with [`Durability::Synced`], as the gate of
    /// the first plugin it protects: the runner does it in the trip that
    /// spawns that plugin, while the plugin starts, and gives the plugin
    /// its configuration only once it is done. [`Synced::done`] tells how
    /// it went.
    pub(super) fn save_synced_gate(&self, record: &Record) -> (Synced, Gate) {
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

    pub(super) async fn save_record(
        &self,
        record: &Record,
        durability: Durability,
    ) -> Result<(), Error> {
        let store = self.store.clone();
        let record = record.clone();
        blocking(move || store.save(&record, durability))
            .await?
            .map_err(Error::state)
    }
}
