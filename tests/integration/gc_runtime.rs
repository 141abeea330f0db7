//! GC asks the runtime before it sweeps: with a CRI socket, a container
//! the runtime lists, or whose record is younger than `reconcileGrace`,
//! keeps its networks whatever the GC call's valid list says (a runtime
//! computes that list before its GC call, so a pod whose ADD ended in
//! between is missing from it, yet alive). A runtime that cannot be asked
//! fails GC with "try again later" and nothing is swept. Without a CRI
//! socket the valid list alone decides.
//!
//! Debian's containerd (support::containerd) runs the pods it lists;
//! containers it never had are made by plexus-shim ADDs with a pod's
//! CNI_ARGS in a namespace of the test (which stays, so that reconcile
//! never takes them: only GC does). Debian's bridge + host-local on a
//! pool of three addresses; the tests assert on the interface and its
//! address in the pod's namespace, plexusd's record and host-local's
//! reservation file. Reconcile rounds run once at start and then hourly.

use std::fs;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::support::cni::{bare, bridge, conflist, failed, gc, ok, Call, Engine};
use crate::support::containerd::{ipv4_in, Containerd, Pod};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::netns::{unique_name, Link, Netns, Subnet};
use crate::support::shim::Run;

/// Longest wait for anything.
const T: Duration = Duration::from_secs(60);
/// "Try again later".
const TRY_AGAIN_LATER: u64 = 11;

/// A node: plexusd whose cluster network is a bridge with host-local on
/// `.10`-`.12` of a subnet of its own, and, when started, a containerd
/// answering on its `criSocket`. Fields drop in order: containerd (its
/// sandboxes removed through plexusd), plexusd, the directories, the
/// bridge.
struct Node {
    ctd: Option<Containerd>,
    daemon: Daemon,
    engine: Engine,
    _bridge: Link,
}

impl Node {
    /// plexusd with `reconcileGrace` `grace`; with `cri`, its `criSocket`
    /// is `<dir>/cri.sock`, a symbolic link to where containerd will
    /// answer (nothing does yet); without, `criSocket` is `""`.
    fn new(tag: &str, cri: bool, grace: &str) -> Node {
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
        engine.write_network(
            "10-cluster.conflist",
            &conflist("cluster", "1.0.0", vec![bridge(&bridge_link.name, ipam)]),
        );
        let mut config = engine.config("cluster", "20s");
        config["criSocket"] = if cri {
            let link = engine.dir.join("cri.sock");
            std::os::unix::fs::symlink(engine.dir.join("ctd").join("c.sock"), &link).unwrap();
            json!(link)
        } else {
            json!("")
        };
        config["reconcileGrace"] = json!(grace);
        config["reconcileInterval"] = json!("1h");
        let mut daemon = Daemon::start(&engine.dir, "d", config);
        daemon.ready();
        Node {
            ctd: None,
            daemon,
            engine,
            _bridge: bridge_link,
        }
    }

    /// Starts containerd where `criSocket` points, calling plexus-shim.
    fn start_containerd(&mut self) {
        let ctd = Containerd::start(&self.engine.dir, "ctd");
        assert_eq!(
            fs::canonicalize(self.engine.dir.join("cri.sock")).unwrap(),
            fs::canonicalize(&ctd.sock).unwrap()
        );
        ctd.use_plexus(&self.engine.dir.join("sock"));
        self.ctd = Some(ctd);
    }

    fn ctd(&self) -> &Containerd {
        self.ctd.as_ref().unwrap()
    }

    /// An ADD through plexus-shim for `id` in `netns`, with the CNI_ARGS
    /// of a pod the runtime never had; its address (bare).
    fn add(&self, id: &str, netns: &Netns) -> String {
        let call = Call::new("ADD", id, netns, "eth0").args(&k8s_args(id));
        let r = ok(&self.daemon, &call.run(&self.daemon));
        bare(r["ips"][0]["address"].as_str().unwrap())
    }

    /// A GC through plexus-shim whose valid list is `valid`.
    fn gc(&self, valid: Value) -> Run {
        gc(&self.daemon, valid)
    }

    /// Makes `id`'s record look written `ago` (the time GC reads).
    fn written_ago(&self, id: &str, ago: Duration) {
        fs::File::options()
            .write(true)
            .open(self.engine.record(id))
            .unwrap()
            .set_modified(SystemTime::now() - ago)
            .unwrap();
    }

    /// Waits until every record of `ids` is older than `age`.
    fn wait_older(&self, ids: &[&str], age: Duration) {
        wait_until(T, "the records to age", || {
            ids.iter().all(|id| {
                let written = fs::metadata(self.engine.record(id))
                    .unwrap()
                    .modified()
                    .unwrap();
                SystemTime::now()
                    .duration_since(written)
                    .is_ok_and(|a| a > age)
            })
        });
    }

    /// Who host-local says holds `addr` (`<id>\r\n<ifname>`), if anyone.
    fn holder(&self, addr: &str) -> Option<String> {
        fs::read_to_string(self.engine.ipam_dir.join("cluster").join(addr)).ok()
    }

    fn reserved(&self) -> Vec<String> {
        self.engine.reservations("cluster")
    }

    fn has_record(&self, id: &str) -> bool {
        self.engine.record(id).exists()
    }

    /// Asserts `id` keeps everything: its record, `addr` on eth0 in
    /// `netns` (a path) and host-local's reservation of it.
    fn assert_kept(&self, id: &str, netns: &str, addr: &str) {
        assert!(self.has_record(id), "{id}'s record was swept");
        let got = ipv4_in(netns, "eth0");
        assert_eq!(
            got.iter().map(|a| bare(a)).collect::<Vec<_>>(),
            [addr],
            "{id}'s interface"
        );
        assert_eq!(
            self.holder(addr).as_deref(),
            Some(format!("{id}\r\neth0").as_str()),
            "{id}'s reservation of {addr}: {:?}",
            self.reserved()
        );
    }

