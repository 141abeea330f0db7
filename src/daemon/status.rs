//! What the service manager hears: the STATUS= line (kept current),
//! READY=1 once the handler's sources have settled, STOPPING=1 at the
//! drain, and the watchdog pings.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::warn;

use super::Stop;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::server::{Handler, Readiness, Shared};

/// How often the STATUS= line is brought up to date.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// The STATUS= line: readiness, then what has been served and what waits.
fn line<H: Handler>(shared: &Shared<H>) -> String {
    let counts = format!(
        "{} served, {} in flight, {} queued",
        shared.activity.served(),
        shared.metrics.in_flight.get(),
        shared.metrics.queued.get()
    );
    match shared.handler.readiness() {
        Readiness::Ready => format!("serving: {counts}"),
        Readiness::Starting(why) => format!("starting: {why}; {counts}"),
        Readiness::Degraded(why) => format!("serving, degraded: {why}; {counts}"),
        Readiness::NotReady(why) => format!("serving, not ready: {why}; {counts}"),
    }
}

/// Sends READY=1 once the handler's sources have settled (bounded by the
/// handler), or at once when a stop is requested meanwhile. The daemon is
/// serving already: the calls that can be served are.
pub(super) async fn announce_ready<H: Handler>(
    notifier: &Notifier,
    shared: &Shared<H>,
    stop: &Stop,
) {
    if shared.handler.readiness() != Readiness::Ready {
        wait_for_sources(notifier, shared, stop).await;
    }
    if let Err(e) = notifier.ready(&line(shared)) {
        warn!(cause = %e, "cannot notify the service manager of readiness");
    }
}

/// Waits for the handler to settle, keeping STATUS= current meanwhile: it
/// names why the sources are not there yet (a refused certificate, 401) as
/// soon as that is known.
async fn wait_for_sources<H: Handler>(notifier: &Notifier, shared: &Shared<H>, stop: &Stop) {
    let mut last = line(shared);
    if let Err(e) = notifier.status(&last) {
        warn!(cause = %e, "cannot send STATUS= to the service manager");
    }
    let settle = shared.handler.settle();
    tokio::pin!(settle);
    let mut tick = tokio::time::interval(STATUS_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.requested() => break,
            _ = &mut settle => break,
            _ = tick.tick() => {
                let line = line(shared);
                if line != last {
                    let _ = notifier.status(&line);
                    last = line;
                }
            }
        }
    }
}

/// Keeps STATUS= current while serving, until a stop is requested.
pub(super) fn spawn_updates<H: Handler>(
    notifier: Arc<Notifier>,
    shared: Arc<Shared<H>>,
    stop: Arc<Stop>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        if !notifier.enabled() {
            return;
        }
        let mut last = String::new();
        let mut tick = tokio::time::interval(STATUS_INTERVAL);
        loop {
            tokio::select! {
                _ = stop.requested() => return,
                _ = tick.tick() => {}
            }
            let line = line(&shared);
            if line != last {
                let _ = notifier.status(&line);
                last = line;
            }
        }
    })
}

/// Sends STOPPING=1 with what the drain waits for.
pub(super) fn notify_stopping(notifier: &Notifier, metrics: &Metrics) {
    if let Err(e) = notifier.stopping(&format!(
        "draining: {} in flight, {} queued",
        metrics.in_flight.get(),
        metrics.queued.get()
    )) {
        warn!(cause = %e, "cannot notify the service manager of stopping");
    }
}

/// Pings the watchdog four times per `interval` (`WatchdogSec=`).
pub(super) fn spawn_watchdog(notifier: Arc<Notifier>, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval / 4);
        loop {
            tick.tick().await;
            let _ = notifier.watchdog();
        }
    })
}
