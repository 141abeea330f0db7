//! The socket path a self-bound daemon owns: watched while it serves (a
//! successor takes it over, an impostor is undone) and released after.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{error, info, warn};

use super::{Stop, StopReason};
use crate::activation::{OwnedPath, PathState};

/// How often the path is looked at.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The owned path, also after a panic elsewhere (it is plain data).
fn lock(owned: &Mutex<OwnedPath>) -> MutexGuard<'_, OwnedPath> {
    owned.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Stops the daemon when a successor renames its socket over ours.
///
/// Only a socket owned by root (or our own user) is a successor's. Anything
/// else at the path is an impostor (or the path was removed): the daemon
/// says so loudly, keeps serving, and puts a socket of its own back over
/// the path (under the lock, so a real successor always wins); the new
/// socket goes to `restored` to be served.
pub(super) fn spawn_takeover_watch(
    owned: Arc<Mutex<OwnedPath>>,
    stop: Arc<Stop>,
    restored: UnboundedSender<UnixListener>,
) {
    tokio::spawn(async move {
        let path = lock(&owned).path().display().to_string();
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        // The last state reported, so a lasting one is logged once.
        let mut reported = None;
        loop {
            tokio::select! {
                _ = stop.requested() => return,
                _ = tick.tick() => {}
            }
            let state = tokio::task::spawn_blocking({
                let owned = owned.clone();
                move || lock(&owned).probe().state()
            })
            .await
            .unwrap_or(PathState::Ours);
            match state {
                PathState::Ours => {
                    reported = None;
                    continue;
                }
                PathState::Successor => {
                    info!(path, "another process took over the socket path; draining");
                    stop.request(StopReason::TakenOver);
                    return;
                }
                PathState::Foreign { .. } | PathState::Missing => {
                    if reported != Some(state) {
                        report_replaced(&path, state);
                    }
                }
            }
            reported = Some(state);
            if let Some(socket) = restore(&owned, &path).await {
                reported = None;
                if restored.send(socket).is_err() {
                    return;
                }
            }
        }
    });
}

/// Says what replaced our socket at `path` (or that it is gone).
fn report_replaced(path: &str, state: PathState) {
    match state {
        PathState::Foreign { uid, mode, socket } => {
            if socket {
                error!(
                    path,
                    uid,
                    mode = format!("{mode:04o}"),
                    "the socket path was replaced by a socket of another user, not by a \
                     successor (those are root's): possible attack; not stepping down, \
                     putting our own socket back"
                );
            } else {
                error!(
                    path,
                    uid,
                    mode = format!("{mode:04o}"),
                    "the socket path was replaced by something that is not a socket: \
                     possible attack; not stepping down, and it is left alone (never \
                     removed), so new clients cannot reach this daemon"
                );
            }
        }
        PathState::Missing => {
            warn!(
                path,
                "the socket path was removed; putting our own socket back"
            );
        }
        PathState::Ours | PathState::Successor => {}
    }
}

/// Puts a socket of ours back over the path, and returns it to be served;
/// `None` when nothing was put back: not a socket there (left alone), a
/// successor came meanwhile (seen on the next probe), or an error (logged).
async fn restore(owned: &Arc<Mutex<OwnedPath>>, path: &str) -> Option<UnixListener> {
    let outcome = tokio::task::spawn_blocking({
        let owned = owned.clone();
        move || lock(&owned).restore()
    })
    .await;
    match outcome {
        Ok(Ok(Some(socket))) => match UnixListener::from_std(socket) {
            Ok(socket) => {
                info!(path, "socket path restored; serving on it again");
                return Some(socket);
            }
            Err(e) => error!(path, cause = %e, "cannot serve the restored socket"),
        },
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            error!(path, cause = %anyhow::Error::from(e), "cannot restore the socket path")
        }
        Err(e) => error!(path, cause = %e, "cannot restore the socket path"),
    }
    None
}

/// Removes the path at the drain unless a successor's socket is there now.
pub(super) async fn release(owned: Arc<Mutex<OwnedPath>>, path: String) {
    // flock + stat + unlink: off the async workers.
    let released = tokio::task::spawn_blocking(move || lock(&owned).release())
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
    match released {
        Ok(true) => info!(path, "socket path removed"),
        Ok(false) => info!(path, "socket path belongs to a successor; left alone"),
        Err(e) => warn!(path, cause = %e, "cannot remove the socket path"),
    }
}
