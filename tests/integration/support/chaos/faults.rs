//! The fault injector: at random moments (paced by the seed), one or more
//! faults at once, held for a random while, then healed in reverse order.
//! Checkpoints take [`Injector::quiet`]: while they hold it no fault is
//! on. Every fault is counted by kind in the world's `faults` tally.
//!
//! The faults:
//! * plexusd SIGKILLed while a plugin it started runs an ADD, a DEL, or
//!   while the runtime's GC call is in flight, and started again at once
//!   on the socket the test holds; plexusd SIGTERMed (drained) and
//!   started again;
//! * a plugin (bridge, host-local, portmap) told to fail, to hang past
//!   `pluginTimeout`, or to be killed a few milliseconds into its call;
//! * the API server slow (every request held), refusing (500 and 503
//!   answers), ending every watch with 410 Gone, or down;
//! * the state directory's file system full;
//! * a pod's network namespace removed under it (its pause process killed
//!   and the namespace file unmounted and deleted, as a node's reboot or
//!   a runtime's crash leaves it);
//! * the runtime's GC call with a partial valid list: the sandboxes as
//!   they were when the injector last looked (pods started since are
//!   missing, pods removed since are still there).

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::json;

use super::node::{PluginOrder, WRAPPED};
use super::{Rng, World};
use crate::support::cni::children;
use crate::support::shim;

/// A fault that is on until healed.
enum Held {
    ApiStalled,
    ApiDown,
    ApiRefusing,
    DiskFull(Vec<std::path::PathBuf>),
    Orders,
}

/// The injector's lock: held while faults are on.
#[derive(Default)]
pub struct Injector(Mutex<()>);

impl Injector {
    /// Waits until no fault is on and keeps it so while the guard lives.
    pub fn quiet(&self) -> MutexGuard<'_, ()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Runs the injector until the run stops.
pub fn run(world: &World, injector: &Injector, mut rng: Rng) {
    let mut snapshot: Vec<String> = Vec::new();
    while !world.stop.pause(rng.millis(300, 2500)) && !world.failures.any() {
        let _on = injector.quiet();
        if world.node.revive() {
            world
                .calls
                .add("plexusd exited by itself, started again", 1);
        }
        let n = if rng.chance(0.35) { 2 } else { 1 };
        let mut held = Vec::new();
        for _ in 0..n {
            if let Some(h) = inject(world, &mut rng, &snapshot) {
                held.push(h);
            }
        }
        world.stop.pause(rng.millis(200, 3000));
        for h in held.into_iter().rev() {
            heal(world, h);
        }
        snapshot = world.pods.lock().keys().cloned().collect();
    }
}

/// Injects one fault chosen by `rng`; what must be healed later.
fn inject(world: &World, rng: &mut Rng, snapshot: &[String]) -> Option<Held> {
    let node = &world.node;
    let kind = rng.below(14);
    let name = match kind {
        0 => kill_during(world, "ADD", rng),
        1 => kill_during(world, "DEL", rng),
        2 => kill_during_gc(world, snapshot, rng),
        3 => {
            if let Err(how) = node.restart_daemon() {
                world
                    .failures
                    .push(format!("plexusd did not exit cleanly on SIGTERM: {how}"));
            }
            "plexusd SIGTERM restart"
        }
        4..=6 => {
            let mut plugin = WRAPPED[rng.below(3) as usize];
            let (order, what) = match kind {
                4 => (PluginOrder::Fail, "fails"),
                5 => (PluginOrder::Hang, "hangs"),
                _ => {
                    // Not host-local: killed between creating its
                    // reservation file and writing the container id in it,
                    // it leaves an empty file no DEL can match
                    // (plugins/ipam/host-local/backend/disk/backend.go,
                    // Reserve), a leak of the plugin's own.
                    if plugin == "host-local" {
                        plugin = "bridge";
                    }
                    (PluginOrder::Kill(1 + rng.below(25)), "killed")
                }
            };
            node.order(plugin, order);
            world.faults.add(&format!("plugin {what}: {plugin}"), 1);
            return Some(Held::Orders);
        }
        7 => {
            node.api.stall(true);
            world.faults.add("API server slow", 1);
            return Some(Held::ApiStalled);
        }
        8 => {
            let status = if rng.chance(0.5) { 500 } else { 503 };
            node.api.fail_next("", status, 1 + rng.below(6) as usize);
            world.faults.add("API server refusing", 1);
            return Some(Held::ApiRefusing);
        }
        9 => {
            node.api.expire_watches();
            "API server 410 Gone on watches"
        }
        10 => {
            node.api.set_up(false);
            world.faults.add("API server down", 1);
            return Some(Held::ApiDown);
        }
        11 => {
            let files = vec![
                node.state.fill("chaos-fill"),
                node.engine.state_dir.join("chaos-fill.probe"),
            ];
            world.faults.add("state directory full", 1);
            return Some(Held::DiskFull(files));
        }
        12 => match remove_netns(world, rng) {
            Some(()) => "a pod's network namespace removed",
            None => return None,
        },
        _ => {
            let gc = gc_call(world, snapshot);
            finish_gc(world, gc);
            "runtime GC with a partial valid list"
        }
    };
    world.faults.add(name, 1);
    None
}

fn heal(world: &World, h: Held) {
    let api = &world.node.api;
    match h {
        Held::ApiStalled => api.stall(false),
        Held::ApiDown => api.set_up(true),
        Held::ApiRefusing => api.clear_failures(),
        Held::DiskFull(files) => {
            for f in files {
                let _ = std::fs::remove_file(f);
            }
        }
        Held::Orders => world.node.clear_orders(),
    }
}

/// The plugin processes plexusd runs for `command` right now.
fn plugins_running(pid: i32, command: &str) -> bool {
    let needle = format!("CNI_COMMAND={command}");
    children(pid).into_iter().any(|c| {
        std::fs::read(format!("/proc/{c}/environ"))
            .map(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
            .unwrap_or(false)
    })
}

/// SIGKILLs plexusd once a plugin runs `command` under it (or after up
/// to 3 s without one), then starts the next plexusd.
fn kill_during(world: &World, command: &str, rng: &mut Rng) -> &'static str {
    let node = &world.node;
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut caught = false;
    while Instant::now() < deadline && !world.stop.stopped() {
        let Some(pid) = node.pid() else { break };
        if plugins_running(pid, command) {
            caught = true;
            break;
        }
        std::thread::sleep(Duration::from_micros(500 + rng.below(1500)));
    }
    node.kill_daemon();
    match (command, caught) {
        ("ADD", true) => "plexusd SIGKILL mid-ADD",
        ("DEL", true) => "plexusd SIGKILL mid-DEL",
        _ => "plexusd SIGKILL (no plugin running)",
    }
}

/// The runtime's GC call through plexus-shim with `valid` (sandbox ids,
/// eth0 each) as its valid attachments.
fn gc_call(world: &World, valid: &[String]) -> Child {
    let valid: Vec<_> = valid
        .iter()
        .map(|id| json!({"containerID": id, "ifname": "eth0"}))
        .collect();
    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus-shim",
        "daemonSocketDir": world.node.sock.parent().unwrap_or(&world.node.sock),
        "cni.dev/valid-attachments": valid,
    }))
    .unwrap_or_default();
    shim::spawn(
        [("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")],
        &stdin,
    )
}

