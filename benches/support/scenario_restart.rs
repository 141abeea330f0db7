//! Scenario 7: restart under load, with the repository's unit files.

use std::collections::BTreeSet;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::report::{met, Section, Table, Target};
use crate::setup::{shim_call, Failures, Network, CNI_BIN, LOG_LEVEL};
use crate::stats::{fmt_ms, Samples};
use crate::support::http;
use crate::support::netns::Netns;
use crate::support::systemd::{self, plexus_units, Manager, SERVICE_UNIT, SOCKET_UNIT};
use crate::Counts;

#[derive(Clone, Copy, PartialEq)]
enum Load {
    Cni,
    Healthz,
}

pub fn restart_under_load(sec: &mut Section, c: &Counts) {
    if let Some(why) = systemd::skip_reason() {
        sec.para(&format!(
            "Skipped: the systemd harness cannot run here ({why})."
        ));
        sec.target(Target::new(
            "failed requests across restarts",
            "0",
            format!("not run ({why})"),
            None,
        ));
        return;
    }
    // Made before the manager: its private mount namespace copies the
    // namespace's /run/netns mount when it starts.
    let netns = Netns::new();
    let Some(m) = Manager::start() else {
        sec.para("Skipped: the systemd manager did not start.");
        return;
    };
    let work = m.work_dir().to_path_buf();
    let conf = work.join("conf");
    fs::create_dir_all(&conf).unwrap();
    let net = Network::loopback();
    fs::write(
        conf.join(&net.file),
        serde_json::to_vec(&net.config).unwrap(),
    )
    .unwrap();
    let cfg = json!({
        "socketDir": work.join("sock"),
        "logLevel": LOG_LEVEL,
        "confDir": conf,
        "binDir": CNI_BIN,
        "stateDir": work.join("plexus-state"),
        "clusterNetwork": net.name,
    });
    fs::write(
        work.join("daemon-config.json"),
        serde_json::to_vec_pretty(&cfg).unwrap(),
    )
    .unwrap();
    let (socket, service) = plexus_units(&work, true);
    m.install_units(&[(SOCKET_UNIT, &socket), (SERVICE_UNIT, &service)]);
    m.systemctl_ok(&["start", SOCKET_UNIT]);
    let sock = work.join("sock/plexus.sock");

    // The first call starts the service; it tells whether real CNI calls
    // work under the unit's sandbox.
    let probe = shim_call(&sock, "ADD", "rs-probe", &netns.path, "lo").run();
    let load = if probe.ok() {
        let _ = shim_call(&sock, "DEL", "rs-probe", &netns.path, "lo").run();
        Load::Cni
    } else {
        sec.para(&format!(
            "A loopback ADD through the shim failed under the unit ({}); the load below is \
             `GET /healthz` over the socket instead.",
            probe.describe()
        ));
        Load::Healthz
    };
    m.wait_property(
        SERVICE_UNIT,
        "ActiveState",
        "active",
        Duration::from_secs(10),
    );
    let main_pid = || m.show(SERVICE_UNIT, "MainPID");
    let mut pids = vec![main_pid()];

    const CLIENTS: usize = 4;
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (stop, total, sock, ns) = (
                stop.clone(),
                total.clone(),
                sock.clone(),
                netns.path.clone(),
            );
            thread::spawn(move || {
                let mut samples = Samples::new();
                let mut fails = Failures::default();
                let mut n = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    match load {
                        Load::Cni => {
                            let cid = format!("rs-{t}-{n}");
                            for cmd in ["ADD", "DEL"] {
                                let o = shim_call(&sock, cmd, &cid, &ns, "lo").run();
                                samples.push(o.elapsed);
                                fails.note(cmd, &o);
                                total.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Load::Healthz => {
                            let t0 = Instant::now();
                            let r = http::request(&sock, "GET", "/healthz", b"");
                            samples.push(t0.elapsed());
                            match r {
                                Ok(r) if r.status == 200 => {}
                                Ok(r) => fails.note_msg(format!("status {}", r.status)),
                                Err(e) => fails.note_msg(e.to_string()),
                            }
                            total.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    n += 1;
                }
                (samples, fails)
            })
        })
        .collect();

    let progress = |k: usize| {
        let target = total.load(Ordering::SeqCst) + k;
        m.wait_for(
            &format!("{target} client calls"),
            Duration::from_secs(60),
            || total.load(Ordering::SeqCst) >= target,
        );
    };
    let mut restart_times = Samples::new();
    let started = Instant::now();
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        for i in 0..c.restarts {
            progress(c.calls_between_restarts);
            let t0 = Instant::now();
            m.systemctl_ok(&["restart", SERVICE_UNIT]);
            restart_times.push(t0.elapsed());
            pids.push(main_pid());
            eprintln!("   restart {} done", i + 1);
        }
        progress(c.calls_between_restarts);
    }));
    stop.store(true, Ordering::SeqCst);
    let mut samples = Samples::new();
    let mut fails = Failures::default();
    for h in clients {
        let (s, f) = h.join().expect("client thread panicked");
        samples.extend(&s);
        fails.count += f.count;
        for m in f.first {
            if fails.first.len() < 3 {
                fails.first.push(m);
            }
        }
    }
    let elapsed = started.elapsed();
    if let Err(p) = result {
        panic::resume_unwind(p);
    }
    let distinct: BTreeSet<&String> = pids.iter().filter(|p| p.as_str() != "0").collect();

    let what = match load {
        Load::Cni => {
            "real CNI calls: loopback ADD then DEL through plexus-shim, fresh container ids"
        }
        Load::Healthz => "`GET /healthz` over the socket",
    };
    sec.para(&format!(
        "The repository's `systemd/plexusd.socket` and `plexusd.service` (paths substituted, \
         output to a file, no start rate limit) under the private `systemd --user` manager of \
         tests/integration/support/systemd.rs. {CLIENTS} clients call continuously ({what}), one netns; \
         `systemctl restart plexusd.service` {} times, {} client calls apart.",
        c.restarts, c.calls_between_restarts
    ));
    let ok = Some(fails.count == 0);
    let mut t = Table::new(&["measurement", "value", "target", "met?"]);
    t.row(vec![
        "client calls (all clients)".into(),
        format!("{} in {:.1} s", samples.len(), elapsed.as_secs_f64()),
        "—".into(),
        "—".into(),
    ]);
    t.row(vec![
        "failed calls".into(),
        fails.count.to_string(),
        "0".into(),
        met(ok),
    ]);
    t.row(vec![
        "longest call (the worst stall)".into(),
        fmt_ms(samples.max()),
        "—".into(),
        "—".into(),
    ]);
    t.row(vec![
        "call p50 / p99".into(),
        format!("{} / {}", fmt_ms(samples.p50()), fmt_ms(samples.p99())),
        "—".into(),
        "—".into(),
    ]);
    t.row(vec![
        "`systemctl restart` p50 / max".into(),
        format!(
            "{} / {}",
            fmt_ms(restart_times.p50()),
            fmt_ms(restart_times.max())
        ),
        "—".into(),
        "—".into(),
    ]);
    t.row(vec![
        "distinct plexusd MainPIDs".into(),
        format!("{} (restarts: {})", distinct.len(), c.restarts),
        "—".into(),
        "—".into(),
    ]);
    sec.table(&t);
    fails.report(sec, "client");
    sec.target(Target::new(
        "failed requests across restarts",
        "0",
        format!(
            "{} of {} ({}), longest stall {}",
            fails.count,
            samples.len(),
            if load == Load::Cni {
                "CNI calls"
            } else {
                "/healthz"
            },
            fmt_ms(samples.max())
        ),
        ok,
    ));
    drop(m);
    drop(netns);
}
