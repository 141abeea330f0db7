//! One listening socket: the accept loop (paused while the admission
//! queue is deep, held at the connection cap unless an idle connection
//! can make room), backoff on accept errors, and at the drain the clients
//! left in the listen backlog.

use std::io;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::backoff::AcceptBackoff;
use super::{connection, Handler, Shared};
use crate::limit::{ConnectionLimit, Slot};

/// Accepts and serves clients on `listener` until `stop` is cancelled;
/// with `drain_backlog`, then serves the clients already waiting in its
/// backlog, and closes it.
pub(super) async fn serve<H: Handler>(
    listener: UnixListener,
    shared: Arc<Shared<H>>,
    connections: ConnectionLimit,
    stop: CancellationToken,
    tracker: TaskTracker,
    drain_backlog: bool,
) {
    let mut backoff = AcceptBackoff::new();
    loop {
        // Requests enough wait for a slot: new clients wait in the listen
        // backlog, where they cost the daemon no memory, until one of
        // them has been admitted.
        let shrank = shared.admission.queue_shrank();
        tokio::pin!(shrank);
        shrank.as_mut().enable();
        let filled = shared.admission.queue_filled();
        tokio::pin!(filled);
        filled.as_mut().enable();
        if shared.admission.accept_paused() {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = &mut shrank => continue,
            }
        }
        let permit = match connections.try_acquire() {
            Slot::Free(p) => Some(p),
            Slot::Full => None,
        };
        // At the cap, a client is accepted only when an idle connection
        // can make room for it (see `make_room`); otherwise it waits in the
        // listen backlog for a slot, or for a connection to turn idle.
        let candidate = shared.idle.candidate();
        tokio::pin!(candidate);
        candidate.as_mut().enable();
        let room = permit.is_some() || shared.idle.has_candidate();
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = listener.accept(), if room => r,
            p = connections.acquire(), if permit.is_none() => {
                // Taken again on the next turn.
                drop(p);
                continue;
            }
            _ = &mut candidate, if !room => continue,
            // The queue filled up while waiting for a client: pause.
            _ = &mut filled => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff.success();
                stream
            }
            Err(e) => {
                let wait = accept_failed(&shared, &mut backoff, &e);
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
        };
        let permit = match permit {
            Some(p) => Some(p),
            None => make_room(&shared, &connections, Some(&stop)).await,
        };
        connection::serve(stream, permit, connections.lingering(), &shared, &tracker);
    }
    if drain_backlog {
        serve_backlog(&listener, &shared, &connections, &tracker).await;
    }
    drop(listener);
}

/// Counts a failed accept, warns of it (rate-limited), and returns how
/// long to wait before the next. Out of descriptors, an idle connection
/// is closed to give one back.
fn accept_failed<H>(shared: &Shared<H>, backoff: &mut AcceptBackoff, e: &io::Error) -> Duration {
    shared.metrics.accept_errors.inc();
    let failure = backoff.failure(Instant::now());
    if let Some(suppressed) = failure.warn {
        warn!(cause = %e, suppressed, retry_in = ?failure.wait, "accept failed");
    }
    if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) && shared.idle.evict_oldest() {
        shared.metrics.connections_evicted.inc();
    }
    failure.wait
}

/// At the drain: serves the clients waiting in the listen backlog (the
/// socket is ours alone: nobody else would answer them).
async fn serve_backlog<H: Handler>(
    listener: &UnixListener,
    shared: &Arc<Shared<H>>,
    connections: &ConnectionLimit,
    tracker: &TaskTracker,
) {
    let mut served = 0usize;
    loop {
        let next = std::future::poll_fn(|cx| match listener.poll_accept(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Ready(None),
        })
        .await;
        let Some(Ok((stream, _))) = next else { break };
        let permit = match connections.try_acquire() {
            Slot::Free(p) => Some(p),
            Slot::Full => make_room(shared, connections, None).await,
        };
        connection::serve(stream, permit, connections.lingering(), shared, tracker);
        served += 1;
    }
    if served > 0 {
        info!(
            connections = served,
            "served connections left in the backlog"
        );
    }
}

/// A slot for a client accepted at the cap: the connection idle longest
/// (accepted, polled, no request head yet) is closed to make room; with
/// none (another accept loop took it, or while the backlog is drained),
/// the client waits for a slot, and one that turns idle meanwhile is
/// closed as well. After `stop` the client is served without a slot (one
/// over the cap per listener, while the daemon drains) rather than left
/// unanswered.
async fn make_room<H>(
    shared: &Shared<H>,
    connections: &ConnectionLimit,
    stop: Option<&CancellationToken>,
) -> Option<OwnedSemaphorePermit> {
    let mut evicted = false;
    loop {
        let candidate = shared.idle.candidate();
        tokio::pin!(candidate);
        candidate.as_mut().enable();
        let declined = shared.idle.declined();
        tokio::pin!(declined);
        declined.as_mut().enable();
        match connections.try_acquire() {
            Slot::Free(p) => return Some(p),
            Slot::Full => {}
        }
        if !evicted && shared.idle.evict_oldest() {
            evicted = true;
            shared.metrics.connections_evicted.inc();
            debug!("closed the connection idle longest to serve a new one");
        }
        let stopped = async {
            match stop {
                Some(s) => s.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            p = connections.acquire() => return Some(p),
            _ = &mut candidate, if !evicted => {}
            // The one chosen got its request head just then: choose again.
            _ = &mut declined, if evicted => evicted = false,
            _ = stopped => return None,
        }
    }
}
