//! Weeks on a node in minutes: a node (the test API server, plexusd
//! socket-activated in Kubernetes mode, Debian's containerd calling
//! plexus-shim, Debian's plugins behind wrappers that can be made to fail)
//! under a kubelet-like driver that keeps creating and removing pods,
//! while an injector breaks things at random moments, one or more at once.
//! What must hold is checked after every call the driver makes, at
//! checkpoints while the churn runs, and once everything is removed.
//!
//! Everything random comes from one seed ([`Rng`]): the pods, their host
//! ports, which faults come when and for how long. The schedule replays
//! from the seed; the interleaving with real processes does not, so a
//! failure that depends on one exact moment may need a few runs of the
//! same seed.
//!
//! Files: `node.rs` (the node and its parts), `kubelet.rs` (the driver),
//! `faults.rs` (the injector), `check.rs` (the invariants).

pub mod check;
pub mod faults;
pub mod kubelet;
pub mod node;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A small seeded generator (splitmix64): the same seed, the same
/// choices.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A duration between `lo` and `hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    /// A generator of its own for a part of the run (a worker, the
    /// injector), so that parts do not shift each other's choices.
    pub fn fork(&mut self, salt: u64) -> Rng {
        Rng(self.next_u64() ^ salt.wrapping_mul(0x2545_f491_4f6c_dd1d))
    }
}

/// Counters by name (faults by kind, checks by invariant), printed at the
/// end.
#[derive(Default)]
pub struct Tally(Mutex<BTreeMap<String, u64>>);

