//! The test Kubernetes API server speaks the wire format clients depend
//! on: lists with resourceVersion, pages (`limit`, `continue`), field
//! selectors, metadata-only answers, watch streams with bookmarks and 410
//! Expired, status patches, Status errors and outages; a made-up large
//! cluster is listed, watched and changed like stored objects. Checked
//! with curl, an independent HTTP client.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::kube::{BulkConfigs, BulkSpec, FakeApi};

const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// `curl` once: (status, body as JSON).
fn curl(args: &[&str]) -> (u16, Value) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("curl output");
    let status = code.trim().parse().unwrap_or(0);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A watch read line by line; curl is killed on drop.
struct Watch {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl Watch {
    fn open(url: &str, accept: Option<&str>) -> Self {
        let mut cmd = Command::new("curl");
        cmd.args(["-sN", "--max-time", "20"]);
        if let Some(a) = accept {
            cmd.args(["-H", &format!("Accept: {a}")]);
        }
        let mut child = cmd
            .arg(url)
            .stdout(Stdio::piped())
            .spawn()
            .expect("run curl");
        let lines = BufReader::new(child.stdout.take().expect("stdout"));
        Self { child, lines }
    }

    fn next(&mut self) -> Value {
        let mut line = String::new();
        let n = self.lines.read_line(&mut line).expect("read watch");
        assert!(n > 0, "the watch ended");
        serde_json::from_str(&line).expect("watch line is JSON")
    }

