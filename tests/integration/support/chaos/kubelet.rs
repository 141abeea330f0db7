//! The kubelet-like driver: workers that keep creating and removing pods
//! through containerd's CRI, each one call at a time, as the kubelet does:
//!
//! * a pod is created in the API server (bound to this node), then
//!   `RunPodSandbox`; a failed one's sandbox (kept by containerd, not
//!   ready) is stopped and removed and the pod tried again with the next
//!   attempt number, until it runs (a pod that cannot start within
//!   [`DEADLINE`] of trying breaks an invariant);
//! * a pod is removed with `StopPodSandbox`, retried until it succeeds
//!   (a pod that cannot be stopped within [`DEADLINE`] breaks an
//!   invariant), then `RemovePodSandbox`, then deleted from the API
//!   server.
//!
//! After each call that succeeded, what it said is checked at once
//! ([`super::check::attached`], [`super::check::detached`]). Each CRI call
//! holds the world's gate shared: a checkpoint takes it exclusively and so
//! sees no call in flight.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;

use super::node::{NETWORKS, NS, SELECTION};
use super::{check, Rng, World};
use crate::support::containerd::Pod;
use crate::support::cri_client::CriError;
use crate::support::kube::NODE;

/// How long a pod may take to start, or to stop, before that is a broken
/// invariant (every fault the injector makes ends well within it).
pub const DEADLINE: Duration = Duration::from_secs(150);

/// A pod whose sandbox runs.
#[derive(Debug, Clone)]
pub struct LivePod {
    pub pod: Pod,
    pub id: String,
    /// The worker that owns it.
    pub owner: usize,
    /// The injector removed its network namespace (and its pause process):
    /// it is no longer ready, and must still be removable.
    pub netns_removed: bool,
    /// A call is on it (being checked after its start, or being removed):
    /// checkpoints and the injector leave it alone.
    pub busy: bool,
}

/// The pods whose sandboxes run, by sandbox id, from the moment
/// RunPodSandbox answers until the pod is removed. A worker marks a pod
/// busy while it works on it, so the injector only ever picks pods no
/// call is using.
#[derive(Default)]
pub struct Registry(Mutex<BTreeMap<String, LivePod>>);

impl Registry {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, LivePod>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_one_of(&self, owner: usize, rng: &mut Rng) -> Option<LivePod> {
        let mut pods = self.lock();
        let mine: Vec<String> = pods
            .values()
            .filter(|p| p.owner == owner && !p.busy)
            .map(|p| p.id.clone())
            .collect();
        let pick = mine.get(rng.below(mine.len() as u64) as usize)?.clone();
        let p = pods.get_mut(&pick)?;
        p.busy = true;
        Some(p.clone())
    }

    fn count_of(&self, owner: usize) -> usize {
        self.lock().values().filter(|p| p.owner == owner).count()
    }
}

/// One answered CRI call, for the soak's figures (read by the soak
/// benchmark only).
#[allow(dead_code)]
#[derive(Debug, Clone, Copy)]
pub struct CallSample {
    pub at: Instant,
    /// RunPodSandbox (true) or StopPodSandbox.
    pub add: bool,
    pub took: Duration,
    pub ok: bool,
}

/// Worker `w`: creates and removes pods until the run stops, keeping up
/// to `target` of its own, then removes what it has left.
pub fn worker(world: &World, w: usize, target: usize, mut rng: Rng) {
    let mut made = 0usize;
    while !world.stop.stopped() && !world.failures.any() {
        let have = world.pods.count_of(w);
        if have < target && (have == 0 || rng.chance(0.55)) {
            made += 1;
            let mut pod = Pod::new(NS, &format!("w{w}-p{made}")).annotate(NETWORKS, SELECTION);
            if rng.chance(0.3) {
                pod.ports = vec![(80, world.host_port())];
            }
            create(world, w, pod);
        } else if let Some(p) = world.pods.take_one_of(w, &mut rng) {
            remove(world, &p);
        }
    }
    while let Some(p) = world.pods.take_one_of(w, &mut rng) {
        remove(world, &p);
    }
}

