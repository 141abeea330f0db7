//! NetworkAttachmentDefinitions with a `resourceName`, with Debian's
//! plugins: each takes the pod's next device of its resource from the
//! kubelet (the pod-resources gRPC API on its socket, else the device
//! checkpoint), the device ID reaches the network's config and capability
//! arguments, the device plugin's device-info file is copied to the
//! network's and shown in network-status, and DEL removes it. The kubelet
//! is asked once per ADD, only when a network names a resource, and when
//! it fails or stalls the ADD fails and leaves nothing.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, failed, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::kube::{pod_args, FakeApi, NODE};
use crate::support::kubelet::FakeKubelet;
use crate::support::netns::{interfaces, Link, Netns, Subnet};

const RESOURCE: &str = "example.com/nic";
const DEV_A: &str = "0000:00:0a.0";
const DEV_B: &str = "0000:00:0b.0";

/// A node: the cluster network in confDir and NADs `ns1/red` and
/// `ns1/blue` (both naming [`RESOURCE`]) and `ns1/plain` (none), each on a
/// bridge of its own. The kubelet's socket, checkpoint and the
/// device-info directory are inside the test dir.
struct Node {
    engine: Engine,
    api: FakeApi,
    daemon: Daemon,
    socket: PathBuf,
    checkpoint: PathBuf,
    devinfo: PathBuf,
    subnets: Vec<Subnet>,
    _links: Vec<Link>,
}

/// `before_start` runs once the paths exist and before the daemon starts
/// (to start a kubelet or write a checkpoint).
fn node<T>(tag: &str, annotation: &str, before_start: impl FnOnce(&Node0) -> T) -> (Node, T) {
    let engine = Engine::new(tag);
    let links: Vec<Link> = (0..4).map(|_| Link::planned("b")).collect();
    let subnets: Vec<Subnet> = (0..4).map(|_| Subnet::new()).collect();
    let net = |i: usize, name: &str| {
        let mut plugin = bridge(&links[i].name, engine.host_local(&subnets[i]));
        plugin["capabilities"] = json!({"deviceID": true});
        conflist(name, "1.0.0", vec![plugin])
    };
    engine.write_network("10-cluster.conflist", &net(0, "cluster"));
    let api = FakeApi::start();
    let with_resource = json!({"k8s.v1.cni.cncf.io/resourceName": RESOURCE});
    api.put_nad(
        "ns1",
        "red",
        Some(&net(1, "red-net").to_string()),
        with_resource.clone(),
    );
    api.put_nad(
        "ns1",
        "blue",
        Some(&net(2, "blue-net").to_string()),
        with_resource,
    );
    api.put_nad(
        "ns1",
        "plain",
        Some(&net(3, "plain-net").to_string()),
        json!({}),
    );
    api.put_pod(
        "ns1",
        "p",
        "uid-p",
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": annotation}),
    );
    api.put_pod(
        "ns1",
        "q",
        "uid-q",
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": "red"}),
    );
    let n0 = Node0 {
        socket: engine.dir.join("kubelet.sock"),
        checkpoint: engine.dir.join("kubelet_internal_checkpoint"),
        devinfo: engine.dir.join("devinfo"),
    };
    std::fs::create_dir_all(n0.devinfo.join("dp")).unwrap();
    let extra = before_start(&n0);
    let mut config = engine.config("cluster", "20s");
    config["podResourcesSocket"] = json!(n0.socket);
    config["deviceCheckpointFile"] = json!(n0.checkpoint);
    config["deviceInfoDir"] = json!(n0.devinfo);
    let daemon = api.start_daemon(&engine.dir, config, "1s");
    (
        Node {
            engine,
            api,
            daemon,
            socket: n0.socket,
            checkpoint: n0.checkpoint,
            devinfo: n0.devinfo,
            subnets,
            _links: links,
        },
        extra,
    )
}

/// The node's paths before it starts.
struct Node0 {
    socket: PathBuf,
    checkpoint: PathBuf,
    devinfo: PathBuf,
}

fn call(command: &str, id: &str, ns: &Netns) -> Call {
    Call::new(command, id, ns, "eth0").args(&pod_args("ns1", "p", "uid-p"))
}

