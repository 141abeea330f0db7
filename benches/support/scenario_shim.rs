//! Scenario 3: the shim alone (VERSION and the shim's own costs, dynamic
//! and statically linked).

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::procs::Call;
use crate::report::{met, Section, Table, Target};
use crate::setup::{cni_env, Failures, CNI_BIN, PLEXUSD, SHIM};
use crate::stats::{fmt_bytes, fmt_delta, fmt_ms, Samples};
use crate::support::daemon::TestDir;
use crate::Counts;

pub fn shim_alone(sec: &mut Section, c: &Counts) {
    let version_stdin = br#"{"cniVersion":"1.0.0"}"#.to_vec();
    let static_path = if crate::setup::shim() == Path::new(SHIM) {
        Err("the build failed".to_string())
    } else {
        Ok(crate::setup::shim().to_path_buf())
    };
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
