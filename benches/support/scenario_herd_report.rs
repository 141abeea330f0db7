//! Scenario 11's report: its tables and its rows of the targets table,
//! from what [`super`] measured.

use super::*;

pub(super) fn report(sec: &mut Section, all: &[Measured]) {
    let rate = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{v:.1}"));
    let wall = |s: Option<Span>| fmt_ms(s.map(|s| s.wall));
    let mut t = Table::new(&[
        "herd",
        "call",
        "direct: all done after",
        "direct pods/s",
        "plexus: all done after",
        "plexus pods/s",
        "plexus/direct pods/s",
        "plexus per pod p50 / p99 / max",
        "failures direct",
        "failures plexus (code 11)",
    ]);
    let none = SideRun::default();
    for m in all {
        let n = m.setting.pods;
        // A shared direct herd is marked as such.
        let shared = if m.direct.is_some() { "" } else { " (shared)" };
        for (k, cmd) in ["ADD", "DEL"].iter().enumerate() {
            let (d, p) = (direct_of(all, m).unwrap_or(&none), &m.plexus);
            let rel = match (p.rate(k, n), d.rate(k, n)) {
                (Some(p), Some(d)) if d > 0.0 => Some(p / d),
                _ => None,
            };
            t.row(vec![
                m.setting.label(),
                cmd.to_string(),
                format!("{}{shared}", wall(d.spans[k])),
                rate(d.rate(k, n)),
                wall(p.spans[k]),
                rate(p.rate(k, n)),
                fmt_ratio(rel),
                format!(
                    "{} / {} / {}",
                    fmt_ms(p.per_pod[k].p50()),
                    fmt_ms(p.per_pod[k].p99()),
                    fmt_ms(p.per_pod[k].max())
                ),
                d.fails[k].count.to_string(),
                if k == 0 {
                    format!("{} ({})", p.fails[k].count, p.code11)
                } else {
                    p.fails[k].count.to_string()
                },
            ]);
        }
    }
    sec.para(&format!(
        "Time until every pod of the herd is attached (ADD) and detached (DEL), from the \
             release of all pods to the last one's exit; pods/s: pods whose call succeeded, over \
             that time. Per pod: one plexus-shim call from spawn to exit. A failure is a call \
             that did not exit 0 (code 11 is CNI's try again later). Direct herds: one per row \
             up to {} pods, one per pod count above (run in the first row of that count: \
             `shared` in the others).",
        count(DIRECT_PER_ROW_MAX_PODS)
    ));
    sec.table(&t);

    let mut mem = Table::new(&[
        "herd",
        "release → READY=1",
        "peak RSS (VmHWM)",
        &format!(
            "VmRSS {} s after the last DEL",
            RSS_AFTER.map(|s| s.to_string()).join(" / ")
        ),
        "sd_notify datagrams",
        "plexusd end",
    ]);
    let mib =
        |k: Option<u64>| k.map_or_else(|| "n/a".into(), |k| format!("{:.1}", k as f64 / 1024.0));
    for m in all {
        let d = &m.daemon;
        mem.row(vec![
            m.setting.label(),
            fmt_ms(d.ready),
            fmt_kib(d.peak),
            format!("{} MiB", d.rss_after.map(mib).join(" / ")),
            d.notifications.to_string(),
            d.end.clone(),
        ]);
    }
    sec.para(
        "plexusd itself (the pid the bench spawned as systemd-socket-activate): READY=1 on \
         NOTIFY_SOCKET (after its caches' first lists), VmHWM from /proc/<pid>/status after the \
         herd, VmRSS polled at fixed times after the DEL herd's last exit, then SIGTERM.",
    );
    sec.table(&mem);

    let mut cpu = Table::new(&[
        "herd",
        "plexusd CPU per pod: ADD / DEL / both",
        "plugins run by plexusd, per pod",
        "plexus-shim per pod",
        "direct: plugins per pod",
        "plugin runs plexusd counted: ADD / DEL / other",
    ]);
    let per = |x: Option<Duration>, n: usize| {
        x.map_or_else(|| "n/a".into(), |x| fmt_ms_f(ms(x) / n as f64))
    };
    let sum = |a: [Option<Duration>; 2]| Some(a[0]? + a[1]?);
    for m in all {
        let (n, d) = (m.setting.pods, &m.daemon);
        cpu.row(vec![
            m.setting.label(),
            format!(
                "{} / {} / {}",
                per(d.cpu_own[0], n),
                per(d.cpu_own[1], n),
                per(sum(d.cpu_own), n)
            ),
            per(sum(d.cpu_plugins), n),
            per(Some(m.plexus.cpu_callers[0] + m.plexus.cpu_callers[1]), n),
            m.direct.as_ref().map_or_else(
                || "shared".into(),
                |r| per(Some(r.cpu_callers[0] + r.cpu_callers[1]), n),
            ),
            d.plugin_runs.map_or_else(
                || "n/a".into(),
                |[add, del, other]| format!("{add} / {del} / {other}"),
            ),
        ]);
    }
    sec.para(
        "CPU (user + system) per pod, ADD and DEL: plexusd's own and that of the plugins it \
         ran and reaped from /proc/<pid>/stat (clock ticks; the daemon's start counts in its \
         ADD), the shims' and the direct plugins' from the bench's getrusage(RUSAGE_CHILDREN); \
         plugin runs from plexusd's `plexus_plugin_duration_seconds` counts at the end.",
    );
    sec.table(&cpu);

    let mut a = Table::new(&[
        "herd",
        "lists (caches' start)",
        "GET per pod",
        "writes per pod",
        "pods with exactly 1 PATCH",
        "API calls during the DELs",
    ]);
    for m in all {
        let n = m.setting.pods;
        let [add, del] = &m.daemon.api;
        let pp = |x: usize| format!("{:.2}", x as f64 / n as f64);
        a.row(vec![
            m.setting.label(),
            add.lists.to_string(),
            pp(add.gets),
            pp(add.writes),
            format!(
                "{} of {n} (most for one pod: {})",
                add.pods_one_patch, add.most_patches
            ),
            (del.lists + del.gets + del.writes).to_string(),
        ]);
    }
    sec.para(
        "Kubernetes API requests during the ADD herd, from the test API server's log (watches \
         left out; a list is a GET of a collection, a re-list by the caches would count there):",
    );
    sec.table(&a);

    let mut ch = Table::new(&[
        "herd",
        "namespaces with eth0, net1, net2 in their ranges: plexus / direct",
        "complete network-status annotations",
        "namespaces with an interface left after DEL: plexus / direct",
        "attachment records left",
    ]);
    for m in all {
        let p = &m.plexus;
        let ok = |r: &SideRun| format!("{} of {}", r.checked - r.attach.count, r.checked);
        let (d_ok, d_left) = m.direct.as_ref().map_or_else(
            || ("shared".to_string(), "shared".to_string()),
            |d| (ok(d), d.leftover.count.to_string()),
        );
        ch.row(vec![
            m.setting.label(),
            format!("{} / {d_ok}", ok(p)),
            format!(
                "{} of {}",
                m.setting.pods - m.daemon.statuses.count,
                m.setting.pods
            ),
            format!("{} / {d_left}", p.leftover.count),
            m.daemon.records_left.to_string(),
        ]);
    }
    sec.para(&format!(
        "Checks: the namespaces of every pod, or of {CHECKED_PODS} evenly spread in larger \
         herds, after the ADDs and after the DELs; every pod's annotation."
    ));
    sec.table(&ch);

    for m in all {
        let l = m.setting.label();
        let sides = [("plexus", Some(&m.plexus)), ("direct", m.direct.as_ref())];
        for (side, r) in sides.into_iter().filter_map(|(s, r)| Some((s, r?))) {
            r.fails[0].report(sec, &format!("ADD ({l}, {side})"));
            r.fails[1].report(sec, &format!("DEL ({l}, {side})"));
            r.attach
                .report(sec, &format!("attachment check ({l}, {side})"));
            r.leftover
                .report(sec, &format!("after-DEL check ({l}, {side})"));
        }
        m.daemon
            .statuses
            .report(sec, &format!("network-status check ({l})"));
        if let Some(why) = &m.daemon.not_plexusd {
            sec.para(&format!(
                "**{l}: the figures of plexusd itself are missing:** {why}"
            ));
        }
    }
    let mut logged: Vec<(String, Vec<String>)> = Vec::new();
    for m in all {
        for line in &m.daemon.log_problems {
            match logged.iter_mut().find(|(l, _)| l == line) {
                Some((_, rows)) => rows.push(m.setting.label()),
                None => logged.push((line.clone(), vec![m.setting.label()])),
            }
        }
    }
    if !logged.is_empty() {
        let lines: Vec<String> = logged
            .iter()
            .map(|(line, rows)| {
                let rows = if rows.len() == all.len() {
                    "every herd".to_string()
                } else {
                    rows.join("; ")
                };
                format!("- `{line}` ({rows})")
            })
            .collect();
        sec.para(&format!(
            "Warnings and errors in plexusd's logs (distinct lines, timestamps cut):\n\n{}",
            lines.join("\n")
        ));
    }

    targets(sec, all);
}

