//! plexusd as a process: configuration errors, readiness, activation,
//! self-bind safety, shutdown and idle exit.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::daemon::{inode, wait_until, Daemon, TestDir, PLEXUSD};
use crate::support::http;

const T: Duration = Duration::from_secs(20);

#[test]
fn config_with_three_mistakes_should_report_all_and_exit_78() {
    let dir = TestDir::new("cfg3");
    let cfg = dir.join("bad.json");
    std::fs::write(
        &cfg,
        r#"{"connectionLimit": 0, "readTimeout": "soon", "logToStderr": "yes"}"#,
    )
    .unwrap();
    for extra in [&[][..], &["--check-config"][..]] {
        let out = Command::new(PLEXUSD)
            .arg("--config")
            .arg(&cfg)
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        for key in ["connectionLimit", "readTimeout", "logToStderr"] {
            assert!(err.contains(key), "{key} missing from {err}");
        }
        assert!(err.contains(cfg.to_str().unwrap()), "{err}");
        assert!(err.contains("3 problems"), "{err}");
    }
}

#[test]
fn check_config_and_version_should_exit_0() {
    let dir = TestDir::new("cfgok");
    let cfg = dir.join("ok.json");
    std::fs::write(&cfg, r#"{"connectionLimit": 4, "queueTimeout": "2s"}"#).unwrap();
    let out = Command::new(PLEXUSD)
        .args(["--check-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = Command::new(PLEXUSD).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("plexusd "));
}

#[test]
fn missing_explicit_config_should_exit_78() {
    let dir = TestDir::new("cfgmissing");
    let out = Command::new(PLEXUSD)
        .arg("--config")
        .arg(dir.join("nope.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.json"));
}

#[test]
fn ready_should_be_sent_only_once_the_socket_serves() {
    let dir = TestDir::new("ready");
    let mut d = Daemon::start(&dir, "d", json!({}));
    let msg = d.wait_notify("READY=1", T);
    assert!(msg.contains("STATUS=serving"), "{msg}");
    // At READY time the socket must already answer.
    assert_eq!(http::healthz(&d.sock), 200);
    let r = http::request(&d.sock, "GET", "/readyz", b"").unwrap();
    assert_eq!(r.status, 200);
    d.terminate();
    let st = d.wait_exit(T);
    assert!(st.success(), "{st:?}");
    let all = d.notifications();
    assert!(all.iter().any(|m| m.contains("STOPPING=1")), "{all:?}");
}

#[test]
fn invalid_config_should_never_send_ready() {
    let dir = TestDir::new("noready");
    let mut d = Daemon::start(&dir, "d", json!({"maxConnections": -1}));
    let st = d.wait_exit(T);
    assert_eq!(st.code(), Some(78));
    assert!(d.notifications().is_empty());
    assert!(!d.sock.exists());
}

#[test]
fn status_line_should_follow_requests() {
    let dir = TestDir::new("status");
    let mut d = Daemon::start(&dir, "d", json!({}));
    d.ready();
    let r = http::request(&d.sock, "POST", "/cni", br#"{"env":{"CNI_COMMAND":"ADD"}}"#).unwrap();
    assert_eq!(r.status, 400);
    d.wait_notify("STATUS=serving: 1 served", T);
}

#[test]
fn sighup_and_sigusr_should_be_ignored_and_sigquit_should_stop_cleanly() {
    let dir = TestDir::new("sighup");
    let mut d = Daemon::start(&dir, "d", json!({}));
    d.ready();
    let before = inode(&d.sock).expect("the socket");
    for (sig, name) in [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGUSR2, "SIGUSR2"),
    ] {
        d.signal(sig);
        // Handled (the log says so), and nothing else happened: still
        // running, the same socket, serving.
        wait_until(T, "the signal to be handled", || {
            d.log_text()
                .lines()
                .any(|l| l.contains(name) && l.contains("ignored"))
        });
        assert!(d.running(), "{name} stopped plexusd");
        assert_eq!(inode(&d.sock), Some(before), "{name}");
        assert_eq!(http::healthz(&d.sock), 200, "{name}");
    }
    // SIGQUIT: a stop like SIGTERM's, its own socket removed.
    d.signal(libc::SIGQUIT);
    let st = d.wait_exit(T);
    assert!(st.success(), "{st:?}");
    assert!(!d.sock.exists(), "own socket left behind");
    assert!(d.notifications().iter().any(|m| m.contains("STOPPING=1")));
}

#[test]
fn self_bind_should_make_private_socket_and_remove_it_at_exit() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let dir = TestDir::new("selfbind");
    let mut d = Daemon::start(&dir, "d", json!({}));
    d.ready();
    let m = std::fs::symlink_metadata(&d.sock).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(d.sock.parent().unwrap()).unwrap().mode() & 0o777,
        0o700
    );
    d.terminate();
    assert!(d.wait_exit(T).success());
    assert!(!d.sock.exists(), "own socket left behind");
    // Nothing else in the directory was removed.
    assert!(d.sock.parent().unwrap().exists());
}

#[test]
fn self_bind_over_regular_file_should_refuse_and_leave_it() {
    let dir = TestDir::new("regfile");
    std::fs::create_dir_all(dir.join("sock")).unwrap();
    let path = dir.join("sock/plexus.sock");
    std::fs::write(&path, b"not a socket").unwrap();
    let mut d = Daemon::start(&dir, "d", json!({}));
    let st = d.wait_exit(T);
    assert_eq!(st.code(), Some(78));
    assert!(d.log_text().contains("is not a socket"), "{}", d.log_text());
    assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
}

/// Sends the head of a POST and part of its body, leaving the request open.
fn start_slow_request(sock: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.write_all(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nnull")
        .unwrap();
    s
}

fn finish_slow_request(mut s: UnixStream) -> http::Response {
    s.write_all(b"      ").unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    http::read_response(&mut s).unwrap()
}

/// The upstream race: a draining predecessor must never remove its
/// successor's socket.
#[test]
fn successor_bound_during_drain_should_keep_the_path() {
    let dir = TestDir::new("race");
    let cfg = json!({"readTimeout": "60s", "shutdownTimeout": "60s"});
    let mut a = Daemon::start(&dir, "a", cfg.clone());
    a.ready();
    let path = a.sock.clone();
    let slow = start_slow_request(&path);
    // The request has arrived (its connection counts) before the signal.
    wait_until(T, "slow request accepted", || {
        http::request(&path, "GET", "/metrics", b"")
            .map(|r| r.body_str().contains("plexus_connections_open 2"))
            .unwrap_or(false)
    });
    a.terminate();
    a.wait_notify("STOPPING=1", T);
    assert!(a.running(), "A must still be draining");

    let mut b = Daemon::start(&dir, "b", cfg);
    b.ready();
    let b_inode = inode(&path).expect("B's socket");

    let r = finish_slow_request(slow);
    assert_eq!(r.status, 200, "A must finish its in-flight request");
    assert!(a.wait_exit(T).success());

    assert_eq!(
        inode(&path),
        Some(b_inode),
        "the path must still name B's socket"
    );
    assert_eq!(http::healthz(&path), 200);
    b.terminate();
    assert!(b.wait_exit(T).success());
}

#[test]
fn successor_taking_over_should_make_predecessor_drain_and_exit() {
    let dir = TestDir::new("takeover");
    let mut a = Daemon::start(&dir, "a", json!({}));
    a.ready();
    let mut b = Daemon::start(&dir, "b", json!({}));
    b.ready();
    let b_inode = inode(&b.sock).unwrap();
    let st = a.wait_exit(T);
    assert!(st.success(), "{st:?}");
    assert_eq!(inode(&b.sock), Some(b_inode));
    assert_eq!(http::healthz(&b.sock), 200);
}

#[test]
fn activated_daemon_should_keep_socket_across_restart_and_serve_queued_clients() {
    let dir = TestDir::new("actrestart");
    let path = dir.join("plexus.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let before = inode(&path).unwrap();

    let mut a = Daemon::start_activated(&dir, "a", json!({}), &listener, &path);
    a.ready();
    assert_eq!(http::healthz(&path), 200);
    a.terminate();
    assert!(a.wait_exit(T).success());
    assert_eq!(
        inode(&path),
        Some(before),
        "the daemon must not touch systemd's node"
    );

    // A client arriving while no daemon runs waits in the backlog...
    let waiting = std::thread::spawn({
        let path = path.clone();
        move || http::request(&path, "GET", "/healthz", b"")
    });
    // ...and the successor, handed the same socket, serves it.
    let mut b = Daemon::start_activated(&dir, "b", json!({}), &listener, &path);
    b.ready();
    let r = waiting.join().unwrap().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(inode(&path), Some(before));
    b.terminate();
    assert!(b.wait_exit(T).success());
    assert_eq!(inode(&path), Some(before));
}

#[test]
fn activation_with_foreign_listen_pid_should_fail_clearly() {
    let dir = TestDir::new("foreignpid");
    let out = Command::new(PLEXUSD)
        .arg("--config")
        .arg(dir.join("none.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    std::fs::write(dir.join("c.json"), "{}").unwrap();
    let out = Command::new(PLEXUSD)
        .arg("--config")
        .arg(dir.join("c.json"))
        .env("LISTEN_FDS", "1")
        .env("LISTEN_PID", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("LISTEN_PID=1"));
}

/// A malformed LISTEN_FDS is neither ignored nor taken as "bind the path
/// ourselves": the daemon exits 78 naming it, and creates no socket.
#[test]
fn activation_with_malformed_listen_fds_should_fail_without_binding() {
    let dir = TestDir::new("badfds");
    let sockets = dir.join("run");
    std::fs::write(
        dir.join("c.json"),
        json!({ "socketDir": sockets, "stateDir": dir.join("state") }).to_string(),
    )
    .unwrap();
    for (fds, pid) in [("x", None), ("-1", None), ("1", Some("y")), ("0", None)] {
        let mut c = Command::new(PLEXUSD);
        c.arg("--config")
            .arg(dir.join("c.json"))
            .env("LISTEN_FDS", fds)
            .env_remove("LISTEN_FDS_FIRST_FD");
        match pid {
            Some(p) => c.env("LISTEN_PID", p),
            None => c.env_remove("LISTEN_PID"),
        };
        // A daemon that wrongly binds would serve forever: bounded wait.
        let mut child = c
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let exited = {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break Some(s);
                }
                if Instant::now() > deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        if exited.is_none() {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        assert!(exited.is_some(), "{fds} {pid:?}: plexusd kept running");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{fds} {pid:?}: {stderr}");
        let named = if fds == "1" {
            "LISTEN_PID=\"y\"".to_string()
        } else {
            format!("LISTEN_FDS={fds}")
        };
        assert!(
            stderr.contains(&named) || stderr.contains(&format!("LISTEN_FDS=\"{fds}\"")),
            "{fds} {pid:?}: {stderr}"
        );
        assert!(!sockets.join("plexus.sock").exists(), "{fds} {pid:?}");
    }
}

#[test]
fn activation_with_a_non_socket_fd_should_fail_clearly() {
    let dir = TestDir::new("badfd");
    std::fs::write(dir.join("c.json"), "{}").unwrap();
    let file = std::fs::File::create(dir.join("plain")).unwrap();
    let out = {
        use std::os::fd::AsRawFd;
        let mut c = Command::new(PLEXUSD);
        c.arg("--config")
            .arg(dir.join("c.json"))
            .env("LISTEN_FDS", "1");
        crate::support::daemon::pass_as_fd3(&mut c, file.as_raw_fd());
        c.output().unwrap()
    };
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("fd 3"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn systemd_socket_activate_should_start_on_first_connection_and_keep_the_node() {
    if Command::new("systemd-socket-activate")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: systemd-socket-activate is not installed");
        return;
    }
    let dir = TestDir::new("ssa");
    let path = dir.join("plexus.sock");
    // A stateDir of its own: plexusd creates it at start.
    std::fs::write(
        dir.join("c.json"),
        json!({"stateDir": dir.join("state")}).to_string(),
    )
    .unwrap();
    let notify_path = dir.join("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    let mut launcher = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&path)
        .arg(format!("--setenv=NOTIFY_SOCKET={}", notify_path.display()))
        .arg(PLEXUSD)
        .arg("--config")
        .arg(dir.join("c.json"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _guard = KillOnDrop(launcher.id() as i32);
    wait_until(T, "systemd-socket-activate to bind", || path.exists());
    let before = inode(&path).unwrap();
    // The first connection makes the launcher exec plexusd in its place.
    // The path appears at bind(), a moment before listen(): until then a
    // connect is refused, so the first request is retried on that alone.
    let deadline = Instant::now() + T;
    let r = loop {
        match http::request(&path, "GET", "/healthz", b"") {
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                std::thread::yield_now()
            }
            r => break r.unwrap(),
        }
    };
    assert_eq!(r.status, 200);
    let mut buf = [0u8; 512];
    notify.set_read_timeout(Some(T)).unwrap();
    // A stopped-and-continued test process sees EINTR from a timed recv.
    let n = loop {
        match notify.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r.unwrap(),
        }
    };
    assert!(String::from_utf8_lossy(&buf[..n]).contains("READY=1"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + T;
    let status = loop {
        if let Some(st) = launcher.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "plexusd did not stop");
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut err = String::new();
    launcher
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status:?} {err}");
    assert_eq!(
        inode(&path),
        Some(before),
        "the node must survive the daemon"
    );

    // A new launcher re-binds the path and a restarted daemon serves it.
    let mut again = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&path)
        .arg(PLEXUSD)
        .arg("--config")
        .arg(dir.join("c.json"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _guard2 = KillOnDrop(again.id() as i32);
    // The old node refuses connections until the launcher has re-bound it
    // (its inode number may be reused, so connecting is the only sure sign).
    let mut answered = None;
    wait_until(T, "the second launcher to serve", || {
        answered = http::request(&path, "GET", "/healthz", b"").ok();
        answered.is_some()
    });
    assert_eq!(answered.unwrap().status, 200);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(again.id() as i32, libc::SIGTERM) };
    let _ = again.wait();
}

struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of a child we started; harmless if gone.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

#[test]
fn readyz_should_turn_503_while_draining() {
    let dir = TestDir::new("readyz");
    let path = dir.join("plexus.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut d = Daemon::start_activated(&dir, "d", json!({"readTimeout": "30s"}), &listener, &path);
    d.ready();
    // A readiness probe that arrived before the signal and completes after it.
    let mut probe = UnixStream::connect(&path).unwrap();
    probe
        .write_all(b"POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nnull")
        .unwrap();
    wait_until(T, "the probe to be accepted", || {
        http::request(&path, "GET", "/metrics", b"")
            .map(|r| r.body_str().contains("plexus_connections_open 2"))
            .unwrap_or(false)
    });
    d.terminate();
    d.wait_notify("STOPPING=1", T);
    let r = finish_slow_request(probe);
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert_eq!(r.json()["code"], 11);
    assert!(d.wait_exit(T).success());
}

#[test]
fn shutdown_timeout_should_bound_the_drain() {
    let dir = TestDir::new("shutdownto");
    let mut d = Daemon::start(
        &dir,
        "d",
        json!({"readTimeout": "60s", "shutdownTimeout": "300ms"}),
    );
    d.ready();
    let path = d.sock.clone();
    let _slow = start_slow_request(&path);
    wait_until(T, "slow request accepted", || {
        http::request(&path, "GET", "/metrics", b"")
            .map(|r| r.body_str().contains("plexus_connections_open 2"))
            .unwrap_or(false)
    });
    let t0 = Instant::now();
    d.terminate();
    assert!(d.wait_exit(T).success());
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(10), "drain took {took:?}");
}

#[test]
fn idle_timeout_should_exit_cleanly() {
    let dir = TestDir::new("idle");
    let mut d = Daemon::start(&dir, "d", json!({"idleTimeout": "200ms"}));
    d.ready();
    assert_eq!(http::healthz(&d.sock), 200);
    let st = d.wait_exit(T);
    assert!(st.success(), "{st:?}");
    assert!(d.notifications().iter().any(|m| m.contains("STOPPING=1")));
}

#[test]
fn watchdog_should_be_pinged_when_enabled() {
    let dir = TestDir::new("watchdog");
    let mut d = Daemon::start_env(&dir, "d", json!({}), &[("WATCHDOG_USEC", "200000")]);
    d.ready();
    // Pings must keep coming: with WATCHDOG_USEC 200 ms systemd expects one
    // at least every 200 ms, so a daemon that pings once (or stops) fails.
    let start = Instant::now();
    wait_until(Duration::from_secs(5), "3 WATCHDOG=1 pings", || {
        d.notifications()
            .iter()
            .filter(|m| m.contains("WATCHDOG=1"))
            .count()
            >= 3
    });
    let pings = d
        .notifications()
        .iter()
        .filter(|m| m.contains("WATCHDOG=1"))
        .count();
    assert!(pings >= 3, "{pings} pings");
    // Three pings should take about 2-3 half-periods, far under the bound.
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn log_file_should_receive_the_log() {
    let dir = TestDir::new("logfile");
    let log = dir.join("plexusd.log");
    let mut d = Daemon::start(
        &dir,
        "d",
        json!({"logFile": log.to_str().unwrap(), "logLevel": "info"}),
    );
    d.ready();
    d.terminate();
    assert!(d.wait_exit(T).success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("serving"), "{text}");
    assert!(text.contains("stopped"), "{text}");
    // logToStderr defaults to off once a log file is set.
    assert!(!d.log_text().contains("serving"), "{}", d.log_text());
}

#[test]
fn metrics_port_should_serve_metrics_over_tcp() {
    let dir = TestDir::new("metricsport");
    let port = http::free_port("127.0.0.1");
    let mut d = Daemon::start(&dir, "d", json!({"metricsPort": port}));
    d.ready();
    let r = http::metrics_over_tcp(port);
    assert_eq!(r.status, 200);
    assert!(r.body_str().contains("plexus_connections_open"));
    d.terminate();
    assert!(d.wait_exit(T).success());
}
