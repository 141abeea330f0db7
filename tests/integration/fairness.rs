//! One bad pod cannot starve the node: a container whose plugin hangs holds
//! one processing slot whatever the number of its calls (the runtime's
//! retries, hot-plugs), a GC storm holds one as well, and the other pods'
//! ADDs are served meanwhile. Debian's bridge and host-local in real
//! namespaces, behind a fake plugin that hangs for the `bad-*` containers
//! until the test releases it. Needs root.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::admission::listen_queue;
use crate::support::cni::{
    address, bridge, cni, conflist, failed, gc_call, ok, Call, Engine, Pending, SETTLE,
};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::http::{self, Response};
use crate::support::netns::{bridge_ports, Link, Netns, Subnet};
use crate::support::shim::{self, Run};

const NET: &str = "fair-net";

/// A node with one network: bridge + host-local, then `stuck`, a fake that
/// passes its prevResult through, except that for the `bad-*` containers
/// its ADD and DEL first wait for `$DIR/release` (touching
/// `$DIR/stuck.<command>` when they start), and for the `slowdel-*`
/// containers its DEL waits for `$DIR/release-del` (touching
/// `$DIR/stuck.slowdel.<container>`).
struct Node {
    e: Engine,
    br: Link,
    subnet: Subnet,
    d: Daemon,
    /// The metrics listener's port: /metrics without the unix socket.
    port: u16,
}

impl Node {
    fn start(name: &str, connection_limit: u64) -> Self {
        Self::start_at(name, connection_limit, "1.0.0")
    }

    /// With the network at `cni_version`; at 1.1.0 `stuck` speaks 1.1.0
    /// too and takes part in GC, copying each GC's stdin to
    /// `$DIR/gc.<n>`.
    fn start_at(name: &str, connection_limit: u64, cni_version: &str) -> Self {
        Self::start_with(name, connection_limit, cni_version, json!({}))
    }

