//! multus's selection rules for pods, with Debian's plugins: the
//! default-network annotation, systemNamespaces without defaultNetworks,
//! namespaceIsolation with globalNamespaces, a NAD without spec.config
//! naming a confDir network, and what an ADD answers while the API server
//! is away.

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, failed, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::kube::{pod_args, FakeApi, NODE};
use crate::support::netns::{Link, Netns, Subnet};

/// Four bridge networks: `cluster` and `lan` (a defaultNetwork) in
/// confDir, NADs `kube-system/alt` and `ns2/blue`, and `ns1/filed` whose
/// NAD has no spec.config and names the confDir network `filed`.
struct Node {
    engine: Engine,
    api: FakeApi,
    daemon: Daemon,
    subnets: Vec<Subnet>,
    _links: Vec<Link>,
}

fn node(tag: &str, extra: Value, pods: Vec<(&str, &str, Value)>) -> Node {
    node_with(tag, extra, pods, |_, _, _| Vec::new())
}

/// [`node`] with more NADs: `nads(engine, link, subnet)` gives
/// (namespace, name, spec.config) on the fifth bridge and subnet.
fn node_with(
    tag: &str,
    extra: Value,
    pods: Vec<(&str, &str, Value)>,
    nads: impl Fn(&Engine, &Link, &Subnet) -> Vec<(String, String, String)>,
) -> Node {
    let engine = Engine::new(tag);
    let links: Vec<Link> = (0..5).map(|_| Link::planned("b")).collect();
    let subnets: Vec<Subnet> = (0..5).map(|_| Subnet::new()).collect();
    let net = |i: usize, name: &str| {
        conflist(
            name,
            "1.0.0",
            vec![bridge(&links[i].name, engine.host_local(&subnets[i]))],
        )
    };
    engine.write_network("10-cluster.conflist", &net(0, "cluster"));
    engine.write_network("20-lan.conflist", &net(1, "lan"));
    engine.write_network("30-filed.conflist", &net(4, "filed"));
    let api = FakeApi::start();
    api.put_nad(
        "kube-system",
        "alt",
        Some(&net(2, "alt-net").to_string()),
        json!({}),
    );
    api.put_nad(
        "ns2",
        "blue",
        Some(&net(3, "blue-net").to_string()),
        json!({}),
    );
    api.put_nad("ns1", "filed", None, json!({}));
    for (ns, name, config) in nads(&engine, &links[4], &subnets[4]) {
        api.put_nad(&ns, &name, Some(&config), json!({}));
    }
    for (ns, name, annotations) in pods {
        api.put_pod(ns, name, &format!("uid-{name}"), NODE, annotations);
    }
    let mut config = engine.config("cluster", "20s");
    config["defaultNetworks"] = json!(["lan"]);
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let daemon = api.start_daemon(&engine.dir, config, "1s");
    Node {
        engine,
        api,
        daemon,
        subnets,
        _links: links,
    }
}

fn add(n: &Node, ns: &Netns, id: &str, pod_ns: &str, pod: &str) -> crate::support::shim::Run {
    Call::new("ADD", id, ns, "eth0")
        .args(&pod_args(pod_ns, pod, &format!("uid-{pod}")))
        .run(&n.daemon)
}

fn del(n: &Node, ns: &Netns, id: &str, pod_ns: &str, pod: &str) {
    ok(
        &n.daemon,
        &Call::new("DEL", id, ns, "eth0")
            .args(&pod_args(pod_ns, pod, &format!("uid-{pod}")))
            .run(&n.daemon),
    );
}

/// (interface, address) of every IPv4 address in the namespace but lo.
fn attached(ns: &Netns) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = ns
        .ifaces()
        .into_iter()
        .filter(|i| i.name != "lo")
        .flat_map(|i| {
            let name = i.name.clone();
            i.addrs
                .into_iter()
                .filter(|a| a.contains('.'))
                .map(move |a| (name.clone(), a))
        })
        .collect();
    v.sort();
    v
}

