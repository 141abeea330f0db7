//! DEL, CHECK and GC of the containers multus attached, from its caches
//! ([`crate::cni::multus_cache`]), always under the container's locks, with
//! the file work on the blocking pool; a damaged cache is moved aside next
//! to the container's damaged records.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::fault::Step;
use super::lock::{Multus, Take};
use super::{blocking, Engine, ErrorKind};
use crate::api::{code, Command};
use crate::cni::exec::CallEnv;
use crate::cni::multus_cache::{CachedDelegate, CachedResult, Caches, Error};
use crate::cni::state::{self, Store};
use crate::device_info;
use crate::netconf::Invocation;

/// Where a damaged cache goes when `<stateDir>` is on another file system
/// than `cniDir` (a rename cannot cross it): `<cniDir>/.plexus-damaged/<id>/`.
/// Its name starts with a dot, so it is no container's delegate cache.
const DAMAGED_HERE: &str = ".plexus-damaged";

/// Moves the damaged cache `e` names aside, next to the container's damaged
/// records (`<stateDir>/attachments/damaged/<id>/<unix time>.multus-<file>`),
/// and logs where it went. Blocking; the caller holds the container's lock.
fn set_aside(
    state_dir: &Path,
    caches: &Caches,
    container_id: &str,
    e: &Error,
) -> Result<PathBuf, super::Error> {
    let from = e.path();
    let file = from
        .strip_prefix(caches.dir())
        .unwrap_or(from)
        .to_string_lossy()
        .replace('/', "-");
    let suffix = format!(".multus-{file}");
    let moved = match Store::at(state_dir).set_aside_file(container_id, from, &suffix) {
        Err(state::Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EXDEV) => {
            // The damaged/<id>/ directory exists now, which is what makes
            // later DELs fall back; the file stays on its file system.
            let here = caches.dir().join(DAMAGED_HERE).join(container_id);
            state::move_aside(from, &here, &suffix)
        }
        other => other,
    }
    .map_err(super::Error::state)?;
    tracing::error!(container_id, cause = %e, moved_to = %moved.display(), "damaged multus cache moved aside");
    Ok(moved)
}

impl Engine {
    /// multus's delegate cache of `id` (the caller holds its lock); a
    /// damaged one is moved aside.
    pub(super) async fn load_multus(&self, id: &str) -> Result<Multus, super::Error> {
        self.fault(Step::MultusLoad)?;
        let caches = self.multus.clone();
        let state_dir = self.config.state_dir.clone();
        let cid = id.to_string();
        blocking(move || match caches.load(&cid) {
            Ok(Some(d)) => Ok(Multus::Delegates(d)),
            Ok(None) => Ok(Multus::Nothing),
            Err(e) if e.is_damaged() => {
                set_aside(&state_dir, &caches, &cid, &e)?;
                Ok(Multus::SetAside)
            }
            Err(e) => Err(super::Error::state(e)),
        })
        .await?
    }

    /// libcni's cached ADD of delegate `d` on `ifname` of `id`; a damaged
    /// one is moved aside and the delegate goes on without it.
    async fn multus_result(
        &self,
        id: &str,
        d: &CachedDelegate,
        ifname: &str,
    ) -> Result<Option<CachedResult>, super::Error> {
        self.fault(Step::MultusResult)?;
        let caches = self.multus.clone();
        let state_dir = self.config.state_dir.clone();
        let (cid, network, ifname) = (id.to_string(), d.network.clone(), ifname.to_string());
        blocking(move || match caches.load_result(&network, &cid, &ifname) {
            Ok(r) => Ok(r),
            Err(e) if e.is_damaged() => {
                set_aside(&state_dir, &caches, &cid, &e)?;
                Ok(None)
            }
            Err(e) => Err(super::Error::state(e)),
        })
        .await?
    }

    async fn remove_multus(&self, path: PathBuf) -> Result<(), super::Error> {
        let caches = self.multus.clone();
        blocking(move || caches.remove(&path))
            .await?
            .map_err(super::Error::state)
    }

    /// After a DEL of `id` that fell back to the configured networks and
    /// succeeded: removes the result caches libcni kept for it (see
    /// [`Caches::results_of`]; `known`: the `(network, ifname)` pairs the
    /// fallback ran), so that the plugins' GC stops listing them as
    /// valid; damaged ones are moved aside. Every file is tried; the
    /// errors are joined. The caller holds the container's lock.
    pub(super) async fn remove_multus_results(
        &self,
        id: &str,
        known: Vec<(String, String)>,
    ) -> Result<(), super::Error> {
        let caches = self.multus.clone();
        let state_dir = self.config.state_dir.clone();
        let cid = id.to_string();
        let errors = blocking(move || {
            let found = match caches.results_of(&cid, &known) {
                Ok(f) => f,
                Err(e) => return vec![super::Error::state(e)],
            };
            let mut errors = Vec::new();
            for r in found {
                let done = match r {
                    Ok(r) => caches.remove(&r.path).map_err(super::Error::state).map(|()| {
                        tracing::info!(container_id = %cid, file = %r.path.display(), "multus's result cache of a container whose DEL fell back removed");
                    }),
                    Err(e) if e.is_damaged() => set_aside(&state_dir, &caches, &cid, &e).map(|_| ()),
                    Err(e) => Err(super::Error::state(e)),
                };
                if let Err(e) = done {
                    errors.push(e);
                }
            }
            errors
        })
        .await?;
        match errors.len() {
            0 => Ok(()),
            _ => Err(super::Error::join(
                Command::Del,
                &format!("the multus result caches of container {id:?}"),
                errors,
            )),
        }
    }

