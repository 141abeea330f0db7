//! The invariants of a chaos run, each checked on what the system really
//! holds (the sandbox's network namespace, plexusd's record, the pod's
//! network-status in the API server, host-local's reservations, the
//! host's bridges and iptables, containerd's sandboxes, plexusd's /proc).
//! A broken one is pushed to the world's failures (the run stops); each
//! check made is counted by name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::kubelet::LivePod;
use super::node::NETS;
use super::World;
use crate::support::containerd::{try_ifaces_in, Pod};
use crate::support::cri_client::SANDBOX_READY;
use crate::support::netns::bridge_ports;
use crate::support::procnet;

/// Interface -> its IPv4 addresses (bare), sorted.
pub type Addrs = BTreeMap<String, BTreeSet<String>>;

fn bare(a: &str) -> String {
    a.split('/').next().unwrap_or(a).to_string()
}

/// The interfaces but `lo` in the namespace file `netns` with their IPv4
/// addresses; an error when it cannot be entered.
pub fn in_netns(netns: &str) -> Result<Addrs, String> {
    Ok(try_ifaces_in(netns)?
        .into_iter()
        .filter(|i| i.name != "lo")
        .map(|i| {
            let v4 = i.addrs.iter().filter(|a| a.contains('.')).map(|a| bare(a));
            (i.name, v4.collect())
        })
        .collect())
}

/// What plexusd's record of `id` says is attached: each added network's
/// interface and the addresses of its result; None without a record.
pub fn in_record(world: &World, id: &str) -> Result<Option<Addrs>, String> {
    let path = world.node.engine.record(id);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let v: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}: {text}", path.display()))?;
    let mut out = Addrs::new();
    for att in v["attachments"].as_array().into_iter().flatten() {
        for d in att["delegates"].as_array().into_iter().flatten() {
            if d["state"] != "added" {
                return Err(format!("{id}: delegate not added in its record: {d}"));
            }
            let ips = d["result"]["ips"].as_array().into_iter().flatten();
            let addrs = ips.filter_map(|i| i["address"].as_str()).map(bare);
            out.insert(
                d["ifname"].as_str().unwrap_or_default().to_string(),
                addrs.collect(),
            );
        }
    }
    Ok(Some(out))
}

/// What the pod's network-status annotation says; None without one.
pub fn in_status(world: &World, pod: &Pod) -> Option<Addrs> {
    let text = world.node.api.network_status(&pod.namespace, &pod.name)?;
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(
        v.as_array()?
            .iter()
            .map(|n| {
                let ips = n["ips"].as_array().into_iter().flatten();
                (
                    n["interface"].as_str().unwrap_or_default().to_string(),
                    ips.filter_map(Value::as_str).map(bare).collect(),
                )
            })
            .collect(),
    )
}

/// The `nat` table's rules (iptables-save), for portmap's.
fn nat_rules() -> String {
    Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The sandbox's network namespace (from the runtime's verbose status).
fn netns_of(world: &World, id: &str) -> Result<String, String> {
    let st = world
        .node
        .ctd
        .cri
        .pod_sandbox_status(id)
        .map_err(|e| format!("PodSandboxStatus {id}: {e}"))?;
    st.netns()
        .ok_or_else(|| format!("{id}: no network namespace in its status"))
}

/// What a successful RunPodSandbox of `pod` (sandbox `id`) must have
/// done: eth0, net1 and net2 in the sandbox's namespace, each with one
/// address of its network's subnet; plexusd's record saying exactly that;
/// the runtime's pod IP being eth0's; a host port's DNAT rule.
pub fn attached(world: &World, pod: &Pod, id: &str) {
    world
        .checks
        .add("a successful RunPodSandbox attached its networks", 1);
    if let Err(e) = attached_or(world, pod, id) {
        world.failures.push(format!(
            "RunPodSandbox {}/{} ({id}) answered success, but {e}",
            pod.namespace, pod.name
        ));
    }
}

