//! plexusd in a large cluster (the test API server's made-up objects): it
//! lists and watches only this node's pods, pages the NAD list and keeps
//! every page, and a NAD changed or deleted while its watch was away is
//! what the next ADD sees once the cache has listed again.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::cni::{conflist, failed, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::kube::{pod_args, BulkConfigs, BulkSpec, FakeApi, Logged, NODE};
use crate::support::netns::Netns;

const T: Duration = Duration::from_secs(20);

/// A node whose networks are all the `rec` fake: it writes each ADD's
/// config as one line to `<dir>/adds.log` and answers an empty result.
fn engine(tag: &str) -> Engine {
    let engine = Engine::new(tag);
    engine.fake(
        "rec",
        r#"case "$CNI_COMMAND" in
ADD) printf '%s\n' "$(printf '%s' "$STDIN" | jq -c .)" >> "$DIR/adds.log"
     printf '%s' "$STDIN" | jq -c '{cniVersion: .cniVersion}' ;;
esac
exit 0"#,
    );
    engine.write_network(
        "10-cluster.conflist",
        &conflist("cluster", "1.0.0", vec![json!({"type": "rec"})]),
    );
    engine
}

/// A NAD config for the `rec` fake, told apart by `marker`.
fn rec_config(name: &str, marker: &str) -> String {
    json!({"cniVersion": "1.0.0", "name": name, "type": "rec", "marker": marker}).to_string()
}

