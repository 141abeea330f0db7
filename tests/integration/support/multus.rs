//! multus's side of a node, for the tests of containers multus attached
//! before the node switched to plexusd: a container is attached as multus
//! would, running the plugins (Debian's, or a test's fakes) with the
//! environment and stdin libcni gives them, and multus's delegate cache
//! and libcni's result cache are written from what the plugins returned.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::cni::{bridge, call_env, conflist, list_dir, Call, Engine, SYSTEM_PLUGINS};
use super::daemon::Daemon;
use super::netns::{Link, Netns, Subnet};
use super::shim;

/// One network as multus runs and caches it.
pub struct Net {
    /// multus's name for it (`<namespace>/<nad>`, or the network's name).
    pub display: String,
    /// The exact configuration multus runs (the delegate cache's `Bytes`).
    pub bytes: Vec<u8>,
    pub conflist: bool,
    /// The selection element's `interface`, if any.
    pub ifname_request: Option<String>,
    /// The device a device plugin gave it (the element's `deviceID`).
    pub device_id: Option<String>,
}

impl Net {
    /// The cluster network, a list, as multus loads it from a file.
    pub fn list(config: &Value) -> Self {
        Net {
            display: config["name"].as_str().unwrap().to_string(),
            bytes: serde_json::to_vec(config).unwrap(),
            conflist: true,
            ifname_request: None,
            device_id: None,
        }
    }

    /// A NetworkAttachmentDefinition's single-plugin configuration.
    pub fn single(namespace: &str, config: &Value) -> Self {
        Net {
            display: format!("{namespace}/{}", config["name"].as_str().unwrap()),
            bytes: serde_json::to_vec(config).unwrap(),
            conflist: false,
            ifname_request: None,
            device_id: None,
        }
    }

    /// With device `id`, as a NAD with a `resourceName` gets it.
    pub fn with_device(mut self, id: &str) -> Self {
        self.device_id = Some(id.to_string());
        self
    }

    pub fn config(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap()
    }

    pub fn network(&self) -> String {
        self.config()["name"].as_str().unwrap().to_string()
    }

    /// multus's interface name for the delegate at `index` (getIfname).
    pub fn ifname(&self, index: usize) -> String {
        match &self.ifname_request {
            Some(n) => n.clone(),
            None if index == 0 => "eth0".into(),
            None => format!("net{index}"),
        }
    }