fn finish_gc(world: &World, mut gc: Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = gc.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = gc.kill();
    let _ = gc.wait();
    world
        .failures
        .push("the runtime's GC call did not end within 60 s".into());
}

/// The runtime's GC call, and plexusd SIGKILLed a moment into it.
fn kill_during_gc(world: &World, snapshot: &[String], rng: &mut Rng) -> &'static str {
    let gc = gc_call(world, snapshot);
    std::thread::sleep(Duration::from_millis(rng.below(30)));
    world.node.kill_daemon();
    finish_gc(world, gc);
    "plexusd SIGKILL mid-GC"
}

/// Removes the network namespace of a live pod no call is using: kills
/// its pause process (the namespace's last holder), unmounts and deletes
/// the namespace file. None when there is no such pod.
fn remove_netns(world: &World, rng: &mut Rng) -> Option<()> {
    let mut pods = world.pods.lock();
    let idle: Vec<String> = pods
        .values()
        .filter(|p| !p.busy && !p.netns_removed)
        .map(|p| p.id.clone())
        .collect();
    let id = idle.get(rng.below(idle.len() as u64) as usize)?.clone();
    let status = world.node.ctd.cri.pod_sandbox_status(&id).ok()?;
    let netns = status.netns()?;
    let pid = status.info["pid"].as_i64()?;
    // SAFETY: kill(2) of the sandbox's pause process, a child of its shim.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = Command::new("umount")
        .arg(&netns)
        .stderr(Stdio::null())
        .status();
    let _ = std::fs::remove_file(&netns);
    if let Some(p) = pods.get_mut(&id) {
        p.netns_removed = true;
    }
    Some(())
}