    /// With the keys of `extra` set in daemon-config.json as well.
    fn start_with(name: &str, connection_limit: u64, cni_version: &str, extra: Value) -> Self {
        let e = Engine::new(name);
        let br = Link::planned("b");
        let subnet = Subnet::new();
        let version_1_1 = if cni_version == "1.1.0" {
            r#"if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}'; exit 0
fi
if [ "$CNI_COMMAND" = GC ]; then
  n=$(ls "$DIR" | grep -c '^gc\.'); echo "$STDIN" > "$DIR/gc.$n"; exit 0
fi"#
        } else {
            ""
        };
        e.fake_with(
            "stuck",
            version_1_1,
            &format!(
                r#"case "$CNI_COMMAND/$CNI_CONTAINERID" in
  ADD/bad-*|DEL/bad-*)
    touch "$DIR/stuck.$CNI_COMMAND"
    for _ in $(seq 12000); do [ -e "$DIR/release" ] && break; sleep 0.01; done ;;
  DEL/slowdel-*)
    touch "$DIR/stuck.slowdel.$CNI_CONTAINERID"
    for _ in $(seq 12000); do [ -e "$DIR/release-del" ] && break; sleep 0.01; done ;;
esac
if [ "$CNI_COMMAND" = ADD ]; then {}; fi
exit 0"#,
                Engine::pass_through()
            ),
        );
        let mut list = conflist(
            NET,
            cni_version,
            vec![
                bridge(&br.name, e.host_local(&subnet)),
                json!({"type": "stuck"}),
            ],
        );
        // Debian's bridge and host-local stop at 1.0.0.
        list["cniVersions"] = json!(["1.0.0", cni_version]);
        e.write_network("10-net.conflist", &list);
        let mut cfg = e.config(NET, "120s");
        cfg["connectionLimit"] = connection_limit.into();
        // Long enough for every good ADD below on a busy machine, short
        // enough that a test of a slot-holding wait fails in seconds.
        cfg["queueTimeout"] = "10s".into();
        let port = http::free_port("127.0.0.1");
        cfg["metricsPort"] = port.into();
        for (k, v) in extra.as_object().into_iter().flatten() {
            cfg[k] = v.clone();
        }
        let mut d = Daemon::start(&e.dir, "d", cfg);
        d.ready();
        Node {
            e,
            br,
            subnet,
            d,
            port,
        }
    }

    /// Starts the ADD of `bad-*` container `id` and waits until its
    /// plugin hangs.
    fn hung_add(&self, id: &str, ns: &Netns) -> Pending {
        let add = Call::new("ADD", id, ns, "eth0").spawn(&self.d);
        wait_until(SETTLE, "the bad ADD's plugin to hang", || self.stuck("ADD"));
        add
    }

    fn stuck(&self, command: &str) -> bool {
        self.e.dir.join(&format!("stuck.{command}")).exists()
    }

    fn release(&self) {
        std::fs::write(self.e.dir.join("release"), b"").unwrap();
    }

    fn gauge(&self, name: &str) -> f64 {
        http::metrics_over_tcp(self.port)
            .body_str()
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until `n` calls wait, for their turn or for a slot (each
    /// queued behind the one before, so they are served in the order they
    /// were started).
    fn wait_waiting(&self, n: usize) {
        wait_until(SETTLE, &format!("{n} calls waiting"), || {
            self.gauge("plexus_requests_waiting_turn") + self.gauge("plexus_requests_queued")
                == n as f64
        });
    }

    /// ADD then DEL of three good containers, one after the other, each in
    /// a namespace of its own: each gets eth0 with an address of the subnet.
    fn good_pods_are_served(&self) {
        for i in 0..3 {
            let ns = Netns::new();
            let id = format!("good-{i}");
            let r = ok(&self.d, &cni(&self.d, "ADD", &id, &ns, "eth0"));
            let addr = address(&r);
            assert!(
                self.subnet.holds(&addr),
                "{addr} not in {}",
                self.subnet.cidr()
            );
            let eth0 = ns.iface("eth0").expect("eth0 of a good container");
            assert!(eth0.has_addr(&addr), "{eth0:?} lacks {addr}");
            ok(&self.d, &cni(&self.d, "DEL", &id, &ns, "eth0"));
            assert!(!ns.has_link("eth0"));
        }
    }

    /// Nothing of any container is left: no record, no port on the bridge.
    fn assert_clean(&self) {
        wait_until(SETTLE, "every record to be gone", || {
            self.e.records().is_empty()
        });
        assert_eq!(bridge_ports(&self.br.name), Vec::<String>::new());
        assert_eq!(self.e.reservations(NET), Vec::<String>::new());
    }
}

/// `POST /delegate` of the node's network into container `id`, in a
/// thread.
fn hot_plug(node: &Node, id: &str, ns: &Netns) -> JoinHandle<Response> {
    let sock = node.d.sock.clone();
    let config = conflist(NET, "1.0.0", vec![json!({"type": "stuck"})]);
    let body = json!({
        "env": {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": id, "CNI_IFNAME": "net5",
                "CNI_NETNS": ns.path, "CNI_ARGS": "IgnoreUnknown=1"},
        "config": base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(&config).unwrap()),
    });
    std::thread::spawn(move || {
        http::request(&sock, "POST", "/delegate", body.to_string().as_bytes()).unwrap()
    })
}

fn finish_all(pending: Vec<Pending>) -> Vec<Run> {
    pending.into_iter().map(Pending::finish).collect()
}

/// The runtime retries a container whose ADD hangs (a DEL, another DEL, a
/// new ADD) and a controller hot-plugs into it: with two slots, the four
/// wait for the hung ADD without a slot, a fifth is refused at once, and
/// the other pods' ADDs get the second slot. Were a call waiting for the
/// container's lock holding a slot, the good ADDs would find none and be
/// refused with code 11 after `queueTimeout`.
#[test]
fn a_stuck_container_should_hold_one_slot_whatever_its_retries() {
    let node = Node::start("fair-retries", 2);
    let d = &node.d;
    let ns = Netns::new();
    let first = node.hung_add("bad-1", &ns);

    let mut retries = Vec::new();
    for (k, command) in ["DEL", "DEL", "ADD"].into_iter().enumerate() {
        retries.push(Call::new(command, "bad-1", &ns, "eth0").spawn(d));
        node.wait_waiting(k + 1);
    }
    let plug = hot_plug(&node, "bad-1", &ns);
    node.wait_waiting(4);
    assert_eq!(node.gauge("plexus_requests_in_flight"), 1.0);

    // A fifth call for the container is refused at once.
    let fifth = Call::new("DEL", "bad-1", &ns, "eth0").run(d);
    let (code, msg, _) = failed(d, &fifth);
    assert_eq!(code, 11, "{msg}");
    assert!(
        msg.contains("bad-1") && msg.contains("in progress"),
        "{msg}"
    );

    // The other pods are served while bad-1 still hangs.
    node.good_pods_are_served();
    // bad-1's ADD still hangs, its four calls still wait.
    assert_eq!(node.gauge("plexus_requests_in_flight"), 1.0);
    assert_eq!(node.gauge("plexus_requests_waiting_turn"), 4.0);

    node.release();
    ok(d, &first.finish());
    for run in finish_all(retries) {
        ok(d, &run);
    }
    let plugged = plug.join().unwrap();
    assert_eq!(plugged.status, 200, "{}", plugged.body_str());
    // The last ADD attached bad-1 again (and the hot-plug joined it): the
    // runtime's final DEL removes both.
    assert!(ns.has_link("eth0"), "{:?}", ns.ifaces());
    let recorded = node.e.records();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    ok(d, &cni(d, "DEL", "bad-1", &ns, "eth0"));
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    node.assert_clean();
}

