//! Self-bind start-up order: a new plexusd does everything that can fail
//! (metrics port, path checks, state directory and engine) before it renames
//! its socket over the path, so one that fails leaves the running daemon
//! serving: same socket, same pid, not draining.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::daemon::{inode, Daemon, TestDir};
use crate::support::http;

const T: Duration = Duration::from_secs(20);

/// Starts a daemon on `<dir>/sock`, then a successor with `successor`
/// settings that must fail; checks that the first one is untouched.
fn failing_successor_should_leave_the_daemon_serving(name: &str, successor: Value, code: i32) {
    let dir = TestDir::new(name);
    let mut a = Daemon::start(&dir, "a", json!({}));
    a.ready();
    let path = a.sock.clone();
    let ours = inode(&path).unwrap();

    let mut b = Daemon::start(&dir, "b", successor);
    let st = b.wait_exit(T);
    assert_eq!(st.code(), Some(code), "{}", b.log_text());

    assert_eq!(
        inode(&path),
        Some(ours),
        "the path no longer names A's socket"
    );
    assert!(a.running(), "A stopped:\n{}", a.log_text());
    assert_eq!(http::healthz(&path), 200);
    let ready = http::request(&path, "GET", "/readyz", b"").unwrap();
    assert_eq!(ready.status, 200, "A is draining:\n{}", a.log_text());
    // A never saw a takeover: it stops for the signal only.
    a.terminate();
    assert!(a.wait_exit(T).success());
    let log = a.log_text();
    assert!(log.contains("reason=Signal"), "{log}");
    assert!(!log.contains("took over"), "{log}");
    assert!(!path.exists());
}

#[test]
fn successor_whose_metrics_port_is_taken_should_leave_the_daemon_serving() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    failing_successor_should_leave_the_daemon_serving(
        "order-metrics",
        json!({"metricsPort": port}),
        71,
    );
    drop(taken);
}

#[test]
fn successor_that_cannot_create_its_state_dir_should_leave_the_daemon_serving() {
    let dir = TestDir::new("order-state-file");
    let file = dir.join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    failing_successor_should_leave_the_daemon_serving(
        "order-state",
        json!({"clusterNetwork": "cluster", "stateDir": file.join("state")}),
        71,
    );
}

#[test]
fn successor_with_an_unsafe_state_dir_should_leave_the_daemon_serving() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TestDir::new("order-unsafe");
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    failing_successor_should_leave_the_daemon_serving(
        "order-unsafe",
        json!({"clusterNetwork": "cluster", "stateDir": state}),
        78,
    );
}

/// Each successor binds the metrics port while its predecessor still
/// holds it (SO_REUSEPORT), takes the path over, and the predecessor
/// drains and exits: one daemon at the end, serving both.
#[test]
fn overlapping_restarts_with_a_metrics_port_should_end_with_one_daemon() {
    const RESTARTS: usize = 20;
    let dir = TestDir::new("order-restarts");
    let port = http::free_port("127.0.0.1");
    let cfg = json!({"metricsPort": port});
    let mut daemons: Vec<Daemon> = Vec::new();
    for i in 0..RESTARTS {
        let mut d = Daemon::start(&dir, &format!("d{i}"), cfg.clone());
        d.ready();
        daemons.push(d);
    }
    let (last, earlier) = daemons.split_last_mut().unwrap();
    for (i, d) in earlier.iter_mut().enumerate() {
        let st = d.wait_exit(T);
        assert!(st.success(), "d{i}: {st:?}\n{}", d.log_text());
    }
    assert!(last.running());
    let path = last.sock.clone();
    assert_eq!(http::healthz(&path), 200);
    assert_eq!(http::metrics_over_tcp(port).status, 200);
    last.terminate();
    assert!(last.wait_exit(T).success());
    assert!(!Path::new(&path).exists());
}
