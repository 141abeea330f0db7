//! The daemon's CNI engine when plugins misbehave: fake bash plugins that
//! hang, crash, print garbage or fail, next to Debian's real bridge and
//! host-local, plus a daemon killed mid-ADD, 50 concurrent containers and
//! invalid input. Needs root and iproute2.

use std::collections::HashSet;
use std::fs;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::cni::{
    address, bridge, children, cni, conflist, failed, ok, processes_matching, Call, Engine, SETTLE,
};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::netns::{bridge_ports, Link, Netns, Subnet};

/// A network of bridge + host-local followed by the fake `fake`.
fn bridge_then(e: &Engine, br: &Link, subnet: &Subnet, net: &str, fake: &str) {
    e.write_network(
        "10-net.conflist",
        &conflist(
            net,
            "1.0.0",
            vec![
                bridge(&br.name, e.host_local(subnet)),
                serde_json::json!({"type": fake}),
            ],
        ),
    );
}

/// Asserts a failed ADD left nothing behind: no interface in the netns, no
/// veth on the bridge, no reservation, no record.
fn assert_rolled_back(e: &Engine, d: &Daemon, br: &Link, ns: &Netns, net: &str) {
    let log = || d.log_text();
    assert!(
        !ns.has_link("eth0"),
        "eth0 left in the netns: {:?}\n{}",
        ns.ifaces(),
        log()
    );
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new(), "{}", log());
    assert_eq!(e.reservations(net), Vec::<String>::new(), "{}", log());
    assert_eq!(e.records(), Vec::<String>::new(), "{}", log());
}

/// The daemon still serves: a good container can be added and deleted.
fn assert_still_serves(e: &Engine, d: &mut Daemon, br: &Link, net: &str) {
    assert!(d.running(), "plexusd died:\n{}", d.log_text());
    let ns = Netns::new();
    let r = ok(d, &cni(d, "ADD", "good-1", &ns, "eth0"));
    let addr = address(&r);
    let eth0 = ns.iface("eth0").expect("eth0 of the good container");
    assert!(eth0.has_addr(&addr), "{eth0:?} lacks {addr}");
    ok(d, &cni(d, "DEL", "good-1", &ns, "eth0"));
    assert!(!ns.has_link("eth0"));
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(e.records(), Vec::<String>::new());
}

/// A fake that misbehaves on ADD for containers named `bad-*` (with
/// `bad_add`) and otherwise passes its prevResult through; DEL succeeds.
fn faulty_body(bad_add: &str) -> String {
    format!(
        "case \"$CNI_COMMAND/$CNI_CONTAINERID\" in\n\
         \x20 ADD/bad-*) {bad_add} ;;\n\
         \x20 ADD/*) {pass} ;;\n\
         esac\n\
         exit 0",
        pass = Engine::pass_through()
    )
}

#[test]
fn hanging_plugin_should_time_out_and_leave_no_process() {
    let e = Engine::new("fault-hang");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "hang-net";
    // The sleeper's child outlives a kill of the sleeper alone; only killing
    // the whole process group gets both.
    e.fake(
        "fake-hang",
        &faulty_body(
            r#"(exec -a "$BIN/fake-hang-child" sleep 1000) &
      echo $! > "$BIN/hang-child.pid"; echo $$ > "$BIN/hang-sleep.pid"
      exec -a "$BIN/fake-hang-sleep" sleep 1000"#,
        ),
    );
    bridge_then(&e, &br, &subnet, net, "fake-hang");
    let ns = Netns::new();
    let mut d = e.start("d", net, "1s");

    let started = Instant::now();
    let run = Call::new("ADD", "bad-hang", &ns, "eth0").run(&d);
    // The plugin wrote both pids before it hung: the sleeper and its child
    // both ran, however late the test looks (the machine may be busy).
    let pid = |name: &str| -> i32 {
        let path = e.bin_dir.join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        text.trim().parse().unwrap()
    };
    let pids = [pid("hang-sleep.pid"), pid("hang-child.pid")];
    let took = started.elapsed();
    let (_, msg, _) = failed(&d, &run);
    assert!(
        msg.contains("\"fake-hang\""),
        "msg should name the plugin: {msg}"
    );
    assert!(msg.contains("timed out"), "{msg}");
    assert!(took < Duration::from_secs(10), "ADD took {took:?}");

    // Dead means gone or a zombie (this machine's PID 1 may not reap).
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    };
    let needle = format!("{}/fake-hang", e.bin_dir.display());
    wait_until(SETTLE, "the hung plugin and its child to be killed", || {
        !pids.iter().any(|&p| alive(p)) && processes_matching(&needle).is_empty()
    });
    assert_rolled_back(&e, &d, &br, &ns, net);
    assert_still_serves(&e, &mut d, &br, net);
}

