//! A pod is never held forever by a DEL that cannot succeed, and nothing
//! is forgotten: the runtime's first DELs get the error (a passing failure
//! is repaired by its retry), a later one succeeds while plexusd keeps what
//! is left and retries it alone, in the recorded namespace while it is the
//! same, without it once it is gone, and gives up a gone container's DEL
//! that keeps failing the same way. Debian's bridge, host-local and
//! macvlan; a fake plugin only for a DEL that fails a set number of times.
//! Needs root.

use std::fs;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cni::{bridge, cni, conflist, failed, ok, Call, Engine, SYSTEM_PLUGINS};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::http;
use crate::support::netns::{bridge_ports, unique_name, Link, Netns, Subnet};
use crate::support::shim::Run;

/// plexusd with `clusterNetwork` `main` and `defaultNetworks` `extra`,
/// retrying failed DELs every 100 ms and giving up after `give_up` same
/// failures.
fn start(e: &Engine, main: &str, extra: &str, give_up: u32) -> Daemon {
    start_with(e, main, extra, give_up, "100ms")
}

/// [`start`] with `cleanupRetryInterval` `interval`.
fn start_with(e: &Engine, main: &str, extra: &str, give_up: u32, interval: &str) -> Daemon {
    let config = json!({
        "confDir": e.conf_dir,
        "binDir": format!("{}:{SYSTEM_PLUGINS}", e.bin_dir.display()),
        "stateDir": e.state_dir,
        "clusterNetwork": main,
        "defaultNetworks": [extra],
        "pluginTimeout": "20s",
        "delErrorsReported": 2,
        "cleanupRetryInterval": interval,
        "cleanupGiveUpAfter": give_up,
    });
    let mut d = Daemon::start(&e.dir, "d", config);
    d.ready();
    d
}

fn record(e: &Engine, id: &str) -> Option<Value> {
    let text = fs::read(e.record(id)).ok()?;
    Some(serde_json::from_slice(&text).unwrap())
}

/// The `cleanup` of the only attachment of `id`'s record.
fn cleanup(e: &Engine, id: &str) -> Value {
    let r = record(e, id).unwrap_or_else(|| panic!("no record of {id}"));
    let atts = r["attachments"].as_array().unwrap();
    assert_eq!(atts.len(), 1, "{r}");
    atts[0]["cleanup"].clone()
}

fn metric(d: &Daemon, sample: &str) -> Option<f64> {
    http::metric(&d.sock, sample)
}

/// The working cluster network `dp-main` (bridge + host-local) on a
/// bridge of its own.
fn main_network(e: &Engine) -> Link {
    let br = Link::bridge();
    e.write_network(
        "10-main.conflist",
        &conflist(
            "dp-main",
            "1.0.0",
            vec![bridge(&br.name, e.host_local(&Subnet::new()))],
        ),
    );
    br
}

/// ADD of `id` (which must succeed), then the runtime's DELs until one is
/// answered with success: the first two get the error, the third hands
/// the failing DEL over to plexusd.
fn add_then_hand_over(d: &Daemon, id: &str, ns: &Netns) {
    ok(d, &cni(d, "ADD", id, ns, "eth0"));
    let answers: Vec<_> = (0..3).map(|_| del(d, id, ns).code).collect();
    assert_eq!(answers, [Some(1), Some(1), Some(0)]);
}

fn del(d: &Daemon, id: &str, ns: &Netns) -> Run {
    cni(d, "DEL", id, ns, "eth0")
}

/// A bridge network that works (eth0) and a macvlan network whose master
/// does not exist (net1): every ADD and every DEL of it fail.
fn never_node(tag: &str, give_up: u32) -> (Engine, Link, Daemon) {
    let e = Engine::new(tag);
    let br = main_network(&e);
    let s2 = Subnet::new();
    let master = unique_name("nm");
    e.write_network(
        "20-mv.conflist",
        &conflist(
            "dp-mv",
            "1.0.0",
            vec![json!({"type": "macvlan", "master": master, "mode": "bridge", "ipam": e.host_local(&s2)})],
        ),
    );
    let d = start(&e, "dp-main", "dp-mv", give_up);
    (e, br, d)
}

