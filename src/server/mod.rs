//! HTTP/1.1 on the listening sockets: the accept loop, one request per
//! connection, read timeouts, and the graceful drain. It calls a
//! [`Handler`] for CNI work and knows nothing of systemd or CNI internals.
//!
//! The unit of accounting is the work, not the connection: an admitted CNI
//! request runs in a task of its own ([`Work`]) that owns the admission
//! permit until the handler returns. A client that hangs up does not cut
//! the work short, and does not free its slot early either; the drain and
//! the idle timer wait for that task.
//!
//! Every resource a client can make the daemon hold is bounded: open
//! connections by the (descriptor-fitted) connection cap, connections that
//! send nothing by eviction at that cap and by the read timeout, request
//! bodies by a byte budget, CNI work by admission.

mod backoff;
mod conn_io;
mod connection;
mod idle;
mod listener;
mod metrics_port;
mod routes;

pub use metrics_port::serve_metrics;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

use crate::api;
use crate::limit::{Admission, BodyBudget, ConnectionLimit, Lanes, Permit, Turn};
use crate::metrics::Metrics;

use idle::IdleConnections;

/// Default of [`Config::body_budget_bytes`].
pub const DEFAULT_BODY_BUDGET_BYTES: usize = 16 << 20;

/// Settings of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Request head and body must arrive within this long after accept.
    pub read_timeout: Duration,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Request-body bytes held at once, from their reading until the work
    /// starts; a body waits (within the read timeout) for room. At least
    /// one body of `max_body_bytes` always fits.
    pub body_budget_bytes: usize,
}

/// What a successful CNI operation answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// ADD: the cluster network's result, sent as `{"Result": ...}`.
    Result(serde_json::Value),
    /// DEL, CHECK, GC, STATUS: an empty 200.
    Done,
}

/// How a failed request is classified; `routes` maps it to an HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The request itself is wrong (bad env, bad config): 400.
    InvalidRequest,
    /// The CNI operation failed: 400, as multus answers.
    Failed,
    /// Temporarily unable (overloaded, shutting down): 503, code 11.
    Unavailable,
    /// A bug or an unexpected internal failure: 500.
    Internal,
}

/// A failed request: its class and the CNI error the client receives.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub kind: FailureKind,
    pub error: api::CniError,
}

impl Failure {
    pub fn new(kind: FailureKind, code: u32, msg: impl Into<String>) -> Self {
        Self {
            kind,
            error: api::CniError::new(code, msg),
        }
    }

    /// Adds the CNI error's `details`.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.error.details = details.into();
        self
    }
}

/// The CNI work behind `POST /cni` and `POST /delegate`.
pub trait Handler: Send + Sync + 'static {
    fn cni(&self, request: api::Request) -> impl Future<Output = Result<Reply, Failure>> + Send;
    fn delegate(
        &self,
        request: api::Request,
    ) -> impl Future<Output = Result<Reply, Failure>> + Send;
    /// What is recorded for one container, as JSON; `None` when nothing is.
    fn attachments(
        &self,
        _container_id: String,
    ) -> impl Future<Output = Result<Option<serde_json::Value>, Failure>> + Send {
        async { Ok(None) }
    }
    /// Whether the handler can serve what it is configured for, as
    /// `/readyz` and the service manager's STATUS= report it.
    fn readiness(&self) -> Readiness {
        Readiness::Ready
    }
    /// Waits until [`Handler::readiness`] is no longer
    /// [`Readiness::Starting`]; bounded by the handler. Start-up awaits it
    /// (while serving) before it reports READY=1.
    fn settle(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Waits, at most `within`, for work the handler's calls left running
    /// in the background once every call has ended; what is still running
    /// then is handed over, which the handler logs. The drain awaits it
    /// after the servers drained.
    fn finish(&self, _within: Duration) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Cuts off the calls still running when the drain's grace ran out,
    /// where dropping their tasks would not (see
    /// [`crate::op_thread::OpThreads::stop`]).
    fn cut_off(&self) {}
}

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// 200.
    Ready,
    /// 503 (code 11): not ready yet, with why.
    Starting(String),
    /// 200, serving with a limitation it names (in the body and STATUS=).
    Degraded(String),
    /// 503 (code 11): serving, but calls wait for something outside the
    /// daemon, which it names (e.g. the readiness indicator file).
    NotReady(String),
}

