//! The CNI call path benchmark: Plexus (`plexus-shim` -> `plexusd` -> the
//! real plugin) side by side with executing Debian's CNI plugins directly,
//! in the same run, interleaved call by call (or burst by burst).
//!
//! `cargo bench --bench cni_path` prints a markdown report on stdout
//! (progress goes to stderr) and writes the same report to `BENCHMARKS.md`
//! at the repository root. It needs root (network namespaces, links, a
//! private systemd manager); what cannot run says so in the report.
//!
//! * `PLEXUS_BENCH_QUICK=1`: far fewer iterations, for trying the bench
//!   out; the numbers mean little and the report says so.
//! * `PLEXUS_BENCH_OUT=<path>`: write the report there instead.
//! * `PLEXUS_BENCH_ONLY=1,4` or `PLEXUS_BENCH_ONLY=floods`: run only these
//!   scenarios, by number or by the first word of their title.
//!
//! The bench reports; it never fails on a missed target. Everything it
//! creates (namespaces, links, temp dirs, processes) is owned by a guard
//! and removed also when a scenario panics; a scenario that panics is
//! reported as such and the others still run.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "support/scenario_floods.rs"]
mod floods;

#[path = "support/flood.rs"]
mod flood;
#[path = "support/procs.rs"]
mod procs;
#[path = "support/report.rs"]
mod report;
#[path = "support/stats.rs"]
mod stats;

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixDatagram;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use procs::{
    burst, children_cpu, poll, proc_cpu, status_kib, unix_listening, Call, ChildGuard, Outcome,
    SYS_PATH,
};
use report::{met, Section, Table, Target};
use stats::{fmt_bytes, fmt_delta, fmt_kib, fmt_ms, fmt_ms_f, fmt_ratio, ms, ratio, Samples};
use support::cni::{self as cnisup, Engine};
use support::daemon::{Daemon, TestDir};
use support::http;
use support::netns::{Link, Netns, Subnet};
use support::systemd::{self, Manager};

const PLEXUSD: &str = env!("CARGO_BIN_EXE_plexusd");
const SHIM: &str = env!("CARGO_BIN_EXE_plexus-shim");
const CNI_BIN: &str = "/usr/lib/cni";
const CNI_ARGS: &str = "IgnoreUnknown=1";
/// The daemon's log level in every scenario (its default).
const LOG_LEVEL: &str = "info";

/// Iteration counts.
#[derive(Debug, Clone)]
struct Counts {
    quick: bool,
    /// Sequential loopback ADD+DEL pairs per side.
    seq: usize,
    /// Sequential bridge + host-local ADD+DEL pairs per side.
    bridge: usize,
    /// Untimed ADD+DEL pairs per side before the timed ones.
    warmup: usize,
    /// shim VERSION runs (and as many of each reference).
    version: usize,
    bursts: Vec<usize>,
    burst_rounds: usize,
    /// exec -> ready -> SIGTERM cycles.
    ready: usize,
    /// Cold starts through systemd-socket-activate.
    cold: usize,
    /// Warm ADD+DEL pairs after each cold start.
    warm_per_cold: usize,
    restarts: usize,
    /// Client calls between two restarts.
    calls_between_restarts: usize,
    /// Record write pattern repetitions.
    record_io: usize,
    /// Calls of each command counted under strace.
    strace_calls: usize,
    /// Idle connections opened before each flooded ADD.
    flood_conns: usize,
    /// Timed ADDs with and without the idle flood.
    flood_rounds: usize,
    /// Concurrent ~1 MiB requests.
    big_bodies: usize,
    /// ADDs of the plugin whose child keeps its pipes.
    setsid_adds: usize,
}

impl Counts {
    fn new(quick: bool) -> Self {
        if quick {
            return Self {
                quick,
                seq: 10,
                bridge: 5,
                warmup: 1,
                version: 50,
                bursts: vec![8, 32],
                burst_rounds: 1,
                ready: 3,
                cold: 2,
                warm_per_cold: 2,
                restarts: 2,
                calls_between_restarts: 8,
                record_io: 20,
                strace_calls: 5,
                flood_conns: 5000,
                flood_rounds: 3,
                big_bodies: 200,
                setsid_adds: 20,
            };
        }
        Self {
            quick,
            seq: 200,
            bridge: 200,
            warmup: 3,
            version: 1000,
            bursts: vec![64, 256],
            burst_rounds: 5,
            ready: 20,
            cold: 5,
            warm_per_cold: 4,
            restarts: 5,
            calls_between_restarts: 40,
            record_io: 200,
            strace_calls: 20,
            flood_conns: 5000,
            flood_rounds: 5,
            big_bodies: 1000,
            setsid_adds: 20,
        }
    }
}

// ---------------------------------------------------------------------------
// CNI calls

/// The environment of one CNI call, as a runtime gives it to a plugin (and
/// as plexusd gives it to the delegate: the CNI variables and `PATH`).
fn cni_env(command: &str, container_id: &str, netns: &str, ifname: &str) -> Vec<(String, String)> {
    let mut env = vec![
        ("CNI_COMMAND".to_string(), command.to_string()),
        ("PATH".to_string(), SYS_PATH.to_string()),
    ];
    if command != "VERSION" {
        env.extend([
            ("CNI_CONTAINERID".to_string(), container_id.to_string()),
            ("CNI_NETNS".to_string(), netns.to_string()),
            ("CNI_IFNAME".to_string(), ifname.to_string()),
            ("CNI_ARGS".to_string(), CNI_ARGS.to_string()),
            ("CNI_PATH".to_string(), CNI_BIN.to_string()),
        ]);
    }
    env
}

/// The shim's stdin: the runtime's view of the Plexus network.
fn shim_stdin(sock: &Path) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": "plexus",
        "type": "plexus-shim",
        "socketPath": sock,
        "timeout": "60s",
    }))
    .unwrap()
}

fn shim_call(sock: &Path, command: &str, cid: &str, netns: &str, ifname: &str) -> Call {
    Call::new(SHIM, cni_env(command, cid, netns, ifname), shim_stdin(sock))
}

/// A network as Plexus sees it (a file in confDir) and as the direct
/// baseline calls its one plugin.
struct Network {
    /// Name in confDir and for `clusterNetwork`.
    name: String,
    file: String,
    config: Value,
    /// The plugin the baseline executes.
    plugin: PathBuf,
    /// The plugin's stdin at ADD, as plexusd builds it: the plugin's entry
    /// with the list's `name` and the negotiated `cniVersion`.
    stdin: Value,
    ifname: String,
}

