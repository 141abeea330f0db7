//! Plexus under a real container runtime: Debian's containerd (1.6) run by
//! the test (support::containerd), its CRI plugin calling plexus-shim, the
//! tests driving it through the CRI gRPC API as the kubelet does. Every
//! pod gets the cluster network (eth0) and a default network (net1), both
//! bridges of Debian's plugins with host-local; the tests look at the
//! sandbox's network namespace, the host's bridges and host-local's store,
//! Plexus's records and containerd's own view of the pod.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::cni::{bare, bridge, conflist, Engine};
use crate::support::containerd::{ipv4_in, Containerd, Pod};
use crate::support::daemon::{wait_until, Daemon, PLEXUSD};
use crate::support::kube::{FakeApi, NODE};
use crate::support::netns::{bridge_ports, Link, Subnet};

/// A node: plexusd with networks `cluster` (eth0) and `lan` (net1, a
/// default network), containerd calling plexus-shim. Fields drop in order:
/// containerd (removing what sandboxes are left, through plexusd), then
/// plexusd, then the directories and bridges.
struct Node {
    ctd: Containerd,
    daemon: Option<Daemon>,
    engine: Engine,
    subnets: [Subnet; 2],
    bridges: [Link; 2],
}

fn networks(engine: &Engine, bridges: &[Link; 2], subnets: &[Subnet; 2]) {
    for (i, (file, name)) in [
        ("10-cluster.conflist", "cluster"),
        ("20-lan.conflist", "lan"),
    ]
    .into_iter()
    .enumerate()
    {
        let b = bridge(&bridges[i].name, engine.host_local(&subnets[i]));
        engine.write_network(file, &conflist(name, "1.0.0", vec![b]));
    }
}

fn daemon_config(engine: &Engine) -> serde_json::Value {
    let mut config = engine.config("cluster", "20s");
    config["defaultNetworks"] = json!(["lan"]);
    config
}

impl Node {
    /// A node whose containerd already uses Plexus.
    fn new(tag: &str) -> Node {
        let n = Node::without_cni(tag, json!({}));
        n.ctd.use_plexus(&n.sock_dir());
        n
    }

    /// A node whose containerd has no CNI config yet; `extra` keys are
    /// added to plexusd's config.
    fn without_cni(tag: &str, extra: Value) -> Node {
        let engine = Engine::new(tag);
        let bridges = [Link::bridge(), Link::bridge()];
        let subnets = [Subnet::new(), Subnet::new()];
        networks(&engine, &bridges, &subnets);
        let mut config = daemon_config(&engine);
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        let mut daemon = Daemon::start(&engine.dir, "d", config);
        daemon.ready();
        let ctd = Containerd::start(&engine.dir, "ctd");
        Node {
            ctd,
            daemon: Some(daemon),
            engine,
            subnets,
            bridges,
        }
    }

    fn sock_dir(&self) -> PathBuf {
        self.engine.dir.join("sock")
    }

    /// Asserts everything a running pod `id` should have: eth0 and net1 in
    /// its netns with addresses of the two subnets, the runtime's IP being
    /// eth0's, a Plexus record, each address reserved in its network's
    /// host-local store; eth0's address.
    fn assert_attached(&self, id: &str) -> String {
        let netns = self.ctd.netns(id);
        let mut addrs = Vec::new();
        for (i, (ifname, net)) in [("eth0", "cluster"), ("net1", "lan")]
            .into_iter()
            .enumerate()
        {
            let got = ipv4_in(&netns, ifname);
            assert!(
                got.len() == 1 && self.subnets[i].holds(&got[0]),
                "{id}: {ifname} {got:?} not in {}",
                self.subnets[i].cidr()
            );
            let reserved = self.engine.reservations(net);
            assert!(
                reserved.contains(&bare(&got[0])),
                "{net}: {reserved:?} lacks {got:?}"
            );
            addrs.push(bare(&got[0]));
        }
        assert_eq!(self.ctd.status(id).ips(), vec![addrs[0].clone()], "{id}");
        assert!(self.engine.record(id).exists(), "no record for {id}");
        let cgroup = self.ctd.sandbox_cgroup(id);
        assert!(cgroup.is_dir(), "{} missing", cgroup.display());
        addrs.swap_remove(0)
    }