    /// Reads until the stream ends; returns how many lines came.
    fn rest(&mut self) -> usize {
        let mut n = 0;
        let mut line = String::new();
        while self.lines.read_line(&mut line).expect("read watch") > 0 {
            n += 1;
            line.clear();
        }
        n
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_watchers(api: &FakeApi, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while api.watchers() < n {
        assert!(std::time::Instant::now() < deadline, "no watch opened");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn lists_should_select_by_node_and_answer_metadata_only_when_asked() {
    let api = FakeApi::start();
    api.put_pod("ns1", "a", "uid-a", "node-1", json!({"k": "v"}));
    api.put_pod("ns1", "b", "uid-b", "node-2", json!({}));
    let url = format!(
        "{}/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
        api.url()
    );
    let (status, list) = curl(&[&url]);
    assert_eq!(status, 200);
    assert_eq!(list["kind"], "PodList");
    assert!(list["metadata"]["resourceVersion"].as_str().is_some());
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a"]);
    assert_eq!(list["items"][0]["spec"]["nodeName"], "node-1");

    let (_, meta) = curl(&["-H", &format!("Accept: {METADATA_LIST}"), &url]);
    assert_eq!(meta["kind"], "PartialObjectMetadataList");
    assert_eq!(meta["items"][0]["kind"], "PartialObjectMetadata");
    assert_eq!(meta["items"][0]["metadata"]["uid"], "uid-a");
    assert_eq!(meta["items"][0]["metadata"]["annotations"]["k"], "v");
    assert!(meta["items"][0].get("spec").is_none());

    let (status, missing) = curl(&[&format!("{}/api/v1/namespaces/ns1/pods/zz", api.url())]);
    assert_eq!(status, 404);
    assert_eq!(missing["kind"], "Status");
    assert_eq!(missing["reason"], "NotFound");
}

#[test]
fn watches_should_stream_changes_bookmarks_and_expire_with_410() {
    let api = FakeApi::start();
    api.put_nad("ns1", "net-a", Some(r#"{"type":"bridge"}"#), json!({}));
    let base = format!(
        "{}/apis/k8s.cni.cncf.io/v1/network-attachment-definitions",
        api.url()
    );
    let (_, list) = curl(&[&base]);
    assert_eq!(list["kind"], "NetworkAttachmentDefinitionList");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    let mut w = Watch::open(
        &format!("{base}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"),
        None,
    );
    wait_watchers(&api, 1);
    api.put_nad("ns2", "net-b", None, json!({}));
    let e = w.next();
    assert_eq!(e["type"], "ADDED");
    assert_eq!(e["object"]["kind"], "NetworkAttachmentDefinition");
    assert_eq!(e["object"]["metadata"]["name"], "net-b");
    assert!(e["object"].get("spec").is_none());
    api.delete_nad("ns1", "net-a");
    let e = w.next();
    assert_eq!(e["type"], "DELETED");
    api.bookmark();
    let e = w.next();
    assert_eq!(e["type"], "BOOKMARK");
    assert!(e["object"]["metadata"]["resourceVersion"]
        .as_str()
        .is_some());
    api.expire_watches();
    let e = w.next();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    assert_eq!(w.rest(), 0, "the watch goes on after 410");

    // Resuming from the old resourceVersion is refused at once.
    let mut w = Watch::open(&format!("{base}?watch=true&resourceVersion={rv}"), None);
    let e = w.next();
    assert_eq!(e["object"]["code"], 410);
}

#[test]
fn metadata_watches_should_carry_partial_object_metadata() {
    let api = FakeApi::start();
    let url = format!(
        "{}/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn1",
        api.url()
    );
    let mut w = Watch::open(
        &url,
        Some("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
    );
    wait_watchers(&api, 1);
    api.put_pod("ns", "other-node", "u0", "n2", json!({}));
    api.put_pod("ns", "p", "u1", "n1", json!({"a": "b"}));
    let e = w.next();
    assert_eq!(e["type"], "ADDED");
    assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(
        e["object"]["metadata"]["name"], "p",
        "another node's pod leaked"
    );
}

#[test]
fn status_patches_should_merge_and_be_logged() {
    let api = FakeApi::start();
    api.put_pod("ns", "p", "u1", "n1", json!({"keep": "1"}));
    let url = format!("{}/api/v1/namespaces/ns/pods/p/status", api.url());
    let mark = api.mark();
    let patch = json!({"metadata": {"annotations": {"k8s.v1.cni.cncf.io/network-status": "[]"}}});
    let (status, pod) = curl(&[
        "-X",
        "PATCH",
        "-H",
        "Content-Type: application/merge-patch+json",
        "--data-binary",
        &patch.to_string(),
        &url,
    ]);
    assert_eq!(status, 200);
    assert_eq!(pod["kind"], "Pod");
    let stored = api.pod("ns", "p").unwrap();
    assert_eq!(stored["metadata"]["annotations"]["keep"], "1");
    assert_eq!(
        stored["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"],
        "[]"
    );
    let calls = api.calls_since(mark);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, "PATCH");
    assert_eq!(
        serde_json::from_slice::<Value>(&calls[0].body).unwrap(),
        patch
    );

    let (status, _) = curl(&[
        "-X",
        "PATCH",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        "{}",
        &url,
    ]);
    assert_eq!(status, 415);
    let gone = format!("{}/api/v1/namespaces/ns/pods/zz/status", api.url());
    let (status, _) = curl(&[
        "-X",
        "PATCH",
        "-H",
        "Content-Type: application/merge-patch+json",
        "--data-binary",
        "{}",
        &gone,
    ]);
    assert_eq!(status, 404);
}

#[test]
fn injected_failures_and_outages_should_be_what_clients_see() {
    let api = FakeApi::start();
    api.put_pod("ns", "p", "u1", "n1", json!({}));
    let url = format!("{}/api/v1/namespaces/ns/pods/p", api.url());
    api.fail_next("/pods/p", 503, 1);
    let (status, body) = curl(&[&url]);
    assert_eq!(
        (status, body["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    assert_eq!(curl(&[&url]).0, 200);

    api.set_up(false);
    assert_eq!(curl(&[&url]).0, 0, "a down server must refuse connections");
    api.set_up(true);
    assert_eq!(curl(&[&url]).0, 200);

    // A stalled server answers once released.
    api.stall(true);
    let mark = api.mark();
    let waiting = std::thread::spawn({
        let url = url.clone();
        move || curl(&[&url]).0
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while api.mark() <= mark {
        assert!(
            std::time::Instant::now() < deadline,
            "request never arrived"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!waiting.is_finished(), "a stalled server answered");
    api.stall(false);
    assert_eq!(waiting.join().unwrap(), 200);
}

/// Every page of a list, following `continue`: (names as `ns/name`, the
/// pages' resourceVersions, how many pages).
fn list_pages(url: &str, limit: usize, accept: Option<&str>) -> (Vec<String>, Vec<String>, usize) {
    let (mut names, mut rvs, mut pages) = (Vec::new(), Vec::new(), 0);
    let mut token: Option<String> = None;
    loop {
        let sep = if url.contains('?') { '&' } else { '?' };
        let mut page_url = format!("{url}{sep}limit={limit}");
        if let Some(t) = &token {
            page_url.push_str(&format!("&continue={t}"));
        }
        let header = accept.map(|a| format!("Accept: {a}"));
        let mut args: Vec<&str> = Vec::new();
        if let Some(h) = &header {
            args.extend(["-H", h]);
        }
        args.push(&page_url);
        let (status, list) = curl(&args);
        assert_eq!(status, 200, "{list}");
        pages += 1;
        let items = list["items"].as_array().unwrap();
        assert!(items.len() <= limit, "a page longer than its limit");
        for o in items {
            names.push(format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            ));
        }
        rvs.push(
            list["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        match list["metadata"]["continue"].as_str() {
            Some(t) if !t.is_empty() => token = Some(t.to_string()),
            _ => break,
        }
        assert!(pages < 100, "the pages never end");
    }
    (names, rvs, pages)
}

#[test]
fn lists_should_page_with_limit_and_continue_over_made_up_and_stored_objects() {
    let api = FakeApi::start();
    api.fill(BulkSpec {
        namespaces: 3,
        nads_per_namespace: 4,
        pods: 30,
        pods_on_node: 5,
        node: "node-1".into(),
        configs: BulkConfigs::Distinct,
    });
    // Stored objects sort among the made-up ones; a made-up one that was
    // changed is listed once, a deleted one not at all.
    api.put_nad("ns-1", "net-1a", Some("{}"), json!({}));
    api.put_nad("ns-0", "net-2", Some(r#"{"changed":true}"#), json!({}));
    assert!(api.delete_nad("ns-2", "net-0"));
    let base = format!(
        "{}/apis/k8s.cni.cncf.io/v1/network-attachment-definitions",
        api.url()
    );
    let (names, rvs, pages) = list_pages(&base, 5, None);
    let mut want: Vec<String> = (0..3)
        .flat_map(|n| (0..4).map(move |j| format!("ns-{n}/net-{j}")))
        .filter(|k| k != "ns-2/net-0")
        .collect();
    want.push("ns-1/net-1a".into());
    want.sort();
    assert_eq!(names, want);
    assert_eq!(pages, 3);
    assert!(
        rvs.iter().all(|rv| *rv == rvs[0]),
        "pages of one list at other versions: {rvs:?}"
    );
    let (_, whole) = curl(&[&base]);
    assert!(whole["metadata"].get("continue").is_none());
    let changed = whole["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["metadata"]["name"] == "net-2" && o["metadata"]["namespace"] == "ns-0")
        .unwrap();
    assert_eq!(changed["spec"]["config"], r#"{"changed":true}"#);
    let made_up = &whole["items"][0];
    assert_eq!(made_up["kind"], "NetworkAttachmentDefinition");
    let config: Value = serde_json::from_str(made_up["spec"]["config"].as_str().unwrap()).unwrap();
    assert_eq!(config["name"], "net-0");
    assert!(made_up["metadata"]["managedFields"].is_array());

    // One namespace, and pods by node, metadata only.
    let (names, _, _) = list_pages(
        &format!(
            "{}/apis/k8s.cni.cncf.io/v1/namespaces/ns-1/network-attachment-definitions",
            api.url()
        ),
        2,
        None,
    );
    assert_eq!(
        names,
        [
            "ns-1/net-0",
            "ns-1/net-1",
            "ns-1/net-1a",
            "ns-1/net-2",
            "ns-1/net-3"
        ]
    );
    let pods = format!(
        "{}/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
        api.url()
    );
    let (names, _, _) = list_pages(&pods, 2, Some(METADATA_LIST));
    assert_eq!(names.len(), 5, "{names:?}");
    let (all, _, _) = list_pages(&format!("{}/api/v1/pods", api.url()), 7, None);
    assert_eq!(all.len(), 30);
    let (_, pod) = curl(&[&format!("{}/api/v1/namespaces/ns-0/pods/pod-0", api.url())]);
    assert_eq!(pod["spec"]["nodeName"], "node-1");
    let pods_sent = api.pod_traffic();
    assert_eq!(pods_sent.list_items, 5 + 30, "{pods_sent:?}");

    // A watch sees changes of made-up objects; the counters see the bytes.
    let before = api.nad_traffic();
    assert!(before.lists >= 4 && before.list_bytes > 0, "{before:?}");
    let rv = &rvs[0];
    let mut w = Watch::open(&format!("{base}?watch=true&resourceVersion={rv}"), None);
    wait_watchers(&api, 1);
    assert!(api.delete_nad("ns-0", "net-3"));
    let e = w.next();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("DELETED"), Some("net-3"))
    );
    let after = api.nad_traffic() - before;
    assert_eq!((after.watches, after.watch_events), (1, 1), "{after:?}");
    assert!(after.watch_bytes > 100, "{after:?}");

    // A continue token older than the history kept is 410 Expired.
    let (_, first) = curl(&[&format!("{base}?limit=2")]);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    api.expire_watches();
    let (status, gone) = curl(&[&format!("{base}?limit=2&continue={token}")]);
    assert_eq!((status, gone["reason"].as_str()), (410, Some("Expired")));
    assert!(api.first_answer().is_some());

    // Copied configs: a NAD name has the same config in every namespace.
    api.fill(BulkSpec {
        namespaces: 3,
        nads_per_namespace: 4,
        pods: 0,
        pods_on_node: 0,
        node: "node-1".into(),
        configs: BulkConfigs::Copied,
    });
    let config = |ns: &str| {
        let (_, o) = curl(&[&format!(
            "{}/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions/net-1",
            api.url()
        )]);
        o["spec"]["config"].as_str().unwrap().to_string()
    };
    assert_eq!(config("ns-0"), config("ns-2"));
}

#[test]
fn accepted_tokens_should_authenticate_and_revoked_ones_get_401() {
    let api = FakeApi::start();
    let node = crate::support::kube::Identity {
        user: "system:node:node-1".into(),
        groups: vec!["system:nodes".into(), "system:authenticated".into()],
    };
    api.accept_token("t-1", node);
    let url = format!("{}/api/v1/pods", api.url());
    let (status, _) = curl(&["-H", "Authorization: Bearer t-1", &url]);
    assert_eq!(status, 200);
    let (status, body) = curl(&["-H", "Authorization: Bearer t-2", &url]);
    assert_eq!(
        (status, body["reason"].as_str()),
        (401, Some("Unauthorized"))
    );
    api.revoke_token("t-1");
    let (status, _) = curl(&["-H", "Authorization: Bearer t-1", &url]);
    assert_eq!(status, 401);
}