    /// Asserts GC swept `id`: no record, no eth0 in `netns`, `addr` free.
    fn assert_swept(&self, id: &str, netns: &Netns, addr: &str) {
        assert!(!self.has_record(id), "{id}'s record was kept");
        assert!(!netns.has_link("eth0"), "{id}'s interface was kept");
        assert_eq!(self.holder(addr), None, "{id}'s address was kept");
    }
}

/// A pod's CNI_ARGS as containerd passes them, for container `id`.
fn k8s_args(id: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=gcr;K8S_POD_NAME=p{};\
         K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID=uid-{id}",
        &id[id.len() - 8..]
    )
}

/// A container id of the runtime's kind, unique.
fn container_id() -> String {
    format!("{:0>64}", unique_name("c").replace('-', ""))
}

#[test]
fn gc_should_keep_a_sandbox_the_runtime_lists_and_sweep_an_old_one_it_does_not() {
    let mut n = Node::new("gcr-listed", true, "2s");
    n.start_containerd();
    let pod = n.ctd().run(&Pod::new("gcr", "live"));
    let pod_ns = n.ctd().netns(&pod);
    let got = ipv4_in(&pod_ns, "eth0");
    assert_eq!(got.len(), 1, "{got:?}");
    let pod_addr = bare(&got[0]);
    let gone = container_id();
    let ns = Netns::new();
    let gone_addr = n.add(&gone, &ns);
    // Both older than the grace: only the runtime's list tells them apart.
    n.wait_older(&[&pod, &gone], Duration::from_secs(2));
    assert_eq!(n.ctd().sandboxes(), std::slice::from_ref(&pod));

    // A valid list computed before the pod existed.
    n.gc(json!([])).success();
    n.assert_kept(&pod, &pod_ns, &pod_addr);
    n.assert_swept(&gone, &ns, &gone_addr);
    assert_eq!(n.reserved(), [pod_addr]);

    n.ctd().stop_remove(&pod);
    assert_eq!(n.reserved(), Vec::<String>::new());
    assert_eq!(n.engine.records(), Vec::<String>::new());
}

#[test]
fn gc_should_keep_a_container_whose_record_is_younger_than_the_grace() {
    let mut n = Node::new("gcr-young", true, "1h");
    n.start_containerd();
    let (young, old) = (container_id(), container_id());
    let (young_ns, old_ns) = (Netns::new(), Netns::new());
    let young_addr = n.add(&young, &young_ns);
    let old_addr = n.add(&old, &old_ns);
    // The other written two hours ago: this GC does sweep what the grace
    // does not cover.
    n.written_ago(&old, Duration::from_secs(2 * 3600));
    // The runtime lists neither: its list, and the valid list, were
    // computed before the young one's ADD ended.
    assert_eq!(n.ctd().sandboxes(), Vec::<String>::new());

    n.gc(json!([])).success();
    n.assert_kept(&young, &young_ns.path, &young_addr);
    n.assert_swept(&old, &old_ns, &old_addr);
    assert_eq!(n.reserved(), [young_addr]);

    let del = Call::new("DEL", &young, &young_ns, "eth0").args(&k8s_args(&young));
    ok(&n.daemon, &del.run(&n.daemon));
    assert_eq!(n.reserved(), Vec::<String>::new());
    assert_eq!(n.engine.records(), Vec::<String>::new());
}

#[test]
fn gc_should_fail_with_try_again_later_and_sweep_nothing_while_the_runtime_does_not_answer() {
    let mut n = Node::new("gcr-silent", true, "1s");
    let old = container_id();
    let ns = Netns::new();
    let addr = n.add(&old, &ns);
    n.wait_older(&[&old], Duration::from_secs(1));

    // Nothing answers at criSocket.
    let run = n.gc(json!([]));
    let (code, msg, _) = failed(&n.daemon, &run);
    assert_eq!(code, TRY_AGAIN_LATER, "{msg}");
    let socket = n.engine.dir.join("cri.sock");
    assert!(msg.contains(&*socket.to_string_lossy()), "{msg}");
    n.assert_kept(&old, &ns.path, &addr);

    // The runtime answers at the same path, without it: the same GC
    // sweeps.
    n.start_containerd();
    n.gc(json!([])).success();
    n.assert_swept(&old, &ns, &addr);
    assert_eq!(n.reserved(), Vec::<String>::new());
}

#[test]
fn gc_without_a_cri_socket_should_sweep_what_the_valid_list_omits_at_once() {
    let n = Node::new("gcr-off", false, "1h");
    let (young, kept) = (container_id(), container_id());
    let (young_ns, kept_ns) = (Netns::new(), Netns::new());
    let young_addr = n.add(&young, &young_ns);
    let kept_addr = n.add(&kept, &kept_ns);

    // Seconds old, well within the grace: without a runtime to ask, the
    // grace does not apply.
    n.gc(json!([{"containerID": kept, "ifname": "eth0"}]))
        .success();
    n.assert_swept(&young, &young_ns, &young_addr);
    n.assert_kept(&kept, &kept_ns.path, &kept_addr);

    let del = Call::new("DEL", &kept, &kept_ns, "eth0").args(&k8s_args(&kept));
    ok(&n.daemon, &del.run(&n.daemon));
    assert_eq!(n.reserved(), Vec::<String>::new());
}
