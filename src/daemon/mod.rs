//! Composition root and lifecycle: the only module that wires the others
//! together (configuration, listeners, server, admission, handler, engine,
//! metrics, notifications); it owns the signals, readiness, the status
//! line, the watchdog and the drain.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, UnixListener};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::activation::{self, OwnedPath};
use crate::config::{self, Lifecycle};
use crate::handler::CniHandler;
use crate::limit::{Admission, ConnectionLimit};
use crate::metrics::Metrics;
use crate::notify::{self, Notifier};
use crate::server::{self, Drained, Handler, Shared};
use crate::{cni, k8s, logging, readiness_file, reconcile};

use signals::Signals;

pub mod check;
mod plugin_needs;
mod signals;
mod socket_path;
mod status;

/// The exit status for a configuration that is wrong (EX_CONFIG); systemd
/// does not restart on it (`RestartPreventExitStatus=78`).
pub const EXIT_CONFIG: u8 = 78;
/// The exit status when the operating system refused something plexusd
/// needs (EX_OSERR).
pub const EXIT_OS: u8 = 71;

/// Most threads of the blocking pool (see where the runtime is built).
const BLOCKING_THREADS: usize = 64;
/// How long an idle blocking-pool thread stays (tokio's default is 10 s).
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(3);

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
    if let Err(exit) = start_logging(&config, activated) {
        return exit;
    }
    let inherited = match inherited {
        Ok(l) => l,
        Err(e) => {
            error!("{:#}", anyhow::Error::from(e));
            return Exit::Config;
        }
    };
    let (notifier, watchdog) = service_manager_from_env();
    crate::memory::few_arenas();
    let runtime = match build_runtime() {
        Ok(r) => r,
        Err(e) => {
            error!(cause = %e, "cannot start the async runtime");
            return Exit::Os;
        }
    };
    let _context = runtime.enter();
    let signals_and_port = match SignalsAndMetricsPort::try_new(&config.lifecycle) {
        Ok(p) => p,
        Err(e) => {
            error!("{:#}", anyhow::Error::from(e));
            return Exit::Os;
        }
    };
    let metrics = Arc::new(Metrics::new());
    let (mut handler, engine) = match networks_handler(&runtime, &config, metrics.clone()) {
        Ok(h) => h,
        Err(exit) => return exit,
    };
    let reporting = Reporting {
        notifier,
        watchdog,
        metrics,
    };
    let reconciling = reconciling(&config);
    if let Some(r) = &reconciling {
        // GC keeps the containers the runtime still has.
        handler = handler.with_runtime(
            r.socket.clone(),
            r.settings.call_timeout(),
            r.settings.grace,
        );
    }
    let background = background_work(
        runtime.handle().clone(),
        handler.clone(),
        engine,
        reconciling,
    );
    serve(
        &runtime,
        config,
        inherited,
        signals_and_port,
        reporting,
        handler,
        background,
    )
}

/// Checks the paths (before anything is opened or created in them, the
/// log file first), starts logging, and warns of unknown keys. Its errors
/// go to stderr: there is no log yet.
fn start_logging(config: &config::Config, activated: bool) -> Result<(), Exit> {
    if let Err(e) = config.check_paths(config::PathScope {
        socket_dir: !activated,
    }) {
        eprintln!("plexusd: {e}");
        return Err(Exit::Config);
    }
    if let Err(e) = logging::init(&config.logging) {
        eprintln!("plexusd: {:#}", anyhow::Error::from(e));
        return Err(Exit::Config);
    }
    for key in &config.unknown_keys {
        let nearest = config::nearest_known_key(key).unwrap_or_default();
        warn!(file = %config.path.display(), key, did_you_mean = nearest, "unknown configuration key is ignored");
    }
    Ok(())
}

/// The service manager's notify socket and the watchdog interval it
/// expects, from the environment it set.
fn service_manager_from_env() -> (Notifier, Option<Duration>) {
    let notifier = Notifier::from_env().unwrap_or_else(|e| {
        warn!(cause = %e, "NOTIFY_SOCKET is unusable; not notifying");
        Notifier::disabled()
    });
    let watchdog = notify::watchdog_interval(
        std::env::var(notify::ENV_WATCHDOG_USEC).ok().as_deref(),
        std::env::var(notify::ENV_WATCHDOG_PID).ok().as_deref(),
        std::process::id(),
    );
    (notifier, watchdog)
}