/// GC calls that sweep a container whose ADD hangs: the first waits for
/// the container with a slot (a DEL and GC slot, `deleteLimit`), the
/// others wait for it without one, and the other pods' ADDs get the
/// remaining slots.
#[test]
fn a_gc_storm_should_hold_one_slot() {
    let node = Node::start("fair-gc", 3);
    let d = &node.d;
    let ns = Netns::new();
    let add = node.hung_add("bad-gc", &ns);

    // bad-gc is not among the valid attachments: each GC would delete it.
    let mut gcs = vec![gc_call(d, json!([]))];
    wait_until(SETTLE, "the first GC to hold a slot", || {
        node.gauge("plexus_requests_in_flight") == 2.0
    });
    for k in 1..=2 {
        gcs.push(gc_call(d, json!([])));
        node.wait_waiting(k);
    }

    node.good_pods_are_served();
    assert_eq!(node.gauge("plexus_requests_waiting_turn"), 2.0);
    assert_eq!(node.gauge("plexus_requests_in_flight"), 2.0);

    node.release();
    ok(d, &add.finish());
    for gc in gcs {
        let run = shim::finish(gc);
        assert_eq!(run.code, Some(0), "{run:?}\n{}", d.log_text());
    }
    // The first GC deleted the stale container once its ADD was done.
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    node.assert_clean();
}

/// GC's plugin phase needs a moment without any operation (a plugin told
/// to GC frees what the valid list lacks, so every ADD under way must be
/// in it). Behind an ADD whose plugin hangs it waits, and the other pods'
/// ADDs and DELs are served meanwhile; once the hung ADD is done, the
/// plugins' GC runs, with that container valid. Were GC queued for the
/// lock, every new ADD would wait behind it until the hung plugin ends.
#[test]
fn gc_waiting_behind_a_hung_add_should_hold_up_no_other_pod() {
    let node = Node::start_at("fair-gcwait", 4, "1.1.0");
    let d = &node.d;
    let ns = Netns::new();
    let add = node.hung_add("bad-gcw", &ns);
    let gc = gc_call(d, json!([{"containerID": "bad-gcw", "ifname": "eth0"}]));
    wait_until(SETTLE, "the plugins' GC to wait for the hung ADD", || {
        d.log_text()
            .contains("the plugins' GC waits for the CNI calls in progress")
    });

    node.good_pods_are_served();
    assert!(
        !node.e.dir.join("gc.0").exists(),
        "GC ran beside the hung ADD"
    );

    node.release();
    ok(d, &add.finish());
    let run = shim::finish(gc);
    assert_eq!(run.code, Some(0), "{run:?}\n{}", d.log_text());
    let sent: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.e.dir.join("gc.0")).unwrap()).unwrap();
    assert_eq!(
        sent["cni.dev/valid-attachments"],
        json!([{"containerID": "bad-gcw", "ifname": "eth0"}]),
        "{sent}"
    );
    ok(d, &cni(d, "DEL", "bad-gcw", &ns, "eth0"));
    node.assert_clean();
}

