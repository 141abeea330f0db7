//! DEL: every recorded network of the attachment in reverse order, from
//! the record alone; without a record, multus's caches or the configured
//! networks. Every error is collected and the DEL goes on.

use std::future::Future;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::chain::{declared_capabilities, recorded_list};
use super::cleanup::FailedDel;
use super::fault::Step;
use super::lock::{Last, Loaded, Multus, Take, Unrecorded};
use super::{blocking, Engine, Error, Planned};
use crate::api::Command;
use crate::cni::exec::Plugin;
use crate::cni::state::{Attachment, Delegate, Durability, Record, State};
use crate::netconf::Invocation;

impl Engine {
    /// DEL of one recorded network of attachment `att`, with the network
    /// config it was added with and `prev` as prevResult; the errors.
    pub(super) async fn del_recorded(
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
        let mut errors = self.del_chain(&list, &env, cap_args, prev, found).await;
        if let Err(e) = self.fault(Step::DelNetwork) {
            errors.push(e);
        }
        if errors.is_empty() {
            self.remove_device_info(cap_args).await;
        }
        errors
    }

    /// After a network's DEL: its device-info file (the
    /// `CNIDeviceInfoFile` capability argument), when that names a
    /// regular file directly in the device-info directory's `cni/`; any
    /// other path is left alone.
    async fn remove_device_info(&self, cap_args: &Map<String, Value>) {
        let Some(file) = cap_args.get("CNIDeviceInfoFile").and_then(Value::as_str) else {
            return;
        };
        let path = PathBuf::from(file);
        if crate::device_info::is_cni_file(&self.config.device_info_dir, &path) {
            self.remove_device_info_file(path).await;
        }
    }

