//! plexusd's records reconciled with the runtime's pod sandboxes: Debian's
//! containerd run by the test (support::containerd), asked over its CRI
//! socket, and Debian's bridge + host-local on a pool of three addresses.
//! A sandbox the runtime forgot (its metadata lost, or one it never had,
//! made by plexus-shim ADDs with a pod's CNI_ARGS) has its networks
//! deleted by plexusd and its addresses given back: host-local's
//! reservation files and plexusd's records go, and the next pod takes the
//! address. Every rule that refuses to act on doubt keeps everything.
//!
//! plexusd's `criSocket` is a symbolic link the test points at the
//! containerd it runs, so a second containerd can take the first's place.
//! Rounds run every 200 ms; the tests count them in plexusd's debug log
//! (`reconcile round`) to know that some ran, and assert on files.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::support::cni::{bare, bridge, conflist, list_dir, ok, processes_matching, Call, Engine};
use crate::support::containerd::{ipv4_in, Containerd, Pod};
use crate::support::daemon::{poll, wait_until, Daemon};
use crate::support::netns::{bridge_ports, unique_name, Link, Netns, Subnet};

/// Longest wait for anything.
const T: Duration = Duration::from_secs(60);
/// How often rounds run in these tests.
const INTERVAL: &str = "200ms";

/// A node: plexusd whose cluster network is a bridge with host-local on
/// `.10`-`.12` of a subnet of its own, and the containerd it reconciles
/// with. Fields drop in order: containerd (its sandboxes removed through
/// plexusd), plexusd, then the directories and the bridge.
struct Node {
    ctd: Option<Containerd>,
    daemon: Option<Daemon>,
    engine: Engine,
    subnet: Subnet,
    bridge: Link,
}

impl Node {
    /// plexusd with `grace` and `extra` keys (no containerd yet); the
    /// cluster network has `more` plugins after bridge.
    fn new(tag: &str, grace: &str, extra: Value, more: Vec<Value>) -> Node {
        let engine = Engine::new(tag);
        let bridge_link = Link::planned("b");
        let subnet = Subnet::new();
        let ipam = json!({
            "type": "host-local",
            "dataDir": engine.ipam_dir,
            "ranges": [[{
                "subnet": subnet.cidr(),
                "rangeStart": format!("{}.10", subnet.prefix),
                "rangeEnd": format!("{}.12", subnet.prefix),
            }]],
        });
        let mut plugins = vec![bridge(&bridge_link.name, ipam)];
        plugins.extend(more);
        engine.write_network(
            "10-cluster.conflist",
            &conflist("cluster", "1.0.0", plugins),
        );
        let mut config = engine.config("cluster", "20s");
        config["criSocket"] = json!(engine.dir.join("cri.sock"));
        config["reconcileGrace"] = json!(grace);
        config["reconcileInterval"] = json!(INTERVAL);
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        let mut daemon = Daemon::start(&engine.dir, "d", config);
        daemon.ready();
        Node {
            ctd: None,
            daemon: Some(daemon),
            engine,
            subnet,
            bridge: bridge_link,
        }
    }

    fn d(&self) -> &Daemon {
        self.daemon.as_ref().unwrap()
    }

    fn ctd(&self) -> &Containerd {
        self.ctd.as_ref().unwrap()
    }

    /// Points plexusd's `criSocket` at the containerd of `tag` (before it
    /// even runs), then starts it, calling plexus-shim.
    fn start_containerd(&mut self, tag: &str) {
        let target = self.engine.dir.join(tag).join("c.sock");
        let link = self.engine.dir.join("cri.sock");
        let tmp = self.engine.dir.join(".cri.sock.tmp");
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp).unwrap();
        fs::rename(&tmp, &link).unwrap();
        let ctd = Containerd::start(&self.engine.dir, tag);
        ctd.use_plexus(&self.engine.dir.join("sock"));
        self.ctd = Some(ctd);
    }

    /// The reserved addresses of the cluster network.
    fn reserved(&self) -> Vec<String> {
        self.engine.reservations("cluster")
    }

    /// The rounds plexusd has logged so far.
    fn rounds(&self) -> usize {
        self.d().log_text().matches("reconcile round").count()
    }

    /// Waits until `n` more rounds have run.
    fn wait_rounds(&self, n: usize) {
        let seen = self.rounds();
        wait_until(T, "reconcile rounds", || self.rounds() >= seen + n);
    }

    /// `plexus_cleanups_total{outcome="reclaimed"}`.
    fn reclaimed(&self) -> u64 {
        crate::support::http::metric(
            &self.d().sock,
            "plexus_cleanups_total{outcome=\"reclaimed\"}",
        )
        .unwrap_or(0.0) as u64
    }

    /// An ADD through plexus-shim for container `id` in `netns`, with
    /// `args` as CNI_ARGS; its address (bare).
    fn add(&self, id: &str, netns: &Netns, args: &str) -> String {
        let r = ok(
            self.d(),
            &Call::new("ADD", id, netns, "eth0").args(args).run(self.d()),
        );
        bare(r["ips"][0]["address"].as_str().unwrap())
    }

    /// How long ago `id`'s record was written.
    fn record_age(&self, id: &str) -> Duration {
        let m = fs::metadata(self.engine.record(id)).unwrap();
        SystemTime::now()
            .duration_since(m.modified().unwrap())
            .unwrap_or_default()
    }

    /// Waits until every record of `ids` is older than `age`.
    fn wait_older(&self, ids: &[&str], age: Duration) {
        wait_until(T, "the records to age", || {
            ids.iter().all(|id| self.record_age(id) > age)
        });
    }

    fn has_record(&self, id: &str) -> bool {
        self.engine.record(id).exists()
    }
}