/// With one slot held by a hung ADD and 16 requests waiting for it (4 per
/// slot, at least 16), plexusd stops accepting: the next client waits in
/// the listen backlog, where it costs the daemon no memory, and is served
/// once the queue moves. Were it accepted, its request would be read and
/// held like the 16 (a herd of 1,000 pods would hold 1,000).
#[test]
fn a_full_queue_should_leave_new_clients_in_the_backlog() {
    let node = Node::start("fair-pause", 1);
    let d = &node.d;
    let ns = Netns::new();
    let bad = node.hung_add("bad-pause", &ns);
    let spaces: Vec<Netns> = (0..16).map(|_| Netns::new()).collect();
    let queued: Vec<Pending> = spaces
        .iter()
        .enumerate()
        .map(|(i, ns)| Call::new("ADD", &format!("good-q{i}"), ns, "eth0").spawn(d))
        .collect();
    wait_until(SETTLE, "16 requests queued", || {
        node.gauge("plexus_requests_queued") == 16.0
    });
    let mut late = UnixStream::connect(&d.sock).unwrap();
    late.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    wait_until(SETTLE, "the next client in the listen backlog", || {
        listen_queue(&d.sock) == Some(1)
    });
    late.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(late.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "answered while the queue was full"
    );
    assert_eq!(node.gauge("plexus_requests_queued"), 16.0);

    node.release();
    ok(d, &bad.finish());
    late.set_nonblocking(false).unwrap();
    late.set_read_timeout(Some(SETTLE)).unwrap();
    assert_eq!(http::read_response(&mut late).unwrap().status, 200);
    for (run, ns) in finish_all(queued).iter().zip(&spaces) {
        let r = ok(d, run);
        assert!(ns.iface("eth0").is_some_and(|i| i.has_addr(&address(&r))));
    }
    for (i, ns) in spaces.iter().enumerate() {
        ok(d, &cni(d, "DEL", &format!("good-q{i}"), ns, "eth0"));
    }
    ok(d, &cni(d, "DEL", "bad-pause", &ns, "eth0"));
    node.assert_clean();
}

/// A DEL takes a slot of its own pool (`deleteLimit`): with the one ADD
/// slot (`connectionLimit` 1) held by an ADD whose plugin hangs, another
/// pod's DEL runs at once and detaches it while the ADD still hangs. Were
/// DELs in the ADDs' pool, it would wait for the hung ADD and be refused
/// with code 11 after `queueTimeout`.
#[test]
fn a_del_should_run_while_every_add_slot_hangs() {
    let node = Node::start("fair-delslot", 1);
    let d = &node.d;
    let good = Netns::new();
    let r = ok(d, &cni(d, "ADD", "good-del", &good, "eth0"));
    assert!(good.iface("eth0").is_some_and(|i| i.has_addr(&address(&r))));
    let ns = Netns::new();
    let bad = node.hung_add("bad-del", &ns);
    assert_eq!(node.gauge("plexus_requests_in_flight"), 1.0);

    ok(d, &cni(d, "DEL", "good-del", &good, "eth0"));
    assert!(!good.has_link("eth0"), "{:?}", good.ifaces());
    // The ADD still hangs: the DEL did not run after it.
    assert_eq!(node.gauge("plexus_requests_in_flight"), 1.0);
    assert!(!node.e.dir.join("release").exists());

    node.release();
    ok(d, &bad.finish());
    ok(d, &cni(d, "DEL", "bad-del", &ns, "eth0"));
    node.assert_clean();
}

/// DEL slots are bounded too: with `deleteLimit` 1 and a DEL whose plugin
/// hangs, the next DEL waits (its pod keeps eth0), while a flood of DELs
/// takes none of the ADDs' slots: another pod's ADD is served at once.
/// Once the hung DEL ends, the waiting one runs.
#[test]
fn del_slots_should_be_bounded_and_leave_the_add_slots_free() {
    let node = Node::start_with("fair-delpool", 1, "1.0.0", json!({"deleteLimit": 1}));
    let d = &node.d;
    let spaces = [Netns::new(), Netns::new()];
    for (i, ns) in spaces.iter().enumerate() {
        ok(d, &cni(d, "ADD", &format!("slowdel-{i}"), ns, "eth0"));
    }
    let first = Call::new("DEL", "slowdel-0", &spaces[0], "eth0").spawn(d);
    wait_until(SETTLE, "the first DEL's plugin to hang", || {
        node.e.dir.join("stuck.slowdel.slowdel-0").exists()
    });
    let second = Call::new("DEL", "slowdel-1", &spaces[1], "eth0").spawn(d);
    node.wait_waiting(1);
    assert_eq!(node.gauge("plexus_requests_queued"), 1.0);

    let good = Netns::new();
    let r = ok(d, &cni(d, "ADD", "good-pool", &good, "eth0"));
    assert!(good.iface("eth0").is_some_and(|i| i.has_addr(&address(&r))));
    // The second DEL still waits for the one DEL slot.
    assert!(spaces[1].has_link("eth0"), "{:?}", spaces[1].ifaces());
    assert!(!node.e.dir.join("stuck.slowdel.slowdel-1").exists());
    assert_eq!(node.gauge("plexus_requests_queued"), 1.0);

    std::fs::write(node.e.dir.join("release-del"), b"").unwrap();
    ok(d, &first.finish());
    ok(d, &second.finish());
    for ns in &spaces {
        assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    }
    ok(d, &cni(d, "DEL", "good-pool", &good, "eth0"));
    node.assert_clean();
}
