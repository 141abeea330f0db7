//! Devices from Dynamic Resource Allocation, with Debian's plugins and the
//! test API server serving resource.k8s.io/v1 ResourceClaims and
//! ResourceSlices as the real one does: a NAD whose `resourceName` the
//! kubelet's device plugins do not serve takes the pod's next device of
//! its claims whose driver published that resource name, with the same
//! device-info handling as a device plugin's device. One LIST of the
//! namespace's claims per such ADD; the slices come from a watch of this
//! node's, started on first use.

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, failed, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::kube::{pod_args, FakeApi, SliceDevice, NODE};
use crate::support::kubelet::FakeKubelet;
use crate::support::netns::{interfaces, Link, Netns, Subnet};

const RESOURCE: &str = "example.com/vf";
const DRIVER: &str = "sriov.example.com";
const VF3: &str = "0000:3b:02.3";
const VF4: &str = "0000:3b:02.4";
const VF9: &str = "0000:3b:02.9";

/// A node: the cluster network in confDir and NADs `ns1/vf-a` and
/// `ns1/vf-b` naming [`RESOURCE`], each on a bridge of its own; a kubelet
/// whose device plugins gave the pods nothing; this node's SR-IOV slice
/// (vf-3, vf-4, vf-9) and a GPU slice, and another node's slice whose pool
/// and device names collide with this node's.
struct Node {
    engine: Engine,
    api: FakeApi,
    daemon: Daemon,
    kubelet: FakeKubelet,
    devinfo: std::path::PathBuf,
    subnets: Vec<Subnet>,
    _links: Vec<Link>,
}

fn node(tag: &str) -> Node {
    let engine = Engine::new(tag);
    let links: Vec<Link> = (0..3).map(|_| Link::planned("b")).collect();
    let subnets: Vec<Subnet> = (0..3).map(|_| Subnet::new()).collect();
    let net = |i: usize, name: &str| {
        let mut plugin = bridge(&links[i].name, engine.host_local(&subnets[i]));
        plugin["capabilities"] = json!({"deviceID": true});
        conflist(name, "1.0.0", vec![plugin])
    };
    engine.write_network("10-cluster.conflist", &net(0, "cluster"));
    let api = FakeApi::start();
    let with_resource = json!({"k8s.v1.cni.cncf.io/resourceName": RESOURCE});
    for (i, name) in [(1, "vf-a"), (2, "vf-b")] {
        let config = net(i, &format!("{name}-net")).to_string();
        api.put_nad("ns1", name, Some(&config), with_resource.clone());
    }
    let networks = |a: &str| json!({"k8s.v1.cni.cncf.io/networks": a});
    api.put_pod("ns1", "p", "uid-p", NODE, networks("vf-a,vf-b"));
    api.put_pod("ns1", "q", "uid-q", NODE, networks("vf-a"));

    let vf = |name, id| SliceDevice {
        name,
        device_id: Some(id),
        resource_name: Some(RESOURCE),
    };
    api.put_slice(
        "node-1-sriov-x8d2k",
        NODE,
        (DRIVER, NODE),
        &[vf("vf-3", VF3), vf("vf-4", VF4), vf("vf-9", VF9)],
    );
    let gpu = SliceDevice {
        name: "gpu-0",
        device_id: None,
        resource_name: None,
    };
    api.put_slice("node-1-gpu-p2m4z", NODE, ("gpu.example.com", NODE), &[gpu]);
    // Sorted before this node's: a cache that kept other nodes' slices
    // would find these first.
    api.put_slice(
        "a-node-2-sriov-q7c1v",
        "node-2",
        (DRIVER, NODE),
        &[vf("vf-3", "0000:99:00.3"), vf("vf-4", "0000:99:00.4")],
    );
    // p's claim: two VFs (listed unsorted) and a GPU; q's: one VF.
    api.put_claim(
        "ns1",
        "p-nic-7xk2q",
        ("p", "uid-p"),
        NODE,
        &[
            (DRIVER, NODE, "vf-4"),
            ("gpu.example.com", NODE, "gpu-0"),
            (DRIVER, NODE, "vf-3"),
        ],
    );
    api.put_claim(
        "ns1",
        "q-nic-m3r8w",
        ("q", "uid-q"),
        NODE,
        &[(DRIVER, NODE, "vf-9")],
    );

    let socket = engine.dir.join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket);
    let devinfo = engine.dir.join("devinfo");
    std::fs::create_dir_all(devinfo.join("dp")).unwrap();
    let mut config = engine.config("cluster", "20s");
    config["podResourcesSocket"] = json!(socket);
    config["deviceInfoDir"] = json!(devinfo);
    let daemon = api.start_daemon(&engine.dir, config, "1s");
    Node {
        engine,
        api,
        daemon,
        kubelet,
        devinfo,
        subnets,
        _links: links,
    }
}

fn call(command: &str, id: &str, pod: &str, ns: &Netns) -> Call {
    Call::new(command, id, ns, "eth0").args(&pod_args("ns1", pod, &format!("uid-{pod}")))
}

