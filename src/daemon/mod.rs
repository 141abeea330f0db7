//! Composition root and lifecycle: the only module that wires the others
//! together (configuration, listeners, server, admission, handler, engine,
//! metrics, notifications); it owns the signals, readiness, the status
//! line, the watchdog and the drain.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, UnixListener};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::activation::{self, OwnedPath, PathState};
use crate::config::{self, Lifecycle};
use crate::handler::Networks;
use crate::limit::{Admission, ConnectionLimit};
use crate::metrics::Metrics;
use crate::notify::{self, Notifier};
use crate::server::{self, Handler, Readiness, Shared};
use crate::{cni, k8s, logging, readiness_file};

pub mod check;
mod plugin_needs;

/// The exit status for a configuration that is wrong (EX_CONFIG); systemd
/// does not restart on it (`RestartPreventExitStatus=78`).
pub const EXIT_CONFIG: u8 = 78;

/// Most threads of the blocking pool (see where the runtime is built).
const BLOCKING_THREADS: usize = 64;
/// How long an idle blocking-pool thread stays (tokio's default is 10 s).
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(3);
/// The async runtime's worker threads. Its work per call (HTTP, JSON, the
/// engine's bookkeeping) is a small part of a call; the plugins run in
/// their own processes and file work on the blocking pool. A second worker
/// mostly woke up to find nothing to steal: with one, plexusd's CPU per
/// loopback ADD+DEL fell by about a tenth (16 context switches fewer per
/// pair), at the same burst rates.
const WORKER_THREADS: usize = 1;

/// How a start-up or a run of the daemon ended, for the process's exit
/// status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Served, then stopped for this reason.
    Stopped(StopReason),
    /// The configuration (or the environment systemd passed) is wrong;
    /// restarting will not help.
    Config,
    /// The operating system refused something the daemon needs.
    Os,
    /// Serving failed after start-up.
    Failed,
}