/// The async runtime: the main thread runs every task. Its work per call
/// (HTTP, JSON, the engine's bookkeeping) is a small part of a call; the
/// plugins run in their own processes and file work on the blocking pool.
/// A worker thread beside the main one (tokio's multi-thread scheduler with
/// one worker) kept a malloc arena and a stack of its own: on one thread,
/// plexusd's resident set after 300 loopback ADDs and DELs was 0.9-1.3 MiB
/// smaller, at the same latency and CPU per call. Nothing on it may block:
/// file work goes to the pool.
fn build_runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("plexusd")
        // File work (locks, records and their fsyncs, config stats) is
        // short: a few dozen threads keep a burst's disk waits overlapped,
        // where tokio's default of 512 lets a burst of hundreds of calls
        // start a thread (stack and malloc arena) for each.
        .max_blocking_threads(BLOCKING_THREADS)
        // A burst's extra threads (and their stacks) go soon after it.
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
}

/// The handler and its engine. Creates the state directory (blocking, on
/// the main thread) and starts the Kubernetes watches when configured.
fn networks_handler(
    runtime: &tokio::runtime::Runtime,
    config: &config::Config,
    metrics: Arc<Metrics>,
) -> Result<(CniHandler, Arc<cni::Engine>), Exit> {
    let selection = config.selection.clone();
    if !selection.base().has_networks() {
        info!(
            "clusterNetwork is not set: each call's network configuration must name the \
             cluster network (clusterNetwork or delegates), as multus's 00-multus.conf does"
        );
    }
    let engine = match cni::Engine::new(config.cni.clone(), Some(metrics)) {
        Ok(e) => Arc::new(e),
        Err(e) => {
            error!("{e}");
            return Err(Exit::Os);
        }
    };
    // Again now that the state directory exists: one planted between the
    // first check and its creation is caught.
    if let Err(e) = config.check_paths(config::PathScope { socket_dir: false }) {
        error!("{e}");
        return Err(Exit::Config);
    }
    let kubernetes = start_kubernetes(runtime, &config.kubernetes)?;
    let mut handler = CniHandler::new(
        engine.clone(),
        selection,
        kubernetes,
        config.kubernetes.sync_timeout,
        config.limit.queue_timeout,
    );
    if let Some(file) = &config.readiness_file {
        info!(path = %file.path.display(), timeout = %crate::duration::format(file.timeout), "ADD, STATUS and GC wait for the readiness indicator file");
        handler = handler.with_readiness_file(readiness_file::Indicator::watch(file.clone()));
    }
    Ok((handler, engine))
}

/// The watches of this node's pods and the NetworkAttachmentDefinitions,
/// when enabled. Fallible (credentials, kubeconfig), so before the socket
/// is taken; it waits for nothing: the caches fill while the daemon serves.
fn start_kubernetes(
    runtime: &tokio::runtime::Runtime,
    config: &k8s::Config,
) -> Result<Option<k8s::Source>, Exit> {
    if !config.enabled() {
        return Ok(None);
    }
    k8s::tune_allocator_for_lists();
    match runtime.block_on(k8s::Source::start(config.clone())) {
        Ok(source) => {
            info!(node = %config.node_name, "watching this node's pods and the NetworkAttachmentDefinitions");
            Ok(Some(source))
        }
        Err(e) => {
            error!("{:#}", anyhow::Error::from(e));
            Err(Exit::Config)
        }
    }
}

/// Reconciling with the runtime, when it is on: its settings, the CRI
/// socket (looked for now, when not configured) and the state directory.
/// Says once in the log when it is off. Blocking.
fn reconciling(config: &config::Config) -> Option<Reconciling> {
    let settings = config.reconcile.clone();
    match settings.socket_to_use() {
        Ok(socket) => {
            info!(socket = %socket.display(), grace = %crate::duration::format(settings.grace), interval = %crate::duration::format(settings.interval), "reconciling the records with the runtime's pod sandboxes");
            Some(Reconciling {
                settings,
                socket,
                state_dir: config.cni.state_dir.clone(),
            })
        }
        Err(why) => {
            info!(why, "reconciling with the runtime's pod sandboxes is off");
            None
        }
    }
}

/// What [`reconcile::run`] needs.
struct Reconciling {
    settings: reconcile::Config,
    socket: std::path::PathBuf,
    state_dir: std::path::PathBuf,
}