    /// Asserts that nothing of any pod is left: no bridge ports, no
    /// reservations, no records, no sandboxes, netns, mounts or shims.
    fn assert_clean(&self) {
        for b in &self.bridges {
            assert_eq!(bridge_ports(&b.name), Vec::<String>::new(), "{}", b.name);
        }
        for net in ["cluster", "lan"] {
            assert_eq!(self.engine.reservations(net), Vec::<String>::new(), "{net}");
        }
        assert_eq!(self.engine.records(), Vec::<String>::new(), "records left");
        self.ctd.assert_empty();
    }
}

#[test]
fn pods_one_after_another_should_get_two_networks_and_leave_nothing() {
    let n = Node::new("cri-seq");
    for i in 0..5 {
        let id = n.ctd.run(&Pod::new("seq", &format!("pod-{i}")));
        n.assert_attached(&id);
        let netns = n.ctd.netns(&id);
        assert_eq!(bridge_ports(&n.bridges[0].name).len(), 1);
        assert_eq!(bridge_ports(&n.bridges[1].name).len(), 1);
        n.ctd.stop_remove(&id);
        assert!(!Path::new(&netns).exists(), "{netns} left");
        assert!(!n.engine.record(&id).exists(), "record of {id} left");
    }
    n.assert_clean();
}

/// Runs `count` pods `<prefix>-<i>` at once, one thread each; their ids.
fn run_at_once(ctd: &Containerd, prefix: &str, count: usize) -> Vec<String> {
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..count)
            .map(|i| s.spawn(move || ctd.run(&Pod::new("many", &format!("{prefix}-{i}")))))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

#[test]
fn thirty_pods_at_once_should_each_get_their_own_addresses_and_leave_nothing() {
    let n = Node::new("cri-many");
    let started = Instant::now();
    let ids = run_at_once(&n.ctd, "pod", 30);
    let ran = started.elapsed();
    let mut eth0: Vec<String> = ids.iter().map(|id| n.assert_attached(id)).collect();
    eth0.sort();
    eth0.dedup();
    assert_eq!(eth0.len(), 30, "addresses given twice");
    for b in &n.bridges {
        assert_eq!(bridge_ports(&b.name).len(), 30, "{}", b.name);
    }
    assert_eq!(n.engine.records().len(), 30);
    assert_eq!(n.ctd.netns_files().len(), 30);
    std::thread::scope(|s| {
        for id in &ids {
            let ctd = &n.ctd;
            s.spawn(move || ctd.stop_remove(id));
        }
    });
    n.assert_clean();
    eprintln!(
        "30 RunPodSandbox at once: {ran:?}; all: {:?}",
        started.elapsed()
    );
}

#[test]
fn sandboxes_should_be_removed_cleanly_after_plexusd_was_killed() {
    let mut n = Node::new("cri-kill");
    let ids = run_at_once(&n.ctd, "pod", 3);
    for id in &ids {
        n.assert_attached(id);
    }
    let mut d = n.daemon.take().unwrap();
    d.signal(libc::SIGKILL);
    d.wait_exit(T);
    // Nothing answers: the runtime cannot tear the network down, says so,
    // and keeps the sandbox.
    assert_eq!(n.ctd.stop_failures(&ids[0], 2), 2);
    assert_eq!(n.ctd.sandboxes().len(), 3);
    let mut d = Daemon::start(&n.engine.dir, "d2", daemon_config(&n.engine));
    d.ready();
    n.daemon = Some(d);
    for id in &ids {
        n.ctd.stop_remove(id);
    }
    n.assert_clean();
}

/// Longest wait for a daemon or a call.
const T: Duration = Duration::from_secs(60);

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// How often plexusd is restarted while pods are created.
const RESTARTS: usize = 10;
/// Threads creating pods meanwhile, each one call at a time.
const CREATORS: usize = 3;

