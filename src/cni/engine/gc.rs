//! GC (1.1.0+): stale attachments DELed one container at a time, then the
//! plugins' own GC, the only phase that excludes every other call.
//!
//! A plugin told to GC frees whatever its valid list does not name (an
//! IPAM plugin gives the addresses back), so that list errs on the side of
//! keeping: for every container the runtime still has, it also names the
//! interfaces a DEL without a record would use, whether or not that
//! container's record can be read (see [`valid_attachments`]).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use serde_json::{json, Value};

use super::chain::stdin_object;
use super::lock::{Loaded, Take};
use super::{blocking, Engine, Error, ErrorKind, Planned};
use crate::api::{code, Command};
use crate::cni::exec::{CallEnv, Plugin};
use crate::cni::multus_cache::CachedResult;
use crate::cni::state::{Attachment, Held, Record};
use crate::netconf::{at_least, Invocation, NetworkList};

/// The containers GC must not sweep, whatever the runtime's valid list
/// says: those its CRI lists, and, when the runtime was asked, those whose
/// record is younger than `grace` (an ADD that ended after the runtime
/// computed its list may be of a sandbox the runtime registers only once
/// its RunPodSandbox returns).
#[derive(Debug, Clone, Default)]
pub struct Live {
    pub ids: BTreeSet<String>,
    pub grace: Option<std::time::Duration>,
}

impl Live {
    /// Blocking (a record file's age).
    fn keeps(&self, store: &dyn crate::cni::backends::Records, id: &str) -> bool {
        self.ids.contains(id)
            || self
                .grace
                .is_some_and(|g| store.age(id).is_some_and(|age| age < g))
    }
}

fn is_valid(id: &str, att: &Attachment, valid: &BTreeSet<(String, String)>) -> bool {
    let listed = |ifname: &str| valid.contains(&(id.to_string(), ifname.to_string()));
    listed(&att.ifname) || att.hot_plugged_into.as_deref().is_some_and(listed)
}

impl Engine {
    /// [`Engine::gc_with`] with no configured networks to fall back to:
    /// the plugins' valid lists name only what records and multus's
    /// caches name.
    pub async fn gc(
        &self,
        valid: &BTreeSet<(String, String)>,
        lists: &[NetworkList],
    ) -> Result<(), Error> {
        let none = |_: String| async { Ok::<_, Error>(Vec::new()) };
        self.gc_with(valid, lists, none).await
    }

    /// GC: DELs every recorded attachment whose (container id, ifname) is
    /// not in `valid`, then sends GC to the plugins of `lists` that speak
    /// 1.1.0 with the attachments still recorded and, for every container
    /// `valid` names, the interfaces of the networks `fallback` plans for
    /// each of its listed interfaces: what a DEL without a record runs
    /// (see [`Engine::del`]), asked once per interface name, and only when
    /// some plugin is to get GC. Errors are collected.
    ///
    /// The sweep locks one container at a time, only while its stale
    /// attachments are deleted: calls for other containers go on meanwhile.
    pub async fn gc_with<F, Fut>(
        &self,
        valid: &BTreeSet<(String, String)>,
        lists: &[NetworkList],
        fallback: F,
    ) -> Result<(), Error>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<Vec<Planned>, Error>>,
    {
        self.gc_keeping(valid, &Live::default(), lists, fallback)
            .await
    }

    /// [`Engine::gc_with`] that never sweeps the containers `live` keeps
    /// (see [`Live`]), whatever `valid` says: a runtime's valid list is
    /// computed before its GC call, so a container whose ADD ended in
    /// between is missing from it, yet alive. Their attachments stay
    /// recorded, and so are valid to the plugins' GC too.
    pub async fn gc_keeping<F, Fut>(
        &self,
        valid: &BTreeSet<(String, String)>,
        live: &Live,
        lists: &[NetworkList],
        fallback: F,
    ) -> Result<(), Error>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<Vec<Planned>, Error>>,
    {
        let store = self.store.clone();
        let ids = blocking(move || store.list())
            .await?
            .map_err(Error::state)?;
        let mut errors = Vec::new();
        // Stale attachments whose DEL failed: the plugins' GC may free them.
        let mut failed = BTreeSet::new();
        let store = self.store.clone();
        let live = live.clone();
        let (ids, live): (Vec<String>, Vec<String>) =
            blocking(move || ids.into_iter().partition(|id| !live.keeps(&*store, id))).await?;
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
            let swept = self
                .locked(&id, Take::own(), |loaded| async {
                    Ok(self.gc_container(&id, loaded, valid, &mut failed).await)
                })
                .await;
            match swept {
                Ok(errs) => errors.extend(errs),
                Err(e) => errors.push(e),
            }
        }
        // DELs that failed before: retried by the retry task within a
        // tick, whether due or not.
        self.all_due_now();
        // The containers multus attached, the same way.
        let mut multus_failed = BTreeSet::new();
        let mut multus_valid = valid.clone();
        multus_valid.extend(live.into_iter().map(|id| (id, String::new())));
        errors.extend(self.gc_multus(&multus_valid, &mut multus_failed).await);
        let kept = Kept {
            failed: &failed,
            multus_failed: &multus_failed,
        };
        errors.extend(self.gc_plugins(lists, valid, &fallback, kept).await);
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
            // A DEL that failed before is retried below, as plexusd's own
            // retries do it (the namespace only while it is the same).
            .filter(|a| !is_valid(id, a, valid) && a.cleanup.is_none())
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

