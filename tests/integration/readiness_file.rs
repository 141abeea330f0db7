//! The readiness indicator file (`readinessindicatorfile`) through
//! plexus-shim and plexusd with Debian's bridge + host-local: ADD waits
//! for it (bounded, then code 11), proceeds when it appears, waits again
//! when it goes; DEL never waits; `/readyz` and STATUS= say why the
//! daemon is not ready, and the daemon keeps running.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, failed, ok, Call, Engine};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::http;
use crate::support::netns::{host_link_exists, Link, Netns, Subnet};

/// A daemon with one bridge network as its cluster network and the
/// readiness indicator file `file`, waited for up to `timeout`.
struct Setup {
    engine: Engine,
    daemon: Daemon,
    subnet: Subnet,
    bridge: Link,
    file: PathBuf,
}

fn setup(tag: &str, file: &str, timeout: &str, present: bool) -> Setup {
    let engine = Engine::new(tag);
    let bridge_link = Link::planned("b");
    let subnet = Subnet::new();
    let name = format!("{tag}-net");
    engine.write_network(
        "10-cluster.conflist",
        &conflist(
            &name,
            "1.0.0",
            vec![bridge(&bridge_link.name, engine.host_local(&subnet))],
        ),
    );
    let file = engine.dir.join(file);
    if present {
        create(&file);
    }
    let mut config = engine.config(&name, "20s");
    config["readinessindicatorfile"] = json!(file);
    config["readinessIndicatorTimeout"] = json!(timeout);
    let mut daemon = Daemon::start(&engine.dir, "d", config);
    daemon.ready();
    Setup {
        engine,
        daemon,
        subnet,
        bridge: bridge_link,
        file,
    }
}

fn readyz(d: &Daemon) -> (u16, Value) {
    let r = http::request(&d.sock, "GET", "/readyz", b"").unwrap();
    let body = if r.body.is_empty() {
        Value::Null
    } else {
        r.json()
    };
    (r.status, body)
}

/// Waits until `/readyz` answers `status` with a body containing `needle`.
fn wait_readyz(d: &Daemon, status: u16, needle: &str) -> Value {
    let mut last = (0, Value::Null);
    let seen =
        crate::support::daemon::poll(Duration::from_secs(10), Duration::from_millis(5), || {
            last = readyz(d);
            last.0 == status && last.1.to_string().contains(needle)
        });
    assert!(
        seen,
        "/readyz never answered {status} with {needle:?}; last {last:?}"
    );
    last.1
}

/// Asserts the answer's msg names `file`.
fn assert_names(body: &Value, file: &Path) {
    assert!(
        body["msg"]
            .as_str()
            .unwrap()
            .contains(&file.display().to_string()),
        "{body}"
    );
}

fn create(file: &Path) {
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, b"").unwrap();
}

#[test]
fn an_add_should_wait_for_the_file_then_fail_with_code_11_and_attach_nothing() {
    let t = setup("rif-absent", "not/yet/ready", "1500ms", false);
    let d = &t.daemon;
    let (status, body) = readyz(d);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], 11, "{body}");
    assert_names(&body, &t.file);
    let ns = Netns::new();
    let started = Instant::now();
    let run = Call::new("ADD", "rif-absent-1", &ns, "eth0").run(d);
    let took = started.elapsed();
    let (code, msg, _) = failed(d, &run);
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("readiness indicator file"), "{msg}");
    assert!(
        took >= Duration::from_millis(1500),
        "answered after {took:?}"
    );
    assert!(!ns.has_link("eth0"));
    assert!(!host_link_exists(&t.bridge.name));
    assert_eq!(t.engine.records(), Vec::<String>::new());
    assert_eq!(
        t.engine.reservations("rif-absent-net"),
        Vec::<String>::new()
    );
}

#[test]
fn an_add_waiting_for_the_file_should_proceed_once_it_appears() {
    let mut t = setup("rif-appear", "run/flannel/ready", "60s", false);
    let ns = Netns::new();
    let pending = Call::new("ADD", "rif-appear-1", &ns, "eth0").spawn(&t.daemon);
    // The ADD is waiting: /readyz and STATUS= say so.
    wait_readyz(&t.daemon, 503, "1 call waiting");
    t.daemon
        .wait_notify("1 call waiting", Duration::from_secs(10));
    assert!(!ns.has_link("eth0"), "nothing runs while it waits");
    create(&t.file);
    let result = ok(&t.daemon, &pending.finish());
    assert!(
        t.subnet.holds(&crate::support::cni::address(&result)),
        "{result}"
    );
    assert!(ns.has_link("eth0"));
    wait_readyz(&t.daemon, 200, "");
    t.daemon
        .wait_notify("STATUS=serving: ", Duration::from_secs(10));
    ok(
        &t.daemon,
        &Call::new("DEL", "rif-appear-1", &ns, "eth0").run(&t.daemon),
    );
}

#[test]
fn the_file_going_away_should_make_adds_wait_again_but_not_dels_nor_stop_the_daemon() {
    let mut t = setup("rif-gone", "ready", "60s", true);
    assert_eq!(readyz(&t.daemon).0, 200);
    let pid = t.daemon.pid();
    let ns = Netns::new();
    ok(
        &t.daemon,
        &Call::new("ADD", "rif-gone-1", &ns, "eth0").run(&t.daemon),
    );

    std::fs::remove_file(&t.file).unwrap();
    let body = wait_readyz(&t.daemon, 503, "does not exist");
    assert_names(&body, &t.file);
    t.daemon.wait_notify(
        "STATUS=serving, not ready: the readiness indicator file",
        Duration::from_secs(10),
    );

    let ns2 = Netns::new();
    let pending = Call::new("ADD", "rif-gone-2", &ns2, "eth0").spawn(&t.daemon);
    wait_readyz(&t.daemon, 503, "1 call waiting");
    // DEL does not wait for the file.
    let started = Instant::now();
    ok(
        &t.daemon,
        &Call::new("DEL", "rif-gone-1", &ns, "eth0").run(&t.daemon),
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(!ns.has_link("eth0"));
    assert!(!ns2.has_link("eth0"), "the waiting ADD ran nothing");

    assert!(t.daemon.running());
    assert_eq!(t.daemon.pid(), pid);
    create(&t.file);
    ok(&t.daemon, &pending.finish());
    assert!(ns2.has_link("eth0"));
    wait_until(Duration::from_secs(10), "/readyz 200", || {
        readyz(&t.daemon).0 == 200
    });
    ok(
        &t.daemon,
        &Call::new("DEL", "rif-gone-2", &ns2, "eth0").run(&t.daemon),
    );
    assert!(t.daemon.running());
}