impl Network {
    fn loopback() -> Self {
        let conf = json!({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"});
        Self {
            name: "lo".into(),
            file: "lo.conf".into(),
            config: conf.clone(),
            plugin: Path::new(CNI_BIN).join("loopback"),
            stdin: conf,
            ifname: "lo".into(),
        }
    }

    fn bridge(bridge: &str, ipam: Value) -> Self {
        let entry = cnisup::bridge(bridge, ipam);
        let name = "plexus-bench-br";
        let mut stdin = entry.clone();
        stdin["name"] = json!(name);
        stdin["cniVersion"] = json!("1.0.0");
        Self {
            name: name.into(),
            file: "10-bench-br.conflist".into(),
            config: cnisup::conflist(name, "1.0.0", vec![entry]),
            plugin: Path::new(CNI_BIN).join("bridge"),
            stdin,
            ifname: "eth0".into(),
        }
    }

    /// The direct call: ADD with the conf, DEL with the ADD's result as
    /// `prevResult` (as plexusd does from its record).
    fn direct(&self, command: &str, cid: &str, netns: &str, prev: Option<&Value>) -> Call {
        let mut stdin = self.stdin.clone();
        if let Some(p) = prev {
            stdin["prevResult"] = p.clone();
        }
        Call::new(
            &self.plugin,
            cni_env(command, cid, netns, &self.ifname),
            serde_json::to_vec(&stdin).unwrap(),
        )
    }
}

/// Starts plexusd on `engine` with `network` as the cluster network and
/// waits for READY=1. `extra` is merged into the config.
fn start_daemon(
    engine: &Engine,
    tag: &str,
    network: &Network,
    state_dir: &Path,
    extra: Value,
) -> Daemon {
    let mut cfg = json!({
        "confDir": engine.conf_dir,
        "binDir": CNI_BIN,
        "stateDir": state_dir,
        "clusterNetwork": network.name,
        "logLevel": LOG_LEVEL,
        "socketDir": engine.dir.join(&format!("sock-{tag}")),
    });
    for (k, v) in extra.as_object().expect("extra config object") {
        cfg[k] = v.clone();
    }
    let mut d = Daemon::start(&engine.dir, tag, cfg);
    d.ready();
    d
}

fn write_network(engine: &Engine, net: &Network) {
    engine.write_network(&net.file, &net.config);
}

/// Failed calls: how many, and the first few messages.
#[derive(Default)]
struct Failures {
    count: usize,
    first: Vec<String>,
}

impl Failures {
    fn note(&mut self, what: &str, o: &Outcome) {
        if !o.ok() {
            self.count += 1;
            if self.first.len() < 3 {
                self.first.push(format!("{what}: {}", o.describe()));
            }
        }
    }

    fn note_msg(&mut self, msg: String) {
        self.count += 1;
        if self.first.len() < 3 {
            self.first.push(msg);
        }
    }

    fn report(&self, sec: &mut Section, what: &str) {
        if self.count > 0 {
            sec.para(&format!(
                "**{} failed {what} call(s).** First: {}",
                self.count,
                self.first.join(" / ")
            ));
        }
    }
}

// ---------------------------------------------------------------------------
// Metrics of a running daemon

/// Sum of every sample of `name` whose labels contain all of `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut sum = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, lab) = key.split_once('{').unwrap_or((key, ""));
        if n == name && labels.iter().all(|l| lab.contains(l)) {
            if let Ok(v) = value.parse::<f64>() {
                *sum.get_or_insert(0.0) += v;
            }
        }
    }
    sum
}

fn metrics_text(sock: &Path) -> String {
    http::request(sock, "GET", "/metrics", b"")
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .unwrap_or_default()
}

/// Mean of a histogram between two scrapes, in milliseconds.
fn hist_mean_ms(before: &str, after: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let sum = |t: &str| metric(t, &format!("{name}_sum"), labels);
    let count = |t: &str| metric(t, &format!("{name}_count"), labels);
    let s = sum(after)? - sum(before).unwrap_or(0.0);
    let c = count(after)? - count(before).unwrap_or(0.0);
    (c > 0.0).then(|| s / c * 1000.0)
}

// ---------------------------------------------------------------------------
// Scenarios 1 and 2: sequential ADD and DEL

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Direct,
    Plexus,
    /// Plexus with its stateDir on tmpfs, where fsync costs next to nothing.
    PlexusTmpfs,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Direct => "direct",
            Side::Plexus => "plexus",
            Side::PlexusTmpfs => "plexus (stateDir on tmpfs)",
        }
    }
}

