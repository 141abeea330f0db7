//! Several networks per container from static configuration, with
//! Debian's plugins through plexus-shim and plexusd: the cluster network,
//! `defaultNetworks`, and networks chosen per call with `PLEXUS_NETWORKS`;
//! the recorded status; rollback; DEL from the record alone; and the quick
//! start script as README.md gives it.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, failed, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::http;
use crate::support::netns::{host_link_exists, Link, Netns, Subnet};

const PLEXUSD: &str = env!("CARGO_BIN_EXE_plexusd");

/// An example network from `examples/net.d`, moved onto this test's own
/// bridge, subnet and host-local store so that tests never share anything.
fn example(engine: &Engine, file: &str, name: &str, bridge_name: &str, subnet: &Subnet) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/net.d")
        .join(file);
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["name"] = json!(name);
    let plugin = &mut v["plugins"][0];
    assert_eq!(plugin["type"], "bridge", "{file} changed shape");
    plugin["bridge"] = json!(bridge_name);
    plugin["ipam"] = engine.host_local(subnet);
    v
}

/// Three bridge networks: cluster and `lan` from the examples, `extra` a
/// third bridge; `lan` is a default network.
struct Three {
    engine: Engine,
    daemon: Daemon,
    subnets: [Subnet; 3],
    _bridges: [Link; 3],
}

fn three(tag: &str, extra: Option<Value>) -> Three {
    let engine = Engine::new(tag);
    let bridges = [Link::planned("b"), Link::planned("b"), Link::planned("b")];
    let subnets = [Subnet::new(), Subnet::new(), Subnet::new()];
    let cluster = example(
        &engine,
        "10-plexus-cluster.conflist",
        "cluster",
        &bridges[0].name,
        &subnets[0],
    );
    let lan = example(
        &engine,
        "20-plexus-lan.conflist",
        "lan",
        &bridges[1].name,
        &subnets[1],
    );
    let extra = extra.unwrap_or_else(|| {
        conflist(
            "extra",
            "1.0.0",
            vec![bridge(&bridges[2].name, engine.host_local(&subnets[2]))],
        )
    });
    engine.write_network("10-cluster.conflist", &cluster);
    engine.write_network("20-lan.conflist", &lan);
    engine.write_network("30-extra.conflist", &extra);
    let mut config = engine.config("cluster", "20s");
    config["defaultNetworks"] = json!(["lan"]);
    let mut daemon = Daemon::start(&engine.dir, "d", config);
    daemon.ready();
    Three {
        engine,
        daemon,
        subnets,
        _bridges: bridges,
    }
}