    /// Removes device-info file `path` (see
    /// [`crate::device_info::remove_cni_file`]); what cannot be removed
    /// is logged, never an error of the DEL.
    pub(super) async fn remove_device_info_file(&self, path: PathBuf) {
        let dir = self.config.device_info_dir.clone();
        let file = path.clone();
        let removed = blocking(move || crate::device_info::remove_cni_file(&dir, &file)).await;
        match removed {
            Ok(Ok(crate::device_info::Removed::Removed)) => {
                tracing::debug!(file = %path.display(), "device-info file removed")
            }
            Ok(Ok(crate::device_info::Removed::Missing)) => {}
            Ok(Ok(crate::device_info::Removed::LeftAlone(why))) => {
                tracing::warn!(file = %path.display(), why, "a device-info file is left alone")
            }
            Ok(Err(e)) => {
                tracing::warn!(file = %path.display(), cause = %e, "cannot remove a device-info file")
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), cause = %e, "cannot remove a device-info file")
            }
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
        self.del_shown(inv, cap_args, fallback).await.map(|_| ())
    }

    /// [`Engine::del`], answering with the container's record as it was
    /// found under the lock, before the DEL ([`crate::cni::show::summary`]):
    /// what the DEL removed, for the call's log line; `None` when nothing
    /// of plexusd's was recorded (a container multus attached, or none).
    pub async fn del_shown<F, Fut>(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        fallback: F,
    ) -> Result<Option<Value>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Planned>, Error>>,
    {
        let take = Take::call(Command::Del, &inv.netns).for_del();
        self.locked_with_last_write(
            &inv.container_id,
            take,
            |loaded| self.del_locked(inv, cap_args, fallback, loaded),
            // A failed write of what is left of the record is the DEL's
            // error, unless a plugin failed already: then the old record
            // stays (it names more than is left, which the next DEL runs
            // again; DEL is idempotent) and the plugin's error is the one
            // to report, the write's is logged (on a full disk, it is this
            // one).
            |failed| async move {
                match failed.answer {
                    Ok(_) => Err(failed.error),
                    Err(first) => {
                        tracing::warn!(container_id = %inv.container_id, cause = %failed.error, "cannot write what is left of the record after a failed DEL; the record stays as it was");
                        Err(first)
                    }
                }
            },
        )
        .await
    }

    /// [`Engine::del`] under the container's lock: the record to write
    /// last, when the DEL changed it.
    async fn del_locked<F, Fut>(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        fallback: F,
        loaded: Loaded,
    ) -> Result<Last<Option<Value>>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Planned>, Error>>,
    {
        let had_failed = loaded.record.as_ref().is_some_and(|r| {
            r.attachments
                .iter()
                .any(|a| a.ifname == inv.ifname && a.cleanup.is_some())
        });
        let mut record = loaded
            .record
            .unwrap_or_else(|| Record::new(&inv.container_id));
        let hot_plugged = record.hot_plugged(&inv.ifname);
        let shown = (!record.attachments.is_empty()).then(|| crate::cni::show::summary(&record));
        if record.attachment(&inv.ifname).is_none() && hot_plugged.is_empty() {
            let unrecorded = match loaded.unrecorded {
                Some(u) => u,
                None => self.load_unrecorded(&inv.container_id).await?,
            };
            let lost = loaded.set_aside || unrecorded.was_set_aside;
            match self
                .del_unrecorded(inv, &cap_args, unrecorded.multus, lost)
                .await
            {
                NotRecorded::Done(out) => return out.map(|()| Last::Answer(None)),
                NotRecorded::FallBack => {
                    let planned = fallback().await?;
                    record
                        .attachments
                        .push(fallback_attachment(inv, cap_args, planned));
                }
            }
        }
        let mut out = self
            .del_with_hot_plugged(inv, &hot_plugged, &mut record, &loaded.found)
            .await;
        if let Err(e) = &out {
            if self.hand_over(inv, &mut record, e).await {
                out = Ok(());
            }
        } else if had_failed {
            tracing::info!(container_id = %inv.container_id, ifname = %inv.ifname, "a DEL that had failed has now succeeded");
            self.count("done");
        }
        Ok(Last::Save {
            record,
            answer: out.map(|()| shown),
            track: true,
        })
    }

    /// What a DEL finds of container `id` when nothing is recorded for
    /// its interface and nothing was read as its locks were taken (see
    /// [`Take::for_del`]): multus's delegate cache (a damaged one is
    /// moved aside) and whether a record of it was ever set aside.
    async fn load_unrecorded(&self, id: &str) -> Result<Unrecorded, Error> {
        self.fault(Step::Unrecorded)?;
        let multus = self.load_multus(id).await?;
        let was_set_aside = match multus {
            Multus::SetAside => true,
            _ => {
                let store = self.store.clone();
                let cid = id.to_string();
                blocking(move || store.was_set_aside(&cid)).await?
            }
        };
        Ok(Unrecorded {
            multus,
            was_set_aside,
        })
    }

    /// The DEL of an interface nothing is recorded for: multus's networks
    /// when it attached the container before plexusd took over; else,
    /// when the container's record was `lost` (damaged, now or before),
    /// the configured networks; else nothing.
    async fn del_unrecorded(
        &self,
        inv: &Invocation,
        cap_args: &Map<String, Value>,
        multus: Multus,
        lost: bool,
    ) -> NotRecorded {
        if let Multus::Delegates(delegates) = &multus {
            tracing::info!(container_id = %inv.container_id, ifname = %inv.ifname, networks = delegates.len(), "no record of its own: DEL runs the networks multus cached for the container");
            let out = self
                .del_multus(inv, &inv.netns, &inv.ifname, delegates, cap_args)
                .await;
            return NotRecorded::Done(out);
        }
        if lost || matches!(multus, Multus::SetAside) {
            NotRecorded::FallBack
        } else {
            NotRecorded::Done(Ok(()))
        }
    }

    /// The DEL of attachment `inv.ifname` of `record` and, first, of the
    /// networks hot-plugged into it, newest first, as a DEL undoes an ADD:
    /// nothing of them may outlive the pod. Every error is collected.
    async fn del_with_hot_plugged(
        &self,
        inv: &Invocation,
        hot_plugged: &[String],
        record: &mut Record,
        found: &[Plugin],
    ) -> Result<(), Error> {
        let mut errors = Vec::new();
        for ifname in hot_plugged.iter().rev() {
            let one = Invocation {
                ifname: ifname.clone(),
                ..inv.clone()
            };
            if let Err(e) = self
                .del_attachment_unsaved(&one, &inv.netns, record, found)
                .await
            {
                errors.push(e);
            }
        }
        if let Err(e) = self
            .del_attachment_unsaved(inv, &inv.netns, record, found)
            .await
        {
            errors.push(e);
        }
        match errors.len() {
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
        }
    }

    /// Notes the failed DEL `e` in every attachment of `record` it left
    /// (the call's, and networks hot-plugged into it); whether the runtime
    /// is to be answered with success, because it has been told of the
    /// failure often enough and plexusd retries alone from now on.
    async fn hand_over(&self, inv: &Invocation, record: &mut Record, e: &Error) -> bool {
        let text = e.to_string();
        let mut left = 0;
        let mut handed_over = 0;
        for a in record.attachments.iter_mut().filter(|a| {
            a.ifname == inv.ifname || a.hot_plugged_into.as_deref() == Some(inv.ifname.as_str())
        }) {
            left += 1;
            if self.note_failure(a, &text, FailedDel::Runtime).await {
                handed_over += 1;
            }
        }
        if left == 0 || handed_over < left {
            return false;
        }
        let failures = record
            .attachment(&inv.ifname)
            .and_then(|a| a.cleanup.as_ref())
            .map_or(0, |c| c.failures);
        tracing::warn!(container_id = %inv.container_id, ifname = %inv.ifname, failures, cause = %text, "DEL failed again: answered with success so that the runtime can let the container go; plexusd keeps what is left and retries it on its own");
        true
    }

    /// DELs attachment `inv.ifname` of `record` (which must hold it) and
    /// saves what is left of the record: the networks whose DEL failed.
    pub(super) async fn del_attachment(
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
    pub(super) async fn del_attachment_unsaved(
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
        // Whatever libcni cached for the container at multus's ADDs goes
        // once a fallback's networks are all DELed: the delegate cache that
        // named those networks is gone or damaged, and the plugins' GC
        // would otherwise keep listing them as valid.
        if att.fell_back && errors.is_empty() {
            let known = att
                .delegates
                .iter()
                .map(|d| (d.name.clone(), d.ifname.clone()))
                .collect();
            if let Err(e) = self.remove_multus_results(&inv.container_id, known).await {
                errors.push(e);
            }
        }
        left.reverse();
        if let Some(a) = record.attachment_mut(&inv.ifname) {
            a.delegates = left;
        }
        record.attachments.retain(|a| !a.delegates.is_empty());
        Error::dels_ok(&inv, errors)
    }
}

/// What the DEL of an interface nothing is recorded for does.
enum NotRecorded {
    /// This, and nothing else: multus's networks were DELed, or there is
    /// nothing to DEL.
    Done(Result<(), Error>),
    /// The container's record was lost: the configured networks are DELed.
    FallBack,
}

/// The configured networks a DEL falls back to, `planned`, recorded like
/// an ADD that was cut short, so that whatever fails stays recorded for
/// the next DEL.
fn fallback_attachment(
    inv: &Invocation,
    cap_args: Map<String, Value>,
    planned: Vec<Planned>,
) -> Attachment {
    let names: Vec<&str> = planned.iter().map(|p| p.list.name.as_str()).collect();
    tracing::warn!(container_id = %inv.container_id, ifname = %inv.ifname, networks = ?names, "the container's record was damaged: DEL runs the configured networks");
    let cap_args = declared_capabilities(planned.iter().map(|p| &p.list), cap_args);
    Attachment {
        fell_back: true,
        hot_plugged_into: None,
        cleanup: None,
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
    }
}