#[test]
fn crashing_plugin_should_fail_clearly_and_keep_the_daemon() {
    let e = Engine::new("fault-crash");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "crash-net";
    e.fake("fake-crash", &faulty_body("ulimit -c 0; kill -SEGV $$"));
    bridge_then(&e, &br, &subnet, net, "fake-crash");
    let ns = Netns::new();
    let mut d = e.start("d", net, "10s");

    let (_, msg, _) = failed(&d, &cni(&d, "ADD", "bad-crash", &ns, "eth0"));
    assert!(
        msg.contains("\"fake-crash\""),
        "msg should name the plugin: {msg}"
    );
    assert!(
        msg.contains("signal") || msg.contains("exit status"),
        "msg should tell how it died: {msg}"
    );
    assert_rolled_back(&e, &d, &br, &ns, net);
    assert_still_serves(&e, &mut d, &br, net);
}

#[test]
fn garbage_printing_plugin_should_fail_clearly_and_keep_the_daemon() {
    let e = Engine::new("fault-garbage");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "garbage-net";
    e.fake(
        "fake-garbage",
        &faulty_body("echo 'this is not json'; exit 0"),
    );
    bridge_then(&e, &br, &subnet, net, "fake-garbage");
    let ns = Netns::new();
    let mut d = e.start("d", net, "10s");

    let (_, msg, _) = failed(&d, &cni(&d, "ADD", "bad-garbage", &ns, "eth0"));
    assert!(
        msg.contains("\"fake-garbage\""),
        "msg should name the plugin: {msg}"
    );
    assert!(msg.contains("invalid result"), "{msg}");
    assert_rolled_back(&e, &d, &br, &ns, net);
    assert_still_serves(&e, &mut d, &br, net);
}

#[test]
fn failed_add_should_roll_back_the_whole_chain() {
    let e = Engine::new("fault-rollback");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "rollback-net";
    let calls = e.dir.join("refuse.calls");
    e.fake(
        "fake-refuse",
        r#"echo "$CNI_COMMAND $CNI_CONTAINERID" >> "$DIR/refuse.calls"
case "$CNI_COMMAND" in
  ADD) echo '{"code":999,"msg":"nope"}'; exit 1 ;;
esac
exit 0"#,
    );
    bridge_then(&e, &br, &subnet, net, "fake-refuse");
    let ns = Netns::new();
    let d = e.start("d", net, "10s");

    let (code, msg, _) = failed(&d, &cni(&d, "ADD", "ctr-rb", &ns, "eth0"));
    assert_eq!(code, 999, "the plugin's own code is kept: {msg}");
    assert!(msg.contains("nope"), "{msg}");
    assert!(
        msg.contains("\"fake-refuse\""),
        "msg should name the plugin: {msg}"
    );
    assert_rolled_back(&e, &d, &br, &ns, net);
    let log = fs::read_to_string(&calls).unwrap_or_default();
    assert!(
        log.lines().any(|l| l == "DEL ctr-rb"),
        "rollback did not DEL the fake: {log:?}"
    );
}

#[test]
fn daemon_killed_mid_add_should_let_a_restarted_daemon_del() {
    let e = Engine::new("fault-kill9");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "kill9-net";
    let marker = e.dir.join("slow.started");
    let del_log = e.dir.join("slow.del");
    e.fake(
        "fake-slow",
        r#"case "$CNI_COMMAND" in
  ADD) touch "$DIR/slow.started"; exec -a "$BIN/fake-slow-sleep" sleep 1000 ;;
  DEL) echo "DEL $CNI_CONTAINERID" >> "$DIR/slow.del" ;;
esac
exit 0"#,
    );
    bridge_then(&e, &br, &subnet, net, "fake-slow");
    let ns = Netns::new();
    let mut d = e.start("d", net, "30s");

    let add = Call::new("ADD", "ctr-k9", &ns, "eth0").spawn(&d);
    wait_until(SETTLE, "the slow plugin to start", || marker.exists());
    // bridge ran before the slow plugin.
    assert!(ns.has_link("eth0"), "{:?}", ns.ifaces());
    d.signal(libc::SIGKILL);
    d.wait_exit(SETTLE);
    // Without systemd nothing kills the plugin the dead daemon started; under
    // systemd, KillMode=mixed kills what is left in the unit's cgroup before
    // the restart (systemd_units.rs proves that). Do its job here.
    let needle = format!("{}/fake-slow", e.bin_dir.display());
    for (pid, _) in processes_matching(&needle) {
        // SAFETY: kill(2) on a fake plugin this test started (its command
        // line names this test's private directory).
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    wait_until(SETTLE, "the orphaned slow plugin to be gone", || {
        processes_matching(&needle).is_empty()
    });
    let run = add.finish();
    assert_eq!(run.code, Some(1), "{run:?}");
    let err: Value = run.json();
    assert!(err["code"].as_u64().is_some_and(|c| c != 0), "{run:?}");

    assert!(
        e.record("ctr-k9").is_file(),
        "no record of the interrupted ADD survived the crash: {:?}",
        e.records()
    );

    // Same config and stateDir.
    let d2 = e.start("d2", net, "30s");
    ok(&d2, &cni(&d2, "DEL", "ctr-k9", &ns, "eth0"));
    assert!(!ns.has_link("eth0"), "{:?}\n{}", ns.ifaces(), d2.log_text());
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(e.records(), Vec::<String>::new());
    let dels = fs::read_to_string(&del_log).unwrap_or_default();
    assert!(
        dels.lines().any(|l| l == "DEL ctr-k9"),
        "the slow plugin's DEL never ran: {dels:?}\n{}",
        d2.log_text()
    );
    ok(&d2, &cni(&d2, "DEL", "ctr-k9", &ns, "eth0"));
}