/// A directory removed on drop (for paths outside a [`TestDir`]).
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory on tmpfs (/dev/shm), if there is one.
fn tmpfs_dir(tag: &str) -> Option<RemoveDir> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    let is_tmpfs = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2 && f[1] == "/dev/shm" && f[2] == "tmpfs"
    });
    if !is_tmpfs {
        return None;
    }
    let p = PathBuf::from(format!(
        "/dev/shm/plexus-bench-{}-{tag}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&p);
    fs::create_dir_all(&p).ok()?;
    Some(RemoveDir(p))
}

/// Per side: samples of ADD and DEL, failures.
struct SideRun {
    side: Side,
    netns: Netns,
    sock: Option<PathBuf>,
    add: Samples,
    del: Samples,
    fails: Failures,
}

fn sequential(sec: &mut Section, c: &Counts, bridge: bool) {
    let n = if bridge { c.bridge } else { c.seq };
    let engine = Engine::new(if bridge { "bench-br" } else { "bench-lo" });
    // Guards: the bridge (made here, with a fixed MAC) and the subnet.
    let mut _bridge_guard = None;
    let net = if bridge {
        let subnet = Subnet::new();
        let br = Link::bridge();
        let net = Network::bridge(&br.name, engine.host_local(&subnet));
        sec.para(&format!(
            "Network: `bridge` (bridge `{}` made beforehand, no isGateway/ipMasq) + `host-local` \
             on {} (dataDir in a temp dir), CNI_IFNAME `eth0`.",
            br.name,
            subnet.cidr()
        ));
        _bridge_guard = Some(br);
        net
    } else {
        sec.para(
            "Network: Debian's `loopback` as a `.conf` \
             (`{\"cniVersion\":\"1.0.0\",\"name\":\"lo\",\"type\":\"loopback\"}`), CNI_IFNAME `lo`.",
        );
        Network::loopback()
    };
    write_network(&engine, &net);

    let tmpfs = if bridge { None } else { tmpfs_dir("seq") };
    sec.para(&format!(
        "{n} iterations. Each side has its own network namespace; an iteration makes one ADD \
         per side, then one DEL per side, for a fresh container id each time (the same \
         CNI_IFNAME, so ADD then DEL in one namespace). The side that goes first rotates every \
         iteration. `direct` executes the plugin with the environment plexusd gives it \
         (CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS=`{CNI_ARGS}`, \
         CNI_PATH=`{CNI_BIN}`, PATH) and the stdin plexusd would give it (the plugin's config \
         with the network's `name` and `cniVersion`; DEL also with the ADD's result as \
         `prevResult`); `plexus` is plexus-shim talking to a running plexusd (self-bound socket \
         in a temp dir; confDir, binDir `{CNI_BIN}`, stateDir{}, clusterNetwork). {} untimed \
         ADD+DEL pairs per side come first (page cache, plexusd's cached plugin VERSION).",
        if bridge {
            " in the temp dir"
        } else {
            " in the temp dir, or on tmpfs for the third side"
        },
        c.warmup
    ));
    let plexus = start_daemon(&engine, "plexus", &net, &engine.state_dir, json!({}));
    let plexus_tmpfs = tmpfs
        .as_ref()
        .map(|t| start_daemon(&engine, "tmpfs", &net, &t.0, json!({})));

    let mut sides = vec![SideRun {
        side: Side::Direct,
        netns: Netns::new(),
        sock: None,
        add: Samples::new(),
        del: Samples::new(),
        fails: Failures::default(),
    }];
    sides.push(SideRun {
        side: Side::Plexus,
        netns: Netns::new(),
        sock: Some(plexus.sock.clone()),
        add: Samples::new(),
        del: Samples::new(),
        fails: Failures::default(),
    });
    if let Some(d) = &plexus_tmpfs {
        sides.push(SideRun {
            side: Side::PlexusTmpfs,
            netns: Netns::new(),
            sock: Some(d.sock.clone()),
            add: Samples::new(),
            del: Samples::new(),
            fails: Failures::default(),
        });
    }

    let call = |s: &SideRun, command: &str, cid: &str, prev: Option<&Value>| match &s.sock {
        None => net.direct(command, cid, &s.netns.path, prev),
        Some(sock) => shim_call(sock, command, cid, &s.netns.path, &net.ifname),
    };

    // Warm-up (not counted): page cache, plexusd's plugin VERSION cache.
    for i in 0..c.warmup {
        for s in &sides {
            let cid = format!("warm-{i}-{}", s.side as u8);
            let add = call(s, "ADD", &cid, None).run();
            let prev = add.json();
            let _ = call(s, "DEL", &cid, prev.as_ref()).run();
        }
    }
    let before: Vec<String> = sides
        .iter()
        .map(|s| s.sock.as_deref().map(metrics_text).unwrap_or_default())
        .collect();

    eprintln!("   {n} iterations x {} sides", sides.len());
    let k = sides.len();
    for i in 0..n {
        // Each iteration rotates which side goes first.
        let order: Vec<usize> = (0..k).map(|j| (i + j) % k).collect();
        let mut prev: Vec<Option<Value>> = vec![None; k];
        for &j in &order {
            let s = &sides[j];
            let cid = format!("seq-{i}-{j}");
            let o = call(s, "ADD", &cid, None).run();
            prev[j] = o.json();
            let s = &mut sides[j];
            s.add.push(o.elapsed);
            s.fails.note("ADD", &o);
        }
        for &j in &order {
            let s = &sides[j];
            let cid = format!("seq-{i}-{j}");
            let o = call(s, "DEL", &cid, prev[j].as_ref()).run();
            let s = &mut sides[j];
            s.del.push(o.elapsed);
            s.fails.note("DEL", &o);
        }
    }
    let after: Vec<String> = sides
        .iter()
        .map(|s| s.sock.as_deref().map(metrics_text).unwrap_or_default())
        .collect();

    let mut t = Table::new(&[
        "call",
        "n",
        "direct p50",
        "direct p99",
        "plexus p50",
        "plexus p99",
        "plexus − direct (p50)",
        "plexus/direct p50",
        "plexus/direct p99",
        "target",
        "met?",
    ]);
    let direct = &sides[0];
    for s in &sides[1..] {
        for (cmd, ds, ps) in [("ADD", &direct.add, &s.add), ("DEL", &direct.del, &s.del)] {
            let r50 = ratio(ps.p50(), ds.p50());
            let (target, ok) = if !bridge && s.side == Side::Plexus {
                ("p50 ≤ 1.15x direct", r50.map(|r| r <= 1.15))
            } else {
                ("—", None)
            };
            let what = if s.side == Side::Plexus {
                format!(
                    "{} {cmd}",
                    if bridge {
                        "bridge+host-local"
                    } else {
                        "loopback"
                    }
                )
            } else {
                format!("loopback {cmd}, {}", s.side.label())
            };
            t.row(vec![
                what.clone(),
                ps.len().to_string(),
                fmt_ms(ds.p50()),
                fmt_ms(ds.p99()),
                fmt_ms(ps.p50()),
                fmt_ms(ps.p99()),
                fmt_delta(ps.p50(), ds.p50()),
                fmt_ratio(r50),
                fmt_ratio(ratio(ps.p99(), ds.p99())),
                target.into(),
                if target == "—" {
                    "—".into()
                } else {
                    met(ok)
                },
            ]);
            if target != "—" {
                sec.target(Target::new(
                    &format!("{what} median"),
                    target,
                    format!(
                        "{} ({} vs {})",
                        fmt_ratio(r50),
                        fmt_ms(ps.p50()),
                        fmt_ms(ds.p50())
                    ),
                    ok,
                ));
            }
        }
    }
    sec.table(&t);
    for s in &sides {
        s.fails.report(sec, s.side.label());
    }

    // Where the time goes, from the daemon's own histograms.
    let plugin = net
        .plugin
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let mut b = Table::new(&["mean per call (ms)", "ADD", "DEL"]);
    let mut rows: Vec<(String, [Option<f64>; 2])> = Vec::new();
    let mut around: Vec<[Option<f64>; 2]> = Vec::new();
    let mean = |s: &Samples| s.mean().map(ms);
    rows.push((
        "direct plugin call (bench: spawn to exit)".into(),
        [mean(&direct.add), mean(&direct.del)],
    ));
    for (j, s) in sides.iter().enumerate().skip(1) {
        let cmds = ["command=\"ADD\"", "command=\"DEL\""];
        let req = cmds.map(|c| {
            hist_mean_ms(
                &before[j],
                &after[j],
                "plexus_request_duration_seconds",
                &["endpoint=\"/cni\"", c],
            )
        });
        let plug_label = format!("plugin=\"{plugin}\"");
        let run = cmds.map(|c| {
            hist_mean_ms(
                &before[j],
                &after[j],
                "plexus_plugin_duration_seconds",
                &[&plug_label, c],
            )
        });
        let e2e = [mean(&s.add), mean(&s.del)];
        let sub = |a: [Option<f64>; 2], b: [Option<f64>; 2]| [0, 1].map(|i| Some(a[i]? - b[i]?));
        let l = s.side.label();
        rows.push((format!("{l}: shim call end to end (bench)"), e2e));
        rows.push((
            format!("{l}: daemon request time (`plexus_request_duration_seconds`)"),
            req,
        ));
        rows.push((
            format!("{l}: daemon plugin run (`plexus_plugin_duration_seconds`, {plugin})"),
            run,
        ));
        rows.push((
            format!("{l}: → outside the daemon's request timer (shim exec, connect, HTTP)"),
            sub(e2e, req),
        ));
        around.push(sub(req, run));
        rows.push((
            format!("{l}: → daemon work around the plugin (records + fsync, config, JSON)"),
            sub(req, run),
        ));
        rows.push((
            format!("{l}: → daemon plugin run − direct plugin call"),
            sub(run, [mean(&direct.add), mean(&direct.del)]),
        ));
    }
    if let [disk, tmpfs] = around[..] {
        rows.push((
            "→ fsync cost in place: daemon work around the plugin, stateDir on disk − on tmpfs"
                .into(),
            [0, 1].map(|i| Some(disk[i]? - tmpfs[i]?)),
        ));
    }
    for (label, v) in rows {
        let f = |x: Option<f64>| x.map_or_else(|| "n/a".into(), |x| format!("{x:.2}"));
        b.row(vec![label, f(v[0]), f(v[1])]);
    }
    sec.para(
        "Where the time goes (means over the timed calls; daemon times from its own \
         Prometheus histograms, scraped before and after the timed loop):",
    );
    sec.table(&b);
    let rss = |d: &Daemon| {
        format!(
            "VmRSS {} / VmHWM {}",
            fmt_kib(status_kib(d.pid(), "VmRSS")),
            fmt_kib(status_kib(d.pid(), "VmHWM"))
        )
    };
    sec.para(&format!("plexusd after this scenario: {}.", rss(&plexus)));
    drop(plexus_tmpfs);
    drop(plexus);
}

// ---------------------------------------------------------------------------
// Scenario 3: the shim alone

/// plexus-shim linked statically, as packaging/build.sh builds it for the
/// packages; `None` (with the reason) when the build fails.
fn static_shim() -> Result<PathBuf, String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = manifest.join("target/bench-static-shim");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "rustc",
            "--release",
            "--locked",
            "--quiet",
            "--bin",
            "plexus-shim",
        ])
        .arg("--target-dir")
        .arg(&target)
        .args(["--", "-C", "target-feature=+crt-static"])
        .current_dir(manifest)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(target.join("release/plexus-shim"))
}

