//! Attachment records under stress: `plexusd show` next to concurrent ADDs,
//! two daemons on one stateDir, every kind of damaged record, and GC next
//! to other containers' calls. Fake plugins for the races, Debian's bridge
//! and host-local where the cleanup itself is the point. Needs root.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::cni::{
    address, bare, bridge, cni, conflist, gc_call, ok, Call, Engine, SETTLE,
};
use crate::support::daemon::{wait_until, Daemon, TestDir, PLEXUSD};
use crate::support::netns::{bridge_ports, Link, Netns, Subnet};
use crate::support::shim::{self, Run};

/// A network of one pass-through fake, `pass`, that answers ADD with its
/// prevResult and does nothing on DEL.
fn pass_network(e: &Engine, net: &str) {
    e.fake(
        "pass",
        &format!(
            "case \"$CNI_COMMAND\" in ADD) {} ;; esac\nexit 0",
            Engine::pass_through()
        ),
    );
    e.write_network(
        "10-pass.conflist",
        &conflist(net, "1.0.0", vec![json!({"type": "pass"})]),
    );
}

fn show(config: &Path, args: &[&str]) -> Output {
    Command::new(PLEXUSD)
        .arg("--config")
        .arg(config)
        .arg("show")
        .args(args)
        .output()
        .expect("run plexusd show")
}

/// The interface names recorded for `id`, each checked to be fully added;
/// empty when there is no record.
fn recorded_ifnames(e: &Engine, id: &str) -> BTreeSet<String> {
    let Ok(text) = fs::read(e.record(id)) else {
        return BTreeSet::new();
    };
    let v: Value = serde_json::from_slice(&text)
        .unwrap_or_else(|err| panic!("record of {id} does not parse ({err}): {text:?}"));
    assert_eq!(v["containerId"], id, "{v}");
    v["attachments"]
        .as_array()
        .unwrap_or_else(|| panic!("record of {id} has no attachments: {v}"))
        .iter()
        .map(|a| {
            for d in a["delegates"].as_array().unwrap() {
                assert_eq!(d["state"], "added", "record of {id}: {v}");
            }
            a["ifname"].as_str().unwrap().to_string()
        })
        .collect()
}

/// `plexusd show` used to remove the temporary files of writes in
/// progress, failing about 4 in 10 concurrent ADDs with "cannot rename
/// into place".
#[test]
fn show_in_a_loop_should_never_fail_a_concurrent_add() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 40;
    let e = Engine::new("rec-show");
    pass_network(&e, "show-net");
    let ns = Netns::new();
    let d = e.start("d", "show-net", "10s");
    let config = e.dir.join("d.json");

    let stop = AtomicBool::new(false);
    let shows = AtomicUsize::new(0);
    let (runs, show_failures) = std::thread::scope(|s| {
        let looper = s.spawn(|| {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let out = show(&config, &[]);
                if !out.status.success() {
                    failures.push(String::from_utf8_lossy(&out.stderr).into_owned());
                }
                shows.fetch_add(1, Ordering::Relaxed);
            }
            failures
        });
        wait_until(SETTLE, "the first show", || {
            shows.load(Ordering::Relaxed) > 0
        });
        let adders: Vec<_> = (0..THREADS)
            .map(|t| {
                let (d, ns) = (&d, &ns);
                s.spawn(move || {
                    (0..PER_THREAD)
                        .map(|i| cni(d, "ADD", &format!("show-{t}-{i}"), ns, "eth0"))
                        .collect::<Vec<Run>>()
                })
            })
            .collect();
        let runs: Vec<Run> = adders.into_iter().flat_map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        (runs, looper.join().unwrap())
    });
    let failed: Vec<&Run> = runs.iter().filter(|r| r.code != Some(0)).collect();
    assert!(
        failed.is_empty(),
        "{} of {} ADDs failed next to `plexusd show`, e.g. {:?}",
        failed.len(),
        runs.len(),
        failed[0]
    );
    assert!(show_failures.is_empty(), "{show_failures:?}");
    assert!(
        shows.load(Ordering::Relaxed) >= 5,
        "show ran only {} times",
        shows.load(Ordering::Relaxed)
    );
    assert_eq!(e.records().len(), THREADS * PER_THREAD);
}

