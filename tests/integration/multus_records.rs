//! Containers that multus attached before the node switched to plexusd:
//! DEL, CHECK and GC from multus's caches in its `cniDir`. Each test attaches
//! a container as multus would ([`crate::support::multus`]); then it calls
//! plexusd through plexus-shim and looks at the namespace, host-local's
//! store and the cache files. Needs root and iproute2.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use serde_json::json;

use crate::support::cni::{address, bare, failed, list_dir, ok, SYSTEM_PLUGINS};
use crate::support::multus::{call, cluster, extra, Net, Node};
use crate::support::netns::{bridge_ports, Link, Netns, Subnet};
use crate::support::shim;
use crate::support::tmpfs::Tmpfs;

#[test]
fn del_should_run_every_network_multus_cached_and_remove_both_caches() {
    let n = Node::new("mc-del");
    let (br1, br2) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    let main = cluster(&n.e, "mc-main", &br1, &s1);
    let nets = [
        Net::list(&main),
        Net::single("default", &extra(&n.e, "mc-extra", &br2, &s2)),
    ];
    let ns = Netns::new();
    let id = "mc-del-1";
    let results = n.multus_add(id, &ns, &nets);
    let (a1, a2) = (address(&results[0]), address(&results[1]));
    assert!(s1.holds(&a1) && s2.holds(&a2), "{a1} {a2}");
    assert!(
        ns.has_link("eth0") && ns.has_link("net1"),
        "{:?}",
        ns.ifaces()
    );
    assert_eq!(n.e.reservations("mc-main"), vec![bare(&a1)]);
    assert_eq!(n.e.reservations("mc-extra"), vec![bare(&a2)]);
    assert_eq!(n.result_caches_of(id).len(), 2);

    let d = n.start("mc-main");
    ok(&d, &call("DEL", id, &ns).run(&d));
    assert!(
        !ns.has_link("eth0") && !ns.has_link("net1"),
        "{:?}",
        ns.ifaces()
    );
    assert!(n.e.reservations("mc-main").is_empty());
    assert!(n.e.reservations("mc-extra").is_empty());
    assert!(bridge_ports(&br1.name).is_empty() && bridge_ports(&br2.name).is_empty());
    assert!(!n.delegate_cache(id).exists(), "delegate cache left");
    assert_eq!(n.result_caches_of(id), Vec::<String>::new());
    // Nothing of plexusd's own was made for it.
    assert!(n.e.records().is_empty(), "{:?}", n.e.records());
    // A repeated DEL finds nothing and succeeds.
    ok(&d, &call("DEL", id, &ns).run(&d));
}

#[test]
fn a_failed_del_should_keep_the_caches_for_the_next_del() {
    let n = Node::new("mc-retry");
    // Fails DEL while `$DIR/fail` exists; ADD answers an empty result.
    n.e.fake(
        "flaky",
        r#"case "$CNI_COMMAND" in
ADD) printf '{"cniVersion":"1.0.0"}' ;;
DEL) if [ -e "$DIR/fail" ]; then printf '{"code":11,"msg":"flaky DEL failed"}'; exit 1; fi ;;
esac
exit 0"#,
    );
    let br = Link::bridge();
    let subnet = Subnet::new();
    let main = cluster(&n.e, "mr-main", &br, &subnet);
    let nets = [
        Net::list(&main),
        Net::single(
            "default",
            &json!({"cniVersion": "1.0.0", "name": "mr-flaky", "type": "flaky"}),
        ),
    ];
    let ns = Netns::new();
    let id = "mc-retry-1";
    n.multus_add(id, &ns, &nets);
    let d = n.start("mr-main");

    fs::write(n.e.dir.join("fail"), b"").unwrap();
    let (code, msg, _) = failed(&d, &call("DEL", id, &ns).run(&d));
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("flaky DEL failed"), "{msg}");
    // The primary's DEL ran past the failure: its interface, address and
    // result cache are gone; the delegate cache and the failed network's
    // result cache stay for the retry.
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    assert!(n.e.reservations("mr-main").is_empty());
    assert!(n.delegate_cache(id).is_file(), "delegate cache removed");
    assert_eq!(n.result_caches_of(id), vec![format!("mr-flaky-{id}-net1")]);

    fs::remove_file(n.e.dir.join("fail")).unwrap();
    ok(&d, &call("DEL", id, &ns).run(&d));
    assert!(!n.delegate_cache(id).exists(), "delegate cache left");
    assert_eq!(n.result_caches_of(id), Vec::<String>::new());
}

