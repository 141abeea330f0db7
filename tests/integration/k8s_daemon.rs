//! plexusd with a Kubernetes source: READY=1 and `/readyz` wait for the
//! caches (bounded by kubernetesSyncTimeout, then serving anyway and
//! saying so), a bad kubeconfig stops start-up, and static networks and
//! DEL never need the API server.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cni::{bridge, cni, conflist, ok, Engine};
use crate::support::daemon::{wait_until, Daemon, PLEXUSD};
use crate::support::http;
use crate::support::kube::{pod_args, FakeApi};
use crate::support::netns::{Link, Netns, Subnet};

const T: Duration = Duration::from_secs(20);

/// An engine with one bridge network as clusterNetwork and a daemon
/// config pointing at `api`.
fn setup(tag: &str, api: &FakeApi, sync_timeout: &str) -> (Engine, Value, Link, Subnet) {
    let engine = Engine::new(tag);
    let link = Link::planned("b");
    let subnet = Subnet::new();
    engine.write_network(
        "10-cluster.conflist",
        &conflist(
            "cluster",
            "1.0.0",
            vec![bridge(&link.name, engine.host_local(&subnet))],
        ),
    );
    let mut config = engine.config("cluster", "20s");
    api.configure(&engine.dir, &mut config, "2s");
    config["kubernetesSyncTimeout"] = json!(sync_timeout);
    (engine, config, link, subnet)
}

fn readyz(d: &Daemon) -> http::Response {
    http::request(&d.sock, "GET", "/readyz", b"").unwrap()
}

#[test]
fn ready_should_wait_for_the_kubernetes_caches() {
    let api = FakeApi::start();
    api.put_nad("ns", "net", Some(r#"{"type":"bridge"}"#), json!({}));
    // Nothing is answered until released: the caches cannot sync.
    api.stall(true);
    let (engine, config, _link, _subnet) = setup("k8s-ready", &api, "60s");
    let mut d = Daemon::start(&engine.dir, "d", config);
    let status = d.wait_notify("STATUS=starting", T);
    assert!(status.contains("Kubernetes caches"), "{status}");
    // The socket serves already, and says it is not ready.
    wait_until(T, "the socket", || d.sock.exists());
    let r = readyz(&d);
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert_eq!(r.json()["code"], 11);
    assert!(
        !d.log_text().contains("READY=1") && !status.contains("READY=1"),
        "READY=1 before the caches synced"
    );
    // A pod's ADD needs the caches: try again later, nothing attached.
    let ns = Netns::new();
    let run = crate::support::cni::Call::new("ADD", "k8sunsynced1", &ns, "eth0")
        .args(&pod_args("ns", "p", "u"))
        .run(&d);
    let (code, msg, _) = crate::support::cni::failed(&d, &run);
    assert_eq!(code, 11, "{msg}");
    assert!(ns.iface("eth0").is_none());
    assert!(engine.records().is_empty());
    api.stall(false);
    let ready = d.wait_notify("READY=1", T);
    assert!(ready.contains("STATUS=serving:"), "{ready}");
    assert_eq!(readyz(&d).status, 200);
    // Both caches were listed, the pods for this node only.
    let log = api.log();
    assert!(log
        .iter()
        .any(|r| r.path == "/api/v1/pods" && r.query.contains("spec.nodeName%3Dnode-1")));
    assert!(log
        .iter()
        .any(|r| r.path == "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"));
}

#[test]
fn without_the_api_server_it_should_serve_after_the_sync_timeout_and_say_so() {
    let api = FakeApi::start();
    api.set_up(false);
    let (engine, config, _link, subnet) = setup("k8s-degraded", &api, "1s");
    let mut d = Daemon::start(&engine.dir, "d", config);
    let ready = d.wait_notify("READY=1", T);
    assert!(ready.contains("degraded"), "{ready}");
    assert!(ready.contains("code 11"), "{ready}");
    let r = readyz(&d);
    assert_eq!(r.status, 200);
    assert!(r.json()["degraded"]
        .as_str()
        .is_some_and(|s| s.contains("not synced")));

    // Static networks and DEL need no API server.
    let ns = Netns::new();
    let result = ok(&d, &cni(&d, "ADD", "k8sdown1", &ns, "eth0"));
    assert!(ns.iface("eth0").is_some(), "{result}");
    assert!(subnet.holds(&crate::support::cni::address(&result)));
    ok(&d, &cni(&d, "DEL", "k8sdown1", &ns, "eth0"));
    assert!(ns.iface("eth0").is_none());
    assert!(engine.records().is_empty());

    // The API coming back turns the daemon ready.
    api.set_up(true);
    wait_until(T, "readyz without degradation", || {
        let r = readyz(&d);
        r.status == 200 && r.body_str().trim().is_empty()
    });
}

#[test]
fn an_unusable_kubeconfig_should_stop_start_up_and_name_the_key() {
    let api = FakeApi::start();
    let (engine, mut config, _link, _subnet) = setup("k8s-badcfg", &api, "1s");
    let path = engine.dir.join("kubeconfig");
    let run = |config: &Value| {
        let file = engine.dir.join("bad.json");
        std::fs::write(&file, config.to_string()).unwrap();
        std::process::Command::new(PLEXUSD)
            .arg("--config")
            .arg(&file)
            .env_remove("LISTEN_FDS")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap()
    };
    // Writable by others: anyone could point the daemon at their own API.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let out = run(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("kubeconfig") && stderr.contains("writable"),
        "{stderr}"
    );

    // Not a kubeconfig at all.
    std::fs::write(&path, "not: [a kubeconfig").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    config["socketDir"] = json!(engine.dir.join("sock"));
    let out = run(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(!engine.dir.join("sock/plexus.sock").exists());

    config["nodeName"] = json!("Not_A_Node");
    let out = run(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("nodeName"), "{stderr}");
}