/// State shared by every connection.
pub struct Shared<H> {
    pub config: Config,
    pub handler: H,
    pub admission: Admission,
    /// A container's calls run one at a time, each waiting for its turn
    /// before it asks for a slot.
    pub lanes: Arc<Lanes>,
    pub metrics: Arc<Metrics>,
    pub activity: Activity,
    /// CNI work in flight, whether or not its client is still connected.
    pub work: Work,
    /// Request-body bytes being read or waiting for admission.
    pub budget: BodyBudget,
    idle: Arc<IdleConnections>,
    draining: AtomicBool,
}

impl<H> Shared<H> {
    pub fn new(config: Config, handler: H, admission: Admission, metrics: Arc<Metrics>) -> Self {
        let budget = BodyBudget::new(
            config.body_budget_bytes.max(config.max_body_bytes),
            metrics.clone(),
        );
        Self {
            config,
            handler,
            admission,
            lanes: Lanes::new(metrics.waiting_turn.clone()),
            metrics,
            activity: Activity::new(),
            work: Work::new(),
            budget,
            idle: Arc::new(IdleConnections::new()),
            draining: AtomicBool::new(false),
        }
    }

    /// Whether the server has begun draining (`/readyz` answers 503).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Marks the server as draining ahead of the stop of the accept loops.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }
}

impl<H: Handler> Shared<H> {
    /// Runs an admitted request in a task of its own that owns `permit`
    /// and its container's `turn`, and is tracked by [`Work`]; the
    /// connection awaits the handle.
    ///
    /// Dropping the handle (the client hung up) leaves the work running:
    /// an ADD or DEL must not stop half-way through its plugins, and its
    /// slot stays taken until the plugins are done.
    fn spawn_work(
        self: &Arc<Self>,
        call: Call,
        request: api::Request,
        permit: Permit,
        turn: Option<Turn>,
        span: tracing::Span,
    ) -> tokio::task::JoinHandle<Result<Reply, Failure>> {
        let entry = self.work.start(
            request.env_var("CNI_CONTAINERID").unwrap_or(""),
            request.env_var("CNI_COMMAND").unwrap_or(""),
            call,
        );
        let shared = self.clone();
        self.work.tracker.spawn(
            async move {
                // Dropped in reverse order, also on a panic: the entry
                // (and the activity touch) first, then the slot, then the
                // container's turn (its next call finds a slot free).
                let _turn = turn;
                let _permit = permit;
                let _entry = Finished {
                    shared: &shared,
                    id: entry,
                };
                match call {
                    Call::Delegate => shared.handler.delegate(request).await,
                    Call::Cni => shared.handler.cni(request).await,
                }
            }
            .instrument(span),
        )
    }
}

/// Which handler method a piece of work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Cni,
    Delegate,
}

/// CNI work in flight: the tasks that own an admission permit and run the
/// handler, with what each is doing (for the log when the drain runs out
/// of time).
#[derive(Debug)]
pub struct Work {
    tracker: TaskTracker,
    running: Mutex<BTreeMap<u64, Running>>,
    next_id: AtomicU64,
    /// Most pieces running at once since the work was last idle.
    peak: std::sync::atomic::AtomicUsize,
}

/// One piece of work not finished yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// `CNI_CONTAINERID` of the request (may be empty, e.g. for GC).
    pub container_id: String,
    /// `CNI_COMMAND` of the request, marked `(/delegate)` for hot-plug.
    pub command: String,
    pub started: Instant,
}

impl Work {
    fn new() -> Self {
        Self {
            tracker: TaskTracker::new(),
            running: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            peak: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Pieces of work whose task has not ended.
    pub fn in_flight(&self) -> usize {
        self.tracker.len()
    }

    /// What is still running, oldest first.
    pub fn running(&self) -> Vec<Running> {
        // Entries are plain data: a panic elsewhere cannot leave one half
        // written, so a poisoned lock is still good to read.
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.values().cloned().collect()
    }

    fn start(&self, container_id: &str, command: &str, call: Call) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let command = match call {
            Call::Cni => command.to_string(),
            Call::Delegate => format!("{command} (/delegate)"),
        };
        let entry = Running {
            container_id: container_id.to_string(),
            command,
            started: Instant::now(),
        };
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.insert(id, entry);
        self.peak.fetch_max(running.len(), Ordering::Relaxed);
        id
    }

    /// Ends piece `id`; when it was the last one of a burst of at least
    /// [`TRIM_AFTER_CALLS`] at once, returns true (once per burst).
    fn finish(&self, id: u64) -> bool {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.remove(&id);
        running.is_empty() && self.peak.swap(0, Ordering::Relaxed) >= TRIM_AFTER_CALLS
    }
}

/// A burst of at least this many pieces of work at once is followed by a
/// trim of the allocator's free memory once it is over.
const TRIM_AFTER_CALLS: usize = 8;

/// How long after a burst's last piece of work the trim runs: the
/// connections' answers and buffers are freed by then.
const TRIM_DELAY: Duration = Duration::from_millis(500);

/// Marks a piece of work finished however its task ends.
struct Finished<'a, H> {
    shared: &'a Shared<H>,
    id: u64,
}

