//! multus's auxiliary CNI chain (`auxiliaryCNIChainName`): after every
//! other network of an ADD, a list of `passthru` and the plugins in
//! `<directory of clusterNetwork>/<name>/*.conf` runs as interface
//! `net<i>`, with Debian's tuning plugin changing the pod's namespace; it
//! shows no network-status entry, and DEL runs it from the record. Debian
//! ships no `passthru`, so a pass-through stand-in takes its place.

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::kube::{pod_args, FakeApi, NODE};
use crate::support::netns::{Link, Netns, Subnet};

/// The cluster network as a path, and an `aux` directory beside it with
/// Debian's tuning setting a sysctl of the pod's namespace.
fn node(tag: &str) -> (Engine, Value, Link, Subnet) {
    let engine = Engine::new(tag);
    let link = Link::planned("b");
    let subnet = Subnet::new();
    let cluster = engine.write_network(
        "10-cluster.conflist",
        &conflist(
            "cluster",
            "1.0.0",
            vec![bridge(&link.name, engine.host_local(&subnet))],
        ),
    );
    std::fs::create_dir(engine.conf_dir.join("aux")).unwrap();
    std::fs::write(
        engine.conf_dir.join("aux").join("10-tuning.conf"),
        json!({"type": "tuning", "sysctl": {"net.ipv4.conf.all.arp_ignore": "1"}}).to_string(),
    )
    .unwrap();
    engine.fake(
        "passthru",
        &format!(
            "case \"$CNI_COMMAND\" in ADD) {} ;; esac\nexit 0",
            Engine::pass_through()
        ),
    );
    let mut config = engine.config(cluster.to_str().unwrap(), "20s");
    config["auxiliaryCNIChainName"] = json!("aux");
    (engine, config, link, subnet)
}

fn arp_ignore(ns: &Netns) -> String {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            "cat",
            "/proc/sys/net/ipv4/conf/all/arp_ignore",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn delegates(engine: &Engine, id: &str) -> Vec<(String, String)> {
    let record: Value = serde_json::from_slice(&std::fs::read(engine.record(id)).unwrap()).unwrap();
    record["attachments"][0]["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["ifname"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_auxiliary_chain_should_run_last_and_be_removed_by_del() {
    let (engine, config, _link, subnet) = node("aux-static");
    let mut daemon = Daemon::start(&engine.dir, "d", config);
    daemon.ready();
    let ns = Netns::new();
    assert_eq!(arp_ignore(&ns), "0");
    let id = "auxstatic1";
    let result = ok(&daemon, &Call::new("ADD", id, &ns, "eth0").run(&daemon));
    // The runtime gets the cluster network's result.
    assert_eq!(
        result["interfaces"].as_array().unwrap().len(),
        3,
        "{result}"
    );
    assert!(ns
        .iface("eth0")
        .unwrap()
        .addrs
        .iter()
        .any(|a| subnet.holds(a)));
    // tuning ran in the pod's namespace, as the last network, net1.
    assert_eq!(arp_ignore(&ns), "1");
    assert_eq!(
        delegates(&engine, id),
        [
            ("cluster".into(), "eth0".into()),
            ("aux".into(), "net1".into())
        ]
    );
    ok(&daemon, &Call::new("DEL", id, &ns, "eth0").run(&daemon));
    assert!(!engine.record(id).exists());
    assert!(ns.iface("eth0").is_none());
}

#[test]
fn a_pods_auxiliary_chain_should_show_no_network_status_entry() {
    let (engine, config, _link, _subnet) = node("aux-pod");
    let api = FakeApi::start();
    api.put_pod("ns1", "p", "uid-p", NODE, json!({}));
    let daemon = api.start_daemon(&engine.dir, config, "2s");
    let ns = Netns::new();
    let id = "auxpod1";
    let call = |cmd: &str| Call::new(cmd, id, &ns, "eth0").args(&pod_args("ns1", "p", "uid-p"));
    ok(&daemon, &call("ADD").run(&daemon));
    assert_eq!(arp_ignore(&ns), "1");
    assert_eq!(
        delegates(&engine, id),
        [
            ("cluster".into(), "eth0".into()),
            ("aux".into(), "net1".into())
        ]
    );
    assert_eq!(api.network_status_names("ns1", "p"), ["cluster"]);
    ok(&daemon, &call("DEL").run(&daemon));
    assert!(!engine.record(id).exists());
}