/// multus's and Plexus's old answer to a macvlan network whose master is
/// missing: every DEL failed ("Link not found") forever, the pod stayed
/// Terminating, and each failed attempt left a record nothing would DEL.
#[test]
fn a_network_that_can_never_work_should_let_the_pod_go_and_be_given_up_once_gone() {
    let (e, br, d) = never_node("dp-never", 2);
    let ns = Netns::new();
    let id = "dp-never-1";

    // ADD fails; its rollback undoes the bridge network, not macvlan's.
    let (_, msg, _) = failed(&d, &cni(&d, "ADD", id, &ns, "eth0"));
    assert!(msg.contains("Link not found"), "{msg}");
    assert!(
        !ns.has_link("eth0") && !ns.has_link("net1"),
        "{:?}",
        ns.ifaces()
    );
    assert!(e.reservations("dp-main").is_empty());
    assert!(bridge_ports(&br.name).is_empty());
    let c = cleanup(&e, id);
    assert_eq!(
        (c["failures"].as_u64(), c["reported"].as_u64()),
        (Some(1), Some(0)),
        "{c}"
    );

    // The runtime's first two DELs get the error, the third succeeds.
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(del(&d, id, &ns).code);
    }
    assert_eq!(answers, [Some(1), Some(1), Some(0)]);
    assert_eq!(cleanup(&e, id)["handedOver"], json!(true));
    // What `plexusd show` prints, from the same record.
    let shown = http::request(&d.sock, "GET", &format!("/attachments/{id}"), b"").unwrap();
    let shown = shown.json()["attachments"][0]["cleanup"].clone();
    assert_eq!(shown["handedOver"], json!(true), "{shown}");
    assert!(
        shown["lastError"]
            .as_str()
            .unwrap()
            .contains("Link not found"),
        "{shown}"
    );
    assert_eq!(
        metric(&d, "plexus_cleanups_total{outcome=\"handed_over\"}"),
        Some(1.0)
    );
    assert_eq!(metric(&d, "plexus_cleanups_pending"), Some(1.0));
    // A repeated DEL stays a success.
    assert_eq!(del(&d, id, &ns).code, Some(0));

    // While the namespace exists, plexusd's retries use it and do not
    // give up, however often they fail.
    let before = cleanup(&e, id)["failures"].as_u64().unwrap();
    wait_until(Duration::from_secs(20), "plexusd's own retries", || {
        cleanup(&e, id)["failures"].as_u64().unwrap() >= before + 3
    });
    assert_eq!(cleanup(&e, id)["sameWhileGone"], json!(0));

    // The container goes: the same failure twice more without it, then
    // plexusd gives up, counted.
    drop(ns);
    wait_until(
        Duration::from_secs(20),
        "the cleanup to be given up",
        || record(&e, id).is_none(),
    );
    assert_eq!(
        metric(&d, "plexus_cleanups_total{outcome=\"given_up\"}"),
        Some(1.0)
    );
    // The gauge follows the record's removal.
    wait_until(Duration::from_secs(20), "no cleanup pending", || {
        metric(&d, "plexus_cleanups_pending") == Some(0.0)
    });
    assert!(e.records().is_empty(), "{:?}", e.records());
}

/// A fake plugin chained after bridge whose DEL fails its first `fails`
/// calls; it notes each DEL's CNI_NETNS in `<dir>/flaky.netns`.
fn flaky(e: &Engine, fails: u32) {
    e.fake(
        "flaky",
        &format!(
            r#"if [ "$CNI_COMMAND" = DEL ]; then
  echo "$CNI_NETNS" >> "$DIR/flaky.netns"
  n=$(wc -l < "$DIR/flaky.netns")
  if [ "$n" -le {fails} ]; then
    echo '{{"cniVersion":"1.0.0","code":11,"msg":"flaky: not yet"}}'
    exit 1
  fi
  exit 0
fi
{}"#,
            Engine::pass_through()
        ),
    );
}

