//! The CNI call path benchmark: Plexus (`plexus-shim` -> `plexusd` -> the
//! real plugin) side by side with executing Debian's CNI plugins directly,
//! in the same run, interleaved call by call (or burst by burst).
//!
//! `cargo bench --bench cni_path` prints a markdown report on stdout
//! (progress goes to stderr) and writes the same report to `BENCHMARKS.md`
//! at the repository root. It needs root (network namespaces, links, a
//! private systemd manager); what cannot run says so in the report.
//!
//! * `PLEXUS_BENCH_QUICK=1`: far fewer iterations, for trying the bench
//!   out; the numbers mean little and the report says so.
//! * `PLEXUS_BENCH_OUT=<path>`: write the report there instead.
//! * `PLEXUS_BENCH_HERDS="250:unset,4 1000:4"`: the herds of scenario 11
//!   (pods, then the `connectionLimit` settings) instead of its own.
//! * `PLEXUS_BENCH_ONLY=1,4` or `PLEXUS_BENCH_ONLY=floods`: run only these
//!   scenarios, by number or by the first word of their title. The bench's
//!   own arguments select the same way and take precedence:
//!   `cargo bench --bench cni_path -- herd` or `-- 4 9`.
//!
//! The bench reports; it never fails on a missed target. Everything it
//! creates (namespaces, links, temp dirs, processes) is owned by a guard
//! and removed also when a scenario panics; a scenario that panics is
//! reported as such and the others still run.
//!
//! Layout: this file holds the iteration counts, the scenario runner and
//! the report's frame; `support/scenario_*.rs` one scenario each (in the
//! report's order: sequential, shim, bursts with memory, start_stop,
//! restart, records, floods, k8s, herd, large_cluster, spawner: plexusd
//! starting plugins through plexus-spawner beside forking them);
//! `support/setup.rs` what they share (call environments, networks, a
//! running plexusd, tmpfs scratch dirs, failure tallies);
//! `support/procs.rs` timed process runs and /proc readings,
//! `support/flood.rs` raw client connections, `support/daemon_metrics.rs`
//! the daemon's Prometheus text, `support/stats.rs` and
//! `support/report.rs` numbers and markdown. The test harness
//! (`tests/integration/support/`) provides the engine setup, the daemon, the shim
//! runner, network namespaces and the systemd manager.

// A failed unwrap here stops the benchmark, not a daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The bench uses a part of the integration tests' harness; the rest is
// dead code here.
#[allow(dead_code, unused_imports)]
#[path = "../tests/integration/support/mod.rs"]
mod support;

#[path = "support/scenario_bursts.rs"]
mod bursts;
#[path = "support/daemon_metrics.rs"]
mod daemon_metrics;
#[path = "support/flood.rs"]
mod flood;
#[path = "support/scenario_floods.rs"]
mod floods;
#[path = "support/scenario_herd.rs"]
mod herd;
#[path = "support/scenario_k8s.rs"]
mod kube;
#[path = "support/scenario_large_cluster.rs"]
mod large_cluster;
#[path = "support/procs.rs"]
mod procs;
#[path = "support/scenario_records.rs"]
mod records;
#[path = "support/report.rs"]
mod report;
#[path = "support/scenario_restart.rs"]
mod restart;
#[path = "support/scenario_sequential.rs"]
mod sequential;
#[path = "support/setup.rs"]
mod setup;
#[path = "support/scenario_shim.rs"]
mod shim_alone;
#[allow(dead_code, unused_imports)]
#[path = "support/soak_report.rs"]
mod soak_report;
#[path = "support/scenario_spawner.rs"]
mod spawner;
#[path = "support/scenario_start_stop.rs"]
mod start_stop;
#[path = "support/stats.rs"]
mod stats;

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use report::{met, Section, Table};
use setup::LOG_LEVEL;

