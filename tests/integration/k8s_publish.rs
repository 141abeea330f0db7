//! What Kubernetes learns of a pod's ADD, with the handler in-process (as
//! plexusd's drain holds it), Debian's plugins in a real namespace and the
//! test API server: a network-status write the API server does not take at
//! ADD time (503) leaves the ADD a success and is retried in the
//! background; the drain's `finish` waits for it, bounded, and names the
//! pod whose write it hands over unfinished.

use std::sync::Arc;
use std::time::{Duration, Instant};

use plexus::api;
use plexus::cni;
use plexus::handler::CniHandler;
use plexus::k8s;
use plexus::selection::{self, overlay::Overlay};
use plexus::server::{Handler, Reply};
use serde_json::json;

use crate::support::cni::{call_env, Engine, SYSTEM_PLUGINS};
use crate::support::kube::{pod_args, FakeApi, NODE};
use crate::support::netns::{Link, Netns, Subnet};

const T: Duration = Duration::from_secs(15);
/// The path of pod `ns1/p`'s status writes.
const STATUS_PATH: &str = "/namespaces/ns1/pods/p/status";

/// Pod `ns1/p` on a node whose cluster network is a bridge of its own,
/// served by a handler in this process.
struct Node {
    engine: Engine,
    api: FakeApi,
    subnet: Subnet,
    handler: CniHandler,
    rt: tokio::runtime::Runtime,
    _link: Link,
}

fn node(tag: &str) -> Node {
    let (engine, link, subnet) = Engine::with_cluster_bridge(tag);
    let api = FakeApi::start();
    api.put_pod("ns1", "p", "uid-p", NODE, json!({}));
    let kubeconfig = engine.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let k8s_config = k8s::Config {
        kubeconfig: Some(kubeconfig),
        node_name: NODE.to_string(),
        sync_timeout: T,
        request_timeout: Duration::from_secs(1),
        devices: Default::default(),
        device_info_dir: engine.dir.join("devinfo"),
        // Only the status write is in the background.
        pod_events: false,
    };
    let cni_config = cni::Config {
        bin_dirs: vec![SYSTEM_PLUGINS.into()],
        conf_dir: engine.conf_dir.clone(),
        state_dir: engine.state_dir.clone(),
        device_info_dir: engine.dir.join("devinfo"),
        cni_dir: engine.dir.join("multus"),
        ..cni::Config::default()
    };
    let handler = rt.block_on(async {
        let source = k8s::Source::start(k8s_config).await.unwrap();
        assert!(source.wait_synced(T).await, "caches never synced");
        let engine = Arc::new(cni::Engine::new(cni_config, None).unwrap());
        let selection = Overlay::new(selection::Config::new("cluster", Vec::new()), |_| true);
        CniHandler::new(engine, selection, Some(source), T, T)
    });
    Node {
        engine,
        api,
        subnet,
        handler,
        rt,
        _link: link,
    }
}

impl Node {
    /// `command` for the pod's sandbox `id` in `netns`, as the runtime
    /// sends it.
    fn call(&self, command: &str, id: &str, netns: &Netns) -> Result<Reply, String> {
        let env = call_env(
            command,
            id,
            &netns.path,
            "eth0",
            &pod_args("ns1", "p", "uid-p"),
        );
        let request = api::Request {
            env: env.into_iter().collect(),
            config: br#"{"cniVersion":"1.0.0","name":"plexus","type":"plexus-shim"}"#.to_vec(),
            interface_attributes: None,
        };
        self.rt
            .block_on(self.handler.cni(request))
            .map_err(|f| f.error.msg)
    }

    /// The PATCHes of the pod's status since `mark`.
    fn status_writes(&self, mark: usize) -> usize {
        let calls = self.api.calls_since(mark);
        calls
            .iter()
            .filter(|c| c.method == "PATCH" && c.path.ends_with(STATUS_PATH))
            .count()
    }

    /// DEL of the sandbox: nothing of it is left.
    fn del(&self, id: &str, netns: &Netns) {
        self.call("DEL", id, netns).unwrap();
        assert!(netns.iface("eth0").is_none());
        assert!(self.engine.records().is_empty());
        assert!(self.engine.reservations("cluster").is_empty());
    }
}

#[test]
fn a_status_write_refused_at_add_time_should_be_retried_and_waited_for_by_the_drain() {
    let n = node("k8s-pub-wait");
    let netns = Netns::new();
    // The write in the call's path fails (with every retry the client
    // makes of a 503 on its own, so a count of refusals would be used up
    // inside the call): the API server takes writes again only once the
    // ADD has answered, so the write that lands is the background retry,
    // which the drain waits for.
    n.api.fail_next(STATUS_PATH, 503, usize::MAX);
    let mark = n.api.mark();
    let added = n.call("ADD", "k8spubw1", &netns).unwrap();
    assert!(matches!(added, Reply::Result(_)));
    let eth0 = netns.iface("eth0").expect("eth0");
    let address = eth0.addrs.iter().find(|a| a.contains('.')).unwrap();
    assert!(n.subnet.holds(address), "{eth0:?}");
    assert!(n.api.network_status("ns1", "p").is_none());
    let refused = n.status_writes(mark);
    assert!(refused >= 1);
    n.api.clear_failures();

    let started = Instant::now();
    let pending = n.rt.block_on(n.handler.finish_publishing(T));
    assert!(pending.is_empty(), "{pending:?}");
    assert!(
        started.elapsed() < T,
        "the drain waited {:?}",
        started.elapsed()
    );
    let status = n.api.network_status("ns1", "p").expect("network-status");
    let bare = address.split('/').next().unwrap();
    assert!(status.contains(&format!("\"{bare}\"")), "{status}");
    assert!(
        n.status_writes(mark) > refused,
        "{:#?}",
        n.api.calls_since(mark)
    );
    n.del("k8spubw1", &netns);
}

#[test]
fn a_status_write_still_refused_should_be_handed_over_naming_the_pod() {
    let n = node("k8s-pub-left");
    let netns = Netns::new();
    n.api.fail_next(STATUS_PATH, 503, 1_000);
    let mark = n.api.mark();
    n.call("ADD", "k8spubl1", &netns).unwrap();
    assert!(netns.iface("eth0").is_some());

    let pending =
        n.rt.block_on(n.handler.finish_publishing(Duration::from_millis(300)));
    assert_eq!(pending.work, ["network-status of ns1/p"]);
    assert!(n.api.network_status("ns1", "p").is_none());
    // The write in the call's path, and the retry the drain hurried.
    assert!(n.status_writes(mark) >= 2, "{:#?}", n.api.calls_since(mark));
    n.api.clear_failures();
    n.del("k8spubl1", &netns);
}
