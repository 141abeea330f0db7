//! Scenario 13: plexusd starting each plugin through plexus-spawner
//! (`pluginSpawner`, the packaged default) side by side with plexusd
//! forking the plugin itself and with the plugin called directly:
//! sequential loopback and bridge + host-local ADD and DEL, the three sides
//! interleaved call by call; 256-call loopback ADD and DEL bursts, the three
//! modes burst by burst; the spawner's own CPU and memory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::daemon_metrics::{hist_mean_ms, metrics_text};
use crate::procs::{
    burst, children_cpu, poll, proc_cpu, status_kib, thread_times, threads_cpu_between,
    unix_listening, ChildGuard, Outcome,
};
use crate::report::{met, Section, Table, Target};
use crate::setup::{
    breakdown_table, burst_calls, daemon_config, minus, shim_call, write_network, AddDel, Failures,
    Network,
};
use crate::stats::{fmt_delta, fmt_kib, fmt_ms, fmt_ms_f, fmt_ratio, ms, Samples};
use crate::support::cni::Engine;
use crate::support::daemon::Daemon;
use crate::support::netns::{Link, Netns, Subnet};
use crate::Counts;

/// The spawner the bench starts (the build's, next to plexusd).
pub const SPAWNER: &str = env!("CARGO_BIN_EXE_plexus-spawner");

/// Most a spawner-side step may differ from the forking side (p50).
const GOAL_MS: f64 = 0.3;
/// The spawner's idle memory goal.
const GOAL_IDLE_KIB: u64 = 4 * 1024;

const SIDES: [&str; 3] = ["direct", "plexus, plexusd forks", "plexus via spawner"];
const DIRECT: usize = 0;
const FORK: usize = 1;
const SPAWN: usize = 2;

/// A plexus-spawner bound at a path of its own (`--listen`), reading
/// binDir from the spawner-side plexusd's configuration; its stderr goes
/// to a file; killed and reaped on drop.
struct Spawner {
    proc: ChildGuard,
    log: PathBuf,
}

impl Spawner {
    fn start(config: &Path, sock: &Path, log: PathBuf) -> Self {
        let child = Command::new(SPAWNER)
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn plexus-spawner");
        let proc = ChildGuard::new(child);
        assert!(
            poll(Duration::from_secs(10), Duration::from_micros(200), || {
                unix_listening(sock)
            }),
            "plexus-spawner did not listen on {}",
            sock.display()
        );
        Self { proc, log }
    }

    fn pid(&self) -> i32 {
        self.proc.pid()
    }

    /// Its own CPU and its reaped children's (the plugins).
    fn cpu(&self) -> (Duration, Duration) {
        proc_cpu(self.pid()).unwrap_or_default()
    }

    /// What it printed (errors only), for the report.
    fn complaints(&self) -> Option<String> {
        let text = fs::read_to_string(&self.log).ok()?;
        let lines: Vec<&str> = text.lines().take(3).collect();
        (!lines.is_empty()).then(|| lines.join(" / "))
    }
}

/// plexusd forking its plugins, a spawner, and plexusd asking it.
struct Daemons {
    fork: Daemon,
    spawn: Daemon,
    spawner: Spawner,
    /// The spawner's VmRSS right after it listened, before any request.
    spawner_idle: Option<u64>,
}

fn start_daemons(engine: &Engine, net: &Network) -> Daemons {
    let cfg = daemon_config(
        engine,
        "fork",
        net,
        &engine.state_dir.join("fork"),
        json!({}),
    );
    let mut fork = Daemon::start(&engine.dir, "fork", cfg);
    fork.ready();
    let sock = engine.dir.join("spawner.sock");
    let cfg = daemon_config(
        engine,
        "spawn",
        net,
        &engine.state_dir.join("spawn"),
        json!({ "pluginSpawner": sock }),
    );
    // The file Daemon::start writes for tag `spawn`, written first for the
    // spawner (it reads binDir from it).
    let cfg_path = engine.dir.join("spawn.json");
    fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    let spawner = Spawner::start(&cfg_path, &sock, engine.dir.join("spawner.log"));
    let spawner_idle = status_kib(spawner.pid(), "VmRSS");
    let mut spawn = Daemon::start(&engine.dir, "spawn", cfg);
    spawn.ready();
    Daemons {
        fork,
        spawn,
        spawner,
        spawner_idle,
    }
}