fn shim_alone(sec: &mut Section, c: &Counts) {
    let version_stdin = br#"{"cniVersion":"1.0.0"}"#.to_vec();
    eprintln!("building the static plexus-shim (as packaged)…");
    let static_path = static_shim();
    let static_call = static_path
        .as_ref()
        .ok()
        .map(|p| Call::new(p, cni_env("VERSION", "", "", ""), version_stdin.clone()));
    let mut s_static = Samples::new();
    let shim = Call::new(SHIM, cni_env("VERSION", "", "", ""), version_stdin.clone());
    let lo = Call::new(
        Path::new(CNI_BIN).join("loopback"),
        cni_env("VERSION", "", "", ""),
        version_stdin,
    );
    let truth = Call::new("/bin/true", cni_env("VERSION", "", "", ""), Vec::new());
    let (mut s_shim, mut s_lo, mut s_true) = (Samples::new(), Samples::new(), Samples::new());
    let mut fails = Failures::default();
    let static_or_shim = static_call.as_ref().unwrap_or(&shim);
    for _ in 0..5 {
        let _ = shim.run();
        let _ = static_or_shim.run();
        let _ = lo.run();
        let _ = truth.run();
    }
    for i in 0..c.version {
        let mut order = [0, 1, 2, 3];
        order.rotate_left(i % 4);
        for k in order {
            let (call, s, what) = match k {
                0 => (&shim, &mut s_shim, "plexus-shim VERSION"),
                1 => (&lo, &mut s_lo, "loopback VERSION"),
                2 if static_call.is_some() => {
                    (static_or_shim, &mut s_static, "static plexus-shim VERSION")
                }
                2 => continue,
                _ => (&truth, &mut s_true, "/bin/true"),
            };
            let o = call.run();
            s.push(o.elapsed);
            fails.note(what, &o);
        }
    }
    let shim_out = shim.run();
    let mut t = Table::new(&["process", "n", "p50", "p99", "max", "target", "met?"]);
    let ok = s_shim.p50().map(|d| d < Duration::from_millis(1));
    t.row(vec![
        "plexus-shim VERSION (spawn to exit; `cargo build`, dynamically linked)".into(),
        s_shim.len().to_string(),
        fmt_ms(s_shim.p50()),
        fmt_ms(s_shim.p99()),
        fmt_ms(s_shim.max()),
        "p50 < 1 ms".into(),
        met(ok),
    ]);
    let ok_static = s_static.p50().map(|d| d < Duration::from_millis(1));
    match &static_path {
        Ok(_) => t.row(vec![
            "plexus-shim VERSION (statically linked, as packaging/build.sh builds it)".into(),
            s_static.len().to_string(),
            fmt_ms(s_static.p50()),
            fmt_ms(s_static.p99()),
            fmt_ms(s_static.max()),
            "p50 < 1 ms".into(),
            met(ok_static),
        ]),
        Err(e) => sec.para(&format!(
            "The static plexus-shim could not be built here: {}",
            e.lines().last().unwrap_or("")
        )),
    }
    t.row(vec![
        "Debian `loopback` VERSION (reference: a Go plugin's start)".into(),
        s_lo.len().to_string(),
        fmt_ms(s_lo.p50()),
        fmt_ms(s_lo.p99()),
        fmt_ms(s_lo.max()),
        "—".into(),
        "—".into(),
    ]);
    t.row(vec![
        "`/bin/true` (reference: the harness's spawn floor)".into(),
        s_true.len().to_string(),
        fmt_ms(s_true.p50()),
        fmt_ms(s_true.p99()),
        fmt_ms(s_true.max()),
        "—".into(),
        "—".into(),
    ]);
    sec.table(&t);
    sec.para(&format!(
        "plexus-shim's own start-to-exit cost above the spawn floor (p50 − `/bin/true` p50): {}.",
        fmt_delta(s_shim.p50(), s_true.p50())
    ));
    sec.target(Target::new(
        "plexus-shim VERSION median",
        "< 1 ms",
        format!("{} (p99 {})", fmt_ms(s_shim.p50()), fmt_ms(s_shim.p99())),
        ok,
    ));
    if static_path.is_ok() {
        sec.target(Target::new(
            "plexus-shim VERSION median, static as packaged",
            "< 1 ms",
            format!(
                "{} (p99 {})",
                fmt_ms(s_static.p50()),
                fmt_ms(s_static.p99())
            ),
            ok_static,
        ));
    }
    fails.report(sec, "VERSION");
    sec.para(&format!(
        "plexus-shim's VERSION answer: `{}`",
        shim_out.stdout.split_whitespace().collect::<String>()
    ));

    let scratch = TestDir::new("bench-sizes");
    let mut t = Table::new(&["binary", "size", "stripped"]);
    for (name, path) in [("plexus-shim", SHIM), ("plexusd", PLEXUSD)] {
        let size = fs::metadata(path).map(|m| m.len()).ok();
        let copy = scratch.join(name);
        let stripped = fs::copy(path, &copy)
            .ok()
            .and_then(|_| {
                Command::new("strip")
                    .arg(&copy)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .ok()
            })
            .filter(|s| s.success())
            .and_then(|_| fs::metadata(&copy).ok())
            .map(|m| fmt_bytes(m.len()))
            .unwrap_or_else(|| "n/a (no `strip`)".into());
        t.row(vec![
            format!("`{name}`"),
            size.map_or_else(|| "n/a".into(), fmt_bytes),
            stripped,
        ]);
    }
    sec.table(&t);
}

