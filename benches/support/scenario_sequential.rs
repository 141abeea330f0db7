//! Scenarios 1 and 2: sequential ADD and DEL through plexus-shim and
//! plexusd, side by side with executing the plugin directly.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::daemon_metrics::{hist_mean_ms, metrics_text};
use crate::procs::{
    children_cpu, status_kib, thread_cpu, thread_times, threads_cpu_between, Call, Outcome,
};
use crate::report::{met, Section, Table, Target};
use crate::setup::{
    breakdown_table, cni_env, minus, shim_call, shim_stdin, side_rows, start_daemon, tmpfs_dir,
    write_network, AddDel, Failures, Network, CNI_ARGS, CNI_BIN,
};
use crate::stats::{fmt_delta, fmt_kib, fmt_ms, fmt_ms_f, fmt_ratio, ms, ratio, Samples};
use crate::support::cni::Engine;
use crate::support::daemon::Daemon;
use crate::support::netns::{Link, Netns, Subnet};
use crate::Counts;

/// Targets: what a loopback call through Plexus may cost beyond the direct
/// call and one more process start (p50), and plexusd's CPU per ADD.
const REST_GOAL_MS: f64 = 0.5;
const DAEMON_CPU_GOAL_MS: f64 = 0.4;

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

/// CPU so far, as [`SideRun::cpu`] reads it.
type Cpu = (Duration, Vec<(u32, u64)>, Duration);

/// Per side: samples of ADD and DEL, failures, CPU.
struct SideRun {
    side: Side,
    netns: Netns,
    sock: Option<PathBuf>,
    /// plexusd's pid (Plexus sides).
    pid: Option<i32>,
    add: Samples,
    del: Samples,
    fails: Failures,
    /// CPU (user + system) over the timed calls, [ADD, DEL]: of the
    /// process the bench ran (plexus-shim or the plugin), and of plexusd
    /// itself (without the plugins it ran).
    cpu_caller: [Duration; 2],
    cpu_daemon: [Duration; 2],
    /// The bench's own CPU to run the call: spawning the process, its
    /// pipes, the wait. For `direct`, what any caller of a plugin pays.
    cpu_runner: [Duration; 2],
}

impl SideRun {
    fn new(side: Side, sock: Option<PathBuf>, pid: Option<i32>) -> Self {
        Self {
            side,
            netns: Netns::new(),
            sock,
            pid,
            add: Samples::new(),
            del: Samples::new(),
            fails: Failures::default(),
            cpu_caller: [Duration::ZERO; 2],
            cpu_daemon: [Duration::ZERO; 2],
            cpu_runner: [Duration::ZERO; 2],
        }
    }

    /// CPU so far: the bench's reaped children, plexusd's threads, the
    /// bench's own thread.
    fn cpu(&self) -> Cpu {
        (
            children_cpu(),
            self.pid.map(thread_times).unwrap_or_default(),
            thread_cpu(),
        )
    }

    /// Counts a timed call of command `k` (0 ADD, 1 DEL): its time, its
    /// failure if it failed, and the CPU between `c0` and `c1` (both from
    /// [`SideRun::cpu`]).
    fn note(&mut self, k: usize, o: &Outcome, c0: &Cpu, c1: &Cpu) {
        let (samples, what) = if k == 0 {
            (&mut self.add, "ADD")
        } else {
            (&mut self.del, "DEL")
        };
        samples.push(o.elapsed);
        self.fails.note(what, o);
        self.cpu_caller[k] += c1.0.saturating_sub(c0.0);
        self.cpu_daemon[k] += threads_cpu_between(&c0.1, &c1.1);
        self.cpu_runner[k] += c1.2.saturating_sub(c0.2);
    }
}

/// The process start floor: `/bin/true`, run as scenario 3 runs it.
fn spawn_floor_call() -> Call {
    Call::new("/bin/true", cni_env("VERSION", "", "", ""), Vec::new())
}

