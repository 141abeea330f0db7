//! The Kubernetes source against the test API server: what it watches,
//! when its caches count as synced, how it finds a pod the cache does not
//! hold yet, and the one write per ADD.

use std::time::Duration;

use plexus::k8s::{Config, Error, PodInfo, Source, NETWORK_STATUS_ANNOTATION};
use serde_json::{json, Value};

use crate::support::daemon::TestDir;
use crate::support::kube::{FakeApi, Logged, NODE};

const T: Duration = Duration::from_secs(15);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn config(api: &FakeApi, dir: &TestDir) -> Config {
    let path = dir.join("kubeconfig");
    api.write_kubeconfig(&path);
    Config {
        kubeconfig: Some(path),
        node_name: NODE.to_string(),
        sync_timeout: T,
        request_timeout: Duration::from_secs(2),
        devices: Default::default(),
        device_info_dir: dir.join("devinfo"),
        pod_events: true,
    }
}

/// Single-object reads of pod `name` (not lists or watches).
fn pod_gets(log: &[Logged], name: &str) -> usize {
    log.iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/pods/{name}")))
        .count()
}

#[test]
fn caches_should_hold_this_nodes_pod_metadata_and_every_nad() {
    let dir = TestDir::new("k8s-sync");
    let api = FakeApi::start();
    api.put_pod(
        "ns1",
        "here",
        "uid-here",
        NODE,
        json!({"k8s.v1.cni.cncf.io/networks": "net", "unread": "1"}),
    );
    api.put_pod("ns1", "there", "uid-there", "node-2", json!({}));
    api.put_nad("ns2", "net", Some(r#"{"type":"bridge"}"#), json!({}));
    let rt = runtime();
    rt.block_on(async {
        let source = Source::start(config(&api, &dir)).await.unwrap();
        assert!(source.wait_synced(T).await, "caches never synced");
        let mark = api.mark();
        let pod = source
            .pod("ns1", "here", Some("uid-here"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pod.uid, "uid-here");
        // Only what selection reads is kept.
        assert_eq!(pod.annotations["k8s.v1.cni.cncf.io/networks"], "net");
        assert!(!pod.annotations.contains_key("unread"), "{pod:?}");
        assert_eq!(
            api.calls_since(mark).len(),
            0,
            "a cached pod cost an API call"
        );
        let nad = source.nad("ns2", "net").unwrap();
        assert_eq!(nad.config.as_deref(), Some(r#"{"type":"bridge"}"#));
        assert_eq!(source.cached(), (1, 1));
        assert!(source.nad("ns1", "net").is_none());
    });
    let log = api.log();
    let pod_lists: Vec<&Logged> = log.iter().filter(|r| r.path == "/api/v1/pods").collect();
    assert!(!pod_lists.is_empty());
    for r in &pod_lists {
        assert!(
            r.query.contains("fieldSelector=spec.nodeName%3Dnode-1"),
            "pods watched beyond this node: {}",
            r.query
        );
        assert!(
            r.accept
                .as_deref()
                .unwrap_or("")
                .contains("as=PartialObjectMetadata"),
            "pods fetched whole: {:?}",
            r.accept
        );
    }
    assert!(log
        .iter()
        .any(|r| r.path == "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"));
}

#[test]
fn a_pod_missing_from_the_cache_should_cost_one_get() {
    let dir = TestDir::new("k8s-miss");
    let api = FakeApi::start();
    let rt = runtime();
    rt.block_on(async {
        let source = Source::start(config(&api, &dir)).await.unwrap();
        assert!(source.wait_synced(T).await);
        // Not on this node's watch: only a GET can find it, as for a pod
        // created moments ago that the watch has not delivered.
        api.put_pod(
            "ns",
            "fresh",
            "u1",
            "node-9",
            json!({"v1.multus-cni.io/default-network": "ns/def", "x": "y"}),
        );
        let mark = api.mark();
        let pod = source
            .pod("ns", "fresh", Some("u1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            pod.annotations["v1.multus-cni.io/default-network"],
            "ns/def"
        );
        assert!(!pod.annotations.contains_key("x"), "{pod:?}");
        let calls = api.calls_since(mark);
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(pod_gets(&calls, "fresh"), 1);
        // Gone: no pod, not an error.
        assert_eq!(source.pod("ns", "nobody", None).await.unwrap(), None);
    });
}

#[test]
fn a_recreated_pod_should_never_pass_for_the_old_one() {
    let dir = TestDir::new("k8s-uid");
    let api = FakeApi::start();
    api.put_pod("ns", "p", "old", NODE, json!({}));
    let rt = runtime();
    rt.block_on(async {
        let source = Source::start(config(&api, &dir)).await.unwrap();
        assert!(source.wait_synced(T).await);
        // Recreated while the watch lags: the cache still has "old".
        api.hold_watches(true);
        api.delete_pod("ns", "p");
        api.put_pod("ns", "p", "new", NODE, json!({}));
        assert_eq!(source.cached_pod("ns", "p").unwrap().uid, "old");
        // The runtime's uid wins over a stale cache: one GET confirms it.
        let mark = api.mark();
        let pod = source.pod("ns", "p", Some("new")).await.unwrap().unwrap();
        assert_eq!(pod.uid, "new");
        assert_eq!(pod_gets(&api.calls_since(mark), "p"), 1);
        api.hold_watches(false);
        let deadline = std::time::Instant::now() + T;
        while source.cached_pod("ns", "p").is_none_or(|p| p.uid != "new") {
            assert!(std::time::Instant::now() < deadline, "the watch never caught up");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A call for the old pod is refused, with both uids named.
        let err = source.pod("ns", "p", Some("old")).await.unwrap_err();
        assert!(
            matches!(&err, Error::UidMismatch { expected, found, .. } if expected == "old" && found == "new"),
            "{err:?}"
        );
        // A static pod's API object is a mirror with its own uid.
        api.put_pod(
            "ns",
            "static",
            "mirror-uid",
            NODE,
            json!({"kubernetes.io/config.source": "file"}),
        );
        let pod = source.pod("ns", "static", Some("runtime-uid")).await.unwrap();
        assert!(pod.is_some_and(|p| p.is_static()));
    });
}

#[test]
fn network_status_should_be_one_merge_patch_guarded_by_the_uid() {
    let dir = TestDir::new("k8s-patch");
    let api = FakeApi::start();
    api.put_pod("ns", "p", "u1", NODE, json!({"keep": "me"}));
    let rt = runtime();
    rt.block_on(async {
        let source = Source::start(config(&api, &dir)).await.unwrap();
        assert!(source.wait_synced(T).await);
        let pod = source.pod("ns", "p", Some("u1")).await.unwrap().unwrap();
        let mark = api.mark();
        let status = r#"[{"name":"ns/net","interface":"net1","ips":["10.0.0.2"]}]"#;
        source.set_network_status(&pod, status).await.unwrap();
        let calls = api.calls_since(mark);
        assert_eq!(calls.len(), 1, "{calls:?}");
        let call = &calls[0];
        assert_eq!(call.method, "PATCH");
        assert_eq!(call.path, "/api/v1/namespaces/ns/pods/p/status");
        assert_eq!(
            call.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        let body: Value = serde_json::from_slice(&call.body).unwrap();
        assert_eq!(
            body,
            json!({"metadata": {"uid": "u1", "annotations": {NETWORK_STATUS_ANNOTATION: status}}})
        );
        let stored = api.pod("ns", "p").unwrap();
        assert_eq!(
            stored["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION],
            status
        );
        assert_eq!(stored["metadata"]["annotations"]["keep"], "me");

        // The pod was recreated since: the write is refused, nothing lands.
        api.delete_pod("ns", "p");
        api.put_pod("ns", "p", "u2", NODE, json!({}));
        let err = source.set_network_status(&pod, status).await.unwrap_err();
        assert!(!err.is_transient(), "{err:?}");
        let stored = api.pod("ns", "p").unwrap();
        assert!(stored["metadata"]["annotations"]
            .get(NETWORK_STATUS_ANNOTATION)
            .is_none());
    });
}

#[test]
fn outages_should_be_transient_errors_and_caches_should_recover() {
    let dir = TestDir::new("k8s-outage");
    let api = FakeApi::start();
    api.put_pod("ns", "p", "u1", NODE, json!({}));
    api.set_up(false);
    let rt = runtime();
    rt.block_on(async {
        let source = Source::start(config(&api, &dir)).await.unwrap();
        assert!(
            !source.wait_synced(Duration::from_millis(300)).await,
            "synced without an API server"
        );
        let pod = PodInfo {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u1".into(),
            annotations: Default::default(),
        };
        let err = source.set_network_status(&pod, "[]").await.unwrap_err();
        assert!(err.is_transient(), "{err:?}");
        api.set_up(true);
        assert!(source.wait_synced(T).await, "caches did not recover");

        // A stalled server: the write gives up at requestTimeout.
        api.stall(true);
        let started = std::time::Instant::now();
        let err = source.set_network_status(&pod, "[]").await.unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        api.stall(false);

        // Watches that expire (410) are listed again: later pods arrive.
        api.expire_watches();
        api.put_pod("ns", "later", "u9", NODE, json!({}));
        let deadline = std::time::Instant::now() + T;
        while source.cached_pod("ns", "later").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the cache never re-listed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// Readiness is looked at (by `/readyz`, STATUS=) while start-up waits
/// on it: neither may lose the other's wake-up.
#[test]
fn looking_at_readiness_while_waiting_should_not_lose_the_wake_up() {
    let dir = TestDir::new("k8s-look");
    let api = FakeApi::start();
    api.stall(true);
    let rt = runtime();
    let source = std::sync::Arc::new(rt.block_on(Source::start(config(&api, &dir))).unwrap());
    let waiting = rt.spawn({
        let source = source.clone();
        async move { source.wait_synced(T).await }
    });
    let looking = rt.spawn({
        let source = source.clone();
        async move {
            while !source.synced() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    api.stall(false);
    assert!(rt.block_on(waiting).unwrap(), "the waiter never woke");
    rt.block_on(looking).unwrap();
}