/// The recorded delegate of interface `ifname`: its device IDs (config,
/// `pciBusID`, capability argument) and device-info file.
fn device_of(n: &Node, id: &str, ifname: &str) -> (Value, Value, Value, Value) {
    let record: Value =
        serde_json::from_slice(&std::fs::read(n.engine.record(id)).unwrap()).unwrap();
    let d = record["attachments"][0]["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["ifname"] == ifname)
        .unwrap_or_else(|| panic!("no {ifname} delegate in {record}"))
        .clone();
    let plugin = &d["config"]["plugins"][0];
    (
        plugin["deviceID"].clone(),
        plugin["pciBusID"].clone(),
        d["capabilityArgs"]["deviceID"].clone(),
        d["capabilityArgs"]["CNIDeviceInfoFile"].clone(),
    )
}

/// The DRA requests since `from` (an index into [`FakeApi::dra_requests`]):
/// ("claims" | "slices", namespace path part or query).
fn dra_since(n: &Node, from: usize) -> Vec<(String, String, String)> {
    n.api.dra_requests().split_off(from)
}

#[test]
fn a_network_should_take_the_devices_of_the_pods_claims() {
    let n = node("k8s-dra");
    // The device driver wrote device information for VF3.
    std::fs::write(
        n.devinfo
            .join("dp")
            .join(format!("example.com-vf-{VF3}-device.json")),
        format!(r#"{{"type":"pci","version":"1.1.0","pci":{{"pci-address":"{VF3}"}}}}"#),
    )
    .unwrap();
    let ns = Netns::new();
    let id = "k8sdra1";
    ok(&n.daemon, &call("ADD", id, "p", &ns).run(&n.daemon));

    // Real interfaces, each with an address of its network.
    let got = interfaces(&ns);
    let names: Vec<&str> = got.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(names, ["eth0", "net1", "net2"], "{got:?}");
    for i in 0..3 {
        assert!(
            got[i].1.iter().any(|a| n.subnets[i].holds(a)),
            "{}: {got:?}",
            got[i].0
        );
    }
    // In network order, sorted: vf-a VF3, vf-b VF4; never the other
    // node's IDs, never the GPU.
    let info = n.devinfo.join("cni").join(format!("ns1-vf-a-{id}_net1"));
    assert_eq!(
        device_of(&n, id, "net1"),
        (json!(VF3), json!(VF3), json!(VF3), json!(info))
    );
    assert_eq!(device_of(&n, id, "net2").0, json!(VF4));
    // The driver's device information became the network's, in
    // network-status too.
    assert!(info.exists());
    let status: Value =
        serde_json::from_str(&n.api.network_status("ns1", "p").expect("network-status")).unwrap();
    let net1 = status
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["interface"] == "net1")
        .expect("net1 in network-status");
    assert_eq!(net1["device-info"]["pci"]["pci-address"], VF3);

    // One LIST of the namespace's claims; the node's slices, selected by
    // the API server, listed once and then watched.
    let dra = dra_since(&n, 0);
    let claims: Vec<_> = dra
        .iter()
        .filter(|r| r.1.ends_with("/resourceclaims"))
        .collect();
    assert_eq!(claims.len(), 1, "{dra:?}");
    assert_eq!(
        claims[0].1,
        "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims"
    );
    let slices: Vec<_> = dra
        .iter()
        .filter(|r| r.1.ends_with("/resourceslices"))
        .collect();
    assert_eq!(slices.len(), 1, "{dra:?}");
    assert!(
        slices[0].2.contains("fieldSelector=spec.nodeName%3Dnode-1"),
        "{slices:?}"
    );
    assert_eq!(n.kubelet.calls(), 1);

    // Another pod: its own claim's device, one more claims LIST, no slice
    // list (the watch has them).
    let ns_q = Netns::new();
    let seen = n.api.dra_requests().len();
    ok(
        &n.daemon,
        &call("ADD", "k8sdra2", "q", &ns_q).run(&n.daemon),
    );
    assert_eq!(device_of(&n, "k8sdra2", "net1").0, json!(VF9));
    let more = dra_since(&n, seen);
    assert_eq!(more.len(), 1, "{more:?}");
    assert!(
        more[0].1.ends_with("/namespaces/ns1/resourceclaims"),
        "{more:?}"
    );

    // DEL asks nothing, and removes the network's device-info file.
    let seen = n.api.dra_requests().len();
    ok(&n.daemon, &call("DEL", id, "p", &ns).run(&n.daemon));
    ok(
        &n.daemon,
        &call("DEL", "k8sdra2", "q", &ns_q).run(&n.daemon),
    );
    assert!(interfaces(&ns).is_empty() && interfaces(&ns_q).is_empty());
    assert!(!info.exists());
    assert_eq!(dra_since(&n, seen), vec![]);
}

#[test]
fn a_new_device_should_reach_the_cache_through_the_watch() {
    let n = node("k8s-dra-watch");
    let ns = Netns::new();
    ok(&n.daemon, &call("ADD", "k8sdraw1", "q", &ns).run(&n.daemon));
    assert_eq!(device_of(&n, "k8sdraw1", "net1").0, json!(VF9));
    ok(&n.daemon, &call("DEL", "k8sdraw1", "q", &ns).run(&n.daemon));

    // The driver publishes a new VF and the scheduler gives it to a new
    // pod r: the watch brings it, no list again.
    let listed = n.api.dra_requests().len();
    let vf = |name, id| SliceDevice {
        name,
        device_id: Some(id),
        resource_name: Some(RESOURCE),
    };
    n.api.put_slice(
        "node-1-sriov-x8d2k",
        NODE,
        (DRIVER, NODE),
        &[
            vf("vf-3", VF3),
            vf("vf-4", VF4),
            vf("vf-9", VF9),
            vf("vf-12", "0000:3b:03.4"),
        ],
    );
    n.api.put_pod(
        "ns1",
        "r",
        "uid-r",
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": "vf-b"}),
    );
    n.api.put_claim(
        "ns1",
        "r-nic-b5t9n",
        ("r", "uid-r"),
        NODE,
        &[(DRIVER, NODE, "vf-12")],
    );
    let ns_r = Netns::new();
    // The watch event may lag the ADD: the runtime retries until the
    // device is there (a network without it would run without a device).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        ok(
            &n.daemon,
            &call("ADD", "k8sdraw2", "r", &ns_r).run(&n.daemon),
        );
        if device_of(&n, "k8sdraw2", "net1").0 == json!("0000:3b:03.4") {
            break;
        }
        ok(
            &n.daemon,
            &call("DEL", "k8sdraw2", "r", &ns_r).run(&n.daemon),
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the new device never arrived"
        );
    }
    let since = dra_since(&n, listed);
    assert!(
        since.iter().all(|r| r.1.ends_with("/resourceclaims")),
        "the slices were listed again: {since:?}"
    );
    ok(
        &n.daemon,
        &call("DEL", "k8sdraw2", "r", &ns_r).run(&n.daemon),
    );
    assert!(interfaces(&ns_r).is_empty());
}