fn status_names(n: &Node, pod_ns: &str, pod: &str) -> Vec<String> {
    let text = n
        .api
        .network_status(pod_ns, pod)
        .unwrap_or_else(|| "[]".into());
    let v: Value = serde_json::from_str(&text).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}@{}",
                e["name"].as_str().unwrap(),
                e["interface"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn the_default_network_annotation_should_replace_the_cluster_network() {
    let n = node(
        "k8s-defnet",
        json!({}),
        vec![(
            "ns1",
            "p",
            json!({"v1.multus-cni.io/default-network": "alt",
                   "k8s.v1.cni.cncf.io/networks": "ns2/blue"}),
        )],
    );
    let ns = Netns::new();
    ok(&n.daemon, &add(&n, &ns, "k8sdefnet1", "ns1", "p"));
    let got = attached(&ns);
    let ifaces: Vec<&str> = got.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(ifaces, ["eth0", "net1", "net2"], "{got:?}");
    let by = |i: &str| got.iter().find(|(n, _)| n == i).unwrap().1.clone();
    assert!(
        n.subnets[2].holds(&by("eth0")),
        "eth0 is not alt's: {got:?}"
    );
    assert!(
        n.subnets[1].holds(&by("net1")),
        "net1 is not lan's: {got:?}"
    );
    assert!(
        n.subnets[3].holds(&by("net2")),
        "net2 is not blue's: {got:?}"
    );
    assert_eq!(
        status_names(&n, "ns1", "p"),
        ["kube-system/alt@eth0", "lan@net1", "ns2/blue@net2"]
    );
    del(&n, &ns, "k8sdefnet1", "ns1", "p");
    assert!(attached(&ns).is_empty());
    assert!(n.engine.records().is_empty());
}

#[test]
fn pods_in_system_namespaces_should_get_no_default_networks() {
    let n = node(
        "k8s-sysns",
        json!({"systemNamespaces": ["infra"]}),
        vec![("infra", "dns", json!({})), ("ns1", "app", json!({}))],
    );
    let (a, b) = (Netns::new(), Netns::new());
    ok(&n.daemon, &add(&n, &a, "k8ssys1", "infra", "dns"));
    ok(&n.daemon, &add(&n, &b, "k8ssys2", "ns1", "app"));
    let ifaces = |ns: &Netns| -> Vec<String> { attached(ns).into_iter().map(|(i, _)| i).collect() };
    assert_eq!(ifaces(&a), ["eth0"]);
    assert_eq!(ifaces(&b), ["eth0", "net1"]);
    del(&n, &a, "k8ssys1", "infra", "dns");
    del(&n, &b, "k8ssys2", "ns1", "app");
}

#[test]
fn namespace_isolation_should_allow_only_global_namespaces() {
    let n = node(
        "k8s-iso",
        json!({"namespaceIsolation": true, "globalNamespaces": "default,ns2"}),
        vec![
            (
                "ns1",
                "ok",
                json!({"k8s.v1.cni.cncf.io/networks": "ns2/blue, filed"}),
            ),
            (
                "ns3",
                "no",
                json!({"k8s.v1.cni.cncf.io/networks": "ns1/filed"}),
            ),
        ],
    );
    let ns = Netns::new();
    // ns2 is global; ns1/filed is the pod's own namespace. The NAD
    // without spec.config runs the confDir network of its name.
    ok(&n.daemon, &add(&n, &ns, "k8siso1", "ns1", "ok"));
    let got = attached(&ns);
    let net3 = &got.iter().find(|(i, _)| i == "net3").expect("no net3").1;
    assert!(n.subnets[4].holds(net3), "{got:?}");
    del(&n, &ns, "k8siso1", "ns1", "ok");

    let other = Netns::new();
    let (code, msg, _) = failed(&n.daemon, &add(&n, &other, "k8siso2", "ns3", "no"));
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("namespace isolation"), "{msg}");
    assert!(attached(&other).is_empty());
    assert!(n.engine.records().is_empty());
}

#[test]
fn an_add_while_the_api_server_is_away_should_attach_from_the_cache_or_be_try_again_later() {
    let n = node(
        "k8s-away",
        json!({}),
        vec![(
            "ns1",
            "cached",
            json!({"k8s.v1.cni.cncf.io/networks": "ns2/blue"}),
        )],
    );
    n.api.set_up(false);
    // In the cache: attached, and the pod does not fail for the API
    // server; network-status is written once it is back.
    let ns = Netns::new();
    ok(&n.daemon, &add(&n, &ns, "k8saway1", "ns1", "cached"));
    let ifaces: Vec<String> = attached(&ns).into_iter().map(|(i, _)| i).collect();
    assert_eq!(ifaces, ["eth0", "net1", "net2"]);
    assert!(status_names(&n, "ns1", "cached").is_empty());
    n.api.set_up(true);
    crate::support::daemon::wait_until(
        std::time::Duration::from_secs(30),
        "network-status after the API server came back",
        || status_names(&n, "ns1", "cached").len() == 3,
    );
    n.api.set_up(false);
    del(&n, &ns, "k8saway1", "ns1", "cached");
    assert!(attached(&ns).is_empty());
    // Not in the cache: the one GET cannot be made: try again later,
    // nothing attached.
    let other = Netns::new();
    let (code, msg, _) = failed(&n.daemon, &add(&n, &other, "k8saway2", "ns1", "fresh"));
    assert_eq!(code, 11, "{msg}");
    assert!(attached(&other).is_empty());
    assert!(n.engine.records().is_empty());
}

#[test]
fn a_nad_without_a_name_should_get_its_own_and_cni_args_should_reach_its_plugins() {
    let n = node_with(
        "k8s-noname",
        json!({}),
        vec![(
            "ns2",
            "q",
            json!({"k8s.v1.cni.cncf.io/networks":
                json!([{"name": "plain", "cni-args": {"role": "storage"}}]).to_string()}),
        )],
        |engine, link, subnet| {
            let config = json!({"cniVersion": "1.0.0",
                                "plugins": [bridge(&link.name, engine.host_local(subnet))]});
            vec![("ns2".into(), "plain".into(), config.to_string())]
        },
    );
    let ns = Netns::new();
    ok(&n.daemon, &add(&n, &ns, "k8snoname1", "ns2", "q"));
    let got = attached(&ns);
    let net2 = &got.iter().find(|(i, _)| i == "net2").expect("no net2").1;
    assert!(n.subnets[4].holds(net2), "{got:?}");
    let record: Value =
        serde_json::from_slice(&std::fs::read(n.engine.record("k8snoname1")).unwrap()).unwrap();
    let plain = record["attachments"][0]["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["ifname"] == "net2")
        .expect("no net2 delegate")
        .clone();
    // The NAD's name became the network's name; cni-args are in args.cni.
    assert_eq!(plain["name"], "plain", "{plain}");
    assert_eq!(
        plain["config"]["plugins"][0]["args"]["cni"]["role"], "storage",
        "{plain}"
    );
    assert_eq!(status_names(&n, "ns2", "q")[2], "ns2/plain@net2");
    del(&n, &ns, "k8snoname1", "ns2", "q");
    assert!(attached(&ns).is_empty());
}
