//! Pods on a Kubernetes node, with Debian's plugins: networks from the
//! pod's annotation (both forms) and NetworkAttachmentDefinitions, the
//! network-status annotation written with one API call per ADD, none per
//! DEL, DEL with the API server stopped, a pod that is gone, and a pod
//! recreated under the same name.

use serde_json::{json, Value};

use crate::support::cni::{bare, bridge, conflist, failed, ok, Call, Engine};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::kube::{pod_args, FakeApi, NETWORK_STATUS as STATUS, NODE};
use crate::support::netns::{Link, Netns, Subnet};
use crate::support::shim::Run;

const T: std::time::Duration = std::time::Duration::from_secs(20);

/// A node: the cluster network in confDir, two NADs (`ns1/blue`,
/// `shared/red`) each on a bridge of its own, and a daemon watching `api`.
struct Node {
    engine: Engine,
    api: FakeApi,
    daemon: Daemon,
    subnets: [Subnet; 3],
    _links: [Link; 3],
}

/// A pod stored before the daemon starts, so its first list holds it.
type Pod<'a> = (&'a str, &'a str, &'a str, Value);

fn node(tag: &str, pods: Vec<Pod<'_>>, extra_nads: Vec<(&str, &str, String)>) -> Node {
    node_with(tag, pods, extra_nads, json!({}))
}

/// [`node`] with `extra` keys in the daemon's configuration.
fn node_with(
    tag: &str,
    pods: Vec<Pod<'_>>,
    extra_nads: Vec<(&str, &str, String)>,
    extra: Value,
) -> Node {
    let engine = Engine::new(tag);
    let links = [Link::planned("b"), Link::planned("b"), Link::planned("b")];
    let subnets = [Subnet::new(), Subnet::new(), Subnet::new()];
    engine.write_network(
        "10-cluster.conflist",
        &conflist(
            "cluster",
            "1.0.0",
            vec![bridge(&links[0].name, engine.host_local(&subnets[0]))],
        ),
    );
    let api = FakeApi::start();
    let nad = |i: usize, name: &str| {
        conflist(
            name,
            "1.0.0",
            vec![bridge(&links[i].name, engine.host_local(&subnets[i]))],
        )
        .to_string()
    };
    api.put_nad("ns1", "blue", Some(&nad(1, "blue-net")), json!({}));
    api.put_nad("shared", "red", Some(&nad(2, "red-net")), json!({}));
    for (ns, name, config) in extra_nads {
        api.put_nad(ns, name, Some(&config), json!({}));
    }
    for (ns, name, uid, annotations) in pods {
        api.put_pod(ns, name, uid, NODE, annotations);
    }
    let mut cfg = engine.config("cluster", "20s");
    for (k, v) in extra.as_object().into_iter().flatten() {
        cfg[k] = v.clone();
    }
    let daemon = api.start_daemon(&engine.dir, cfg, "2s");
    Node {
        engine,
        api,
        daemon,
        subnets,
        _links: links,
    }
}

/// The IPv4 address of `ifname` in `netns`, as `address/prefix`.
fn addr_in(netns: &Netns, ifname: &str) -> String {
    let iface = netns.iface(ifname).unwrap_or_else(|| panic!("no {ifname}"));
    iface
        .addrs
        .iter()
        .find(|a| a.contains('.'))
        .cloned()
        .unwrap_or_else(|| panic!("{ifname} has no IPv4 address: {iface:?}"))
}

