//! Admission control: the cap on open connections, the limits on CNI
//! requests processed at once with a bounded FIFO wait for a slot, and the
//! budget of request-body bytes read at once.
//!
//! Two pools of slots, because two kinds of calls cost the node different
//! things. An ADD (and a CHECK or STATUS) is CPU-bound: its plugins start,
//! read and write, and a few slots per CPU keep the CPUs busy. A DEL (and
//! a GC, which deletes what is left over) mostly waits: for the kernel's
//! veth teardown (RCU grace periods under the RTNL lock) and the IPAM
//! plugin's lock, so with a low `connectionLimit` a DEL herd in the ADDs'
//! slots ran well below the plugins' own pace, and in a mixed load a DEL
//! queued behind ADDs. `connectionLimit` bounds the first kind
//! ([`Slots::Setup`]), `deleteLimit` the second ([`Slots::Teardown`]);
//! neither kind ever waits for the other's slots, so a DEL never queues
//! behind ADDs (nor a flood of DELs takes the slots ADDs need). Both wait in one FIFO per pool, and their waiters count
//! together towards the depth at which accepting pauses, so the memory
//! bound (a waiting call holds about 14 KiB) is the one of one queue.
//!
//! Slots are taken only once a request has fully arrived, so an idle or
//! slow client never holds one. A slot is then held by the work, not the
//! connection: the [`Permit`] moves into the task that runs the plugins and
//! is freed when they are done, even if the client hung up long before.
//!
//! Descriptors: the connection cap is fitted under `RLIMIT_NOFILE` at
//! start-up so that open connections can never take the descriptors the
//! plugin runs need (pipes, lock and record files).

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

use crate::metrics::{Metrics, RejectLabels};

mod lanes;
pub use lanes::{LaneError, LaneKey, Lanes, Turn, MAX_WAITING};

/// Settings of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// ADD, CHECK and STATUS calls (every call but DEL and GC) processed at
    /// once; `None` means no limit.
    pub connection_limit: Option<NonZeroUsize>,
    /// DEL and GC calls processed at once, in slots of their own; `None`
    /// means no limit.
    pub delete_limit: Option<NonZeroUsize>,
    /// How long a request may wait for a processing slot.
    pub queue_timeout: Duration,
    /// Open client connections; past it the daemon stops accepting.
    pub max_connections: NonZeroUsize,
}

impl Config {
    /// Slots of both pools together; `None` when either has no limit.
    pub fn slots(&self) -> Option<usize> {
        let setup = self.connection_limit?.get();
        let teardown = self.delete_limit?.get();
        Some(setup.saturating_add(teardown))
    }
}

/// Which pool of slots a call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// `connectionLimit`: the CPU-bound calls that set up or look (ADD,
    /// CHECK, STATUS, and anything else, refused later or not).
    Setup,
    /// `deleteLimit`: the calls that tear down and mostly wait on the
    /// kernel (DEL, GC).
    Teardown,
}

impl Slots {
    /// The pool of a call with `CNI_COMMAND` `command`.
    pub fn of(command: Option<&str>) -> Self {
        match command {
            Some("DEL" | "GC") => Self::Teardown,
            _ => Self::Setup,
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "too many CNI requests: no processing slot became free within {}; try again later",
        crate::duration::format(*.waited)
    )]
    QueueTimeout { waited: Duration },
}

/// Gate in front of CNI work.
#[derive(Debug, Clone)]
pub struct Admission {
    setup: Option<Arc<Semaphore>>,
    teardown: Option<Arc<Semaphore>>,
    queue_timeout: Duration,
    depth: Arc<QueueDepth>,
    metrics: Arc<Metrics>,
}

/// Requests waiting for a slot (of either pool), and the depth at which
/// the accept loops stop taking new connections: each waiting request
/// holds its connection and buffers (about 14 KiB), while a client in the
/// listen backlog costs the daemon nothing. A herd of 1,000 pods then takes
/// the memory of the calls its slots run plus this queue, as a herd of 250
/// does.
///
/// The backlog is first come, first served and a client's command is known
/// only once its request is read, so while the queue is this deep a DEL in
/// the backlog waits for the queue to shrink (one waiter admitted, or given
/// up at `queueTimeout`) like any client; once read, it never waits for an
/// ADD's slot.
#[derive(Debug)]
struct QueueDepth {
    now: AtomicUsize,
    pause_at: Option<usize>,
    shrank: tokio::sync::Notify,
    filled: tokio::sync::Notify,
}

