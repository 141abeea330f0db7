//! Carrying out a [`crate::cni::plan`]: the steps of one ADD.
//!
//! 1. The device plugins' device-info files are copied to the networks'
//!    (as multus: a copy that fails is only logged, the plugin may write
//!    the file itself).
//! 2. The networks run ([`Engine::add_networks`]), which rolls back what it
//!    added when one of them fails.
//! 3. The default routes change as the plan's marks say
//!    ([`default_route`]); the result given to the runtime is not changed.
//! 4. The networks' device-info files are read back (a plugin may have
//!    written or completed one).
//!
//! When a step after the networks fails, the ADD is rolled back like any
//! failed ADD (docs/records.md): every network of the attachment is
//! DELed under the container's locks; the attachment leaves the record
//! when every DEL worked, and what failed stays recorded for the runtime's
//! DEL and plexusd's own retries, noted as a rollback's failure (which the
//! runtime was not answered with). Device-info files this ADD copied are
//! removed on any failure. File work runs on the blocking pool.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::cleanup::FailedDel;
use super::lock::{Last, Loaded, Take, WriteFailed};
use super::{blocking, Engine, Error, ErrorKind};
use crate::api::{code, Command};
use crate::cni::default_route::{self, Marks};
use crate::cni::plan::{Attached, Plan};
use crate::cni::{AddedNetwork, Planned};
use crate::device_info::{self, DeviceInfo};
use crate::netconf::Invocation;

impl Engine {
    /// ADD as `plan` says (see the module's steps): every network's
    /// outcome, in order ([`Attached::primary`] of them is the one the
    /// runtime gets). On failure nothing of the ADD is left but what a
    /// rollback could not remove, which stays recorded.
    pub async fn carry_out(
        &self,
        inv: &Invocation,
        cap_args: Map<String, Value>,
        plan: Plan,
    ) -> Result<Vec<Attached>, Error> {
        let Plan { networks, marks } = plan;
        let copies: Vec<(PathBuf, PathBuf)> = networks
            .iter()
            .filter_map(|n| n.copy_device_info.clone())
            .collect();
        let info_files: Vec<Option<PathBuf>> = networks
            .iter()
            .map(|n| device_info_file(&self.config.device_info_dir, &n.planned))
            .collect();
        let shown: Vec<String> = networks.iter().map(|n| n.shown_as.clone()).collect();
        let copied = copy_device_info(copies).await;
        let planned = networks.into_iter().map(|n| n.planned).collect();
        let added = match self.add_networks(inv, cap_args, planned).await {
            Ok(added) => added,
            Err(e) => {
                self.remove_copies(copied).await;
                return Err(e);
            }
        };
        if let Some(marks) = marks {
            if let Err(e) = set_default_routes(inv, &marks, &added).await {
                let e = self.roll_back_added(inv, e).await;
                self.remove_copies(copied).await;
                return Err(e);
            }
        }
        let device_info = load_device_info(info_files).await;
        Ok(added
            .into_iter()
            .zip(shown)
            .zip(device_info)
            .map(|((network, shown_as), device_info)| Attached {
                network,
                shown_as,
                device_info,
            })
            .collect())
    }

    /// Rolls back the attachment `inv` names, which an ADD recorded
    /// whole before a later step of its plan failed with `cause`; the
    /// error to report (`cause`, with what the rollback could not undo).
    async fn roll_back_added(&self, inv: &Invocation, cause: Error) -> Error {
        let del = Invocation {
            command: Command::Del,
            ..inv.clone()
        };
        // What the DEL could not undo, if anything.
        let body = |loaded: Loaded| async move {
            let Some(mut record) = loaded.record else {
                return Ok(Last::Answer(None));
            };
            let out = self
                .del_attachment_unsaved(&del, &del.netns, &mut record, &loaded.found)
                .await;
            let left = match out {
                Ok(()) => None,
                Err(e) => {
                    if let Some(att) = record.attachment_mut(&del.ifname) {
                        self.note_failure(att, &e.to_string(), FailedDel::Rollback)
                            .await;
                    }
                    Some(e)
                }
            };
            Ok(Last::Save {
                record,
                answer: Ok(left),
                track: true,
            })
        };
        let write_failed = |failed: WriteFailed<Option<Error>>| async move {
            tracing::error!(container_id = %inv.container_id, cause = %failed.error, "cannot update the attachment record after a rollback");
            failed.answer
        };
        let take = Take::call(Command::Del, &inv.netns).for_del();
        let rolled_back = self
            .locked_with_last_write(&inv.container_id, take, body, write_failed)
            .await;
        match rolled_back {
            Ok(None) => cause,
            Ok(Some(e)) => {
                tracing::warn!(container_id = %inv.container_id, cause = %e, "rollback after a failed ADD left errors; the attachment stays recorded for DEL");
                with_details(cause, &e.msg)
            }
            Err(e) => {
                tracing::warn!(container_id = %inv.container_id, cause = %e, "cannot roll back the ADD; its attachment stays recorded for DEL");
                with_details(cause, &e.msg)
            }
        }
    }

