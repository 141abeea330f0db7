//! Plexus under a real container runtime: Debian's containerd (1.6) run by
//! the test (support::containerd), its CRI plugin calling plexus-shim, the
//! tests driving it through the CRI gRPC API as the kubelet does. Every
//! pod gets the cluster network (eth0) and a default network (net1), both
//! bridges of Debian's plugins with host-local; the tests look at the
//! sandbox's network namespace, the host's bridges and host-local's store,
//! Plexus's records and containerd's own view of the pod.

use std::path::Path;

use serde_json::json;

use crate::support::cni::{bare, bridge, conflist, Engine};
use crate::support::containerd::{ipv4_in, Containerd, Pod};
use crate::support::daemon::Daemon;
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
    fn new(tag: &str) -> Node {
        let engine = Engine::new(tag);
        let bridges = [Link::bridge(), Link::bridge()];
        let subnets = [Subnet::new(), Subnet::new()];
        networks(&engine, &bridges, &subnets);
        let mut daemon = Daemon::start(&engine.dir, "d", daemon_config(&engine));
        daemon.ready();
        let ctd = Containerd::start(&engine.dir, "ctd");
        ctd.use_plexus(daemon.sock.parent().unwrap());
        Node {
            ctd,
            daemon: Some(daemon),
            engine,
            subnets,
            bridges,
        }
    }

    /// Asserts everything a running pod `id` should have: eth0 and net1 in
    /// its netns with addresses of the two subnets, the runtime's IP being
    /// eth0's, a Plexus record, a reservation in each host-local store.
    fn assert_attached(&self, id: &str) -> String {
        let netns = self.ctd.netns(id);
        let eth0 = ipv4_in(&netns, "eth0");
        let net1 = ipv4_in(&netns, "net1");
        assert!(
            eth0.len() == 1 && self.subnets[0].holds(&eth0[0]),
            "{id} eth0 {eth0:?} not in {}",
            self.subnets[0].cidr()
        );
        assert!(
            net1.len() == 1 && self.subnets[1].holds(&net1[0]),
            "{id} net1 {net1:?} not in {}",
            self.subnets[1].cidr()
        );
        assert_eq!(self.ctd.status(id).ips(), vec![bare(&eth0[0])], "{id}");
        assert!(self.engine.record(id).exists(), "no record for {id}");
        for net in ["cluster", "lan"] {
            assert!(
                self.engine.reservations(net).contains(&bare(&eth0[0]))
                    || self
                        .engine
                        .reservations(net)
                        .iter()
                        .any(|r| net1.contains(&format!("{r}/24"))),
                "{net}: no reservation of {id}"
            );
        }
        netns
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
        let netns = n.assert_attached(&id);
        assert_eq!(bridge_ports(&n.bridges[0].name).len(), 1);
        assert_eq!(bridge_ports(&n.bridges[1].name).len(), 1);
        n.ctd.stop_remove(&id);
        assert!(!Path::new(&netns).exists(), "{netns} left");
        assert!(!n.engine.record(&id).exists(), "record of {id} left");
    }
    n.assert_clean();
    drop(n.daemon);
}