#[test]
fn pods_created_while_plexusd_restarts_under_socket_activation_should_never_fail() {
    let engine = Engine::new("cri-restart");
    let bridges = [Link::bridge(), Link::bridge()];
    let subnets = [Subnet::new(), Subnet::new()];
    networks(&engine, &bridges, &subnets);
    // Declared before the node: dropped after containerd is gone.
    let mut daemon: Option<Daemon>;
    let n = Node {
        ctd: Containerd::start(&engine.dir, "ctd"),
        daemon: None,
        engine,
        subnets,
        bridges,
    };
    let path = n.sock_dir().join("plexus.sock");
    std::fs::create_dir_all(n.sock_dir()).unwrap();
    // The test is the service manager: it holds the listening socket and
    // hands it to each plexusd it starts.
    let listener = UnixListener::bind(&path).unwrap();
    let config = daemon_config(&n.engine);
    let start = |tag: &str| {
        let mut d = Daemon::start_activated(&n.engine.dir, tag, config.clone(), &listener, &path);
        d.ready();
        d
    };
    daemon = Some(start("d0"));
    n.ctd.use_plexus(&n.sock_dir());
    let done = AtomicBool::new(false);
    let tried = AtomicUsize::new(0);
    let failed = Mutex::new(Vec::new());
    let ids = std::thread::scope(|s| {
        // The creators stop when the restarts end, also by a panic.
        let _stop = StopOnDrop(&done);
        let creators: Vec<_> = (0..CREATORS)
            .map(|c| {
                let (done, tried, failed, ctd) = (&done, &tried, &failed, &n.ctd);
                s.spawn(move || {
                    let mut ids = Vec::new();
                    for attempt in 0.. {
                        if done.load(Ordering::SeqCst) {
                            break;
                        }
                        let pod = Pod::new("restart", &format!("pod-{c}-{attempt}"));
                        match ctd.try_run(&pod) {
                            Ok(id) => ids.push(id),
                            Err(e) => failed.lock().unwrap().push(e.to_string()),
                        }
                        tried.fetch_add(1, Ordering::SeqCst);
                    }
                    ids
                })
            })
            .collect();
        for r in 1..=RESTARTS {
            // A pod since the last restart: restarts are spread over the
            // creations, each one with calls in flight or queued.
            let seen = tried.load(Ordering::SeqCst);
            wait_until(T, "a RunPodSandbox to finish", || {
                tried.load(Ordering::SeqCst) > seen
            });
            let mut old = daemon.take().unwrap();
            old.terminate();
            assert!(old.wait_exit(T).success(), "{}", old.log_text());
            daemon = Some(start(&format!("d{r}")));
        }
        let seen = tried.load(Ordering::SeqCst);
        wait_until(T, "a RunPodSandbox after the last restart", || {
            tried.load(Ordering::SeqCst) > seen
        });
        done.store(true, Ordering::SeqCst);
        creators
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect::<Vec<_>>()
    });
    let failed = failed.into_inner().unwrap();
    assert_eq!(failed, Vec::<String>::new(), "failed RunPodSandbox calls");
    assert!(ids.len() > RESTARTS, "{} pods", ids.len());
    eprintln!("{} pods across {RESTARTS} restarts", ids.len());
    for id in &ids {
        n.assert_attached(id);
    }
    for id in &ids {
        n.ctd.stop_remove(id);
    }
    n.assert_clean();
}