/// Starts the daemon from a validated configuration and runs it until it
/// stops. Start-up, in this order: path checks, logging, inherited sockets
/// (before any thread exists), runtime, then everything else that can fail
/// (metrics port, signal handlers, engine and state directory), and only
/// then, last, the socket path is taken over in self-bind mode: a new
/// daemon that fails leaves the one it would replace serving.
///
/// Must be called from the process's main thread before any other thread
/// exists (it reads and clears `LISTEN_*`); blocks until the daemon stops.
pub fn main(config: config::Config) -> Exit {
    // Before any thread exists: this clears LISTEN_* from the environment.
    // A refused activation is reported once logging is up.
    let inherited = activation::inherited();
    // socketDir is written only when binding the socket ourselves.
    let activated = !matches!(inherited, Ok(None));
    // Before anything is opened or created in them (the log file next).
    if let Err(e) = config.check_paths(config::PathScope {
        socket_dir: !activated,
    }) {
        eprintln!("plexusd: {e}");
        return Exit::Config;
    }
    if let Err(e) = logging::init(&config.logging) {
        eprintln!("plexusd: {:#}", anyhow::Error::from(e));
        return Exit::Config;
    }
    for key in &config.unknown_keys {
        let nearest = config::nearest_known_key(key).unwrap_or_default();
        warn!(file = %config.path.display(), key, did_you_mean = nearest, "unknown configuration key is ignored");
    }
    let inherited = match inherited {
        Ok(l) => l,
        Err(e) => {
            error!("{:#}", anyhow::Error::from(e));
            return Exit::Config;
        }
    };
    let notifier = Notifier::from_env().unwrap_or_else(|e| {
        warn!(cause = %e, "NOTIFY_SOCKET is unusable; not notifying");
        Notifier::disabled()
    });
    let watchdog = notify::watchdog_interval(
        std::env::var(notify::ENV_WATCHDOG_USEC).ok().as_deref(),
        std::env::var(notify::ENV_WATCHDOG_PID).ok().as_deref(),
        std::process::id(),
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("plexusd")
        // File work (locks, records and their fsyncs, config stats) is
        // short: a few dozen threads keep a burst's disk waits overlapped,
        // where tokio's default of 512 lets a burst of hundreds of calls
        // start a thread (stack and malloc arena) for each.
        .max_blocking_threads(BLOCKING_THREADS)
        // A burst's extra threads (and their stacks) go soon after it.
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .worker_threads(WORKER_THREADS)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            error!(cause = %e, "cannot start the async runtime");
            return Exit::Os;
        }
    };
    let _context = runtime.enter();
    let prepared = match Prepared::new(&config.lifecycle) {
        Ok(p) => p,
        Err(e) => {
            error!("{:#}", anyhow::Error::from(e));
            return Exit::Os;
        }
    };
    let metrics = Arc::new(Metrics::new());
    let env = Environment {
        notifier,
        watchdog,
        metrics: metrics.clone(),
    };
    let selection = config.selection.clone();
    if !selection.base().has_networks() {
        info!(
            "clusterNetwork is not set: each call's network configuration must name the \
             cluster network (clusterNetwork or delegates), as multus's 00-multus.conf does"
        );
    }
    // Blocking, on the main thread: creates the state directory.
    let engine = match cni::Engine::new(config.cni.clone(), Some(metrics)) {
        Ok(e) => Arc::new(e),
        Err(e) => {
            error!("{e}");
            return Exit::Os;
        }
    };
    // Again now that the state directory exists: one planted between the
    // first check and its creation is caught.
    if let Err(e) = config.check_paths(config::PathScope { socket_dir: false }) {
        error!("{e}");
        return Exit::Config;
    }
    // Fallible (credentials, kubeconfig), so before the socket is taken;
    // it waits for nothing: the caches fill while the daemon serves.
    let kubernetes = if config.kubernetes.enabled() {
        k8s::tune_allocator_for_lists();
        match runtime.block_on(k8s::Source::start(config.kubernetes.clone())) {
            Ok(source) => {
                info!(node = %config.kubernetes.node_name, "watching this node's pods and the NetworkAttachmentDefinitions");
                Some(source)
            }
            Err(e) => {
                error!("{:#}", anyhow::Error::from(e));
                return Exit::Config;
            }
        }
    } else {
        None
    };
    let cleanups = engine.clone();
    let mut handler = Networks::new(
        engine,
        selection,
        kubernetes,
        config.kubernetes.sync_timeout,
        config.limit.queue_timeout,
    );
    if let Some(file) = &config.readiness_file {
        info!(path = %file.path.display(), timeout = %crate::duration::format(file.timeout), "ADD, STATUS and GC wait for the readiness indicator file");
        handler = handler.with_readiness_file(readiness_file::Indicator::watch(file.clone()));
    }
    let check = handler.clone();
    let rt = runtime.handle().clone();
    serve(
        &runtime,
        config,
        inherited,
        prepared,
        env,
        handler,
        move || {
            // In the background: it runs each plugin's VERSION (warming the
            // cache) and must not delay readiness.
            rt.spawn(async move {
                for problem in check.preflight().await {
                    warn!(%problem, "network check at start-up failed; ADD will fail until this is fixed");
                }
            });
            rt.spawn(retry_cleanups(cleanups));
        },
    )
}

/// plexusd's own retries of DELs that failed (docs/records.md, "Pending
/// cleanup"): every one recorded at start-up, then each as it falls due.
async fn retry_cleanups(engine: Arc<cni::Engine>) {
    if let Err(e) = engine.scan_cleanups().await {
        warn!(cause = %e, "cannot look for DELs to retry at start-up");
    }
    engine.retry_cleanups(true).await;
    let tick = engine.cleanup_tick();
    loop {
        tokio::time::sleep(tick).await;
        engine.retry_cleanups(false).await;
    }
}

/// Takes the listeners over (the last fallible start-up step), then runs
/// `after_listen` and the daemon.
fn serve<H: Handler>(
    runtime: &tokio::runtime::Runtime,
    config: config::Config,
    inherited: Option<Vec<std::os::unix::net::UnixListener>>,
    prepared: Prepared,
    env: Environment,
    handler: H,
    after_listen: impl FnOnce(),
) -> Exit {
    let listening = match listen(&config.activation, inherited) {
        Ok(l) => l,
        Err(e) => {
            let exit = match e {
                StartError::Listen(_) => Exit::Config,
                _ => Exit::Os,
            };
            error!("{:#}", anyhow::Error::from(e));
            return exit;
        }
    };
    after_listen();
    match runtime.block_on(run(config, listening, prepared, env, handler)) {
        Ok(reason) => Exit::Stopped(reason),
        Err(e) => {
            error!("{e:#}");
            Exit::Failed
        }
    }
}

