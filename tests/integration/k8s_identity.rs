//! Which Kubernetes identity is enough. The test API server authorizes as
//! `--authorization-mode=Node,RBAC` does, with README's ClusterRoles and
//! ClusterRoleBindings read from README.md itself; for each identity README
//! proposes, every Kubernetes feature of plexusd is run with Debian's
//! plugins (networks named by NADs, network-status, pod events, a kubelet
//! device's device-info, DRA devices) and the matrix of what works is
//! checked against README's table. A refused request is logged once per
//! kind, naming the verb, the resource, the identity and the rule to add.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, Call, Engine};
use crate::support::daemon::{poll, Daemon};
use crate::support::kube::{
    cluster_role_bindings_in, cluster_roles_in, pod_args, Authorization, ClusterRole, FakeApi,
    Identity, SliceDevice, Subject, NODE,
};
use crate::support::kubelet::FakeKubelet;
use crate::support::netns::{interfaces, Link, Netns, Subnet};

/// The kubelet's device-plugin resource and its device.
const NIC: &str = "example.com/nic";
const DEV_A: &str = "0000:00:0a.0";
/// The DRA driver's resource, driver and devices.
const VF: &str = "example.com/vf";
const DRIVER: &str = "sriov.example.com";
const VF3: &str = "0000:3b:02.3";
const VF4: &str = "0000:3b:02.4";
/// The service account README binds `plexus` to.
const SA: (&str, &str) = ("kube-system", "plexus");
/// The one line each refused kind of request gets.
const REFUSED: &str = "refused this identity";

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// README's ClusterRole `name`.
fn role(name: &str) -> ClusterRole {
    cluster_roles_in(&readme())
        .into_iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("README has no ClusterRole {name}"))
}

/// README's binding of ClusterRole `name`: its subject.
fn binding(name: &str) -> Subject {
    cluster_role_bindings_in(&readme())
        .into_iter()
        .find(|(r, _)| r == name)
        .unwrap_or_else(|| panic!("README has no ClusterRoleBinding of {name}"))
        .1
}

fn node_identity() -> Identity {
    Identity {
        user: format!("system:node:{NODE}"),
        groups: vec!["system:nodes".into(), "system:authenticated".into()],
    }
}

fn service_account() -> Identity {
    Identity {
        user: format!("system:serviceaccount:{}:{}", SA.0, SA.1),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{}", SA.0),
            "system:authenticated".into(),
        ],
    }
}

/// The features, in the matrix's column order.
const FEATURES: [&str; 5] = [
    "NAD networks",
    "network-status",
    "pod events",
    "device-info",
    "DRA devices",
];

/// A node for one identity: the cluster network in confDir; NADs `ns1/blue`
/// (plain), `ns1/red` ([`NIC`], from the kubelet) and `ns1/vf` ([`VF`], from
/// DRA), each on a bridge of its own; pods `plain` (no networks), `nets`
/// (blue), `dev` (red), `dra` and `dra2` (vf, each with a claim made from a
/// template); the kubelet gives `dev` [`DEV_A`] and wrote its device-info.
struct Node {
    engine: Engine,
    api: FakeApi,
    daemon: Daemon,
    devinfo: std::path::PathBuf,
    subnets: Vec<Subnet>,
    _kubelet: FakeKubelet,
    _links: Vec<Link>,
}