// ---------------------------------------------------------------------------
// Scenarios 4 and 5: bursts and daemon memory

#[derive(Default)]
struct BurstAgg {
    walls: Vec<Duration>,
    per_call: Samples,
    fails: Failures,
    calls: usize,
    /// CPU of the processes the bench ran (shims or plugins).
    cpu_callers: Duration,
    /// CPU of plexusd itself.
    cpu_daemon: Duration,
    /// CPU of the plugins plexusd ran.
    cpu_plugins: Duration,
}

impl BurstAgg {
    fn wall_p50(&self) -> Option<Duration> {
        let mut s = Samples::new();
        for w in &self.walls {
            s.push(*w);
        }
        s.p50()
    }

    fn cps(&self, size: usize) -> Option<f64> {
        self.wall_p50()
            .filter(|w| !w.is_zero())
            .map(|w| size as f64 / w.as_secs_f64())
    }
}

fn bursts(sec: &mut Section, mem: &mut Section, c: &Counts) {
    let engine = Engine::new("bench-burst");
    let net = Network::loopback();
    write_network(&engine, &net);
    let state_unl = engine.state_dir.join("unlimited");
    let state_lim = engine.state_dir.join("limit4");
    let mut unl = start_daemon(&engine, "unlimited", &net, &state_unl, json!({}));
    let idle_unl = status_kib(unl.pid(), "VmRSS");
    let mut lim = start_daemon(
        &engine,
        "limit4",
        &net,
        &state_lim,
        json!({"connectionLimit": 4}),
    );
    let idle_lim = status_kib(lim.pid(), "VmRSS");
    const MODES: [&str; 3] = [
        "direct",
        "plexus, connectionLimit unset",
        "plexus, connectionLimit 4",
    ];
    let netns: Vec<Netns> = (0..3).map(|_| Netns::new()).collect();
    let socks = [None, Some(unl.sock.clone()), Some(lim.sock.clone())];
    let pids = [None, Some(unl.pid()), Some(lim.pid())];

    let calls_for =
        |mode: usize, command: &str, ids: &[String], prev: &[Option<Value>]| -> Vec<Call> {
            ids.iter()
                .enumerate()
                .map(|(i, cid)| match &socks[mode] {
                    None => net.direct(
                        command,
                        cid,
                        &netns[mode].path,
                        prev.get(i).and_then(|p| p.as_ref()),
                    ),
                    Some(sock) => shim_call(sock, command, cid, &netns[mode].path, &net.ifname),
                })
                .collect()
        };
    // Warm-up: one call each (plexusd's VERSION cache), then idle RSS again.
    for mode in 0..3 {
        let ids = vec![format!("bwarm-{mode}")];
        let a = burst(&calls_for(mode, "ADD", &ids, &[]));
        let prev: Vec<Option<Value>> = a.outcomes.iter().map(Outcome::json).collect();
        let _ = burst(&calls_for(mode, "DEL", &ids, &prev));
    }
    let warm_unl = status_kib(unl.pid(), "VmRSS");
    let warm_lim = status_kib(lim.pid(), "VmRSS");

    // (size index, mode, command) -> aggregate
    let mut agg: Vec<Vec<[BurstAgg; 2]>> = c
        .bursts
        .iter()
        .map(|_| {
            (0..3)
                .map(|_| [BurstAgg::default(), BurstAgg::default()])
                .collect()
        })
        .collect();
    for round in 0..c.burst_rounds {
        for (si, &size) in c.bursts.iter().enumerate() {
            for j in 0..3 {
                let mode = (round + si + j) % 3;
                eprintln!("   round {round}: {size} x ADD then DEL, {}", MODES[mode]);
                let ids: Vec<String> = (0..size)
                    .map(|i| format!("burst-{round}-{size}-{mode}-{i}"))
                    .collect();
                let pid = pids[mode];
                let cpu = || {
                    let (own, kids) = pid.and_then(proc_cpu).unwrap_or_default();
                    (children_cpu(), own, kids)
                };
                let c0 = cpu();
                let add = burst(&calls_for(mode, "ADD", &ids, &[]));
                let c1 = cpu();
                let prev: Vec<Option<Value>> = add.outcomes.iter().map(Outcome::json).collect();
                let del = burst(&calls_for(mode, "DEL", &ids, &prev));
                let c2 = cpu();
                for (k, b) in [add, del].into_iter().enumerate() {
                    let a = &mut agg[si][mode][k];
                    let (x, y) = if k == 0 { (c0, c1) } else { (c1, c2) };
                    a.cpu_callers += y.0.saturating_sub(x.0);
                    a.cpu_daemon += y.1.saturating_sub(x.1);
                    a.cpu_plugins += y.2.saturating_sub(x.2);
                    a.walls.push(b.wall);
                    a.calls += b.outcomes.len();
                    for o in &b.outcomes {
                        a.per_call.push(o.elapsed);
                        a.fails.note(if k == 0 { "ADD" } else { "DEL" }, o);
                    }
                }
            }
        }
    }

    let mut t = Table::new(&[
        "burst",
        "mode",
        "calls",
        "wall p50 (of rounds)",
        "calls/s",
        "failures",
        "per call p50",
        "per call p99",
        "calls/s vs direct",
        "target",
        "met?",
    ]);
    for (si, &size) in c.bursts.iter().enumerate() {
        for (k, cmd) in ["ADD", "DEL"].iter().enumerate() {
            let direct_cps = agg[si][0][k].cps(size);
            for (mode, mode_name) in MODES.iter().enumerate() {
                let a = &agg[si][mode][k];
                let cps = a.cps(size);
                let rel = match (cps, direct_cps) {
                    (Some(p), Some(d)) if d > 0.0 && mode > 0 => Some(p / d),
                    _ => None,
                };
                let is_target = mode > 0 && *cmd == "ADD" && size == *c.bursts.last().unwrap();
                let ok = rel.map(|r| r >= 0.8 && a.fails.count == 0);
                t.row(vec![
                    format!("{size} × {cmd}"),
                    mode_name.to_string(),
                    a.calls.to_string(),
                    fmt_ms(a.wall_p50()),
                    cps.map_or_else(|| "n/a".into(), |v| format!("{v:.0}")),
                    a.fails.count.to_string(),
                    fmt_ms(a.per_call.p50()),
                    fmt_ms(a.per_call.p99()),
                    if mode == 0 {
                        "—".into()
                    } else {
                        fmt_ratio(rel)
                    },
                    if is_target {
                        "≥ 0.8x, 0 failures".into()
                    } else {
                        "—".into()
                    },
                    if is_target { met(ok) } else { "—".into() },
                ]);
                if is_target {
                    sec.target(Target::new(
                        &format!("{size}-ADD burst, {mode_name}"),
                        "≥ 0.8x direct calls/s, 0 failures",
                        format!(
                            "{} ({} vs {} calls/s), {} failures",
                            fmt_ratio(rel),
                            cps.map_or_else(|| "n/a".into(), |v| format!("{v:.0}")),
                            direct_cps.map_or_else(|| "n/a".into(), |v| format!("{v:.0}")),
                            a.fails.count
                        ),
                        ok,
                    ));
                }
            }
        }
    }
    sec.para(&format!(
        "Each burst starts every call at once (one thread per call released by a barrier; wall \
         time from the release to the last exit), {} round(s) per size with the order of the \
         three modes rotated. Loopback network, CNI_IFNAME `lo`; all calls of a mode share one \
         network namespace (the loopback plugin accepts repeated and concurrent ADDs for the \
         same `lo`: see the failure counts), each call has its own container id. The DEL burst \
         follows the ADD burst of the same mode.",
        c.burst_rounds
    ));
    sec.table(&t);
    for (si, &size) in c.bursts.iter().enumerate() {
        for (mode, mode_name) in MODES.iter().enumerate() {
            for (k, cmd) in ["ADD", "DEL"].iter().enumerate() {
                agg[si][mode][k]
                    .fails
                    .report(sec, &format!("{size} × {cmd} ({mode_name})"));
            }
        }
    }

    let mut t = Table::new(&[
        "burst",
        "mode",
        "CPU per call: shim or plugin run by the bench",
        "plexusd itself",
        "plugins run by plexusd",
        "total",
    ]);
    for (si, &size) in c.bursts.iter().enumerate() {
        for (k, cmd) in ["ADD", "DEL"].iter().enumerate() {
            for (mode, mode_name) in MODES.iter().enumerate() {
                let a = &agg[si][mode][k];
                let per = |d: Duration| {
                    if a.calls == 0 {
                        "n/a".to_string()
                    } else {
                        fmt_ms_f(ms(d) / a.calls as f64)
                    }
                };
                let na = |d: Duration| {
                    if mode == 0 {
                        "—".to_string()
                    } else {
                        per(d)
                    }
                };
                t.row(vec![
                    format!("{size} × {cmd}"),
                    mode_name.to_string(),
                    per(a.cpu_callers),
                    na(a.cpu_daemon),
                    na(a.cpu_plugins),
                    per(a.cpu_callers + a.cpu_daemon + a.cpu_plugins),
                ]);
            }
        }
    }
    sec.para(
        "Where the CPU goes in the bursts (user + system time per call, means over all rounds; \
         the bench's reaped children from getrusage, plexusd and its reaped plugins from \
         /proc/<pid>/stat, clock-tick resolution):",
    );
    sec.table(&t);

    // Memory.
    let peak_unl = status_kib(unl.pid(), "VmHWM");
    let peak_lim = status_kib(lim.pid(), "VmHWM");
    let now_unl = status_kib(unl.pid(), "VmRSS");
    let now_lim = status_kib(lim.pid(), "VmRSS");
    let mut t = Table::new(&[
        "plexusd",
        "VmRSS idle after start",
        "VmRSS after one call",
        "VmHWM (peak) after the bursts",
        "VmRSS after the bursts",
        "target",
        "met?",
    ]);
    let mib = |k: Option<u64>, lim: u64| k.map(|k| k < lim * 1024);
    for (name, idle, warm, peak, now) in [
        (
            "connectionLimit unset",
            idle_unl,
            warm_unl,
            peak_unl,
            now_unl,
        ),
        ("connectionLimit 4", idle_lim, warm_lim, peak_lim, now_lim),
    ] {
        let ok = match (mib(idle, 8), mib(peak, 32)) {
            (Some(a), Some(b)) => Some(a && b),
            _ => None,
        };
        t.row(vec![
            name.into(),
            fmt_kib(idle),
            fmt_kib(warm),
            fmt_kib(peak),
            fmt_kib(now),
            "idle < 8 MiB, peak < 32 MiB".into(),
            met(ok),
        ]);
        mem.target(Target::new(
            &format!("plexusd RSS idle ({name})"),
            "< 8 MiB",
            fmt_kib(idle),
            mib(idle, 8),
        ));
        mem.target(Target::new(
            &format!(
                "plexusd peak RSS after the {}-burst ({name})",
                c.bursts.last().unwrap()
            ),
            "< 32 MiB",
            fmt_kib(peak),
            mib(peak, 32),
        ));
    }
    mem.para(&format!(
        "VmRSS/VmHWM from /proc/<pid>/status of the two burst daemons: idle right after READY=1, \
         after one warm-up ADD+DEL, and after every burst of scenario 4 ({} rounds of {} \
         concurrent ADDs then DELs each).",
        c.burst_rounds,
        c.bursts
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    ));
    mem.table(&t);
    unl.terminate();
    lim.terminate();
    let _ = unl.child.wait();
    let _ = lim.child.wait();
}

