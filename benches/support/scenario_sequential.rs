//! Scenarios 1 and 2: sequential ADD and DEL through plexus-shim and
//! plexusd, side by side with executing the plugin directly.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::daemon_metrics::{hist_mean_ms, metrics_text};
use crate::procs::status_kib;
use crate::report::{met, Section, Table, Target};
use crate::setup::{
    shim_call, start_daemon, tmpfs_dir, write_network, Failures, Network, CNI_ARGS, CNI_BIN,
};
use crate::stats::{fmt_delta, fmt_kib, fmt_ms, fmt_ratio, ms, ratio, Samples};
use crate::support::cni::Engine;
use crate::support::daemon::Daemon;
use crate::support::netns::{Link, Netns, Subnet};
use crate::Counts;

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

/// Per side: samples of ADD and DEL, failures.
struct SideRun {
    side: Side,
    netns: Netns,
    sock: Option<PathBuf>,
    add: Samples,
    del: Samples,
    fails: Failures,
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