fn node(tag: &str, identity: Identity, authorization: Authorization) -> Node {
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
    let resource = |r: &str| json!({ "k8s.v1.cni.cncf.io/resourceName": r });
    api.put_nad(
        "ns1",
        "blue",
        Some(&net(1, "blue-net").to_string()),
        json!({}),
    );
    api.put_nad(
        "ns1",
        "red",
        Some(&net(2, "red-net").to_string()),
        resource(NIC),
    );
    api.put_nad(
        "ns1",
        "vf",
        Some(&net(3, "vf-net").to_string()),
        resource(VF),
    );
    for (pod, networks) in [
        ("plain", ""),
        ("nets", "blue"),
        ("dev", "red"),
        ("dra", "vf"),
        ("dra2", "vf"),
    ] {
        let annotations = match networks {
            "" => json!({}),
            n => json!({ "k8s.v1.cni.cncf.io/networks": n }),
        };
        api.put_pod("ns1", pod, &format!("uid-{pod}"), NODE, annotations);
    }
    let vf = |name, id| SliceDevice {
        name,
        device_id: Some(id),
        resource_name: Some(VF),
    };
    api.put_slice(
        "node-1-sriov-x8d2k",
        NODE,
        (DRIVER, NODE),
        &[vf("vf-3", VF3), vf("vf-4", VF4)],
    );
    for (pod, claim, device) in [
        ("dra", "dra-nic-7xk2q", "vf-3"),
        ("dra2", "dra2-nic-m3r8w", "vf-4"),
    ] {
        api.put_claim(
            "ns1",
            claim,
            (pod, &format!("uid-{pod}")),
            NODE,
            &[(DRIVER, NODE, device)],
        );
        api.reference_claim("ns1", pod, "nic", claim);
    }
    api.accept_token("test-token", identity);
    api.authorize(authorization);

    let socket = engine.dir.join("kubelet.sock");
    let kubelet = FakeKubelet::start(&socket);
    kubelet.set_pod("ns1", "dev", &[&[(NIC, &[DEV_A])]]);
    let devinfo = engine.dir.join("devinfo");
    std::fs::create_dir_all(devinfo.join("dp")).unwrap();
    std::fs::write(
        devinfo
            .join("dp")
            .join(format!("example.com-nic-{DEV_A}-device.json")),
        format!(r#"{{"type":"pci","version":"1.1.0","pci":{{"pci-address":"{DEV_A}"}}}}"#),
    )
    .unwrap();
    let mut config = engine.config("cluster", "20s");
    config["podResourcesSocket"] = json!(socket);
    config["deviceInfoDir"] = json!(devinfo);
    config["kubernetesSyncTimeout"] = json!("1s");
    let daemon = api.start_daemon(&engine.dir, config, "2s");
    Node {
        engine,
        api,
        daemon,
        devinfo,
        subnets,
        _kubelet: kubelet,
        _links: links,
    }
}

/// ADD of pod `pod` in a netns of its own: whether it succeeded, the
/// netns (kept until the node is dropped) and the container ID.
fn add(n: &Node, pod: &str, keep: &mut Vec<Netns>) -> (bool, String) {
    let ns = Netns::new();
    let id = format!("ident{pod}{}", keep.len());
    let run = Call::new("ADD", &id, &ns, "eth0")
        .args(&pod_args("ns1", pod, &format!("uid-{pod}")))
        .run(&n.daemon);
    let added = run.code == Some(0);
    if !added {
        eprintln!("ADD of {pod}: {}", run.stdout);
    }
    keep.push(ns);
    (added, id)
}

/// The recorded delegate of interface `ifname` of container `id`.
fn delegate(n: &Node, id: &str, ifname: &str) -> Value {
    let record: Value =
        serde_json::from_slice(&std::fs::read(n.engine.record(id)).unwrap()).unwrap();
    record["attachments"][0]["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["ifname"] == ifname)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Whether an `AddedInterface` event about `pod` was posted: waited for
/// until one is stored or every post of an event about it was answered
/// (refused).
fn event_posted(n: &Node, pod: &str) -> bool {
    let posted = || {
        n.api
            .pod_events()
            .iter()
            .any(|e| e["involvedObject"]["name"] == pod && e["reason"] == "AddedInterface")
    };
    let settled = || {
        let about = format!("\"name\":\"{pod}\"");
        let posts: Vec<_> = n
            .api
            .log()
            .into_iter()
            .filter(|r| r.is_event_post() && String::from_utf8_lossy(&r.body).contains(&about))
            .collect();
        !posts.is_empty() && posts.iter().all(|r| r.answered.is_some())
    };
    poll(Duration::from_secs(10), Duration::from_millis(20), || {
        posted() || settled()
    });
    posted()
}

/// Runs every feature once; what worked, in [`FEATURES`] order.
fn features(n: &Node) -> [bool; 5] {
    let mut keep = Vec::new();
    // NAD networks: net1 is blue's, with an address of its subnet.
    let (added, _) = add(n, "nets", &mut keep);
    let nad = added
        && interfaces(keep.last().unwrap())
            .iter()
            .any(|(i, a)| i == "net1" && a.iter().any(|a| n.subnets[1].holds(a)));
    // network-status and pod events, of a pod with the cluster network.
    let (added, _) = add(n, "plain", &mut keep);
    let status = added && !n.api.network_status_names("ns1", "plain").is_empty();
    let events = added && event_posted(n, "plain");
    // The kubelet's device: its device-info became the network's.
    let (added, id) = add(n, "dev", &mut keep);
    let info = n.devinfo.join("cni").join(format!("ns1-red-{id}_net1"));
    let device_info = added
        && delegate(n, &id, "net1")["config"]["plugins"][0]["deviceID"] == DEV_A
        && info.exists();
    // DRA: each pod's network takes the device of its claim.
    let mut dra = true;
    for (pod, want) in [("dra", VF3), ("dra2", VF4)] {
        let (added, id) = add(n, pod, &mut keep);
        dra &= added && delegate(n, &id, "net1")["config"]["plugins"][0]["deviceID"] == want;
    }
    [nad, status, events, device_info, dra]
}

/// The daemon's log lines about refused requests naming `resource`.
fn refused_lines(n: &Node, resource: &str) -> Vec<String> {
    n.daemon
        .log_text()
        .lines()
        .filter(|l| l.contains(REFUSED) && l.contains(resource))
        .map(str::to_string)
        .collect()
}

/// How many requests to paths containing `path` the server refused (403
/// answers are all the authorizer's here: no failure is injected).
fn refusals(n: &Node, path: &str) -> usize {
    let log = n.api.log();
    log.iter()
        .filter(|r| r.path.contains(path) && r.answered.is_some())
        .count()
}

fn print_matrix(rows: &[(&str, [bool; 5])]) {
    let mut text = format!("{:<58}", "identity");
    for f in FEATURES {
        text.push_str(&format!(" | {f:<14}"));
    }
    for (who, row) in rows {
        text.push_str(&format!("\n{who:<58}"));
        for ok in row {
            text.push_str(&format!(" | {:<14}", if *ok { "yes" } else { "no" }));
        }
    }
    println!("{text}");
}

#[test]
fn each_identity_readme_proposes_should_run_exactly_the_features_its_table_says() {
    let node_role = role("plexus-node");
    let plexus = role("plexus");
    // README binds plexus-node to every node and plexus to the service
    // account; the node may also be given plexus.
    let identities = [
        (
            "node kubeconfig, Node authorizer only",
            node_identity(),
            Authorization::node_and_rbac(),
        ),
        (
            "node kubeconfig + plexus-node",
            node_identity(),
            Authorization::node_and_rbac().bind(&node_role, binding("plexus-node")),
        ),
        (
            "node kubeconfig + plexus (bound to group system:nodes)",
            node_identity(),
            Authorization::node_and_rbac().bind(&plexus, Subject::Group("system:nodes".into())),
        ),
        (
            "service account kube-system/plexus + plexus",
            service_account(),
            Authorization::node_and_rbac().bind(&plexus, binding("plexus")),
        ),
    ];
    assert_eq!(
        binding("plexus-node"),
        Subject::Group("system:nodes".into())
    );
    assert_eq!(
        binding("plexus"),
        Subject::ServiceAccount {
            namespace: SA.0.into(),
            name: SA.1.into()
        }
    );
    let mut rows = Vec::new();
    for (i, (who, identity, authorization)) in identities.into_iter().enumerate() {
        let n = node(&format!("k8s-ident{i}"), identity, authorization);
        rows.push((who, features(&n)));
    }
    print_matrix(&rows);
    let all = [true; 5];
    // Without NADs: the cluster network, its network-status and events;
    // the device and DRA networks here are NADs.
    let node_only = [false, true, true, false, false];
    assert_eq!(
        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        vec![node_only, all, all, all],
        "README's table of identities and features"
    );
}

/// The node's own identity without plexus-node: the NAD cache is refused
/// (its watch retries with backoff); a pod that names no NAD is served, one
/// that names a NAD fails saying why; the refusal is logged exactly once,
/// with the rule to add.
#[test]
fn a_refused_nad_list_should_be_logged_once_with_the_rule_to_add() {
    let n = node(
        "k8s-ident-refused",
        node_identity(),
        Authorization::node_and_rbac(),
    );
    let mut keep = Vec::new();
    let (added, _) = add(&n, "plain", &mut keep);
    assert!(added, "a pod that names no NAD needs none");
    let ns = Netns::new();
    let run = Call::new("ADD", "identnets-refused", &ns, "eth0")
        .args(&pod_args("ns1", "nets", "uid-nets"))
        .run(&n.daemon);
    keep.push(ns);
    assert_ne!(run.code, Some(0), "{}", run.stdout);
    for needle in [
        "ns1",
        "blue",
        "cannot be read",
        "forbidden",
        "The identity plexusd uses",
    ] {
        assert!(
            run.stdout.contains(needle),
            "{needle:?} not in {}",
            run.stdout
        );
    }
    // The watch has retried: several refused lists.
    let retried = poll(Duration::from_secs(15), Duration::from_millis(50), || {
        refusals(&n, "network-attachment-definitions") >= 3
    });
    assert!(retried, "{:#?}", n.api.log());
    let lines = refused_lines(&n, "network-attachment-definitions");
    assert_eq!(lines.len(), 1, "{}", n.daemon.log_text());
    let line = &lines[0];
    for needle in [
        "list",
        "system:node:node-1",
        r#"apiGroups: ["k8s.cni.cncf.io"], resources: [network-attachment-definitions], verbs: [list]"#,
        "NetworkAttachmentDefinitions",
        "The identity plexusd uses",
    ] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    // The pods are the node's to read: nothing else was refused.
    let others: Vec<_> = n
        .daemon
        .log_text()
        .lines()
        .filter(|l| l.contains(REFUSED) && !l.contains("network-attachment-definitions"))
        .map(str::to_string)
        .collect();
    assert!(others.is_empty(), "{others:#?}");
}

/// The node's own identity with plexus-node: the LIST of a namespace's
/// ResourceClaims is refused (logged once for two ADDs) and the pods'
/// claims are read one by one instead, as the Node authorizer allows.
#[test]
fn a_node_identity_should_read_its_pods_claims_one_by_one_when_the_list_is_refused() {
    let n = node(
        "k8s-ident-claims",
        node_identity(),
        Authorization::node_and_rbac().bind(&role("plexus-node"), binding("plexus-node")),
    );
    let mut keep = Vec::new();
    for (pod, want) in [("dra", VF3), ("dra2", VF4)] {
        let (added, id) = add(&n, pod, &mut keep);
        assert!(added, "{}", n.daemon.log_text());
        assert_eq!(
            delegate(&n, &id, "net1")["config"]["plugins"][0]["deviceID"],
            want
        );
    }
    let claims: Vec<(String, String)> = n
        .api
        .dra_requests()
        .into_iter()
        .filter(|(_, p, _)| p.contains("resourceclaims"))
        .map(|(m, p, _)| (m, p))
        .collect();
    let list = "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims".to_string();
    assert_eq!(
        claims,
        [
            ("GET".into(), list.clone()),
            ("GET".into(), format!("{list}/dra-nic-7xk2q")),
            ("GET".into(), list.clone()),
            ("GET".into(), format!("{list}/dra2-nic-m3r8w")),
        ]
    );
    let lines = refused_lines(&n, "resourceclaims");
    assert_eq!(lines.len(), 1, "{}", n.daemon.log_text());
    for needle in [
        "list",
        "system:node:node-1",
        r#"apiGroups: ["resource.k8s.io"], resources: [resourceclaims], verbs: [list]"#,
        "Dynamic Resource Allocation",
    ] {
        assert!(lines[0].contains(needle), "{needle:?} not in {}", lines[0]);
    }
}

/// `curl` as `token`: (status, body as JSON).
fn curl(api: &FakeApi, token: &str, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-s",
        "--max-time",
        "10",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ])
    .args(["-H", &format!("Authorization: Bearer {token}")]);
    if let Some(b) = body {
        let ct = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        cmd.args(["-H", &format!("Content-Type: {ct}"), "--data", b]);
    }
    let out = cmd
        .arg(format!("{}{path}", api.url()))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("curl output");
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// The test API server refuses what the Node authorizer and RBAC refuse,
/// in the API server's words, and allows what they allow.
#[test]
fn the_test_api_server_should_authorize_as_the_node_authorizer_and_rbac_do() {
    let api = FakeApi::start();
    api.put_pod("ns1", "mine", "u1", NODE, json!({}));
    api.put_pod("ns1", "other", "u2", "node-2", json!({}));
    api.put_claim(
        "ns1",
        "mine-nic",
        ("mine", "u1"),
        NODE,
        &[(DRIVER, NODE, "vf-3")],
    );
    api.reference_claim("ns1", "mine", "nic", "mine-nic");
    api.put_claim(
        "ns1",
        "other-nic",
        ("other", "u2"),
        "node-2",
        &[(DRIVER, "node-2", "vf-3")],
    );
    api.accept_token("node", node_identity());
    api.accept_token("sa", service_account());
    api.accept_token(
        "stranger",
        Identity {
            user: "jane".into(),
            groups: vec!["system:authenticated".into()],
        },
    );
    api.authorize(Authorization::node_and_rbac().bind(&role("plexus"), binding("plexus")));

    let node_user = r#"User "system:node:node-1""#;
    let refused = |token: &str, method: &str, path: &str, message: &str, details: Value| {
        let (code, body) = curl(
            &api,
            token,
            method,
            path,
            Some("{}").filter(|_| method != "GET"),
        );
        assert_eq!(code, 403, "{method} {path}: {body}");
        assert_eq!(body["reason"], "Forbidden");
        assert_eq!(body["message"], message, "{method} {path}");
        assert_eq!(body["details"], details, "{method} {path}");
    };
    let allowed = |token: &str, method: &str, path: &str, body: Option<&str>| {
        let (code, answer) = curl(&api, token, method, path, body);
        assert!(
            code != 403 && code != 401,
            "{token} {method} {path}: {code} {answer}"
        );
    };
    let nads = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions";
    refused(
        "node",
        "GET",
        nads,
        &format!("network-attachment-definitions.k8s.cni.cncf.io is forbidden: {node_user} cannot list resource \"network-attachment-definitions\" in API group \"k8s.cni.cncf.io\" at the cluster scope"),
        json!({"group": "k8s.cni.cncf.io", "kind": "network-attachment-definitions"}),
    );
    allowed("sa", "GET", nads, None);
    refused(
        "stranger",
        "GET",
        &format!("{nads}?watch=true"),
        "network-attachment-definitions.k8s.cni.cncf.io is forbidden: User \"jane\" cannot watch resource \"network-attachment-definitions\" in API group \"k8s.cni.cncf.io\" at the cluster scope",
        json!({"group": "k8s.cni.cncf.io", "kind": "network-attachment-definitions"}),
    );

    // Pods: the node's own, listed by its name.
    refused(
        "node",
        "GET",
        "/api/v1/pods",
        &format!("pods is forbidden: {node_user} cannot list resource \"pods\" in API group \"\" at the cluster scope: can only list/watch pods with spec.nodeName field selector"),
        json!({"kind": "pods"}),
    );
    allowed(
        "node",
        "GET",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1&watch=true&timeoutSeconds=1",
        None,
    );
    allowed("node", "GET", "/api/v1/namespaces/ns1/pods/mine", None);
    refused(
        "node",
        "GET",
        "/api/v1/namespaces/ns1/pods/other",
        &format!("pods \"other\" is forbidden: {node_user} cannot get resource \"pods\" in API group \"\" in the namespace \"ns1\": no relationship found between node 'node-1' and this object"),
        json!({"name": "other", "kind": "pods"}),
    );
    // pods/status: authorized, then NodeRestriction: own pods only.
    let patch = r#"{"metadata":{"annotations":{"a":"b"}}}"#;
    allowed(
        "node",
        "PATCH",
        "/api/v1/namespaces/ns1/pods/mine/status",
        Some(patch),
    );
    refused(
        "node",
        "PATCH",
        "/api/v1/namespaces/ns1/pods/other/status",
        "pods \"other\" is forbidden: node \"node-1\" can only update pod status for pods with spec.nodeName set to itself",
        json!({"name": "other", "kind": "pods"}),
    );
    allowed(
        "sa",
        "PATCH",
        "/api/v1/namespaces/ns1/pods/other/status",
        Some(patch),
    );
    refused(
        "sa",
        "DELETE",
        "/api/v1/namespaces/ns1/pods/mine",
        "pods \"mine\" is forbidden: User \"system:serviceaccount:kube-system:plexus\" cannot delete resource \"pods\" in API group \"\" in the namespace \"ns1\"",
        json!({"name": "mine", "kind": "pods"}),
    );
    // Events: the system:node rules.
    let event = r#"{"kind":"Event","apiVersion":"v1","metadata":{"name":"e1"}}"#;
    allowed("node", "POST", "/api/v1/namespaces/ns1/events", Some(event));
    allowed("sa", "POST", "/api/v1/namespaces/ns1/events", Some(event));

    // ResourceClaims: a node gets those of its pods, never a list.
    let claims = "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims";
    refused(
        "node",
        "GET",
        claims,
        &format!("resourceclaims.resource.k8s.io is forbidden: {node_user} cannot list resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace \"ns1\": can only get individual resources of this type"),
        json!({"group": "resource.k8s.io", "kind": "resourceclaims"}),
    );
    allowed("node", "GET", &format!("{claims}/mine-nic"), None);
    refused(
        "node",
        "GET",
        &format!("{claims}/other-nic"),
        &format!("resourceclaims.resource.k8s.io \"other-nic\" is forbidden: {node_user} cannot get resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace \"ns1\": no relationship found between node 'node-1' and this object"),
        json!({"name": "other-nic", "group": "resource.k8s.io", "kind": "resourceclaims"}),
    );
    allowed("sa", "GET", claims, None);
    // ResourceSlices: the node's own, by the field selector.
    let slices = "/apis/resource.k8s.io/v1/resourceslices";
    allowed(
        "node",
        "GET",
        &format!("{slices}?fieldSelector=spec.nodeName%3Dnode-1"),
        None,
    );
    refused(
        "node",
        "GET",
        slices,
        &format!("resourceslices.resource.k8s.io is forbidden: {node_user} cannot list resource \"resourceslices\" in API group \"resource.k8s.io\" at the cluster scope: can only list/watch/deletecollection resourceslices with nodeName field selector"),
        json!({"group": "resource.k8s.io", "kind": "resourceslices"}),
    );
}