/// Iteration counts.
#[derive(Debug, Clone)]
pub struct Counts {
    pub quick: bool,
    /// Sequential loopback ADD+DEL pairs per side.
    pub seq: usize,
    /// Sequential bridge + host-local ADD+DEL pairs per side.
    pub bridge: usize,
    /// Untimed ADD+DEL pairs per side before the timed ones.
    pub warmup: usize,
    /// shim VERSION runs (and as many of each reference).
    pub version: usize,
    pub bursts: Vec<usize>,
    pub burst_rounds: usize,
    /// exec -> ready -> SIGTERM cycles.
    pub ready: usize,
    /// Cold starts through systemd-socket-activate.
    pub cold: usize,
    /// Warm ADD+DEL pairs after each cold start.
    pub warm_per_cold: usize,
    pub restarts: usize,
    /// Client calls between two restarts.
    pub calls_between_restarts: usize,
    /// Record write pattern repetitions.
    pub record_io: usize,
    /// Calls of each command counted under strace.
    pub strace_calls: usize,
    /// Idle connections opened before each flooded ADD.
    pub flood_conns: usize,
    /// Timed ADDs with and without the idle flood.
    pub flood_rounds: usize,
    /// Concurrent ~1 MiB requests.
    pub big_bodies: usize,
    /// ADDs of the plugin whose child keeps its pipes.
    pub setsid_adds: usize,
    /// Kubernetes pod ADD+DEL pairs (two networks) per side.
    pub k8s: usize,
    /// Starts of plexusd per large-cluster case.
    pub large_runs: usize,
}

impl Counts {
    pub fn new(quick: bool) -> Self {
        if quick {
            return Self {
                quick,
                seq: 10,
                bridge: 5,
                warmup: 1,
                version: 50,
                bursts: vec![8, 32],
                burst_rounds: 1,
                ready: 3,
                cold: 2,
                warm_per_cold: 2,
                restarts: 2,
                calls_between_restarts: 8,
                record_io: 20,
                strace_calls: 5,
                flood_conns: 5000,
                flood_rounds: 3,
                big_bodies: 200,
                setsid_adds: 20,
                k8s: 5,
                large_runs: 1,
            };
        }
        Self {
            quick,
            seq: 200,
            bridge: 200,
            warmup: 3,
            version: 1000,
            bursts: vec![64, 256],
            burst_rounds: 5,
            ready: 20,
            cold: 5,
            warm_per_cold: 4,
            restarts: 5,
            calls_between_restarts: 40,
            record_io: 200,
            strace_calls: 20,
            flood_conns: 5000,
            flood_rounds: 5,
            big_bodies: 1000,
            setsid_adds: 20,
            k8s: 80,
            large_runs: 3,
        }
    }
}

// ---------------------------------------------------------------------------

pub fn is_root() -> bool {
    // SAFETY: geteuid never fails.
    unsafe { libc::geteuid() == 0 }
}

/// The scenarios asked for, by number or first word of the title: the
/// bench's arguments (cargo adds `--bench`, which is no selection), else
/// `PLEXUS_BENCH_ONLY`; `None`: every scenario.
fn selection() -> Option<Vec<String>> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .flat_map(|a| a.split(',').map(str::to_string).collect::<Vec<_>>())
        .collect();
    if !args.is_empty() {
        return Some(args);
    }
    let only = std::env::var("PLEXUS_BENCH_ONLY").ok()?;
    Some(only.split(',').map(str::to_string).collect())
}

/// Runs one scenario, turning a panic into a line of the report.
fn run(title: &str, needs_root: bool, f: impl FnOnce(&mut Section)) -> Section {
    eprintln!("== {title}");
    let t0 = Instant::now();
    let mut sec = Section::new(title);
    if let Some(only) = selection() {
        let (number, name) = title.split_once(". ").unwrap_or((title, ""));
        let word = name.split_whitespace().next().unwrap_or("");
        let selected = only
            .iter()
            .map(|o| o.trim())
            .any(|o| o == number || (!o.is_empty() && o.eq_ignore_ascii_case(word)));
        if !selected {
            sec.para("Skipped: not selected (bench arguments or PLEXUS_BENCH_ONLY).");
            return sec;
        }
    }
    if needs_root && !is_root() {
        sec.para("Skipped: not running as root (needs network namespaces).");
        return sec;
    }
    let r = panic::catch_unwind(AssertUnwindSafe(|| f(&mut sec)));
    if let Err(p) = r {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(no message)".into());
        let first = msg.lines().take(12).collect::<Vec<_>>().join("\n    ");
        sec.para(&format!(
            "**This scenario did not complete**; what it measured before is above. Panic:\n\n    {first}"
        ));
    }
    eprintln!("   {:.1} s", t0.elapsed().as_secs_f64());
    sec
}

