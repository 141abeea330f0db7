//! Attachments whose DEL failed: how many of the runtime's DELs get the
//! error, when the rest is handed over to plexusd's own retries, and when
//! those give up (docs/records.md, "Pending cleanup").

use std::os::unix::fs::MetadataExt;
use std::time::{SystemTime, UNIX_EPOCH};

use super::fault::Step;
use super::lock::{Last, Take};
use super::tracked::{cause, pod_of, Tracked};
use super::{blocking, Engine, Error};
use crate::api::Command;
use crate::cni::state::{Attachment, Cleanup, Record};
use crate::metrics::CleanupLabels;
use crate::netconf::Invocation;

/// A DEL that failed, by who ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailedDel {
    /// The runtime's DEL call.
    Runtime,
    /// The rollback of a failed ADD (the ADD's error reached the runtime).
    Rollback,
    /// plexusd's own retry; `netns_gone`: it ran without the namespace.
    Retry { netns_gone: bool },
}

/// What a given-up attachment's networks may still hold, for the log: each
/// network's name, interface, configuration and recorded result (its
/// addresses), as JSON.
fn left_behind(att: &Attachment) -> String {
    let networks: Vec<serde_json::Value> = att
        .delegates
        .iter()
        .map(|d| {
            serde_json::json!({
                "network": d.name,
                "interface": d.ifname,
                "config": d.config,
                "result": d.result,
            })
        })
        .collect();
    serde_json::Value::Array(networks).to_string()
}

/// Longest wait between two retries, in multiples of the first.
const MAX_BACKOFF_FACTOR: u32 = 64;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `<dev>:<inode>` of the namespace file at `path`, if there is one.
async fn netns_id(path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    let m = tokio::fs::metadata(path).await.ok()?;
    Some(format!("{}:{}", m.dev(), m.ino()))
}

impl Engine {
    /// Notes a failed DEL of `att` with `error`; for the runtime's DEL,
    /// whether it is to be answered with success (handed over to
    /// plexusd's own retries) rather than with the error.
    pub(super) async fn note_failure(
        &self,
        att: &mut Attachment,
        error: &str,
        who: FailedDel,
    ) -> bool {
        let policy = &self.config.cleanup;
        let now = now_ms();
        let first = att.cleanup.is_none();
        let netns = if first {
            netns_id(&att.netns).await
        } else {
            None
        };
        let c = att.cleanup.get_or_insert_with(|| Cleanup {
            first_failure_ms: now,
            failures: 0,
            retries: 0,
            reported: 0,
            handed_over: false,
            last_error: String::new(),
            same_while_gone: 0,
            next_attempt_ms: now,
            netns_id: netns,
        });
        let same = c.last_error == error;
        c.failures = c.failures.saturating_add(1);
        c.last_error = error.to_string();
        c.same_while_gone = match who {
            FailedDel::Retry { netns_gone: true } if same => c.same_while_gone.saturating_add(1),
            FailedDel::Retry { netns_gone: true } => 1,
            _ => 0,
        };
        // The first retry one interval after any failure; each of
        // plexusd's own failures doubles the wait, up to 64 intervals.
        if matches!(who, FailedDel::Retry { .. }) {
            c.retries = c.retries.saturating_add(1);
        }
        let factor = (1u32 << c.retries.min(6)).min(MAX_BACKOFF_FACTOR);
        let wait = policy.retry_interval.saturating_mul(factor);
        c.next_attempt_ms = now.saturating_add(wait.as_millis() as u64);
        if who != FailedDel::Runtime {
            return false;
        }
        if c.handed_over {
            return true;
        }
        if c.reported < policy.errors_reported {
            c.reported += 1;
            return false;
        }
        c.handed_over = true;
        self.count("handed_over");
        true
    }

