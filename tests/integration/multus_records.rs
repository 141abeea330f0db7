//! Containers that multus attached before the node switched to plexusd:
//! DEL, CHECK and GC from multus's caches in its `cniDir`. Each test attaches
//! a container as multus would, running Debian's plugins itself with the
//! environment and stdin libcni gives them, and writes multus's delegate
//! cache and libcni's result cache from what the plugins returned; then it
//! calls plexusd through plexus-shim and looks at the namespace,
//! host-local's store and the cache files. Needs root and iproute2.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::support::cni::{
    address, bare, bridge, call_env, conflist, failed, list_dir, ok, Call, Engine, SYSTEM_PLUGINS,
};
use crate::support::daemon::Daemon;
use crate::support::netns::{bridge_ports, Link, Netns, Subnet};
use crate::support::shim;
use crate::support::tmpfs::Tmpfs;

/// One network as multus runs and caches it.
struct Net {
    /// multus's name for it (`<namespace>/<nad>`, or the network's name).
    display: String,
    /// The exact configuration multus runs (the delegate cache's `Bytes`).
    bytes: Vec<u8>,
    conflist: bool,
    /// The selection element's `interface`, if any.
    ifname_request: Option<String>,
}

impl Net {
    /// The cluster network, a list, as multus loads it from a file.
    fn list(config: &Value) -> Self {
        Net {
            display: config["name"].as_str().unwrap().to_string(),
            bytes: serde_json::to_vec(config).unwrap(),
            conflist: true,
            ifname_request: None,
        }
    }

    /// A NetworkAttachmentDefinition's single-plugin configuration.
    fn single(namespace: &str, config: &Value) -> Self {
        Net {
            display: format!("{namespace}/{}", config["name"].as_str().unwrap()),
            bytes: serde_json::to_vec(config).unwrap(),
            conflist: false,
            ifname_request: None,
        }
    }

    fn config(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap()
    }

    fn network(&self) -> String {
        self.config()["name"].as_str().unwrap().to_string()
    }

    /// multus's interface name for the delegate at `index` (getIfname).
    fn ifname(&self, index: usize) -> String {
        match &self.ifname_request {
            Some(n) => n.clone(),
            None if index == 0 => "eth0".into(),
            None => format!("net{index}"),
        }
    }

    /// The plugin objects libcni runs, each with `name` and `cniVersion`
    /// set from the list.
    fn plugins(&self) -> Vec<Map<String, Value>> {
        let c = self.config();
        let raw: Vec<Value> = if self.conflist {
            c["plugins"].as_array().unwrap().clone()
        } else {
            vec![c.clone()]
        };
        raw.into_iter()
            .map(|p| {
                let mut m = p.as_object().unwrap().clone();
                m.insert("name".into(), c["name"].clone());
                m.insert("cniVersion".into(), c["cniVersion"].clone());
                m
            })
            .collect()
    }