impl<H> Drop for Finished<'_, H> {
    fn drop(&mut self) {
        if self.shared.work.finish(self.id) {
            // glibc keeps what a burst freed in its arenas (one per thread
            // that allocated, up to 8 per core): give it back, off the
            // async workers, whether or not another burst has begun.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async {
                    tokio::time::sleep(TRIM_DELAY).await;
                    let _ = tokio::task::spawn_blocking(crate::memory::release_free_memory).await;
                });
            }
        }
        // The idle timer counts from the end of the work, not from the
        // end of a connection that may have gone long before.
        self.shared.activity.touch();
    }
}

/// When the daemon last had something to do, for the idle exit.
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    served: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn served_one(&self) {
        self.served.fetch_add(1, Ordering::Relaxed);
        self.touch();
    }

    /// Time since the last connection opened, request was answered or
    /// piece of work ended.
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

/// How the drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Connections still open when the grace period ran out (0: clean).
    pub abandoned: usize,
    /// Pieces of CNI work still running when the grace period ran out.
    pub unfinished: usize,
}

/// Serves `listeners` until `stop` is cancelled, then stops accepting and
/// lets open connections and CNI work finish within `grace`.
///
/// With `drain_backlog`, connections already waiting in the listen backlog
/// when `stop` fires are accepted and served too (the socket is ours alone);
/// without it they stay queued for the next process (systemd's socket).
pub async fn run<H: Handler>(
    listeners: Vec<UnixListener>,
    shared: Arc<Shared<H>>,
    connections: ConnectionLimit,
    stop: CancellationToken,
    grace: Duration,
    drain_backlog: bool,
) -> Drained {
    shared
        .metrics
        .connections_limit
        .set(connections.cap() as i64);
    let tracker = TaskTracker::new();
    let mut loops = tokio::task::JoinSet::new();
    for listener in listeners {
        loops.spawn(listener::serve(
            listener,
            shared.clone(),
            connections.clone(),
            stop.clone(),
            tracker.clone(),
            drain_backlog,
        ));
    }
    while loops.join_next().await.is_some() {}
    // Every accept loop has ended and dropped its listener. Accepted
    // connections are left to finish: one whose request has not been read
    // yet is a real client too (it may have queued during a restart), so
    // it is served, not closed; the read timeout bounds silent ones.
    shared.draining.store(true, Ordering::Release);
    tracker.close();
    shared.work.tracker.close();
    let open = tracker.len();
    let work = shared.work.in_flight();
    if open > 0 || work > 0 {
        info!(connections = open, work, grace = ?grace, "draining open connections and CNI work");
    }
    // One grace period for both: connections first (each waits for its own
    // work), then work whose client has gone.
    let deadline = tokio::time::Instant::now() + grace;
    let abandoned = match tokio::time::timeout_at(deadline, tracker.wait()).await {
        Ok(()) => 0,
        Err(_) => tracker.len(),
    };
    let unfinished = match tokio::time::timeout_at(deadline, shared.work.tracker.wait()).await {
        Ok(()) => 0,
        Err(_) => {
            shared.handler.cut_off();
            let running = shared.work.running();
            for r in &running {
                warn!(
                    container_id = %r.container_id,
                    command = %r.command,
                    running_for = ?r.started.elapsed(),
                    "shutdown timeout reached with CNI work unfinished; it is cut off"
                );
            }
            running.len().max(shared.work.in_flight())
        }
    };
    if abandoned > 0 {
        warn!(
            abandoned,
            "shutdown timeout reached with connections still open"
        );
    }
    Drained {
        abandoned,
        unfinished,
    }
}