/// The markers of the ADD configs `rec` saw (the cluster network's has
/// none), in order.
fn markers(engine: &Engine) -> Vec<String> {
    std::fs::read_to_string(engine.dir.join("adds.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["marker"].as_str().map(str::to_string))
        .collect()
}

fn add(d: &Daemon, id: &str, ns: &Netns, pod_ns: &str, pod: &str) -> crate::support::shim::Run {
    Call::new("ADD", id, ns, "eth0")
        .args(&pod_args(pod_ns, pod, &format!("uid-{pod}")))
        .run(d)
}

fn del(d: &Daemon, id: &str, ns: &Netns, pod_ns: &str, pod: &str) {
    ok(
        d,
        &Call::new("DEL", id, ns, "eth0")
            .args(&pod_args(pod_ns, pod, &format!("uid-{pod}")))
            .run(d),
    );
}

fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn query_has(r: &Logged, needle: &str) -> bool {
    r.query.split('&').any(|kv| kv == needle)
}

/// 3,000 pods (12 on this node) and 600 NADs (more than one page of 500):
/// every pod list and watch, also after the watches expired and the
/// caches listed again, selects this node's pods and asks for metadata
/// only; the NADs come in pages and the last page's NADs are usable.
#[test]
fn a_large_cluster_should_cost_this_nodes_pods_only_and_every_nad_page() {
    let engine = engine("k8s-large");
    let api = FakeApi::start();
    api.fill(BulkSpec {
        namespaces: 50,
        nads_per_namespace: 12,
        pods: 3000,
        pods_on_node: 12,
        node: NODE.into(),
        configs: BulkConfigs::Copied,
    });
    // The very last NAD of the list, and a pod of this node using it.
    api.put_nad(
        "ns-49",
        "net-11",
        Some(&rec_config("last", "last-page")),
        json!({}),
    );
    api.put_pod(
        "ns-49",
        "user",
        "uid-user",
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": "net-11"}),
    );
    let d = api.start_daemon(&engine.dir, engine.config("cluster", "10s"), "5s");

    let netns = Netns::new();
    ok(&d, &add(&d, "c1", &netns, "ns-49", "user"));
    assert_eq!(markers(&engine), ["last-page"]);
    del(&d, "c1", &netns, "ns-49", "user");

    // The watches expire: both caches list again.
    let (nads, pods) = (api.nad_traffic(), api.pod_traffic());
    api.expire_watches();
    wait("both caches listed again", || {
        api.nad_traffic().lists >= nads.lists + 2 && api.pod_traffic().lists > pods.lists
    });

    let log = api.log();
    let pod_requests: Vec<&Logged> = log
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/pods"))
        .collect();
    assert!(pod_requests.len() >= 4, "{pod_requests:?}");
    for r in &pod_requests {
        assert_eq!(r.path, "/api/v1/pods", "{r:?}");
        assert!(
            query_has(r, "fieldSelector=spec.nodeName%3Dnode-1"),
            "pods asked for beyond this node: {r:?}"
        );
        assert!(
            r.accept
                .as_deref()
                .unwrap_or("")
                .contains("as=PartialObjectMetadata"),
            "whole pods asked for: {r:?}"
        );
    }
    let sent = api.pod_traffic();
    assert_eq!(
        sent.list_items,
        13 * sent.lists,
        "a pod list held more than this node's 13 pods: {sent:?}"
    );
    let nad_lists: Vec<&Logged> = log
        .iter()
        .filter(|r| r.path.ends_with("/network-attachment-definitions") && !r.is_watch())
        .collect();
    assert!(
        nad_lists.iter().all(|r| query_has(r, "limit=500")),
        "NADs listed without pages: {nad_lists:?}"
    );
    assert!(
        nad_lists.iter().any(|r| r.query.contains("continue=")),
        "the second page was never asked for: {nad_lists:?}"
    );
}

/// A NAD's config changed, and then the NAD deleted, while the daemon's
/// NAD watch was away (the API server had forgotten its history: the
/// cache must list again): the next ADD attaches the new config, then
/// finds no NAD. Back on a live watch, a change reaches the next ADD too.
#[test]
fn a_nad_changed_or_deleted_while_the_watch_was_away_should_be_seen_after_the_relist() {
    let engine = engine("k8s-relist");
    let api = FakeApi::start();
    api.put_nad("ns1", "net", Some(&rec_config("net", "v1")), json!({}));
    api.put_nad("ns1", "other", Some(&rec_config("other", "o")), json!({}));
    api.put_pod(
        "ns1",
        "p",
        "uid-p",
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": "net"}),
    );
    let d = api.start_daemon(&engine.dir, engine.config("cluster", "10s"), "5s");
    let netns = Netns::new();
    ok(&d, &add(&d, "c1", &netns, "ns1", "p"));
    del(&d, "c1", &netns, "ns1", "p");
    assert_eq!(markers(&engine), ["v1"]);

    // Watches see nothing from now on: only a list can tell the daemon.
    api.hold_watches(true);
    let relist = |change: &dyn Fn()| {
        let before = api.nad_traffic().lists;
        change();
        api.expire_watches();
        wait("the NAD cache listed again", || {
            api.nad_traffic().lists > before
        });
    };
    relist(&|| api.put_nad("ns1", "net", Some(&rec_config("net", "v2")), json!({})));
    // The list is answered before the cache takes it: the next ADDs see
    // v1 until it has.
    let mut n = 0;
    wait("an ADD with the relisted config", || {
        n += 1;
        let id = format!("c2-{n}");
        ok(&d, &add(&d, &id, &netns, "ns1", "p"));
        del(&d, &id, &netns, "ns1", "p");
        markers(&engine).last().map(String::as_str) == Some("v2")
    });

    relist(&|| assert!(api.delete_nad("ns1", "net")));
    wait("an ADD that finds no NAD", || {
        n += 1;
        let id = format!("c3-{n}");
        let run = add(&d, &id, &netns, "ns1", "p");
        if run.code == Some(0) {
            del(&d, &id, &netns, "ns1", "p");
            return false;
        }
        let (_, msg, _) = failed(&d, &run);
        del(&d, &id, &netns, "ns1", "p");
        assert!(
            msg.contains("no such NetworkAttachmentDefinition") && msg.contains("(ns1)"),
            "{msg}"
        );
        true
    });
    assert_eq!(markers(&engine).last().map(String::as_str), Some("v2"));

    // A live watch again: a new NAD of that name reaches the next ADD.
    api.hold_watches(false);
    api.put_nad("ns1", "net", Some(&rec_config("net", "v3")), json!({}));
    wait("an ADD with the watched config", || {
        n += 1;
        let id = format!("c4-{n}");
        let run = add(&d, &id, &netns, "ns1", "p");
        let done =
            (run.code == Some(0)) && markers(&engine).last().map(String::as_str) == Some("v3");
        del(&d, &id, &netns, "ns1", "p");
        done
    });
}
