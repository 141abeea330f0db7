//! DEL: every recorded network of the attachment in reverse order, from
//! the record alone; without a record, multus's caches or the configured
//! networks. Every error is collected and the DEL goes on.

use std::future::Future;
use std::path::PathBuf;

use serde_json::{Map, Value};

use super::chain::{declared_capabilities, recorded_list};
use super::cleanup::{FailedDel, Tracked};
use super::lock::Loaded;
use super::multus::Multus;
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
        let errors = self.del_chain(&list, &env, cap_args, prev, found).await;
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
        let (lock, loaded) = self
            .lock_op_with(
                &inv.container_id,
                Some((Command::Del, &inv.netns)),
                Vec::new(),
                true,
            )
            .await?;
        let had_failed = loaded.record.as_ref().is_some_and(|r| {
            r.attachments
                .iter()
                .any(|a| a.ifname == inv.ifname && a.cleanup.is_some())
        });
        let (mut out, changed) = self.del_or_fall_back(inv, cap_args, fallback, loaded).await;
        let Some(mut record) = changed else {
            self.unlock(&inv.container_id, lock).await;
            return out;
        };
        if let Err(e) = &out {
            if self.hand_over(inv, &mut record, e).await {
                out = Ok(());
            }
        } else if had_failed {
            tracing::info!(container_id = %inv.container_id, ifname = %inv.ifname, "a DEL that had failed has now succeeded");
            self.count("done");
        }
        let tracked = Tracked::of(&record);
        // A failed write of what is left of the record is the DEL's error,
        // unless a plugin failed already: then the old record stays (it
        // names more than is left, which the next DEL runs again; DEL is
        // idempotent) and the plugin's error is the one to report, the
        // write's is logged (on a full disk, it is this one).
        match self.save_and_unlock(&inv.container_id, lock, record).await {
            Ok(()) => {
                self.track(&inv.container_id, tracked);
                out
            }
            Err((e, lock)) => {
                if let Some(lock) = lock {
                    self.unlock(&inv.container_id, lock).await;
                }
                match out {
                    Ok(()) => Err(e),
                    Err(first) => {
                        tracing::warn!(container_id = %inv.container_id, cause = %e, "cannot write what is left of the record after a failed DEL; the record stays as it was");
                        Err(first)
                    }
                }
            }
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