    /// The device-info files of delegate `d` at `index` on `ifname`, which
    /// multus's DEL removes: `<dir>/cni/<multus name>-<id>_<ifname>` when
    /// the delegate has a device ID (the selection element's, which multus
    /// never gives the primary, else the call's `deviceID`), else the
    /// call's `CNIDeviceInfoFile`; and the one libcni cached with the
    /// ADD's capability arguments when that is another. Only paths
    /// directly in the device-info directory's `cni/`.
    fn multus_device_info(
        &self,
        id: &str,
        index: usize,
        d: &CachedDelegate,
        ifname: &str,
        call: &Map<String, Value>,
        cached: Option<&CachedResult>,
    ) -> Vec<PathBuf> {
        let dir = &self.config.device_info_dir;
        let named = |caps: &Map<String, Value>| {
            caps.get("CNIDeviceInfoFile")
                .and_then(Value::as_str)
                .filter(|f| !f.is_empty())
                .map(PathBuf::from)
        };
        let device_id = d
            .device_id()
            .filter(|_| index > 0)
            .or_else(|| call.get("deviceID").and_then(Value::as_str))
            .filter(|id| !id.is_empty());
        let mut files: Vec<PathBuf> = match device_id {
            Some(_) => vec![device_info::cni_file(dir, &d.name, id, ifname)],
            None => named(call).into_iter().collect(),
        };
        if let Some(f) = cached
            .and_then(|c| c.capability_args.as_ref())
            .and_then(named)
        {
            if !files.contains(&f) {
                files.push(f);
            }
        }
        files.retain(|f| device_info::is_cni_file(dir, f));
        files
    }

