//! multus's `default-route` on a Kubernetes node, with Debian's plugins
//! in real network namespaces: the selection element's gateway takes the
//! pod's default route from the cluster network, two IPv4 gateways fail the
//! ADD before anything is attached, a route the kernel refuses rolls the
//! ADD back, and without the key the routes the plugins installed stay.
//!
//! The cluster network's IPAM installs the default route (a host-local
//! `routes` entry) rather than the bridge's `isGateway`, which would also
//! turn on the host's IP forwarding; the pod's routes are the same.

use serde_json::{json, Value};

use crate::support::cni::{conflist, failed, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::kube::{pod_args, FakeApi, NETWORK_STATUS as STATUS, NODE};
use crate::support::netns::{ip_ok, Link, Netns, Subnet};
use crate::support::shim::Run;

/// A node: the cluster network in confDir (its IPAM gives a default route
/// via `<subnet 0>.1`), two NADs `ns1/blue` and `ns1/green` each on a
/// bridge of its own (their IPAM gives a gateway `.1`, no route), and a
/// daemon watching `api`.
struct Node {
    engine: Engine,
    api: FakeApi,
    daemon: Daemon,
    subnets: [Subnet; 3],
    _links: [Link; 3],
}

fn bridge_on(engine: &Engine, link: &Link, subnet: &Subnet, default_route: bool) -> Value {
    let mut ipam = engine.host_local(subnet);
    ipam["ranges"] = json!([[{"subnet": subnet.cidr(), "gateway": gateway(subnet)}]]);
    if default_route {
        ipam["routes"] = json!([{"dst": "0.0.0.0/0"}]);
    }
    json!({"type": "bridge", "bridge": link.name, "ipam": ipam})
}

fn gateway(subnet: &Subnet) -> String {
    format!("{}.1", subnet.prefix)
}

/// `annotations` of the pod, made from the node's subnets.
fn node(
    tag: &str,
    ns: &str,
    pod: &str,
    uid: &str,
    annotations: impl Fn(&[Subnet; 3]) -> Value,
) -> Node {
    let engine = Engine::new(tag);
    let links = [Link::planned("b"), Link::planned("b"), Link::planned("b")];
    let subnets = [Subnet::new(), Subnet::new(), Subnet::new()];
    engine.write_network(
        "10-cluster.conflist",
        &conflist(
            "cluster",
            "1.0.0",
            vec![bridge_on(&engine, &links[0], &subnets[0], true)],
        ),
    );
    let api = FakeApi::start();
    for (i, name) in [(1, "blue"), (2, "green")] {
        let config = conflist(
            &format!("{name}-net"),
            "1.0.0",
            vec![bridge_on(&engine, &links[i], &subnets[i], false)],
        );
        api.put_nad("ns1", name, Some(&config.to_string()), json!({}));
    }
    api.put_pod(ns, pod, uid, NODE, annotations(&subnets));
    let daemon = api.start_daemon(&engine.dir, engine.config("cluster", "20s"), "2s");
    Node {
        engine,
        api,
        daemon,
        subnets,
        _links: links,
    }
}

/// The default routes in `netns` (both families, main table) as
/// `(dev, gateway)`.
fn default_routes(netns: &Netns) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for family in ["-4", "-6"] {
        let text = ip_ok(&["-n", &netns.name, family, "-j", "route", "show"]);
        let routes: Value = serde_json::from_str(&text).unwrap_or(json!([]));
        for r in routes.as_array().into_iter().flatten() {
            if r["dst"] == "default" {
                out.push((
                    r["dev"].as_str().unwrap_or_default().to_string(),
                    r["gateway"].as_str().unwrap_or_default().to_string(),
                ));
            }
        }
    }
    out
}

/// Asserts the only default route in `netns` is via `gw` on `dev`.
fn assert_default_route(netns: &Netns, dev: &str, gw: &str) {
    assert_eq!(
        default_routes(netns),
        [(dev.to_string(), gw.to_string())],
        "the pod's default routes"
    );
}