    /// This daemon's GC lock, exclusively, once no operation holds a share
    /// of it, without keeping new operations from taking one meanwhile;
    /// `None` if that moment did not come within `pluginTimeout`.
    async fn gc_exclusive(&self) -> Option<tokio::sync::RwLockWriteGuard<'_, ()>> {
        let deadline = tokio::time::Instant::now() + self.config.plugin_timeout;
        let mut waited = false;
        loop {
            // Registered before the try, so a release in between wakes it.
            let released = self.gc_released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Ok(g) = self.gc_lock.try_write() {
                return Some(g);
            }
            if !waited {
                tracing::debug!("GC: the plugins' GC waits for the CNI calls in progress");
                waited = true;
            }
            tokio::time::timeout_at(deadline, released).await.ok()?;
        }
    }

    /// The last phase of GC: sends GC to every plugin of `lists` that
    /// speaks 1.1.0, with the valid attachments [`valid_attachments`]
    /// lists for its network (`live` from the runtime's `valid` and
    /// `fallback`, see [`Engine::gc_with`]).
    async fn gc_plugins<F, Fut>(
        &self,
        lists: &[NetworkList],
        valid: &BTreeSet<(String, String)>,
        fallback: &F,
        kept: Kept<'_>,
    ) -> Vec<Error>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<Vec<Planned>, Error>>,
    {
        // Worked out before the exclusive lock: VERSION runs may be slow,
        // and with no plugin to run, nothing is locked at all.
        let (work, mut errors) = self.gc_work(lists).await;
        if work.is_empty() {
            return errors;
        }
        // Before the lock too: planning may load network configs. Without
        // it, a live container whose record is damaged would lose its
        // addresses: no GC rather than that one.
        let live = match live_attachments(valid, fallback).await {
            Ok(live) => live,
            Err(e) => {
                errors.push(Error::new(
                    e.kind,
                    e.code,
                    format!(
                        "GC: the plugins' GC did not run: the networks a DEL without a record \
                         would run cannot be planned: {}",
                        e.msg
                    ),
                ));
                return errors;
            }
        };
        // Exclusive, and only around this phase. A plugin told to GC frees
        // whatever is missing from the valid list, so the list must hold
        // every attachment whose ADD has started: otherwise an ADD running
        // now could lose the address it just reserved. Every operation
        // holds gc_lock (this daemon) and .gc.lock (any daemon on this
        // stateDir) shared from before it records its attachment until its
        // plugins are done; holding both exclusively, no ADD runs, and each
        // one that ran is in the records read below.
        //
        // Taken without queueing for it: a queued writer makes every new
        // operation wait behind it, so an ADD whose plugin hangs would
        // hold up every pod of the node until `pluginTimeout`. GC waits
        // for a moment when no operation runs instead, at most
        // `pluginTimeout` (by which any plugin running now has ended);
        // past it, the plugins' GC is left to the runtime's next one.
        let Some(_gc) = self.gc_exclusive().await else {
            errors.push(Error::new(
                ErrorKind::Failed,
                code::TRY_AGAIN_LATER,
                format!(
                    "GC: the plugins' GC did not run: CNI calls kept running for {} (it needs a \
                     moment without any); the next GC runs it",
                    crate::duration::format(self.config.plugin_timeout)
                ),
            ));
            return errors;
        };
        let (_gc_file, records, multus_cached) = match self.gc_listing().await {
            Ok(listed) => listed,
            Err(e) => {
                errors.push(e);
                return errors;
            }
        };
        let env = CallEnv {
            command: Command::Gc.as_str(),
            ..CallEnv::default()
        };
        let none = BTreeSet::new();
        for (list, plugins) in work {
            let listed = Listed {
                records: &records,
                multus_cached: &multus_cached,
                live: live.get(&list.name).unwrap_or(&none),
            };
            let valid = Value::Array(valid_attachments(list, &listed, kept));
            for (i, plugin, version) in plugins {
                let mut stdin = stdin_object(list, i, &version);
                stdin.insert("cni.dev/valid-attachments".into(), valid.clone());
                stdin.insert("cni.dev/attachments".into(), valid.clone());
                let stdin = serde_json::to_vec(&Value::Object(stdin)).unwrap_or_default();
                if let Err(e) = self.runner.run(&plugin, &env, stdin).await {
                    errors.push(Error::plugin(Command::Gc, &list.name, e));
                }
            }
        }
        errors
    }

    /// The plugins of `lists` that get GC: those speaking 1.1.0 of each
    /// list at 1.1.0 that does not disable GC, each with its index in its
    /// list and the version it runs at; and the errors of the lists whose
    /// plugins could not be located.
    async fn gc_work<'l>(&self, lists: &'l [NetworkList]) -> (Vec<GcWork<'l>>, Vec<Error>) {
        let mut work = Vec::new();
        let mut errors = Vec::new();
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
        (work, errors)
    }

    /// Under this daemon's GC lock held exclusively: `.gc.lock`, taken
    /// exclusively too and handed back held, every record that can be
    /// read and every attachment in multus's result cache. Not one cache
    /// may be missed: a plugin frees what is not listed.
    async fn gc_listing(&self) -> Result<(Held, Vec<Record>, Vec<CachedResult>), Error> {
        let locks = self.locks.clone();
        let store = self.store.clone();
        let multus = self.multus.clone();
        blocking(move || -> Result<_, Error> {
            let gc_file = locks.gc_exclusive().map_err(Error::state)?;
            let mut records = Vec::new();
            for id in store.list().map_err(Error::state)? {
                // A damaged record names nothing that could be kept.
                if let Ok(Some(r)) = store.load(&id) {
                    records.push(r);
                }
            }
            let cached = multus.results().map_err(Error::state)?;
            Ok((gc_file, records, cached))
        })
        .await?
    }
}

