//! Composition root and lifecycle: wires the modules together, owns the
//! signals, readiness, the status line, the watchdog and the drain.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

mod handler;

pub use handler::Networks;

use crate::activation::{Listeners, OwnedPath};
use crate::api::{self, code};
use crate::limit::{Admission, ConnectionLimit};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::server::{self, Failure, FailureKind, Handler, Reply, Shared};

/// Settings of the lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How long open connections and CNI work in flight may take to finish
    /// after a stop request.
    pub shutdown_timeout: Duration,
    /// Exit after this long without connections, requests or CNI work
    /// (off: `None`).
    pub idle_timeout: Option<Duration>,
    /// TCP port for `/metrics` besides the unix socket (off: `None`).
    pub metrics_port: Option<u16>,
}

/// What the daemon inherits from its environment besides the config.
#[derive(Debug)]
pub struct Environment {
    pub notifier: Notifier,
    /// Ping interval systemd expects (`WatchdogSec=`), if enabled.
    pub watchdog: Option<Duration>,
    /// The registry every module reports into.
    pub metrics: Arc<Metrics>,
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Idle,
    TakenOver,
}

/// Answers every CNI request with "no networks are configured" until the
/// engine is configured.
#[derive(Debug, Default)]
pub struct Unconfigured;

impl Handler for Unconfigured {
    async fn cni(&self, _request: api::Request) -> Result<Reply, Failure> {
        Err(Failure::new(
            FailureKind::Failed,
            code::INVALID_NETWORK_CONFIG,
            "no networks are configured: set clusterNetwork in the daemon configuration",
        ))
    }

    async fn delegate(&self, request: api::Request) -> Result<Reply, Failure> {
        self.cni(request).await
    }
}

/// Runs the daemon until a stop request and the drain that follows.
pub async fn run<H: Handler>(
    config: crate::config::Config,
    listeners: Listeners,
    env: Environment,
    handler: H,
) -> anyhow::Result<StopReason> {
    let metrics = env.metrics.clone();
    let Listeners { sockets, owned } = listeners;
    let mut tokio_listeners = Vec::with_capacity(sockets.len());
    for s in sockets {
        tokio_listeners.push(UnixListener::from_std(s)?);
    }
    let drain_backlog = owned.is_some();
    let shared = Arc::new(Shared::new(
        config.server.clone(),
        handler,
        Admission::new(&config.limit, metrics.clone()),
        metrics.clone(),
    ));
    let trigger = CancellationToken::new();
    let stop_serving = CancellationToken::new();
    let reason = Arc::new(parking_reason());

    let mut metrics_task = None;
    if let Some(port) = config.daemon.metrics_port {
        let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
        metrics_task = Some(tokio::spawn(server::serve_metrics(
            listener,
            metrics.clone(),
            stop_serving.clone(),
        )));
    }

    let serving = tokio::spawn(server::run(
        tokio_listeners,
        shared.clone(),
        ConnectionLimit::new(&config.limit),
        stop_serving.clone(),
        config.daemon.shutdown_timeout,
        drain_backlog,
    ));

    // Registered before READY=1, so a stop request right after readiness
    // is never met by the default action (termination without a drain).
    spawn_signal_watch(signals()?, trigger.clone(), reason.clone());
    if let Some(owned) = &owned {
        spawn_takeover_watch(owned, trigger.clone(), reason.clone());
    }
    if let Some(idle) = config.daemon.idle_timeout {
        spawn_idle_watch(idle, shared.clone(), trigger.clone(), reason.clone());
    }
    let notifier = Arc::new(env.notifier);
    if let Err(e) = notifier.ready(&status_line(&shared)) {
        warn!(cause = %e, "cannot notify the service manager of readiness");
    }
    info!(
        activated = owned.is_none(),
        socket = %owned.as_ref().map(|o| o.path().display().to_string()).unwrap_or_else(|| "inherited from systemd".into()),
        "serving"
    );
    let status_task = spawn_status(notifier.clone(), shared.clone(), trigger.clone());
    let watchdog_task = env
        .watchdog
        .map(|interval| spawn_watchdog(notifier.clone(), interval));

    trigger.cancelled().await;
    let reason = reason.get();
    shared.begin_drain();
    if let Err(e) = notifier.stopping(&format!(
        "draining: {} in flight, {} queued",
        metrics.in_flight.get(),
        metrics.queued.get()
    )) {
        warn!(cause = %e, "cannot notify the service manager of stopping");
    }
    if let Some(mut owned) = owned {
        // flock + stat + unlink: off the async workers.
        let path = owned.path().display().to_string();
        let released = tokio::task::spawn_blocking(move || owned.release())
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        match released {
            Ok(true) => info!(path, "socket path removed"),
            Ok(false) => info!(path, "socket path belongs to a successor; left alone"),
            Err(e) => warn!(path, cause = %e, "cannot remove the socket path"),
        }
    }
    stop_serving.cancel();
    status_task.abort();
    let drained = serving.await?;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    if let Some(t) = watchdog_task {
        t.abort();
    }
    if drained.abandoned > 0 || drained.unfinished > 0 {
        warn!(
            connections = drained.abandoned,
            work = drained.unfinished,
            "stopped with requests unfinished"
        );
    }
    info!(?reason, served = shared.activity.served(), "stopped");
    Ok(reason)
}