/// `connectionLimit` when the configuration leaves it out: 8 per CPU, at
/// least 16. Measured with herds of 250 pods (three bridge + host-local
/// networks each) on 2 CPUs: an ADD is CPU-bound (the plugins), so a few
/// slots per CPU keep the CPUs busy and 16 kept the ADD herd at the
/// unlimited pace with half its peak memory (BENCHMARKS.md, 11).
pub fn default_connection_limit() -> NonZeroUsize {
    let cpus = std::thread::available_parallelism().map_or(2, NonZeroUsize::get);
    NonZeroUsize::new(cpus.saturating_mul(8).max(16)).unwrap_or(NonZeroUsize::MIN)
}

/// `deleteLimit` when the configuration leaves it out: 16, whatever the
/// CPUs (a DEL's time is mostly the kernel's and the plugins' own locks',
/// not a CPU's). Measured with herds of 1,000 pods (three bridge +
/// host-local networks each) on 2 busy CPUs: with 32 and 64 slots the DEL
/// herd ran no faster than with 16 (0.85x and 0.94x the plugins called
/// directly, against 0.82-0.88x), while plexusd's peak memory grew by 7
/// and 15 MiB (a running DEL holds far more than a waiting one: its
/// plugins' output buffers, and a blocking-pool thread with its stack and
/// malloc arena for its file work). host-local's per-network lock and the
/// kernel's RTNL lock serialise a DEL's plugins, so more DELs at once make
/// each of them slower rather than the herd faster.
pub fn default_delete_limit() -> NonZeroUsize {
    NonZeroUsize::new(DEFAULT_DELETE_LIMIT).unwrap_or(NonZeroUsize::MIN)
}

/// The default of `deleteLimit` (see [`default_delete_limit`]).
pub const DEFAULT_DELETE_LIMIT: usize = 16;

/// Queued requests at which accepting pauses, per processing slot.
pub const PAUSE_QUEUED_PER_SLOT: usize = 4;
/// Queued requests at which accepting pauses, at least.
pub const PAUSE_QUEUED_MIN: usize = 16;

/// Owned by the task doing a request's CNI work; frees its slot (and
/// counts the work out of the in-flight gauge) when dropped.
#[derive(Debug)]
pub struct Permit {
    _slot: Option<OwnedSemaphorePermit>,
    metrics: Arc<Metrics>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// Counts a request as queued until its wait ends, however it ends.
struct Queued<'a>(&'a Admission);

impl<'a> Queued<'a> {
    fn new(a: &'a Admission) -> Self {
        a.metrics.queued.inc();
        let after = a.depth.now.fetch_add(1, Ordering::AcqRel) + 1;
        if a.depth.pause_at == Some(after) {
            a.depth.filled.notify_waiters();
        }
        Self(a)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.metrics.queued.dec();
        let before = self.0.depth.now.fetch_sub(1, Ordering::AcqRel);
        if self.0.depth.pause_at == Some(before) {
            self.0.depth.shrank.notify_waiters();
        }
    }
}