/// What starts once the socket is taken, in the background: the network
/// check (it runs each plugin's VERSION, warming the cache, and must not
/// delay readiness), plexusd's own retries of failed DELs, and the
/// reconcile rounds when on.
fn background_work(
    runtime: tokio::runtime::Handle,
    check: CniHandler,
    cleanups: Arc<cni::Engine>,
    reconciling: Option<Reconciling>,
) -> impl FnOnce() {
    move || {
        runtime.spawn(async move {
            for problem in check.preflight().await {
                warn!(%problem, "network check at start-up failed; ADD will fail until this is fixed");
            }
        });
        if let Some(r) = reconciling {
            runtime.spawn(reconcile::run(
                cleanups.clone(),
                r.settings,
                r.socket,
                r.state_dir,
            ));
        }
        runtime.spawn(retry_cleanups(cleanups));
    }
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
    signals_and_port: SignalsAndMetricsPort,
    reporting: Reporting,
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
    match runtime.block_on(run(config, listening, signals_and_port, reporting, handler)) {
        Ok(reason) => Exit::Stopped(reason),
        Err(e) => {
            error!("{e:#}");
            Exit::Failed
        }
    }
}

/// Where the daemon reports: the service manager (notifications, and the
/// watchdog when it expects pings) and the metrics registry.
#[derive(Debug)]
struct Reporting {
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

/// The stop request every part of the daemon waits on, with the reason
/// of the first one.
#[derive(Debug, Default)]
struct Stop {
    token: CancellationToken,
    reason: OnceLock<StopReason>,
}

impl Stop {
    /// Requests the stop; the first request's reason is the one kept.
    fn request(&self, reason: StopReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    fn is_requested(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once the stop is requested.
    async fn requested(&self) {
        self.token.cancelled().await
    }

    /// Why the daemon stops.
    fn reason(&self) -> StopReason {
        self.reason.get().copied().unwrap_or(StopReason::Signal)
    }
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

/// The signal handlers and the `metricsPort` listener: set up before the
/// socket path is taken over, as everything that can fail is, so that a
/// successor that fails leaves its predecessor serving.
#[derive(Debug)]
struct SignalsAndMetricsPort {
    signals: Signals,
    metrics_port: Option<TcpListener>,
}

impl SignalsAndMetricsPort {
    /// Binds `metricsPort` and installs the signal handlers. Must run
    /// within the runtime's context (`Runtime::enter`).
    fn try_new(config: &Lifecycle) -> Result<Self, StartError> {
        let metrics_port = match config.metrics_port {
            Some(port) => Some(bind_metrics(SocketAddr::new(
                config.metrics_bind_address,
                port,
            ))?),
            None => None,
        };
        // Installed before READY=1, so a stop request right after readiness
        // is never met by the default action (termination without a drain).
        let signals = Signals::install().map_err(StartError::Signals)?;
        Ok(Self {
            signals,
            metrics_port,
        })
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
    signals_and_port: SignalsAndMetricsPort,
    reporting: Reporting,
    handler: H,
) -> anyhow::Result<StopReason> {
    let Reporting {
        notifier,
        watchdog,
        metrics,
    } = reporting;
    let Listening { sockets, owned } = listening;
    let shared = Arc::new(Shared::new(
        config.server.clone(),
        handler,
        Admission::new(&config.limit, metrics.clone()),
        metrics.clone(),
    ));
    let stop = Arc::new(Stop::default());
    let stop_serving = CancellationToken::new();
    let mut servers = Servers::new(
        shared.clone(),
        &config,
        stop_serving.clone(),
        owned.is_some(),
    );
    let metrics_task = signals_and_port.metrics_port.map(|listener| {
        tokio::spawn(server::serve_metrics(
            listener,
            metrics.clone(),
            stop_serving.clone(),
        ))
    });
    servers.spawn(sockets);

    // What requests the stop: a signal, a successor, idleness.
    signals_and_port.signals.spawn_watch(stop.clone());
    let socket_name = owned
        .as_ref()
        .map(|o| o.path().display().to_string())
        .unwrap_or_else(|| "inherited from systemd".into());
    let owned = owned.map(|o| Arc::new(Mutex::new(o)));
    // Sockets put back over the path after an impostor replaced it.
    let (restored_tx, restored_rx) = tokio::sync::mpsc::unbounded_channel();
    if let Some(owned) = &owned {
        socket_path::spawn_takeover_watch(owned.clone(), stop.clone(), restored_tx);
    }
    if let Some(idle) = config.lifecycle.idle_timeout {
        spawn_idle_watch(idle, shared.clone(), stop.clone());
    }
    let notifier = Arc::new(notifier);
    status::announce_ready(&notifier, &shared, &stop).await;
    info!(activated = owned.is_none(), socket = %socket_name, "serving");
    let status_task = status::spawn_updates(notifier.clone(), shared.clone(), stop.clone());
    let watchdog_task = watchdog.map(|interval| status::spawn_watchdog(notifier.clone(), interval));
    servers.serve_restored(restored_rx, &stop).await;

    // The drain: refuse new work, hand the socket path on, then wait
    // (within the grace period) for connections and work to finish.
    let reason = stop.reason();
    let draining = std::time::Instant::now();
    shared.begin_drain();
    status::notify_stopping(&notifier, &metrics);
    if let Some(owned) = owned {
        socket_path::release(owned, socket_name).await;
    }
    stop_serving.cancel();
    status_task.abort();
    let drained = servers.drained().await?;
    // Then what the calls left running (writes to Kubernetes being
    // retried), within what is left of the grace period.
    let left = config
        .lifecycle
        .shutdown_timeout
        .saturating_sub(draining.elapsed());
    shared.handler.finish(left).await;
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

/// The servers of the daemon's sockets: the first ones, and each socket
/// put back over the path since. They share the connection cap, the stop
/// and the grace period.
struct Servers<H> {
    shared: Arc<Shared<H>>,
    connections: ConnectionLimit,
    /// Cancelled at the drain: stop accepting.
    stop: CancellationToken,
    grace: Duration,
    /// Whether the listen backlog is served at the drain (the socket is
    /// ours alone).
    drain_backlog: bool,
    running: Vec<JoinHandle<Drained>>,
}

impl<H: Handler> Servers<H> {
    fn new(
        shared: Arc<Shared<H>>,
        config: &config::Config,
        stop: CancellationToken,
        drain_backlog: bool,
    ) -> Self {
        Self {
            shared,
            connections: ConnectionLimit::new(&config.limit),
            stop,
            grace: config.lifecycle.shutdown_timeout,
            drain_backlog,
            running: Vec::new(),
        }
    }

    fn spawn(&mut self, sockets: Vec<UnixListener>) {
        self.running.push(tokio::spawn(server::run(
            sockets,
            self.shared.clone(),
            self.connections.clone(),
            self.stop.clone(),
            self.grace,
            self.drain_backlog,
        )));
    }

    /// Until a stop is requested: serves each socket put back over the
    /// path, with the same connection cap and drain as the first.
    async fn serve_restored(&mut self, mut restored: UnboundedReceiver<UnixListener>, stop: &Stop) {
        loop {
            tokio::select! {
                _ = stop.requested() => break,
                Some(socket) = restored.recv() => self.spawn(vec![socket]),
            }
        }
    }

    /// Waits for every server's drain (after `stop` is cancelled).
    async fn drained(self) -> Result<Drained, JoinError> {
        let mut drained = Drained {
            abandoned: 0,
            unfinished: 0,
        };
        for server in self.running {
            let d = server.await?;
            drained.abandoned += d.abandoned;
            // Every server counts the same CNI work.
            drained.unfinished = drained.unfinished.max(d.unfinished);
        }
        Ok(drained)
    }
}

/// Requests a stop once nothing has happened for `idle`: no connection,
/// no work (also none whose client has gone), nothing queued.
fn spawn_idle_watch<H: Handler>(idle: Duration, shared: Arc<Shared<H>>, stop: Arc<Stop>) {
    tokio::spawn(async move {
        loop {
            let wait = idle.saturating_sub(shared.activity.idle_for());
            tokio::select! {
                _ = stop.requested() => return,
                _ = tokio::time::sleep(wait.max(Duration::from_millis(10))) => {}
            }
            // Work whose client has gone keeps the daemon busy too.
            let busy = shared.metrics.connections_open.get() > 0
                || shared.work.in_flight() > 0
                || shared.metrics.in_flight.get() > 0
                || shared.metrics.queued.get() > 0;
            if !busy && shared.activity.idle_for() >= idle {
                info!(idle = ?idle, "idle; exiting until the next connection");
                stop.request(StopReason::Idle);
                return;
            }
        }
    });
}
