//! The TCP listener of `metricsPort`: `GET /metrics` only.
//!
//! It is reachable by anyone who can reach the address, so it is kept
//! cheap: at most [`MAX_CONNECTIONS`] open connections (past that it stops
//! accepting and the kernel backlog holds the rest), each with a deadline;
//! accept errors back off exponentially with rate-limited warnings; and the
//! drain closes its connections rather than leaving them to the process
//! exit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::backoff::AcceptBackoff;
use super::routes;
use crate::metrics::Metrics;

/// Open connections at most.
pub const MAX_CONNECTIONS: usize = 16;
/// The request head must arrive within this long.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is closed after this long, whatever it is doing.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request in progress may take to finish once the drain began.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Serves `GET /metrics` on `listener` until `stop` is cancelled, then
/// closes the listener and every connection (one mid-request gets
/// `DRAIN_GRACE`, 1 s) before returning.
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    let mut backoff = AcceptBackoff::new();
    loop {
        while connections.try_join_next().is_some() {}
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                backoff.success();
                connections.spawn(serve_one(stream, metrics.clone(), permit, stop.clone()));
            }
            Err(e) => {
                // EMFILE and friends: wait instead of spinning, longer
                // each time in a row.
                let failure = backoff.failure(Instant::now());
                let delay = failure.wait;
                if let Some(suppressed) = failure.warn {
                    warn!(cause = %e, retry_in = ?delay, suppressed, "metrics listener: accept failed");
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    // Frees the port at once (a successor shares it through SO_REUSEPORT).
    drop(listener);
    let all_done = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN_GRACE * 2, all_done)
        .await
        .is_err()
    {
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
}

async fn serve_one(
    stream: TcpStream,
    metrics: Arc<Metrics>,
    permit: OwnedSemaphorePermit,
    stop: CancellationToken,
) {
    let _permit = permit;
    let service = hyper::service::service_fn(move |req| {
        std::future::ready(Ok::<_, std::convert::Infallible>(routes::metrics_only(
            &metrics, &req,
        )))
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = tokio::time::sleep(CONNECTION_TIMEOUT) => return,
        _ = stop.cancelled() => {}
    }
    // Idle connections close at once; a response being written may finish.
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(DRAIN_GRACE, conn).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn flood_should_hold_at_most_the_cap_and_the_drain_should_close_them() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve_metrics(listener, metrics, stop.clone()));
        let mut clients = Vec::new();
        for _ in 0..(MAX_CONNECTIONS + 8) {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        // The first MAX_CONNECTIONS are accepted; the rest wait in the
        // backlog, so a further client gets no answer while they are idle.
        let mut extra = TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        extra
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 16];
        let waited = tokio::time::timeout(Duration::from_millis(300), extra.read(&mut buf)).await;
        assert!(waited.is_err(), "a connection past the cap was served");
        let started = Instant::now();
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the drain ends")
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(3));
        // Accepted idle connections were closed by the drain.
        let n = tokio::time::timeout(Duration::from_secs(2), clients[0].read(&mut buf))
            .await
            .expect("closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
}
