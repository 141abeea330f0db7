//! plexusd with a Kubernetes source: READY=1 and `/readyz` wait for the
//! caches (bounded by kubernetesSyncTimeout, then serving anyway and
//! saying so), a bad kubeconfig stops start-up, and static networks and
//! DEL never need the API server.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::cni::{cni, ok, Call, Engine};
use crate::support::daemon::{wait_until, Daemon, PLEXUSD};
use crate::support::http;
use crate::support::kube::{pod_args, FakeApi, NODE};
use crate::support::netns::{Link, Netns, Subnet};

const T: Duration = Duration::from_secs(20);

/// An engine with one bridge network as clusterNetwork and a daemon
/// config pointing at `api`.
fn setup(tag: &str, api: &FakeApi, sync_timeout: &str) -> (Engine, Value, Link, Subnet) {
    let (engine, link, subnet) = Engine::with_cluster_bridge(tag);
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
    let (engine, mut config, _link, _subnet) = setup("k8s-ready", &api, "60s");
    // How long a pod's ADD may wait for the caches.
    config["queueTimeout"] = json!("1s");
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
    // A pod's ADD needs the caches: it waits for them up to queueTimeout,
    // then try again later, nothing attached.
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

/// A daemon started by the first calls after a node's boot, while the API
/// server is slow to list: the pods' ADDs wait for the caches and all
/// succeed, none is sent back with code 11.
#[test]
fn adds_at_a_cold_start_should_wait_for_the_caches_and_succeed() {
    const PODS: usize = 4;
    let api = FakeApi::start();
    let namespaces: Vec<Netns> = (0..PODS).map(|_| Netns::new()).collect();
    for i in 0..PODS {
        api.put_pod(
            "ns",
            &format!("cold{i}"),
            &format!("uid-cold{i}"),
            NODE,
            json!({}),
        );
    }
    api.delay_lists(Duration::from_secs(2));
    let (engine, config, _link, subnet) = setup("k8s-cold", &api, "60s");
    let d = Daemon::start(&engine.dir, "d", config);
    wait_until(T, "the socket", || d.sock.exists());
    let calls: Vec<_> = namespaces
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            let call = Call::new("ADD", &format!("k8scold{i}"), ns, "eth0").args(&pod_args(
                "ns",
                &format!("cold{i}"),
                &format!("uid-cold{i}"),
            ));
            let (env, stdin) = (call.env(), call.stdin(&d));
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let run = crate::support::shim::run(env, &stdin);
                (run, t0.elapsed())
            })
        })
        .collect();
    let mut longest = Duration::ZERO;
    for (i, c) in calls.into_iter().enumerate() {
        let (run, took) = c.join().unwrap();
        longest = longest.max(took);
        let result = ok(&d, &run);
        assert!(
            subnet.holds(&crate::support::cni::address(&result)),
            "{result}"
        );
        assert!(namespaces[i].iface("eth0").is_some(), "pod {i}: no eth0");
        assert!(
            api.network_status("ns", &format!("cold{i}")).is_some(),
            "pod {i}: no network-status"
        );
    }
    // They did arrive before the caches synced, and waited.
    let log = d.log_text();
    for i in 0..PODS {
        let waited = log.lines().any(|l| {
            l.contains("ADD waited for the Kubernetes caches")
                && l.contains(&format!("k8scold{i} "))
                || l.contains("ADD waited for the Kubernetes caches")
                    && l.contains(&format!("k8scold{i}\""))
        });
        assert!(waited, "ADD k8scold{i} did not wait for the caches:\n{log}");
    }
    println!("cold start: {PODS} ADDs, the longest took {longest:?} (lists held back 2 s)");
}

/// Without the API server, a pod's ADD waits at most `queueTimeout` (here
/// shorter than what is left of `kubernetesSyncTimeout`), then fails with
/// code 11 naming the cause.
#[test]
fn an_add_without_the_api_server_should_wait_for_its_bound_then_fail_with_code_11() {
    let api = FakeApi::start();
    api.set_up(false);
    let (engine, mut config, _link, _subnet) = setup("k8s-coldown", &api, "60s");
    config["queueTimeout"] = json!("2s");
    let d = Daemon::start(&engine.dir, "d", config);
    wait_until(T, "the socket", || d.sock.exists());
    let ns = Netns::new();
    let t0 = Instant::now();
    let run = Call::new("ADD", "k8scoldown1", &ns, "eth0")
        .args(&pod_args("ns", "p", "u"))
        .run(&d);
    let took = t0.elapsed();
    let (code, msg, _) = crate::support::cni::failed(&d, &run);
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("have not synced"), "{msg}");
    assert!(
        msg.contains("onnection refused"),
        "the cause is not named: {msg}"
    );
    // Loose sanity bounds around the 2 s bound, not a performance claim.
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(7),
        "the ADD took {took:?}"
    );
    assert!(ns.iface("eth0").is_none());
    assert!(engine.records().is_empty());
}