#[test]
fn show_of_a_missing_state_dir_should_say_so_and_create_nothing() {
    let dir = TestDir::new("rec-show-missing");
    let state = dir.join("state");
    let config = dir.join("c.json");
    fs::write(
        &config,
        serde_json::to_vec(&json!({"stateDir": state, "clusterNetwork": "x"})).unwrap(),
    )
    .unwrap();

    let all = show(&config, &[]);
    assert!(all.status.success(), "{all:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&all.stdout).unwrap(),
        json!([])
    );
    assert!(
        String::from_utf8_lossy(&all.stderr).contains("nothing is recorded"),
        "{all:?}"
    );
    let one = show(&config, &["ctr-1"]);
    assert_eq!(one.status.code(), Some(1), "{one:?}");
    assert!(
        String::from_utf8_lossy(&one.stderr).contains("nothing is recorded for container"),
        "{one:?}"
    );
    assert!(!state.exists(), "show created {}", state.display());
}

/// During a self-bind takeover two daemons serve the same stateDir. Every
/// container's record must hold exactly the attachments whose ADD
/// succeeded and whose DEL did not run, whichever daemon served which call.
#[test]
fn two_daemons_on_one_state_dir_should_keep_every_record_exact() {
    const CONTAINERS: usize = 6;
    let e = Engine::new("rec-two");
    pass_network(&e, "two-net");
    let ns = Netns::new();
    let start = |tag: &str| {
        let mut config = e.config("two-net", "10s");
        config["socketDir"] = e.dir.join(&format!("sock-{tag}")).to_string_lossy().into();
        let mut d = Daemon::start(&e.dir, tag, config);
        d.ready();
        d
    };
    let (a, b) = (start("a"), start("b"));
    assert_ne!(a.sock, b.sock);
    let id = |c: usize| format!("two-{c}");

    // Each round runs its calls for every container at once, each call on
    // the daemon named; then every record must be exactly `expect`.
    let round = |calls: &[(&Daemon, &str, &str)], expect: &[&str]| {
        let runs: Vec<(String, Run)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..CONTAINERS)
                .flat_map(|c| {
                    let ns = &ns;
                    calls.iter().map(move |&(d, command, ifname)| {
                        s.spawn(move || {
                            let what = format!("{command} {} {ifname}", id(c));
                            (what, Call::new(command, &id(c), ns, ifname).run(d))
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (what, run) in &runs {
            assert_eq!(
                run.code,
                Some(0),
                "{what}: {run:?}\n--- a ---\n{}\n--- b ---\n{}",
                a.log_text(),
                b.log_text()
            );
        }
        let expect: BTreeSet<String> = expect.iter().map(|s| s.to_string()).collect();
        for c in 0..CONTAINERS {
            assert_eq!(recorded_ifnames(&e, &id(c)), expect, "container {}", id(c));
        }
    };
    for _ in 0..3 {
        round(
            &[(&a, "ADD", "eth0"), (&b, "ADD", "eth1")],
            &["eth0", "eth1"],
        );
        round(
            &[
                (&b, "DEL", "eth0"),
                (&a, "ADD", "eth2"),
                (&b, "ADD", "eth3"),
            ],
            &["eth1", "eth2", "eth3"],
        );
        round(
            &[
                (&a, "DEL", "eth1"),
                (&b, "DEL", "eth2"),
                (&a, "ADD", "eth4"),
            ],
            &["eth3", "eth4"],
        );
        round(&[(&a, "DEL", "eth3"), (&b, "DEL", "eth4")], &[]);
    }
    assert!(e.records().is_empty(), "{:?}", e.records());
    // The lock files went with the records.
    let locks = crate::support::cni::list_dir(&e.state_dir.join("locks"));
    assert!(
        locks.iter().all(|l| l.starts_with('.')),
        "lock files left: {locks:?}"
    );
}

/// How a record gets damaged; `good` is another container's record.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Damage {
    Empty,
    Truncated,
    Garbage,
    Directory,
    Symlink,
    OtherContainer,
}

impl Damage {
    const ALL: [Damage; 6] = [
        Damage::Empty,
        Damage::Truncated,
        Damage::Garbage,
        Damage::Directory,
        Damage::Symlink,
        Damage::OtherContainer,
    ];

    /// Damages `record`; returns the bytes a file now holds (None for a
    /// directory or a symbolic link).
    fn apply(self, record: &Path, good: &Path) -> Option<Vec<u8>> {
        let original = fs::read(record).unwrap();
        fs::remove_file(record).unwrap();
        let bytes = match self {
            Damage::Empty => Vec::new(),
            Damage::Truncated => original[..original.len() / 2].to_vec(),
            Damage::Garbage => b"\x00\x01 this is not JSON \xff".to_vec(),
            Damage::OtherContainer => fs::read(good).unwrap(),
            Damage::Directory => {
                fs::create_dir(record).unwrap();
                fs::write(record.join("left-inside"), b"x").unwrap();
                return None;
            }
            Damage::Symlink => {
                symlink(good, record).unwrap();
                return None;
            }
        };
        fs::write(record, &bytes).unwrap();
        Some(bytes)
    }
}

/// One bridge + host-local network for the damage tests.
struct Real {
    e: Engine,
    br: Link,
    net: &'static str,
    d: Daemon,
}

fn real(tag: &str) -> Real {
    let e = Engine::new(tag);
    let br = Link::bridge();
    let subnet = Subnet::new();
    let net = "dmg-net";
    e.write_network(
        "10-dmg.conflist",
        &conflist(net, "1.0.0", vec![bridge(&br.name, e.host_local(&subnet))]),
    );
    let d = e.start("d", net, "10s");
    Real { e, br, net, d }
}

/// Every kind of damage used to make DEL of the container fail for good
/// (code 5), and a record holding another container's id made that DEL
/// overwrite the other record. Now DEL moves the record aside and runs the
/// configured network: the interface and the address go, the bytes stay.
#[test]
fn del_should_clean_up_after_every_kind_of_damaged_record() {
    let Real { e, br, net, d } = real("rec-dmg");
    let good_ns = Netns::new();
    let good = ok(&d, &cni(&d, "ADD", "good1", &good_ns, "eth0"));
    let good_record = fs::read(e.record("good1")).unwrap();

    for damage in Damage::ALL {
        let id = format!("dmg-{}", format!("{damage:?}").to_lowercase());
        let ns = Netns::new();
        let addr = address(&ok(&d, &cni(&d, "ADD", &id, &ns, "eth0")));
        assert!(e.reservations(net).contains(&bare(&addr)));
        let kept = damage.apply(&e.record(&id), &e.record("good1"));

        let run = cni(&d, "DEL", &id, &ns, "eth0");
        ok(&d, &run);
        assert!(
            !ns.has_link("eth0"),
            "{damage:?}: eth0 left: {:?}",
            ns.ifaces()
        );
        assert!(
            !e.reservations(net).contains(&bare(&addr)),
            "{damage:?}: {addr} still reserved: {:?}",
            e.reservations(net)
        );
        assert!(!e.record(&id).exists() && fs::symlink_metadata(e.record(&id)).is_err());
        let aside_dir = e.state_dir.join("attachments/damaged").join(&id);
        let aside = crate::support::cni::list_dir(&aside_dir);
        assert_eq!(aside.len(), 1, "{damage:?}: {aside:?}");
        let aside = aside_dir.join(&aside[0]);
        match damage {
            Damage::Directory => assert_eq!(fs::read(aside.join("left-inside")).unwrap(), b"x"),
            Damage::Symlink => assert_eq!(fs::read_link(&aside).unwrap(), e.record("good1")),
            _ => assert_eq!(Some(fs::read(&aside).unwrap()), kept, "{damage:?}"),
        }
        // A repeated DEL is fine too.
        ok(&d, &cni(&d, "DEL", &id, &ns, "eth0"));
    }

    // The container the damaged records pointed at is untouched.
    assert_eq!(fs::read(e.record("good1")).unwrap(), good_record);
    assert!(good_ns.iface("eth0").unwrap().has_addr(&address(&good)));
    assert_eq!(e.reservations(net), vec![bare(&address(&good))]);
    ok(&d, &cni(&d, "DEL", "good1", &good_ns, "eth0"));
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(e.records(), vec!["damaged".to_string()]);
}

/// `show` reports a damaged record and leaves it; ADD over it proceeds as
/// if nothing was recorded; GC moves damaged records aside and goes on
/// deleting what is stale.
#[test]
fn show_add_and_gc_should_go_on_past_a_damaged_record() {
    let Real { e, br, net, d } = real("rec-dmg-more");
    let garbage = b"{\"kind\": \"plexusAttachmentsV1\", \"contai".to_vec();
    fs::write(e.record("fresh"), &garbage).unwrap();
    fs::write(e.record("gcdmg"), &garbage).unwrap();

    let out = show(&e.dir.join("d.json"), &[]);
    assert!(out.status.success(), "{out:?}");
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let fresh = &listed.as_array().unwrap()[0];
    assert_eq!(fresh["containerId"], "fresh", "{listed}");
    assert!(
        fresh["damaged"].as_str().unwrap().contains("fresh.json"),
        "{listed}"
    );
    let one = show(&e.dir.join("d.json"), &["fresh"]);
    assert_eq!(one.status.code(), Some(1), "{one:?}");
    assert_eq!(
        fs::read(e.record("fresh")).unwrap(),
        garbage,
        "show moved it"
    );

    let ns = Netns::new();
    let addr = address(&ok(&d, &cni(&d, "ADD", "fresh", &ns, "eth0")));
    assert!(ns.iface("eth0").unwrap().has_addr(&addr));
    assert_eq!(
        recorded_ifnames(&e, "fresh"),
        BTreeSet::from(["eth0".to_string()])
    );
    let aside = e.state_dir.join("attachments/damaged/fresh");
    assert_eq!(
        fs::read(aside.join(&crate::support::cni::list_dir(&aside)[0])).unwrap(),
        garbage
    );

    let stale_ns = Netns::new();
    ok(&d, &cni(&d, "ADD", "gc-stale", &stale_ns, "eth0"));
    let gc = shim::finish(gc_call(
        &d,
        json!([{"containerID": "fresh", "ifname": "eth0"}]),
    ));
    assert_eq!(gc.code, Some(0), "{gc:?}\n{}", d.log_text());
    assert!(!stale_ns.has_link("eth0"), "GC left the stale eth0");
    assert!(ns.has_link("eth0"), "GC removed the valid eth0");
    assert!(!e.record("gcdmg").exists());
    assert!(e.state_dir.join("attachments/damaged/gcdmg").is_dir());
    assert_eq!(e.reservations(net), vec![bare(&addr)]);

    ok(&d, &cni(&d, "DEL", "fresh", &ns, "eth0"));
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());
}

/// A fake whose DEL for `stale-*` containers notes that it started, then
/// waits (bounded) for `$DIR/release` before finishing.
fn gated_del_network(e: &Engine, net: &str) {
    e.fake(
        "gated",
        &format!(
            r#"case "$CNI_COMMAND/$CNI_CONTAINERID" in
  ADD/*) {pass} ;;
  DEL/stale-*)
    touch "$DIR/del-started.$CNI_CONTAINERID"
    for _ in $(seq 2000); do [ -e "$DIR/release" ] && break; sleep 0.01; done
    touch "$DIR/del-done.$CNI_CONTAINERID" ;;
esac
exit 0"#,
            pass = Engine::pass_through()
        ),
    );
    e.write_network(
        "10-gated.conflist",
        &conflist(net, "1.0.0", vec![json!({"type": "gated"})]),
    );
}

/// GC used to hold a lock that every ADD waits for while it ran stale
/// DELs one after another (4 hung DELs held an ADD for 11.6 s). Now an ADD
/// of another container completes while GC's DEL is still running.
#[test]
fn gc_should_not_hold_up_other_containers_while_a_del_hangs() {
    let e = Engine::new("rec-gc-slow");
    gated_del_network(&e, "gated-net");
    let ns = Netns::new();
    let d = e.start("d", "gated-net", "30s");
    for i in 1..=4 {
        ok(&d, &cni(&d, "ADD", &format!("stale-{i}"), &ns, "eth0"));
    }
    let release = e.dir.join("release");
    // Released on every way out, so that nothing waits 20 s.
    struct Release<'a>(&'a Path);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            let _ = fs::write(self.0, b"");
        }
    }
    let _release = Release(&release);

    let gc = gc_call(&d, json!([{"containerID": "other-1", "ifname": "eth0"}]));
    wait_until(SETTLE, "GC's first DEL to start", || {
        e.dir.join("del-started.stale-1").exists()
    });
    let started = Instant::now();
    let call = Call::new("ADD", "other-1", &ns, "eth0");
    let mut add = shim::spawn(call.env(), &call.stdin(&d));
    let finished = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if add.try_wait().unwrap().is_some() {
                break true;
            }
            if Instant::now() > deadline {
                let _ = add.kill();
                break false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let took = started.elapsed();
    assert!(
        finished,
        "the ADD waited for GC's hung DEL:\n{}",
        d.log_text()
    );
    assert!(
        !e.dir.join("del-done.stale-1").exists(),
        "GC's DEL finished before the ADD (took {took:?})"
    );
    ok(&d, &shim::finish(add));
    eprintln!("ADD next to a hung GC DEL took {took:?}");

    fs::write(&release, b"").unwrap();
    let gc = shim::finish(gc);
    assert_eq!(gc.code, Some(0), "{gc:?}\n{}", d.log_text());
    for i in 1..=4 {
        assert!(e.dir.join(&format!("del-done.stale-{i}")).exists());
        assert!(!e.record(&format!("stale-{i}")).exists());
    }
    assert_eq!(
        recorded_ifnames(&e, "other-1"),
        BTreeSet::from(["eth0".to_string()])
    );
}

/// The plugins' GC frees whatever is not in its valid list, so it must not
/// run while an ADD is in progress: it waits, and the list it gets holds
/// that ADD's attachment. The ADD's plugin waits up to 2 s for a GC to
/// run; one running then would be a GC racing the ADD.
#[test]
fn plugin_gc_should_wait_for_an_add_in_progress_and_list_it() {
    let e = Engine::new("rec-gc-excl");
    let events = e.dir.join("events");
    e.fake_with(
        "gc11",
        r#"if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}'; exit 0
fi"#,
        &format!(
            r#"case "$CNI_COMMAND" in
  ADD)
    echo add-start >> "$DIR/events"
    for _ in $(seq 200); do grep -q '^gc' "$DIR/events" && break; sleep 0.01; done
    echo add-end >> "$DIR/events"
    {pass} ;;
  GC) echo "gc $(printf '%s' "$STDIN" | jq -c '.["cni.dev/valid-attachments"]')" >> "$DIR/events" ;;
esac
exit 0"#,
            pass = Engine::pass_through()
        ),
    );
    e.write_network(
        "10-gc11.conflist",
        &conflist("gc11-net", "1.1.0", vec![json!({"type": "gc11"})]),
    );
    let ns = Netns::new();
    let d = e.start("d", "gc11-net", "10s");

    let add = Call::new("ADD", "adding-1", &ns, "eth0").spawn(&d);
    wait_until(SETTLE, "the ADD's plugin to start", || {
        fs::read_to_string(&events).is_ok_and(|t| t.contains("add-start"))
    });
    let gc = shim::finish(gc_call(
        &d,
        json!([{"containerID": "adding-1", "ifname": "eth0"}]),
    ));
    assert_eq!(gc.code, Some(0), "{gc:?}\n{}", d.log_text());
    ok(&d, &add.finish());
    let text = fs::read_to_string(&events).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(
        &lines[..2],
        ["add-start", "add-end"],
        "GC ran during the ADD: {text}"
    );
    let listed: Value = serde_json::from_str(lines[2].strip_prefix("gc ").unwrap()).unwrap();
    assert_eq!(
        listed,
        json!([{"containerID": "adding-1", "ifname": "eth0"}])
    );
}