fn attached_or(world: &World, pod: &Pod, id: &str) -> Result<(), String> {
    let netns = netns_of(world, id)?;
    let got = in_netns(&netns)?;
    let names: Vec<&str> = got.keys().map(String::as_str).collect();
    if names != ["eth0", "net1", "net2"] {
        return Err(format!("its namespace has {got:?}"));
    }
    for (i, (ifname, _)) in NETS.iter().enumerate() {
        let a = &got[*ifname];
        if a.len() != 1
            || !a
                .iter()
                .all(|x| world.node.subnets[i].holds(&format!("{x}/24")))
        {
            return Err(format!(
                "{ifname} has {a:?}, not one address of {}",
                world.node.subnets[i].cidr()
            ));
        }
    }
    match in_record(world, id)? {
        Some(r) if r == got => {}
        other => return Err(format!("the namespace has {got:?}, the record {other:?}")),
    }
    let ips = world
        .node
        .ctd
        .cri
        .pod_sandbox_status(id)
        .map_err(|e| e.to_string())?
        .ips();
    if ips.first() != got["eth0"].iter().next() {
        return Err(format!(
            "the runtime reports {ips:?}, eth0 has {:?}",
            got["eth0"]
        ));
    }
    if !pod.ports.is_empty() && !nat_rules().contains(id) {
        return Err(format!("no portmap rule for host port {:?}", pod.ports));
    }
    Ok(())
}

/// What a successful StopPodSandbox must have done: plexusd's record is
/// gone with every reservation and portmap rule of the sandbox, or what is
/// left is a pending cleanup plexusd took over (a DEL that failed more
/// often than the runtime is told).
pub fn detached(world: &World, p: &LivePod) {
    world
        .checks
        .add("a successful StopPodSandbox detached its networks", 1);
    let id = &p.id;
    let record = fs::read_to_string(world.node.engine.record(id)).ok();
    if let Some(text) = record {
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let atts = v["attachments"].as_array().cloned().unwrap_or_default();
        if atts.iter().all(|a| a["cleanup"].is_object()) {
            world.calls.add("StopPodSandbox handed over to plexusd", 1);
            return;
        }
        world.failures.push(format!(
            "StopPodSandbox {id} answered success, but its record still has attachments without a pending cleanup: {text}"
        ));
        return;
    }
    for (_, net) in NETS {
        let held: Vec<_> = world
            .node
            .reservations(net)
            .into_iter()
            .filter(|(_, holder)| holder == id)
            .collect();
        if !held.is_empty() {
            world.failures.push(format!(
                "StopPodSandbox {id} answered success and its record is gone, but {net} still reserves {held:?} for it"
            ));
        }
    }
    if !p.pod.ports.is_empty() && nat_rules().contains(id.as_str()) {
        world.failures.push(format!(
            "StopPodSandbox {id} answered success, but its portmap rules are still there"
        ));
    }
}

/// A checkpoint, with no call in flight and no fault on: every ready
/// sandbox is a pod of the driver whose namespace, record and
/// network-status agree (the status may take a moment to be written
/// again after the API server's faults); no address is held by two live
/// pods; every reservation belongs to a live pod or to a record plexusd
/// keeps (an ADD's rollback or a DEL still to retry).
pub fn checkpoint(world: &World) {
    world.node.wait_ready(Duration::from_secs(60));
    let pods: Vec<LivePod> = world.pods.lock().values().cloned().collect();
    let ready: BTreeSet<String> = match world.node.ctd.cri.list_pod_sandbox() {
        Ok(l) => l
            .into_iter()
            .filter(|s| s.state == SANDBOX_READY)
            .map(|s| s.id)
            .collect(),
        Err(e) => return world.failures.push(format!("ListPodSandbox: {e}")),
    };
    let known: BTreeSet<String> = pods.iter().map(|p| p.id.clone()).collect();
    world
        .checks
        .add("every ready sandbox is a pod the driver runs", 1);
    if let Some(stray) = ready.difference(&known).next() {
        world.failures.push(format!(
            "sandbox {stray} is ready, but no RunPodSandbox answered it"
        ));
    }
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for p in pods.iter().filter(|p| !p.netns_removed && !p.busy) {
        let Some(got) = agreeing(world, p) else {
            continue;
        };
        world.checks.add("no address is given to two live pods", 1);
        for a in got.values().flatten() {
            if let Some(other) = owner.insert(a.clone(), p.id.clone()) {
                world
                    .failures
                    .push(format!("address {a} is in both {other} and {}", p.id));
            }
        }
    }
    reservations_owned(world, &known);
}