/// A pod's CNI_ARGS as containerd passes them.
fn k8s_args(namespace: &str, name: &str, id: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID=uid-{name}"
    )
}

/// A container id of the runtime's kind, unique.
fn container_id() -> String {
    format!("{:0>64}", unique_name("c").replace('-', ""))
}

/// containerd's process (its command line names its config).
fn containerd_pid(ctd: &Containerd) -> i32 {
    let needle = format!("--config {}", ctd.dir.join("config.toml").display());
    let found = processes_matching(&needle);
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].0
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a containerd this test started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Kills containerd with SIGKILL, then drops its guard: with containerd
/// dead, the guard only kills the sandboxes' processes and unmounts their
/// namespaces. No DEL reaches plexusd: the runtime lost everything. The
/// runc shims, left without their containerd, are killed here (the guard
/// looks for shims by an `-address` that is not their last argument) and
/// their sockets in `/run/containerd/s` removed.
fn forget_everything(ctd: Containerd) {
    let pid = containerd_pid(&ctd);
    let address = format!("-address {}", ctd.sock.display());
    let tasks = ctd.state.join("io.containerd.runtime.v2.task/k8s.io");
    let sockets: Vec<PathBuf> = list_dir(&tasks)
        .into_iter()
        .filter_map(|id| fs::read_to_string(tasks.join(id).join("address")).ok())
        .filter_map(|a| a.trim().strip_prefix("unix://").map(PathBuf::from))
        .collect();
    signal(pid, libc::SIGKILL);
    wait_until(T, "containerd to die", || {
        !Path::new(&format!("/proc/{pid}/cmdline")).exists()
            || fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.is_empty())
    });
    drop(ctd);
    let shims = || -> Vec<i32> {
        processes_matching(&address)
            .into_iter()
            .filter(|(_, cmd)| cmd.ends_with(&address) || cmd.contains(&format!("{address} ")))
            .map(|(p, _)| p)
            .collect()
    };
    for p in shims() {
        signal(p, libc::SIGKILL);
    }
    wait_until(T, "the runtime's shims to die", || shims().is_empty());
    for s in sockets {
        let _ = fs::remove_file(s);
    }
}

/// Resumes a stopped containerd however the test ends (its guard calls
/// it on drop).
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// The grace of the test below: long enough for a few rounds after the
/// second containerd comes up, which is all the restart rule keeps.
const RESTART_GRACE: Duration = Duration::from_secs(10);