#[test]
fn a_pod_should_get_its_annotated_networks_and_its_network_status() {
    let n = node(
        "k8s-pod",
        vec![(
            "ns1",
            "web",
            "uid-web",
            json!({"k8s.v1.cni.cncf.io/networks": "blue, shared/red@red0"}),
        )],
        vec![],
    );
    let ns = Netns::new();
    let mark = n.api.mark();
    let add = Call::new("ADD", "k8sweb1", &ns, "eth0")
        .args(&pod_args("ns1", "web", "uid-web"))
        .run(&n.daemon);
    let result = ok(&n.daemon, &add);
    // The runtime gets the cluster network's result.
    assert_eq!(result["interfaces"][2]["name"], "eth0", "{result}");
    let eth0 = addr_in(&ns, "eth0");
    let net1 = addr_in(&ns, "net1");
    let red0 = addr_in(&ns, "red0");
    assert!(n.subnets[0].holds(&eth0), "{eth0}");
    assert!(n.subnets[1].holds(&net1), "{net1}");
    assert!(n.subnets[2].holds(&red0), "{red0}");

    // One API call: the status patch.
    let calls = n.api.calls_since(mark);
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].method, "PATCH");
    let pod = n.api.pod("ns1", "web").unwrap();
    let text = pod["metadata"]["annotations"][STATUS]
        .as_str()
        .unwrap()
        .to_string();
    let status: Value = serde_json::from_str(&text).unwrap();
    let shown: Vec<(String, String, String, bool)> = status
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["interface"].as_str().unwrap().to_string(),
                e["ips"][0].as_str().unwrap().to_string(),
                e["default"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("cluster".into(), "eth0".into(), bare(&eth0), true),
            ("ns1/blue".into(), "net1".into(), bare(&net1), false),
            ("shared/red".into(), "red0".into(), bare(&red0), false),
        ]
    );
    // multus's layout: 4-space indented entries joined by commas.
    assert!(
        text.starts_with("[{\n    \"name\": \"cluster\",\n"),
        "{text}"
    );
    assert!(text.contains("},{\n"), "{text}");

    // DEL needs no API server at all.
    n.api.set_up(false);
    let mark = n.api.mark();
    ok(
        &n.daemon,
        &Call::new("DEL", "k8sweb1", &ns, "eth0")
            .args(&pod_args("ns1", "web", "uid-web"))
            .run(&n.daemon),
    );
    assert_eq!(n.api.mark(), mark, "DEL called the API");
    for ifname in ["eth0", "net1", "red0"] {
        assert!(ns.iface(ifname).is_none(), "{ifname} is left");
    }
    for net in ["cluster", "blue-net", "red-net"] {
        assert!(
            n.engine.reservations(net).is_empty(),
            "{net} keeps an address"
        );
    }
    assert!(n.engine.records().is_empty());
}

#[test]
fn the_json_form_should_pass_interface_and_ips_to_the_network() {
    // A static address through the `ips` capability: the static IPAM
    // plugin reads runtimeConfig.ips when the network declares it.
    let link = Link::planned("b");
    let subnet = Subnet::new();
    let static_ip = format!("{}.9/24", subnet.prefix);
    let mut b = bridge(&link.name, json!({"type": "static"}));
    b["capabilities"] = json!({"ips": true});
    let fixed = conflist("fixed-net", "1.0.0", vec![b]).to_string();
    let annotation =
        json!([{"name": "fixed", "interface": "data0", "ips": [static_ip]}]).to_string();
    let n = node(
        "k8s-json",
        vec![(
            "ns1",
            "db",
            "uid-db",
            json!({"k8s.v1.cni.cncf.io/networks": annotation}),
        )],
        vec![("ns1", "fixed", fixed)],
    );
    let ns = Netns::new();
    ok(
        &n.daemon,
        &Call::new("ADD", "k8sdb1", &ns, "eth0")
            .args(&pod_args("ns1", "db", "uid-db"))
            .run(&n.daemon),
    );
    assert_eq!(addr_in(&ns, "data0"), static_ip);
    // multus's CNI_ARGS for a pod's networks, with the element's legacy IP=.
    let record: Value =
        serde_json::from_slice(&std::fs::read(n.engine.record("k8sdb1")).unwrap()).unwrap();
    let args: Vec<&str> = record["attachments"][0]["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["cniArgs"].as_str().unwrap_or(""))
        .collect();
    let base = "IgnoreUnknown=true;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=db;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=uid-db";
    assert_eq!(args, [base.to_string(), format!("{base};IP={static_ip}")]);
    ok(
        &n.daemon,
        &Call::new("DEL", "k8sdb1", &ns, "eth0")
            .args(&pod_args("ns1", "db", "uid-db"))
            .run(&n.daemon),
    );
    assert!(ns.iface("data0").is_none());
}

#[test]
fn a_pod_that_is_gone_or_was_recreated_should_get_nothing() {
    let n = node("k8s-gone", vec![], vec![]);
    let ns = Netns::new();
    // Gone: multus's placeholder answer, nothing attached or recorded.
    let out = ok(
        &n.daemon,
        &Call::new("ADD", "k8sgone1", &ns, "eth0")
            .args(&pod_args("ns1", "nobody", "uid-x"))
            .run(&n.daemon),
    );
    assert_eq!(out["ips"][0]["address"], "0.0.0.0/0", "{out}");
    assert!(ns.iface("eth0").is_none());
    assert!(n.engine.records().is_empty());

    // Recreated: the runtime's uid is the old pod's.
    n.api.put_pod(
        "ns1",
        "web",
        "uid-new",
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": "blue"}),
    );
    let run = Call::new("ADD", "k8sold1", &ns, "eth0")
        .args(&pod_args("ns1", "web", "uid-old"))
        .run(&n.daemon);
    let (_, msg, _) = failed(&n.daemon, &run);
    assert!(msg.contains("uid-old") && msg.contains("uid-new"), "{msg}");
    assert!(ns.iface("eth0").is_none() && ns.iface("net1").is_none());
    assert!(n.engine.records().is_empty());
    let pod = n.api.pod("ns1", "web").unwrap();
    assert!(pod["metadata"]["annotations"].get(STATUS).is_none());
}

#[test]
fn a_missing_nad_should_fail_the_add_and_leave_nothing() {
    let n = node(
        "k8s-nonad",
        vec![(
            "ns1",
            "p",
            "uid-p",
            json!({"k8s.v1.cni.cncf.io/networks": "blue, nothere"}),
        )],
        vec![],
    );
    let ns = Netns::new();
    let run = Call::new("ADD", "k8snonad1", &ns, "eth0")
        .args(&pod_args("ns1", "p", "uid-p"))
        .run(&n.daemon);
    let (code, msg, _) = failed(&n.daemon, &run);
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("nothere") && msg.contains("ns1"), "{msg}");
    assert!(ns.iface("eth0").is_none() && ns.iface("net1").is_none());
    assert!(n.engine.records().is_empty());
}