impl Admission {
    /// The pools of `config`. Accepting pauses at a queue depth set by
    /// `connectionLimit` alone (by `deleteLimit` when only it limits): the
    /// queue needs only to be deep enough to keep the slots fed.
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Self {
        let setup = config.connection_limit.map(NonZeroUsize::get);
        let teardown = config.delete_limit.map(NonZeroUsize::get);
        let semaphore = |n: usize| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)));
        Self {
            setup: setup.map(semaphore),
            teardown: teardown.map(semaphore),
            queue_timeout: config.queue_timeout,
            depth: Arc::new(QueueDepth {
                now: AtomicUsize::new(0),
                pause_at: setup.or(teardown).map(|n| {
                    n.saturating_mul(PAUSE_QUEUED_PER_SLOT)
                        .max(PAUSE_QUEUED_MIN)
                }),
                shrank: tokio::sync::Notify::new(),
                filled: tokio::sync::Notify::new(),
            }),
            metrics,
        }
    }

    /// Whether so many requests wait for a slot that new connections are
    /// better left in the listen backlog (see [`QueueDepth`]).
    pub fn accept_paused(&self) -> bool {
        self.depth
            .pause_at
            .is_some_and(|at| self.depth.now.load(Ordering::Acquire) >= at)
    }

    /// Resolves after the queue next drops below the pause depth; `enable`
    /// it before checking [`Admission::accept_paused`].
    pub fn queue_shrank(&self) -> tokio::sync::futures::Notified<'_> {
        self.depth.shrank.notified()
    }

    /// Resolves after the queue next reaches the pause depth (an accept
    /// loop waiting for a client stops waiting).
    pub fn queue_filled(&self) -> tokio::sync::futures::Notified<'_> {
        self.depth.filled.notified()
    }

    /// How long a call may wait for its turn and a slot together.
    pub fn queue_timeout(&self) -> Duration {
        self.queue_timeout
    }

    /// Waits (first come, first served) for a processing slot, for at most
    /// `queueTimeout`.
    pub async fn admit(&self) -> Result<Permit, Error> {
        self.admit_until(tokio::time::Instant::now() + self.queue_timeout)
            .await
    }

    /// Waits (first come, first served) for a [`Slots::Setup`] slot until
    /// `deadline` (see [`Admission::admit_to`]).
    pub async fn admit_until(&self, deadline: tokio::time::Instant) -> Result<Permit, Error> {
        self.admit_to(Slots::Setup, deadline).await
    }

    /// Waits (first come, first served among the calls of the same pool)
    /// for a slot of `pool` until `deadline` (the end of the call's
    /// `queueTimeout`, part of which it may have spent waiting for its
    /// container's turn).
    pub async fn admit_to(
        &self,
        pool: Slots,
        deadline: tokio::time::Instant,
    ) -> Result<Permit, Error> {
        let slots = match pool {
            Slots::Setup => &self.setup,
            Slots::Teardown => &self.teardown,
        };
        let slot = match slots {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_no_permits) => {
                    let _queued = Queued::new(self);
                    match tokio::time::timeout_at(deadline, acquire_many(slots, 1)).await {
                        Ok(p) => Some(p),
                        Err(_) => {
                            self.metrics
                                .rejected
                                .get_or_create(&RejectLabels {
                                    reason: "queue_timeout",
                                })
                                .inc();
                            return Err(Error::QueueTimeout {
                                waited: self.queue_timeout,
                            });
                        }
                    }
                }
            },
        };
        self.metrics.in_flight.inc();
        Ok(Permit {
            _slot: slot,
            metrics: self.metrics.clone(),
        })
    }
}

/// Descriptors kept free for everything but client connections: the
/// daemon's own files (listeners, log, epoll, state files) and a margin.
pub const FD_RESERVE_BASE: usize = 64;
/// Descriptors kept free per processing slot (of both pools): a plugin run holds its
/// stdin, stdout and stderr pipes (both ends while it starts), the pipe
/// `exec` reports errors on, a lock and a record file.
pub const FD_RESERVE_PER_SLOT: usize = 8;

/// The cap on open connections: a permit is taken before a connection is
/// served, so past the cap clients wait in the kernel's listen backlog
/// (or, when an idle connection can make room, are served in its place).
#[derive(Debug, Clone)]
pub struct ConnectionLimit {
    slots: Arc<Semaphore>,
    cap: usize,
    /// Places of connections evicted to make room that still read what
    /// their clients send before they close (as many as the cap: their
    /// descriptors are reserved beside the connections').
    lingering: Arc<Semaphore>,
}

/// What [`ConnectionLimit::try_acquire`] found.
#[derive(Debug)]
pub enum Slot {
    Free(OwnedSemaphorePermit),
    Full,
}