#[test]
fn pods_the_runtime_forgot_should_give_their_addresses_back_once_it_has_run_for_the_grace() {
    let mut n = Node::new("rec-forgot", "10s", json!({}), vec![]);
    n.start_containerd("ctd1");
    let a = n.ctd().run(&Pod::new("rec", "a"));
    let b = n.ctd().run(&Pod::new("rec", "b"));
    let taken = n.reserved();
    assert_eq!(taken.len(), 2, "{taken:?}");
    // Listed by the runtime: kept, however old.
    n.wait_older(&[&a, &b], RESTART_GRACE);
    n.wait_rounds(2);
    assert_eq!(n.reserved(), taken);

    forget_everything(n.ctd.take().unwrap());
    assert!(n.has_record(&a) && n.has_record(&b));
    assert_eq!(n.reserved(), taken);
    // A new runtime that never heard of them: within the grace of its
    // start, nothing is done.
    let started = Instant::now();
    n.start_containerd("ctd2");
    let pid = containerd_pid(n.ctd());
    // It lists a sandbox, so that only its young age holds plexusd back;
    // that pod takes the pool's last address.
    let y = n.ctd().run(&Pod::new("rec", "y"));
    let full = n.reserved();
    assert_eq!(full.len(), 3, "{full:?}");
    let (err, _) = n.ctd().run_failing(&Pod::new("rec", "z"));
    assert!(err.message.contains("no IP addresses available"), "{err}");
    n.wait_rounds(3);
    assert_eq!(n.reserved(), full, "reclaimed within the runtime's grace");
    assert!(n.has_record(&a) && n.has_record(&b));
    let seen_after = started.elapsed();
    assert!(
        seen_after < RESTART_GRACE,
        "the test was too slow to see rounds within the grace"
    );
    assert_eq!(containerd_pid(n.ctd()), pid);

    wait_until(T, "the forgotten pods' addresses to come back", || {
        n.reserved().len() == 1 && !n.has_record(&a) && !n.has_record(&b)
    });
    eprintln!(
        "kept through rounds {seen_after:?} after the new runtime's start; addresses given back \
         after {:?}",
        started.elapsed()
    );
    assert!(!n.has_record(&a) && !n.has_record(&b));
    assert_eq!(n.engine.records(), [format!("{y}.json")]);
    assert_eq!(n.reclaimed(), 2);
    // The next pod takes a freed address.
    let c = n.ctd().run(&Pod::new("rec", "c"));
    let ns = n.ctd().netns(&c);
    let got = ipv4_in(&ns, "eth0");
    assert!(
        got.len() == 1 && n.subnet.holds(&got[0]) && taken.contains(&bare(&got[0])),
        "{got:?} not among the freed {taken:?} ({full:?} were taken)"
    );
    assert!(n.has_record(&c));
    n.ctd().stop_remove(&c);
    n.ctd().stop_remove(&y);
    assert_eq!(n.reserved(), Vec::<String>::new());
    assert_eq!(bridge_ports(&n.bridge.name), Vec::<String>::new());
    n.ctd().assert_empty();
}

#[test]
fn only_kubernetes_pods_whose_namespace_is_gone_should_be_reclaimed() {
    let mut n = Node::new("rec-args", "1s", json!({}), vec![]);
    n.start_containerd("ctd");
    let (forgotten, podman) = (container_id(), container_id());
    let ns1 = Netns::new();
    let ns2 = Netns::new();
    let gone_addr = n.add(&forgotten, &ns1, &k8s_args("rec", "web", &forgotten));
    // podman's (and any caller's without a pod): CNI_ARGS name no pod.
    let podman_addr = n.add(&podman, &ns2, "IgnoreUnknown=1");
    let podman_netns = ns2.path.clone();
    drop(ns1);
    drop(ns2);
    wait_until(T, "the forgotten pod's address to come back", || {
        !n.reserved().contains(&gone_addr) && !n.has_record(&forgotten)
    });
    assert!(!n.has_record(&forgotten));
    n.wait_rounds(2);
    assert_eq!(n.reserved(), [podman_addr], "podman's address went");
    assert!(n.has_record(&podman));
    assert_eq!(n.reclaimed(), 1);
    // A pod whose namespace is still there is kept as well.
    let live = container_id();
    let ns3 = Netns::new();
    n.add(&live, &ns3, &k8s_args("rec", "live", &live));
    n.wait_older(&[&live], Duration::from_secs(1));
    n.wait_rounds(2);
    assert!(n.has_record(&live) && ns3.has_link("eth0"));
    assert_eq!(n.reserved().len(), 2);
    let del = Call::new("DEL", &live, &ns3, "eth0").args(&k8s_args("rec", "live", &live));
    ok(n.d(), &del.run(n.d()));
    let mut del = Call::new("DEL", &podman, &ns3, "eth0");
    del.netns = podman_netns;
    ok(n.d(), &del.run(n.d()));
    assert_eq!(n.reserved(), Vec::<String>::new());
    assert_eq!(n.engine.records(), Vec::<String>::new());
}

#[test]
fn nothing_should_be_reclaimed_while_the_runtime_does_not_answer() {
    let mut n = Node::new("rec-stop", "1s", json!({}), vec![]);
    n.start_containerd("ctd");
    n.wait_rounds(1);
    let pid = containerd_pid(n.ctd());
    signal(pid, libc::SIGSTOP);
    let resume = Resume(pid);
    let id = container_id();
    let ns = Netns::new();
    let addr = n.add(&id, &ns, &k8s_args("rec", "web", &id));
    drop(ns);
    n.wait_older(&[&id], Duration::from_secs(1));
    // Two whole rounds (each waits out its call's bound) with the record
    // eligible but for the silence.
    n.wait_rounds(2);
    assert!(n.d().log_text().contains("did not answer"));
    assert_eq!(n.reserved(), [addr], "reclaimed without an answer");
    assert!(n.has_record(&id));
    drop(resume);
    wait_until(
        T,
        "the address to come back once the runtime answers",
        || n.reserved().is_empty() && !n.has_record(&id),
    );
    assert!(!n.has_record(&id));
}

