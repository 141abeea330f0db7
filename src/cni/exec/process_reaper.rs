//! The [`Reaper`]: whatever happens to a plugin run (an answer, a
//! timeout, a dropped call, a panic), the plugin's group is killed before
//! the plugin is reaped, and its journal entry is closed once it is.

use std::process::Child;
use std::sync::Arc;

use super::super::remote::Remote;
use super::super::{Group, Journal};
use super::{kill_group, wait_exit, wait_pidfd, REMOTE_REAP_TIMEOUT};

/// A plugin run noted in a journal, to be closed once the plugin is reaped.
pub(super) struct Note {
    pub(super) journal: Arc<dyn Journal>,
    pub(super) container_id: String,
    pub(super) group: Group,
}

impl Note {
    /// Does not block (see [`Journal::finished`]).
    fn finished(self) {
        self.journal.finished(&self.container_id, self.group);
    }
}

/// A started plugin: a child of plexusd, or of the plugin spawner.
pub(super) enum Handle {
    Local(Child),
    Remote(Remote),
}

impl Handle {
    pub(super) fn id(&self) -> u32 {
        match self {
            Handle::Local(child) => child.id(),
            Handle::Remote(remote) => remote.id(),
        }
    }

    /// Blocking: kills nothing, waits for the (killed) plugin and reaps it;
    /// a remote one is reaped by the spawner once its connection closes.
    pub(super) fn reap_blocking(self) {
        match self {
            Handle::Local(mut child) => {
                let _ = child.wait();
            }
            Handle::Remote(remote) => drop(remote),
        }
    }
}

/// Makes sure a plugin is killed and reaped, and its journal entry closed,
/// even when the call is dropped half-way (its future cancelled).
pub(super) struct Reaper {
    pid: u32,
    handle: Option<Handle>,
    note: Option<Note>,
}

impl Reaper {
    pub(super) fn new(handle: Handle, note: Option<Note>) -> Self {
        Self {
            pid: handle.id(),
            handle: Some(handle),
            note,
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits until the plugin has exited, without reaping it.
    pub(super) async fn exited(&self) {
        match &self.handle {
            Some(Handle::Local(_)) => wait_exit(self.pid).await,
            Some(Handle::Remote(remote)) => {
                // Without a pidfd there is nothing to wait on: the caller
                // kills the group next.
                if let Ok(fd) = remote.pidfd() {
                    wait_pidfd(fd).await;
                }
            }
            None => {}
        }
    }

    /// Reaps the exited plugin, a child of plexusd, with try_wait; `None`
    /// if it cannot (a remote one, or one not exited: Drop kills and reaps
    /// it off the runtime instead).
    pub(super) fn reap_now(&mut self) -> Option<std::process::ExitStatus> {
        match self.handle.take()? {
            Handle::Local(mut child) => match child.try_wait() {
                Ok(Some(s)) => Some(s),
                _ => {
                    self.handle = Some(Handle::Local(child));
                    None
                }
            },
            remote => {
                self.handle = Some(remote);
                None
            }
        }
    }

    /// Blocking, for a call's own thread: reaps the exited plugin, a local
    /// one with try_wait ([`Reaper::reap_now`]), a remote one by the
    /// spawner (which answers at once), waiting for it with poll(2) until
    /// its timeout or the thread's stop.
    pub(super) fn reap_here(&mut self) -> Option<std::process::ExitStatus> {
        match self.handle.take()? {
            Handle::Remote(remote) => {
                let stop = crate::op_thread::stop_of_this_call();
                let stop_fd = stop.as_ref().and_then(|s| s.fd());
                remote.reap_here(REMOTE_REAP_TIMEOUT, stop_fd).ok()
            }
            local => {
                self.handle = Some(local);
                self.reap_now()
            }
        }
    }

    /// A pidfd of the plugin: opened for a child of plexusd, a copy of the
    /// spawner's for one of the spawner.
    pub(super) fn pidfd(&self) -> Option<std::os::fd::OwnedFd> {
        match self.handle.as_ref()? {
            Handle::Local(_) => super::pidfd_open(self.pid),
            Handle::Remote(remote) => remote.pidfd().ok(),
        }
    }

    /// Reaps the exited plugin; `None` if it cannot. Never blocks: a local
    /// child is reaped with try_wait ([`Reaper::reap_now`]), a remote one
    /// by the spawner, which answers at once.
    pub(super) async fn reap(&mut self) -> Option<std::process::ExitStatus> {
        match self.handle.take()? {
            local @ Handle::Local(_) => {
                self.handle = Some(local);
                self.reap_now()
            }
            // The spawner answers at once; one that does not (hung, or
            // gone with its connection) leaves the status unknown.
            Handle::Remote(remote) => tokio::time::timeout(REMOTE_REAP_TIMEOUT, remote.reap())
                .await
                .ok()
                .and_then(Result::ok),
        }
    }

    /// Closes the journal entry of a reaped plugin.
    pub(super) fn finish(mut self) {
        if self.handle.is_none() {
            if let Some(note) = self.note.take() {
                note.finished();
            }
        }
        // Otherwise Drop kills, reaps and closes the entry.
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let handle = self.handle.take();
        let note = self.note.take();
        if handle.is_none() && note.is_none() {
            return;
        }
        if handle.is_some() {
            kill_group(self.pid);
        }
        let reap = move || {
            if let Some(handle) = handle {
                handle.reap_blocking();
            }
            if let Some(note) = note {
                note.finished();
            }
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(tokio::task::spawn_blocking(reap));
        } else {
            reap();
        }
    }
}