/// The recorded delegate of interface `ifname`.
fn delegate(n: &Node, id: &str, ifname: &str) -> Value {
    let record: Value =
        serde_json::from_slice(&std::fs::read(n.engine.record(id)).unwrap()).unwrap();
    record["attachments"][0]["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["ifname"] == ifname)
        .unwrap_or_else(|| panic!("no {ifname} delegate in {record}"))
        .clone()
}

/// The network-status entry of interface `ifname`.
fn status_entry(n: &Node, ifname: &str) -> Value {
    let text = n.api.network_status("ns1", "p").expect("no network-status");
    let v: Value = serde_json::from_str(&text).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|e| e["interface"] == ifname)
        .unwrap_or_else(|| panic!("no {ifname} in {text}"))
        .clone()
}

fn device_ids(d: &Value) -> (Value, Value, Value) {
    let plugin = &d["config"]["plugins"][0];
    (
        plugin["deviceID"].clone(),
        plugin["pciBusID"].clone(),
        d["capabilityArgs"]["deviceID"].clone(),
    )
}

#[test]
fn networks_naming_a_resource_should_take_the_pods_devices_in_order() {
    let (n, kubelet) = node("k8s-dev-order", "red,plain,blue", |n0| {
        let k = FakeKubelet::start(&n0.socket);
        // Two containers; the IDs come unsorted, the assignment is sorted.
        k.set_pod(
            "ns1",
            "p",
            &[&[(RESOURCE, &[DEV_B])], &[(RESOURCE, &[DEV_A])]],
        );
        // Another pod of the same name elsewhere is not this pod.
        k.set_pod("ns2", "p", &[&[(RESOURCE, &["0000:00:01.0"])]]);
        // The device plugin wrote device information for DEV_A only.
        std::fs::write(
            n0.devinfo
                .join("dp")
                .join(format!("example.com-nic-{DEV_A}-device.json")),
            r#"{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:00:0a.0"}}"#,
        )
        .unwrap();
        k
    });
    let ns = Netns::new();
    let id = "k8sdevorder1";
    ok(&n.daemon, &call("ADD", id, &ns).run(&n.daemon));

    // Real interfaces with addresses from each network's subnet.
    let got = interfaces(&ns);
    let names: Vec<&str> = got.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(names, ["eth0", "net1", "net2", "net3"], "{got:?}");
    for (i, subnet) in [(1, &n.subnets[1]), (2, &n.subnets[3]), (3, &n.subnets[2])] {
        assert!(
            got[i].1.iter().any(|a| subnet.holds(a)),
            "{}: {got:?}",
            got[i].0
        );
    }

    // red (net1) took DEV_A, blue (net3) DEV_B; plain (net2) none.
    let red = delegate(&n, id, "net1");
    let blue = delegate(&n, id, "net3");
    let plain = delegate(&n, id, "net2");
    assert_eq!(
        device_ids(&red),
        (json!(DEV_A), json!(DEV_A), json!(DEV_A)),
        "{red}"
    );
    assert_eq!(
        device_ids(&blue),
        (json!(DEV_B), json!(DEV_B), json!(DEV_B)),
        "{blue}"
    );
    assert_eq!(
        device_ids(&plain),
        (Value::Null, Value::Null, Value::Null),
        "{plain}"
    );
    assert_eq!(kubelet.calls(), 1, "the kubelet is asked once per ADD");

    // The device plugin's file became red's device-info file, and
    // network-status shows it; blue has none.
    let red_file = n.devinfo.join("cni").join(format!("ns1-red-{id}_net1"));
    assert_eq!(
        red["capabilityArgs"]["CNIDeviceInfoFile"],
        json!(red_file),
        "{red}"
    );
    assert!(red_file.exists());
    assert!(!n
        .devinfo
        .join("cni")
        .join(format!("ns1-blue-{id}_net3"))
        .exists());
    assert_eq!(
        status_entry(&n, "net1")["device-info"],
        json!({"type": "pci", "version": "1.1.0", "pci": {"pci-address": DEV_A}})
    );
    assert!(status_entry(&n, "net3").get("device-info").is_none());
    assert!(status_entry(&n, "net2").get("device-info").is_none());

    // DEL: interfaces gone, the network's file gone, the plugin's kept.
    ok(&n.daemon, &call("DEL", id, &ns).run(&n.daemon));
    assert!(interfaces(&ns).is_empty(), "{:?}", interfaces(&ns));
    assert!(!red_file.exists());
    assert!(n
        .devinfo
        .join("dp")
        .join(format!("example.com-nic-{DEV_A}-device.json"))
        .exists());
    assert_eq!(kubelet.calls(), 1, "DEL needs no kubelet");
    assert!(!n.checkpoint.exists());
}