/// Namespace, record and network-status of a live pod agree (waiting up
/// to 30 s for the status); what the namespace has.
fn agreeing(world: &World, p: &LivePod) -> Option<Addrs> {
    world.checks.add(
        "a ready sandbox's namespace, record and network-status agree",
        1,
    );
    let netns = match netns_of(world, &p.id).and_then(|n| in_netns(&n)) {
        Ok(g) => g,
        Err(e) => {
            world.failures.push(format!("live pod {}: {e}", p.id));
            return None;
        }
    };
    match in_record(world, &p.id) {
        Ok(Some(r)) if r == netns => {}
        other => {
            world.failures.push(format!(
                "live pod {} ({}): its namespace has {netns:?}, its record {other:?}",
                p.pod.name, p.id
            ));
            return None;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = in_status(world, &p.pod);
        if status.as_ref() == Some(&netns) {
            return Some(netns);
        }
        if Instant::now() > deadline {
            world.failures.push(format!(
                "live pod {} ({}): its namespace has {netns:?}, its network-status {status:?}",
                p.pod.name, p.id
            ));
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every reserved address belongs to a live pod or to a record.
fn reservations_owned(world: &World, live: &BTreeSet<String>) {
    world.checks.add("every reserved address has an owner", 1);
    let records: BTreeSet<String> = world
        .node
        .engine
        .records()
        .into_iter()
        .filter_map(|f| f.strip_suffix(".json").map(str::to_string))
        .collect();
    for (_, net) in NETS {
        for (addr, holder) in world.node.reservations(net) {
            if !live.contains(&holder) && !records.contains(&holder) {
                world.failures.push(format!(
                    "{net} reserves {addr} for {holder}: no live pod and no record of plexusd"
                ));
            }
        }
    }
}

/// What is left of the run's pods on the node (empty when clean).
pub fn leftovers(world: &World) -> Vec<String> {
    let n = &world.node;
    let mut left = Vec::new();
    for (_, net) in NETS {
        for (addr, holder) in n.reservations(net) {
            left.push(format!("{net} reserves {addr} for {holder}"));
        }
    }
    for b in &n.bridges {
        for port in bridge_ports(&b.name) {
            left.push(format!("bridge {} has port {port}", b.name));
        }
    }
    let nat = nat_rules();
    for id in world.seen_ids() {
        if nat.contains(&id) {
            left.push(format!("a portmap rule names {id}"));
        }
    }
    for r in n.engine.records() {
        left.push(format!("record {r}"));
    }
    for l in n.lock_files() {
        left.push(format!("lock file {l}"));
    }
    match n.ctd.cri.list_pod_sandbox() {
        Ok(l) => left.extend(l.into_iter().map(|s| format!("sandbox {}", s.id))),
        Err(e) => left.push(format!("ListPodSandbox: {e}")),
    }
    left
}

/// plexusd's descriptors, threads, and of the descriptors the TCP
/// connections to port `api_port` (the API server's: the Kubernetes
/// client keeps idle ones pooled for a while after a burst of requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub fds: usize,
    pub threads: usize,
    pub api_connections: usize,
}

impl Usage {
    pub fn of(pid: i32, api_port: u16) -> Usage {
        let targets: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .map(|t| t.display().to_string())
            .collect();
        let api = procnet::socket_inodes(pid, procnet::End::Remote, api_port);
        Usage {
            fds: targets.len(),
            threads: fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()),
            api_connections: targets
                .iter()
                .filter(|t| {
                    t.strip_prefix("socket:[")
                        .and_then(|r| r.strip_suffix(']'))
                        .is_some_and(|i| api.contains(i))
                })
                .count(),
        }
    }

    /// Descriptors other than the API server's connections.
    pub fn own_fds(&self) -> usize {
        self.fds - self.api_connections
    }
}