impl ConnectionLimit {
    /// The cap of `config`, lowered when the process may not open enough
    /// descriptors for it plus the reserve the plugin runs need (see
    /// [`fit_to_descriptors`]). The soft `RLIMIT_NOFILE` is raised first,
    /// as far as the hard limit allows and no further than needed.
    pub fn new(config: &Config) -> Self {
        let wanted = config.max_connections.get();
        let slots = config.slots();
        let cap = match open_files_limit(descriptors_needed(wanted, slots)) {
            Ok(nofile) => {
                let cap = fit_to_descriptors(wanted, slots, nofile);
                if cap < wanted {
                    warn!(
                        max_connections = wanted,
                        effective = cap,
                        nofile,
                        reserve = FD_RESERVE_BASE + FD_RESERVE_PER_SLOT * slots.unwrap_or(cap),
                        "maxConnections lowered to fit RLIMIT_NOFILE with descriptors \
                         reserved for plugin runs; raise LimitNOFILE= to lift it"
                    );
                }
                cap
            }
            Err(e) => {
                warn!(cause = %e, "cannot read RLIMIT_NOFILE; maxConnections is used as is");
                wanted
            }
        };
        Self {
            slots: Arc::new(Semaphore::new(cap)),
            cap,
            lingering: Arc::new(Semaphore::new(cap)),
        }
    }

    /// The places of evicted connections that linger before they close.
    pub fn lingering(&self) -> Arc<Semaphore> {
        self.lingering.clone()
    }

    /// Connections served at most at once.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// A connection slot, once one is free.
    pub async fn acquire(&self) -> OwnedSemaphorePermit {
        acquire_many(&self.slots, 1).await
    }

    /// A connection slot if one is free now.
    pub fn try_acquire(&self) -> Slot {
        match self.slots.clone().try_acquire_owned() {
            Ok(p) => Slot::Free(p),
            // NoPermits (this module never closes its semaphores).
            Err(_) => Slot::Full,
        }
    }
}

/// `n` permits of `semaphore`. This module never closes its semaphores,
/// so tokio's acquire cannot fail; were one closed, the caller would wait
/// (every caller bounds its wait) instead of failing or panicking.
async fn acquire_many(semaphore: &Arc<Semaphore>, n: u32) -> OwnedSemaphorePermit {
    match semaphore.clone().acquire_many_owned(n).await {
        Ok(p) => p,
        Err(_closed) => std::future::pending().await,
    }
}

/// Descriptors `max_connections` connections need with the reserve:
/// `FD_RESERVE_BASE + 2 * max_connections + FD_RESERVE_PER_SLOT * slots`
/// (each connection may be joined by one evicted to make room for it that
/// lingers before it closes), where `slots` counts both pools and without
/// a limit on either every connection may run plugins.
pub fn descriptors_needed(max_connections: usize, slots: Option<usize>) -> usize {
    let slots = slots.unwrap_or(max_connections);
    FD_RESERVE_BASE
        .saturating_add(max_connections.saturating_mul(2))
        .saturating_add(FD_RESERVE_PER_SLOT.saturating_mul(slots))
}

/// The largest connection cap, at most `max_connections` and at least 1,
/// that leaves the reserve free under a limit of `nofile` descriptors.
pub fn fit_to_descriptors(max_connections: usize, slots: Option<usize>, nofile: usize) -> usize {
    let room = nofile.saturating_sub(FD_RESERVE_BASE);
    let cap = match slots {
        Some(slots) => room.saturating_sub(FD_RESERVE_PER_SLOT.saturating_mul(slots)) / 2,
        // Each connection may bring a plugin run of its own.
        None => room / (2 + FD_RESERVE_PER_SLOT),
    };
    cap.clamp(1, max_connections.max(1))
}

/// The soft `RLIMIT_NOFILE`, raised towards `needed` within the hard limit.
fn open_files_limit(needed: usize) -> std::io::Result<usize> {
    let as_usize = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            usize::MAX
        } else {
            usize::try_from(v).unwrap_or(usize::MAX)
        }
    };
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let soft = as_usize(lim.rlim_cur);
    if soft >= needed {
        return Ok(soft);
    }
    let raised = needed.min(as_usize(lim.rlim_max));
    if raised <= soft {
        return Ok(soft);
    }
    let new = libc::rlimit {
        rlim_cur: raised as libc::rlim_t,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: setrlimit reads the struct we own; raising the soft limit
    // within the hard one needs no privilege and affects only descriptor
    // numbers allocated from now on.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
        let e = std::io::Error::last_os_error();
        debug!(cause = %e, soft, wanted = raised, "cannot raise RLIMIT_NOFILE");
        return Ok(soft);
    }
    info!(from = soft, to = raised, "raised the soft RLIMIT_NOFILE");
    Ok(raised)
}

