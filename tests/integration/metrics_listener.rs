//! The `metricsPort` listener: bound to `metricsBindAddress` (127.0.0.1 by
//! default), at most 16 open connections however many clients come, and
//! its connections end with the drain.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::Duration;

use serde_json::json;

use crate::support::daemon::{retry_interrupted, wait_until, Daemon, TestDir};
use crate::support::http;
use crate::support::procnet;

const T: Duration = Duration::from_secs(20);
/// The listener's cap (server::metrics_port::MAX_CONNECTIONS).
const CAP: usize = 16;

fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// How many connections accepted on `port` the process holds. Counting
/// all its descriptors instead would also count what the daemon opens and
/// closes on its own meanwhile.
fn accepted_on(pid: i32, port: u16) -> usize {
    procnet::descriptors_among(pid, &procnet::socket_inodes(pid, procnet::End::Local, port))
}

fn get_metrics(ip: &str, port: u16) -> std::io::Result<http::Response> {
    let mut s = TcpStream::connect((ip.parse::<IpAddr>().unwrap(), port))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
    s.set_read_timeout(Some(T))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    http::parse_response(&buf)
}

#[test]
fn flood_of_idle_connections_should_not_pin_descriptors() {
    let dir = TestDir::new("metrics-flood");
    let port = http::free_port("127.0.0.1");
    let mut d = Daemon::start(&dir, "d", json!({"metricsPort": port}));
    d.ready();
    let before = fds(d.pid());
    let flood: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    wait_until(T, "the listener to fill up to its cap", || {
        accepted_on(d.pid(), port) >= CAP
    });
    // The unix socket still answers while the flood waits.
    let r = http::request(&d.sock, "GET", "/metrics", b"").unwrap();
    assert_eq!(r.status, 200);
    let held = accepted_on(d.pid(), port);
    assert!(held <= CAP, "{held} metrics connections held, cap {CAP}");
    let during = fds(d.pid());
    eprintln!("fds: {before} before, {during} with 200 idle metrics clients");
    assert!(
        during <= before + CAP + 4,
        "{during} fds open with the flood, {before} before"
    );
    drop(flood);
    d.terminate();
    assert!(d.wait_exit(T).success());
}

#[test]
fn metrics_bind_address_should_be_honoured() {
    let dir = TestDir::new("metrics-addr");
    let port = http::free_port("127.0.0.2");
    let mut d = Daemon::start(
        &dir,
        "d",
        json!({"metricsPort": port, "metricsBindAddress": "127.0.0.2"}),
    );
    d.ready();
    let r = get_metrics("127.0.0.2", port).unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body_str().contains("plexus_connections_open"));
    let refused = get_metrics("127.0.0.1", port).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    d.terminate();
    assert!(d.wait_exit(T).success());
}

#[test]
fn default_metrics_address_should_be_loopback_only() {
    let dir = TestDir::new("metrics-default");
    let port = http::free_port("127.0.0.1");
    let mut d = Daemon::start(&dir, "d", json!({"metricsPort": port}));
    d.ready();
    assert_eq!(get_metrics("127.0.0.1", port).unwrap().status, 200);
    // Another address of this host: not listened on.
    let refused = get_metrics("127.0.0.2", port).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    d.terminate();
    assert!(d.wait_exit(T).success());
}

#[test]
fn drain_should_close_metrics_connections() {
    let dir = TestDir::new("metrics-drain");
    let port = http::free_port("127.0.0.1");
    let cfg = json!({"metricsPort": port, "readTimeout": "60s", "shutdownTimeout": "60s"});
    let mut d = Daemon::start(&dir, "d", cfg);
    d.ready();
    let mut idle = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_until(T, "the idle metrics client accepted", || {
        accepted_on(d.pid(), port) == 1
    });
    // A request in progress on the unix socket holds the drain open.
    let mut slow = std::os::unix::net::UnixStream::connect(&d.sock).unwrap();
    slow.write_all(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nnull")
        .unwrap();
    wait_until(T, "the slow request accepted", || {
        http::request(&d.sock, "GET", "/metrics", b"")
            .map(|r| r.body_str().contains("plexus_connections_open 2"))
            .unwrap_or(false)
    });
    d.terminate();
    d.wait_notify("STOPPING=1", T);
    // Well under the 10 s header timeout that would close it otherwise.
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    match retry_interrupted(|| idle.read(&mut buf)) {
        Ok(0) => {}
        Ok(n) => panic!("unexpected {n} bytes on an idle metrics connection"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    assert!(
        d.running(),
        "the drain should still be waiting for the slow request"
    );
    slow.write_all(b"      ").unwrap();
    slow.set_read_timeout(Some(T)).unwrap();
    assert_eq!(http::read_response(&mut slow).unwrap().status, 200);
    assert!(d.wait_exit(T).success());
}