/// The pod's annotations naming `networks`.
fn networks(networks: &str) -> Value {
    json!({"k8s.v1.cni.cncf.io/networks": networks})
}

/// ADD of the pod's sandbox (CNI_ARGS `args`) through plexus-shim.
fn add(n: &Node, container_id: &str, netns: &Netns, args: &str) -> Run {
    Call::new("ADD", container_id, netns, "eth0")
        .args(args)
        .run(&n.daemon)
}

/// DEL of the pod's sandbox; afterwards nothing of it is left.
fn del_and_check(n: &Node, container_id: &str, netns: &Netns, args: &str, ifnames: &[&str]) {
    ok(
        &n.daemon,
        &Call::new("DEL", container_id, netns, "eth0")
            .args(args)
            .run(&n.daemon),
    );
    for ifname in ifnames {
        assert!(netns.iface(ifname).is_none(), "{ifname} is left");
    }
    assert!(n.engine.records().is_empty());
}

#[test]
fn a_default_route_element_should_take_the_pods_default_route_from_the_cluster_network() {
    let (ns, pod, uid) = ("ns1", "gw", "uid-gw");
    let n = node("k8s-dr", ns, pod, uid, |subnets| {
        let annotation =
            json!([{"name": "blue", "default-route": [gateway(&subnets[1])]}]).to_string();
        json!({"k8s.v1.cni.cncf.io/networks": annotation})
    });
    let gw = gateway(&n.subnets[1]);
    let netns = Netns::new();
    let args = pod_args(ns, pod, uid);
    let result = ok(&n.daemon, &add(&n, "k8sdr1", &netns, &args));
    assert!(netns.iface("eth0").is_some() && netns.iface("net1").is_some());
    // Only net1 holds a default route, via the requested gateway; the
    // cluster network's (its IPAM installed one) is gone.
    assert_default_route(&netns, "net1", &gw);
    // The result returned to the runtime is the cluster network's, as its
    // plugins answered it: its default route is still listed.
    let routes = result["routes"].as_array().cloned().unwrap_or_default();
    assert!(routes.iter().any(|r| r["dst"] == "0.0.0.0/0"), "{result}");
    // network-status was written as usual.
    let pod_now = n.api.pod(ns, pod).unwrap();
    assert!(
        pod_now["metadata"]["annotations"][STATUS].is_string(),
        "{pod_now}"
    );
    del_and_check(&n, "k8sdr1", &netns, &args, &["eth0", "net1"]);
}

#[test]
fn two_ipv4_gateways_should_fail_the_add_before_anything_is_attached() {
    let annotation = json!([
        {"name": "blue", "default-route": ["10.250.1.1"]},
        {"name": "green", "default-route": ["10.250.2.1"]},
    ])
    .to_string();
    let (ns, pod, uid) = ("ns1", "ecmp", "uid-ecmp");
    let n = node("k8s-ecmp", ns, pod, uid, |_| networks(&annotation));
    let netns = Netns::new();
    let mark = n.api.mark();
    let run = add(&n, "k8secmp1", &netns, &pod_args(ns, pod, uid));
    let (code, msg, _) = failed(&n.daemon, &run);
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.contains("multus does not support ECMP for default-route"),
        "{msg}"
    );
    assert!(
        netns.ifaces().iter().all(|i| i.name == "lo"),
        "{:?}",
        netns.ifaces()
    );
    assert!(n.engine.records().is_empty());
    for net in ["cluster", "blue-net", "green-net"] {
        assert!(n.engine.reservations(net).is_empty(), "{net} ran");
    }
    // Nothing written to the pod either.
    let calls = n.api.calls_since(mark);
    assert!(calls.iter().all(|c| c.method != "PATCH"), "{calls:#?}");
}