fn main() {
    let started = Instant::now();
    let c = Counts::new(std::env::var("PLEXUS_BENCH_QUICK").as_deref() == Ok("1"));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let date = report::now_utc();
    let machine = report::machine(manifest);

    let mut sections = Vec::new();
    sections.push(run("1. Sequential ADD and DEL: loopback", true, |s| {
        sequential::sequential(s, &c, false)
    }));
    sections.push(run(
        "2. Sequential ADD and DEL: bridge + host-local",
        true,
        |s| sequential::sequential(s, &c, true),
    ));
    sections.push(run("3. The shim alone", false, |s| {
        shim_alone::shim_alone(s, &c)
    }));
    let mut mem = Section::new("5. Daemon memory");
    sections.push(run("4. Bursts of concurrent calls", true, |s| {
        bursts::bursts(s, &mut mem, &c)
    }));
    if mem.body.is_empty() {
        mem.para("Not measured: scenario 4 did not run or did not complete.");
    }
    sections.push(mem);
    sections.push(run("6. Start and stop", false, |s| {
        start_stop::start_stop(s, &c)
    }));
    let mut restart = run("7. Restart under load (systemd)", true, |s| {
        restart::restart_under_load(s, &c)
    });
    // Measured by an integration test, not here: the recorded figures.
    restart.body.push_str(include_str!("upgrade.md"));
    sections.push(restart);
    sections.push(run(
        "8. What the attachment record's fsyncs cost",
        false,
        |s| records::record_io(s, &c),
    ));
    sections.push(run("9. Floods", true, |s| floods::floods(s, &c)));
    sections.push(run("10. Kubernetes pods with two networks", true, |s| {
        kube::kubernetes(s, &c)
    }));
    sections.push(run(
        "11. Herd after a reboot: every pod at once at a cold, socket-activated plexusd",
        true,
        |s| herd::herd_after_reboot(s, &c),
    ));
    sections.push(run("12. Large clusters", false, |s| {
        large_cluster::large_cluster(s, &c)
    }));
    sections.push(run(
        "13. Spawner or forking: plexusd starting plugins through plexus-spawner",
        true,
        |s| spawner::spawner(s, &c),
    ));

    let mut out = String::new();
    out.push_str("# Plexus benchmark: the CNI call path\n\n");
    out.push_str(&format!(
        "Generated by `cargo bench --bench cni_path` on {date}; the whole run took {:.0} s. \
         Every Plexus measurement runs side by side with its direct-plugin baseline in the \
         same run, interleaved call by call (bursts: burst by burst). A call is timed from \
         `spawn` to `waitpid` of the executed process (plexus-shim or the plugin), stdin piped, \
         stdout captured. p50 is the median, p99 the nearest-rank 99th percentile. plexusd logs \
         at `{LOG_LEVEL}`.\n\n",
        started.elapsed().as_secs_f64()
    ));
    if c.quick {
        out.push_str(
            "**PLEXUS_BENCH_QUICK=1: reduced iteration counts; these numbers are only a smoke \
             test.**\n\n",
        );
    }
    let mut t = Table::new(&["machine", ""]);
    for (k, v) in machine {
        t.row(vec![k, v]);
    }
    t.row(vec![
        "load average at the end".into(),
        report::load_average(),
    ]);
    out.push_str(&t.render());
    out.push_str("\n## Targets\n\n");
    let mut t = Table::new(&["target", "measured", "goal", "met?"]);
    for s in &sections {
        for tg in &s.targets {
            t.row(vec![
                tg.what.clone(),
                tg.measured.clone(),
                tg.target.clone(),
                met(tg.met),
            ]);
        }
    }
    out.push_str(&t.render());
    out.push('\n');
    out.push_str(include_str!("limits.md"));
    for s in &sections {
        out.push_str(&format!("\n## {}\n\n{}", s.title, s.body));
    }

    let path = std::env::var_os("PLEXUS_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("BENCHMARKS.md"));
    // The soak's section (`cargo bench --bench soak`, an hour long) stays.
    if let Some(soak) = fs::read_to_string(manifest.join("BENCHMARKS.md"))
        .ok()
        .as_deref()
        .and_then(soak_report::section_of)
    {
        out = soak_report::splice(&out, soak);
    }
    print!("{out}");
    match fs::write(&path, &out) {
        Ok(()) => eprintln!("report written to {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}
