//! The lifecycle of one operation on a container: the locks it takes (in
//! one order, so two operations or two daemons never wait in a cycle), the
//! plugin groups an earlier daemon left that it kills first, the record as
//! it loads it, the synced write its first plugin waits for, and the last
//! write that shares the release's trip to the blocking pool.
//!
//! Every operation runs its locked part through [`Engine::locked`] (or
//! [`Engine::locked_with_last_write`]), which owns the whole bracket from
//! taking the locks to releasing them: an operation cannot leave them, or
//! the plugin marker in its lock file, half-released, whichever of its
//! steps fails.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{Notify, OwnedMutexGuard, RwLockReadGuard};

use super::chain::recorded_types;
use super::fault::Step;
use super::tracked::Tracked;
use super::{blocking, check_netns_now, Engine, Error, ErrorKind, KillGroup};
use crate::api::{code, Command};
use crate::cni::backends::Records;
use crate::cni::exec::{Gate, Plugin};
use crate::cni::multus_cache::{CachedDelegate, Caches};
use crate::cni::state;
use crate::cni::state::{Durability, Held, MarkerState, Markers, Record, Released};

/// How long a plugin group left by an earlier daemon may take to die after
/// SIGKILL before the call gives up ("try again later").
const STALE_GROUP_WAIT: Duration = Duration::from_secs(5);

/// Everything one operation on a container holds. Taken in the order
/// gc, gc_file, container, file (the GC phase takes gc then gc_file and no
/// container), so two operations, or two daemons, never wait on each other
/// in a cycle; released in the reverse order when [`Engine::locked`] ends.
/// Private to this file: no operation holds one outside that bracket.
struct OpLock<'a> {
    /// `locks/<id>.lock`, flock'ed: excludes other daemons on this stateDir.
    file: Held,
    /// Cheap ordering of this daemon's own calls in front of the flock.
    container: ContainerLock<'a>,
    /// `locks/.gc.lock`, shared: another daemon's plugin GC waits for us.
    gc_file: Held,
    gc: GcShared<'a>,
}

/// What an operation takes a container's locks for, and what it reads in
/// the same trip to the blocking pool (see [`Engine::locked`]).
pub(super) struct Take<'a> {
    netns: Option<(Command, &'a str)>,
    plugins: Vec<String>,
    for_del: bool,
}

impl<'a> Take<'a> {
    /// For the runtime's call of `command` in namespace `netns`, which is
    /// checked before any lock is taken (a refused call leaves no lock
    /// file; an empty path names no namespace and is not checked).
    pub(super) fn call(command: Command, netns: &'a str) -> Self {
        Self {
            netns: Some((command, netns)),
            plugins: Vec::new(),
            for_del: false,
        }
    }

    /// For plexusd's own work on a container (GC's sweep, a retried DEL):
    /// no namespace of a call to check.
    pub(super) fn own() -> Self {
        Self {
            netns: None,
            plugins: Vec::new(),
            for_del: false,
        }
    }

    /// Also locates `plugins` (by type) once the locks are held; one not
    /// found then is looked up again, and its error reported, by
    /// [`Engine::prepare`].
    pub(super) fn locating(mut self, plugins: Vec<String>) -> Self {
        self.plugins = plugins;
        self
    }

    /// For a DEL: also locates the plugins of every recorded network, or,
    /// when the container has no record, reads multus's delegate cache
    /// for it and whether a record of it was set aside (a DEL needs both
    /// then; a damaged cache is left to the DEL, which moves it aside).
    pub(super) fn for_del(mut self) -> Self {
        self.for_del = true;
        self
    }
}

/// How the locked part of an operation ends (see
/// [`Engine::locked_with_last_write`]).
pub(super) enum Last<A> {
    /// Nothing left to write: the locks are released and `A` is the
    /// answer.
    Answer(A),
    /// `record` is written ([`Durability::Atomic`]) in the trip that
    /// releases the locks; once it is, `answer` is the answer, and, with
    /// `track`, what the record leaves to retry is taken note of
    /// ([`Engine::track`]).
    Save {
        record: Record,
        answer: Result<A, Error>,
        track: bool,
    },
}

/// A last write ([`Last::Save`]) that failed.
pub(super) struct WriteFailed<A> {
    /// Why it failed.
    pub(super) error: Error,
    /// What the operation would have answered.
    pub(super) answer: Result<A, Error>,
    /// Whether the locks are still held: `false` when the trip could not
    /// run at all (the runtime is shutting down) and they went with it.
    pub(super) held: bool,
}

