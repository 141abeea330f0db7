//! The soak: the chaos test's node (tests/integration/support/chaos: the
//! test API server, plexusd socket-activated in Kubernetes mode, Debian's
//! containerd calling plexus-shim, three networks of Debian's plugins
//! behind the fault wrappers) churning pods for a long time, first with
//! the fault injector off, then on. At the end of every window (five
//! minutes) plexusd's memory, descriptors, threads and state directory are
//! read and the window's calls summed up; the report (a section of
//! BENCHMARKS.md, see benches/support/soak_report.rs) gives the windows,
//! the goals and a plot. Not run by CI.
//!
//! `cargo bench --bench soak`; as root. Settings (environment):
//! * `PLEXUS_SOAK_MINUTES` (60): the churn without faults;
//! * `PLEXUS_SOAK_FAULT_MINUTES` (15): then with the injector on;
//! * `PLEXUS_SOAK_WINDOW_SECS` (300): one window;
//! * `PLEXUS_SOAK_WORKERS` (3) and `PLEXUS_SOAK_PODS` (3): the kubelet's
//!   workers and the pods each keeps;
//! * `PLEXUS_SOAK_SEED`: the seed of the pods and faults (else the clock);
//! * `PLEXUS_BENCH_OUT`: write the section there instead of splicing it
//!   into BENCHMARKS.md; the plot goes to `docs/soak.svg` either way;
//! * `PLEXUS_SOAK_SELF_CHECK=1`: only check the report's arithmetic.

// A failed unwrap here stops the benchmark, not a daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code, unused_imports)]
#[path = "../tests/integration/support/mod.rs"]
mod support;

#[allow(dead_code, unused_imports)]
#[path = "support/procs.rs"]
mod procs;
#[allow(dead_code)]
#[path = "support/report.rs"]
mod report;
#[allow(dead_code, unused_imports)]
#[path = "support/setup.rs"]
mod setup;
#[path = "support/soak_report.rs"]
mod soak_report;
#[allow(dead_code)]
#[path = "support/stats.rs"]
mod stats;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use soak_report::Window;
use stats::Samples;
use support::chaos::{self, node::Node, Plan, Rng, World};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// What the windows are cut from.
struct Meter {
    began: Instant,
    windows: Vec<Window>,
    /// CRI calls answered so far.
    calls: u64,
    faults_before: u64,
}

impl Meter {
    /// Closes a window: the driver's calls since the last one, a reading.
    fn close(&mut self, world: &World, faults: bool) {
        let samples: Vec<_> = world
            .samples
            .as_ref()
            .map(|s| std::mem::take(&mut *s.lock().unwrap()))
            .unwrap_or_default();
        let (mut add, mut del, mut failed) = (Samples::new(), Samples::new(), 0);
        for s in samples {
            match (s.ok, s.add) {
                (false, _) => failed += 1,
                (true, true) => add.push(s.took),
                (true, false) => del.push(s.took),
            }
        }
        // Read with no call of the driver in flight, as a checkpoint
        // looks: what plexusd keeps between calls.
        let reading = {
            let _exclusive = world.gate.write().unwrap();
            world
                .node
                .pid()
                .and_then(|pid| soak_report::read(pid, &world.node.engine.state_dir).ok())
                .unwrap_or_default()
        };
        let start_s = self.windows.last().map_or(0.0, |w| w.end_s);
        self.calls += (add.len() + del.len()) as u64 + failed;
        let faults_now = world.faults.total();
        let w = Window {
            index: self.windows.len() + 1,
            faults,
            start_s,
            end_s: self.began.elapsed().as_secs_f64(),
            calls_total: self.calls,
            reading,
            add,
            del,
            failed,
            faults_injected: faults_now - self.faults_before,
        };
        self.faults_before = faults_now;
        eprintln!(
            "soak: window {} ({}) at {:.0} s: {} calls, RSS {} KiB, fds {}, threads {}, state {} entries, {} failed, ADD p99 {:?}",
            w.index,
            if faults { "faults" } else { "quiet" },
            w.end_s,
            w.calls_total,
            w.reading.rss_kib,
            w.reading.fds,
            w.reading.threads,
            w.reading.state_entries,
            w.failed,
            w.add.p99()
        );
        self.windows.push(w);
    }
}