    /// The entry multus's `saveDelegates` writes: Go field names, the
    /// standard CNI fields in `Conf`/`ConfList` (informational), `Bytes`.
    fn delegate_entry(&self) -> Value {
        let c = self.config();
        let standard = |p: &Value| {
            json!({"ipam": if p["ipam"].is_object() { json!({"type": p["ipam"]["type"]}) } else { json!({}) },
                   "type": p["type"]})
        };
        let (conf, list) = if self.conflist {
            let plugins: Vec<Value> = c["plugins"]
                .as_array()
                .unwrap()
                .iter()
                .map(standard)
                .collect();
            (
                json!({"ipam": {}}),
                json!({"cniVersion": c["cniVersion"], "name": c["name"], "plugins": plugins}),
            )
        } else {
            let mut conf = standard(&c);
            conf["cniVersion"] = c["cniVersion"].clone();
            conf["name"] = c["name"].clone();
            (conf, json!({}))
        };
        let mut e = json!({"Conf": conf, "ConfList": list, "Name": self.display});
        if let Some(i) = &self.ifname_request {
            e["ifnameRequest"] = json!(i);
        }
        e["IsFilterV4Gateway"] = json!(false);
        e["IsFilterV6Gateway"] = json!(false);
        e["Bytes"] = json!(b64(&self.bytes));
        e
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `CNI_ARGS` multus gives every delegate of a pod.
fn pod_args(id: &str) -> Vec<(String, String)> {
    [
        ("IgnoreUnknown", "true".to_string()),
        ("K8S_POD_NAMESPACE", "default".to_string()),
        ("K8S_POD_NAME", format!("pod-{id}")),
        ("K8S_POD_INFRA_CONTAINER_ID", id.to_string()),
        ("K8S_POD_UID", format!("uid-{id}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn joined(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// Writes `body` as multus and libcni do: directory 0700, file 0600.
fn write_private(path: &Path, body: &[u8]) {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path.parent().unwrap())
        .unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(body).unwrap();
}

/// A test's node: plexusd's engine directories plus multus's `cniDir`.
struct Node {
    e: Engine,
    cni_dir: PathBuf,
}

impl Node {
    fn new(name: &str) -> Self {
        let e = Engine::new(name);
        let cni_dir = e.dir.join("multus");
        Node { e, cni_dir }
    }

    /// plexusd with `cluster` as clusterNetwork and multus's cniDir.
    fn start(&self, cluster: &str) -> Daemon {
        let mut config = self.e.config(cluster, "20s");
        config["cniDir"] = json!(self.cni_dir);
        let mut d = Daemon::start(&self.e.dir, "d", config);
        d.ready();
        d
    }

    fn delegate_cache(&self, id: &str) -> PathBuf {
        self.cni_dir.join(id)
    }

    fn result_cache(&self, network: &str, id: &str, ifname: &str) -> PathBuf {
        self.cni_dir
            .join("results")
            .join(format!("{network}-{id}-{ifname}"))
    }

    /// The files of libcni's result cache that belong to `id`.
    fn result_caches_of(&self, id: &str) -> Vec<String> {
        list_dir(&self.cni_dir.join("results"))
            .into_iter()
            .filter(|f| f.contains(&format!("-{id}-")))
            .collect()
    }

    /// The plugin `type`: the test's fakes first, then Debian's.
    fn plugin(&self, name: &str) -> PathBuf {
        let fake = self.e.bin_dir.join(name);
        if fake.exists() {
            fake
        } else {
            Path::new(SYSTEM_PLUGINS).join(name)
        }
    }

    /// Attaches `nets` to container `id` in `ns` as multus's ADD does: the
    /// delegate cache first, then per delegate libcni's AddNetworkList
    /// (plugins in order, prevResult chained) and its result cache.
    /// Returns each delegate's final result.
    fn multus_add(&self, id: &str, ns: &Netns, nets: &[Net]) -> Vec<Value> {
        let entries: Vec<Value> = nets.iter().map(Net::delegate_entry).collect();
        write_private(
            &self.delegate_cache(id),
            &serde_json::to_vec(&entries).unwrap(),
        );
        let args = pod_args(id);
        let mut results = Vec::new();
        for (i, net) in nets.iter().enumerate() {
            let ifname = net.ifname(i);
            let env = call_env("ADD", id, &ns.path, &ifname, &joined(&args));
            let mut prev: Option<Value> = None;
            for mut p in net.plugins() {
                if let Some(r) = &prev {
                    p.insert("prevResult".into(), r.clone());
                }
                let ty = p["type"].as_str().unwrap().to_string();
                let stdin = serde_json::to_vec(&p).unwrap();
                prev = Some(run_plugin(&self.plugin(&ty), &env, &stdin));
            }
            let result = prev.unwrap();
            let cache = json!({
                "kind": "cniCacheV1",
                "containerId": id,
                "config": b64(&net.bytes),
                "ifName": ifname,
                "networkName": net.network(),
                "netns": ns.path,
                "cniArgs": args.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
                "result": result,
            });
            write_private(
                &self.result_cache(&net.network(), id, &ifname),
                &serde_json::to_vec(&cache).unwrap(),
            );
            results.push(result);
        }
        results
    }

    /// What `<stateDir>/attachments/damaged/<id>/` holds.
    fn damaged(&self, id: &str) -> Vec<PathBuf> {
        let dir = self.e.state_dir.join("attachments/damaged").join(id);
        list_dir(&dir).into_iter().map(|f| dir.join(f)).collect()
    }
}

/// Runs one plugin as libcni does; its parsed stdout, or the test fails.
fn run_plugin(path: &Path, env: &[(String, String)], stdin: &[u8]) -> Value {
    let mut child = shim::command(path, env.iter().cloned())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} failed: {}\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The cluster network: bridge + host-local on its own bridge and subnet,
/// written to confDir as well (plexusd's clusterNetwork).
fn cluster(e: &Engine, name: &str, br: &Link, subnet: &Subnet) -> Value {
    let c = conflist(name, "1.0.0", vec![bridge(&br.name, e.host_local(subnet))]);
    e.write_network(&format!("10-{name}.conflist"), &c);
    c
}

/// A NAD's single bridge + host-local configuration.
fn extra(e: &Engine, name: &str, br: &Link, subnet: &Subnet) -> Value {
    json!({"cniVersion": "1.0.0", "name": name, "type": "bridge", "bridge": br.name,
           "ipam": e.host_local(subnet)})
}

/// A runtime's call through the shim, with a pod's CNI_ARGS.
fn call(command: &str, id: &str, ns: &Netns) -> Call {
    Call::new(command, id, ns, "eth0").args(&joined(&pod_args(id)))
}

#[test]
fn del_should_run_every_network_multus_cached_and_remove_both_caches() {
    let n = Node::new("mc-del");
    let (br1, br2) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    let main = cluster(&n.e, "mc-main", &br1, &s1);
    let nets = [
        Net::list(&main),
        Net::single("default", &extra(&n.e, "mc-extra", &br2, &s2)),
    ];
    let ns = Netns::new();
    let id = "mc-del-1";
    let results = n.multus_add(id, &ns, &nets);
    let (a1, a2) = (address(&results[0]), address(&results[1]));
    assert!(s1.holds(&a1) && s2.holds(&a2), "{a1} {a2}");
    assert!(
        ns.has_link("eth0") && ns.has_link("net1"),
        "{:?}",
        ns.ifaces()
    );
    assert_eq!(n.e.reservations("mc-main"), vec![bare(&a1)]);
    assert_eq!(n.e.reservations("mc-extra"), vec![bare(&a2)]);
    assert_eq!(n.result_caches_of(id).len(), 2);

    let d = n.start("mc-main");
    ok(&d, &call("DEL", id, &ns).run(&d));
    assert!(
        !ns.has_link("eth0") && !ns.has_link("net1"),
        "{:?}",
        ns.ifaces()
    );
    assert!(n.e.reservations("mc-main").is_empty());
    assert!(n.e.reservations("mc-extra").is_empty());
    assert!(bridge_ports(&br1.name).is_empty() && bridge_ports(&br2.name).is_empty());
    assert!(!n.delegate_cache(id).exists(), "delegate cache left");
    assert_eq!(n.result_caches_of(id), Vec::<String>::new());
    // Nothing of plexusd's own was made for it.
    assert!(n.e.records().is_empty(), "{:?}", n.e.records());
    // A repeated DEL finds nothing and succeeds.
    ok(&d, &call("DEL", id, &ns).run(&d));
}

#[test]
fn a_failed_del_should_keep_the_caches_for_the_next_del() {
    let n = Node::new("mc-retry");
    // Fails DEL while `$DIR/fail` exists; ADD answers an empty result.
    n.e.fake(
        "flaky",
        r#"case "$CNI_COMMAND" in
ADD) printf '{"cniVersion":"1.0.0"}' ;;
DEL) if [ -e "$DIR/fail" ]; then printf '{"code":11,"msg":"flaky DEL failed"}'; exit 1; fi ;;
esac
exit 0"#,
    );
    let br = Link::bridge();
    let subnet = Subnet::new();
    let main = cluster(&n.e, "mr-main", &br, &subnet);
    let nets = [
        Net::list(&main),
        Net::single(
            "default",
            &json!({"cniVersion": "1.0.0", "name": "mr-flaky", "type": "flaky"}),
        ),
    ];
    let ns = Netns::new();
    let id = "mc-retry-1";
    n.multus_add(id, &ns, &nets);
    let d = n.start("mr-main");

    fs::write(n.e.dir.join("fail"), b"").unwrap();
    let (code, msg, _) = failed(&d, &call("DEL", id, &ns).run(&d));
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("flaky DEL failed"), "{msg}");
    // The primary's DEL ran past the failure: its interface, address and
    // result cache are gone; the delegate cache and the failed network's
    // result cache stay for the retry.
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    assert!(n.e.reservations("mr-main").is_empty());
    assert!(n.delegate_cache(id).is_file(), "delegate cache removed");
    assert_eq!(n.result_caches_of(id), vec![format!("mr-flaky-{id}-net1")]);

    fs::remove_file(n.e.dir.join("fail")).unwrap();
    ok(&d, &call("DEL", id, &ns).run(&d));
    assert!(!n.delegate_cache(id).exists(), "delegate cache left");
    assert_eq!(n.result_caches_of(id), Vec::<String>::new());
}

#[test]
fn a_damaged_delegate_cache_should_be_moved_aside_and_del_should_fall_back() {
    let n = Node::new("mc-damaged");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let main = cluster(&n.e, "md-main", &br, &subnet);
    let (ns_a, ns_b, ns_c) = (Netns::new(), Netns::new(), Netns::new());
    let results = n.multus_add("md-a", &ns_a, &[Net::list(&main)]);
    let addr_a = address(&results[0]);
    let results = n.multus_add("md-c", &ns_c, &[Net::list(&main)]);
    let addr_c = address(&results[0]);
    // a's delegate cache cut in half; b's a symbolic link to c's.
    let whole = fs::read(n.delegate_cache("md-a")).unwrap();
    let half = whole[..whole.len() / 2].to_vec();
    fs::write(n.delegate_cache("md-a"), &half).unwrap();
    symlink(n.delegate_cache("md-c"), n.delegate_cache("md-b")).unwrap();
    let c_cache = fs::read(n.delegate_cache("md-c")).unwrap();
    let a_result = fs::read(n.result_cache("md-main", "md-a", "eth0")).unwrap();
    let d = n.start("md-main");

    // a: set aside as it was, and the configured network DELed instead.
    ok(&d, &call("DEL", "md-a", &ns_a).run(&d));
    assert!(!n.delegate_cache("md-a").exists());
    let aside = n.damaged("md-a");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        aside[0].to_string_lossy().ends_with(".multus-md-a"),
        "{aside:?}"
    );
    assert_eq!(fs::read(&aside[0]).unwrap(), half);
    assert!(!ns_a.has_link("eth0"), "{:?}", ns_a.ifaces());
    assert_eq!(n.e.reservations("md-main"), vec![bare(&addr_c)]);
    assert_ne!(addr_a, addr_c);
    // The fallback succeeded: a's result cache went with it.
    assert_eq!(n.result_caches_of("md-a"), Vec::<String>::new());

    // b: the link itself is moved, never followed; c is untouched.
    ok(&d, &call("DEL", "md-b", &ns_b).run(&d));
    let aside = n.damaged("md-b");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(fs::read_link(&aside[0]).unwrap(), n.delegate_cache("md-c"));
    assert_eq!(fs::read(n.delegate_cache("md-c")).unwrap(), c_cache);
    assert!(ns_c.has_link("eth0"), "{:?}", ns_c.ifaces());
    assert_eq!(n.e.reservations("md-main"), vec![bare(&addr_c)]);

    // c's result cache replaced by a's (it names md-a): moved aside, and
    // c's DEL goes on from its delegate cache without a prevResult.
    let c_result = n.result_cache("md-main", "md-c", "eth0");
    fs::write(&c_result, &a_result).unwrap();
    ok(&d, &call("DEL", "md-c", &ns_c).run(&d));
    assert!(!ns_c.has_link("eth0"), "{:?}", ns_c.ifaces());
    assert!(n.e.reservations("md-main").is_empty());
    assert!(!n.delegate_cache("md-c").exists());
    assert!(!c_result.exists());
    let aside = n.damaged("md-c");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        aside[0]
            .to_string_lossy()
            .ends_with(".multus-results-md-main-md-c-eth0"),
        "{aside:?}"
    );
    assert_eq!(fs::read(&aside[0]).unwrap(), a_result);
}

