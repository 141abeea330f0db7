//! The DEL of a container the runtime has forgotten, made by plexusd itself
//! (see `crate::reconcile`): every attachment of its record, as a pending
//! cleanup the runtime has handed over, under the container's locks. An
//! operation in progress on the container (an ADD of a sandbox being
//! created) is waited for, and the caller's check runs again on the record
//! as the locks find it, so that a container that changed meanwhile is
//! kept. What cannot be deleted stays in the record as a pending cleanup,
//! retried, shown and given up like any other (docs/records.md).

use std::future::Future;

use super::cleanup::FailedDel;
use super::lock::{Last, Take};
use super::{Engine, Error};
use crate::api::Command;
use crate::cni::state::{Cleanup, Record};
use crate::netconf::Invocation;

/// What became of a container [`Engine::reclaim`] was asked to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reclaimed {
    /// Every network was deleted; the record is gone.
    Done,
    /// Some networks' DEL failed: they are pending cleanups now, retried
    /// by plexusd; the error.
    Pending(String),
    /// The check, made again under the locks, said no: nothing was done.
    Kept,
    /// It had no record any more.
    Gone,
}

/// The outcome counted in `plexus_cleanups_total` for each reclaimed
/// container.
const RECLAIMED: &str = "reclaimed";

impl Engine {
    /// Deletes every attachment of container `id` as plexusd's own pending
    /// cleanup (with `why` as its first cause), once `still` says yes to
    /// the record as found under the container's locks. `CNI_NETNS` is
    /// empty: the namespace is gone.
    pub async fn reclaim<C, CF>(&self, id: &str, why: &str, still: C) -> Result<Reclaimed, Error>
    where
        C: FnOnce(Record) -> CF,
        CF: Future<Output = bool>,
    {
        self.locked_with_last_write(
            id,
            Take::own().for_del(),
            |loaded| async move {
                let Some(mut record) = loaded.record else {
                    return Ok(Last::Answer(Reclaimed::Gone));
                };
                if !still(record.clone()).await {
                    return Ok(Last::Answer(Reclaimed::Kept));
                }
                self.count(RECLAIMED);
                let errors = self.reclaim_all(id, why, &mut record, &loaded.found).await;
                let answer = if errors.is_empty() {
                    Reclaimed::Done
                } else {
                    Reclaimed::Pending(errors.join("; "))
                };
                Ok(Last::Save {
                    record,
                    answer: Ok(answer),
                    track: true,
                })
            },
            |failed| async move {
                tracing::warn!(container_id = %id, cause = %failed.error, "cannot write the record after deleting the networks of a forgotten sandbox");
                Err(failed.error)
            },
        )
        .await
    }

    /// The DEL of every attachment of `record`, newest first (networks
    /// hot-plugged into an attachment come after it), each noted as a
    /// pending cleanup handed over to plexusd first; the errors.
    async fn reclaim_all(
        &self,
        id: &str,
        why: &str,
        record: &mut Record,
        found: &[crate::cni::exec::Plugin],
    ) -> Vec<String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let ifnames: Vec<String> = record
            .attachments
            .iter()
            .rev()
            .map(|a| a.ifname.clone())
            .collect();
        let mut errors = Vec::new();
        for ifname in ifnames {
            let Some(att) = record.attachment_mut(&ifname) else {
                continue;
            };
            let c = att.cleanup.get_or_insert_with(|| Cleanup {
                first_failure_ms: now,
                failures: 0,
                retries: 0,
                reported: 0,
                handed_over: true,
                last_error: why.to_string(),
                same_while_gone: 0,
                next_attempt_ms: now,
                netns_id: None,
            });
            c.handed_over = true;
            let cni_args = att.cni_args.clone();
            let env = |k: &str| -> Option<String> {
                match k {
                    "CNI_COMMAND" => Some(Command::Del.to_string()),
                    "CNI_CONTAINERID" => Some(id.to_string()),
                    "CNI_NETNS" => Some(String::new()),
                    "CNI_IFNAME" => Some(ifname.clone()),
                    "CNI_ARGS" => Some(cni_args.clone()),
                    _ => None,
                }
            };
            let inv = match Invocation::from_env(env) {
                Ok(inv) => inv,
                Err(e) => {
                    tracing::error!(container_id = %id, ifname, cause = %e.msg, "a forgotten sandbox's record cannot make a DEL call");
                    errors.push(e.msg);
                    continue;
                }
            };
            if let Err(e) = self.del_attachment_unsaved(&inv, "", record, found).await {
                let text = e.to_string();
                if let Some(left) = record.attachment_mut(&ifname) {
                    self.note_failure(left, &text, FailedDel::Retry { netns_gone: true })
                        .await;
                }
                tracing::warn!(container_id = %id, ifname, cause = %text, "the DEL of a forgotten sandbox's network failed; it stays a pending cleanup, retried later");
                errors.push(text);
            }
        }
        errors
    }
}