#[test]
fn an_empty_list_after_a_full_one_should_keep_everything_for_the_grace() {
    let mut n = Node::new("rec-empty", "5s", json!({}), vec![]);
    n.start_containerd("ctd");
    let p = n.ctd().run(&Pod::new("rec", "p"));
    let id = container_id();
    let ns = Netns::new();
    let addr = n.add(&id, &ns, &k8s_args("rec", "web", &id));
    n.wait_older(&[&id], Duration::from_secs(5));
    n.ctd().stop_remove(&p);
    let emptied = Instant::now();
    // The runtime now lists nothing, and the pod's namespace is gone.
    drop(ns);
    n.wait_rounds(3);
    assert_eq!(n.reserved(), [addr], "reclaimed on a sudden empty list");
    assert!(n.has_record(&id));
    assert!(
        emptied.elapsed() < Duration::from_secs(5),
        "the test was too slow to see rounds within the grace"
    );
    wait_until(
        T,
        "the address to come back once the list stayed empty",
        || n.reserved().is_empty() && !n.has_record(&id),
    );
    assert!(emptied.elapsed() >= Duration::from_secs(5));
    assert!(!n.has_record(&id));
}

#[test]
fn a_sandbox_being_created_should_keep_its_address() {
    // The cluster network's second plugin holds every ADD until the test
    // releases it.
    let mut n = Node::new(
        "rec-hold",
        "100ms",
        json!({}),
        vec![json!({"type": "hold"})],
    );
    n.engine.fake(
        "hold",
        r#"if [ "$CNI_COMMAND" = ADD ]; then
  touch "$DIR/holding"
  while [ ! -e "$DIR/release" ]; do sleep 0.05; done
fi
printf '%s' "$STDIN" | jq -c '(.prevResult // {}) + {cniVersion: .cniVersion}'"#,
    );
    n.start_containerd("ctd");
    let holding = n.engine.dir.join("holding");
    let release = n.engine.dir.join("release");
    let id = std::thread::scope(|s| {
        let run = s.spawn(|| n.ctd().run(&Pod::new("rec", "slow")));
        wait_until(T, "the ADD to be held", || holding.exists());
        // Rounds while the ADD is held, with a record older than the grace.
        n.wait_rounds(5);
        let reserved = n.reserved();
        assert_eq!(reserved.len(), 1, "{reserved:?}");
        assert_eq!(n.engine.records().len(), 1);
        fs::write(&release, b"").unwrap();
        run.join().unwrap()
    });
    n.wait_rounds(3);
    let ns = n.ctd().netns(&id);
    let got = ipv4_in(&ns, "eth0");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(n.reserved(), [bare(&got[0])]);
    assert!(n.has_record(&id));
    assert_eq!(n.reclaimed(), 0);
    n.ctd().stop_remove(&id);
    assert_eq!(n.reserved(), Vec::<String>::new());
}

#[test]
fn reconcile_false_should_leave_every_record_alone() {
    let mut n = Node::new("rec-off", "200ms", json!({"reconcile": false}), vec![]);
    n.start_containerd("ctd");
    let id = container_id();
    let ns = Netns::new();
    let addr = n.add(&id, &ns, &k8s_args("rec", "web", &id));
    drop(ns);
    // Ten intervals, the record eligible all along: nothing changes.
    let changed = poll(Duration::from_secs(2), Duration::from_millis(50), || {
        n.reserved() != [addr.clone()] || !n.has_record(&id)
    });
    assert!(!changed, "reclaimed with reconcile: false");
    assert_eq!(n.rounds(), 0);
    // The same records under a plexusd that reconciles: reclaimed.
    let mut d = n.daemon.take().unwrap();
    d.terminate();
    assert!(d.wait_exit(T).success());
    let mut config: Value =
        serde_json::from_slice(&fs::read(n.engine.dir.join("d.json")).unwrap()).unwrap();
    config["reconcile"] = json!(true);
    let mut d = Daemon::start(&n.engine.dir, "d2", config);
    d.ready();
    n.daemon = Some(d);
    wait_until(T, "the address to come back", || {
        n.reserved().is_empty() && !n.has_record(&id)
    });
    assert!(!n.has_record(&id));
}