#[test]
fn a_damaged_delegate_cache_should_be_moved_aside_and_del_should_fall_back() {
    let n = Node::new("mc-damaged");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let main = cluster(&n.e, "md-main", &br, &subnet);
    let (ns_a, ns_b, ns_c) = (Netns::new(), Netns::new(), Netns::new());
    let results = n.multus_add("md-a", &ns_a, &[Net::list(&main)]);
    let addr_a = address(&results[0]);
    let results = n.multus_add("md-c", &ns_c, &[Net::list(&main)]);
    let addr_c = address(&results[0]);
    // a's delegate cache cut in half; b's a symbolic link to c's.
    let whole = fs::read(n.delegate_cache("md-a")).unwrap();
    let half = whole[..whole.len() / 2].to_vec();
    fs::write(n.delegate_cache("md-a"), &half).unwrap();
    symlink(n.delegate_cache("md-c"), n.delegate_cache("md-b")).unwrap();
    let c_cache = fs::read(n.delegate_cache("md-c")).unwrap();
    let a_result = fs::read(n.result_cache("md-main", "md-a", "eth0")).unwrap();
    let d = n.start("md-main");

    // a: set aside as it was, and the configured network DELed instead.
    ok(&d, &call("DEL", "md-a", &ns_a).run(&d));
    assert!(!n.delegate_cache("md-a").exists());
    let aside = n.damaged("md-a");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        aside[0].to_string_lossy().ends_with(".multus-md-a"),
        "{aside:?}"
    );
    assert_eq!(fs::read(&aside[0]).unwrap(), half);
    assert!(!ns_a.has_link("eth0"), "{:?}", ns_a.ifaces());
    assert_eq!(n.e.reservations("md-main"), vec![bare(&addr_c)]);
    assert_ne!(addr_a, addr_c);
    // The fallback succeeded: a's result cache went with it.
    assert_eq!(n.result_caches_of("md-a"), Vec::<String>::new());

    // b: the link itself is moved, never followed; c is untouched.
    ok(&d, &call("DEL", "md-b", &ns_b).run(&d));
    let aside = n.damaged("md-b");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(fs::read_link(&aside[0]).unwrap(), n.delegate_cache("md-c"));
    assert_eq!(fs::read(n.delegate_cache("md-c")).unwrap(), c_cache);
    assert!(ns_c.has_link("eth0"), "{:?}", ns_c.ifaces());
    assert_eq!(n.e.reservations("md-main"), vec![bare(&addr_c)]);

    // c's result cache replaced by a's (it names md-a): moved aside, and
    // c's DEL goes on from its delegate cache without a prevResult.
    let c_result = n.result_cache("md-main", "md-c", "eth0");
    fs::write(&c_result, &a_result).unwrap();
    ok(&d, &call("DEL", "md-c", &ns_c).run(&d));
    assert!(!ns_c.has_link("eth0"), "{:?}", ns_c.ifaces());
    assert!(n.e.reservations("md-main").is_empty());
    assert!(!n.delegate_cache("md-c").exists());
    assert!(!c_result.exists());
    let aside = n.damaged("md-c");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        aside[0]
            .to_string_lossy()
            .ends_with(".multus-results-md-main-md-c-eth0"),
        "{aside:?}"
    );
    assert_eq!(fs::read(&aside[0]).unwrap(), a_result);
}

#[test]
fn check_should_pass_for_a_multus_container_and_fail_once_an_interface_is_gone() {
    let n = Node::new("mc-check");
    let (br1, br2) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    let main = cluster(&n.e, "mk-main", &br1, &s1);
    let nets = [
        Net::list(&main),
        Net::single("default", &extra(&n.e, "mk-extra", &br2, &s2)),
    ];
    let ns = Netns::new();
    let id = "mc-check-1";
    n.multus_add(id, &ns, &nets);
    let d = n.start("mk-main");

    ok(&d, &call("CHECK", id, &ns).run(&d));
    ns.del_link("net1");
    let (_, msg, _) = failed(&d, &call("CHECK", id, &ns).run(&d));
    assert!(
        msg.contains("mk-extra"),
        "msg should name the network: {msg}"
    );
    // CHECK changed nothing: DEL still has both caches to work from.
    assert!(n.delegate_cache(id).is_file());
    assert_eq!(n.result_caches_of(id).len(), 2);
    ok(&d, &call("DEL", id, &ns).run(&d));
    assert!(n.e.reservations("mk-main").is_empty() && n.e.reservations("mk-extra").is_empty());
}