/// A network list whose plugins get GC, and those plugins (see
/// [`Engine::gc_work`]).
type GcWork<'l> = (&'l NetworkList, Vec<(usize, Plugin, String)>);

/// What GC keeps out of the plugins' valid lists: the stale attachments
/// whose DEL `failed` and the multus containers whose DEL failed
/// (`multus_failed`), which the plugins' GC may free instead.
#[derive(Clone, Copy)]
struct Kept<'a> {
    failed: &'a BTreeSet<(String, String)>,
    multus_failed: &'a BTreeSet<String>,
}

/// What the plugins' valid lists are made of (see [`valid_attachments`]).
struct Listed<'a> {
    /// Every record that could be read.
    records: &'a [Record],
    /// Every attachment in multus's result cache.
    multus_cached: &'a [CachedResult],
    /// The (container id, ifname) of the network's interfaces a DEL
    /// without a record would use, for every container the runtime has.
    live: &'a BTreeSet<(String, String)>,
}

/// By network name, the (container id, ifname) a DEL without a record
/// would use for each container of the runtime's `valid` list: the
/// networks `fallback` plans for each listed interface name (asked once
/// per name: they depend on the name alone).
async fn live_attachments<F, Fut>(
    valid: &BTreeSet<(String, String)>,
    fallback: &F,
) -> Result<BTreeMap<String, BTreeSet<(String, String)>>, Error>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Vec<Planned>, Error>>,
{
    let mut by_ifname: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (id, ifname) in valid {
        by_ifname.entry(ifname).or_default().push(id);
    }
    let mut live: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (ifname, ids) in by_ifname {
        for p in fallback(ifname.to_string()).await? {
            let set = live.entry(p.list.name).or_default();
            set.extend(ids.iter().map(|id| (id.to_string(), p.ifname.clone())));
        }
    }
    Ok(live)
}

/// The valid attachments of network `list` for its plugins' GC, each once:
/// every attachment of the readable records with a network of that name,
/// but the stale ones whose DEL failed; every one multus cached for it,
/// but those of the containers whose DEL failed; and every one `live`
/// names. Always a list, empty when there is none (the CNI spec's
/// `cni.dev/valid-attachments` is an array).
///
/// `live` is what keeps a running container's addresses when its record
/// cannot be read (a crash or a disk fault damaged it, now or before, and
/// it was moved aside): its interfaces are the ones a DEL without a
/// record would use, which is also where that DEL frees them later. They
/// are listed even when a stale attachment of the same name failed its
/// DEL: the runtime still has the container, and freeing an address in
/// use hands it to the next pod. Listing more than a container holds
/// costs nothing, since a plugin keeps only what it has; listing a live
/// container's interface it does not hold keeps nothing of another's.
///
/// A damaged record of a stale container (one the runtime no longer
/// lists) names nothing that could be listed, and nothing should be: the
/// runtime no longer has the container, so whatever its plugins still
/// hold for it is a leak the plugins' GC is right to free.
fn valid_attachments(list: &NetworkList, listed: &Listed<'_>, kept: Kept<'_>) -> Vec<Value> {
    let recorded = listed.records.iter().flat_map(|r| {
        r.attachments
            .iter()
            .filter(|a| {
                !kept
                    .failed
                    .contains(&(r.container_id.clone(), a.ifname.clone()))
            })
            .flat_map(|a| a.delegates.iter())
            .filter(|d| d.name == list.name)
            .map(|d| (r.container_id.as_str(), d.ifname.as_str()))
    });
    let cached = listed
        .multus_cached
        .iter()
        .filter(|c| c.network == list.name && !kept.multus_failed.contains(&c.container_id))
        .map(|c| (c.container_id.as_str(), c.ifname.as_str()));
    let live = listed.live.iter().map(|(c, i)| (c.as_str(), i.as_str()));
    let mut seen = BTreeSet::new();
    recorded
        .chain(cached)
        .chain(live)
        .filter(|pair| seen.insert(*pair))
        .map(|(id, ifname)| json!({"containerID": id, "ifname": ifname}))
        .collect()
}
