//! The built plexusd's drain and the pods' network-status writes it has
//! pending: a write the API server refused at ADD time (503) and that is
//! waiting for its retry when SIGTERM comes is tried at once and waited
//! for, so the pod has its annotation before the daemon exits; one the API
//! server keeps refusing is handed over when `shutdownTimeout` runs out,
//! and the daemon exits all the same.
//!
//! One attempt at the write is one PATCH as the daemon sees it, but the
//! Kubernetes client repeats a PATCH answered 503 itself (from 5 ms,
//! doubling) until `kubernetesRequestTimeout` ends the attempt: so the API
//! server refuses the pod's status writes until a given moment, not a
//! given number of times.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::cni::{address, bare, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::kube::{pod_args, FakeApi, NODE};
use crate::support::netns::{Link, Netns, Subnet};
use crate::support::systemd::poll_until;

/// The path of pod `ns1/p`'s status writes.
const STATUS_PATH: &str = "/namespaces/ns1/pods/p/status";
/// `kubernetesRequestTimeout`: how long one attempt at a write lasts when
/// the API server refuses it.
const REQUEST_TIMEOUT: &str = "1s";

/// plexusd in Kubernetes mode on a node whose cluster network is a bridge
/// of its own, serving pod `ns1/p`.
struct Node {
    api: FakeApi,
    subnet: Subnet,
    daemon: Daemon,
    // Dropped after the daemon: its directory and the bridge.
    _engine: Engine,
    _link: Link,
}

fn node(tag: &str, shutdown_timeout: &str) -> Node {
    let (engine, link, subnet) = Engine::with_cluster_bridge(tag);
    let api = FakeApi::start();
    api.put_pod("ns1", "p", "uid-p", NODE, json!({}));
    let mut config = engine.config("cluster", "20s");
    config["shutdownTimeout"] = json!(shutdown_timeout);
    let daemon = api.start_daemon(&engine.dir, config, REQUEST_TIMEOUT);
    Node {
        api,
        subnet,
        daemon,
        _engine: engine,
        _link: link,
    }
}

impl Node {
    /// The pod's sandbox `id` ADDed in `netns` through plexus-shim: it
    /// succeeds; its address, checked to be in the cluster subnet.
    fn add(&self, id: &str, netns: &Netns) -> String {
        let run = Call::new("ADD", id, netns, "eth0")
            .args(&pod_args("ns1", "p", "uid-p"))
            .run(&self.daemon);
        let result = ok(&self.daemon, &run);
        let address = address(&result);
        assert!(self.subnet.holds(&address), "{result}");
        assert!(netns.iface("eth0").is_some(), "no eth0: {result}");
        address
    }

    /// The PATCHes of the pod's status since `mark`.
    fn status_writes(&self, mark: usize) -> usize {
        self.api
            .calls_since(mark)
            .iter()
            .filter(|c| c.method == "PATCH" && c.path.ends_with(STATUS_PATH))
            .count()
    }
}

#[test]
fn a_status_write_waiting_for_its_retry_should_land_before_plexusd_exits() {
    let mut n = node("k8s-drain-wait", "20s");
    let netns = Netns::new();
    // Refused until the drain has tried again.
    n.api.fail_next(STATUS_PATH, 503, usize::MAX);
    let mark = n.api.mark();
    let address = n.add("k8sdrainw1", &netns);
    // The attempt in the call's path was refused: the write waits for its
    // first retry, half a second away, and the stop comes now.
    assert!(n.api.network_status("ns1", "p").is_none());
    assert!(n.status_writes(mark) > 0);
    let stopping = n.api.mark();
    let stopped = Instant::now();
    n.daemon.terminate();
    // The drain tries the write at once; once it has been refused again,
    // the API server takes it.
    poll_until(Duration::from_secs(20), || {
        n.status_writes(stopping) > 0 || !n.daemon.running()
    });
    n.api.clear_failures();
    let status = n.daemon.wait_exit(Duration::from_secs(30));
    let took = stopped.elapsed();
    println!("plexusd exited {took:?} after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", n.daemon.log_text());
    let written = n.api.network_status("ns1", "p").unwrap_or_else(|| {
        panic!(
            "no network-status on the pod after plexusd exited ({took:?} after SIGTERM); \
             status writes since the stop: {}",
            n.status_writes(stopping)
        )
    });
    assert!(
        written.contains(&format!("\"{}\"", bare(&address))),
        "{written}"
    );
}

#[test]
fn a_status_write_still_refused_should_be_handed_over_when_the_grace_period_ends() {
    const GRACE: Duration = Duration::from_secs(1);
    let mut n = node("k8s-drain-left", &format!("{}s", GRACE.as_secs()));
    let netns = Netns::new();
    // Refused for good.
    n.api.fail_next(STATUS_PATH, 503, usize::MAX);
    n.add("k8sdrainl1", &netns);
    let stopping = n.api.mark();
    let stopped = Instant::now();
    n.daemon.terminate();
    let status = n.daemon.wait_exit(GRACE * 5);
    let took = stopped.elapsed();
    println!("plexusd exited {took:?} after SIGTERM (shutdownTimeout {GRACE:?})");
    assert_eq!(status.code(), Some(0), "{}", n.daemon.log_text());
    assert!(n.api.network_status("ns1", "p").is_none());
    // The drain did try again: the retry it hurried.
    assert!(n.status_writes(stopping) > 0);
}