/// Bytes of request bodies held at once from the start of their reading
/// until the parsed request is handed to the work: a large body waits for
/// room instead of taking memory, so a burst of big requests under a low
/// `connectionLimit` costs at most the budget (plus what the work holds).
#[derive(Debug, Clone)]
pub struct BodyBudget {
    inner: Arc<BudgetInner>,
}

#[derive(Debug)]
struct BudgetInner {
    bytes: Arc<Semaphore>,
    total: usize,
    held: AtomicUsize,
    /// Highest `held` since memory was last given back.
    peak: AtomicUsize,
    metrics: Arc<Metrics>,
}

/// Bytes of the budget held by one request; given back when dropped.
#[derive(Debug)]
pub struct BodyBytes {
    budget: Arc<BudgetInner>,
    permit: Option<OwnedSemaphorePermit>,
}

/// Once a burst has held this much, the allocator is asked to return
/// freed memory to the system when the burst ends.
pub const TRIM_AFTER_BYTES: usize = 4 << 20;

impl BodyBudget {
    /// A budget of `total` bytes (at least 1).
    pub fn new(total: usize, metrics: Arc<Metrics>) -> Self {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(BudgetInner {
                bytes: Arc::new(Semaphore::new(total)),
                total,
                held: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                metrics,
            }),
        }
    }

    /// Holds nothing yet; [`BodyBytes::grow`] adds to it.
    pub fn hold(&self) -> BodyBytes {
        BodyBytes {
            budget: self.inner.clone(),
            permit: None,
        }
    }

    /// Bytes held by all requests together.
    pub fn held(&self) -> usize {
        self.inner.held.load(Ordering::Relaxed)
    }
}

impl BodyBytes {
    /// Bytes this request holds.
    pub fn len(&self) -> usize {
        self.permit.as_ref().map_or(0, |p| p.num_permits())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits (first come, first served) until `n` more bytes are free. A
    /// single request never holds more than the whole budget, so a body
    /// larger than it still gets read, alone.
    pub async fn grow(&mut self, n: usize) {
        let n = n.min(self.budget.total.saturating_sub(self.len()));
        if n == 0 {
            return;
        }
        let n32 = u32::try_from(n).unwrap_or(u32::MAX);
        let more = acquire_many(&self.budget.bytes, n32).await;
        let got = more.num_permits();
        match &mut self.permit {
            Some(p) => p.merge(more),
            None => self.permit = Some(more),
        }
        let now = self.budget.held.fetch_add(got, Ordering::Relaxed) + got;
        self.budget.peak.fetch_max(now, Ordering::Relaxed);
        self.budget.metrics.body_bytes.inc_by(got as i64);
    }
}

impl Drop for BodyBytes {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let n = permit.num_permits();
        drop(permit);
        self.budget.metrics.body_bytes.dec_by(n as i64);
        let before = self.budget.held.fetch_sub(n, Ordering::Relaxed);
        // The last body of a burst is gone: glibc keeps freed memory in its
        // arenas (large buffers stop being mmapped once one was freed), so
        // ask for it back, off the async workers.
        if before == n && self.budget.peak.swap(0, Ordering::Relaxed) >= TRIM_AFTER_BYTES {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn_blocking(crate::memory::release_free_memory);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(limit: usize, wait_ms: u64) -> Config {
        Config {
            connection_limit: NonZeroUsize::new(limit),
            delete_limit: NonZeroUsize::new(limit),
            queue_timeout: Duration::from_millis(wait_ms),
            max_connections: NonZeroUsize::new(8).unwrap(),
        }
    }

    #[tokio::test]
    async fn admit_over_limit_should_time_out_with_try_again() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&config(1, 20), m.clone());
        let held = a.admit().await.unwrap();
        assert_eq!(m.in_flight.get(), 1);
        let err = a.admit().await.unwrap_err();
        assert!(matches!(err, Error::QueueTimeout { .. }));
        assert!(err.to_string().contains("try again later"));
        assert_eq!(m.queued.get(), 0);
        drop(held);
        assert_eq!(m.in_flight.get(), 0);
        a.admit().await.unwrap();
    }