/// One side of the sequential loop.
struct SideRun {
    netns: Netns,
    sock: Option<PathBuf>,
    pid: Option<i32>,
    /// [ADD, DEL]
    samples: [Samples; 2],
    fails: Failures,
    /// plexus-shim (or the plugin, direct), from getrusage of the bench's
    /// reaped children.
    cpu_caller: [Duration; 2],
    /// plexusd's threads (schedstat).
    cpu_daemon: [Duration; 2],
}

impl SideRun {
    fn new(daemon: Option<&Daemon>) -> Self {
        Self {
            netns: Netns::new(),
            sock: daemon.map(|d| d.sock.clone()),
            pid: daemon.map(Daemon::pid),
            samples: [Samples::new(), Samples::new()],
            fails: Failures::default(),
            cpu_caller: [Duration::ZERO; 2],
            cpu_daemon: [Duration::ZERO; 2],
        }
    }
}

/// What the targets need from a sequential part: spawner − forking p50,
/// [ADD, DEL], in ms.
type Gap = [Option<f64>; 2];

pub fn spawner(sec: &mut Section, c: &Counts) {
    sec.para(
        "plexus-spawner is the small process that starts the plugins on plexusd's behalf when \
         plexusd's configuration sets `pluginSpawner` (the packaged default: \
         `plexus-plugins.service`, outside plexusd's sandbox, so that plugins run as a \
         container runtime would run them). For every plugin run plexusd connects to the \
         spawner's `SOCK_SEQPACKET` socket, sends the plugin's path, its CNI variables and the \
         three pipe ends, and gets the plugin's pid and a pidfd back; once the plugin has \
         exited, plexusd kills its group and asks the spawner to reap it. The spawner serves \
         each connection on a worker thread (kept for the next one) and checks every request \
         (the peer's uid, the program in a binDir directory no other user can change, binDir \
         read again from plexusd's configuration when the file changed, only CNI variables). Here the bench starts it itself, as it starts plexusd: \
         `plexus-spawner --config <that plexusd's config> --listen <temp dir>/spawner.sock`, \
         killed and reaped at the end like the daemons. Three sides: `direct` (the plugin \
         executed by the bench, as in scenarios 1 and 2), `plexus, plexusd forks` (no \
         `pluginSpawner`: plexusd starts the plugin itself, as in scenarios 1, 2 and 4) and \
         `plexus via spawner` (the same plexusd configuration plus `pluginSpawner`); both \
         Plexus sides are the static plexus-shim talking to their own plexusd, stateDir in the \
         temp dir.",
    );

    // Loopback: sequential, then the bursts with the same daemons.
    let engine = Engine::new("bench-spawn-lo");
    let lo = Network::loopback();
    write_network(&engine, &lo);
    let d = start_daemons(&engine, &lo);
    let mut seq_lo = Section::new("");
    let lo_gap = sequential(&mut seq_lo, c, &d, &lo, false);
    let spawner_warm = status_kib(d.spawner.pid(), "VmRSS");
    let mut bursts_sec = Section::new("");
    bursts(&mut bursts_sec, c, &d, &lo);
    let spawner_peak = status_kib(d.spawner.pid(), "VmHWM");
    let spawner_after = status_kib(d.spawner.pid(), "VmRSS");
    let daemon_mem = |x: &Daemon| (status_kib(x.pid(), "VmRSS"), status_kib(x.pid(), "VmHWM"));
    let (fork_mem, spawn_mem) = (daemon_mem(&d.fork), daemon_mem(&d.spawn));
    let complaints_lo = d.spawner.complaints();
    let spawner_idle = d.spawner_idle;
    drop(d);
    drop(engine);

    // Bridge + host-local: sequential.
    let engine = Engine::new("bench-spawn-br");
    let subnet = Subnet::new();
    let br = Link::bridge();
    let bridge = Network::bridge(&br.name, engine.host_local(&subnet));
    write_network(&engine, &bridge);
    let d = start_daemons(&engine, &bridge);
    let mut seq_br = Section::new("");
    seq_br.para(&format!(
        "Network: `bridge` (bridge `{}` made beforehand, no isGateway/ipMasq) + `host-local` \
         on {} (dataDir in the temp dir), CNI_IFNAME `eth0`; `bridge` runs `host-local` itself, \
         so each call is one plugin run by plexusd (or its spawner).",
        br.name,
        subnet.cidr()
    ));
    let br_gap = sequential(&mut seq_br, c, &d, &bridge, true);
    let complaints_br = d.spawner.complaints();
    drop(d);
    drop(br);
    drop(engine);

    sec.para("### Sequential ADD and DEL: loopback");
    sec.body.push('\n');
    sec.body.push_str(&seq_lo.body);
    sec.para("### Sequential ADD and DEL: bridge + host-local");
    sec.body.push('\n');
    sec.body.push_str(&seq_br.body);
    sec.para(&format!(
        "### {}-call bursts: loopback",
        c.bursts.last().unwrap()
    ));
    sec.body.push('\n');
    sec.body.push_str(&bursts_sec.body);

    sec.para("### plexus-spawner's memory");
    let mut t = Table::new(&[
        "process",
        "VmRSS idle after start",
        "VmRSS after the sequential calls",
        "VmHWM (peak) after the bursts",
        "VmRSS after the bursts",
        "target",
        "met?",
    ]);
    let idle_ok = spawner_idle.map(|k| k < GOAL_IDLE_KIB);
    t.row(vec![
        "plexus-spawner".into(),
        fmt_kib(spawner_idle),
        fmt_kib(spawner_warm),
        fmt_kib(spawner_peak),
        fmt_kib(spawner_after),
        "idle < 4 MiB".into(),
        met(idle_ok),
    ]);
    for (name, (rss, hwm)) in [
        ("plexusd (forks its plugins)", fork_mem),
        ("plexusd (asks the spawner)", spawn_mem),
    ] {
        t.row(vec![
            name.into(),
            "—".into(),
            "—".into(),
            fmt_kib(hwm),
            fmt_kib(rss),
            "—".into(),
            "—".into(),
        ]);
    }
    sec.para(
        "VmRSS/VmHWM from /proc/<pid>/status: the loopback part's spawner right after it \
         listened (no request yet), after the sequential loop, and after the bursts; the two \
         loopback daemons after the bursts for comparison.",
    );
    sec.table(&t);
    for (part, complaints) in [("loopback", complaints_lo), ("bridge", complaints_br)] {
        if let Some(text) = complaints {
            sec.para(&format!(
                "plexus-spawner ({part} part) wrote to its stderr: {text}"
            ));
        }
    }

    // Targets.
    let gap_target = |sec: &mut Section, what: &str, gap: Option<f64>| {
        sec.target(Target::new(
            what,
            "≤ 0.3 ms",
            gap.map_or_else(|| "n/a".into(), |g| format!("{g:+.3} ms")),
            gap.map(|g| g <= GOAL_MS),
        ));
    };
    gap_target(sec, "loopback ADD via spawner − forking (p50)", lo_gap[0]);
    gap_target(sec, "loopback DEL via spawner − forking (p50)", lo_gap[1]);
    gap_target(
        sec,
        "bridge+host-local ADD via spawner − forking (p50)",
        br_gap[0],
    );
    sec.target(Target::new(
        "plexus-spawner RSS idle",
        "< 4 MiB",
        fmt_kib(spawner_idle),
        idle_ok,
    ));
}