fn ipv4(ns: &Netns, ifname: &str) -> Vec<String> {
    ns.iface(ifname)
        .map(|i| {
            i.addrs
                .iter()
                .filter(|a| a.contains('.'))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn cluster_default_and_requested_networks_should_get_eth0_net1_net2_and_go_away_on_del() {
    let t = three("threenets", None);
    let ns = Netns::new();
    let id = "three-1";
    // No IgnoreUnknown: host-local rejects unknown CNI_ARGS keys, so this
    // also proves PLEXUS_NETWORKS never reaches the plugins.
    let add = Call::new("ADD", id, &ns, "eth0")
        .args("PLEXUS_NETWORKS=extra")
        .run(&t.daemon);
    let result = ok(&t.daemon, &add);
    // The runtime gets the cluster network's result.
    let addr = crate::support::cni::address(&result);
    assert!(t.subnets[0].holds(&addr), "{result}");

    for (ifname, subnet) in ["eth0", "net1", "net2"].iter().zip(&t.subnets) {
        let got = ipv4(&ns, ifname);
        assert!(
            got.len() == 1 && subnet.holds(&got[0]),
            "{ifname}: {got:?} not in {}",
            subnet.cidr()
        );
    }
    for net in ["cluster", "lan", "extra"] {
        assert_eq!(t.engine.reservations(net).len(), 1, "{net}");
    }

    // The status, over the socket and from `plexusd show`, names them all.
    let r = http::request(&t.daemon.sock, "GET", &format!("/attachments/{id}"), b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.body_str());
    let status = r.json();
    let shown = Command::new(PLEXUSD)
        .arg("--config")
        .arg(t.engine.dir.join("d.json"))
        .args(["show", id])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{shown:?}");
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(status, shown);
    let networks = status["attachments"][0]["networks"]
        .as_array()
        .unwrap()
        .clone();
    let summary: Vec<(String, String, String)> = networks
        .iter()
        .map(|n| {
            (
                n["network"].as_str().unwrap().to_string(),
                n["interface"].as_str().unwrap().to_string(),
                n["ips"][0].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    for (i, (net, ifname)) in [("cluster", "eth0"), ("lan", "net1"), ("extra", "net2")]
        .iter()
        .enumerate()
    {
        assert_eq!(summary[i].0, *net, "{status}");
        assert_eq!(summary[i].1, *ifname, "{status}");
        assert_eq!(vec![summary[i].2.clone()], ipv4(&ns, ifname), "{status}");
    }
    assert_eq!(networks[0]["primary"], true);

    let del = Call::new("DEL", id, &ns, "eth0")
        .args("PLEXUS_NETWORKS=extra")
        .run(&t.daemon);
    ok(&t.daemon, &del);
    for ifname in ["eth0", "net1", "net2"] {
        assert!(!ns.has_link(ifname), "{ifname} left after DEL");
    }
    for net in ["cluster", "lan", "extra"] {
        assert!(t.engine.reservations(net).is_empty(), "{net}");
    }
    assert!(t.engine.records().is_empty(), "{:?}", t.engine.records());
    let r = http::request(&t.daemon.sock, "GET", &format!("/attachments/{id}"), b"").unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["code"], 3);
}

#[test]
fn a_failing_third_network_should_roll_back_the_first_two() {
    let t = three(
        "rollback3",
        Some(conflist("extra", "1.0.0", vec![json!({"type": "refuse"})])),
    );
    t.engine.fake(
        "refuse",
        r#"if [ "$CNI_COMMAND" = ADD ]; then echo '{"code":7,"msg":"no room on this network"}'; exit 1; fi
exit 0"#,
    );
    let ns = Netns::new();
    let add = Call::new("ADD", "rb-1", &ns, "eth0")
        .args("IgnoreUnknown=1;PLEXUS_NETWORKS=extra")
        .run(&t.daemon);
    let (code, msg, _) = failed(&t.daemon, &add);
    assert_eq!(code, 7);
    assert!(
        msg.contains("\"extra\"") && msg.contains("no room on this network"),
        "{msg}"
    );
    for ifname in ["eth0", "net1", "net2"] {
        assert!(!ns.has_link(ifname), "{ifname} left after the rollback");
    }
    for net in ["cluster", "lan"] {
        assert!(t.engine.reservations(net).is_empty(), "{net}");
    }
    assert!(t.engine.records().is_empty(), "{:?}", t.engine.records());
}

#[test]
fn del_should_clean_every_network_after_their_files_are_removed() {
    let t = three("filesgone", None);
    let ns = Netns::new();
    let add = Call::new("ADD", "gone-1", &ns, "eth0")
        .args("IgnoreUnknown=1;PLEXUS_NETWORKS=extra@fast0")
        .run(&t.daemon);
    ok(&t.daemon, &add);
    assert!(ns.has_link("fast0"), "requested interface name not used");
    for f in std::fs::read_dir(&t.engine.conf_dir).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    let del = Call::new("DEL", "gone-1", &ns, "eth0").run(&t.daemon);
    ok(&t.daemon, &del);
    for ifname in ["eth0", "net1", "fast0"] {
        assert!(!ns.has_link(ifname), "{ifname} left after DEL");
    }
    for net in ["cluster", "lan", "extra"] {
        assert!(t.engine.reservations(net).is_empty(), "{net}");
    }
    assert!(t.engine.records().is_empty());
}

#[test]
fn bad_selections_should_fail_before_anything_runs() {
    let t = three("badsel", None);
    let ns = Netns::new();
    let cases = [
        ("PLEXUS_NETWORKS=a@b@c", 4, "PLEXUS_NETWORKS"),
        ("PLEXUS_NETWORKS=nosuchnet", 7, "nosuchnet"),
        ("PLEXUS_NETWORKS=extra@net1", 7, "net1"),
        ("PLEXUS_NETWORKS=extra@eth0", 7, "eth0"),
    ];
    for (args, want, needle) in cases {
        let run = Call::new("ADD", "badsel-1", &ns, "eth0")
            .args(&format!("IgnoreUnknown=1;{args}"))
            .run(&t.daemon);
        let (code, msg, _) = failed(&t.daemon, &run);
        assert_eq!(code, want, "{args}: {msg}");
        assert!(msg.contains(needle), "{args}: {msg}");
        assert!(
            ns.ifaces().iter().all(|i| i.name == "lo"),
            "{args}: something ran"
        );
        assert!(t.engine.records().is_empty(), "{args}");
    }
}

/// README.md's quick start, run as written except that it uses the binaries
/// this test run built (`PLEXUS_BIN_DIR`) instead of building them again.
#[test]
fn quick_start_should_attach_two_networks_and_leave_nothing_behind() {
    // The script makes (and removes) host paths that other tests use.
    let _host = crate::support::lock::host_paths();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = Path::new(PLEXUSD).parent().unwrap();
    if Path::new("/run/plexus/plexus.sock").exists() {
        panic!("/run/plexus/plexus.sock exists: a Plexus daemon runs on this host; the quick start needs that path");
    }
    let out = Command::new("bash")
        .arg(repo.join("examples/quickstart.sh"))
        .env("PLEXUS_BIN_DIR", bin)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "quickstart failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // It showed both interfaces with their addresses...
    assert!(
        stdout.contains("10.252.10.") && stdout.contains("10.252.20."),
        "{stdout}"
    );
    // ...and removed all it made.
    assert!(!Path::new("/run/plexus").exists());
    assert!(!host_link_exists("plexusbr0") && !host_link_exists("plexusbr1"));
    let netns = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().starts_with("plexus-demo-"))
        })
        .unwrap_or(false);
    assert!(!netns, "a plexus-demo namespace is left");
    assert!(!Path::new("/var/lib/cni/networks/plexus-cluster").exists());
}

/// GC (CNI 1.1.0) deletes, from the records, every attachment the runtime
/// no longer lists, and leaves the listed ones alone; STATUS succeeds with
/// plugins that predate it (Debian's stop at 1.0.0, so nothing is sent).
#[test]
fn gc_should_delete_what_the_runtime_no_longer_lists_and_status_should_pass() {
    let t = three("gcstatus", None);
    let keep_ns = Netns::new();
    let stale_ns = Netns::new();
    ok(
        &t.daemon,
        &Call::new("ADD", "gc-keep", &keep_ns, "eth0").run(&t.daemon),
    );
    ok(
        &t.daemon,
        &Call::new("ADD", "gc-stale", &stale_ns, "eth0").run(&t.daemon),
    );
    assert_eq!(t.engine.reservations("cluster").len(), 2);
    assert_eq!(t.engine.reservations("lan").len(), 2);

    let stdin = |extra: Value| {
        let mut v = json!({
            "cniVersion": "1.1.0",
            "name": "plexus",
            "type": "plexus-shim",
            "daemonSocketDir": t.daemon.sock.parent().unwrap(),
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::to_vec(&v).unwrap()
    };
    let env = |cmd: &str| {
        vec![
            ("CNI_COMMAND".to_string(), cmd.to_string()),
            ("CNI_PATH".to_string(), "/usr/lib/cni".to_string()),
        ]
    };
    let status = crate::support::shim::run(env("STATUS"), &stdin(json!({})));
    assert_eq!(status.code, Some(0), "{status:?}\n{}", t.daemon.log_text());

    let gc = crate::support::shim::run(
        env("GC"),
        &stdin(
            json!({"cni.dev/valid-attachments": [{"containerID": "gc-keep", "ifname": "eth0"}]}),
        ),
    );
    assert_eq!(gc.code, Some(0), "{gc:?}\n{}", t.daemon.log_text());
    for ifname in ["eth0", "net1"] {
        assert!(keep_ns.has_link(ifname), "GC removed the listed {ifname}");
        assert!(!stale_ns.has_link(ifname), "GC left the stale {ifname}");
    }
    assert_eq!(t.engine.reservations("cluster").len(), 1);
    assert_eq!(t.engine.reservations("lan").len(), 1);
    assert_eq!(t.engine.records(), vec!["gc-keep.json".to_string()]);

    // A GC without the list would delete everything: it is refused.
    let refused = crate::support::shim::run(env("GC"), &stdin(json!({})));
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(keep_ns.has_link("eth0"));
    ok(
        &t.daemon,
        &Call::new("DEL", "gc-keep", &keep_ns, "eth0").run(&t.daemon),
    );
    assert!(t.engine.records().is_empty());
}
