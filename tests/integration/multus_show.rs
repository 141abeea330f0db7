//! `plexusd show` and `GET /attachments/<id>` of containers multus
//! attached before the node switched to plexusd: shown from multus's
//! caches, marked as such, as the container's namespace has them; damaged
//! caches reported as damaged; nothing read is moved, removed or followed.
//! Each container is attached as multus would ([`crate::support::multus`])
//! with Debian's bridge and host-local. Needs root and iproute2.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::support::cni::{ok, Call};
use crate::support::daemon::{Daemon, PLEXUSD};
use crate::support::http;
use crate::support::multus::{call, cluster, extra, Net, Node};
use crate::support::netns::{ip_ok, Link, Netns, Subnet};

/// `plexusd show [args]` with the config the node's daemon runs with.
fn show(n: &Node, args: &[&str]) -> Output {
    Command::new(PLEXUSD)
        .arg("--config")
        .arg(n.e.dir.join("d.json"))
        .arg("show")
        .args(args)
        .output()
        .expect("run plexusd show")
}

/// What `show <id>` printed, which must be what the daemon answers at
/// `/attachments/<id>`; the exit status and stderr alongside.
fn shown(n: &Node, d: &Daemon, id: &str) -> (Value, bool, String) {
    let out = show(n, &[id]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let printed: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("show {id} printed no JSON ({e}): {out:?}"));
    let r = http::request(&d.sock, "GET", &format!("/attachments/{id}"), b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(r.json(), printed, "show and /attachments differ for {id}");
    (printed, out.status.success(), stderr)
}

/// The IPv4 addresses (`a.b.c.d/len`) of `ifname` in `ns`.
fn ipv4(ns: &Netns, ifname: &str) -> Vec<Value> {
    let iface = ns
        .iface(ifname)
        .unwrap_or_else(|| panic!("no {ifname} in {}: {:?}", ns.name, ns.ifaces()));
    iface
        .addrs
        .iter()
        .filter(|a| a.contains('.'))
        .map(|a| json!(a))
        .collect()
}

/// The MAC address of `ifname` in `ns`.
fn mac(ns: &Netns, ifname: &str) -> String {
    let links: Value =
        serde_json::from_str(&ip_ok(&["-n", &ns.name, "-j", "link", "show", ifname])).unwrap();
    links[0]["address"].as_str().unwrap().to_string()
}

/// Every path below `dir` with what it is: a file's bytes, a link's
/// target, or a directory; to see that nothing changed.
fn tree(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let meta = fs::symlink_metadata(&p).unwrap();
        if meta.is_symlink() {
            out.push((
                p.clone(),
                format!("-> {}", fs::read_link(&p).unwrap().display()),
            ));
        } else if meta.is_dir() {
            out.push((p.clone(), "dir".into()));
            out.extend(tree(&p));
        } else {
            out.push((
                p.clone(),
                String::from_utf8_lossy(&fs::read(&p).unwrap()).into(),
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn show_should_list_a_container_multus_attached_as_its_namespace_has_it() {
    let n = Node::new("ms-list");
    let (br1, br2) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    let main = cluster(&n.e, "ms-main", &br1, &s1);
    let nets = [
        Net::list(&main),
        Net::single("default", &extra(&n.e, "ms-extra", &br2, &s2)),
    ];
    let (ns_m, ns_own, ns_both) = (Netns::new(), Netns::new(), Netns::new());
    n.multus_add("ms-m", &ns_m, &nets);
    // ms-both has multus's delegate cache and a record of plexusd's own.
    fs::copy(n.delegate_cache("ms-m"), n.delegate_cache("ms-both")).unwrap();
    let d = n.start("ms-main");
    ok(&d, &call("ADD", "ms-own", &ns_own).run(&d));
    ok(&d, &call("ADD", "ms-both", &ns_both).run(&d));
    let before = tree(&n.cni_dir);

    let (m, success, _) = shown(&n, &d, "ms-m");
    assert!(success);
    assert_eq!(m["containerId"], "ms-m");
    assert_eq!(m["attachedBy"], "multus");
    let att = &m["attachments"][0];
    assert_eq!(att["ifname"], "eth0", "{m}");
    assert_eq!(att["netns"], ns_m.path, "{m}");
    let networks = att["networks"].as_array().unwrap();
    assert_eq!(networks.len(), 2, "{m}");
    for (net, (name, multus_name, ifname, primary)) in networks.iter().zip([
        ("ms-main", "ms-main", "eth0", true),
        ("ms-extra", "default/ms-extra", "net1", false),
    ]) {
        assert_eq!(net["network"], name, "{m}");
        assert_eq!(net["multusName"], multus_name, "{m}");
        assert_eq!(net["interface"], ifname, "{m}");
        assert_eq!(net["primary"], primary, "{m}");
        assert_eq!(net["state"], "added", "{m}");
        assert_eq!(net["ips"], json!(ipv4(&ns_m, ifname)), "{m}");
        assert_eq!(net["mac"], mac(&ns_m, ifname), "{m}");
        assert!(net.get("damaged").is_none(), "{m}");
    }

    // plexusd's own record wins.
    let (both, success, _) = shown(&n, &d, "ms-both");
    assert!(success);
    assert!(both.get("attachedBy").is_none(), "{both}");
    assert_eq!(both["attachments"][0]["netns"], ns_both.path, "{both}");
    let ips = &both["attachments"][0]["networks"][0]["ips"];
    assert_eq!(ips, &json!(ipv4(&ns_both, "eth0")), "{both}");

    // The whole list: every container, multus's marked.
    let all = show(&n, &[]);
    assert!(all.status.success(), "{all:?}");
    let all: Value = serde_json::from_slice(&all.stdout).unwrap();
    let listed: Vec<(&str, Option<&str>)> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["containerId"].as_str().unwrap(), c["attachedBy"].as_str()))
        .collect();
    assert_eq!(
        listed,
        [
            ("ms-both", None),
            ("ms-m", Some("multus")),
            ("ms-own", None)
        ]
    );
    assert_eq!(all[1], m);

    // Reading changed nothing in cniDir.
    assert_eq!(tree(&n.cni_dir), before);

    // Once DELed, nothing is left to show.
    ok(&d, &call("DEL", "ms-m", &ns_m).run(&d));
    let out = show(&n, &["ms-m"]);
    assert!(!out.status.success(), "{out:?}");
    let r = http::request(&d.sock, "GET", "/attachments/ms-m", b"").unwrap();
    assert_eq!(r.status, 404, "{}", r.body_str());
    for (id, ns) in [("ms-own", &ns_own), ("ms-both", &ns_both)] {
        ok(&d, &Call::new("DEL", id, ns, "eth0").run(&d));
    }
}

#[test]
fn show_should_report_damaged_multus_caches_as_damaged_and_move_nothing() {
    let n = Node::new("ms-damaged");
    let (br1, br2) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    let main = cluster(&n.e, "mz-main", &br1, &s1);
    let (ns_a, ns_b) = (Netns::new(), Netns::new());
    n.multus_add("mz-a", &ns_a, &[Net::list(&main)]);
    n.multus_add(
        "mz-b",
        &ns_b,
        &[
            Net::list(&main),
            Net::single("default", &extra(&n.e, "mz-extra", &br2, &s2)),
        ],
    );
    // mz-a's delegate cache cut short; mz-b's net1 result cache a link to
    // a file elsewhere.
    let whole = fs::read(n.delegate_cache("mz-a")).unwrap();
    fs::write(n.delegate_cache("mz-a"), &whole[..whole.len() / 2]).unwrap();
    let target = n.e.dir.join("target");
    fs::write(&target, b"keep").unwrap();
    let link = n.result_cache("mz-extra", "mz-b", "net1");
    fs::remove_file(&link).unwrap();
    symlink(&target, &link).unwrap();
    let d = n.start("mz-main");
    let before = tree(&n.cni_dir);

    // A damaged delegate cache: the container is shown as damaged, naming
    // the file, and show exits 1.
    let (a, success, stderr) = shown(&n, &d, "mz-a");
    assert!(!success, "{a}");
    assert_eq!(a["attachedBy"], "multus", "{a}");
    let why = a["damaged"].as_str().unwrap();
    let path = n.delegate_cache("mz-a").display().to_string();
    assert!(why.contains(&path), "{why}");
    assert!(stderr.contains(&path), "{stderr}");

    // A damaged result cache: its network says so, the rest is shown.
    let (b, success, stderr) = shown(&n, &d, "mz-b");
    assert!(success, "{b}");
    let networks = &b["attachments"][0]["networks"];
    assert_eq!(networks[0]["state"], "added", "{b}");
    assert_eq!(networks[0]["ips"], json!(ipv4(&ns_b, "eth0")), "{b}");
    let why = networks[1]["damaged"].as_str().unwrap();
    let path = link.display().to_string();
    assert!(
        why.contains(&path) && why.contains("symbolic link"),
        "{why}"
    );
    assert!(stderr.contains(&path), "{stderr}");
    assert_eq!(networks[1]["state"], "unknown", "{b}");
    assert_eq!(networks[1]["interface"], "net1", "{b}");

    // The list goes on past both.
    let all = show(&n, &[]);
    assert!(all.status.success(), "{all:?}");
    let all: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(all, json!([a, b]));

    // Nothing moved, removed or followed.
    assert_eq!(tree(&n.cni_dir), before);
    assert_eq!(fs::read(&target).unwrap(), b"keep");
    assert!(n.damaged("mz-a").is_empty() && n.damaged("mz-b").is_empty());
}