    /// Whether attachment `att` of container `id`, which failed again in
    /// plexusd's own retry, is to be given up: it has failed the same way
    /// `cleanupGiveUpAfter` times in a row since its container went; or it
    /// failed so once, and a newer container of the same pod (kubelet's
    /// next attempt at the sandbox) has a pending cleanup failing alike,
    /// so that a pod never holds one pending cleanup per attempt. The
    /// reason, if so.
    fn gives_up(&self, id: &str, att: &Attachment) -> Option<&'static str> {
        let c = att.cleanup.as_ref()?;
        if c.same_while_gone == 0 {
            return None;
        }
        if c.same_while_gone >= self.config.cleanup.give_up_after.max(1) {
            return Some("it failed the same way every time");
        }
        let pod = pod_of(&att.cni_args)?;
        let mine = cause(&c.last_error);
        let map = self.cleanups.lock().unwrap_or_else(|e| e.into_inner());
        let newer = map.iter().any(|(other, t)| {
            other != id
                && t.pod.as_deref() == Some(pod.as_str())
                && t.since > c.first_failure_ms
                && t.causes.iter().any(|x| x == mine)
        });
        newer.then_some("a newer sandbox of the same pod fails the same way")
    }

    pub(super) fn count(&self, outcome: &'static str) {
        if let Some(m) = &self.metrics {
            m.cleanups.get_or_create(&CleanupLabels { outcome }).inc();
        }
    }

    /// Takes note of what `record` (just written) leaves to retry.
    pub(super) fn track_cleanups(&self, record: &Record) {
        self.track(&record.container_id, Tracked::of(record));
    }

    /// Takes note of what container `id` leaves to retry: `tracked`, from
    /// its record as just written ([`Tracked::of`]); `None`, nothing.
    pub(super) fn track(&self, id: &str, tracked: Option<Tracked>) {
        let mut map = self.cleanups.lock().unwrap_or_else(|e| e.into_inner());
        match tracked {
            Some(t) => {
                map.insert(id.to_string(), t);
            }
            None => {
                map.remove(id);
            }
        }
        if let Some(m) = &self.metrics {
            m.cleanups_pending.set(map.len() as i64);
        }
    }

    /// Makes every pending cleanup due now: the retry task takes them up
    /// within a tick (a GC call asks for this; it does not wait for
    /// plugins that may each take up to `pluginTimeout`).
    pub(super) fn all_due_now(&self) {
        let mut map = self.cleanups.lock().unwrap_or_else(|e| e.into_inner());
        for t in map.values_mut() {
            t.due = 0;
        }
    }

    /// How often to look for retries that fell due: the first retry's wait,
    /// at most a second.
    pub fn cleanup_tick(&self) -> std::time::Duration {
        self.config
            .cleanup
            .retry_interval
            .min(std::time::Duration::from_secs(1))
            .max(std::time::Duration::from_millis(10))
    }

    /// Reads every record once and takes note of the pending cleanups
    /// (at start-up: an earlier daemon's are retried too).
    pub async fn scan_cleanups(&self) -> Result<(), Error> {
        let store = self.store.clone();
        let records = blocking(move || -> Vec<Record> {
            let Ok(ids) = store.list() else {
                return Vec::new();
            };
            ids.iter()
                .filter_map(|id| store.load(id).ok().flatten())
                .filter(|r| r.attachments.iter().any(|a| a.cleanup.is_some()))
                .collect()
        })
        .await?;
        for r in &records {
            self.track_cleanups(r);
        }
        if !records.is_empty() {
            tracing::info!(
                containers = records.len(),
                "attachments whose DEL failed earlier are retried"
            );
        }
        Ok(())
    }

    /// Retries the DEL of every pending cleanup that is due (`all`: every
    /// one, as at start-up), one container at a time.
    pub async fn retry_cleanups(&self, all: bool) {
        let now = now_ms();
        let due: Vec<String> = self
            .cleanups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, t)| all || t.due <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.retry_container(&id).await;
        }
    }

    /// Retries every pending cleanup of container `id` (its earliest is
    /// due; the others go along, a little early).
    async fn retry_container(&self, id: &str) {
        let retried = self
            .locked_with_last_write(
                id,
                Take::own().for_del(),
                |loaded| async move {
                    let Some(mut record) = loaded.record else {
                        self.track(id, None);
                        return Ok(Last::Answer(()));
                    };
                    let due: Vec<String> = record
                        .attachments
                        .iter()
                        .filter(|a| a.cleanup.is_some())
                        .map(|a| a.ifname.clone())
                        .collect();
                    for ifname in due {
                        self.retry_attachment(id, &ifname, &mut record, &loaded.found)
                            .await;
                    }
                    Ok(Last::Save {
                        record,
                        answer: Ok(()),
                        track: true,
                    })
                },
                |failed| async move {
                    tracing::warn!(container_id = %id, cause = %failed.error, "cannot write the record after retrying its DEL");
                    Ok(())
                },
            )
            .await;
        if let Err(e) = retried {
            tracing::warn!(container_id = %id, cause = %e, "cannot lock the container to retry its DEL");
        }
    }

    /// One retry of attachment `ifname` of `record`, under its locks.
    async fn retry_attachment(
        &self,
        id: &str,
        ifname: &str,
        record: &mut Record,
        found: &[crate::cni::exec::Plugin],
    ) {
        let Some(att) = record.attachment(ifname).cloned() else {
            return;
        };
        // The recorded namespace only while it is still the same one.
        let recorded = att.cleanup.as_ref().and_then(|c| c.netns_id.clone());
        let now_id = netns_id(&att.netns).await;
        let netns = if recorded.is_some() && now_id == recorded {
            att.netns.clone()
        } else {
            String::new()
        };
        let env = |k: &str| -> Option<String> {
            match k {
                "CNI_COMMAND" => Some(Command::Del.to_string()),
                "CNI_CONTAINERID" => Some(id.to_string()),
                "CNI_NETNS" => Some(netns.clone()),
                "CNI_IFNAME" => Some(ifname.to_string()),
                "CNI_ARGS" => Some(att.cni_args.clone()),
                _ => None,
            }
        };
        let made = match self.fault(Step::RetryCall) {
            Ok(()) => Invocation::from_env(env).map_err(|e| e.msg),
            Err(e) => Err(e.msg),
        };
        let inv = match made {
            Ok(inv) => inv,
            Err(why) => {
                tracing::error!(container_id = %id, ifname, cause = %why, "a pending cleanup's record cannot make a DEL call");
                return;
            }
        };
        match self
            .del_attachment_unsaved(&inv, &netns, record, found)
            .await
        {
            Ok(()) => {
                tracing::info!(container_id = %id, ifname, failures = att.cleanup.as_ref().map_or(0, |c| c.failures), "a DEL that had failed has now succeeded");
                self.count("done");
            }
            Err(e) => {
                let text = e.to_string();
                let Some(left) = record.attachment_mut(ifname) else {
                    return;
                };
                self.note_failure(
                    left,
                    &text,
                    FailedDel::Retry {
                        netns_gone: netns.is_empty(),
                    },
                )
                .await;
                if let Some(why) = self.gives_up(id, left) {
                    let gone = left.clone();
                    record.attachments.retain(|a| a.ifname != ifname);
                    self.count("given_up");
                    tracing::error!(
                        container_id = %id,
                        ifname,
                        networks = ?gone.delegates.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
                        left = %left_behind(&gone),
                        cause = %text,
                        why,
                        "gave up the DEL of a gone container; what these networks' plugins keep for it (addresses, host-side devices) must be released by hand"
                    );
                } else {
                    self.count("retry_failed");
                    tracing::warn!(container_id = %id, ifname, netns = %netns, cause = %text, "a retried DEL failed again; retrying later");
                }
            }
        }
    }
}