// ---------------------------------------------------------------------------
// Scenario 6: start and stop

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

fn start_stop(sec: &mut Section, c: &Counts) {
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
            .env("PATH", SYS_PATH)
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
                .env("PATH", SYS_PATH)
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

// ---------------------------------------------------------------------------
// Scenario 7: restart under load, with the repository's unit files

const SOCKET_UNIT: &str = "plexusd.socket";
const SERVICE_UNIT: &str = "plexusd.service";

fn replace_once(text: &str, from: &str, to: &str, unit: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "{unit} no longer contains exactly one {from:?}"
    );
    text.replacen(from, to, 1)
}

/// The repository's units with what tests/systemd_units.rs substitutes:
/// the socket path and ExecStart (a copy of the built plexusd in the work
/// dir, outside /tmp because of PrivateTmp=yes), output to a log file (no
/// journald here), and no start rate limit (we restart on purpose).
fn plexus_units(work: &Path) -> (String, String) {
    let unit = |name: &str| {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("systemd")
            .join(name);
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
    };
    let sock = work.join("sock/plexus.sock");
    let socket = replace_once(
        &unit(SOCKET_UNIT),
        "/run/plexus/plexus.sock",
        sock.to_str().unwrap(),
        SOCKET_UNIT,
    );
    let bin = work.join("plexusd");
    fs::copy(PLEXUSD, &bin).expect("copy plexusd into the work dir");
    let exec = format!(
        "ExecStart={} --config {}",
        bin.display(),
        work.join("daemon-config.json").display()
    );
    let mut service = replace_once(
        &unit(SERVICE_UNIT),
        "ExecStart=/usr/bin/plexusd --config /etc/plexus/daemon-config.json",
        &exec,
        SERVICE_UNIT,
    );
    service = replace_once(
        &service,
        "[Unit]\n",
        "[Unit]\nStartLimitIntervalSec=0\n",
        SERVICE_UNIT,
    );
    let log = work.join("plexusd.log");
    service = replace_once(
        &service,
        "[Service]\n",
        &format!(
            "[Service]\nStandardOutput=append:{0}\nStandardError=append:{0}\n",
            log.display()
        ),
        SERVICE_UNIT,
    );
    (socket, service)
}