    /// Removes the device-info files an ADD that failed had copied.
    async fn remove_copies(&self, copied: Vec<PathBuf>) {
        for path in copied {
            self.remove_device_info_file(path).await;
        }
    }
}

fn with_details(mut e: Error, more: &str) -> Error {
    if !e.details.is_empty() {
        e.details.push_str("; ");
    }
    e.details.push_str(more);
    e
}

/// A network's device-info file, when its own capability arguments name
/// one in the device-info directory's `cni/`.
fn device_info_file(dir: &Path, planned: &Planned) -> Option<PathBuf> {
    let file = planned
        .capability_args
        .as_ref()?
        .get("CNIDeviceInfoFile")?
        .as_str()?;
    let path = PathBuf::from(file);
    device_info::is_cni_file(dir, &path).then_some(path)
}

/// Copies device plugins' device-info files to the networks' (before the
/// plugins run); the copies made where there was no file before, which a
/// failed ADD removes again. A failure is only logged.
async fn copy_device_info(copies: Vec<(PathBuf, PathBuf)>) -> Vec<PathBuf> {
    if copies.is_empty() {
        return Vec::new();
    }
    let done = blocking(move || {
        let mut made = Vec::new();
        for (from, to) in copies {
            let existed = to.symlink_metadata().is_ok();
            match device_info::copy_from_dp(&from, &to) {
                Ok(true) if !existed => made.push(to),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(from = %from.display(), to = %to.display(), cause = %e, "cannot copy a device plugin's device-info file");
                }
            }
        }
        made
    })
    .await;
    done.unwrap_or_else(|e| {
        tracing::warn!(cause = %e, "copying device-info files failed");
        Vec::new()
    })
}

/// The networks' device-info, read after the plugins ran.
async fn load_device_info(files: Vec<Option<PathBuf>>) -> Vec<Option<DeviceInfo>> {
    let n = files.len();
    if files.iter().all(Option::is_none) {
        return vec![None; n];
    }
    blocking(move || {
        files
            .iter()
            .map(|f| f.as_deref().and_then(device_info::load))
            .collect()
    })
    .await
    .unwrap_or_else(|_| vec![None; n])
}

/// multus's `default-route` after a pod's networks were attached (see
/// [`default_route`]): the default routes of every attached network
/// marked are removed in the pod, then the requested ones added.
async fn set_default_routes(
    inv: &Invocation,
    marks: &[Marks],
    added: &[AddedNetwork],
) -> Result<(), Error> {
    let actions = default_route::actions(marks.iter().zip(added).map(|(m, a)| {
        (
            m,
            a.ifname.as_str(),
            default_route::shows_attachment(&a.result),
        )
    }));
    if !actions.is_empty() {
        tracing::info!(container_id = %inv.container_id, netns = %inv.netns, changes = ?actions, "default-route: changing the pod's default routes");
    }
    default_route::apply(&inv.netns, actions, default_route::COMMAND_TIMEOUT)
        .await
        .map_err(|e| {
            tracing::warn!(container_id = %inv.container_id, cause = %e, "default-route handling failed; the ADD is rolled back");
            Error::new(
                ErrorKind::Failed,
                code::INTERNAL,
                format!("default-route: {e}"),
            )
        })
}