#[test]
fn unreadable_claims_or_slices_should_fail_the_add_and_leave_nothing() {
    let n = node("k8s-dra-fail");
    let ns = Netns::new();
    let id = "k8sdraf1";

    // Claims refused (no RBAC for them): the ADD fails, naming them.
    n.api.fail_next("/resourceclaims", 403, 1);
    let (code, msg, _) = failed(&n.daemon, &call("ADD", id, "p", &ns).run(&n.daemon));
    assert_ne!(code, 11, "a refusal is not worth retrying: {msg}");
    assert!(msg.contains("ResourceClaims of namespace ns1"), "{msg}");
    assert!(msg.contains(RESOURCE), "{msg}");
    assert!(interfaces(&ns).is_empty());
    assert!(!n.engine.record(id).exists());

    // This node's slices cannot be listed: bounded by
    // kubernetesRequestTimeout, worth retrying, nothing left.
    n.api.fail_next("/resourceslices", 403, 1_000_000);
    let (code, msg, _) = failed(&n.daemon, &call("ADD", id, "p", &ns).run(&n.daemon));
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("ResourceSlices"), "{msg}");
    assert!(
        msg.contains("403") || msg.contains("forbidden") || msg.contains("Forbidden"),
        "{msg}"
    );
    assert!(interfaces(&ns).is_empty());
    assert!(!n.engine.record(id).exists());

    // Allowed again: the runtime's retries attach once the watch lists.
    n.api.clear_failures();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = call("ADD", id, "p", &ns).run(&n.daemon);
        if out.code == Some(0) {
            break;
        }
        let (code, msg, _) = failed(&n.daemon, &out);
        assert_eq!(code, 11, "{msg}");
        assert!(
            std::time::Instant::now() < deadline,
            "never recovered: {msg}"
        );
    }
    assert_eq!(device_of(&n, id, "net1").0, json!(VF3));
    assert_eq!(device_of(&n, id, "net2").0, json!(VF4));
    ok(&n.daemon, &call("DEL", id, "p", &ns).run(&n.daemon));
    assert!(interfaces(&ns).is_empty());
}

#[test]
fn an_api_server_without_dra_should_leave_the_network_without_a_device() {
    let n = node("k8s-dra-none");
    // resource.k8s.io/v1 not served (Kubernetes before 1.34).
    n.api.fail_next("/resourceclaims", 404, 1);
    let ns = Netns::new();
    let id = "k8sdran1";
    ok(&n.daemon, &call("ADD", id, "q", &ns).run(&n.daemon));
    assert_eq!(interfaces(&ns).len(), 2);
    assert_eq!(device_of(&n, id, "net1").0, Value::Null);
    // Nothing asked of the slices: no claim, no device to look up.
    assert!(
        n.api
            .dra_requests()
            .iter()
            .all(|r| !r.1.ends_with("/resourceslices")),
        "{:?}",
        n.api.dra_requests()
    );
    ok(&n.daemon, &call("DEL", id, "q", &ns).run(&n.daemon));
    assert!(interfaces(&ns).is_empty());
}