fn targets(sec: &mut Section, all: &[Measured]) {
    let none = SideRun::default();
    for m in all {
        let n = m.setting.pods;
        let (p, d) = (&m.plexus, direct_of(all, m).unwrap_or(&none));
        for (k, call, goal) in [(0, "ADD", ADD_RATIO_GOAL), (1, "DEL", DEL_RATIO_GOAL)] {
            // Only the default settings are held to the DEL goal: low
            // limits trade a DEL herd's pace for memory on purpose.
            if k == 1 && m.setting.limit.is_some() {
                continue;
            }
            let rel = match (p.rate(k, n), d.rate(k, n)) {
                (Some(p), Some(d)) if d > 0.0 => Some(p / d),
                _ => None,
            };
            let ok = rel.map(|r| r >= goal && p.fails[k].count == 0);
            let r1 = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |v| format!("{v:.1}"));
            sec.target(Target::new(
                &format!("reboot herd {call}, {}", m.setting.label()),
                &format!("{call} throughput >= {goal:.2}x the direct calls, 0 failures"),
                format!(
                    "{} ({} vs {} pods/s), {} failures{}",
                    fmt_ratio(rel),
                    r1(p.rate(k, n)),
                    r1(d.rate(k, n)),
                    p.fails[k].count,
                    if k == 0 {
                        format!(" ({} code 11)", p.code11)
                    } else {
                        String::new()
                    }
                ),
                ok,
            ));
        }
    }

    if !all.is_empty() {
        let writes: Vec<String> = all
            .iter()
            .map(|m| {
                format!(
                    "{:.2}",
                    m.daemon.api[0].writes as f64 / m.setting.pods as f64
                )
            })
            .collect();
        let one = all.iter().all(|m| {
            m.daemon.api[0].writes == m.setting.pods
                && m.daemon.api[0].pods_one_patch == m.setting.pods
        });
        let del_calls: usize = all
            .iter()
            .map(|m| {
                let d = &m.daemon.api[1];
                d.lists + d.gets + d.writes
            })
            .sum();
        let gets = all
            .iter()
            .map(|m| m.daemon.api[0].gets as f64 / m.setting.pods as f64)
            .fold(0.0, f64::max);
        let events: usize = all
            .iter()
            .map(|m| m.daemon.api[0].events + m.daemon.api[1].events)
            .sum();
        let pods: usize = all.iter().map(|m| m.setting.pods).sum();
        sec.target(Target::new(
            "reboot herd: Kubernetes API writes per pod (every herd)",
            "1 API write per pod",
            format!(
                "{} per pod; at most {gets:.2} GET per pod; {del_calls} API calls during the DELs; \
                 besides, {events} pod events for {pods} pods, posted in the background",
                writes.join(", ")
            ),
            Some(one),
        ));
    }

    let default_of = |pods: usize| {
        all.iter()
            .find(|m| m.setting.pods == pods && m.setting.limit.is_none())
    };
    let mut sizes: Vec<usize> = all.iter().map(|m| m.setting.pods).collect();
    sizes.sort();
    sizes.dedup();
    let under = |k: Option<u64>, mib: u64| k.map(|k| k < mib * 1024);
    if let Some(m) = sizes.first().and_then(|&s| default_of(s)) {
        sec.target(Target::new(
            &format!("reboot herd: plexusd peak RSS, {}", m.setting.label()),
            &format!("peak RSS < {PEAK_GOAL_MIB} MiB with the default settings"),
            fmt_kib(m.daemon.peak),
            under(m.daemon.peak, PEAK_GOAL_MIB),
        ));
    }
    for &size in &sizes {
        if let Some(m) = default_of(size) {
            let last = m.daemon.rss_after[RSS_AFTER.len() - 1];
            sec.target(Target::new(
                &format!(
                    "reboot herd: plexusd RSS {} s after the last DEL, {}",
                    RSS_AFTER[RSS_AFTER.len() - 1],
                    m.setting.label()
                ),
                &format!("RSS back under {SETTLED_GOAL_MIB} MiB within 10 s of the burst"),
                format!("{} (peak {})", fmt_kib(last), fmt_kib(m.daemon.peak)),
                under(last, SETTLED_GOAL_MIB),
            ));
        }
    }
    if let (Some(&small), Some(&big)) = (sizes.first(), sizes.last()) {
        if let (true, Some(s), Some(b)) = (big > small, default_of(small), default_of(big)) {
            let growth = match (s.daemon.peak, b.daemon.peak) {
                (Some(s), Some(b)) if s > 0 => Some(b as f64 / s as f64),
                _ => None,
            };
            sec.target(Target::new(
                &format!(
                    "reboot herd: plexusd peak RSS, {}-pod vs {}-pod herd (connectionLimit unset, the default)",
                    count(big),
                    count(small)
                ),
                &format!(
                    "{}-pod herd peak RSS within 10% of the {}-pod herd's",
                    count(big),
                    count(small)
                ),
                format!(
                    "{} vs {} ({})",
                    fmt_kib(b.daemon.peak),
                    fmt_kib(s.daemon.peak),
                    growth.map_or_else(|| "n/a".into(), |g| format!("{:+.1}%", (g - 1.0) * 100.0))
                ),
                growth.map(|g| g <= GROWTH_GOAL),
            ));
        }
    }
}
