//! A daemon killed with -9 in self-bind mode (no systemd to kill what is
//! left in its cgroup) must not leak what its still-running plugins make:
//! the next daemon kills them before it runs that container's plugins.
//! Debian's bridge and host-local behind a slow fake. Needs root.

use std::fs;

use serde_json::json;

use crate::support::cni::{cni, conflist, ok, processes_matching, Call, Engine, SETTLE};
use crate::support::daemon::wait_until;
use crate::support::netns::{bridge_ports, Link, Netns, Subnet};

/// Without the fix, in 10 of 10 trials the orphaned plugin finished after
/// the new daemon's DEL and left eth0, a bridge port and an address behind
/// with no record.
#[test]
fn plugins_of_a_killed_daemon_should_not_outlive_the_next_del() {
    const TRIALS: usize = 3;
    let e = Engine::new("crash-orphan");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let net = "orphan-net";
    // Reads its stdin, says it started, takes 0.4 s, then is the bridge
    // plugin. The shell waits for bridge, so while any process runs from
    // the fakes' directory, the plugin may still act.
    e.fake(
        "slowbridge",
        r#"if [ "$CNI_COMMAND" = ADD ]; then
  touch "$DIR/started.$CNI_CONTAINERID"
  sleep 0.4
fi
printf '%s' "$STDIN" | /usr/lib/cni/bridge"#,
    );
    let mut plugin = json!({"type": "slowbridge", "bridge": br.name});
    plugin["ipam"] = e.host_local(&subnet);
    e.write_network("10-orphan.conflist", &conflist(net, "1.0.0", vec![plugin]));
    let fakes = format!("{}/", e.bin_dir.display());

    for trial in 0..TRIALS {
        let id = format!("orphan-{trial}");
        let ns = Netns::new();
        let mut d = e.start(&format!("d{trial}"), net, "10s");
        let add = Call::new("ADD", &id, &ns, "eth0").spawn(&d);
        wait_until(SETTLE, "the slow plugin to start", || {
            e.dir.join(&format!("started.{id}")).exists()
        });
        d.signal(libc::SIGKILL);
        d.wait_exit(SETTLE);
        let _ = add.finish();

        let d2 = e.start(&format!("d{trial}-next"), net, "10s");
        ok(&d2, &cni(&d2, "DEL", &id, &ns, "eth0"));
        // Whatever of the orphan is left has run to its end by now.
        wait_until(SETTLE, "no plugin process to be left", || {
            processes_matching(&fakes).is_empty()
        });
        let log = || {
            format!(
                "--- killed ---\n{}\n--- next ---\n{}",
                d.log_text(),
                d2.log_text()
            )
        };
        assert!(
            !ns.has_link("eth0"),
            "trial {trial}: eth0 left: {:?}\n{}",
            ns.ifaces(),
            log()
        );
        assert_eq!(
            bridge_ports(&br.name),
            Vec::<String>::new(),
            "trial {trial}\n{}",
            log()
        );
        assert_eq!(
            e.reservations(net),
            Vec::<String>::new(),
            "trial {trial}\n{}",
            log()
        );
        assert_eq!(
            e.records(),
            Vec::<String>::new(),
            "trial {trial}\n{}",
            log()
        );
        let markers = markers_left(&e.state_dir);
        assert!(
            markers.is_empty(),
            "trial {trial}: markers left: {markers:?}"
        );
        fs::remove_file(e.dir.join(&format!("started.{id}"))).unwrap();
    }
}

/// A daemon killed with -9 at varying points of a stream of ADDs (Debian's
/// bridge and host-local, no fakes): whatever had started, the runtime's
/// DEL of every container it asked for, through the next daemon, leaves no
/// interface, no bridge port, no address reservation and no record. The
/// kill points come from a seed printed on failure.
#[test]
fn dels_after_a_kill_at_any_point_of_adds_should_leave_nothing() {
    const ROUNDS: u64 = 6;
    const PER_ROUND: usize = 3;
    let e = Engine::new("crash-random");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let net = "random-net";
    let mut plugin = json!({"type": "bridge", "bridge": br.name});
    plugin["ipam"] = e.host_local(&subnet);
    e.write_network("10-random.conflist", &conflist(net, "1.0.0", vec![plugin]));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    for round in 0..ROUNDS {
        let namespaces: Vec<Netns> = (0..PER_ROUND).map(|_| Netns::new()).collect();
        let ids: Vec<String> = (0..PER_ROUND).map(|i| format!("rnd-{round}-{i}")).collect();
        let mut d = e.start(&format!("d{round}"), net, "10s");
        let adds: Vec<_> = ids
            .iter()
            .zip(&namespaces)
            .map(|(id, ns)| Call::new("ADD", id, ns, "eth0").spawn(&d))
            .collect();
        // Somewhere between before the first plugin and after the last.
        std::thread::sleep(std::time::Duration::from_micros(next() % 40_000));
        d.signal(libc::SIGKILL);
        d.wait_exit(SETTLE);
        // Their outcome does not matter, and a shim that had not connected
        // yet would retry the dead socket for its connectTimeout: kill them
        // all before the next daemon binds the path.
        drop(adds);
        let d2 = e.start(&format!("d{round}-next"), net, "10s");
        for (id, ns) in ids.iter().zip(&namespaces) {
            ok(&d2, &cni(&d2, "DEL", id, ns, "eth0"));
        }
        let why = || {
            format!(
                "seed {seed}, round {round}\n--- killed ---\n{}\n--- next ---\n{}",
                d.log_text(),
                d2.log_text()
            )
        };
        for ns in &namespaces {
            assert!(
                !ns.has_link("eth0"),
                "eth0 left: {:?}\n{}",
                ns.ifaces(),
                why()
            );
        }
        assert_eq!(bridge_ports(&br.name), Vec::<String>::new(), "{}", why());
        assert_eq!(e.reservations(net), Vec::<String>::new(), "{}", why());
        assert_eq!(e.records(), Vec::<String>::new(), "{}", why());
    }
}

