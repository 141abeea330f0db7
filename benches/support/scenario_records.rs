//! Scenario 8: what the attachment record's fsyncs cost, counted in a
//! running daemon and replayed in isolation.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use plexus::cni::state::{self, Attachment, Delegate, Durability, Record, State, Store};
use serde_json::json;

use crate::procs::{self, poll, thread_cpu, ChildGuard};
use crate::report::{Section, Table};
use crate::setup::{shim_call, start_daemon, tmpfs_dir, write_network, Network, CNI_ARGS};
use crate::stats::{fmt_ms, fmt_ms_f, ms, Samples};
use crate::support::cni::Engine;
use crate::support::daemon::TestDir;
use crate::support::netns::Netns;
use crate::{is_root, Counts};

/// A loopback attachment's record as plexusd writes it once the ADD is
/// done: the network as used, its result, the call's CNI_ARGS.
fn loopback_record(container_id: &str, netns: &str) -> Record {
    let mut record = Record::new(container_id);
    record.attachments.push(Attachment {
        ifname: "lo".into(),
        netns: netns.into(),
        cni_args: CNI_ARGS.into(),
        capability_args: Default::default(),
        hot_plugged_into: None,
        cleanup: None,
        fell_back: false,
        delegates: vec![Delegate {
            name: "lo".into(),
            ifname: "lo".into(),
            primary: true,
            state: State::Added,
            config: json!({
                "cniVersion": "1.0.0",
                "name": "lo",
                "plugins": [{"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}],
            }),
            capability_args: None,
            cni_args: None,
            result: Some(json!({
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": netns}],
                "ips": [
                    {"interface": 0, "address": "127.0.0.1/8"},
                    {"interface": 0, "address": "::1/128"},
                ],
                "dns": {},
            })),
        }],
    });
    record
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

pub fn record_io(sec: &mut Section, c: &Counts) {
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
    // A container id as runtimes make them: 64 hex digits.
    let record = loopback_record(&format!("{:064x}", 0xbe_u8), "/var/run/netns/plexus-bench");
    let size = state::encoded_len(&record);
    let mut dirs = vec![(
        format!("temp dir ({})", std::env::temp_dir().display()),
        scratch.path.clone(),
    )];
    if let Some(s) = &shm {
        dirs.push(("tmpfs (/dev/shm)".into(), s.0.clone()));
    }
    let mut t = Table::new(&[
        "operation",
        "file system",
        "n",
        "p50",
        "p99",
        "max",
        "CPU per operation (mean)",
    ]);
    let mut fsync_pair = None;
    for (label, dir) in &dirs {
        // The daemon's own store, in <dir>/attachments.
        let store = Store::open(dir).expect("open the record store");
        for sync in [true, false] {
            let durability = if sync {
                Durability::Synced
            } else {
                Durability::Atomic
            };
            let (mut save, mut remove) = (Samples::new(), Samples::new());
            let (mut save_cpu, mut remove_cpu) = (Duration::ZERO, Duration::ZERO);
            for _ in 0..c.record_io {
                let (t0, c0) = (Instant::now(), thread_cpu());
                store.save(&record, durability).expect("record save");
                save.push(t0.elapsed());
                save_cpu += thread_cpu().saturating_sub(c0);
                let (t0, c0) = (Instant::now(), thread_cpu());
                store
                    .remove(&record.container_id, durability)
                    .expect("record remove");
                remove.push(t0.elapsed());
                remove_cpu += thread_cpu().saturating_sub(c0);
            }
            let per = |d: Duration| fmt_ms_f(ms(d) / c.record_io.max(1) as f64);
            let how = if sync {
                "fsync of file and directory"
            } else {
                "no fsync (atomic only)"
            };
            t.row(vec![
                format!("save: encode, temporary file, write, rename; {how}"),
                label.clone(),
                save.len().to_string(),
                fmt_ms(save.p50()),
                fmt_ms(save.p99()),
                fmt_ms(save.max()),
                per(save_cpu),
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
                per(remove_cpu),
            ]);
            if fsync_pair.is_none() {
                fsync_pair = Some((save.p50(), None));
            } else if let Some((synced, None)) = fsync_pair {
                fsync_pair = Some((synced, save.p50()));
            }
        }
    }
    sec.para(&format!(
        "A record write and removal by plexusd's own record store (`Store::save` and \
         `Store::remove`), replayed in isolation ({} times each, a loopback attachment's \
         record of {size} bytes) on the file system of the stateDir used above and on tmpfs; \
         CPU is the replaying thread's user + system time (CLOCK_THREAD_CPUTIME_ID):",
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