#[test]
fn fifty_concurrent_containers_should_add_and_del_cleanly() {
    const N: usize = 50;
    let e = Engine::new("fault-fifty");
    // Made here so that fifty first ADDs do not race to create it.
    let br = Link::bridge();
    let subnet = Subnet::new();
    let net = "fifty-net";
    e.write_network(
        "10-fifty.conflist",
        &conflist(net, "1.0.0", vec![bridge(&br.name, e.host_local(&subnet))]),
    );
    let namespaces: Vec<Netns> = (0..N).map(|_| Netns::new()).collect();
    let d = e.start("d", net, "20s");

    let run_all = |command: &str| -> Vec<crate::support::shim::Run> {
        std::thread::scope(|s| {
            let handles: Vec<_> = namespaces
                .iter()
                .enumerate()
                .map(|(i, ns)| {
                    let d = &d;
                    s.spawn(move || cni(d, command, &format!("ctr-{i}"), ns, "eth0"))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };

    let adds = run_all("ADD");
    let mut seen = HashSet::new();
    for (i, run) in adds.iter().enumerate() {
        let r = ok(&d, run);
        let addr = address(&r);
        assert!(
            subnet.holds(&addr),
            "ctr-{i}: {addr} not in {}",
            subnet.cidr()
        );
        assert!(seen.insert(addr.clone()), "ctr-{i}: {addr} given twice");
        let eth0 = namespaces[i]
            .iface("eth0")
            .unwrap_or_else(|| panic!("ctr-{i}: no eth0"));
        assert!(eth0.has_addr(&addr), "ctr-{i}: {eth0:?} lacks {addr}");
    }
    assert_eq!(bridge_ports(&br.name).len(), N);
    assert_eq!(e.reservations(net).len(), N);
    assert_eq!(e.records().len(), N);

    for (i, run) in run_all("DEL").iter().enumerate() {
        ok(&d, run);
        assert!(!namespaces[i].has_link("eth0"), "ctr-{i}: eth0 left");
    }
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(e.records(), Vec::<String>::new());
    wait_until(SETTLE, "plexusd to have no child process", || {
        children(d.pid()).is_empty()
    });
}

#[test]
fn invalid_input_should_give_code_4_and_run_no_plugin() {
    let e = Engine::new("fault-invalid");
    let calls = e.dir.join("record.calls");
    // Records every exec, VERSION included.
    e.fake_with(
        "fake-record",
        r#"echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME" >> "$DIR/record.calls""#,
        Engine::pass_through(),
    );
    e.write_network(
        "record.conflist",
        &conflist(
            "record-net",
            "1.0.0",
            vec![serde_json::json!({"type": "fake-record"})],
        ),
    );
    let ns = Netns::new();
    let d = e.start("d", "record-net", "10s");
    // VERSION probes (the daemon's start-up check, the version cache) do
    // not count: only calls for a container do.
    let container_calls = || -> Vec<String> {
        fs::read_to_string(&calls)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("VERSION"))
            .map(str::to_string)
            .collect()
    };
    let before = container_calls();

    let cases = [
        ("container id a/b", Call::new("ADD", "a/b", &ns, "eth0")),
        (
            "16-char ifname",
            Call::new("ADD", "ctr-inv", &ns, "abcdefghijklmnop"),
        ),
        (
            "CNI_ARGS FOO",
            Call::new("ADD", "ctr-inv", &ns, "eth0").args("FOO"),
        ),
    ];
    for (what, call) in cases {
        for command in ["ADD", "DEL"] {
            let mut call = call.clone();
            call.command = command.into();
            let (code, msg, _) = failed(&d, &call.run(&d));
            assert_eq!(code, 4, "{command} with {what}: {msg}");
            assert_eq!(
                container_calls(),
                before,
                "{command} with {what} ran a plugin"
            );
        }
    }
    assert_eq!(e.records(), Vec::<String>::new());

    // The recorder does record a valid call.
    ok(&d, &cni(&d, "ADD", "ctr-valid", &ns, "eth0"));
    ok(&d, &cni(&d, "DEL", "ctr-valid", &ns, "eth0"));
    let log = fs::read_to_string(&calls).unwrap_or_default();
    assert!(log.contains("ADD ctr-valid eth0"), "{log:?}");
    assert!(log.contains("DEL ctr-valid eth0"), "{log:?}");
    assert_eq!(e.records(), Vec::<String>::new());
}