fn flaky_node(tag: &str, fails: u32) -> (Engine, Link, Link, Daemon) {
    flaky_node_with(tag, fails, "100ms")
}

/// [`flaky_node`] with `cleanupRetryInterval` `interval`.
fn flaky_node_with(tag: &str, fails: u32, interval: &str) -> (Engine, Link, Link, Daemon) {
    let e = Engine::new(tag);
    let (br, br2) = (main_network(&e), Link::bridge());
    let s2 = Subnet::new();
    flaky(&e, fails);
    e.write_network(
        "20-flaky.conflist",
        &conflist(
            "dp-flaky",
            "1.0.0",
            vec![
                bridge(&br2.name, e.host_local(&s2)),
                json!({"type": "flaky"}),
            ],
        ),
    );
    let d = start_with(&e, "dp-main", "dp-flaky", 2, interval);
    (e, br, br2, d)
}

fn netns_seen(e: &Engine) -> Vec<String> {
    fs::read_to_string(e.dir.join("flaky.netns"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A DEL that fails once (a plugin timing out, say) reaches the runtime
/// as an error, and the runtime's retry repairs it: nothing handed over.
#[test]
fn a_passing_del_failure_should_reach_the_runtime_and_its_retry_should_repair_it() {
    let (e, br, br2, d) = flaky_node("dp-once", 1);
    let ns = Netns::new();
    let id = "dp-once-1";
    ok(&d, &cni(&d, "ADD", id, &ns, "eth0"));
    assert!(ns.has_link("eth0") && ns.has_link("net1"));

    let (_, msg, _) = failed(&d, &del(&d, id, &ns));
    assert!(msg.contains("flaky: not yet"), "{msg}");
    assert_eq!(cleanup(&e, id)["handedOver"], json!(false));
    ok(&d, &del(&d, id, &ns));
    assert!(record(&e, id).is_none());
    assert!(e.reservations("dp-main").is_empty() && e.reservations("dp-flaky").is_empty());
    assert!(bridge_ports(&br.name).is_empty() && bridge_ports(&br2.name).is_empty());
    assert_eq!(
        metric(&d, "plexus_cleanups_total{outcome=\"done\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&d, "plexus_cleanups_total{outcome=\"handed_over\"}"),
        None
    );
}

/// A DEL that fails until the container is gone: handed over after the
/// runtime's third DEL, then retried by plexusd without the namespace
/// (its path names nothing any more), which releases the address.
#[test]
fn a_del_retried_after_the_netns_is_gone_should_run_without_it_and_release_everything() {
    let (e, _br, br2, d) = flaky_node("dp-gone", 1_000);
    let ns = Netns::new();
    let id = "dp-gone-1";
    add_then_hand_over(&d, id, &ns);
    assert_eq!(cleanup(&e, id)["handedOver"], json!(true));
    // Each DEL of the chain ran bridge's DEL too, in the namespace.
    assert!(!ns.has_link("net1") && !ns.has_link("eth0"));
    let path = ns.path.clone();
    assert!(
        netns_seen(&e).iter().all(|p| *p == path),
        "{:?}",
        netns_seen(&e)
    );

    // The container goes, and the plugin recovers: the next retry runs
    // without a namespace and ends the cleanup.
    drop(ns);
    flaky(&e, 0);
    wait_until(Duration::from_secs(20), "the retried DEL", || {
        record(&e, id).is_none()
    });
    assert_eq!(netns_seen(&e).last().map(String::as_str), Some(""));
    assert!(e.reservations("dp-flaky").is_empty() && e.reservations("dp-main").is_empty());
    assert!(bridge_ports(&br2.name).is_empty());
    assert_eq!(
        metric(&d, "plexus_cleanups_total{outcome=\"done\"}"),
        Some(1.0)
    );
}

/// A runtime that reuses container ids (podman's restart) ADDs again over
/// a DEL that was answered with success but is still pending: the pending
/// DEL runs first, and the ADD waits for it to succeed.
#[test]
fn an_add_over_a_pending_del_should_finish_that_del_first() {
    let (e, _br, br2, d) = flaky_node("dp-readd", 1_000);
    let ns = Netns::new();
    let id = "dp-readd-1";
    add_then_hand_over(&d, id, &ns);
    let (code, msg, _) = failed(&d, &cni(&d, "ADD", id, &ns, "eth0"));
    assert_eq!(code, 11, "{msg}");
    assert!(
        msg.contains("still pending") && msg.contains("flaky: not yet"),
        "{msg}"
    );
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());

    flaky(&e, 0);
    ok(&d, &cni(&d, "ADD", id, &ns, "eth0"));
    assert!(ns.has_link("eth0") && ns.has_link("net1"));
    assert_eq!(cleanup(&e, id), Value::Null);
    assert_eq!(bridge_ports(&br2.name).len(), 1);
    ok(&d, &del(&d, id, &ns));
    assert!(record(&e, id).is_none());
}

/// kubelet retries a pod whose sandbox cannot get its network, each time
/// with a new sandbox (container id): the older attempt's cleanup is given
/// up as soon as it fails once more after its sandbox went and a newer one
/// of the same pod fails the same way; the newest stays pending.
#[test]
fn attempts_of_one_pod_should_not_pile_up_a_pending_cleanup_each() {
    let (e, _br, d) = never_node("dp-pile", 1_000);
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_UID=5f0c-pile";
    let mut ids = Vec::new();
    for attempt in 1..=3 {
        let ns = Netns::new();
        let id = format!("dp-pile-{attempt}");
        let call = |command: &str| Call::new(command, &id, &ns, "eth0").args(args).run(&d);
        failed(&d, &call("ADD"));
        let answers: Vec<_> = (0..3).map(|_| call("DEL").code).collect();
        assert_eq!(answers, [Some(1), Some(1), Some(0)]);
        // The sandbox goes, as after a successful StopPodSandbox.
        drop(ns);
        ids.push(id);
    }
    wait_until(
        Duration::from_secs(20),
        "the older attempts to be given up",
        || record(&e, &ids[0]).is_none() && record(&e, &ids[1]).is_none(),
    );
    assert_eq!(
        metric(&d, "plexus_cleanups_total{outcome=\"given_up\"}"),
        Some(2.0)
    );
    // The newest is kept: nothing newer fails like it, and 1000 same
    // failures are far off.
    assert_eq!(cleanup(&e, &ids[2])["handedOver"], json!(true));
    assert_eq!(metric(&d, "plexus_cleanups_pending"), Some(1.0));
}

/// A GC call makes every pending cleanup due at once: with an hour between
/// retries, the DEL runs again right after the runtime's GC.
#[test]
fn a_gc_call_should_retry_pending_cleanups_at_once() {
    let (e, _br, br2, d) = flaky_node_with("dp-gc", 1_000, "1h");
    let ns = Netns::new();
    let id = "dp-gc-1";
    add_then_hand_over(&d, id, &ns);
    assert_eq!(cleanup(&e, id)["handedOver"], json!(true));
    flaky(&e, 0);
    ok(&d, &crate::support::cni::gc(&d, json!([])));
    wait_until(Duration::from_secs(20), "the DEL the GC made due", || {
        record(&e, id).is_none()
    });
    assert!(e.reservations("dp-flaky").is_empty());
    assert!(bridge_ports(&br2.name).is_empty());
}