/// The three sides call by call; returns spawner − forking p50 [ADD, DEL].
fn sequential(sec: &mut Section, c: &Counts, d: &Daemons, net: &Network, bridge: bool) -> Gap {
    let n = if bridge { c.bridge } else { c.seq };
    let mut sides = [
        SideRun::new(None),
        SideRun::new(Some(&d.fork)),
        SideRun::new(Some(&d.spawn)),
    ];
    let call = |s: &SideRun, command: &str, cid: &str, prev: Option<&Value>| match &s.sock {
        None => net.direct(command, cid, &s.netns.path, prev),
        Some(sock) => shim_call(sock, command, cid, &s.netns.path, &net.ifname),
    };
    for i in 0..c.warmup {
        for (j, s) in sides.iter().enumerate() {
            let cid = format!("spwarm-{i}-{j}");
            let add = call(s, "ADD", &cid, None).run();
            let _ = call(s, "DEL", &cid, add.json().as_ref()).run();
        }
    }
    let scrape = |s: &SideRun| s.sock.as_deref().map(metrics_text).unwrap_or_default();
    let before: Vec<String> = sides.iter().map(scrape).collect();
    let spawner0 = d.spawner.cpu();
    eprintln!("   {n} iterations x 3 sides");
    let k = sides.len();
    for i in 0..n {
        let order: Vec<usize> = (0..k).map(|j| (i + j) % k).collect();
        let mut prev: Vec<Option<Value>> = vec![None; k];
        for (cmd, command) in ["ADD", "DEL"].into_iter().enumerate() {
            for &j in &order {
                let s = &sides[j];
                let cid = format!("spseq-{i}-{j}");
                let c0 = (children_cpu(), s.pid.map(thread_times).unwrap_or_default());
                let o = call(s, command, &cid, prev[j].as_ref()).run();
                let c1 = (children_cpu(), s.pid.map(thread_times).unwrap_or_default());
                if cmd == 0 {
                    prev[j] = o.json();
                }
                let s = &mut sides[j];
                s.samples[cmd].push(o.elapsed);
                s.fails.note(command, &o);
                s.cpu_caller[cmd] += c1.0.saturating_sub(c0.0);
                s.cpu_daemon[cmd] += threads_cpu_between(&c0.1, &c1.1);
            }
        }
    }
    let spawner1 = d.spawner.cpu();
    let after: Vec<String> = sides.iter().map(scrape).collect();

    sec.para(&format!(
        "{n} iterations after {} untimed ADD+DEL pairs per side. Each side has its own network \
         namespace; an iteration makes one ADD per side, then one DEL per side (the ADD's \
         result as `prevResult` for `direct`), a fresh container id each time; the side that \
         goes first rotates every iteration.",
        c.warmup
    ));
    let mut t = Table::new(&[
        "call",
        "n",
        "direct p50",
        "direct p99",
        "forks p50",
        "forks p99",
        "via spawner p50",
        "via spawner p99",
        "forks − direct (p50)",
        "via spawner − forks (p50)",
        "via spawner − forks (p99)",
    ]);
    let name = if bridge {
        "bridge+host-local"
    } else {
        "loopback"
    };
    let mut gap: Gap = [None; 2];
    for (cmd, command) in ["ADD", "DEL"].into_iter().enumerate() {
        let [dr, fo, sp] = [DIRECT, FORK, SPAWN].map(|j| &sides[j].samples[cmd]);
        gap[cmd] = match (sp.p50(), fo.p50()) {
            (Some(s), Some(f)) => Some(ms(s) - ms(f)),
            _ => None,
        };
        t.row(vec![
            format!("{name} {command}"),
            sp.len().to_string(),
            fmt_ms(dr.p50()),
            fmt_ms(dr.p99()),
            fmt_ms(fo.p50()),
            fmt_ms(fo.p99()),
            fmt_ms(sp.p50()),
            fmt_ms(sp.p99()),
            fmt_delta(fo.p50(), dr.p50()),
            fmt_delta(sp.p50(), fo.p50()),
            fmt_delta(sp.p99(), fo.p99()),
        ]);
    }
    sec.table(&t);
    for (j, s) in sides.iter().enumerate() {
        s.fails.report(sec, SIDES[j]);
    }

    // CPU per call.
    let per = |d: Duration| ms(d) / n.max(1) as f64;
    let runs = 2 * n;
    let spawner_own = spawner1.0.saturating_sub(spawner0.0);
    let spawner_kids = spawner1.1.saturating_sub(spawner0.1);
    let hz = 100.0; // USER_HZ: /proc/<pid>/stat counts in 10 ms ticks.
    let mut t = Table::new(&[
        "side",
        "call",
        "CPU per call: plexus-shim (or the plugin, direct)",
        "CPU per call: plexusd itself",
        "CPU per plugin run: plexus-spawner itself (ADD and DEL together)",
    ]);
    for (j, s) in sides.iter().enumerate() {
        for (cmd, command) in ["ADD", "DEL"].into_iter().enumerate() {
            t.row(vec![
                SIDES[j].into(),
                command.into(),
                fmt_ms_f(per(s.cpu_caller[cmd])),
                if j == DIRECT {
                    "—".into()
                } else {
                    fmt_ms_f(per(s.cpu_daemon[cmd]))
                },
                if j == SPAWN {
                    fmt_ms_f(ms(spawner_own) / runs.max(1) as f64)
                } else {
                    "—".into()
                },
            ]);
        }
    }
    sec.para(&format!(
        "CPU (user + system) summed over the timed calls: plexus-shim or the directly run \
         plugin from getrusage of the bench's reaped children, plexusd from its threads' \
         /proc/<pid>/task/<tid>/schedstat read around each call, without the plugins it ran. \
         plexus-spawner's from /proc/<pid>/stat utime+stime read before and after the whole \
         timed loop (it serves only its side's calls), divided by its {runs} plugin runs: \
         {:.0} ms in all at a resolution of {:.0} ms, so ±{:.3} ms per run. The plugins it ran \
         (its reaped children, cutime+cstime): {} per run.",
        ms(spawner_own),
        1000.0 / hz,
        1000.0 / hz / runs.max(1) as f64,
        fmt_ms_f(ms(spawner_kids) / runs.max(1) as f64),
    ));
    sec.table(&t);
    let cpu_gap = |cmd: usize| per(sides[SPAWN].cpu_daemon[cmd]) - per(sides[FORK].cpu_daemon[cmd]);
    sec.para(&format!(
        "plexusd's CPU per call, via spawner − forks: {:+.3} ms per ADD, {:+.3} ms per DEL \
         (asking the spawner instead of forking: connect, two messages with descriptors, the \
         reap's round trip, against fork/exec and waitpid).",
        cpu_gap(0),
        cpu_gap(1)
    ));

    // Where the time goes, from the daemons' histograms.
    let plugin = net
        .plugin
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let plug_label = format!("plugin=\"{plugin}\"");
    let cmds = ["command=\"ADD\"", "command=\"DEL\""];
    let hist = |j: usize, name: &str, label: &str| -> AddDel {
        cmds.map(|c| hist_mean_ms(&before[j], &after[j], name, &[label, c]))
    };
    let mean = |j: usize| -> AddDel { [0, 1].map(|k| sides[j].samples[k].mean().map(ms)) };
    let req = |j| hist(j, "plexus_request_duration_seconds", "endpoint=\"/cni\"");
    let run = |j| hist(j, "plexus_plugin_duration_seconds", &plug_label);
    let rows: Vec<(String, AddDel)> = vec![
        (
            "direct plugin call (bench: spawn to exit)".into(),
            mean(DIRECT),
        ),
        ("forks: shim call end to end (bench)".into(), mean(FORK)),
        (
            "via spawner: shim call end to end (bench)".into(),
            mean(SPAWN),
        ),
        (
            "forks: daemon request time (`plexus_request_duration_seconds`)".into(),
            req(FORK),
        ),
        ("via spawner: daemon request time".into(), req(SPAWN)),
        (
            format!("forks: daemon plugin run (`plexus_plugin_duration_seconds`, {plugin})"),
            run(FORK),
        ),
        ("via spawner: daemon plugin run".into(), run(SPAWN)),
        (
            "→ plugin run: via spawner − forks".into(),
            minus(run(SPAWN), run(FORK)),
        ),
        (
            "→ daemon work around the plugin: via spawner − forks".into(),
            minus(minus(req(SPAWN), run(SPAWN)), minus(req(FORK), run(FORK))),
        ),
        (
            "→ shim call end to end: via spawner − forks".into(),
            minus(mean(SPAWN), mean(FORK)),
        ),
    ];
    sec.para(
        "Where the time goes (means over the timed calls; daemon times from each plexusd's \
         Prometheus histograms, scraped before and after the timed loop):",
    );
    sec.table(&breakdown_table(rows));
    gap
}