#[test]
fn without_the_key_the_plugins_routes_should_stay() {
    let (ns, pod, uid) = ("ns1", "plain", "uid-plain");
    let n = node("k8s-nodr", ns, pod, uid, |_| networks("blue"));
    let netns = Netns::new();
    let args = pod_args(ns, pod, uid);
    ok(&n.daemon, &add(&n, "k8snodr1", &netns, &args));
    assert!(netns.iface("net1").is_some());
    assert_default_route(&netns, "eth0", &gateway(&n.subnets[0]));
    del_and_check(&n, "k8snodr1", &netns, &args, &["eth0", "net1"]);
}

#[test]
/// `[]` is about its own network only (multus strips every network's
/// default routes): the cluster network keeps its default route.
fn an_empty_list_should_leave_other_networks_default_routes() {
    let annotation = json!([{"name": "blue", "default-route": []}]).to_string();
    let (ns, pod, uid) = ("ns1", "none", "uid-none");
    let n = node("k8s-drnone", ns, pod, uid, |_| networks(&annotation));
    let netns = Netns::new();
    let args = pod_args(ns, pod, uid);
    ok(&n.daemon, &add(&n, "k8sdrnone1", &netns, &args));
    assert!(netns.iface("net1").is_some() && netns.iface("eth0").is_some());
    assert_default_route(&netns, "eth0", &gateway(&n.subnets[0]));
    del_and_check(&n, "k8sdrnone1", &netns, &args, &["eth0", "net1"]);
}

/// A route the kernel refuses fails the ADD after its networks were
/// attached: the ADD is rolled back as any failed ADD (docs/records.md):
/// every network's DEL runs, so the interfaces and the addresses go, and
/// the record with them; the runtime's DEL that follows finds nothing.
#[test]
fn an_unreachable_gateway_should_fail_the_add_and_roll_it_back() {
    // 192.0.2.1 (TEST-NET-1) is on no subnet of the pod: the kernel
    // refuses the route.
    let annotation = json!([{"name": "blue", "default-route": ["192.0.2.1"]}]).to_string();
    let (ns, pod, uid) = ("ns1", "bad", "uid-bad");
    let n = node("k8s-drbad", ns, pod, uid, |_| networks(&annotation));
    let netns = Netns::new();
    let args = pod_args(ns, pod, uid);
    let mark = n.api.mark();
    let run = add(&n, "k8sdrbad1", &netns, &args);
    let (_, msg, _) = failed(&n.daemon, &run);
    assert!(
        msg.contains("net1") && msg.contains("192.0.2.1"),
        "the error should name the interface and the gateway: {msg}"
    );
    assert!(
        netns.ifaces().iter().all(|i| i.name == "lo"),
        "{:?}",
        netns.ifaces()
    );
    assert!(n.engine.records().is_empty(), "{:?}", n.engine.records());
    for net in ["cluster", "blue-net"] {
        assert!(
            n.engine.reservations(net).is_empty(),
            "{net} keeps an address"
        );
    }
    // Nothing was written to the pod.
    let calls = n.api.calls_since(mark);
    assert!(calls.iter().all(|c| c.method != "PATCH"), "{calls:#?}");
    del_and_check(&n, "k8sdrbad1", &netns, &args, &["eth0", "net1"]);
}

/// The default-network annotation's element may carry the key too: its
/// network replaces the cluster network and owns the default route.
#[test]
fn the_default_network_elements_default_route_should_be_honoured() {
    let (ns, pod, uid) = ("ns1", "dn", "uid-dn");
    let n = node("k8s-drdn", ns, pod, uid, |subnets| {
        let default_network = json!([{"name": "blue", "namespace": "ns1",
                                      "default-route": [gateway(&subnets[1])]}])
        .to_string();
        json!({"v1.multus-cni.io/default-network": default_network,
               "k8s.v1.cni.cncf.io/networks": "green"})
    });
    let netns = Netns::new();
    let args = pod_args(ns, pod, uid);
    ok(&n.daemon, &add(&n, "k8sdrdn1", &netns, &args));
    // eth0 is blue's (no IPAM default route of its own), net1 green's.
    assert_default_route(&netns, "eth0", &gateway(&n.subnets[1]));
    del_and_check(&n, "k8sdrdn1", &netns, &args, &["eth0", "net1"]);
}
