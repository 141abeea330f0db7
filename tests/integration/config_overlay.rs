//! multus's per-call overlay through plexus-shim and plexusd with Debian's
//! bridge, host-local and loopback: a node keeping its `00-multus.conf`
//! names the networks in the configuration the runtime passes to the
//! shim; keys daemon-config.json sets win, the others come from the call.

use serde_json::{json, Value};

use crate::support::cni::{bridge, call_env, conflist, failed, ok, Engine};
use crate::support::daemon::Daemon;
use crate::support::kube::{pod_args, FakeApi, NODE};
use crate::support::netns::{host_link_exists, Link, Netns, Subnet};
use crate::support::shim::{self, Run};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/multus-wire/");

/// The engine's daemon config without `clusterNetwork` (and without
/// `confDir` when `conf_dir` is false).
fn daemon_config(engine: &Engine, conf_dir: bool) -> Value {
    let mut c = engine.config("", "20s");
    let obj = c.as_object_mut().unwrap();
    obj.remove("clusterNetwork");
    if !conf_dir {
        obj.remove("confDir");
    }
    c
}

/// A `00-multus.conf` as multus's generator writes it, aimed at this
/// test's daemon, plus `extra` keys. Its `binDir` names a directory
/// without plugins: the daemon's own is used (binDir is daemon-only).
fn multus_conf(daemon: &Daemon, extra: Value) -> Value {
    let mut c = json!({
        "cniVersion": "0.3.1",
        "name": "multus-cni-network",
        "type": "multus-shim",
        "binDir": "/nonexistent/cni/bin",
        "logLevel": "verbose",
        "logToStderr": true,
        "capabilities": {"portMappings": true},
        "daemonSocketDir": daemon.sock.parent().unwrap(),
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// One call through plexus-shim with `config` as its stdin.
fn call(command: &str, id: &str, ns: &Netns, config: &Value) -> Run {
    call_with_args(command, id, ns, config, crate::support::cni::DEFAULT_ARGS)
}

/// [`call`] with `CNI_ARGS` `args`.
fn call_with_args(command: &str, id: &str, ns: &Netns, config: &Value, args: &str) -> Run {
    let env = call_env(command, id, &ns.path, "eth0", args);
    shim::run(env, &serde_json::to_vec(config).unwrap())
}

fn ipv4(ns: &Netns, ifname: &str) -> Vec<String> {
    ns.iface(ifname)
        .map(|i| i.addrs.into_iter().filter(|a| a.contains('.')).collect())
        .unwrap_or_default()
}

/// Asserts `ifname` in `ns` has exactly one IPv4 address, in `subnet`.
fn assert_in(ns: &Netns, ifname: &str, subnet: &Subnet) {
    let got = ipv4(ns, ifname);
    assert!(
        got.len() == 1 && subnet.holds(&got[0]),
        "{ifname}: {got:?} not in {}",
        subnet.cidr()
    );
}

/// A bridge network named `name` on its own bridge and subnet.
struct Net {
    name: String,
    subnet: Subnet,
    bridge: Link,
}

impl Net {
    fn new(name: &str) -> Self {
        Net {
            name: crate::support::netns::unique_name(name),
            subnet: Subnet::new(),
            bridge: Link::planned("b"),
        }
    }

    fn conflist(&self, engine: &Engine) -> Value {
        conflist(
            &self.name,
            "0.3.1",
            vec![bridge(&self.bridge.name, engine.host_local(&self.subnet))],
        )
    }

    /// The single-plugin form (`.conf`).
    fn conf(&self, engine: &Engine) -> Value {
        let mut b = bridge(&self.bridge.name, engine.host_local(&self.subnet));
        b["cniVersion"] = json!("0.3.1");
        b["name"] = json!(self.name);
        b
    }
}

#[test]
fn a_call_naming_the_cluster_network_by_path_and_default_networks_by_name_should_get_them() {
    let engine = Engine::new("ovl-path");
    let (cluster, lan) = (Net::new("cl"), Net::new("ln"));
    // The cluster network outside confDir, named by path; lan by name.
    let outside = engine.dir.join("net.d");
    std::fs::create_dir_all(&outside).unwrap();
    let cluster_path = outside.join("10-cluster.conflist");
    std::fs::write(
        &cluster_path,
        serde_json::to_vec(&cluster.conflist(&engine)).unwrap(),
    )
    .unwrap();
    engine.write_network("20-lan.conflist", &lan.conflist(&engine));
    let mut d = Daemon::start(&engine.dir, "d", daemon_config(&engine, true));
    d.ready();
    let conf = multus_conf(
        &d,
        json!({"clusterNetwork": cluster_path, "defaultNetworks": [lan.name]}),
    );
    let ns = Netns::new();
    let result = ok(&d, &call("ADD", "ovl-path-1", &ns, &conf));
    assert!(
        cluster.subnet.holds(&crate::support::cni::address(&result)),
        "{result}"
    );
    assert_in(&ns, "eth0", &cluster.subnet);
    assert_in(&ns, "net1", &lan.subnet);
    assert_eq!(engine.reservations(&cluster.name).len(), 1);
    assert_eq!(engine.reservations(&lan.name).len(), 1);

    ok(&d, &call("DEL", "ovl-path-1", &ns, &conf));
    assert!(!ns.has_link("eth0") && !ns.has_link("net1"));
    assert_eq!(engine.reservations(&cluster.name), Vec::<String>::new());
    assert_eq!(engine.reservations(&lan.name), Vec::<String>::new());
    assert_eq!(engine.records(), Vec::<String>::new());
}

#[test]
fn a_call_naming_the_cluster_network_and_confdir_should_find_it_by_name() {
    let engine = Engine::new("ovl-name");
    let cluster = Net::new("cl");
    engine.write_network("10-cluster.conflist", &cluster.conflist(&engine));
    // Neither clusterNetwork nor confDir in daemon-config.json.
    let mut d = Daemon::start(&engine.dir, "d", daemon_config(&engine, false));
    d.ready();
    let conf = multus_conf(
        &d,
        json!({"clusterNetwork": cluster.name, "confDir": engine.conf_dir}),
    );
    let ns = Netns::new();
    ok(&d, &call("ADD", "ovl-name-1", &ns, &conf));
    assert_in(&ns, "eth0", &cluster.subnet);
    assert!(host_link_exists(&cluster.bridge.name));
    ok(&d, &call("DEL", "ovl-name-1", &ns, &conf));
    assert!(!ns.has_link("eth0"));
    assert_eq!(engine.reservations(&cluster.name), Vec::<String>::new());
}

#[test]
fn inline_delegates_should_attach_the_first_as_cluster_network_and_the_rest_after_it() {
    let engine = Engine::new("ovl-deleg");
    let (first, second, unused) = (Net::new("d0"), Net::new("d1"), Net::new("dn"));
    engine.write_network("30-unused.conflist", &unused.conflist(&engine));
    let mut d = Daemon::start(&engine.dir, "d", daemon_config(&engine, true));
    d.ready();
    // A list and a single plugin; defaultNetworks are not attached
    // without a clusterNetwork, as in multus.
    let conf = multus_conf(
        &d,
        json!({
            "delegates": [first.conflist(&engine), second.conf(&engine)],
            "defaultNetworks": [unused.name],
        }),
    );
    let ns = Netns::new();
    let result = ok(&d, &call("ADD", "ovl-deleg-1", &ns, &conf));
    assert!(
        first.subnet.holds(&crate::support::cni::address(&result)),
        "{result}"
    );
    assert_in(&ns, "eth0", &first.subnet);
    assert_in(&ns, "net1", &second.subnet);
    assert!(!ns.has_link("net2"));
    assert_eq!(engine.reservations(&unused.name), Vec::<String>::new());

    ok(&d, &call("DEL", "ovl-deleg-1", &ns, &conf));
    assert!(!ns.has_link("eth0") && !ns.has_link("net1"));
    assert_eq!(engine.reservations(&first.name), Vec::<String>::new());
    assert_eq!(engine.reservations(&second.name), Vec::<String>::new());
}

#[test]
fn the_daemons_cluster_network_should_win_over_the_calls() {
    let engine = Engine::new("ovl-wins");
    let (mine, theirs) = (Net::new("x"), Net::new("y"));
    engine.write_network("10-x.conflist", &mine.conflist(&engine));
    let theirs_path = engine.dir.join("y.conflist");
    std::fs::write(
        &theirs_path,
        serde_json::to_vec(&theirs.conflist(&engine)).unwrap(),
    )
    .unwrap();
    let mut d = Daemon::start(&engine.dir, "d", engine.config(&mine.name, "20s"));
    d.ready();
    let conf = multus_conf(&d, json!({"clusterNetwork": theirs_path}));
    let ns = Netns::new();
    ok(&d, &call("ADD", "ovl-wins-1", &ns, &conf));
    assert_in(&ns, "eth0", &mine.subnet);
    assert!(!host_link_exists(&theirs.bridge.name));
    assert_eq!(engine.reservations(&theirs.name), Vec::<String>::new());
    ok(&d, &call("DEL", "ovl-wins-1", &ns, &conf));
    assert!(!ns.has_link("eth0"));
}

#[test]
fn no_cluster_network_anywhere_should_fail_with_multus_words_and_attach_nothing() {
    let engine = Engine::new("ovl-none");
    let net = Net::new("n");
    engine.write_network("10-n.conflist", &net.conflist(&engine));
    let mut d = Daemon::start(&engine.dir, "d", daemon_config(&engine, true));
    d.ready();
    let ns = Netns::new();
    for conf in [
        multus_conf(&d, json!({})),
        multus_conf(&d, json!({"clusterNetwork": "", "delegates": []})),
    ] {
        let (code, msg, _) = failed(&d, &call("ADD", "ovl-none-1", &ns, &conf));
        assert_eq!(code, 7, "{msg}");
        assert!(
            msg.contains("at least one delegate/clusterNetwork must be specified"),
            "{msg}"
        );
    }
    assert_eq!(
        ns.ifaces()
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>(),
        ["lo"]
    );
    assert!(!host_link_exists(&net.bridge.name));
    assert_eq!(engine.records(), Vec::<String>::new());
    // A malformed key is named, and nothing runs either.
    let conf = multus_conf(
        &d,
        json!({"clusterNetwork": net.name, "defaultNetworks": "lan"}),
    );
    let (code, msg, _) = failed(&d, &call("ADD", "ovl-none-2", &ns, &conf));
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("\"defaultNetworks\""), "{msg}");
    assert!(!host_link_exists(&net.bridge.name));
}

/// multus-shim's captured stdin (tests/fixtures/multus-wire), its paths
/// moved into this test's directory: the loopback network it names is
/// attached through plexus-shim and plexusd as through multus.
#[test]
fn the_captured_multus_conf_should_attach_its_cluster_network() {
    let engine = Engine::new("ovl-capture");
    let mut conf: Value = serde_json::from_slice(
        &std::fs::read(format!("{FIXTURES}shim-stdin-config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        conf["clusterNetwork"],
        "/run/example/net.d/10-loopback.conf"
    );
    let net_d = engine.dir.join("net.d");
    std::fs::create_dir_all(&net_d).unwrap();
    let loopback = net_d.join("10-loopback.conf");
    let name = crate::support::netns::unique_name("lo");
    std::fs::write(
        &loopback,
        serde_json::to_vec(&json!({"cniVersion": "0.3.1", "name": name, "type": "loopback"}))
            .unwrap(),
    )
    .unwrap();
    let mut d = Daemon::start(&engine.dir, "d", daemon_config(&engine, true));
    d.ready();
    conf["clusterNetwork"] = json!(loopback);
    conf["cniDir"] = json!(engine.dir.join("cache"));
    conf["logFile"] = json!(engine.dir.join("multus-daemon.log"));
    conf["daemonSocketDir"] = json!(d.sock.parent().unwrap());
    let ns = Netns::new();
    assert!(!ns.iface("lo").unwrap().up);
    let result = ok(&d, &call("ADD", "ovl-capture-1", &ns, &conf));
    assert_eq!(result["cniVersion"], "0.3.1", "{result}");
    let lo = ns.iface("lo").unwrap();
    assert!(lo.up && lo.has_addr("127.0.0.1/8"), "{lo:?}");
    assert_eq!(engine.records().len(), 1);
    ok(&d, &call("DEL", "ovl-capture-1", &ns, &conf));
    assert!(!ns.iface("lo").unwrap().up);
    assert_eq!(engine.records(), Vec::<String>::new());
    // The keys that stay the daemon's were not taken from the call.
    assert!(!engine.dir.join("cache").exists());
    assert!(!engine.dir.join("multus-daemon.log").exists());
}

/// A pod's ADD resolves the call's networks the same way: the call's
/// `clusterNetwork` names a NAD in the call's `multusNamespace`, and the
/// pod's annotation adds a NAD of its own namespace.
#[test]
fn a_pods_networks_should_come_from_the_calls_configuration_too() {
    let engine = Engine::new("ovl-pod");
    let (cluster, blue) = (Net::new("cl"), Net::new("bl"));
    let api = FakeApi::start();
    api.put_nad(
        "netops",
        "cl",
        Some(&cluster.conflist(&engine).to_string()),
        json!({}),
    );
    api.put_nad(
        "ns1",
        "blue",
        Some(&blue.conflist(&engine).to_string()),
        json!({}),
    );
    api.put_pod(
        "ns1",
        "web",
        "uid-web",
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": "blue"}),
    );
    let d = api.start_daemon(&engine.dir, daemon_config(&engine, true), "2s");
    let conf = multus_conf(
        &d,
        json!({"clusterNetwork": "cl", "multusNamespace": "netops"}),
    );
    let ns = Netns::new();
    let args = pod_args("ns1", "web", "uid-web");
    ok(&d, &call_with_args("ADD", "ovl-pod-1", &ns, &conf, &args));
    assert_in(&ns, "eth0", &cluster.subnet);
    assert_in(&ns, "net1", &blue.subnet);
    assert_eq!(
        api.network_status_names("ns1", "web"),
        ["netops/cl", "ns1/blue"]
    );
    ok(&d, &call_with_args("DEL", "ovl-pod-1", &ns, &conf, &args));
    assert!(!ns.has_link("eth0") && !ns.has_link("net1"));
    assert_eq!(engine.reservations(&cluster.name), Vec::<String>::new());
    assert_eq!(engine.reservations(&blue.name), Vec::<String>::new());
}