/// The handler of a failed last write of an operation that never writes
/// one ([`Engine::locked`]).
fn never_written<A>(failed: WriteFailed<A>) -> std::future::Ready<Result<A, Error>> {
    std::future::ready(Err(failed.error))
}

/// An operation's share of this daemon's GC lock. GC's plugin phase waits
/// until it can take the lock exclusively without queueing for it (a
/// queued writer would make every new operation wait behind it, and so
/// behind a hung ADD): each share that goes wakes it to try again.
struct GcShared<'a> {
    guard: Option<RwLockReadGuard<'a, ()>>,
    released: &'a Notify,
}

impl<'a> GcShared<'a> {
    fn new(guard: RwLockReadGuard<'a, ()>, released: &'a Notify) -> Self {
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
    /// [`Take::locating`]); the others are looked up when needed.
    pub(super) found: Vec<Plugin>,
    /// For a DEL of a container without a record, what else decides what
    /// it does, read in the same trip (see [`Take::for_del`]).
    pub(super) unrecorded: Option<Unrecorded>,
}

/// What multus left for a container, as an operation under its lock sees it.
pub(super) enum Multus {
    /// No delegate cache.
    Nothing,
    /// The delegate cache was damaged and has just been moved aside.
    SetAside,
    /// The networks multus attached, in its order.
    Delegates(Vec<CachedDelegate>),
}

/// A container without a record of its own: multus's delegate cache for
/// it, and whether a damaged record of it was ever set aside.
pub(super) struct Unrecorded {
    pub(super) multus: Multus,
    pub(super) was_set_aside: bool,
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

/// Kills the plugin group an earlier holder of `held` (the lock of
/// container `id`) noted in it and left running, and empties the marker.
/// A group that survives keeps its marker and is the error. Blocking.
pub(super) fn clear_marker(
    markers: &Markers,
    kill: KillGroup,
    plugin_timeout: Duration,
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
        MarkerState::Running(group) => match kill(group, plugin_timeout, STALE_GROUP_WAIT) {
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

/// What a DEL of container `id`, which has no record, needs to know:
/// multus's delegate cache of it and whether a record of it was ever set
/// aside; `None` when the cache cannot be used as it is (damaged or
/// unreadable), which the DEL then deals with under its lock (see
/// `Engine::load_unrecorded`). Blocking.
fn probe_unrecorded(multus: &Caches, store: &dyn Records, id: &str) -> Option<Unrecorded> {
    let multus = match multus.load(id) {
        Ok(Some(d)) => Multus::Delegates(d),
        Ok(None) => Multus::Nothing,
        Err(_) => return None,
    };
    Some(Unrecorded {
        multus,
        was_set_aside: store.was_set_aside(id),
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
    /// Runs `body` on container `id` under the container's locks: takes
    /// them as `take` says ([`Engine::lock_op`]), hands `body` the record
    /// as loaded under them, and releases them however `body` ends: with
    /// its answer, with an error from any of its steps, or with a panic
    /// (released, then resumed). The release is the only one there is: it
    /// empties the marker of the last plugin reaped, or removes the lock
    /// file when the container has no record left, and gives up the files'
    /// locks, then the container's mutex and the GC share (docs/records.md,
    /// "What an operation leaves").
    pub(super) async fn locked<A, B, BF>(
        &self,
        id: &str,
        take: Take<'_>,
        body: B,
    ) -> Result<A, Error>
    where
        B: FnOnce(Loaded) -> BF,
        BF: Future<Output = Result<A, Error>>,
    {
        let body = |loaded| async move { body(loaded).await.map(Last::Answer) };
        self.locked_with_last_write(id, take, body, never_written)
            .await
    }

    /// [`Engine::locked`] for an operation whose body may end with its
    /// last record write ([`Last::Save`]): that write is made in the trip
    /// that releases the locks, so the two cost one hand-off to the
    /// blocking pool. When it fails, the locks are kept: `write_failed`
    /// runs under them (see [`WriteFailed`]), and they are released after
    /// it.
    pub(super) async fn locked_with_last_write<A, B, BF, W, WF>(
        &self,
        id: &str,
        take: Take<'_>,
        body: B,
        write_failed: W,
    ) -> Result<A, Error>
    where
        B: FnOnce(Loaded) -> BF,
        BF: Future<Output = Result<Last<A>, Error>>,
        W: FnOnce(WriteFailed<A>) -> WF,
        WF: Future<Output = Result<A, Error>>,
    {
        let (lock, loaded) = self.lock_op(id, take).await?;
        let ended = AssertUnwindSafe(async move { body(loaded).await })
            .catch_unwind()
            .await;
        let (record, answer, track) = match ended {
            Ok(Ok(Last::Save {
                record,
                answer,
                track,
            })) => (record, answer, track),
            Ok(Ok(Last::Answer(a))) => {
                self.unlock(id, lock).await;
                return Ok(a);
            }
            Ok(Err(e)) => {
                self.unlock(id, lock).await;
                return Err(e);
            }
            Err(panic) => {
                self.unlock(id, lock).await;
                std::panic::resume_unwind(panic)
            }
        };
        let tracked = track.then(|| Tracked::of(&record));
        let store = self.store.clone();
        let fault = self.fault(Step::LastWrite);
        let saved = self
            .unlock_after(id, lock, move || {
                fault?;
                store
                    .save(&record, Durability::Atomic)
                    .map_err(Error::state)
            })
            .await;
        let (error, lock) = match saved {
            Ok(()) => {
                if let Some(t) = tracked {
                    self.track(id, t);
                }
                return answer;
            }
            Err(failed) => failed,
        };
        let held = lock.is_some();
        let handled = AssertUnwindSafe(write_failed(WriteFailed {
            error,
            answer,
            held,
        }))
        .catch_unwind()
        .await;
        if let Some(lock) = lock {
            self.unlock(id, lock).await;
        }
        handled.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Takes everything an operation on container `id` holds (see
    /// [`OpLock`]), then kills the plugin groups an earlier daemon left
    /// running for it, so none of them can act after this operation's
    /// plugins. Fails ("try again later") if one of them survives; what
    /// was taken by then is released as it is dropped (nothing notes a
    /// plugin in the lock file before this returns).
    ///
    /// One trip to the blocking pool does it all, each hand-off costing
    /// CPU on every call: the check of the call's namespace (before any
    /// lock is taken, so a refused call leaves no lock file), the lock
    /// files, the marker scan, the record and what [`Take`] asks for.
    async fn lock_op(&self, id: &str, take: Take<'_>) -> Result<(OpLock<'_>, Loaded), Error> {
        let Take {
            netns,
            plugins,
            for_del,
        } = take;
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
                    ((None, None), true) => probe_unrecorded(&multus, store.as_ref(), &cid),
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
            Some(_) => self.clear_stale(id, file).await?,
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

    /// [`clear_marker`] on the blocking pool: `file`, the lock of `id`,
    /// back once the marker in it is emptied; an error ("try again
    /// later") when its group survives.
    async fn clear_stale(&self, id: &str, file: Held) -> Result<Held, Error> {
        let markers = self.markers.clone();
        let kill = self.kill_group;
        let timeout = self.config.plugin_timeout;
        let cid = id.to_string();
        let (file, cleared) = blocking(move || {
            let r = clear_marker(&markers, kill, timeout, &cid, &file);
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
        Ok(file)
    }

    /// Releases an operation's locks (for [`Engine::locked`] alone).
    async fn unlock(&self, id: &str, lock: OpLock<'_>) {
        // Nothing to write: only a trip that could not run fails.
        if let Err((e, _)) = self.unlock_after(id, lock, || Ok(())).await {
            tracing::error!(container_id = %id, cause = %e, "releasing the container's lock failed");
        }
    }

    /// Runs `work` on the blocking pool and, when it succeeds, releases
    /// the operation's locks in the same trip (see [`release_files`]):
    /// the last write of an operation and its release cost one hand-off.
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
                // Boxed: the held files make the tuple large.
                Err(e) => Err(Box::new((e, file, gc_file))),
            }
        })
        .await;
        match done {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(kept)) => {
                let (e, file, gc_file) = *kept;
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
    /// the first plugin it protects: the runner does it beside the spawn
    /// of that plugin, while the plugin starts, and gives the plugin
    /// its configuration only once it is done. [`Synced::done`] tells how
    /// it went.
    pub(super) fn save_synced_gate(&self, record: &Record) -> (Synced, Gate) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let store = self.store.clone();
        let record = record.clone();
        let fault = self.fault(Step::RecordSync);
        let work = Box::new(move || {
            let r = fault.map_err(|e| e.to_string()).and_then(|()| {
                store
                    .save(&record, Durability::Synced)
                    .map_err(|e| e.to_string())
            });
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
        self.fault(Step::RecordWrite)?;
        let store = self.store.clone();
        let record = record.clone();
        blocking(move || store.save(&record, durability))
            .await?
            .map_err(Error::state)
    }
}
