//! Weeks on a node in minutes: pods created and removed without a pause
//! through Debian's containerd, plexusd socket-activated in Kubernetes
//! mode, while random faults (support::chaos::faults) come one or more at
//! once, and what must hold is checked after every call, at checkpoints
//! and at the end (support::chaos::check).
//!
//! `PLEXUS_CHAOS_SEED` replays a run's schedule (its seed is printed at
//! the start and in the failure); `PLEXUS_CHAOS_SECS` sets how long the
//! pods churn (default 100 s, which keeps the whole test under four
//! minutes on two cores).

use std::time::{Duration, Instant};

use crate::support::chaos::{self, node::Node, Plan, Rng, World};

const DEFAULT_SECS: u64 = 100;

#[test]
fn a_node_under_random_faults_should_keep_every_invariant() {
    let (seed, length) = chaos::settings(DEFAULT_SECS);
    let replay = format!(
        "PLEXUS_CHAOS_SEED={seed} PLEXUS_CHAOS_SECS={}",
        length.as_secs()
    );
    eprintln!("chaos: {replay}");
    let began = Instant::now();
    let world = World::new(Node::new("chaos"), false);
    let baseline = world.usage().unwrap();
    let plan = Plan {
        workers: 3,
        pods_per_worker: 3,
        checkpoint_every: Duration::from_secs(20),
    };
    let mut rng = Rng::new(seed);
    chaos::churn(&world, &mut rng, plan, length, true, length, &mut |_| {});
    if !world.failures.any() {
        chaos::finish(&world, baseline);
    }
    // Every network of the run can work: a cleanup given up is a bug.
    let given_up = world.node.daemon_logs().matches("gave up the DEL").count();
    if given_up > 0 {
        world.failures.push(format!(
            "plexusd gave up {given_up} cleanup(s), although every network can work"
        ));
    }
    eprintln!(
        "chaos: {replay}: {:.0} s, {} plexusd starts\n  faults ({}): {}\n  checks ({}): {}\n  calls: {}\n  cleanups given up (logged): {given_up}",
        began.elapsed().as_secs_f64(),
        world.node.starts(),
        world.faults.total(),
        world.faults.line(),
        world.checks.total(),
        world.checks.line(),
        world.calls.line(),
    );
    for (error, n) in world.errors.snapshot() {
        eprintln!("  {n} x {error}");
    }
    let failures = world.failures.list();
    if !failures.is_empty() {
        // The logs outlive the test's directory, for the post-mortem.
        let keep = std::env::temp_dir().join(format!("plexus-chaos-{seed}.log"));
        let all = format!(
            "{}\n==== containerd ====\n{}",
            world.node.daemon_logs(),
            world.node.ctd.log_text()
        );
        let _ = std::fs::write(&keep, all);
        eprintln!("chaos: logs kept in {}", keep.display());
    }
    assert!(
        failures.is_empty(),
        "{} invariant(s) broken; replay with {replay}:\n{}\nplexusd's log (last 60 lines):\n{}",
        failures.len(),
        failures.join("\n"),
        tail(&world.node.daemon_logs(), 60)
    );
    assert!(world.faults.total() > 0, "no fault was injected");
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