#[test]
fn check_should_pass_for_a_multus_container_and_fail_once_an_interface_is_gone() {
    let n = Node::new("mc-check");
    let (br1, br2) = (Link::bridge(), Link::bridge());
    let (s1, s2) = (Subnet::new(), Subnet::new());
    let main = cluster(&n.e, "mk-main", &br1, &s1);
    let nets = [
        Net::list(&main),
        Net::single("default", &extra(&n.e, "mk-extra", &br2, &s2)),
    ];
    let ns = Netns::new();
    let id = "mc-check-1";
    n.multus_add(id, &ns, &nets);
    let d = n.start("mk-main");

    ok(&d, &call("CHECK", id, &ns).run(&d));
    ns.del_link("net1");
    let (_, msg, _) = failed(&d, &call("CHECK", id, &ns).run(&d));
    assert!(
        msg.contains("mk-extra"),
        "msg should name the network: {msg}"
    );
    // CHECK changed nothing: DEL still has both caches to work from.
    assert!(n.delegate_cache(id).is_file());
    assert_eq!(n.result_caches_of(id).len(), 2);
    ok(&d, &call("DEL", id, &ns).run(&d));
    assert!(n.e.reservations("mk-main").is_empty() && n.e.reservations("mk-extra").is_empty());
}

#[test]
fn gc_should_keep_multus_containers_in_the_valid_list_and_del_the_others() {
    let n = Node::new("mc-gc");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let main = cluster(&n.e, "mg-main", &br, &subnet);
    let (ns_keep, ns_stale) = (Netns::new(), Netns::new());
    let keep = address(&n.multus_add("mg-keep", &ns_keep, &[Net::list(&main)])[0]);
    n.multus_add("mg-stale", &ns_stale, &[Net::list(&main)]);
    let d = n.start("mg-main");

    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus-shim",
        "daemonSocketDir": d.sock.parent().unwrap(),
        "cni.dev/valid-attachments": [{"containerID": "mg-keep", "ifname": "eth0"}],
    }))
    .unwrap();
    let run = shim::finish(shim::spawn(
        [("CNI_COMMAND", "GC"), ("CNI_PATH", SYSTEM_PLUGINS)],
        &stdin,
    ));
    ok(&d, &run);

    assert!(ns_keep.has_link("eth0"), "{:?}", ns_keep.ifaces());
    assert_eq!(n.e.reservations("mg-main"), vec![bare(&keep)]);
    assert!(n.delegate_cache("mg-keep").is_file());
    assert_eq!(n.result_caches_of("mg-keep").len(), 1);

    assert!(!ns_stale.has_link("eth0"), "{:?}", ns_stale.ifaces());
    assert!(!n.delegate_cache("mg-stale").exists());
    assert_eq!(n.result_caches_of("mg-stale"), Vec::<String>::new());

    ok(&d, &call("DEL", "mg-keep", &ns_keep).run(&d));
    assert!(n.e.reservations("mg-main").is_empty());
}