/// `openssl s_server` on a free local port with `cert`/`key`; killed on
/// drop.
struct TlsServer {
    child: std::process::Child,
    port: u16,
}

impl TlsServer {
    fn start(cert: &Path, key: &Path) -> TlsServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(cert)
            .arg("-key")
            .arg(key)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run openssl s_server");
        let server = TlsServer { child, port };
        wait_until(T, "openssl s_server listening", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        server
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn openssl(args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `<dir>/<name>-ca.pem` (and its key) and, when `leaf`, a server
/// certificate for 127.0.0.1 it signed (`<dir>/<name>.pem`, `.key`).
/// Returns (CA, leaf, leaf key).
fn certificates(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let p = |suffix: &str| dir.join(format!("{name}{suffix}"));
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let (ca, ca_key, cert, key, csr, ext) = (
        p("-ca.pem"),
        p("-ca.key"),
        p(".pem"),
        p(".key"),
        p(".csr"),
        p(".ext"),
    );
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    let subj = format!("/CN={name} CA");
    args.extend(["-days", "1", "-subj", &subj, "-keyout"]);
    let (ca_s, ca_key_s) = (s(&ca), s(&ca_key));
    args.extend([ca_key_s.as_str(), "-out", ca_s.as_str()]);
    openssl(&args);
    let mut args = vec!["req"];
    args.extend(ec);
    let (key_s, csr_s, cert_s, ext_s) = (s(&key), s(&csr), s(&cert), s(&ext));
    args.extend(["-subj", "/CN=127.0.0.1", "-keyout", &key_s, "-out", &csr_s]);
    openssl(&args);
    std::fs::write(
        &ext,
        "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr_s,
        "-CA",
        &ca_s,
        "-CAkey",
        &ca_key_s,
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &ext_s,
        "-out",
        &cert_s,
    ]);
    (ca, cert, key)
}

/// The watches' real cause reaches the log and STATUS=: a refused token
/// (401 Unauthorized) and a server certificate the kubeconfig's CA did
/// not sign, not only "client error (Connect)".
#[test]
fn a_refused_token_or_certificate_should_be_named_in_the_log_and_status() {
    let api = FakeApi::start();
    api.require_token("another-token");
    let (engine, config, _link, _subnet) = setup("k8s-401", &api, "60s");
    let mut d = Daemon::start(&engine.dir, "d", config);
    let status = d.wait_notify("Unauthorized", T);
    println!("wrong token: {status}");
    assert!(status.contains("STATUS=starting"), "{status}");
    assert!(
        status.contains("401") || status.contains("Unauthorized"),
        "{status}"
    );
    wait_until(T, "the cause in the log", || {
        d.log_text()
            .lines()
            .any(|l| l.contains("Kubernetes watch failed") && l.contains("Unauthorized"))
    });
    drop(d);

    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        println!("skipping the certificate case: openssl is not installed");
        return;
    }
    let (engine, mut config, _link, _subnet) = setup("k8s-tls", &api, "60s");
    // The server's certificate is signed by a CA; the kubeconfig trusts
    // another one.
    let (_, cert, key) = certificates(&engine.dir.path, "fake-api");
    let (other_ca, _, _) = certificates(&engine.dir.path, "other");
    let server = TlsServer::start(&cert, &key);
    let kubeconfig = engine.dir.join("tls-kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: tls\n  cluster:\n    server: https://127.0.0.1:{}\n\
             \x20   certificate-authority: {}\ncontexts:\n- name: tls\n  context:\n    cluster: tls\n    user: node\n\
             current-context: tls\nusers:\n- name: node\n  user:\n    token: test-token\n",
            server.port,
            other_ca.display()
        ),
    )
    .unwrap();
    config["kubeconfig"] = json!(kubeconfig);
    let mut d = Daemon::start(&engine.dir, "d", config);
    let status = d.wait_notify("UnknownIssuer", T);
    println!("wrong CA: {status}");
    assert!(status.contains("certificate"), "{status}");
    wait_until(T, "the certificate error in the log", || {
        d.log_text().lines().any(|l| {
            l.contains("Kubernetes watch failed")
                && l.contains("certificate")
                && l.contains("UnknownIssuer")
        })
    });
}