#[derive(Clone, Copy, PartialEq)]
enum Load {
    Cni,
    Healthz,
}

fn restart_under_load(sec: &mut Section, c: &Counts) {
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
    let (socket, service) = plexus_units(&work);
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
         tests/support/systemd.rs. {CLIENTS} clients call continuously ({what}), one netns; \
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

// ---------------------------------------------------------------------------
// Record writes: the cost of the attachment record's fsyncs

/// Writes `body` as a record save does: a temporary file, rename over the
/// record; `sync` adds an fsync of the file before the rename and of the
/// directory after it.
fn record_save(dir: &Path, seq: usize, body: &[u8], sync: bool) -> io::Result<()> {
    let tmp = dir.join(format!(".rec.{seq}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(body)?;
    if sync {
        f.sync_all()?;
    }
    drop(f);
    fs::rename(&tmp, dir.join("rec.json"))?;
    if sync {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Removes the record; `sync` adds an fsync of the directory.
fn record_remove(dir: &Path, sync: bool) -> io::Result<()> {
    fs::remove_file(dir.join("rec.json"))?;
    if sync {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Whether every thread of `pid` is being traced.
fn all_traced(pid: i32) -> bool {
    let Ok(rd) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for t in rd.flatten() {
        any = true;
        let traced = fs::read_to_string(t.path().join("status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("TracerPid:"))
                    .map(|v| v.trim() != "0")
            })
            .unwrap_or(false);
        if !traced {
            return false;
        }
    }
    any
}

/// The sync calls (fsync, fdatasync, syncfs, sync_file_range) plexusd
/// makes per loopback ADD and per DEL, counted by `strace -f -c` attached
/// to a running daemon for `n` untimed calls of each; `Err` says why not.
fn syncs_per_call(n: usize) -> Result<(f64, f64), String> {
    if procs::output_of("strace", &["-V"]).is_none() {
        return Err("`strace` is not installed".into());
    }
    let engine = Engine::new("bench-strace");
    let net = Network::loopback();
    write_network(&engine, &net);
    let d = start_daemon(&engine, "strace", &net, &engine.state_dir, json!({}));
    let netns = Netns::new();
    let call = |cmd: &str, cid: &str| shim_call(&d.sock, cmd, cid, &netns.path, &net.ifname).run();
    let _ = call("ADD", "strace-warm");
    let _ = call("DEL", "strace-warm");
    let mut per = Vec::new();
    for cmd in ["ADD", "DEL"] {
        let out = engine.dir.join(&format!("strace-{cmd}.txt"));
        let mut strace = ChildGuard::new(
            Command::new("strace")
                .args([
                    "-f",
                    "-c",
                    "-e",
                    "trace=fsync,fdatasync,syncfs,sync_file_range",
                ])
                .arg("-o")
                .arg(&out)
                .arg("-p")
                .arg(d.pid().to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot run strace: {e}"))?,
        );
        if !poll(Duration::from_secs(10), Duration::from_millis(2), || {
            all_traced(d.pid())
        }) {
            return Err("strace did not attach to every plexusd thread".into());
        }
        for i in 0..n {
            let o = call(cmd, &format!("strace-{i}"));
            if !o.ok() {
                return Err(format!("{cmd} under strace failed: {}", o.describe()));
            }
        }
        // SIGINT: strace detaches and writes its summary.
        // With no traced call at all the summary is empty.
        let _ = strace.stop_timed(libc::SIGINT, Duration::from_secs(10));
        let text = fs::read_to_string(&out).map_err(|e| format!("strace output: {e}"))?;
        // "% time  seconds  usecs/call  calls  errors  syscall": the calls
        // column is the fourth.
        let calls: f64 = text
            .lines()
            .filter(|l| {
                l.split_whitespace().last().is_some_and(|w| {
                    matches!(w, "fsync" | "fdatasync" | "syncfs" | "sync_file_range")
                })
            })
            .filter_map(|l| l.split_whitespace().nth(3)?.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b);
        per.push(calls / n as f64);
    }
    Ok((per[0], per[1]))
}

fn record_io(sec: &mut Section, c: &Counts) {
    // How many syncs the current code makes per call.
    let syncs = if is_root() {
        syncs_per_call(c.strace_calls)
    } else {
        Err("not running as root".into())
    };
    match &syncs {
        Ok((add, del)) => sec.para(&format!(
            "Sync calls (fsync, fdatasync, syncfs, sync_file_range) plexusd and its plugins \
             made per loopback call, counted with `strace -f -c` attached to a running daemon \
             for {} untimed ADDs, then as many DELs (the loopback plugin makes none): \
             **{add:.2} per ADD, {del:.2} per DEL**.",
            c.strace_calls
        )),
        Err(why) => sec.para(&format!("Sync calls per ADD/DEL not counted: {why}.")),
    }

    let scratch = TestDir::new("bench-records");
    let shm = tmpfs_dir("records");
    // About the size of a loopback attachment record.
    let body = vec![b'x'; 700];
    let mut dirs = vec![(
        format!("temp dir ({})", std::env::temp_dir().display()),
        scratch.path.clone(),
    )];
    if let Some(s) = &shm {
        dirs.push(("tmpfs (/dev/shm)".into(), s.0.clone()));
    }
    let mut t = Table::new(&["operation", "file system", "n", "p50", "p99", "max"]);
    let mut fsync_pair = None;
    for (label, dir) in &dirs {
        for sync in [true, false] {
            let (mut save, mut remove) = (Samples::new(), Samples::new());
            for i in 0..c.record_io {
                let t0 = Instant::now();
                record_save(dir, i, &body, sync).expect("record save");
                save.push(t0.elapsed());
                let t0 = Instant::now();
                record_remove(dir, sync).expect("record remove");
                remove.push(t0.elapsed());
            }
            let how = if sync {
                "fsync of file and directory"
            } else {
                "no fsync (atomic only)"
            };
            t.row(vec![
                format!("save: temporary file, write, rename; {how}"),
                label.clone(),
                save.len().to_string(),
                fmt_ms(save.p50()),
                fmt_ms(save.p99()),
                fmt_ms(save.max()),
            ]);
            t.row(vec![
                format!(
                    "remove{}",
                    if sync {
                        "; fsync of the directory"
                    } else {
                        "; no fsync"
                    }
                ),
                label.clone(),
                remove.len().to_string(),
                fmt_ms(remove.p50()),
                fmt_ms(remove.p99()),
                fmt_ms(remove.max()),
            ]);
            if fsync_pair.is_none() {
                fsync_pair = Some((save.p50(), None));
            } else if let Some((synced, None)) = fsync_pair {
                fsync_pair = Some((synced, save.p50()));
            }
        }
    }
    sec.para(&format!(
        "The building blocks of a record write, replayed in isolation ({} times each, a \
         700-byte body, about a loopback record's size) on the file system of the stateDir \
         used above and on tmpfs:",
        c.record_io
    ));
    sec.table(&t);
    if let Some((Some(synced), Some(atomic))) = fsync_pair {
        let two_fsyncs = ms(synced) - ms(atomic);
        let mut text = format!(
            "The two fsyncs of a synced save cost {} (p50, on the temp dir's file system).",
            fmt_ms_f(two_fsyncs)
        );
        if let Ok((add, _)) = syncs {
            text.push_str(&format!(
                " At {add:.2} sync calls per ADD, that is about {} per ADD; scenario 1's \
                 \"fsync cost in place\" row measures the same end to end (stateDir on disk \
                 minus on tmpfs, which includes the page-cache work of the writes too).",
                fmt_ms_f(two_fsyncs / 2.0 * add)
            ));
        }
        sec.para(&text);
    }
}

// ---------------------------------------------------------------------------

fn is_root() -> bool {
    // SAFETY: geteuid never fails.
    unsafe { libc::geteuid() == 0 }
}

/// Runs one scenario, turning a panic into a line of the report.
fn run(title: &str, needs_root: bool, f: impl FnOnce(&mut Section)) -> Section {
    eprintln!("== {title}");
    let t0 = Instant::now();
    let mut sec = Section::new(title);
    if let Ok(only) = std::env::var("PLEXUS_BENCH_ONLY") {
        let (number, name) = title.split_once(". ").unwrap_or((title, ""));
        let word = name.split_whitespace().next().unwrap_or("");
        let selected = only
            .split(',')
            .map(str::trim)
            .any(|o| o == number || (!o.is_empty() && o.eq_ignore_ascii_case(word)));
        if !selected {
            sec.para("Skipped: not selected by PLEXUS_BENCH_ONLY.");
            return sec;
        }
    }
    if needs_root && !is_root() {
        sec.para("Skipped: not running as root (needs network namespaces).");
        return sec;
    }
    let r = panic::catch_unwind(AssertUnwindSafe(|| f(&mut sec)));
    if let Err(p) = r {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(no message)".into());
        let first = msg.lines().take(12).collect::<Vec<_>>().join("\n    ");
        sec.para(&format!(
            "**This scenario did not complete**; what it measured before is above. Panic:\n\n    {first}"
        ));
    }
    eprintln!("   {:.1} s", t0.elapsed().as_secs_f64());
    sec
}

fn main() {
    let started = Instant::now();
    let c = Counts::new(std::env::var("PLEXUS_BENCH_QUICK").as_deref() == Ok("1"));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let date = report::now_utc();
    let machine = report::machine(manifest);

    let mut sections = Vec::new();
    sections.push(run("1. Sequential ADD and DEL: loopback", true, |s| {
        sequential(s, &c, false)
    }));
    sections.push(run(
        "2. Sequential ADD and DEL: bridge + host-local",
        true,
        |s| sequential(s, &c, true),
    ));
    sections.push(run("3. The shim alone", false, |s| shim_alone(s, &c)));
    let mut mem = Section::new("5. Daemon memory");
    sections.push(run("4. Bursts of concurrent calls", true, |s| {
        bursts(s, &mut mem, &c)
    }));
    if mem.body.is_empty() {
        mem.para("Not measured: scenario 4 did not run or did not complete.");
    }
    sections.push(mem);
    sections.push(run("6. Start and stop", false, |s| start_stop(s, &c)));
    sections.push(run("7. Restart under load (systemd)", true, |s| {
        restart_under_load(s, &c)
    }));
    sections.push(run(
        "8. What the attachment record's fsyncs cost",
        false,
        |s| record_io(s, &c),
    ));
    sections.push(run("9. Floods", true, |s| floods::floods(s, &c)));

    let mut out = String::new();
    out.push_str("# Plexus benchmark: the CNI call path\n\n");
    out.push_str(&format!(
        "Generated by `cargo bench --bench cni_path` on {date}; the whole run took {:.0} s. \
         Every Plexus measurement runs side by side with its direct-plugin baseline in the \
         same run, interleaved call by call (bursts: burst by burst). A call is timed from \
         `spawn` to `waitpid` of the executed process (plexus-shim or the plugin), stdin piped, \
         stdout captured. p50 is the median, p99 the nearest-rank 99th percentile. plexusd logs \
         at `{LOG_LEVEL}`.\n\n",
        started.elapsed().as_secs_f64()
    ));
    if c.quick {
        out.push_str(
            "**PLEXUS_BENCH_QUICK=1: reduced iteration counts; these numbers are only a smoke \
             test.**\n\n",
        );
    }
    let mut t = Table::new(&["machine", ""]);
    for (k, v) in machine {
        t.row(vec![k, v]);
    }
    t.row(vec![
        "load average at the end".into(),
        report::load_average(),
    ]);
    out.push_str(&t.render());
    out.push_str("\n## Targets\n\n");
    let mut t = Table::new(&["target", "measured", "goal", "met?"]);
    for s in &sections {
        for tg in &s.targets {
            t.row(vec![
                tg.what.clone(),
                tg.measured.clone(),
                tg.target.clone(),
                met(tg.met),
            ]);
        }
    }
    out.push_str(&t.render());
    out.push('\n');
    out.push_str(include_str!("limits.md"));
    for s in &sections {
        out.push_str(&format!("\n## {}\n\n{}", s.title, s.body));
    }

    print!("{out}");
    let path = std::env::var_os("PLEXUS_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("BENCHMARKS.md"));
    match fs::write(&path, &out) {
        Ok(()) => eprintln!("report written to {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}