#[test]
fn generate_config_written_while_containerd_runs_should_send_the_next_sandbox_through_plexus() {
    let n = Node::without_cni("cri-gen", json!({}));
    // No network config yet: the runtime says so and runs no sandbox.
    assert!(!n.ctd.cri.condition("NetworkReady"));
    // containerd keeps the failed sandbox, not ready, for the kubelet to
    // stop and remove.
    let (err, early) = n.ctd.run_failing(&Pod::new("gen", "early"));
    assert!(err.message.contains("cni"), "{err}");
    let early = early.expect("the failed sandbox is kept");
    assert_eq!(n.ctd.sandboxes(), std::slice::from_ref(&early));
    // The generator's configuration: plexusd's own confDir holds the
    // primary (cluster) network, containerd's conf_dir gets the output.
    let config = json!({
        "multusAutoconfigDir": n.engine.conf_dir,
        "cniConfigDir": n.ctd.conf_dir,
        "daemonSocketDir": n.sock_dir(),
    });
    let path = n.engine.dir.join("generate.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let out = Command::new(PLEXUSD)
        .arg("--config")
        .arg(&path)
        .arg("generate-config")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let written: Value =
        serde_json::from_slice(&std::fs::read(n.ctd.conf_dir.join("00-plexus.conf")).unwrap())
            .unwrap();
    assert_eq!(written["type"], "plexus-shim", "{written}");
    n.ctd.wait_network_ready();
    let id = n.ctd.run(&Pod::new("gen", "first"));
    n.assert_attached(&id);
    n.ctd.stop_remove(&id);
    // The failed sandbox goes too, through Plexus, which never saw it.
    n.ctd.stop_remove(&early);
    n.assert_clean();
}

/// The pods' namespace on the fake API server.
const K8S_NS: &str = "team";
/// The annotation selecting a pod's networks.
const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";

#[test]
fn pods_should_get_the_networks_their_annotations_select_from_the_api_server() {
    let api = FakeApi::start();
    let engine = Engine::new("cri-k8s");
    let bridges = [Link::bridge(), Link::bridge()];
    let subnets = [Subnet::new(), Subnet::new()];
    let cluster = bridge(&bridges[0].name, engine.host_local(&subnets[0]));
    engine.write_network(
        "10-cluster.conflist",
        &conflist("cluster", "1.0.0", vec![cluster]),
    );
    let blue = bridge(&bridges[1].name, engine.host_local(&subnets[1]));
    let blue = conflist("blue-net", "1.0.0", vec![blue]).to_string();
    api.put_nad(K8S_NS, "blue", Some(&blue), json!({}));
    // Selection reads the pod from the API server by the name containerd
    // passes (K8S_POD_NAMESPACE, K8S_POD_NAME from the sandbox metadata).
    let networks = json!({NETWORKS: "blue"});
    api.put_pod(K8S_NS, "web", "uid-team-web", NODE, networks.clone());
    api.put_pod(K8S_NS, "plain", "uid-team-plain", NODE, json!({}));
    let daemon = api.start_daemon(&engine.dir, engine.config("cluster", "20s"), "5s");
    let n = Node {
        ctd: Containerd::start(&engine.dir, "ctd"),
        daemon: Some(daemon),
        engine,
        subnets,
        bridges,
    };
    n.ctd.use_plexus(&n.sock_dir());

    let mark = api.mark();
    let web = n
        .ctd
        .run(&Pod::new(K8S_NS, "web").annotate(NETWORKS, "blue"));
    let plain = n.ctd.run(&Pod::new(K8S_NS, "plain"));
    let web_ns = n.ctd.netns(&web);
    let (eth0, net1) = (ipv4_in(&web_ns, "eth0"), ipv4_in(&web_ns, "net1"));
    assert!(eth0.len() == 1 && n.subnets[0].holds(&eth0[0]), "{eth0:?}");
    assert!(net1.len() == 1 && n.subnets[1].holds(&net1[0]), "{net1:?}");
    assert_eq!(n.ctd.status(&web).ips(), vec![bare(&eth0[0])]);
    let plain_ns = n.ctd.netns(&plain);
    assert_eq!(ipv4_in(&plain_ns, "net1"), Vec::<String>::new());
    assert_eq!(ipv4_in(&plain_ns, "eth0").len(), 1);
    assert_eq!(bridge_ports(&n.bridges[1].name).len(), 1);
    assert!(n.engine.record(&web).exists() && n.engine.record(&plain).exists());
    // The status was written to the pod the runtime named.
    assert_eq!(
        api.network_status_names(K8S_NS, "web"),
        ["cluster", "team/blue"]
    );
    assert_eq!(api.network_status_names(K8S_NS, "plain"), ["cluster"]);
    let patches = api
        .calls_since(mark)
        .into_iter()
        .filter(|c| c.method == "PATCH")
        .count();
    assert_eq!(patches, 2);

    n.ctd.stop_remove(&web);
    n.ctd.stop_remove(&plain);
    assert_eq!(bridge_ports(&n.bridges[0].name), Vec::<String>::new());
    assert_eq!(bridge_ports(&n.bridges[1].name), Vec::<String>::new());
    assert_eq!(n.engine.reservations("blue-net"), Vec::<String>::new());
    assert_eq!(n.engine.reservations("cluster"), Vec::<String>::new());
    assert_eq!(n.engine.records(), Vec::<String>::new());
    n.ctd.assert_empty();
}

/// A counter of plexusd's `/metrics`, 0 when it has no sample yet.
fn counter(d: &Daemon, sample: &str) -> u64 {
    crate::support::http::metric(&d.sock, sample).unwrap_or(0.0) as u64
}

fn dels(d: &Daemon, outcome: &str) -> u64 {
    counter(
        d,
        &format!(
            "plexus_requests_total{{endpoint=\"/cni\",command=\"DEL\",outcome=\"{outcome}\"}}"
        ),
    )
}

/// A node whose pods get `cluster` (eth0), `lan` (net1) and `broken`
/// (net2), a network whose every ADD and DEL fail; plexusd retries failed
/// DELs every 100 ms and gives up after 2 same failures.
fn never_node(tag: &str, broken: impl FnOnce(&Engine) -> Value) -> Node {
    let n = Node::without_cni(
        tag,
        json!({
            "defaultNetworks": ["lan", "broken"],
            "cleanupRetryInterval": "100ms",
            "cleanupGiveUpAfter": 2,
        }),
    );
    let broken = broken(&n.engine);
    n.engine.write_network(
        "30-broken.conflist",
        &conflist("broken", "1.0.0", vec![broken]),
    );
    n.ctd.use_plexus(&n.sock_dir());
    n
}

/// The one pending network of `id`'s record, which must be handed over
/// (or not yet, `handed_over`).
fn assert_pending(n: &Node, id: &str, handed_over: bool) {
    let record: Value =
        serde_json::from_slice(&std::fs::read(n.engine.record(id)).unwrap()).unwrap();
    let atts = record["attachments"].as_array().unwrap();
    assert_eq!(atts.len(), 1, "{record}");
    assert_eq!(
        atts[0]["cleanup"]["handedOver"],
        json!(handed_over),
        "{record}"
    );
    let names: Vec<&str> = atts[0]["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["broken"],
        "only the network that cannot work is pending"
    );
    // The ADD's rollback undid eth0 and net1.
    assert!(n.engine.reservations("cluster").is_empty() && n.engine.reservations("lan").is_empty());
}

/// A bridge network with an invalid VLAN id: Debian's bridge refuses its
/// configuration on ADD and on DEL alike ("invalid VLAN ID"). Every
/// StopPodSandbox used to fail for ever; now the second succeeds (the
/// third DEL: containerd's own teardown in RunPodSandbox was the first), the
/// sandbox goes, and plexusd gives the network's DEL up once the
/// namespace is gone.
#[test]
fn a_pod_whose_network_can_never_work_should_be_stopped_by_the_second_stop_call() {
    let br = Link::bridge();
    let subnet = Subnet::new();
    let n = never_node(
        "cri-vlan",
        |e| json!({"type": "bridge", "bridge": br.name, "vlan": 5000, "ipam": e.host_local(&subnet)}),
    );
    let d = n.daemon.as_ref().unwrap();
    let (err, kept) = n.ctd.run_failing(&Pod::new("never", "web"));
    assert!(err.message.contains("invalid VLAN ID"), "{err}");
    let id = kept.expect("containerd keeps the sandbox whose teardown failed");
    let dels_in_run = dels(d, "error");
    assert_pending(&n, &id, false);

    // The kubelet calls StopPodSandbox until it succeeds.
    let mut stops = 0;
    while n.ctd.cri.stop_pod_sandbox(&id).is_err() {
        stops += 1;
        assert!(stops < 10, "StopPodSandbox still fails after 10 calls");
    }
    eprintln!(
        "never-working bridge: {dels_in_run} failed DEL during RunPodSandbox; StopPodSandbox failed {stops} time(s), then succeeded; DELs answered with an error: {}, with success: {}",
        dels(d, "error"),
        dels(d, "success"),
    );
    assert_eq!(
        stops,
        2 - dels_in_run.min(2) as usize,
        "the runtime hears of 2 failed DELs in all"
    );
    assert_pending(&n, &id, true);

    n.ctd.cri.remove_pod_sandbox(&id).unwrap();
    wait_until(T, "the pending cleanup to be given up", || {
        !n.engine.record(&id).exists()
    });
    assert_eq!(counter(d, "plexus_cleanups_total{outcome=\"given_up\"}"), 1);
    n.assert_clean();
}

/// macvlan on a master the node does not have: every DEL fails with
/// "Link not found", which containerd 1.6 takes for success, so it
/// forgets the sandbox at once. Plexus used to keep a record of it for
/// ever; now its pending cleanup is given up once the namespace is gone.
#[test]
fn a_sandbox_the_runtime_forgot_should_have_its_cleanup_given_up() {
    let master = crate::support::netns::unique_name("nm");
    let subnet = Subnet::new();
    let n = never_node(
        "cri-never",
        |e| json!({"type": "macvlan", "master": master, "mode": "bridge", "ipam": e.host_local(&subnet)}),
    );
    let d = n.daemon.as_ref().unwrap();
    let (err, kept) = n.ctd.run_failing(&Pod::new("never", "web"));
    assert!(err.message.contains("Link not found"), "{err}");
    assert_eq!(
        kept, None,
        "containerd ignores a DEL error that says \"not found\""
    );
    eprintln!(
        "macvlan without master: DELs during RunPodSandbox answered with an error: {}",
        dels(d, "error")
    );
    wait_until(T, "the pending cleanup to be given up", || {
        n.engine.records().is_empty()
    });
    assert_eq!(counter(d, "plexus_cleanups_total{outcome=\"given_up\"}"), 1);
    n.assert_clean();
}
