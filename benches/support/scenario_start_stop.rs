//! Scenario 6: start and stop: exec to READY=1, and SIGTERM to exit.

use std::fs::{self, File};
use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::procs::{poll, unix_listening, ChildGuard};
use crate::report::{met, Section, Table, Target};
use crate::setup::{shim_call, write_network, Failures, Network, CNI_BIN, LOG_LEVEL, PLEXUSD};
use crate::stats::{fmt_delta, fmt_ms, Samples};
use crate::support::cni::Engine;
use crate::support::cni::PLUGIN_PATH;
use crate::support::http;
use crate::support::netns::Netns;
use crate::{is_root, Counts};

fn loopback_config(engine: &Engine, sock_dir: &Path) -> PathBuf {
    let net = Network::loopback();
    write_network(engine, &net);
    let cfg = json!({
        "confDir": engine.conf_dir,
        "binDir": CNI_BIN,
        "stateDir": engine.state_dir,
        "clusterNetwork": net.name,
        "logLevel": LOG_LEVEL,
        "socketDir": sock_dir,
    });
    let path = engine.dir.join("daemon-config.json");
    fs::write(&path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    path
}

pub fn start_stop(sec: &mut Section, c: &Counts) {
    let engine = Engine::new("bench-start");
    let sock_dir = engine.dir.join("sock");
    let cfg = loopback_config(&engine, &sock_dir);
    let sock = sock_dir.join("plexus.sock");
    let log = File::create(engine.dir.join("plexusd.log")).unwrap();
    let (mut healthy, mut ready, mut stop) = (Samples::new(), Samples::new(), Samples::new());
    let mut fails = Failures::default();
    for i in 0..c.ready {
        let notify_path = engine.dir.join(&format!("notify-{i}"));
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let waiter = thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match notify.recv(&mut buf) {
                    Ok(n) if String::from_utf8_lossy(&buf[..n]).contains("READY=1") => {
                        return Some(Instant::now())
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return None,
                }
            }
        });
        let mut cmd = Command::new(PLEXUSD);
        cmd.arg("--config")
            .arg(&cfg)
            .env_clear()
            .env("PATH", PLUGIN_PATH)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log.try_clone().unwrap());
        let t0 = Instant::now();
        let mut child = ChildGuard::new(cmd.spawn().expect("spawn plexusd"));
        let mut up = false;
        poll(Duration::from_secs(10), Duration::from_micros(100), || {
            up = matches!(http::request(&sock, "GET", "/healthz", b""), Ok(r) if r.status == 200);
            up
        });
        let t_healthy = t0.elapsed();
        let t_ready = waiter.join().ok().flatten().map(|t| t - t0);
        let _ = fs::remove_file(&notify_path);
        if !up {
            fails.note_msg(format!("run {i}: no /healthz 200 within 10 s"));
            continue;
        }
        healthy.push(t_healthy);
        match t_ready {
            Some(d) => ready.push(d),
            None => fails.note_msg(format!("run {i}: no READY=1 within 10 s")),
        }
        let (d, code) = child.stop_timed(libc::SIGTERM, Duration::from_secs(15));
        stop.push(d);
        if code != Some(0) {
            fails.note_msg(format!("run {i}: exit {code:?} after SIGTERM"));
        }
    }

    let mut t = Table::new(&["measurement", "n", "p50", "p99", "max", "target", "met?"]);
    let ok_ready = healthy.p50().map(|d| d <= Duration::from_millis(10));
    let ok_stop = stop.p50().map(|d| d <= Duration::from_millis(100));
    let mut row = |what: &str, s: &Samples, target: &str, ok: Option<bool>| {
        t.row(vec![
            what.into(),
            s.len().to_string(),
            fmt_ms(s.p50()),
            fmt_ms(s.p99()),
            fmt_ms(s.max()),
            target.into(),
            if target == "—" {
                "—".into()
            } else {
                met(ok)
            },
        ]);
    };
    row(
        "exec of plexusd → first `/healthz` 200 (polled every 0.1 ms)",
        &healthy,
        "p50 ≤ 10 ms",
        ok_ready,
    );
    row("exec of plexusd → READY=1 received", &ready, "—", None);
    row(
        "SIGTERM when idle → exit (waitpid)",
        &stop,
        "p50 ≤ 100 ms",
        ok_stop,
    );
    sec.target(Target::new(
        "exec → first /healthz 200",
        "≤ 10 ms",
        format!("{} (p99 {})", fmt_ms(healthy.p50()), fmt_ms(healthy.p99())),
        ok_ready,
    ));
    sec.target(Target::new(
        "SIGTERM → exit when idle",
        "≤ 100 ms",
        format!("{} (p99 {})", fmt_ms(stop.p50()), fmt_ms(stop.p99())),
        ok_stop,
    ));

    // Socket activation: cold first call vs warm calls.
    let have_ssa = Command::new("systemd-socket-activate")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_ssa || !is_root() {
        row(
            "first ADD through socket activation",
            &Samples::new(),
            "—",
            None,
        );
        sec.table(&t);
        sec.para(if have_ssa {
            "Socket activation skipped: not running as root (needs a network namespace)."
        } else {
            "Socket activation skipped: `systemd-socket-activate` is not installed."
        });
        fails.report(sec, "start/stop");
        return;
    }
    let netns = Netns::new();
    let (mut cold, mut warm, mut warm_del, mut act_stop) = (
        Samples::new(),
        Samples::new(),
        Samples::new(),
        Samples::new(),
    );
    for i in 0..c.cold {
        let dir = engine.dir.join(&format!("act-{i}"));
        fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("plexus.sock");
        let mut launcher = ChildGuard::new(
            Command::new("systemd-socket-activate")
                .arg("-l")
                .arg(&sock)
                .arg("--fdname=plexus")
                .arg(PLEXUSD)
                .arg("--config")
                .arg(&cfg)
                .env_clear()
                .env("PATH", PLUGIN_PATH)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log.try_clone().unwrap())
                .spawn()
                .expect("spawn systemd-socket-activate"),
        );
        if !poll(Duration::from_secs(10), Duration::from_millis(1), || {
            unix_listening(&sock)
        }) {
            fails.note_msg(format!("activation {i}: {} never listened", sock.display()));
            continue;
        }
        let o = shim_call(&sock, "ADD", &format!("cold-{i}"), &netns.path, "lo").run();
        fails.note("cold ADD", &o);
        cold.push(o.elapsed);
        let o = shim_call(&sock, "DEL", &format!("cold-{i}"), &netns.path, "lo").run();
        fails.note("DEL", &o);
        for j in 0..c.warm_per_cold {
            let cid = format!("warm-{i}-{j}");
            let o = shim_call(&sock, "ADD", &cid, &netns.path, "lo").run();
            fails.note("warm ADD", &o);
            warm.push(o.elapsed);
            let o = shim_call(&sock, "DEL", &cid, &netns.path, "lo").run();
            fails.note("warm DEL", &o);
            warm_del.push(o.elapsed);
        }
        let (d, code) = launcher.stop_timed(libc::SIGTERM, Duration::from_secs(15));
        act_stop.push(d);
        if code != Some(0) {
            fails.note_msg(format!("activation {i}: exit {code:?} after SIGTERM"));
        }
    }
    row(
        "socket-activated: first shim ADD, plexusd not yet running (cold)",
        &cold,
        "—",
        None,
    );
    row("socket-activated: later shim ADD (warm)", &warm, "—", None);
    row(
        "socket-activated: later shim DEL (warm)",
        &warm_del,
        "—",
        None,
    );
    row(
        "socket-activated: SIGTERM after the calls → exit",
        &act_stop,
        "—",
        None,
    );
    sec.table(&t);
    if !cold.is_empty() {
        sec.para(&format!(
            "Cold minus warm ADD (p50): {} — the price of starting plexusd on the first call \
         (exec, config, the loopback plugin's VERSION query, first record write).",
            fmt_delta(cold.p50(), warm.p50())
        ));
    }
    fails.report(sec, "start/stop");
}