#[test]
fn the_checkpoint_should_serve_when_the_kubelet_socket_is_absent() {
    let (n, ()) = node("k8s-dev-ckpt", "blue,red", |n0| {
        let entries = json!({"Data": {"PodDeviceEntries": [
            {"PodUID": "uid-p", "ContainerName": "c", "ResourceName": RESOURCE,
             "DeviceIDs": {"1": [DEV_B], "0": [DEV_A]}, "AllocResp": "CgA="},
            {"PodUID": "uid-other", "ContainerName": "c", "ResourceName": RESOURCE,
             "DeviceIDs": {"0": ["0000:00:01.0"]}, "AllocResp": "CgA="}
        ], "RegisteredDevices": {RESOURCE: [DEV_A, DEV_B, "0000:00:01.0"]}}, "Checksum": 42});
        std::fs::write(&n0.checkpoint, entries.to_string()).unwrap();
    });
    assert!(!n.socket.exists());
    let ns = Netns::new();
    let id = "k8sdevckpt1";
    ok(&n.daemon, &call("ADD", id, &ns).run(&n.daemon));
    // In network order: blue (net1) first.
    assert_eq!(device_ids(&delegate(&n, id, "net1")).0, json!(DEV_A));
    assert_eq!(device_ids(&delegate(&n, id, "net2")).0, json!(DEV_B));
    ok(&n.daemon, &call("DEL", id, &ns).run(&n.daemon));
    assert!(interfaces(&ns).is_empty());
}

#[test]
fn pods_without_resource_networks_should_not_need_the_kubelet() {
    // Neither a socket nor a checkpoint: not needed.
    let (n, ()) = node("k8s-dev-none", "plain", |_| ());
    let ns = Netns::new();
    let id = "k8sdevnone1";
    ok(&n.daemon, &call("ADD", id, &ns).run(&n.daemon));
    assert_eq!(interfaces(&ns).len(), 2);
    assert_eq!(device_ids(&delegate(&n, id, "net1")).0, Value::Null);
    ok(&n.daemon, &call("DEL", id, &ns).run(&n.daemon));
    // A resource network with no kubelet data at all fails clearly.
    let ns2 = Netns::new();
    let q = Call::new("ADD", "k8sdevnone2", &ns2, "eth0").args(&pod_args("ns1", "q", "uid-q"));
    let (_, msg, _) = failed(&n.daemon, &q.run(&n.daemon));
    assert!(msg.contains("checkpoint"), "{msg}");
    assert!(msg.contains(RESOURCE), "{msg}");
    assert!(interfaces(&ns2).is_empty());
    assert!(!n.engine.record("k8sdevnone2").exists());
}

#[test]
fn a_kubelet_that_fails_or_stalls_should_fail_the_add_and_leave_nothing() {
    let (n, kubelet) = node("k8s-dev-fail", "red", |n0| {
        let k = FakeKubelet::start(&n0.socket);
        k.set_pod("ns1", "p", &[&[(RESOURCE, &[DEV_A])]]);
        k
    });
    let ns = Netns::new();
    let id = "k8sdevfail1";

    kubelet.fail_with(14, "kubelet is restarting");
    let (code, msg, _) = failed(&n.daemon, &call("ADD", id, &ns).run(&n.daemon));
    assert!(msg.contains("kubelet is restarting"), "{code}: {msg}");
    assert!(msg.contains(RESOURCE), "{msg}");
    assert!(interfaces(&ns).is_empty());
    assert!(!n.engine.record(id).exists());

    // A stall is bounded by kubernetesRequestTimeout: try again later.
    kubelet.stall(true);
    let (code, msg, _) = failed(&n.daemon, &call("ADD", id, &ns).run(&n.daemon));
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("did not answer"), "{msg}");
    assert!(interfaces(&ns).is_empty());
    assert!(!n.engine.record(id).exists());

    // The kubelet back: the retry attaches.
    kubelet.stall(false);
    kubelet.succeed();
    ok(&n.daemon, &call("ADD", id, &ns).run(&n.daemon));
    assert_eq!(device_ids(&delegate(&n, id, "net1")).0, json!(DEV_A));
    ok(&n.daemon, &call("DEL", id, &ns).run(&n.daemon));
    assert!(interfaces(&ns).is_empty());
}