/// What the daemon inherits from its environment besides the config.
#[derive(Debug)]
struct Environment {
    notifier: Notifier,
    /// Ping interval systemd expects (`WatchdogSec=`), if enabled.
    watchdog: Option<Duration>,
    /// The registry every module reports into.
    metrics: Arc<Metrics>,
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Idle,
    TakenOver,
}

/// Why start-up failed (before anything was served).
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("cannot listen on {addr} for metricsPort")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot install the SIGTERM/SIGINT handlers")]
    Signals(#[source] io::Error),
    #[error(transparent)]
    Listen(#[from] activation::Error),
    #[error("cannot register the listening socket with the async runtime")]
    Register(#[source] io::Error),
}

/// What start-up sets up before the socket path is taken over: everything
/// that can fail, so that a successor that fails leaves its predecessor
/// serving.
#[derive(Debug)]
struct Prepared {
    metrics: Option<TcpListener>,
    signals: Signals,
}

impl Prepared {
    /// Binds `metricsPort` and installs the signal handlers. Must run
    /// within the runtime's context (`Runtime::enter`).
    fn new(config: &Lifecycle) -> Result<Self, StartError> {
        let metrics = match config.metrics_port {
            Some(port) => Some(bind_metrics(SocketAddr::new(
                config.metrics_bind_address,
                port,
            ))?),
            None => None,
        };
        // Installed before READY=1, so a stop request right after readiness
        // is never met by the default action (termination without a drain).
        let signals = signals().map_err(StartError::Signals)?;
        Ok(Self { metrics, signals })
    }
}

/// The metrics listener, with `SO_REUSEPORT` so that a successor can bind
/// the port while its predecessor still holds it (only processes of the
/// same user can share it).
fn bind_metrics(addr: SocketAddr) -> Result<TcpListener, StartError> {
    let err = |source| StartError::Metrics { addr, source };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    socket.set_reuseport(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(1024).map_err(err)
}

/// The sockets to serve, registered with the runtime, and in self-bind
/// mode the path this daemon took over.
#[derive(Debug)]
struct Listening {
    sockets: Vec<UnixListener>,
    owned: Option<OwnedPath>,
}

/// The last start-up step: registers the inherited sockets, or in
/// self-bind mode binds a socket (privately), registers it and only then
/// renames it over the socket path. Must run within the runtime's context,
/// outside of any task (it blocks on the lock file).
fn listen(
    config: &activation::Config,
    inherited: Option<Vec<std::os::unix::net::UnixListener>>,
) -> Result<Listening, StartError> {
    let register = |s| UnixListener::from_std(s).map_err(StartError::Register);
    if let Some(inherited) = inherited {
        let sockets = inherited
            .into_iter()
            .map(register)
            .collect::<Result<_, _>>()?;
        return Ok(Listening {
            sockets,
            owned: None,
        });
    }
    let (socket, pending) = activation::stage(config)?;
    let socket = register(socket)?;
    let owned = pending.publish()?;
    Ok(Listening {
        sockets: vec![socket],
        owned: Some(owned),
    })
}

/// Runs the daemon until a stop request and the drain that follows.
async fn run<H: Handler>(
    config: config::Config,
    listening: Listening,
    prepared: Prepared,
    env: Environment,
    handler: H,
) -> anyhow::Result<StopReason> {
    let metrics = env.metrics.clone();
    let Listening { sockets, owned } = listening;
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
    let connections = ConnectionLimit::new(&config.limit);
    let grace = config.lifecycle.shutdown_timeout;

    let metrics_task = prepared.metrics.map(|listener| {
        tokio::spawn(server::serve_metrics(
            listener,
            metrics.clone(),
            stop_serving.clone(),
        ))
    });

    let serving = tokio::spawn(server::run(
        sockets,
        shared.clone(),
        connections.clone(),
        stop_serving.clone(),
        grace,
        drain_backlog,
    ));

    spawn_signal_watch(prepared.signals, trigger.clone(), reason.clone());
    let socket_name = owned
        .as_ref()
        .map(|o| o.path().display().to_string())
        .unwrap_or_else(|| "inherited from systemd".into());
    let owned = owned.map(|o| Arc::new(Mutex::new(o)));
    // Sockets put back over the path after an impostor replaced it.
    let (restored_tx, mut restored_rx) = tokio::sync::mpsc::unbounded_channel();
    if let Some(owned) = &owned {
        spawn_takeover_watch(owned.clone(), trigger.clone(), reason.clone(), restored_tx);
    }
    if let Some(idle) = config.lifecycle.idle_timeout {
        spawn_idle_watch(idle, shared.clone(), trigger.clone(), reason.clone());
    }
    let notifier = Arc::new(env.notifier);
    // Serving already (calls that can be served are), but READY=1 waits
    // for the handler's sources, bounded by the handler; a stop request
    // meanwhile wins.
    if shared.handler.readiness() != Readiness::Ready {
        let mut last = status_line(&shared);
        if let Err(e) = notifier.status(&last) {
            warn!(cause = %e, "cannot send STATUS= to the service manager");
        }
        // STATUS= stays current meanwhile: it names why the sources are
        // not there yet (a refused certificate, 401) as soon as known.
        let settle = shared.handler.settle();
        tokio::pin!(settle);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = trigger.cancelled() => break,
                _ = &mut settle => break,
                _ = tick.tick() => {
                    let line = status_line(&shared);
                    if line != last {
                        let _ = notifier.status(&line);
                        last = line;
                    }
                }
            }
        }
    }
    if let Err(e) = notifier.ready(&status_line(&shared)) {
        warn!(cause = %e, "cannot notify the service manager of readiness");
    }
    info!(activated = owned.is_none(), socket = %socket_name, "serving");
    let status_task = spawn_status(notifier.clone(), shared.clone(), trigger.clone());
    let watchdog_task = env
        .watchdog
        .map(|interval| spawn_watchdog(notifier.clone(), interval));

    let mut extra_serving = Vec::new();
    loop {
        tokio::select! {
            _ = trigger.cancelled() => break,
            Some(socket) = restored_rx.recv() => {
                // The same connection cap and drain as the first socket.
                extra_serving.push(tokio::spawn(server::run(
                    vec![socket],
                    shared.clone(),
                    connections.clone(),
                    stop_serving.clone(),
                    grace,
                    drain_backlog,
                )));
            }
        }
    }
    let reason = reason.get();
    shared.begin_drain();
    if let Err(e) = notifier.stopping(&format!(
        "draining: {} in flight, {} queued",
        metrics.in_flight.get(),
        metrics.queued.get()
    )) {
        warn!(cause = %e, "cannot notify the service manager of stopping");
    }
    if let Some(owned) = owned {
        // flock + stat + unlink: off the async workers.
        let path = socket_name.clone();
        let released = tokio::task::spawn_blocking(move || lock_owned(&owned).release())
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
    let mut drained = serving.await?;
    for extra in extra_serving {
        let d = extra.await?;
        drained.abandoned += d.abandoned;
        // Every server counts the same CNI work.
        drained.unfinished = drained.unfinished.max(d.unfinished);
    }
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

/// The owned path, also after a panic elsewhere (it is plain data).
fn lock_owned(owned: &Mutex<OwnedPath>) -> std::sync::MutexGuard<'_, OwnedPath> {
    owned.lock().unwrap_or_else(PoisonError::into_inner)
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

fn status_line<H: Handler>(shared: &Shared<H>) -> String {
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

/// The signals plexusd handles: the ones that stop it (SIGTERM, SIGINT,
/// SIGQUIT: a drain, then exit, the socket path released when it bound
/// it), and the ones whose default action would kill it without a word
/// (SIGHUP, SIGUSR1, SIGUSR2: logged and ignored).
#[derive(Debug)]
struct Signals {
    stop: Vec<(&'static str, tokio::signal::unix::Signal)>,
    ignored: Vec<(&'static str, tokio::signal::unix::Signal)>,
}

fn signals() -> std::io::Result<Signals> {
    use tokio::signal::unix::{signal, SignalKind};
    Ok(Signals {
        stop: vec![
            ("SIGTERM", signal(SignalKind::terminate())?),
            ("SIGINT", signal(SignalKind::interrupt())?),
            ("SIGQUIT", signal(SignalKind::quit())?),
        ],
        ignored: vec![
            ("SIGHUP", signal(SignalKind::hangup())?),
            ("SIGUSR1", signal(SignalKind::user_defined1())?),
            ("SIGUSR2", signal(SignalKind::user_defined2())?),
        ],
    })
}

/// The first of `signals` to arrive (never, if there are none).
async fn next_signal(signals: &mut [(&'static str, tokio::signal::unix::Signal)]) -> &'static str {
    let waits = signals.iter_mut().map(|(name, s)| {
        Box::pin(async move {
            s.recv().await;
            *name
        })
    });
    futures_util::future::select_all(waits).await.0
}

fn spawn_signal_watch(signals: Signals, trigger: CancellationToken, reason: Arc<Reason>) {
    let Signals {
        mut stop,
        mut ignored,
    } = signals;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                name = next_signal(&mut stop) => {
                    if trigger.is_cancelled() {
                        info!(signal = name, "already stopping");
                    } else {
                        info!(signal = name, "stop requested");
                        reason.set(StopReason::Signal);
                        trigger.cancel();
                    }
                }
                name = next_signal(&mut ignored) => {
                    info!(
                        signal = name,
                        "ignored: nothing is reloaded on a signal. Networks in confDir and \
                         NetworkAttachmentDefinitions are read as they change; a change of \
                         daemon-config.json takes a restart (systemctl restart plexusd: systemd \
                         keeps the socket, so calls wait rather than fail)"
                    );
                }
            }
        }
    });
}

/// In self-bind mode: stop when a successor renames its socket over ours.
///
/// Only a socket owned by root (or our own user) is a successor's. Anything
/// else at the path is an impostor (or the path was removed): the daemon
/// says so loudly, keeps serving, and puts a socket of its own back over
/// the path (under the lock, so a real successor always wins); the new
/// socket goes to `restored` to be served.
fn spawn_takeover_watch(
    owned: Arc<Mutex<OwnedPath>>,
    trigger: CancellationToken,
    reason: Arc<Reason>,
    restored: tokio::sync::mpsc::UnboundedSender<UnixListener>,
) {
    tokio::spawn(async move {
        let path = lock_owned(&owned).path().display().to_string();
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        // The last state reported, so a lasting one is logged once.
        let mut reported = None;
        loop {
            tokio::select! {
                _ = trigger.cancelled() => return,
                _ = tick.tick() => {}
            }
            let state = tokio::task::spawn_blocking({
                let owned = owned.clone();
                move || lock_owned(&owned).probe().state()
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
                    reason.set(StopReason::TakenOver);
                    trigger.cancel();
                    return;
                }
                PathState::Foreign { uid, mode, socket } if reported != Some(state) => {
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
                PathState::Missing if reported != Some(state) => {
                    warn!(
                        path,
                        "the socket path was removed; putting our own socket back"
                    );
                }
                PathState::Foreign { .. } | PathState::Missing => {}
            }
            reported = Some(state);
            let outcome = tokio::task::spawn_blocking({
                let owned = owned.clone();
                move || lock_owned(&owned).restore()
            })
            .await;
            match outcome {
                Ok(Ok(Some(socket))) => match UnixListener::from_std(socket) {
                    Ok(socket) => {
                        info!(path, "socket path restored; serving on it again");
                        reported = None;
                        if restored.send(socket).is_err() {
                            return;
                        }
                    }
                    Err(e) => error!(path, cause = %e, "cannot serve the restored socket"),
                },
                // Not a socket (left alone), or a successor came meanwhile
                // (seen on the next tick).
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    error!(path, cause = %anyhow::Error::from(e), "cannot restore the socket path")
                }
                Err(e) => error!(path, cause = %e, "cannot restore the socket path"),
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