#[derive(Default)]
struct BurstAgg {
    walls: Samples,
    per_call: Samples,
    fails: Failures,
    calls: usize,
    /// plexus-shim or the plugin (direct).
    cpu_callers: Duration,
    cpu_daemon: Duration,
    /// The plugins plexusd (forks) or the spawner ran.
    cpu_plugins: Duration,
    cpu_spawner: Duration,
}

impl BurstAgg {
    fn cps(&self, size: usize) -> Option<f64> {
        self.walls
            .p50()
            .filter(|w| !w.is_zero())
            .map(|w| size as f64 / w.as_secs_f64())
    }
}

/// CPU so far: the bench's reaped children, each plexusd's own and its
/// reaped children's, the spawner's own and its reaped children's.
type BurstCpu = (Duration, [(Duration, Duration); 3]);

fn bursts(sec: &mut Section, c: &Counts, d: &Daemons, net: &Network) {
    let size = *c.bursts.last().unwrap();
    let netns: Vec<Netns> = (0..3).map(|_| Netns::new()).collect();
    let socks = [None, Some(d.fork.sock.clone()), Some(d.spawn.sock.clone())];
    let calls_for = |mode: usize, command: &str, ids: &[String], prev: &[Option<Value>]| {
        let sock = socks[mode].as_deref();
        burst_calls(net, sock, &netns[mode].path, command, ids, prev)
    };
    let cpu = || -> BurstCpu {
        let p = |pid: i32| proc_cpu(pid).unwrap_or_default();
        (
            children_cpu(),
            [p(d.fork.pid()), p(d.spawn.pid()), d.spawner.cpu()],
        )
    };
    let mut agg: Vec<[BurstAgg; 2]> = (0..3)
        .map(|_| [BurstAgg::default(), BurstAgg::default()])
        .collect();
    for round in 0..c.burst_rounds {
        for j in 0..3 {
            let mode = (round + j) % 3;
            eprintln!("   round {round}: {size} x ADD then DEL, {}", SIDES[mode]);
            let ids: Vec<String> = (0..size)
                .map(|i| format!("spburst-{round}-{mode}-{i}"))
                .collect();
            let c0 = cpu();
            let add = burst(&calls_for(mode, "ADD", &ids, &[]));
            let c1 = cpu();
            let prev: Vec<Option<Value>> = add.outcomes.iter().map(Outcome::json).collect();
            let del = burst(&calls_for(mode, "DEL", &ids, &prev));
            let c2 = cpu();
            for (k, b) in [add, del].into_iter().enumerate() {
                let a = &mut agg[mode][k];
                let (x, y) = if k == 0 { (&c0, &c1) } else { (&c1, &c2) };
                let delta = |i: usize, kids: bool| {
                    let (a, b) = (x.1[i], y.1[i]);
                    if kids {
                        b.1.saturating_sub(a.1)
                    } else {
                        b.0.saturating_sub(a.0)
                    }
                };
                a.cpu_callers += y.0.saturating_sub(x.0);
                match mode {
                    FORK => {
                        a.cpu_daemon += delta(0, false);
                        a.cpu_plugins += delta(0, true);
                    }
                    SPAWN => {
                        a.cpu_daemon += delta(1, false);
                        a.cpu_plugins += delta(2, true);
                        a.cpu_spawner += delta(2, false);
                    }
                    _ => {}
                }
                a.walls.push(b.wall);
                a.calls += b.outcomes.len();
                for o in &b.outcomes {
                    a.per_call.push(o.elapsed);
                    a.fails.note(if k == 0 { "ADD" } else { "DEL" }, o);
                }
            }
        }
    }

    sec.para(&format!(
        "Each burst starts {size} calls at once (one thread per call released by a barrier; \
         wall time from the release to the last exit), {} round(s) with the order of the three \
         modes rotated; the DEL burst follows the ADD burst of the same mode. Loopback network \
         (the daemons of the loopback part above, connectionLimit unset), CNI_IFNAME `lo`, one \
         network namespace per mode, a container id per call.",
        c.burst_rounds
    ));
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
        "calls/s via spawner vs forks",
    ]);
    for (k, cmd) in ["ADD", "DEL"].into_iter().enumerate() {
        let direct = agg[DIRECT][k].cps(size);
        let fork = agg[FORK][k].cps(size);
        for (mode, a) in agg.iter().enumerate() {
            let cps = a[k].cps(size);
            let rel = |base: Option<f64>| match (cps, base) {
                (Some(p), Some(b)) if b > 0.0 => fmt_ratio(Some(p / b)),
                _ => "n/a".into(),
            };
            t.row(vec![
                format!("{size} × {cmd}"),
                SIDES[mode].into(),
                a[k].calls.to_string(),
                fmt_ms(a[k].walls.p50()),
                cps.map_or_else(|| "n/a".into(), |v| format!("{v:.0}")),
                a[k].fails.count.to_string(),
                fmt_ms(a[k].per_call.p50()),
                fmt_ms(a[k].per_call.p99()),
                if mode == DIRECT {
                    "—".into()
                } else {
                    rel(direct)
                },
                if mode == SPAWN {
                    rel(fork)
                } else {
                    "—".into()
                },
            ]);
        }
    }
    sec.table(&t);
    for (mode, a) in agg.iter().enumerate() {
        for (k, cmd) in ["ADD", "DEL"].into_iter().enumerate() {
            a[k].fails
                .report(sec, &format!("{size} × {cmd} ({})", SIDES[mode]));
        }
    }
    let mut t = Table::new(&[
        "burst",
        "mode",
        "CPU per call: shim or plugin run by the bench",
        "plexusd itself",
        "plexus-spawner itself",
        "plugins run by plexusd or the spawner",
        "total",
    ]);
    for (k, cmd) in ["ADD", "DEL"].into_iter().enumerate() {
        for (mode, a) in agg.iter().enumerate() {
            let a = &a[k];
            let per = |d: Duration| {
                if a.calls == 0 {
                    "n/a".to_string()
                } else {
                    fmt_ms_f(ms(d) / a.calls as f64)
                }
            };
            let only = |yes: bool, d: Duration| if yes { per(d) } else { "—".into() };
            t.row(vec![
                format!("{size} × {cmd}"),
                SIDES[mode].into(),
                per(a.cpu_callers),
                only(mode != DIRECT, a.cpu_daemon),
                only(mode == SPAWN, a.cpu_spawner),
                only(mode != DIRECT, a.cpu_plugins),
                per(a.cpu_callers + a.cpu_daemon + a.cpu_spawner + a.cpu_plugins),
            ]);
        }
    }
    sec.para(&format!(
        "Where the CPU goes in the bursts (user + system time per call, means over all rounds: \
         the bench's reaped children from getrusage; plexusd, the spawner and the plugins each \
         ran (their reaped children) from /proc/<pid>/stat, 10 ms ticks over {} calls per \
         mode and command, so ±{:.3} ms per call):",
        size * c.burst_rounds,
        10.0 / (size * c.burst_rounds).max(1) as f64,
    ));
    sec.table(&t);
}
