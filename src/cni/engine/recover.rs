//! Start-up recovery: what a crashed predecessor left (plugin groups,
//! temporary files, lock files of containers without a record).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::lock::clear_marker;
use super::Engine;

impl Engine {
    /// At start-up, for every container no one holds the lock of (a live
    /// predecessor's running operations hold theirs and are left alone):
    /// kills the plugin groups a crashed daemon left running, removes the
    /// temporary files of writes it never finished, and removes lock files
    /// of containers without a record. Blocking.
    pub(super) fn recover(&self) {
        // Every container with a lock file (its marker, if any, is in it)
        // or a leftover temporary file.
        let mut work: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for id in self.locks.ids() {
            work.entry(id).or_default();
        }
        for (id, path) in self.store.temp_files() {
            work.entry(id).or_default().push(path);
        }
        for (id, temps) in work {
            let held = match self.locks.try_lock(&id) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    tracing::info!(container_id = %id, "another plexusd is working on this container; its state is left alone");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(container_id = %id, cause = %e, "cannot lock the container at start-up");
                    continue;
                }
            };
            if let Err((pgid, e)) = clear_marker(
                &self.markers,
                self.kill_group,
                self.config.plugin_timeout,
                &id,
                &held,
            ) {
                tracing::error!(container_id = %id, pgid, cause = %e, "a plugin process group left by an earlier plexusd survived SIGKILL; calls for this container fail until it is gone");
            }
            for t in temps {
                if let Err(e) = std::fs::remove_file(&t) {
                    tracing::warn!(path = %t.display(), cause = %e, "cannot remove a leftover temporary file");
                }
            }
            if !self.store.exists(&id) {
                if let Err(e) = held.unlink() {
                    tracing::warn!(container_id = %id, cause = %e, "cannot remove a lock file");
                }
            }
        }
    }
}