pub fn sequential(sec: &mut Section, c: &Counts, bridge: bool) {
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

    let mut sides = vec![SideRun::new(Side::Direct, None, None)];
    sides.push(SideRun::new(
        Side::Plexus,
        Some(plexus.sock.clone()),
        Some(plexus.pid()),
    ));
    if let Some(d) = &plexus_tmpfs {
        sides.push(SideRun::new(
            Side::PlexusTmpfs,
            Some(d.sock.clone()),
            Some(d.pid()),
        ));
    }
    let floor_call = spawn_floor_call();
    let mut floor = Samples::new();
    let mut floor_cpu = Duration::ZERO;

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
            let c0 = s.cpu();
            let o = call(s, "ADD", &cid, None).run();
            let c1 = s.cpu();
            prev[j] = o.json();
            sides[j].note(0, &o, &c0, &c1);
        }
        for &j in &order {
            let s = &sides[j];
            let cid = format!("seq-{i}-{j}");
            let c0 = s.cpu();
            let o = call(s, "DEL", &cid, prev[j].as_ref()).run();
            let c1 = s.cpu();
            sides[j].note(1, &o, &c0, &c1);
        }
        let c0 = children_cpu();
        floor.push(floor_call.run().elapsed);
        floor_cpu += children_cpu().saturating_sub(c0);
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
            let (target, ok) = match (bridge, s.side, cmd) {
                (false, Side::Plexus, _) => ("p50 ≤ 1.30x direct", r50.map(|r| r <= 1.30)),
                (true, Side::Plexus, "ADD") => ("p50 ≤ 1.10x direct", r50.map(|r| r <= 1.10)),
                _ => ("—", None),
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
                // What the second process alone makes of the direct call.
                let floor_ratio = match (ds.p50(), floor.p50()) {
                    (Some(d), Some(f)) => ratio(Some(d + f), Some(d)),
                    _ => None,
                };
                sec.target(Target::new(
                    &format!("{what} median"),
                    target,
                    format!(
                        "{} ({} vs {}); floor: direct + spawn floor = {}",
                        fmt_ratio(r50),
                        fmt_ms(ps.p50()),
                        fmt_ms(ds.p50()),
                        fmt_ratio(floor_ratio)
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
    spawn_floor_and_cpu(sec, &sides, (&floor, floor_cpu), n, bridge);

    // Where the time goes, from the daemon's own histograms.
    let plugin = net
        .plugin
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let mut rows: Vec<(String, AddDel)> = Vec::new();
    let mut around: Vec<AddDel> = Vec::new();
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
        let l = s.side.label();
        rows.extend(side_rows(l, e2e, req));
        rows.push((
            format!("{l}: daemon plugin run (`plexus_plugin_duration_seconds`, {plugin})"),
            run,
        ));
        rows.push((
            format!("{l}: → outside the daemon's request timer (shim exec, connect, HTTP)"),
            minus(e2e, req),
        ));
        around.push(minus(req, run));
        rows.push((
            format!("{l}: → daemon work around the plugin (records + fsync, config, JSON)"),
            minus(req, run),
        ));
        rows.push((
            format!("{l}: → daemon plugin run − direct plugin call"),
            minus(run, [mean(&direct.add), mean(&direct.del)]),
        ));
    }
    if let [disk, tmpfs] = around[..] {
        rows.push((
            "→ fsync cost in place: daemon work around the plugin, stateDir on disk − on tmpfs"
                .into(),
            minus(disk, tmpfs),
        ));
    }
    let b = breakdown_table(rows);
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
    if !bridge {
        empty_round_trips(sec, c, &sides[1..]);
    }
    drop(plexus_tmpfs);
    drop(plexus);
}

/// What is left of Plexus's extra time once the one process it must start
/// on top of the plugin's is paid, and the CPU per call of each process.
fn spawn_floor_and_cpu(
    sec: &mut Section,
    sides: &[SideRun],
    (floor, floor_cpu): (&Samples, Duration),
    n: usize,
    bridge: bool,
) {
    let direct = &sides[0];
    let mut t = Table::new(&[
        "side",
        "call",
        "plexus − direct − spawn floor (p50)",
        "CPU per call: plexus-shim (or the plugin, direct)",
        "CPU per call: plexusd itself",
        "CPU per call: the bench running it (spawn, pipes, wait)",
        "targets",
        "met?",
    ]);
    let per = |d: Duration| ms(d) / n.max(1) as f64;
    for s in sides {
        for (k, cmd) in ["ADD", "DEL"].into_iter().enumerate() {
            let (ps, ds) = if k == 0 {
                (&s.add, &direct.add)
            } else {
                (&s.del, &direct.del)
            };
            let rest = match (ps.p50(), ds.p50(), floor.p50()) {
                (Some(p), Some(d), Some(f)) if s.side != Side::Direct => {
                    Some(ms(p) - ms(d) - ms(f))
                }
                _ => None,
            };
            let shim_cpu = per(s.cpu_caller[k]);
            let daemon_cpu = per(s.cpu_daemon[k]);
            let targeted = s.side == Side::Plexus && !bridge;
            let ok =
                targeted.then_some(shim_cpu <= 0.5 && (k == 1 || daemon_cpu <= DAEMON_CPU_GOAL_MS));
            t.row(vec![
                s.side.label().into(),
                cmd.into(),
                rest.map_or_else(|| "—".into(), |r| format!("{r:.2} ms")),
                fmt_ms_f(shim_cpu),
                if s.side == Side::Direct {
                    "—".into()
                } else {
                    fmt_ms_f(daemon_cpu)
                },
                fmt_ms_f(per(s.cpu_runner[k])),
                if !targeted {
                    "—".into()
                } else if k == 0 {
                    "shim ≤ 0.5 ms, plexusd ≤ 0.4 ms".into()
                } else {
                    "shim ≤ 0.5 ms".into()
                },
                if targeted { met(ok) } else { "—".into() },
            ]);
            if !targeted {
                continue;
            }
            sec.target(Target::new(
                &format!("loopback {cmd}: plexus − direct − spawn floor (p50)"),
                "≤ 0.5 ms",
                rest.map_or_else(
                    || "n/a".into(),
                    |r| format!("{r:.2} ms (spawn floor {})", fmt_ms(floor.p50())),
                ),
                rest.map(|r| r <= REST_GOAL_MS),
            ));
            sec.target(Target::new(
                &format!("plexus-shim CPU per loopback {cmd}"),
                "≤ 0.5 ms",
                format!(
                    "{}; floor: `/bin/true` {}",
                    fmt_ms_f(shim_cpu),
                    fmt_ms_f(ms(floor_cpu) / n.max(1) as f64)
                ),
                Some(shim_cpu <= 0.5),
            ));
            if k == 0 {
                sec.target(Target::new(
                    "plexusd CPU per loopback ADD",
                    "≤ 0.4 ms",
                    format!(
                        "{}; running the plugin costs a direct caller {}",
                        fmt_ms_f(daemon_cpu),
                        fmt_ms_f(per(direct.cpu_runner[0]))
                    ),
                    Some(daemon_cpu <= DAEMON_CPU_GOAL_MS),
                ));
            }
        }
    }
    sec.para(&format!(
        "Spawn floor: `/bin/true` run as in scenario 3, once per iteration of this loop \
         (p50 {}, p99 {}). CPU per call is user + system time summed over the timed calls: the \
         bench's reaped children (getrusage: plexus-shim, or the plugin for `direct`; the spawn \
         floor's own CPU is {} per `/bin/true`) and plexusd itself (its threads' \
         /proc/<pid>/task/<tid>/schedstat), without the plugins plexusd ran. The bench's own \
         thread (CLOCK_THREAD_CPUTIME_ID) is what running the process costs its caller: for \
         `direct`, what any program that runs a plugin (plexusd included) spends per plugin \
         on top of the plugin's own CPU.",
        fmt_ms(floor.p50()),
        fmt_ms(floor.p99()),
        fmt_ms_f(ms(floor_cpu) / n.max(1) as f64)
    ));
    sec.table(&t);
}

/// The Plexus call path with no plugin run: a DEL of a container with
/// nothing recorded, through plexus-shim, and the same request sent by the
/// bench itself over the socket; `GET /healthz` for the transport alone.
fn empty_round_trips(sec: &mut Section, c: &Counts, sides: &[SideRun]) {
    let n = c.seq;
    let mut t = Table::new(&[
        "side",
        "round trip",
        "n",
        "p50",
        "p99",
        "plexusd CPU per call",
        "failures",
    ]);
    for s in sides {
        let Some(sock) = &s.sock else { continue };
        let request = |cid: &str| plexus::api::Request {
            env: cni_env("DEL", cid, "", "lo")
                .into_iter()
                .filter(|(k, _)| plexus::shim::ENV_VARS.contains(&k.as_str()))
                .collect(),
            config: shim_stdin(sock),
            interface_attributes: None,
        };
        let kinds = [
            "plexus-shim → plexusd → back: DEL, nothing recorded",
            "bench → plexusd over the socket: the same DEL as raw HTTP",
            "bench → plexusd over the socket: GET /healthz",
        ];
        let mut samples: [Samples; 3] = [Samples::new(), Samples::new(), Samples::new()];
        let mut cpu = [Duration::ZERO; 3];
        let mut fails: [usize; 3] = [0; 3];
        for i in 0..n {
            for (k, sample) in samples.iter_mut().enumerate() {
                let cid = format!("empty-{i}-{k}");
                let c0 = s.cpu().1;
                let (elapsed, ok) = match k {
                    0 => {
                        let o = shim_call(sock, "DEL", &cid, "", "lo").run();
                        (o.elapsed, o.ok())
                    }
                    1 => {
                        let raw = crate::support::http::cni_request(&request(&cid));
                        let t0 = std::time::Instant::now();
                        let r = crate::support::http::send_raw(sock, &raw);
                        (t0.elapsed(), r.is_ok_and(|r| r.status / 100 == 2))
                    }
                    _ => {
                        let t0 = std::time::Instant::now();
                        let r = crate::support::http::request(sock, "GET", "/healthz", b"");
                        (t0.elapsed(), r.is_ok_and(|r| r.status == 200))
                    }
                };
                cpu[k] += threads_cpu_between(&c0, &s.cpu().1);
                sample.push(elapsed);
                if !ok {
                    fails[k] += 1;
                }
            }
        }
        for (k, what) in kinds.iter().enumerate() {
            t.row(vec![
                s.side.label().into(),
                (*what).into(),
                samples[k].len().to_string(),
                fmt_ms(samples[k].p50()),
                fmt_ms(samples[k].p99()),
                fmt_ms_f(ms(cpu[k]) / n.max(1) as f64),
                fails[k].to_string(),
            ]);
        }
    }
    sec.para(&format!(
        "Empty round trips, {n} of each per Plexus side, interleaved: the cheapest real path \
         through plexusd is a DEL of a container id nothing was ever recorded for, with \
         CNI_NETNS empty (a runtime's DEL after the namespace is gone), so no namespace check \
         and no plugin: plexusd takes and drops the container's locks, finds no record, no \
         multus cache entry and no record set aside, and answers success. Through plexus-shim \
         (exec, config and environment parsing, connect, HTTP, JSON), then the same request \
         built once by the bench and sent over the unix socket (no shim: transport, HTTP and \
         the daemon's work), then `GET /healthz` (transport and HTTP only)."
    ));
    sec.table(&t);
}