/// A node whose only pod is `ns1/<name>` (uid `uid-<name>`), annotated
/// with `networks`; `extra` keys in the daemon's configuration.
fn one_pod(tag: &str, name: &str, networks: &str, extra: Value) -> Node {
    let uid = format!("uid-{name}");
    let annotations = if networks.is_empty() {
        json!({})
    } else {
        json!({"k8s.v1.cni.cncf.io/networks": networks})
    };
    node_with(tag, vec![("ns1", name, &uid, annotations)], vec![], extra)
}

/// `command` for pod `ns1/<name>`'s container `cid` in `ns`.
fn pod_call(n: &Node, command: &str, cid: &str, name: &str, ns: &Netns) -> Run {
    Call::new(command, cid, ns, "eth0")
        .args(&pod_args("ns1", name, &format!("uid-{name}")))
        .run(&n.daemon)
}

/// The one event posted for the pod, once it is there.
fn the_event(n: &Node) -> Value {
    wait_until(T, "the pod's event", || !n.api.pod_events().is_empty());
    let events = n.api.pod_events();
    assert_eq!(events.len(), 1, "{events:#?}");
    events[0].clone()
}

/// One `AddedInterface` event per ADD (one API write, posted after the
/// ADD in the background), listing every interface, network and address,
/// as `kubectl describe pod` shows it; none for the DEL.
#[test]
fn an_add_should_post_one_event_listing_every_interface() {
    let n = one_pod("k8s-event", "web", "blue, shared/red@red0", json!({}));
    let ns = Netns::new();
    ok(&n.daemon, &pod_call(&n, "ADD", "k8sevent1", "web", &ns));
    let e = &the_event(&n);
    let (eth0, net1, red0) = (
        bare(&addr_in(&ns, "eth0")),
        bare(&addr_in(&ns, "net1")),
        bare(&addr_in(&ns, "red0")),
    );
    assert_eq!(e["kind"], "Event");
    assert_eq!(e["apiVersion"], "v1");
    assert_eq!(e["metadata"]["namespace"], "ns1");
    assert!(
        e["metadata"]["name"].as_str().unwrap().starts_with("web."),
        "{e}"
    );
    assert_eq!(
        e["involvedObject"],
        json!({"apiVersion": "v1", "kind": "Pod", "namespace": "ns1", "name": "web", "uid": "uid-web"})
    );
    assert_eq!(e["reason"], "AddedInterface");
    assert_eq!(e["type"], "Normal");
    assert_eq!(e["source"], json!({"component": "plexus", "host": NODE}));
    assert_eq!(e["count"], 1);
    assert_eq!(
        e["message"],
        format!(
            "Add eth0 [{eth0}] from cluster; Add net1 [{net1}] from ns1/blue; \
             Add red0 [{red0}] from shared/red"
        )
    );
    ok(&n.daemon, &pod_call(&n, "DEL", "k8sevent1", "web", &ns));
    assert_eq!(n.api.pod_events().len(), 1);
}