    /// DEL of a container multus attached, as multus's DEL: every delegate
    /// in reverse order, past errors, with the configuration multus ran,
    /// libcni's cached result as prevResult (0.4.0 on) and the cached
    /// `CNI_ARGS` and capability arguments (else the call's `CNI_ARGS` and
    /// `cap_args` with the delegate's requests). A delegate whose DEL
    /// succeeded loses its device-info file (as in multus) and its result
    /// cache file (as in libcni); the delegate cache goes once every
    /// delegate succeeded, and stays otherwise, for the runtime's next
    /// DEL. The caller holds the container's lock.
    pub(super) async fn del_multus(
        &self,
        inv: &Invocation,
        netns: &str,
        primary_ifname: &str,
        delegates: &[CachedDelegate],
        cap_args: &Map<String, Value>,
    ) -> Result<(), super::Error> {
        let id = &inv.container_id;
        let mut errors = Vec::new();
        for (i, d) in delegates.iter().enumerate().rev() {
            let ifname = d.ifname(i, primary_ifname);
            let cached = match self.multus_result(id, d, &ifname).await {
                Ok(c) => c,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let list = match d.list(cached.as_ref().and_then(|c| c.config_version.as_deref())) {
                Ok(l) => l,
                Err(e) => {
                    errors.push(super::Error::config(e));
                    continue;
                }
            };
            let env = CallEnv {
                command: Command::Del.as_str(),
                container_id: id.clone(),
                netns: netns.to_string(),
                ifname: ifname.clone(),
                args: cached
                    .as_ref()
                    .and_then(|c| c.cni_args.clone())
                    .unwrap_or_else(|| inv.args.clone()),
            };
            let caps = cached
                .as_ref()
                .and_then(|c| c.capability_args.clone())
                .unwrap_or_else(|| d.capability_args(cap_args));
            let prev = cached.as_ref().and_then(|c| c.result.as_ref());
            let errs = self.del_chain(&list, &env, &caps, prev, &[]).await;
            if !errs.is_empty() {
                errors.extend(errs);
                continue;
            }
            for file in self.multus_device_info(id, i, d, &ifname, cap_args, cached.as_ref()) {
                self.remove_device_info_file(file).await;
            }
            if let Some(c) = cached {
                if let Err(e) = self.remove_multus(c.path).await {
                    errors.push(e);
                }
            }
        }
        if !errors.is_empty() {
            tracing::warn!(container_id = %id, "DEL of a container multus attached failed; its multus caches stay for the next DEL");
            return Err(super::Error::join(
                Command::Del,
                &format!("container {id:?} (attached by multus)"),
                errors,
            ));
        }
        self.remove_multus(self.multus.delegates_path(id)).await
    }

    /// CHECK of a container multus attached: every delegate in multus's
    /// order, with libcni's cached result; the first failure is returned.
    pub(super) async fn check_multus(
        &self,
        inv: &Invocation,
        delegates: &[CachedDelegate],
    ) -> Result<(), super::Error> {
        let id = &inv.container_id;
        for (i, d) in delegates.iter().enumerate() {
            let ifname = d.ifname(i, &inv.ifname);
            let Some(cached) = self.multus_result(id, d, &ifname).await? else {
                return Err(super::Error::new(
                    ErrorKind::Failed,
                    code::UNKNOWN_CONTAINER,
                    format!(
                        "network {:?} of container {id:?} on {ifname:?}: multus's result cache {} is missing; CHECK needs the result of the ADD",
                        d.network,
                        self.multus.result_path(&d.network, id, &ifname).display()
                    ),
                ));
            };
            let list = d
                .list(cached.config_version.as_deref())
                .map_err(super::Error::config)?;
            let env = CallEnv {
                command: Command::Check.as_str(),
                container_id: id.clone(),
                netns: inv.netns.clone(),
                ifname,
                args: cached.cni_args.clone().unwrap_or_else(|| inv.args.clone()),
            };
            let caps = cached
                .capability_args
                .clone()
                .unwrap_or_else(|| d.capability_args(&Map::new()));
            self.check_network(&list, &env, cached.result.as_ref(), &caps)
                .await?;
        }
        Ok(())
    }

    /// GC's sweep of the containers multus attached: each one with no
    /// attachment in `valid` is locked and DELed from its caches (in the
    /// namespace libcni cached, checked first), as a stale record would
    /// be. The ones whose DEL failed go into `failed`.
    pub(super) async fn gc_multus(
        &self,
        valid: &BTreeSet<(String, String)>,
        failed: &mut BTreeSet<String>,
    ) -> Vec<super::Error> {
        let caches = self.multus.clone();
        let listed = blocking(move || -> Result<_, Error> {
            let ids = caches.containers()?;
            let results = if ids.is_empty() {
                Vec::new()
            } else {
                caches.results()?
            };
            Ok((ids, results))
        })
        .await;
        let (ids, results) = match listed {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return vec![super::Error::state(e)],
            Err(e) => return vec![e],
        };
        // A container is valid as a whole: multus's delegates all hang on
        // the runtime's one attachment, whatever its interface name.
        let valid_ids: BTreeSet<&str> = valid.iter().map(|(c, _)| c.as_str()).collect();
        let mut errors = Vec::new();
        for id in ids.iter().filter(|id| !valid_ids.contains(id.as_str())) {
            let swept = self
                .locked(id, Take::own(), |_own| async {
                    if let Err(e) = self.gc_multus_container(id, &results).await {
                        failed.insert(id.clone());
                        errors.push(e);
                    }
                    Ok(())
                })
                .await;
            if let Err(e) = swept {
                errors.push(e);
            }
        }
        errors
    }

    /// DELs stale container `id` from multus's caches; `results` is
    /// libcni's result cache as listed before the lock was taken (for the
    /// runtime's interface name and the namespace only). Locked by the
    /// caller.
    async fn gc_multus_container(
        &self,
        id: &str,
        results: &[CachedResult],
    ) -> Result<(), super::Error> {
        let delegates = match self.load_multus(id).await? {
            Multus::Delegates(d) => d,
            Multus::Nothing | Multus::SetAside => return Ok(()),
        };
        let mine: Vec<&CachedResult> = results.iter().filter(|r| r.container_id == id).collect();
        let primary_ifname = delegates
            .first()
            .and_then(|p| mine.iter().find(|r| r.network == p.network))
            .filter(|_| delegates.first().is_some_and(|p| p.takes_call_ifname(0)))
            .map(|r| r.ifname.clone())
            .unwrap_or_else(|| "eth0".to_string());
        let netns = mine
            .iter()
            .map(|r| r.netns.clone())
            .find(|n| !n.is_empty())
            .unwrap_or_default();
        // The cached namespace may be gone, but must not be the host's.
        self.check_netns(Command::Del, &netns).await?;
        tracing::info!(container_id = %id, ifname = %primary_ifname, "GC: deleting a stale container multus attached");
        let inv = Invocation {
            command: Command::Del,
            container_id: id.to_string(),
            netns: netns.clone(),
            ifname: primary_ifname.clone(),
            args: String::new(),
            arg_pairs: Vec::new(),
        };
        self.del_multus(&inv, &netns, &primary_ifname, &delegates, &Map::new())
            .await
    }
}