impl Tally {
    pub fn add(&self, name: &str, n: u64) {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_default() += n;
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// `name=count` pairs on one line.
    pub fn line(&self) -> String {
        self.snapshot()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The run's stop flag with a wake-up for pacing waits: a part that
/// waits between its steps returns at once when the run stops.
#[derive(Default)]
pub struct Stop {
    flag: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Stop {
    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.cv.notify_all();
    }

    /// Ready for another phase.
    pub fn reset(&self) {
        self.flag.store(false, Ordering::SeqCst);
    }

    pub fn stopped(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Paces a loop: returns after `d`, or at once when the run stops
    /// (true then).
    pub fn pause(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while !self.stopped() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        self.stopped()
    }
}

/// The first invariant broken, kept for the end of the run (the parts run
/// on threads; the test fails once with all of them).
#[derive(Default)]
pub struct Failures(Mutex<Vec<String>>);

impl Failures {
    pub fn push(&self, what: String) {
        eprintln!("chaos: INVARIANT BROKEN: {what}");
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(what);
    }

    pub fn list(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn any(&self) -> bool {
        !self.0.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
}

/// The seed and length of a run: `PLEXUS_CHAOS_SEED` (else one made from
/// the clock) and `PLEXUS_CHAOS_SECS` (else `default_secs`).
pub fn settings(default_secs: u64) -> (u64, Duration) {
    let seed = std::env::var("PLEXUS_CHAOS_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (t.as_nanos() as u64) ^ u64::from(std::process::id())
        });
    let secs = std::env::var("PLEXUS_CHAOS_SECS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default_secs);
    (seed, Duration::from_secs(secs))
}

/// Everything a run's parts share.
pub struct World {
    pub node: node::Node,
    pub pods: kubelet::Registry,
    /// Held shared by each CRI call of the driver, exclusively by a
    /// checkpoint.
    pub gate: std::sync::RwLock<()>,
    pub stop: Stop,
    pub failures: Failures,
    /// Faults injected, by kind.
    pub faults: Tally,
    /// Invariant checks made, by invariant.
    pub checks: Tally,
    /// CRI calls, by call and outcome.
    pub calls: Tally,
    /// Errors the driver's calls got, by their shape.
    pub errors: Tally,
    /// Every answered CRI call, when the run keeps them (the soak).
    pub samples: Option<Mutex<Vec<kubelet::CallSample>>>,
    /// Every sandbox id the run made (for the leftovers' search).
    seen: Mutex<std::collections::BTreeSet<String>>,
    next_port: std::sync::atomic::AtomicU32,
}

impl World {
    pub fn new(node: node::Node, keep_samples: bool) -> World {
        let base = 20000 + (std::process::id() % 400) * 100;
        World {
            node,
            pods: kubelet::Registry::default(),
            gate: std::sync::RwLock::new(()),
            stop: Stop::default(),
            failures: Failures::default(),
            faults: Tally::default(),
            checks: Tally::default(),
            calls: Tally::default(),
            errors: Tally::default(),
            samples: keep_samples.then(|| Mutex::new(Vec::new())),
            seen: Mutex::new(Default::default()),
            next_port: std::sync::atomic::AtomicU32::new(base),
        }
    }

    /// One CRI call of the driver, under the gate, timed.
    pub fn call<T, E>(&self, add: bool, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
        let at = Instant::now();
        let res = f();
        if let Some(s) = &self.samples {
            s.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(kubelet::CallSample {
                    at,
                    add,
                    took: at.elapsed(),
                    ok: res.is_ok(),
                });
        }
        res
    }

    /// A host port no other pod of the run had.
    pub fn host_port(&self) -> u16 {
        let p = self.next_port.fetch_add(1, Ordering::SeqCst);
        (20000 + (p - 20000) % 40000) as u16
    }

    /// plexusd's descriptors and threads now.
    pub fn usage(&self) -> Option<check::Usage> {
        let pid = self.node.pid()?;
        Some(check::Usage::of(pid, self.node.api.port()))
    }

    pub fn seen(&self, id: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string());
    }

    pub fn seen_ids(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// How the driver churns.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Workers, each one call at a time.
    pub workers: usize,
    /// Pods each worker keeps at most.
    pub pods_per_worker: usize,
    /// Time between checkpoints.
    pub checkpoint_every: Duration,
}

/// Churns pods for `length` (with the injector when `faults`), a
/// checkpoint every `plan.checkpoint_every` and one at the end; `tick`
/// runs on the calling thread every `tick_every` (the soak samples
/// there). Every worker removes its pods before this returns.
pub fn churn(
    world: &World,
    rng: &mut Rng,
    plan: Plan,
    length: Duration,
    faults: bool,
    tick_every: Duration,
    tick: &mut dyn FnMut(&World),
) {
    world.stop.reset();
    let injector = faults::Injector::default();
    let began = Instant::now();
    std::thread::scope(|s| {
        for w in 0..plan.workers {
            let r = rng.fork(w as u64 + 1);
            s.spawn(move || kubelet::worker(world, w, plan.pods_per_worker, r));
        }
        if faults {
            let (r, inj) = (rng.fork(1000), &injector);
            s.spawn(move || faults::run(world, inj, r));
        }
        let (mut next_check, mut next_tick) = (plan.checkpoint_every, tick_every);
        while began.elapsed() < length && !world.failures.any() {
            let next = next_check.min(next_tick).min(length);
            world_wait(world, next.saturating_sub(began.elapsed()));
            if began.elapsed() >= next_check {
                checkpoint(world, &injector);
                next_check += plan.checkpoint_every;
            }
            if began.elapsed() >= next_tick {
                tick(world);
                next_tick += tick_every;
            }
        }
        checkpoint(world, &injector);
        world.stop.stop();
    });
}

/// A paced wait of the calling thread (not a synchronisation: the next
/// checkpoint or sample is due then).
fn world_wait(world: &World, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !world.failures.any() {
        std::thread::sleep(
            until
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(200)),
        );
    }
}

/// A checkpoint: no fault on, no call in flight, plexusd running.
pub fn checkpoint(world: &World, injector: &faults::Injector) {
    if world.failures.any() {
        return;
    }
    let _quiet = injector.quiet();
    let _exclusive = world.gate.write().unwrap_or_else(|e| e.into_inner());
    if world.node.revive() {
        world
            .calls
            .add("plexusd exited by itself, started again", 1);
    }
    check::checkpoint(world);
}

/// The Kubernetes client's pooled connections to the API server that
/// may outlive a burst (one per request a worker or plexusd's background
/// work had in flight at once), beyond those at the start.
pub const POOLED: usize = 6;

/// After the last pod is removed: waits (up to 90 s, while plexusd
/// retries its pending cleanups) until nothing of any pod is left, then
/// until plexusd's descriptors (the API server's pooled connections
/// aside, up to [`POOLED`] more) and threads are back to `baseline`; what
/// is still wrong then is pushed to the failures.
pub fn finish(world: &World, baseline: check::Usage) {
    world.node.revive();
    world.node.wait_ready(Duration::from_secs(60));
    world
        .checks
        .add("nothing of any pod is left once cleanups are due", 1);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut left = check::leftovers(world);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        left = check::leftovers(world);
    }
    if !left.is_empty() {
        world
            .failures
            .push(format!("left after the last pod was removed: {left:#?}"));
    }
    world.checks.add(
        "plexusd's descriptors and threads are back to their start",
        1,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut now = None;
    while Instant::now() < deadline {
        let Some(u) = world.usage() else { break };
        now = Some(u);
        if u.own_fds() <= baseline.own_fds()
            && u.api_connections <= baseline.api_connections + POOLED
            && u.threads <= baseline.threads
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let fds: Vec<String> = world
        .node
        .pid()
        .and_then(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).ok())
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.display().to_string())
        .collect();
    world.failures.push(format!(
        "plexusd's usage is {now:?}, {baseline:?} at the start; its descriptors: {fds:?}"
    ));
}