#[test]
fn gc_should_keep_multus_containers_in_the_valid_list_and_del_the_others() {
    let n = Node::new("mc-gc");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let main = cluster(&n.e, "mg-main", &br, &subnet);
    let (ns_keep, ns_stale) = (Netns::new(), Netns::new());
    let keep = address(&n.multus_add("mg-keep", &ns_keep, &[Net::list(&main)])[0]);
    n.multus_add("mg-stale", &ns_stale, &[Net::list(&main)]);
    let d = n.start("mg-main");

    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus-shim",
        "daemonSocketDir": d.sock.parent().unwrap(),
        "cni.dev/valid-attachments": [{"containerID": "mg-keep", "ifname": "eth0"}],
    }))
    .unwrap();
    let run = shim::finish(shim::spawn(
        [("CNI_COMMAND", "GC"), ("CNI_PATH", SYSTEM_PLUGINS)],
        &stdin,
    ));
    ok(&d, &run);

    assert!(ns_keep.has_link("eth0"), "{:?}", ns_keep.ifaces());
    assert_eq!(n.e.reservations("mg-main"), vec![bare(&keep)]);
    assert!(n.delegate_cache("mg-keep").is_file());
    assert_eq!(n.result_caches_of("mg-keep").len(), 1);

    assert!(!ns_stale.has_link("eth0"), "{:?}", ns_stale.ifaces());
    assert!(!n.delegate_cache("mg-stale").exists());
    assert_eq!(n.result_caches_of("mg-stale"), Vec::<String>::new());

    ok(&d, &call("DEL", "mg-keep", &ns_keep).run(&d));
    assert!(n.e.reservations("mg-main").is_empty());
}

/// Under systemd's ReadWritePaths= (and whenever cniDir and stateDir are
/// on different file systems) a rename between them fails with EXDEV: the
/// damaged cache is moved aside within cniDir instead, never deleted.
#[test]
fn a_damaged_cache_on_another_file_system_should_be_moved_aside_where_it_is() {
    let n = Node::new("mc-exdev");
    let _mounted = Tmpfs::mount(&n.cni_dir, None);
    let br = Link::bridge();
    let subnet = Subnet::new();
    let main = cluster(&n.e, "mx-main", &br, &subnet);
    let ns = Netns::new();
    let id = "mc-exdev-1";
    n.multus_add(id, &ns, &[Net::list(&main)]);
    fs::write(n.delegate_cache(id), b"[{\"Name\":").unwrap();
    let d = n.start("mx-main");

    ok(&d, &call("DEL", id, &ns).run(&d));
    assert!(!n.delegate_cache(id).exists());
    let here = n.cni_dir.join(".plexus-damaged").join(id);
    let aside = list_dir(&here);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(aside[0].ends_with(&format!(".multus-{id}")), "{aside:?}");
    assert_eq!(fs::read(here.join(&aside[0])).unwrap(), b"[{\"Name\":");
    // The fallback ran, and later DELs fall back too.
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    assert!(n.e.reservations("mx-main").is_empty());
    assert!(n.e.state_dir.join("attachments/damaged").join(id).is_dir());
    ok(&d, &call("DEL", id, &ns).run(&d));
}

