//! ADD: the attachment recorded before any plugin runs, each network's
//! chain run in order and recorded as it succeeds, and a rollback of what
//! was added when a network fails.

use serde_json::{Map, Value};

use super::chain::{declared_capabilities, recorded_capabilities, LocatedPlugins};
use super::cleanup::FailedDel;
use super::fault::Step;
use super::lock::{Last, Loaded, Take};
use super::{AddedNetwork, Engine, Error, ErrorKind, Planned};
use crate::api::{code, Command};
use crate::cni::exec::Plugin;
use crate::cni::state;
use crate::cni::state::{Attachment, Delegate, Durability, Record, State};
use crate::netconf::Invocation;

/// An ADD whose networks were all added, before the record's last write.
struct AddPending {
    pub(super) record: Record,
    /// The attachment the ADD made (one delegate per network).
    pub(super) slot: usize,
}

impl AddPending {
    /// Every network's result, in order.
    pub(super) fn added(&self) -> Vec<AddedNetwork> {
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

impl Engine {
    /// ADD: attaches `planned` networks to the container; answers every
    /// network's result, in order ([`AddedNetwork::primary`] is the one the
    /// runtime gets).
    pub async fn add_networks(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        planned: Vec<Planned>,
    ) -> Result<Vec<AddedNetwork>, Error> {
        // The namespace is checked before anything runs, so the rollback
        // of a failed ADD, too, only ever runs in a namespace that passed.
        // The plugins are located in the same trip to the blocking pool.
        let take = Take::call(Command::Add, &inv.netns).locating(plugin_types(&planned));
        let pending = self
            .locked_with_last_write(
                &inv.container_id,
                take,
                |loaded| async move {
                    let pending = self
                        .add_unsaved(inv, cap_args, planned, loaded, None)
                        .await?;
                    Ok(Last::Save {
                        record: pending.record.clone(),
                        answer: Ok(pending),
                        track: false,
                    })
                },
                |failed| async move {
                    match (failed.answer, failed.held) {
                        // Still under the container's lock: nothing of it
                        // may run while another call holds the container.
                        (Ok(pending), true) => {
                            Err(self.roll_back_saved(inv, pending, failed.error).await)
                        }
                        // Released already: the record still says the
                        // networks are being added, and the runtime's DEL
                        // removes them.
                        _ => Err(failed.error),
                    }
                },
            )
            .await?;
        Ok(pending.added())
    }

    /// Adds `planned` under the container's lock taken with `loaded`, the
    /// record saved last.
    pub(super) async fn add_locked(
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
        let mut networks = Vec::with_capacity(planned.len());
        for p in &planned {
            networks.push(
                self.prepare_with(&p.list, Command::Add, &loaded.found)
                    .await?,
            );
        }
        let mut record = loaded
            .record
            .unwrap_or_else(|| Record::new(&inv.container_id));
        if record
            .attachment(&inv.ifname)
            .is_some_and(|a| a.cleanup.as_ref().is_some_and(|c| c.handed_over))
        {
            self.del_handed_over(inv, &mut record, &loaded.found)
                .await?;
        }
        let slot = record_attachment(inv, &planned, cap_args, hot_plugged_into, &mut record)?;
        for (i, (p, plugins)) in planned.iter().zip(&networks).enumerate() {
            self.add_network(inv, p, plugins, &mut record, slot, i)
                .await?;
        }
        Ok(AddPending { record, slot })
    }

    /// A runtime that reuses its container ids (podman's restart) may ADD
    /// again over a DEL that was answered with success but is still
    /// pending: that DEL is retried first, and must succeed. The record
    /// is saved with what it left.
    async fn del_handed_over(
        &self,
        inv: &Invocation,
        record: &mut Record,
        found: &[Plugin],
    ) -> Result<(), Error> {
        let del = Invocation {
            command: Command::Del,
            ..inv.clone()
        };
        let out = self
            .del_attachment_unsaved(&del, &inv.netns, record, found)
            .await;
        let saved = self.save_record(record, Durability::Atomic).await;
        if saved.is_ok() {
            self.track_cleanups(record);
        }
        if let Err(e) = out {
            return Err(Error::new(
                ErrorKind::Failed,
                code::TRY_AGAIN_LATER,
                format!(
                    "container {:?} ifname {:?}: the DEL of its earlier attachment is still pending and failed again; try again later: {e}",
                    inv.container_id, inv.ifname
                ),
            ));
        }
        saved
    }

    /// Network `i` of attachment `slot` of `record`, `p`, with its plugins
    /// located: recorded as being added (synced before its first plugin
    /// reads its configuration), its chain run, its result recorded; on a
    /// failure, what the ADD did so far is rolled back and the error is
    /// the answer.
    async fn add_network(
        &self,
        inv: &Invocation,
        p: &Planned,
        plugins: &LocatedPlugins,
        record: &mut Record,
        slot: usize,
        i: usize,
    ) -> Result<(), Error> {
        record.attachments[slot].delegates[i].state = State::Adding;
        // The record must be on disk before this network's first plugin
        // reads its configuration; its write and syncs run while that
        // plugin starts (see docs/records.md).
        let (synced, gate) = self.save_synced_gate(record);
        let env = self.call_env(
            Command::Add,
            inv,
            &p.ifname,
            &inv.netns,
            p.cni_args.as_deref(),
        );
        let att = &record.attachments[slot];
        let args = att.delegates[i]
            .capability_args
            .clone()
            .unwrap_or_else(|| att.capability_args.clone());
        let added = self
            .add_chain(&p.list, plugins, &env, &args, Some(gate))
            .await
            .and_then(|res| match self.fault(Step::AddChain) {
                Ok(()) => Ok(res),
                Err(e) => Err((e, Some(res))),
            });
        // Nothing writes the record again before its sync is done.
        if let Err(e) = synced.done().await {
            // The gate held this network's first plugin before it read a
            // byte of its configuration: nothing of the network ran, so
            // the rollback has nothing of it to undo (and, on a full disk,
            // could not note a plugin's group to try).
            record.attachments[slot].delegates[i].state = State::Pending;
            let partial = added.err().and_then(|(_, partial)| partial);
            return Err(self.roll_back(inv, record, slot, i, partial, e).await);
        }
        match added {
            Ok(res) => {
                let d = &mut record.attachments[slot].delegates[i];
                d.state = State::Added;
                d.result = Some(res);
                Ok(())
            }
            Err((e, partial)) => Err(self.roll_back(inv, record, slot, i, partial, e).await),
        }
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
            let text = e.to_string();
            self.note_failure(&mut record.attachments[slot], &text, FailedDel::Rollback)
                .await;
            if !cause.details.is_empty() {
                cause.details.push_str("; ");
            }
            cause.details.push_str(&e.msg);
        }
        match self.save_record(record, Durability::Atomic).await {
            Ok(()) => self.track_cleanups(record),
            Err(e) => {
                tracing::error!(container_id = %inv.container_id, cause = %e, "cannot update the attachment record after a rollback")
            }
        }
        cause
    }
}

/// The plugin types of `planned`, once each.
fn plugin_types(planned: &[Planned]) -> Vec<String> {
    let mut types: Vec<String> = Vec::new();
    for p in planned {
        for i in 0..p.list.plugins.len() {
            let kind = p.list.plugin_type(i);
            if !types.iter().any(|k| k == kind) {
                types.push(kind.to_string());
            }
        }
    }
    types
}

/// Adds the attachment of `inv` with its `planned` networks (all
/// `pending`) to `record`; its index. Refused, before anything ran (so
/// there is nothing to roll back), when the interface is taken or the
/// record would grow too large: a record is read back on every call.
fn record_attachment(
    inv: &Invocation,
    planned: &[Planned],
    cap_args: Map<String, Value>,
    hot_plugged_into: Option<String>,
    record: &mut Record,
) -> Result<usize, Error> {
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
        fell_back: false,
        hot_plugged_into,
        cleanup: None,
        ifname: inv.ifname.clone(),
        netns: inv.netns.clone(),
        cni_args: inv.args.clone(),
        capability_args: cap_args,
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
    let size = state::encoded_len(record);
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
    Ok(record.attachments.len() - 1)
}