/// A pod naming a NAD that does not exist gets a `NoNetworkFound` warning
/// naming it, beside its failed ADD.
#[test]
fn a_missing_nad_should_post_a_no_network_found_warning() {
    let n = one_pod("k8s-event-nonet", "lost", "ghost", json!({}));
    let ns = Netns::new();
    failed(&n.daemon, &pod_call(&n, "ADD", "k8sevent2", "lost", &ns));
    let e = &the_event(&n);
    assert_eq!(e["reason"], "NoNetworkFound");
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["involvedObject"]["uid"], "uid-lost");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("ghost") && msg.contains("no such NetworkAttachmentDefinition"),
        "{msg}"
    );
}

/// With `podEvents` false nothing is posted; with the events endpoint
/// failing, ADDs succeed all the same.
#[test]
fn events_should_be_optional_and_never_fail_an_add() {
    let n = one_pod("k8s-event-off", "quiet", "", json!({"podEvents": false}));
    let ns = Netns::new();
    ok(&n.daemon, &pod_call(&n, "ADD", "k8sevent3", "quiet", &ns));
    ok(&n.daemon, &pod_call(&n, "DEL", "k8sevent3", "quiet", &ns));
    assert!(n.api.pod_events().is_empty(), "{:#?}", n.api.pod_events());
    assert!(!n.api.log().iter().any(|r| r.is_event_post()));

    let m = one_pod("k8s-event-fail", "loud", "", json!({}));
    m.api.fail_next("/events", 500, 10);
    let ns = Netns::new();
    ok(&m.daemon, &pod_call(&m, "ADD", "k8sevent4", "loud", &ns));
    wait_until(T, "the event's attempt", || {
        m.api.log().iter().any(|r| r.is_event_post())
    });
    assert!(m.api.pod_events().is_empty());
    assert!(ns.iface("eth0").is_some());
}

/// CHECK of a pod checks every network its ADD attached (the cluster
/// network and each NAD's), from the record, with no API call; a broken
/// interface of one NAD's network fails it, naming that network. STATUS
/// asks the networks every pod gets: here the cluster network alone
/// (`status_networks` has the default networks).
#[test]
fn check_and_status_of_a_pod_should_cover_its_networks() {
    let n = one_pod("k8s-check", "chk", "blue, shared/red@red0", json!({}));
    let ns = Netns::new();
    let call = |command: &str| pod_call(&n, command, "k8scheck1", "chk", &ns);
    ok(&n.daemon, &call("ADD"));
    let mark = n.api.mark();
    ok(&n.daemon, &call("CHECK"));
    assert_eq!(
        n.api.calls_since(mark).len(),
        0,
        "{:#?}",
        n.api.calls_since(mark)
    );

    ns.del_link("red0");
    let (_, msg, _) = failed(&n.daemon, &call("CHECK"));
    assert!(
        msg.contains("red-net") && msg.contains("\"bridge\""),
        "{msg}"
    );
    assert_eq!(n.api.calls_since(mark).len(), 0);

    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus-shim",
        "daemonSocketDir": n.daemon.sock.parent().unwrap(),
    }))
    .unwrap();
    let status = crate::support::shim::run(
        [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/usr/lib/cni")],
        &stdin,
    );
    assert_eq!(status.code, Some(0), "{status:?}\n{}", n.daemon.log_text());
    ok(&n.daemon, &call("DEL"));
    assert!(
        !ns.has_link("eth0") && !ns.has_link("net1"),
        "{:?}",
        ns.ifaces()
    );

    // A cluster network (of CNI 1.1.0, the first with STATUS) whose plugin
    // is not installed: STATUS says so.
    n.engine.write_network(
        "10-cluster.conflist",
        &conflist("cluster", "1.1.0", vec![json!({"type": "no-such-plugin"})]),
    );
    let status = crate::support::shim::run(
        [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/usr/lib/cni")],
        &stdin,
    );
    assert_ne!(status.code, Some(0), "{status:?}");
    assert!(status.stdout.contains("no-such-plugin"), "{status:?}");
}