    /// The plugin objects libcni runs, each with `name` and `cniVersion`
    /// set from the list.
    pub fn plugins(&self) -> Vec<Map<String, Value>> {
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
    pub fn delegate_entry(&self) -> Value {
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
        if let Some(id) = &self.device_id {
            e["deviceID"] = json!(id);
        }
        e["IsFilterV4Gateway"] = json!(false);
        e["IsFilterV6Gateway"] = json!(false);
        e["Bytes"] = json!(b64(&self.bytes));
        e
    }
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `CNI_ARGS` multus gives every delegate of a pod.
pub fn pod_args(id: &str) -> Vec<(String, String)> {
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

pub fn joined(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// Writes `body` as multus and libcni do: directory 0700, file 0600.
pub fn write_private(path: &Path, body: &[u8]) {
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
pub struct Node {
    pub e: Engine,
    pub cni_dir: PathBuf,
    /// plexusd's (and multus's) `deviceInfoDir`.
    pub devinfo: PathBuf,
}

impl Node {
    pub fn new(name: &str) -> Self {
        let e = Engine::new(name);
        let cni_dir = e.dir.join("multus");
        let devinfo = e.dir.join("devinfo");
        Node {
            e,
            cni_dir,
            devinfo,
        }
    }

    /// plexusd with `cluster` as clusterNetwork and multus's cniDir.
    pub fn start(&self, cluster: &str) -> Daemon {
        let mut config = self.e.config(cluster, "20s");
        config["cniDir"] = json!(self.cni_dir);
        config["deviceInfoDir"] = json!(self.devinfo);
        let mut d = Daemon::start(&self.e.dir, "d", config);
        d.ready();
        d
    }

    pub fn delegate_cache(&self, id: &str) -> PathBuf {
        self.cni_dir.join(id)
    }

    pub fn result_cache(&self, network: &str, id: &str, ifname: &str) -> PathBuf {
        self.cni_dir
            .join("results")
            .join(format!("{network}-{id}-{ifname}"))
    }

    /// The files of libcni's result cache that belong to `id`.
    pub fn result_caches_of(&self, id: &str) -> Vec<String> {
        list_dir(&self.cni_dir.join("results"))
            .into_iter()
            .filter(|f| f.contains(&format!("-{id}-")))
            .collect()
    }

    /// The device-info file multus names for network `net` of container
    /// `id` on `ifname` when the network has a device ID (and is not the
    /// primary): `<devinfo>/cni/<display>-<id>_<ifname>`, `/` as `-`.
    pub fn device_info(&self, net: &Net, id: &str, ifname: &str) -> PathBuf {
        self.devinfo
            .join("cni")
            .join(format!("{}-{id}_{ifname}", net.display).replace('/', "-"))
    }

    /// The plugin `type`: the test's fakes first, then Debian's.
    pub fn plugin(&self, name: &str) -> PathBuf {
        let fake = self.e.bin_dir.join(name);
        if fake.exists() {
            fake
        } else {
            Path::new(SYSTEM_PLUGINS).join(name)
        }
    }

    /// Attaches `nets` to container `id` in `ns` as multus's ADD does: the
    /// delegate cache first, then per delegate libcni's AddNetworkList
    /// (plugins in order, prevResult chained) and its result cache. A
    /// network with a device ID (but the primary) gets its device-info
    /// file first, as multus copies the device plugin's, and libcni caches
    /// `deviceID` and `CNIDeviceInfoFile` with its capability arguments.
    /// Returns each delegate's final result.
    pub fn multus_add(&self, id: &str, ns: &Netns, nets: &[Net]) -> Vec<Value> {
        let entries: Vec<Value> = nets.iter().map(Net::delegate_entry).collect();
        write_private(
            &self.delegate_cache(id),
            &serde_json::to_vec(&entries).unwrap(),
        );
        let args = pod_args(id);
        let mut results = Vec::new();
        for (i, net) in nets.iter().enumerate() {
            let ifname = net.ifname(i);
            let mut caps = Map::new();
            if let Some(device) = net.device_id.as_ref().filter(|_| i > 0) {
                let file = self.device_info(net, id, &ifname);
                fs::create_dir_all(file.parent().unwrap()).unwrap();
                let info =
                    json!({"type": "pci", "version": "1.1.0", "pci": {"pci-address": device}});
                fs::write(&file, serde_json::to_vec(&info).unwrap()).unwrap();
                caps.insert("deviceID".into(), json!(device));
                caps.insert("CNIDeviceInfoFile".into(), json!(file));
            }
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
            let mut cache = json!({
                "kind": "cniCacheV1",
                "containerId": id,
                "config": b64(&net.bytes),
                "ifName": ifname,
                "networkName": net.network(),
                "netns": ns.path,
                "cniArgs": args.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
                "result": result,
            });
            if !caps.is_empty() {
                cache["capabilityArgs"] = Value::Object(caps);
            }
            write_private(
                &self.result_cache(&net.network(), id, &ifname),
                &serde_json::to_vec(&cache).unwrap(),
            );
            results.push(result);
        }
        results
    }

    /// What `<stateDir>/attachments/damaged/<id>/` holds.
    pub fn damaged(&self, id: &str) -> Vec<PathBuf> {
        let dir = self.e.state_dir.join("attachments/damaged").join(id);
        list_dir(&dir).into_iter().map(|f| dir.join(f)).collect()
    }
}

/// Runs one plugin as libcni does; its parsed stdout, or the test fails.
pub fn run_plugin(path: &Path, env: &[(String, String)], stdin: &[u8]) -> Value {
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
pub fn cluster(e: &Engine, name: &str, br: &Link, subnet: &Subnet) -> Value {
    let c = conflist(name, "1.0.0", vec![bridge(&br.name, e.host_local(subnet))]);
    e.write_network(&format!("10-{name}.conflist"), &c);
    c
}

/// A NAD's single bridge + host-local configuration.
pub fn extra(e: &Engine, name: &str, br: &Link, subnet: &Subnet) -> Value {
    json!({"cniVersion": "1.0.0", "name": name, "type": "bridge", "bridge": br.name,
           "ipam": e.host_local(subnet)})
}

/// A runtime's call through the shim, with a pod's CNI_ARGS.
pub fn call(command: &str, id: &str, ns: &Netns) -> Call {
    Call::new(command, id, ns, "eth0").args(&joined(&pod_args(id)))
}