/// Creates `pod` and runs its sandbox, retrying as the kubelet does.
pub fn create(world: &World, owner: usize, mut pod: Pod) {
    world.node.api.put_pod(
        &pod.namespace,
        &pod.name,
        &pod.uid,
        NODE,
        json!({ NETWORKS: SELECTION }),
    );
    let began = Instant::now();
    loop {
        // Registered before the gate is let go: a checkpoint never sees a
        // ready sandbox the driver does not know.
        let res = world.call(true, || {
            let r = world.node.ctd.try_run(&pod);
            if let Ok(id) = &r {
                world.pods.lock().insert(
                    id.clone(),
                    LivePod {
                        pod: pod.clone(),
                        id: id.clone(),
                        owner,
                        netns_removed: false,
                        busy: true,
                    },
                );
            }
            r
        });
        match res {
            Ok(id) => {
                world.calls.add("RunPodSandbox ok", 1);
                world.seen(&id);
                check::attached(world, &pod, &id);
                if let Some(p) = world.pods.lock().get_mut(&id) {
                    p.busy = false;
                }
                return;
            }
            Err(e) => {
                world.calls.add("RunPodSandbox failed", 1);
                world.errors.add(&shape(&e.to_string()), 1);
                discard_failed(world, &pod);
                if world.failures.any() {
                    // The run has failed already: no more retries.
                    world.node.api.delete_pod(&pod.namespace, &pod.name);
                    return;
                }
                if began.elapsed() > DEADLINE {
                    world.failures.push(format!(
                        "pod {}/{} did not start within {DEADLINE:?}: {e}",
                        pod.namespace, pod.name
                    ));
                    world.node.api.delete_pod(&pod.namespace, &pod.name);
                    return;
                }
                pod.attempt += 1;
                // The kubelet backs off before it tries a pod again.
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Stops and removes the sandbox a failed RunPodSandbox of `pod` left.
fn discard_failed(world: &World, pod: &Pod) {
    let Ok(list) = world.node.ctd.cri.list_pod_sandbox() else {
        return;
    };
    for s in list {
        let Some(m) = &s.metadata else { continue };
        if m.name == pod.name && m.namespace == pod.namespace && m.attempt == pod.attempt {
            world.seen(&s.id);
            stop_until_done(world, &s.id, &format!("the failed sandbox of {}", pod.name));
            remove_sandbox(world, &s.id);
        }
    }
}

/// StopPodSandbox until it succeeds; false when it did not within
/// [`DEADLINE`] (an invariant broken: a pod that cannot be deleted).
fn stop_until_done(world: &World, id: &str, what: &str) -> bool {
    let began = Instant::now();
    let mut last: Option<CriError> = None;
    while began.elapsed() < DEADLINE {
        if world.failures.any() {
            // The run has failed already: no more waiting.
            return false;
        }
        match world.call(false, || world.node.ctd.cri.stop_pod_sandbox(id)) {
            Ok(()) => {
                world.calls.add("StopPodSandbox ok", 1);
                return true;
            }
            Err(e) => {
                world.calls.add("StopPodSandbox failed", 1);
                world.errors.add(&shape(&e.to_string()), 1);
                last = Some(e);
                // The kubelet's sync loop comes back to a pod about once a
                // second; a short back-off keeps the retries from spinning.
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    world.failures.push(format!(
        "{what} ({id}) could not be stopped within {DEADLINE:?}: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    ));
    false
}

fn remove_sandbox(world: &World, id: &str) {
    let began = Instant::now();
    while let Err(e) = world.node.ctd.cri.remove_pod_sandbox(id) {
        if world.failures.any() {
            return;
        }
        if began.elapsed() > DEADLINE {
            world
                .failures
                .push(format!("RemovePodSandbox {id} kept failing: {e}"));
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Removes a running pod (marked busy): stop (retried), check, remove,
/// delete.
pub fn remove(world: &World, p: &LivePod) {
    if stop_until_done(world, &p.id, &format!("pod {}", p.pod.name)) {
        check::detached(world, p);
        remove_sandbox(world, &p.id);
    }
    world.pods.lock().remove(&p.id);
    world.node.api.delete_pod(&p.pod.namespace, &p.pod.name);
}

/// An error's text without what differs from call to call (ids, paths,
/// addresses, numbers), to count errors by kind.
pub fn shape(text: &str) -> String {
    let mut out = String::new();
    for word in text.split_whitespace().take(40) {
        if word.chars().any(|c| c.is_ascii_digit()) {
            out.push_str("# ");
        } else {
            out.push_str(word);
            out.push(' ');
        }
    }
    out.trim_end().to_string()
}