/// A successor that takes the socket over while its predecessor is still
/// running a plugin leaves that plugin alone at start-up (the container is
/// locked); once the predecessor dies with -9, the successor's next call
/// for the container kills it before running anything. The plugin waits
/// for `$DIR/go`, given only after the DEL: if it survived, it would then
/// make eth0.
#[test]
fn a_successor_should_kill_what_a_predecessor_killed_mid_takeover_left() {
    let e = Engine::new("crash-takeover");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let net = "takeover-net";
    e.fake(
        "gatebridge",
        r#"if [ "$CNI_COMMAND" = ADD ]; then
  touch "$DIR/started.$CNI_CONTAINERID"
  for _ in $(seq 2000); do [ -e "$DIR/go" ] && break; sleep 0.01; done
fi
printf '%s' "$STDIN" | /usr/lib/cni/bridge"#,
    );
    let mut plugin = json!({"type": "gatebridge", "bridge": br.name});
    plugin["ipam"] = e.host_local(&subnet);
    e.write_network(
        "10-takeover.conflist",
        &conflist(net, "1.0.0", vec![plugin]),
    );
    let fakes = format!("{}/", e.bin_dir.display());
    let ns = Netns::new();

    let mut old = e.start("old", net, "30s");
    let add = Call::new("ADD", "taken-1", &ns, "eth0").spawn(&old);
    wait_until(SETTLE, "the gated plugin to start", || {
        e.dir.join("started.taken-1").exists()
    });
    // Same socket path: the successor takes it over; the predecessor
    // drains its ADD, which is still in its plugin.
    let new = e.start("new", net, "30s");
    assert!(old.running());
    assert!(!processes_matching(&fakes).is_empty());
    old.signal(libc::SIGKILL);
    old.wait_exit(SETTLE);
    let _ = add.finish();

    ok(&new, &cni(&new, "DEL", "taken-1", &ns, "eth0"));
    fs::write(e.dir.join("go"), b"").unwrap();
    wait_until(SETTLE, "no plugin process to be left", || {
        processes_matching(&fakes).is_empty()
    });
    let log = || {
        format!(
            "--- old ---\n{}\n--- new ---\n{}",
            old.log_text(),
            new.log_text()
        )
    };
    assert!(
        !ns.has_link("eth0"),
        "eth0 left: {:?}\n{}",
        ns.ifaces(),
        log()
    );
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new(), "{}", log());
    assert_eq!(e.reservations(net), Vec::<String>::new(), "{}", log());
    assert_eq!(e.records(), Vec::<String>::new(), "{}", log());
    assert!(markers_left(&e.state_dir).is_empty());
}

/// Lock files that still hold a running plugin's marker (its content).
fn markers_left(state_dir: &std::path::Path) -> Vec<String> {
    let locks = state_dir.join("locks");
    crate::support::cni::list_dir(&locks)
        .into_iter()
        .filter(|name| {
            fs::metadata(locks.join(name))
                .map(|m| m.len() > 0)
                .unwrap_or(false)
        })
        .collect()
}

/// An operation notes each plugin's process group in the container's lock
/// file and empties it only in its later trips to that file (the next
/// plugin's note, the release of the lock). Whatever the number of plugins,
/// the lock file a finished ADD or CHECK leaves behind (the container keeps
/// its record) names no plugin, so the next holder has nothing to kill.
/// Debian's bridge, host-local and tuning in one list.
#[test]
fn a_finished_operation_should_leave_no_marker_in_the_lock_file() {
    let e = Engine::new("crash-marker");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let net = "marker-net";
    let bridge = crate::support::cni::bridge(&br.name, e.host_local(&subnet));
    e.write_network(
        "10-marker.conflist",
        &conflist(net, "1.0.0", vec![bridge, json!({"type": "tuning"})]),
    );
    let d = e.start("d", net, "10s");
    let ns = Netns::new();
    let lock = e.state_dir.join("locks/marker-1.lock");
    for command in ["ADD", "CHECK"] {
        ok(&d, &cni(&d, command, "marker-1", &ns, "eth0"));
        assert!(
            lock.exists(),
            "after {command}: the record keeps its lock file"
        );
        // Emptied as blanks: the file keeps its block for the next marker.
        assert_eq!(
            fs::read_to_string(&lock).unwrap().trim(),
            "",
            "after {command}: a marker of a finished plugin was left"
        );
    }
    assert!(ns.has_link("eth0"));
    ok(&d, &cni(&d, "DEL", "marker-1", &ns, "eth0"));
    assert!(!ns.has_link("eth0"));
    assert!(!lock.exists());
    assert_eq!(e.records(), Vec::<String>::new());
}
