//! The daemon's CNI engine with Debian's real plugins (/usr/lib/cni):
//! runtime -> plexus-shim -> plexusd -> bridge/host-local/loopback/macvlan/
//! ptp, checked against what the kernel and host-local's store show.
//! Needs root and iproute2.

use std::fs;

use crate::support::cni::{
    address, assert_sandbox_iface, bare, bridge, cni, conflist, failed, ok, Call, Engine,
};
use crate::support::netns::{bridge_ports, host_link_exists, Link, Netns, Subnet};

/// Asserts `ns` has `ifname` up with exactly the address the result gave.
fn assert_addressed(ns: &Netns, ifname: &str, addr: &str) {
    let iface = ns
        .iface(ifname)
        .unwrap_or_else(|| panic!("{ifname} missing in {}: {:?}", ns.name, ns.ifaces()));
    assert!(iface.up, "{ifname} is not up: {iface:?}");
    assert!(iface.has_addr(addr), "{ifname} lacks {addr}: {iface:?}");
}

#[test]
fn bridge_with_host_local_should_add_check_and_del() {
    let e = Engine::new("cni-bridge");
    // Made here with a fixed MAC, so that CHECK of one container survives
    // the removal of another's veth (see Link::bridge).
    let br = Link::bridge();
    let subnet = Subnet::new();
    let net = "bridge-net";
    e.write_network(
        "10-bridge.conflist",
        &conflist(net, "1.0.0", vec![bridge(&br.name, e.host_local(&subnet))]),
    );
    let (ns_a, ns_b) = (Netns::new(), Netns::new());
    let d = e.start("d", net, "10s");

    // ADD: an addressed eth0 in each netns, a veth each on the bridge.
    let ra = ok(&d, &cni(&d, "ADD", "ctr-a", &ns_a, "eth0"));
    let rb = ok(&d, &cni(&d, "ADD", "ctr-b", &ns_b, "eth0"));
    assert_eq!(ra["cniVersion"], "1.0.0", "{ra}");
    let (addr_a, addr_b) = (address(&ra), address(&rb));
    assert!(subnet.holds(&addr_a), "{addr_a} not in {}", subnet.cidr());
    assert!(subnet.holds(&addr_b), "{addr_b} not in {}", subnet.cidr());
    assert_ne!(addr_a, addr_b);
    assert_sandbox_iface(&ra, "eth0", &ns_a);
    assert_addressed(&ns_a, "eth0", &addr_a);
    assert_addressed(&ns_b, "eth0", &addr_b);
    let ports = bridge_ports(&br.name);
    assert_eq!(ports.len(), 2, "{ports:?}");
    assert!(ports.iter().all(|p| p.starts_with("veth")), "{ports:?}");
    assert!(e.record("ctr-a").is_file(), "records: {:?}", e.records());
    assert!(e.record("ctr-b").is_file(), "records: {:?}", e.records());
    let mut held = e.reservations(net);
    held.sort();
    let mut want = vec![bare(&addr_a), bare(&addr_b)];
    want.sort();
    assert_eq!(held, want);

    // CHECK with the recorded result; then break a's interface.
    ok(&d, &cni(&d, "CHECK", "ctr-a", &ns_a, "eth0"));
    ns_a.del_link("eth0");
    let (_, msg, _) = failed(&d, &cni(&d, "CHECK", "ctr-a", &ns_a, "eth0"));
    assert!(
        msg.contains("\"bridge\""),
        "msg should name the plugin: {msg}"
    );
    ok(&d, &cni(&d, "CHECK", "ctr-b", &ns_b, "eth0"));

    // DEL a: its reservation goes, b's stays.
    ok(&d, &cni(&d, "DEL", "ctr-a", &ns_a, "eth0"));
    assert_eq!(e.reservations(net), vec![bare(&addr_b)]);
    assert!(!e.record("ctr-a").exists());
    assert_eq!(bridge_ports(&br.name).len(), 1);

    // DEL b with everything still in place.
    ok(&d, &cni(&d, "DEL", "ctr-b", &ns_b, "eth0"));
    assert!(!ns_b.has_link("eth0"), "{:?}", ns_b.ifaces());
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());

    // DEL is idempotent.
    ok(&d, &cni(&d, "DEL", "ctr-a", &ns_a, "eth0"));
    ok(&d, &cni(&d, "DEL", "ctr-b", &ns_b, "eth0"));
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn loopback_should_bring_lo_up_and_del_should_take_it_down() {
    let e = Engine::new("cni-lo");
    e.write_network(
        "lo.conflist",
        &conflist(
            "lo-net",
            "1.0.0",
            vec![serde_json::json!({"type": "loopback"})],
        ),
    );
    let ns = Netns::new();
    let d = e.start("d", "lo-net", "10s");
    assert!(!ns.iface("lo").unwrap().up, "a new netns has lo down");

    let r = ok(&d, &cni(&d, "ADD", "ctr-lo", &ns, "lo"));
    assert_eq!(address(&r), "127.0.0.1/8", "{r}");
    assert_sandbox_iface(&r, "lo", &ns);
    assert_addressed(&ns, "lo", "127.0.0.1/8");
    assert!(e.record("ctr-lo").is_file());

    ok(&d, &cni(&d, "DEL", "ctr-lo", &ns, "lo"));
    assert!(
        !ns.iface("lo").unwrap().up,
        "lo still up: {:?}",
        ns.ifaces()
    );
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn macvlan_with_host_local_should_add_and_del() {
    let e = Engine::new("cni-macvlan");
    let master = Link::dummy_or_veth();
    let subnet = Subnet::new();
    let net = "macvlan-net";
    e.write_network(
        "20-macvlan.conflist",
        &conflist(
            net,
            "1.0.0",
            vec![serde_json::json!({
                "type": "macvlan",
                "master": master.name,
                "mode": "bridge",
                "ipam": e.host_local(&subnet),
            })],
        ),
    );
    let ns = Netns::new();
    let d = e.start("d", net, "10s");

    let r = ok(&d, &cni(&d, "ADD", "ctr-mv", &ns, "net1"));
    let addr = address(&r);
    assert!(subnet.holds(&addr), "{addr} not in {}", subnet.cidr());
    assert_sandbox_iface(&r, "net1", &ns);
    assert_addressed(&ns, "net1", &addr);
    assert!(!ns.has_link("eth0"));
    assert_eq!(e.reservations(net), vec![bare(&addr)]);

    ok(&d, &cni(&d, "DEL", "ctr-mv", &ns, "net1"));
    assert!(!ns.has_link("net1"), "{:?}", ns.ifaces());
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert!(host_link_exists(&master.name), "the master must stay");
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn ptp_with_host_local_should_add_and_del_both_ends() {
    let e = Engine::new("cni-ptp");
    let subnet = Subnet::new();
    let net = "ptp-net";
    // Selected by absolute path rather than by name.
    let file = e.write_network(
        "30-ptp.conflist",
        &conflist(
            net,
            "1.0.0",
            vec![serde_json::json!({"type": "ptp", "ipam": e.host_local(&subnet)})],
        ),
    );
    let ns = Netns::new();
    let d = e.start("d", file.to_str().unwrap(), "10s");

    let r = ok(&d, &cni(&d, "ADD", "ctr-ptp", &ns, "eth0"));
    let addr = address(&r);
    assert!(subnet.holds(&addr), "{addr} not in {}", subnet.cidr());
    assert_sandbox_iface(&r, "eth0", &ns);
    assert_addressed(&ns, "eth0", &addr);
    let host_veth = r["interfaces"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i.get("sandbox").is_none()))
        .and_then(|i| i["name"].as_str())
        .unwrap_or_else(|| panic!("no host interface in {r}"))
        .to_string();
    assert!(
        host_link_exists(&host_veth),
        "{host_veth} missing on the host"
    );

    ok(&d, &cni(&d, "DEL", "ctr-ptp", &ns, "eth0"));
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    assert!(
        !host_link_exists(&host_veth),
        "{host_veth} left on the host"
    );
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn conflist_at_1_1_0_should_work_with_plugins_that_stop_at_1_0_0() {
    let e = Engine::new("cni-v110");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "v110-net";
    e.write_network(
        "10-v110.conflist",
        &conflist(net, "1.1.0", vec![bridge(&br.name, e.host_local(&subnet))]),
    );
    let ns = Netns::new();
    let d = e.start("d", net, "10s");

    let call = |cmd: &str| Call::new(cmd, "ctr-v110", &ns, "eth0").version("1.1.0");
    let r = ok(&d, &call("ADD").run(&d));
    assert_eq!(r["cniVersion"], "1.1.0", "{r}");
    let addr = address(&r);
    assert!(subnet.holds(&addr), "{addr} not in {}", subnet.cidr());
    assert_sandbox_iface(&r, "eth0", &ns);
    assert_addressed(&ns, "eth0", &addr);

    ok(&d, &call("CHECK").run(&d));
    ok(&d, &call("DEL").run(&d));
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn del_should_work_from_the_record_after_the_config_file_is_gone() {
    let e = Engine::new("cni-noconf");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "gone-net";
    let file = e.write_network(
        "10-gone.conflist",
        &conflist(net, "1.0.0", vec![bridge(&br.name, e.host_local(&subnet))]),
    );
    let ns = Netns::new();
    let d = e.start("d", net, "10s");

    let r = ok(&d, &cni(&d, "ADD", "ctr-gone", &ns, "eth0"));
    let addr = address(&r);
    assert_addressed(&ns, "eth0", &addr);
    assert_eq!(e.reservations(net), vec![bare(&addr)]);

    fs::remove_file(&file).unwrap();
    ok(&d, &cni(&d, "DEL", "ctr-gone", &ns, "eth0"));
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn single_plugin_conf_file_should_load_as_a_one_plugin_list() {
    let e = Engine::new("cni-conf");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "conf-net";
    e.write_network(
        "50-single.conf",
        &serde_json::json!({
            "cniVersion": "1.0.0",
            "name": net,
            "type": "bridge",
            "bridge": br.name,
            "ipam": e.host_local(&subnet),
        }),
    );
    let ns = Netns::new();
    let d = e.start("d", net, "10s");

    let r = ok(&d, &cni(&d, "ADD", "ctr-conf", &ns, "eth0"));
    let addr = address(&r);
    assert!(subnet.holds(&addr), "{addr} not in {}", subnet.cidr());
    assert_sandbox_iface(&r, "eth0", &ns);
    assert_addressed(&ns, "eth0", &addr);
    assert_eq!(bridge_ports(&br.name).len(), 1);
    ok(&d, &cni(&d, "CHECK", "ctr-conf", &ns, "eth0"));

    ok(&d, &cni(&d, "DEL", "ctr-conf", &ns, "eth0"));
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(e.records(), Vec::<String>::new());
}