/// After a DEL that fell back (the delegate cache was damaged), libcni's
/// result caches of that container go once the DEL succeeded, and only
/// its: not those of containers whose ids start or end like its own; a
/// result cache that is a symbolic link is moved aside, never followed.
#[test]
fn a_fallback_del_should_remove_the_containers_result_caches_and_no_one_elses() {
    let n = Node::new("mc-fbres");
    let (br1, br2) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    let main = cluster(&n.e, "mf-main", &br1, &s1);
    let nets = || {
        [
            Net::list(&main),
            Net::single("default", &extra(&n.e, "mf-extra", &br2, &s2)),
        ]
    };
    let (ns_a, ns_longer, ns_ending) = (Netns::new(), Netns::new(), Netns::new());
    // "mf-a-2" starts like "mf-a", "x-mf-a" ends like it; network names
    // hold '-' too.
    n.multus_add("mf-a", &ns_a, &nets());
    n.multus_add("mf-a-2", &ns_longer, &nets());
    n.multus_add("x-mf-a", &ns_ending, &nets());
    let others: Vec<(PathBuf, Vec<u8>)> = ["mf-a-2", "x-mf-a"]
        .iter()
        .flat_map(|id| {
            [
                n.result_cache("mf-main", id, "eth0"),
                n.result_cache("mf-extra", id, "net1"),
            ]
        })
        .map(|p| {
            let bytes = fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    // mf-a's delegate cache cut short, and its primary's result cache a
    // symbolic link to a file elsewhere.
    let whole = fs::read(n.delegate_cache("mf-a")).unwrap();
    fs::write(n.delegate_cache("mf-a"), &whole[..whole.len() / 2]).unwrap();
    let target = n.e.dir.join("target");
    fs::write(&target, b"not a cache").unwrap();
    let primary = n.result_cache("mf-main", "mf-a", "eth0");
    fs::remove_file(&primary).unwrap();
    symlink(&target, &primary).unwrap();
    let d = n.start("mf-main");

    ok(&d, &call("DEL", "mf-a", &ns_a).run(&d));
    assert!(!ns_a.has_link("eth0"), "{:?}", ns_a.ifaces());
    // Its result caches are gone: the readable one removed, the link
    // moved aside as it was, its target untouched.
    assert!(!n.result_cache("mf-extra", "mf-a", "net1").exists());
    assert!(fs::symlink_metadata(&primary).is_err(), "link left");
    let aside = n.damaged("mf-a");
    let link = aside
        .iter()
        .find(|p| {
            p.to_string_lossy()
                .ends_with(".multus-results-mf-main-mf-a-eth0")
        })
        .unwrap_or_else(|| panic!("{aside:?}"));
    assert_eq!(fs::read_link(link).unwrap(), target);
    assert_eq!(fs::read(&target).unwrap(), b"not a cache");
    // The others' are as they were, and their DELs work from them.
    for (p, bytes) in &others {
        assert_eq!(&fs::read(p).unwrap(), bytes, "{}", p.display());
    }
    ok(&d, &call("DEL", "mf-a-2", &ns_longer).run(&d));
    ok(&d, &call("DEL", "x-mf-a", &ns_ending).run(&d));
    for ns in [&ns_longer, &ns_ending] {
        assert!(
            !ns.has_link("eth0") && !ns.has_link("net1"),
            "{:?}",
            ns.ifaces()
        );
    }
    assert_eq!(list_dir(&n.cni_dir.join("results")), Vec::<String>::new());
}

/// multus's device-info files: a network's goes with its DEL, as in
/// multus; another container's stays; one that is a symbolic link is left
/// as it is, and its target survives.
#[test]
fn del_should_remove_a_multus_containers_device_info_files_and_follow_no_link() {
    let n = Node::new("mc-devinfo");
    let (br1, br2) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    let main = cluster(&n.e, "mv-main", &br1, &s1);
    let nets = || {
        [
            Net::list(&main),
            Net::single("default", &extra(&n.e, "mv-sriov", &br2, &s2)).with_device("0000:18:02.5"),
        ]
    };
    let (ns_a, ns_b, ns_c) = (Netns::new(), Netns::new(), Netns::new());
    n.multus_add("mv-a", &ns_a, &nets());
    n.multus_add("mv-b", &ns_b, &nets());
    n.multus_add("mv-c", &ns_c, &nets());
    let [_, sriov] = nets();
    let info = |id: &str| n.device_info(&sriov, id, "net1");
    assert!(info("mv-a").ends_with("cni/default-mv-sriov-mv-a_net1"));
    assert!(info("mv-a").is_file() && info("mv-b").is_file());
    // mv-c's is a link to a file elsewhere.
    let target = n.e.dir.join("target");
    fs::write(&target, b"keep").unwrap();
    fs::remove_file(info("mv-c")).unwrap();
    symlink(&target, info("mv-c")).unwrap();
    let d = n.start("mv-main");

    ok(&d, &call("DEL", "mv-a", &ns_a).run(&d));
    assert!(!ns_a.has_link("net1"), "{:?}", ns_a.ifaces());
    assert!(!info("mv-a").exists(), "mv-a's device-info file left");
    assert!(info("mv-b").is_file(), "mv-b's device-info file removed");

    ok(&d, &call("DEL", "mv-c", &ns_c).run(&d));
    assert!(!ns_c.has_link("net1"), "{:?}", ns_c.ifaces());
    assert_eq!(fs::read_link(info("mv-c")).unwrap(), target);
    assert_eq!(fs::read(&target).unwrap(), b"keep");
    assert!(info("mv-b").is_file(), "mv-b's device-info file removed");

    ok(&d, &call("DEL", "mv-b", &ns_b).run(&d));
    assert!(!info("mv-b").exists(), "mv-b's device-info file left");
    assert!(n.e.reservations("mv-sriov").is_empty());
}