    #[tokio::test]
    async fn admit_should_serve_waiters_when_a_slot_frees() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&config(1, 5_000), m.clone());
        let held = a.admit().await.unwrap();
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.admit().await.map(|_| ()) });
        while m.queued.get() == 0 {
            tokio::task::yield_now().await;
        }
        drop(held);
        waiter.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_deep_queue_should_pause_accepting_until_it_shrinks() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&config(1, 60_000), m.clone());
        let held = a.admit().await.unwrap();
        let mut waiters = Vec::new();
        for k in 1..=PAUSE_QUEUED_MIN {
            assert!(!a.accept_paused(), "paused at {} queued", k - 1);
            let a2 = a.clone();
            waiters.push(tokio::spawn(async move { a2.admit().await.map(|_| ()) }));
            while m.queued.get() < k as i64 {
                tokio::task::yield_now().await;
            }
        }
        assert!(a.accept_paused());
        let shrank = a.queue_shrank();
        tokio::pin!(shrank);
        shrank.as_mut().enable();
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), shrank)
            .await
            .expect("the accept loop is woken");
        assert!(!a.accept_paused());
        for w in waiters {
            w.await.unwrap().unwrap();
        }
        // Without a limit nothing queues, and accepting never pauses.
        let a = Admission::new(&config(0, 0), m);
        assert!(!a.accept_paused());
    }

    fn pools(setup: usize, teardown: usize, wait_ms: u64) -> Config {
        Config {
            connection_limit: NonZeroUsize::new(setup),
            delete_limit: NonZeroUsize::new(teardown),
            ..config(1, wait_ms)
        }
    }

    #[test]
    fn dels_and_gcs_should_take_the_teardown_slots() {
        assert_eq!(Slots::of(Some("DEL")), Slots::Teardown);
        assert_eq!(Slots::of(Some("GC")), Slots::Teardown);
        for c in [
            Some("ADD"),
            Some("CHECK"),
            Some("STATUS"),
            Some("del"),
            None,
        ] {
            assert_eq!(Slots::of(c), Slots::Setup, "{c:?}");
        }
        assert_eq!(pools(3, 5, 0).slots(), Some(8));
        assert_eq!(pools(0, 5, 0).slots(), None);
    }

    #[tokio::test]
    async fn a_del_should_not_wait_for_the_slots_adds_hold() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&pools(1, 1, 60_000), m.clone());
        let add = a.admit_to(Slots::Setup, soon()).await.unwrap();
        // An ADD waits behind the one holding the setup slot.
        let a2 = a.clone();
        let queued =
            tokio::spawn(async move { a2.admit_to(Slots::Setup, soon()).await.map(|_| ()) });
        while m.queued.get() == 0 {
            tokio::task::yield_now().await;
        }
        // Bounded, so a DEL that wrongly waits fails instead of hanging.
        let del = tokio::time::timeout(Duration::from_secs(5), a.admit_to(Slots::Teardown, soon()))
            .await
            .expect("a DEL waited for an ADD's slot")
            .unwrap();
        assert_eq!(m.in_flight.get(), 2);
        assert_eq!(m.queued.get(), 1);
        drop((add, del));
        queued.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn teardown_slots_should_be_bounded_and_leave_setup_slots_free() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&pools(1, 2, 20), m.clone());
        let dels = [
            a.admit_to(Slots::Teardown, soon()).await.unwrap(),
            a.admit_to(Slots::Teardown, soon()).await.unwrap(),
        ];
        let late = tokio::time::Instant::now() + Duration::from_millis(20);
        let err = a.admit_to(Slots::Teardown, late).await.unwrap_err();
        assert!(matches!(err, Error::QueueTimeout { .. }), "{err}");
        // A flood of DELs waiting for their slots takes none of the ADDs'.
        let mut waiting = Vec::new();
        for k in 1..=3 {
            let a2 = a.clone();
            waiting.push(tokio::spawn(async move {
                a2.admit_to(Slots::Teardown, soon()).await.map(|_| ())
            }));
            while m.queued.get() < k {
                tokio::task::yield_now().await;
            }
        }
        let add = tokio::time::timeout(Duration::from_secs(5), a.admit_to(Slots::Setup, soon()))
            .await
            .expect("an ADD waited behind DELs")
            .unwrap();
        assert_eq!(m.in_flight.get(), 3);
        drop((add, dels));
        for w in waiting {
            w.await.unwrap().unwrap();
        }
        assert_eq!((m.in_flight.get(), m.queued.get()), (0, 0));
    }

    #[tokio::test]
    async fn waiters_of_both_pools_should_count_towards_the_pause() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&pools(1, 1, 60_000), m.clone());
        let held = [
            a.admit_to(Slots::Setup, soon()).await.unwrap(),
            a.admit_to(Slots::Teardown, soon()).await.unwrap(),
        ];
        let mut waiters = Vec::new();
        for k in 1..=PAUSE_QUEUED_MIN {
            assert!(!a.accept_paused(), "paused at {} queued", k - 1);
            let pool = if k % 2 == 0 {
                Slots::Setup
            } else {
                Slots::Teardown
            };
            let a2 = a.clone();
            waiters.push(tokio::spawn(async move {
                a2.admit_to(pool, soon()).await.map(|_| ())
            }));
            while m.queued.get() < k as i64 {
                tokio::task::yield_now().await;
            }
        }
        assert!(a.accept_paused());
        drop(held);
        for w in waiters {
            w.await.unwrap().unwrap();
        }
        assert!(!a.accept_paused());
    }

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test]
    async fn unlimited_should_never_wait() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&config(0, 0), m);
        // Bounded, so a limit that wrongly waits fails instead of hanging.
        let p = tokio::time::timeout(Duration::from_secs(5), futures_lite(&a, 100))
            .await
            .expect("an unlimited admission waited");
        assert_eq!(p.len(), 100);
    }

    #[test]
    fn fit_to_descriptors_should_keep_the_reserve_free() {
        // connectionLimit 2: 64 + 2 * 8 descriptors stay for plugin runs,
        // and one per connection for an evicted one that lingers.
        assert_eq!(fit_to_descriptors(1024, Some(2), 128), 24);
        assert_eq!(descriptors_needed(24, Some(2)), 128);
        // Room enough: maxConnections as configured.
        assert_eq!(fit_to_descriptors(1024, Some(4), 65536), 1024);
        // No connectionLimit: every connection may run plugins.
        assert_eq!(fit_to_descriptors(1024, None, 1024), 96);
        assert!(descriptors_needed(96, None) <= 1024);
        assert!(descriptors_needed(97, None) > 1024);
        // Never below one connection, even with no room at all.
        assert_eq!(fit_to_descriptors(1024, Some(64), 100), 1);
    }

    #[tokio::test]
    async fn body_budget_should_make_readers_wait_for_room() {
        let m = Arc::new(Metrics::new());
        let budget = BodyBudget::new(100, m.clone());
        let mut a = budget.hold();
        a.grow(60).await;
        let mut b = budget.hold();
        // 60 + 50 > 100: b waits until a is dropped.
        let waiting = tokio::time::timeout(Duration::from_millis(20), b.grow(50)).await;
        assert!(waiting.is_err(), "b got room past the budget");
        assert_eq!(b.len(), 0);
        assert_eq!(m.body_bytes.get(), 60);
        drop(a);
        b.grow(50).await;
        // Chunks add up; one request never asks for more than the budget.
        b.grow(1000).await;
        assert_eq!(b.len(), 100);
        assert_eq!(budget.held(), 100);
        drop(b);
        assert_eq!(budget.held(), 0);
        assert_eq!(m.body_bytes.get(), 0);
    }

    async fn futures_lite(a: &Admission, n: usize) -> Vec<Permit> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(a.admit().await.unwrap());
        }
        v
    }
}