fn main() {
    if std::env::var("PLEXUS_SOAK_SELF_CHECK").as_deref() == Ok("1") {
        soak_report::self_check();
        eprintln!("soak: self-check passed");
        return;
    }
    let quiet = Duration::from_secs(60 * env_u64("PLEXUS_SOAK_MINUTES", 60));
    let noisy = Duration::from_secs(60 * env_u64("PLEXUS_SOAK_FAULT_MINUTES", 15));
    let window = Duration::from_secs(env_u64("PLEXUS_SOAK_WINDOW_SECS", 300));
    let seed = env_u64("PLEXUS_SOAK_SEED", chaos::settings(0).0);
    let plan = Plan {
        workers: env_u64("PLEXUS_SOAK_WORKERS", 3) as usize,
        pods_per_worker: env_u64("PLEXUS_SOAK_PODS", 3) as usize,
        checkpoint_every: Duration::from_secs(120),
    };
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let started_at = report::now_utc();
    eprintln!(
        "soak: seed {seed}, {quiet:?} quiet then {noisy:?} with faults, windows of {window:?}"
    );
    let world = World::new(Node::new("soak"), true);
    let baseline = world.usage().unwrap();
    let mut meter = Meter {
        began: Instant::now(),
        windows: Vec::new(),
        calls: 0,
        faults_before: 0,
    };
    let mut rng = Rng::new(seed);
    for (length, faults) in [(quiet, false), (noisy, true)] {
        if length.is_zero() || world.failures.any() {
            continue;
        }
        let mut tick = |w: &World| meter.close(w, faults);
        chaos::churn(&world, &mut rng, plan, length, faults, window, &mut tick);
    }
    if !world.failures.any() {
        chaos::finish(&world, baseline);
    }
    if world.failures.any() {
        // The logs outlive the node's directory, for the post-mortem.
        let keep = std::env::temp_dir().join(format!("plexus-soak-{seed}.log"));
        let _ = fs::write(&keep, world.node.daemon_logs());
        eprintln!("soak: plexusd's logs kept in {}", keep.display());
    }
    let meta = meta(&manifest, &started_at, seed, plan, window, &world, &meter);
    write_report(&manifest, &meter.windows, &meta);
}

/// How the soak ran, for the report's first paragraph.
fn meta(
    manifest: &Path,
    started_at: &str,
    seed: u64,
    plan: Plan,
    window: Duration,
    world: &World,
    meter: &Meter,
) -> Vec<String> {
    let machine: Vec<String> = report::machine(manifest)
        .into_iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let failures = world.failures.list();
    let quiet = meter.windows.iter().filter(|w| !w.faults).count();
    vec![
        format!(
            "Generated by `cargo bench --bench soak` (started {started_at}, seed {seed}): the node of \
             the chaos test (tests/integration/chaos.rs) with {} kubelet workers keeping up to {} \
             pods each, every pod with three networks (bridge + host-local + portmap, and two NADs \
             of bridge + host-local), created and removed through containerd's CRI without a pause; \
             {quiet} windows of {} s with the fault injector off, then {} with it on.",
            plan.workers,
            plan.pods_per_worker,
            window.as_secs(),
            meter.windows.len() - quiet,
        ),
        "ADD is RunPodSandbox and DEL StopPodSandbox as the kubelet times them (containerd's own \
         work included: each runs a CNI call through plexus-shim and plexusd); calls are these \
         CRI calls (a pod also gets a second DEL from RemovePodSandbox, not counted). Readings \
         are taken with no call of the driver in flight."
            .to_string(),
        format!(
            "Machine: {}; load average at the end: {}.",
            machine.join("; "),
            report::load_average()
        ),
        format!(
            "Faults injected: {}. Invariant checks: {} ({}), broken: {}.",
            if world.faults.total() == 0 { "none".to_string() } else { world.faults.line() },
            world.checks.total(),
            world.checks.line(),
            if failures.is_empty() { "none".to_string() } else { failures.join("; ") },
        ),
    ]
}

fn write_report(manifest: &Path, windows: &[Window], meta: &[String]) {
    let svg_rel = "docs/soak.svg";
    let section = soak_report::markdown(windows, meta, svg_rel);
    print!("{section}");
    let svg_path = manifest.join(svg_rel);
    match fs::write(&svg_path, soak_report::svg(windows)) {
        Ok(()) => eprintln!("plot written to {}", svg_path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", svg_path.display()),
    }
    let (path, text) = match std::env::var_os("PLEXUS_BENCH_OUT") {
        Some(p) => (PathBuf::from(p), section),
        None => {
            let path = manifest.join("BENCHMARKS.md");
            let old = fs::read_to_string(&path).unwrap_or_default();
            let new = soak_report::splice(&old, &section);
            (path, new)
        }
    };
    match fs::write(&path, text) {
        Ok(()) => eprintln!("report written to {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}