/// Under systemd's ReadWritePaths= (and whenever cniDir and stateDir are
/// on different file systems) a rename between them fails with EXDEV: the
/// damaged cache is moved aside within cniDir instead, never deleted.
#[test]
fn a_damaged_cache_on_another_file_system_should_be_moved_aside_where_it_is() {
    let n = Node::new("mc-exdev");
    let _mounted = Tmpfs::mount(&n.cni_dir, None);
    let br = Link::bridge();
    let subnet = Subnet::new();
    let main = cluster(&n.e, "mx-main", &br, &subnet);
    let ns = Netns::new();
    let id = "mc-exdev-1";
    n.multus_add(id, &ns, &[Net::list(&main)]);
    fs::write(n.delegate_cache(id), b"[{\"Name\":").unwrap();
    let d = n.start("mx-main");

    ok(&d, &call("DEL", id, &ns).run(&d));
    assert!(!n.delegate_cache(id).exists());
    let here = n.cni_dir.join(".plexus-damaged").join(id);
    let aside = list_dir(&here);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(aside[0].ends_with(&format!(".multus-{id}")), "{aside:?}");
    assert_eq!(fs::read(here.join(&aside[0])).unwrap(), b"[{\"Name\":");
    // The fallback ran, and later DELs fall back too.
    assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    assert!(n.e.reservations("mx-main").is_empty());
    assert!(n.e.state_dir.join("attachments/damaged").join(id).is_dir());
    ok(&d, &call("DEL", id, &ns).run(&d));
}
