//! One client connection, in a task of its own: hyper serves its one
//! request while the task watches the client (a hang-up during the work
//! ends the connection; so does eviction before a request head arrives),
//! then the close that lets the client read its answer.

use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Interval, MissedTickBehavior};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;
use tracing::debug;

use super::conn_io::{self, ConnIo};
use super::idle::Ticket;
use super::{routes, Handler, Shared};
use crate::api;

/// How often a connection whose request is in progress checks whether its
/// client hung up (half-closed clients are still answered, so hyper's EOF
/// cannot tell).
const HANG_UP_CHECK: Duration = Duration::from_millis(100);

/// Most bytes hyper buffers per connection (request heads included).
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Why a connection task ended.
enum Ended {
    Served(Result<(), hyper::Error>),
    Evicted,
    HungUp,
}

/// Serves `stream` in a task tracked by `tracker`, holding `permit` (its
/// slot under the connection cap, if it got one) until it closes.
pub(super) fn serve<H: Handler>(
    stream: UnixStream,
    permit: Option<OwnedSemaphorePermit>,
    lingering: Arc<Semaphore>,
    shared: &Arc<Shared<H>>,
    tracker: &TaskTracker,
) {
    shared.activity.touch();
    shared.metrics.connections_open.inc();
    let accepted = Instant::now();
    // Valid as long as the connection owns the stream, which outlives
    // every use below (they happen in the task that owns it).
    let fd = stream.as_raw_fd();
    let (ticket, evict) = shared.idle.register();
    let ticket = Arc::new(ticket);
    let svc_shared = shared.clone();
    let svc_ticket = ticket.clone();
    // Whether the answer was a success: every route reads its whole
    // request before it can succeed.
    let succeeded = Arc::new(AtomicBool::new(false));
    let svc_succeeded = succeeded.clone();
    let service = hyper::service::service_fn(move |req| {
        // The head has arrived: this connection is no longer idle.
        svc_ticket.busy();
        let route = routes::route(svc_shared.clone(), req, accepted);
        let succeeded = svc_succeeded.clone();
        // Boxed: hyper's `poll_without_shutdown` wants an `Unpin` future.
        Box::pin(async move {
            let answer = route.await;
            if matches!(&answer, Ok(a) if a.status().is_success()) {
                succeeded.store(true, Ordering::Relaxed);
            }
            answer
        })
    });
    let mut conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(shared.config.read_timeout)
        .keep_alive(false)
        // A client may shut down its write side after the request and
        // still wait for the answer (hyper would take that EOF for a
        // cancellation).
        .half_close(true)
        // Bodies are copied out as they arrive; a larger read buffer
        // would only double what a big request costs.
        .max_buf_size(READ_BUFFER_BYTES)
        .serve_connection(TokioIo::new(ConnIo::new(stream, ticket.clone())), service);
    let shared = shared.clone();
    tracker.spawn(async move {
        let evicted = std::pin::pin!(evict.cancelled());
        let mut client = ClientWatch {
            fd,
            ticket,
            evict: &evict,
            evicted,
            declined: false,
            first_poll: true,
            hang_up_check: None,
        };
        let ended = std::future::poll_fn(|cx| {
            // Without hyper's shutdown: the stream is closed below, after
            // the client has read its answer.
            if let Poll::Ready(r) = conn.poll_without_shutdown(cx) {
                return Poll::Ready(Ended::Served(r));
            }
            client.poll(cx)
        })
        .await;
        shared.metrics.connections_open.dec();
        match ended {
            Ended::Served(r) => {
                let read_whole = succeeded.load(Ordering::Relaxed);
                close_served(r, conn.into_parts().io.into_inner(), read_whole, permit).await
            }
            Ended::HungUp => {
                debug!("client hung up before its answer");
                drop(permit);
            }
            Ended::Evicted => {
                let io = conn.into_parts().io.into_inner().into_stream();
                close_evicted(io, permit, &lingering).await;
            }
        }
        shared.activity.touch();
    });
}

/// What a connection task watches besides hyper: once the request head
/// has arrived, whether the client hung up; before, whether the
/// connection was chosen for eviction.
struct ClientWatch<'a, 't> {
    fd: RawFd,
    ticket: Arc<Ticket>,
    evict: &'t CancellationToken,
    evicted: Pin<&'a mut WaitForCancellationFuture<'t>>,
    /// Whether an eviction that came as the head arrived was declined.
    declined: bool,
    first_poll: bool,
    hang_up_check: Option<Interval>,
}

impl ClientWatch<'_, '_> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Ended> {
        if self.first_poll {
            self.first_poll = false;
            self.ticket.polled();
        }
        if self.ticket.is_busy() {
            let check = self.hang_up_check.get_or_insert_with(|| {
                // The first check one period in: the client has just sent
                // its request, and a call that ends sooner never wakes the
                // task for a check.
                let first = tokio::time::Instant::now() + HANG_UP_CHECK;
                let mut i = tokio::time::interval_at(first, HANG_UP_CHECK);
                i.set_missed_tick_behavior(MissedTickBehavior::Delay);
                i
            });
            while check.poll_tick(cx).is_ready() {
                if peer_hung_up(self.fd) {
                    return Poll::Ready(Ended::HungUp);
                }
            }
            // Chosen for eviction as its head arrived: a request in
            // progress is never evicted.
            if !self.declined && self.evict.is_cancelled() {
                self.declined = true;
                self.ticket.decline();
            }
        } else if self.evicted.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ended::Evicted);
        }
        Poll::Pending
    }
}

/// After hyper is done: writes what it has not written yet (its own error
/// answer, replaced), then closes: at once when the whole request was read
/// (`read_whole`) and nothing more from the client waits unread, as the
/// answer is already in the client's socket and closing discards nothing;
/// else lingering, in the connection's slot.
async fn close_served(
    result: Result<(), hyper::Error>,
    mut io: ConnIo,
    read_whole: bool,
    permit: Option<OwnedSemaphorePermit>,
) {
    if let Err(e) = result {
        debug!(cause = %e, "connection ended with an error");
    }
    let flushed = tokio::time::timeout(conn_io::LINGER_TIME, io.flush()).await;
    if matches!(flushed, Ok(Ok(()))) {
        let stream = io.into_stream();
        if !(read_whole && conn_io::nothing_unread(&stream)) {
            conn_io::linger(stream, None).await;
        }
    }
    drop(permit);
}

/// Tells an evicted client why, best effort and never waiting on it (it
/// sent nothing that needs an answer). Its slot is free at once; it reads
/// the answer while the connection lingers in a place of its own.
async fn close_evicted(
    io: UnixStream,
    permit: Option<OwnedSemaphorePermit>,
    lingering: &Arc<Semaphore>,
) {
    let _ = io.try_write(&evicted_response());
    drop(permit);
    conn_io::linger(io, Some(lingering)).await;
}

/// Answer of an evicted connection: try again later, as for an overload.
fn evicted_response() -> Vec<u8> {
    let body = api::CniError::new(
        api::code::TRY_AGAIN_LATER,
        "connection closed to make room: no request arrived on it; try again later",
    )
    .to_json();
    let mut r = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body.as_bytes());
    r
}

/// Whether the peer of the connected unix socket `fd` closed its end
/// completely (a shutdown of its write side alone is not a hang-up).
fn peer_hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one pollfd we own; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}
