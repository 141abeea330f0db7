//! A full state directory never blocks a DEL: with the file system of
//! `stateDir` full (a 64 KiB tmpfs filled up), an ADD fails and is rolled
//! back, and a DEL still undoes every network and removes the record,
//! needing no new space. Debian's bridge and host-local. Needs root.

use std::fs;

use serde_json::{json, Value};

use crate::support::cni::{
    address, bare, bridge, cni, conflist, failed, ok, Engine, SYSTEM_PLUGINS,
};
use crate::support::daemon::Daemon;
use crate::support::netns::{bridge_ports, Link, Netns, Subnet};
use crate::support::tmpfs::Tmpfs;

/// Two bridge + host-local networks (eth0 and net1), stateDir on a
/// 64 KiB tmpfs.
struct Node {
    e: Engine,
    main: Link,
    extra: Link,
    disk: Tmpfs,
    d: Daemon,
}

fn node(tag: &str) -> Node {
    let e = Engine::new(tag);
    let disk = Tmpfs::mount(&e.state_dir, Some("64k"));
    let (main, extra) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    e.write_network(
        "10-main.conflist",
        &conflist(
            "fd-main",
            "1.0.0",
            vec![bridge(&main.name, e.host_local(&s1))],
        ),
    );
    e.write_network(
        "20-extra.conflist",
        &conflist(
            "fd-extra",
            "1.0.0",
            vec![bridge(&extra.name, e.host_local(&s2))],
        ),
    );
    let config = json!({
        "confDir": e.conf_dir,
        "binDir": format!("{}:{SYSTEM_PLUGINS}", e.bin_dir.display()),
        "stateDir": e.state_dir,
        "clusterNetwork": "fd-main",
        "defaultNetworks": ["fd-extra"],
        "pluginTimeout": "20s",
    });
    let mut d = Daemon::start(&e.dir, "d", config);
    d.ready();
    Node {
        e,
        main,
        extra,
        disk,
        d,
    }
}

fn reserved(n: &Node) -> (Vec<String>, Vec<String>) {
    (n.e.reservations("fd-main"), n.e.reservations("fd-extra"))
}

/// Before: with the disk full, DEL failed with code 5 ("cannot write the
/// temporary file: No space left on device") and left the interfaces,
/// the reservations and the record; no pod could be torn down.
#[test]
fn a_full_state_dir_should_fail_an_add_cleanly_and_never_block_a_del() {
    let n = node("fd-del");
    let (ns_a, ns_b, ns_c) = (Netns::new(), Netns::new(), Netns::new());
    let a = ok(&n.d, &cni(&n.d, "ADD", "fd-a", &ns_a, "eth0"));
    ok(&n.d, &cni(&n.d, "ADD", "fd-b", &ns_b, "eth0"));
    assert!(ns_a.has_link("net1") && ns_b.has_link("net1"));
    assert_eq!(bridge_ports(&n.main.name).len(), 2);

    let filler = n.disk.fill("filler");

    // ADD: fails for lack of space and leaves nothing behind.
    let run = cni(&n.d, "ADD", "fd-c", &ns_c, "eth0");
    let (code, msg, _) = failed(&n.d, &run);
    assert_eq!(code, 5, "{msg}");
    assert!(msg.contains("No space left on device"), "{msg}");
    assert!(
        !ns_c.has_link("eth0") && !ns_c.has_link("net1"),
        "{:?}",
        ns_c.ifaces()
    );
    assert!(!n.e.record("fd-c").exists());
    let (main, extra) = reserved(&n);
    assert_eq!((main.len(), extra.len()), (2, 2), "{main:?} {extra:?}");

    // DEL: undoes both networks and removes the record, with no space.
    ok(&n.d, &cni(&n.d, "DEL", "fd-a", &ns_a, "eth0"));
    assert!(
        !ns_a.has_link("eth0") && !ns_a.has_link("net1"),
        "{:?}",
        ns_a.ifaces()
    );
    assert!(!n.e.record("fd-a").exists());
    let (main, extra) = reserved(&n);
    assert!(!main.contains(&bare(&address(&a))), "{main:?}");
    assert_eq!((main.len(), extra.len()), (1, 1), "{main:?} {extra:?}");
    assert_eq!(bridge_ports(&n.main.name).len(), 1);
    assert_eq!(bridge_ports(&n.extra.name).len(), 1);
    // Repeated, as runtimes do: still nothing to write, still a success.
    ok(&n.d, &cni(&n.d, "DEL", "fd-a", &ns_a, "eth0"));
    ok(&n.d, &cni(&n.d, "DEL", "fd-c", &ns_c, "eth0"));

    // The disk still full, the last pod goes too.
    ok(&n.d, &cni(&n.d, "DEL", "fd-b", &ns_b, "eth0"));
    assert!(!ns_b.has_link("eth0") && !ns_b.has_link("net1"));
    assert_eq!(reserved(&n), (Vec::new(), Vec::new()));
    assert!(bridge_ports(&n.main.name).is_empty() && bridge_ports(&n.extra.name).is_empty());
    assert_eq!(n.e.records(), Vec::<String>::new());

    // Space again: ADD works again.
    fs::remove_file(&filler).unwrap();
    let _ = fs::remove_file(filler.with_extension("probe"));
    let _ = fs::remove_file(n.e.state_dir.join("filler.probe"));
    let c: Value = ok(&n.d, &cni(&n.d, "ADD", "fd-c", &ns_c, "eth0"));
    assert!(ns_c.has_link("eth0") && ns_c.has_link("net1"));
    assert!(!address(&c).is_empty());
    ok(&n.d, &cni(&n.d, "DEL", "fd-c", &ns_c, "eth0"));
}