/// Records the first stop reason.
#[derive(Debug)]
struct Reason(std::sync::OnceLock<StopReason>);

impl Reason {
    fn set(&self, r: StopReason) {
        let _ = self.0.set(r);
    }
    fn get(&self) -> StopReason {
        self.0.get().copied().unwrap_or(StopReason::Signal)
    }
}

fn parking_reason() -> Reason {
    Reason(std::sync::OnceLock::new())
}

fn status_line<H>(shared: &Shared<H>) -> String {
    format!(
        "serving: {} served, {} in flight, {} queued",
        shared.activity.served(),
        shared.metrics.in_flight.get(),
        shared.metrics.queued.get()
    )
}

type Signals = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

fn signals() -> std::io::Result<Signals> {
    use tokio::signal::unix::{signal, SignalKind};
    Ok((
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    ))
}

fn spawn_signal_watch(signals: Signals, trigger: CancellationToken, reason: Arc<Reason>) {
    let (mut term, mut int) = signals;
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            if trigger.is_cancelled() {
                info!(signal = name, "already stopping");
            } else {
                info!(signal = name, "stop requested");
                reason.set(StopReason::Signal);
                trigger.cancel();
            }
        }
    });
}

/// In self-bind mode: stop when a successor renames its socket over ours.
fn spawn_takeover_watch(owned: &OwnedPath, trigger: CancellationToken, reason: Arc<Reason>) {
    // Only the identity is needed; the watch never unlinks anything.
    let probe = owned.probe();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = trigger.cancelled() => return,
                _ = tick.tick() => {}
            }
            let ours = tokio::task::spawn_blocking({
                let probe = probe.clone();
                move || probe.still_ours()
            })
            .await
            .unwrap_or(true);
            if !ours {
                info!(path = %probe.path().display(), "another process took over the socket path; draining");
                reason.set(StopReason::TakenOver);
                trigger.cancel();
                return;
            }
        }
    });
}

fn spawn_idle_watch<H: Handler>(
    idle: Duration,
    shared: Arc<Shared<H>>,
    trigger: CancellationToken,
    reason: Arc<Reason>,
) {
    tokio::spawn(async move {
        loop {
            let wait = idle.saturating_sub(shared.activity.idle_for());
            tokio::select! {
                _ = trigger.cancelled() => return,
                _ = tokio::time::sleep(wait.max(Duration::from_millis(10))) => {}
            }
            // Work whose client has gone keeps the daemon busy too.
            let busy = shared.metrics.connections_open.get() > 0
                || shared.work.in_flight() > 0
                || shared.metrics.in_flight.get() > 0
                || shared.metrics.queued.get() > 0;
            if !busy && shared.activity.idle_for() >= idle {
                info!(idle = ?idle, "idle; exiting until the next connection");
                reason.set(StopReason::Idle);
                trigger.cancel();
                return;
            }
        }
    });
}

fn spawn_status<H: Handler>(
    notifier: Arc<Notifier>,
    shared: Arc<Shared<H>>,
    trigger: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if !notifier.enabled() {
            return;
        }
        let mut last = String::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = trigger.cancelled() => return,
                _ = tick.tick() => {}
            }
            let line = status_line(&shared);
            if line != last {
                let _ = notifier.status(&line);
                last = line;
            }
        }
    })
}

fn spawn_watchdog(notifier: Arc<Notifier>, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval / 4);
        loop {
            tick.tick().await;
            let _ = notifier.watchdog();
        }
    })
}
