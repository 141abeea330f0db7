//! Doubles of third-party CNI plugins that cannot be installed here: one
//! binary that does to its environment what a given plugin does (the log
//! files it appends to, the locks it takes, the agent sockets it talks to,
//! the state it keeps on disk, the sysctls it sets), chosen by its own file
//! name (the tests copy it under the plugin's type name) or by the config
//! key `profile`.
//!
//! Every profile also does what any primary plugin does: a veth pair (host
//! side `hostVeth` from the config, else derived from the container id;
//! container side `CNI_IFNAME` in `CNI_NETNS`), the address from its IPAM
//! plugin or from `address` in the config, and a CNI 1.0 result. DEL
//! removes the veth and the state, and succeeds when they are gone already.
//!
//! What the double did is appended as one JSON line per call to the file
//! the config key `report` names. Where the real plugin goes on quietly
//! after a denied write (a log file it cannot open, a lock it cannot take),
//! the double goes on too but says so: the line's `degraded` list, and a
//! line in `<report>.degraded`. Where the real plugin fails, the double
//! fails with CNI error 999 naming the path and the error.
//!
//! Test plugin only: never packaged.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// Profiles whose veth and address the double makes itself.
const PRIMARY: &[&str] = &[
    "calico",
    "cilium-cni",
    "flannel",
    "aws-cni",
    "antrea",
    "ovn-k8s-cni-overlay",
    "sriov",
    "ovs",
];

/// One CNI call and what the double did in it.
struct Call {
    profile: String,
    command: String,
    id: String,
    netns: String,
    ifname: String,
    stdin: Vec<u8>,
    conf: Value,
    effects: Vec<Value>,
    degraded: Vec<String>,
    /// Descriptors held until the process exits (flock).
    held: Vec<File>,
}

type Res<T> = Result<T, String>;

fn main() {
    let mut stdin = Vec::new();
    let _ = io::stdin().read_to_end(&mut stdin);
    let command = env("CNI_COMMAND");
    if command == "VERSION" {
        println!(
            "{}",
            json!({"cniVersion": "1.0.0",
                   "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]})
        );
        return;
    }
    let conf: Value = serde_json::from_slice(&stdin).unwrap_or(Value::Null);
    let argv0 = std::env::args().next().unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let profile = conf["profile"].as_str().map(str::to_string).unwrap_or(name);
    let mut call = Call {
        profile,
        command,
        id: env("CNI_CONTAINERID"),
        netns: env("CNI_NETNS"),
        ifname: conf["ifname"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| env("CNI_IFNAME")),
        stdin,
        conf,
        effects: Vec::new(),
        degraded: Vec::new(),
        held: Vec::new(),
    };
    let outcome = match call.command.as_str() {
        "ADD" => add(&mut call).map(Some),
        "DEL" => del(&mut call).map(|()| None),
        // CHECK, GC, STATUS: nothing to verify or collect here.
        _ => Ok(None),
    };
    let reported = report(&call, outcome.as_ref().err());
    let version = call.conf["cniVersion"].as_str().unwrap_or("1.0.0");
    match (outcome, reported) {
        (Ok(result), Ok(())) => {
            if let Some(mut r) = result {
                r["cniVersion"] = json!(version);
                println!("{r}");
            }
            drop(call.held);
        }
        (Err(msg), _) | (Ok(_), Err(msg)) => {
            println!(
                "{}",
                json!({"cniVersion": version, "code": 999,
                       "msg": format!("{}: {msg}", call.profile)})
            );
            std::process::exit(1);
        }
    }
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_default()
}

fn add(c: &mut Call) -> Res<Value> {
    match c.profile.as_str() {
        // projectcalico/calico: cni-plugin/internal/pkg/utils/utils.go
        // (ConfigureLogging: MkdirAll of log_file_path's directory, then a
        // file logger; failures only logged, stderr logging goes on) and
        // cni-plugin/pkg/plugin/plugin.go (cmdAdd: the nodename file,
        // default /var/lib/calico/nodename, must exist unless
        // nodename_file_optional; the IPAM plugin through CNI_PATH).
        "calico" => {
            calico_log(c);
            if !c.conf["nodename_file_optional"].as_bool().unwrap_or(false) {
                let path = str_or(&c.conf, "nodename_file", "/var/lib/calico/nodename");
                let name = fs::read_to_string(&path).map_err(|e| {
                    format!(
                        "{path}: {e}: check that the calico/node container is running and has \
                         mounted /var/lib/calico/"
                    )
                })?;
                c.effects
                    .push(json!({"read": path, "content": name.trim()}));
            }
            let ipam = delegate_ipam(c)?;
            attach(c, ipam)
        }
        // projectcalico/calico: cni-plugin/pkg/ipamplugin/ipam_plugin.go
        // (acquireIPAMLockBestEffort: MkdirAll 0777 of the lock's directory,
        // errors only logged; a blocking flock, and on failure "may contend
        // for datastore updates" and carries on) and ipam_lock_linux.go
        // (ipamLockPath /var/run/calico/ipam.lock; ipam_lock_file overrides).
        "calico-ipam" => {
            calico_ipam_lock(c);
            Ok(json!({"ips": [{"address": ipam_address(&c.conf)?}]}))
        }
        // cilium/cilium: plugins/cilium-cni/cmd/cmd.go (log-file, a rotating
        // file logger; the agent's API over /var/run/cilium/cilium.sock,
        // without which ADD fails; chaining-mode: works on prevResult's
        // interfaces) and pkg/datapath/connector (DisableRpFilter on the
        // veth it makes). The double turns rp_filter off on the pod side,
        // where a test can tell the write from the namespace's default.
        "cilium-cni" => {
            let log = str_or(&c.conf, "log-file", "/var/run/cilium/cilium-cni.log");
            log_or_degrade(c, &log);
            let sock = str_or(&c.conf, "socketPath", "/var/run/cilium/cilium.sock");
            agent_http(
                c,
                &sock,
                "POST",
                "/v1/ipam",
                "unable to connect to Cilium agent",
            )?;
            let result = if c.conf["chaining-mode"].is_string() {
                let prev = c.conf["prevResult"].clone();
                let pod_if = prev["interfaces"]
                    .as_array()
                    .and_then(|l| l.iter().find(|i| i["sandbox"].is_string()))
                    .and_then(|i| i["name"].as_str())
                    .ok_or("chaining: no container interface in prevResult")?
                    .to_string();
                pod_sysctl(c, &pod_if)?;
                prev
            } else {
                let r = attach(c, Value::Null)?;
                let ifname = c.ifname.clone();
                pod_sysctl(c, &ifname)?;
                r
            };
            Ok(result)
        }
        // flannel-io/cni-plugin: flannel.go (subnetFile, default
        // /run/flannel/subnet.env; dataDir, default /var/lib/cni/flannel)
        // and flannel_linux.go (saveScratchNetConf: MkdirAll 0700, the
        // delegate's config in <dataDir>/<container id>, 0600; an error
        // fails ADD). The double makes the veth itself instead of running
        // the bridge plugin.
        "flannel" => {
            let path = str_or(&c.conf, "subnetFile", "/run/flannel/subnet.env");
            let env = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
            let subnet = env
                .lines()
                .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
                .ok_or(format!("{path} is missing FLANNEL_SUBNET"))?
                .to_string();
            c.effects.push(json!({"read": path, "subnet": subnet}));
            let dir = str_or(&c.conf, "dataDir", "/var/lib/cni/flannel");
            let delegate = json!({"type": "bridge", "name": c.conf["name"],
                                  "ipam": {"type": "host-local", "subnet": subnet}});
            let id = c.id.clone();
            save_state(c, &dir, &id, &delegate)?;
            attach(c, Value::Null)
        }
        // aws/amazon-vpc-cni-k8s: cmd/routed-eni-cni-plugin/cni.go
        // (LoadNetConf: the logger on pluginLogFile, whose write errors go
        // nowhere; add: ipamd at 127.0.0.1:50051 over gRPC, AddNetwork,
        // without which ADD fails). The double sends one HTTP/1.1 request
        // in place of the gRPC call.
        "aws-cni" => {
            let log = str_or(
                &c.conf,
                "pluginLogFile",
                "/var/log/aws-routed-eni/plugin.log",
            );
            log_or_degrade(c, &log);
            let addr = str_or(&c.conf, "ipamdAddress", "127.0.0.1:50051");
            agent_tcp(c, &addr, "/rpc.CNIBackend/AddNetwork")?;
            attach(c, Value::Null)
        }
        // aws/amazon-vpc-cni-k8s: cmd/egress-cni-plugin/main.go and
        // egressContext.go (chained after aws-cni; logs to pluginLogFile,
        // /var/log/aws-routed-eni/egress-v6-plugin.log in the shipped
        // conflist). Its v4/v6 egress interface and host-local IPAM are
        // left out; prevResult passes through.
        "egress-cni" => {
            let log = str_or(
                &c.conf,
                "pluginLogFile",
                "/var/log/aws-routed-eni/egress-v6-plugin.log",
            );
            log_or_degrade(c, &log);
            Ok(c.conf["prevResult"].clone())
        }
        // antrea-io/antrea: cmd/antrea-cni and pkg/cni (AntreaCNISocketAddr
        // /var/run/antrea/cni.sock: every command is a gRPC call to the
        // agent, which makes the interface). The double sends one HTTP/1.1
        // request in place of the gRPC call and makes the veth itself.
        "antrea" => {
            let sock = str_or(&c.conf, "socketPath", "/var/run/antrea/cni.sock");
            agent_http(
                c,
                &sock,
                "POST",
                "/antrea_io.antrea.pkg.apis.cni.v1beta1.Cni/CmdAdd",
                "failed to connect to the Antrea agent",
            )?;
            attach(c, Value::Null)
        }
        // ovn-org/ovn-kubernetes: go-controller/pkg/cni/cnishim.go and
        // types.go (the shim POSTs the call to http://dummy/ over
        // /var/run/ovn-kubernetes/cni/ovn-cni-server.sock; ovnkube-node
        // makes the interface). The double makes the veth itself.
        "ovn-k8s-cni-overlay" => {
            let sock = str_or(
                &c.conf,
                "socketPath",
                "/var/run/ovn-kubernetes/cni/ovn-cni-server.sock",
            );
            agent_http(c, &sock, "POST", "/", "failed to reach the OVN CNI server")?;
            attach(c, Value::Null)
        }
        // k8snetworkplumbingwg/ovs-cni: pkg/plugin/plugin.go (CmdAdd: OVSDB
        // over socket_file, default /var/run/openvswitch/db.sock; the veth;
        // the IPAM plugin) and pkg/utils/cache.go (SaveCache: MkdirAll 0700
        // of DefaultCacheDir /tmp/ovscache, the config for DEL in a file of
        // the container id and interface name, 0600; an error fails ADD).
        "ovs" => {
            let sock = str_or(&c.conf, "socket_file", "/var/run/openvswitch/db.sock");
            let sock = sock.strip_prefix("unix:").unwrap_or(&sock).to_string();
            ovsdb(c, &sock, "insert")?;
            let ipam = delegate_ipam(c)?;
            let r = attach(c, ipam)?;
            let key = format!("{}_{}", c.id, c.ifname);
            let conf = c.conf.clone();
            save_state(c, "/tmp/ovscache", &key, &conf)?;
            Ok(r)
        }
        // k8snetworkplumbingwg/sriov-cni: pkg/config/config.go
        // (DefaultCNIDir /var/lib/cni/sriov; SaveNetConf: MkdirAll 0700,
        // the config in <dir>/<container id>-<ifname>, 0600; an error fails
        // ADD). The VF and its sysfs are left out: a veth stands in.
        "sriov" => {
            let dir = str_or(&c.conf, "cniDir", "/var/lib/cni/sriov");
            let key = format!("{}-{}", c.id, c.ifname);
            let conf = c.conf.clone();
            save_state(c, &dir, &key, &conf)?;
            attach(c, Value::Null)
        }
        // k8snetworkplumbingwg/whereabouts: pkg/logging/logging.go
        // (SetLogFile: a log file that cannot be opened is reported on
        // stderr and skipped; log_file is commonly /tmp/whereabouts.log)
        // and pkg/config/config.go (LoadIPAMConfig: the flat file
        // configuration_path, default
        // /etc/cni/net.d/whereabouts.d/whereabouts.conf, read only). The
        // allocation through the Kubernetes API is left out: the address
        // comes from the config.
        "whereabouts" => {
            let ipam = c.conf["ipam"].clone();
            if let Some(log) = ipam["log_file"].as_str() {
                log_or_degrade(c, log);
            }
            let flat = str_or(
                &ipam,
                "configuration_path",
                "/etc/cni/net.d/whereabouts.d/whereabouts.conf",
            );
            if let Ok(text) = fs::read_to_string(&flat) {
                c.effects.push(json!({"read": flat, "content": text}));
            }
            Ok(json!({"ips": [{"address": ipam_address(&c.conf)?}]}))
        }
        other => Err(format!("no such profile {other:?}")),
    }
}

fn del(c: &mut Call) -> Res<()> {
    match c.profile.as_str() {
        "calico" => {
            calico_log(c);
            delegate_ipam(c)?;
        }
        "calico-ipam" => calico_ipam_lock(c),
        "cilium-cni" => {
            let log = str_or(&c.conf, "log-file", "/var/run/cilium/cilium-cni.log");
            log_or_degrade(c, &log);
            let sock = str_or(&c.conf, "socketPath", "/var/run/cilium/cilium.sock");
            // Upstream DEL tolerates an unreachable agent.
            let _ = agent_http(c, &sock, "DELETE", "/v1/endpoint", "agent");
        }
        "flannel" => {
            let dir = str_or(&c.conf, "dataDir", "/var/lib/cni/flannel");
            let id = c.id.clone();
            consume_state(c, &dir, &id)?;
        }
        "aws-cni" => {
            let log = str_or(
                &c.conf,
                "pluginLogFile",
                "/var/log/aws-routed-eni/plugin.log",
            );
            log_or_degrade(c, &log);
            let addr = str_or(&c.conf, "ipamdAddress", "127.0.0.1:50051");
            // Upstream tears down from prevResult when ipamd is away.
            let _ = agent_tcp(c, &addr, "/rpc.CNIBackend/DelNetwork");
        }
        "egress-cni" => {
            let log = str_or(
                &c.conf,
                "pluginLogFile",
                "/var/log/aws-routed-eni/egress-v6-plugin.log",
            );
            log_or_degrade(c, &log);
        }
        "antrea" => {
            let sock = str_or(&c.conf, "socketPath", "/var/run/antrea/cni.sock");
            agent_http(
                c,
                &sock,
                "POST",
                "/antrea_io.antrea.pkg.apis.cni.v1beta1.Cni/CmdDel",
                "failed to connect to the Antrea agent",
            )?;
        }
        "ovn-k8s-cni-overlay" => {
            let sock = str_or(
                &c.conf,
                "socketPath",
                "/var/run/ovn-kubernetes/cni/ovn-cni-server.sock",
            );
            agent_http(c, &sock, "POST", "/", "failed to reach the OVN CNI server")?;
        }
        "ovs" => {
            let sock = str_or(&c.conf, "socket_file", "/var/run/openvswitch/db.sock");
            let sock = sock.strip_prefix("unix:").unwrap_or(&sock).to_string();
            let key = format!("{}_{}", c.id, c.ifname);
            consume_state(c, "/tmp/ovscache", &key)?;
            ovsdb(c, &sock, "delete")?;
            delegate_ipam(c)?;
        }
        "sriov" => {
            let dir = str_or(&c.conf, "cniDir", "/var/lib/cni/sriov");
            let key = format!("{}-{}", c.id, c.ifname);
            consume_state(c, &dir, &key)?;
        }
        "whereabouts" => {
            if let Some(log) = c.conf["ipam"]["log_file"].as_str().map(str::to_string) {
                log_or_degrade(c, &log);
            }
        }
        other => return Err(format!("no such profile {other:?}")),
    }
    if PRIMARY.contains(&c.profile.as_str()) && !c.conf["chaining-mode"].is_string() {
        detach(c)?;
    }
    Ok(())
}

fn str_or(v: &Value, key: &str, default: &str) -> String {
    v[key].as_str().unwrap_or(default).to_string()
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The line every log of a call gets: the tests look for the container id.
fn log_line(c: &Call) -> String {
    format!(
        "{:.3} [INFO] {} {} ContainerID={} IfName={}\n",
        now(),
        c.profile,
        c.command,
        c.id,
        c.ifname
    )
}

/// Creates `dir` and its missing parents with `mode`.
fn mkdir_all(dir: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(mode).create(dir)
}

/// Appends the call's line to `path` (its directory made 0755 first, as
/// the loggers do); the error says which step failed.
fn append_log(c: &Call, path: &str) -> Res<()> {
    let p = Path::new(path);
    if let Some(dir) = p.parent() {
        mkdir_all(dir, 0o755).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    }
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(p)
        .map_err(|e| format!("open {path}: {e}"))?;
    f.write_all(log_line(c).as_bytes())
        .map_err(|e| format!("write {path}: {e}"))
}

/// A log the real plugin gives up on quietly: the double notes it.
fn log_or_degrade(c: &mut Call, path: &str) {
    match append_log(c, path) {
        Ok(()) => c.effects.push(json!({"log": path})),
        Err(e) => c.degraded.push(format!("log {e}")),
    }
}

fn calico_log(c: &mut Call) {
    let path = str_or(&c.conf, "log_file_path", "/var/log/calico/cni/cni.log");
    log_or_degrade(c, &path);
}

fn calico_ipam_lock(c: &mut Call) {
    let path = str_or(
        &c.conf["ipam"],
        "ipam_lock_file",
        "/var/run/calico/ipam.lock",
    );
    let p = Path::new(&path);
    if let Some(dir) = p.parent() {
        // Upstream logs this and carries on.
        let _ = mkdir_all(dir, 0o777);
    }
    let file = match OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(p)
    {
        Ok(f) => f,
        Err(e) => {
            c.degraded.push(format!("lock open {path}: {e}"));
            return;
        }
    };
    // SAFETY: flock(2) on a descriptor `file` owns; no memory involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let e = io::Error::last_os_error();
        c.degraded.push(format!("lock flock {path}: {e}"));
        return;
    }
    let (dev, ino) = match file.metadata() {
        Ok(m) => (m.dev(), m.ino()),
        Err(_) => (0, 0),
    };
    c.effects
        .push(json!({"lock": path, "flock": "LOCK_EX", "dev": dev, "ino": ino}));
    c.held.push(file);
}

/// The IPAM plugin of the config (`ipam.type`), run from `CNI_PATH` with
/// this call's environment and stdin, as libcni's delegation does; `null`
/// without one.
fn delegate_ipam(c: &mut Call) -> Res<Value> {
    let Some(kind) = c.conf["ipam"]["type"].as_str().map(str::to_string) else {
        return Ok(Value::Null);
    };
    let bin = env("CNI_PATH")
        .split(':')
        .map(|d| Path::new(d).join(&kind))
        .find(|p| p.is_file())
        .ok_or(format!("failed to find plugin {kind:?} in CNI_PATH"))?;
    let mut child = Command::new(&bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("exec {}: {e}", bin.display()))?;
    if let Some(mut i) = child.stdin.take() {
        let _ = i.write_all(&c.stdin);
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("IPAM plugin {kind}: {}", text.trim()));
    }
    c.effects.push(json!({"ipam": kind}));
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text).map_err(|e| format!("IPAM plugin {kind} printed {text:?}: {e}"))
}

fn ipam_address(conf: &Value) -> Res<String> {
    conf["ipam"]["address"]
        .as_str()
        .or(conf["address"].as_str())
        .map(str::to_string)
        .ok_or("no address in the config".into())
}

/// Saves `state` in `<dir>/<key>` (0700 directory, 0600 file).
fn save_state(c: &mut Call, dir: &str, key: &str, state: &Value) -> Res<()> {
    mkdir_all(Path::new(dir), 0o700)
        .map_err(|e| format!("failed to create the data directory {dir:?}: {e}"))?;
    let path = Path::new(dir).join(key);
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(state.to_string().as_bytes()))
        .map_err(|e| format!("failed to write container data in {}: {e}", path.display()))?;
    c.effects.push(json!({"state": path}));
    Ok(())
}

/// Reads and removes `<dir>/<key>`; a missing one is fine (DEL again).
fn consume_state(c: &mut Call, dir: &str, key: &str) -> Res<()> {
    let path = Path::new(dir).join(key);
    match fs::remove_file(&path) {
        Ok(()) => c.effects.push(json!({"removed": path})),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("remove {}: {e}", path.display())),
    }
    Ok(())
}

fn request_body(c: &Call) -> String {
    json!({"command": c.command, "containerId": c.id, "netns": c.netns,
           "ifname": c.ifname, "plugin": c.profile})
    .to_string()
}

/// One HTTP/1.1 request over a stream; the answer must be 200.
fn exchange<S: Read + Write>(mut s: S, method: &str, uri: &str, body: &str) -> io::Result<String> {
    let req = format!(
        "{method} {uri} HTTP/1.1\r\nHost: dummy\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    if !answer.starts_with("HTTP/1.1 200") {
        return Err(io::Error::other(format!("answer {answer:?}")));
    }
    Ok(answer)
}

fn agent_http(c: &mut Call, sock: &str, method: &str, uri: &str, what: &str) -> Res<()> {
    let body = request_body(c);
    let s = UnixStream::connect(sock).map_err(|e| format!("{what}: dial unix {sock}: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    exchange(s, method, uri, &body).map_err(|e| format!("{what}: {sock}: {e}"))?;
    c.effects
        .push(json!({"socket": sock, "method": method, "uri": uri}));
    Ok(())
}

fn agent_tcp(c: &mut Call, addr: &str, uri: &str) -> Res<()> {
    let body = request_body(c);
    let s = TcpStream::connect(addr)
        .map_err(|e| format!("failed to connect to backend server {addr}: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    exchange(s, "POST", uri, &body).map_err(|e| format!("{addr}{uri}: {e}"))?;
    c.effects.push(json!({"tcp": addr, "uri": uri}));
    Ok(())
}

/// One OVSDB JSON-RPC `transact` (RFC 7047) over the unix socket.
fn ovsdb(c: &mut Call, sock: &str, op: &str) -> Res<()> {
    let mut s = UnixStream::connect(sock).map_err(|e| format!("dial unix {sock}: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = json!({"method": "transact", "id": 0, "params": ["Open_vSwitch",
        {"op": op, "table": "Port", "row": {"name": host_veth(c),
         "external_ids": ["map", [["contNetns", c.netns], ["contIface", c.ifname],
                                  ["containerId", c.id]]]}}]});
    s.write_all(format!("{req}\n").as_bytes())
        .map_err(|e| format!("write {sock}: {e}"))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| format!("read {sock}: {e}"))?;
    let v: Value = serde_json::from_str(answer.trim())
        .map_err(|e| format!("OVSDB answered {answer:?}: {e}"))?;
    if !v["error"].is_null() {
        return Err(format!("OVSDB transact: {}", v["error"]));
    }
    c.effects.push(json!({"socket": sock, "ovsdb": op}));
    Ok(())
}

fn host_veth(c: &Call) -> String {
    if let Some(n) = c.conf["hostVeth"].as_str() {
        return n.to_string();
    }
    let tail: String =
        c.id.chars()
            .filter(|ch| ch.is_ascii_alphanumeric())
            .take(12)
            .collect();
    format!("dbl{tail}")
}

/// `ip` in the host namespace, or in `netns` (through nsenter).
fn ip(netns: Option<&str>, args: &[&str]) -> Res<String> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={ns}")).arg("ip");
            c
        }
        None => Command::new("ip"),
    };
    let out = cmd
        .args(args)
        .output()
        .map_err(|e| format!("exec ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn mac_of(netns: Option<&str>, ifname: &str) -> String {
    ip(netns, &["-j", "link", "show", "dev", ifname])
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v[0]["address"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The veth pair, up, the address on the container side; the result.
fn attach(c: &mut Call, ipam: Value) -> Res<Value> {
    let host = host_veth(c);
    let (netns, ifname) = (c.netns.clone(), c.ifname.clone());
    let address = match ipam["ips"][0]["address"].as_str() {
        Some(a) => a.to_string(),
        None => ipam_address(&c.conf)?,
    };
    ip(
        None,
        &[
            "link", "add", &host, "type", "veth", "peer", "name", &ifname, "netns", &netns,
        ],
    )?;
    ip(None, &["link", "set", &host, "up"])?;
    ip(Some(&netns), &["addr", "add", &address, "dev", &ifname])?;
    ip(Some(&netns), &["link", "set", &ifname, "up"])?;
    c.effects
        .push(json!({"veth": host, "peer": ifname, "netns": netns, "address": address}));
    Ok(json!({
        "interfaces": [
            {"name": host, "mac": mac_of(None, &host)},
            {"name": ifname, "mac": mac_of(Some(&netns), &ifname), "sandbox": netns},
        ],
        "ips": [{"address": address, "interface": 1}],
        "dns": {},
    }))
}

/// Removes the host side (its peer goes with it); gone already is fine.
fn detach(c: &mut Call) -> Res<()> {
    let host = host_veth(c);
    if ip(None, &["link", "show", "dev", &host]).is_err() {
        return Ok(());
    }
    ip(None, &["link", "del", &host])?;
    c.effects.push(json!({"removed veth": host}));
    Ok(())
}

/// `net.ipv4.conf.<ifname>.rp_filter = 0` in the pod's namespace: the
/// double enters it for good (the last thing it does in the host's).
fn pod_sysctl(c: &mut Call, ifname: &str) -> Res<()> {
    let ns = File::open(&c.netns).map_err(|e| format!("open {}: {e}", c.netns))?;
    // SAFETY: setns(2) on a descriptor `ns` owns; the process has one
    // thread, so the whole process moves to the pod's network namespace.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {}: {}", c.netns, io::Error::last_os_error()));
    }
    let key = format!("/proc/sys/net/ipv4/conf/{ifname}/rp_filter");
    fs::write(&key, "0").map_err(|e| format!("write {key}: {e}"))?;
    c.effects.push(json!({"sysctl": key, "value": "0"}));
    Ok(())
}

/// Appends the call's line to `report` (and the degradations to
/// `<report>.degraded`).
fn report(c: &Call, error: Option<&String>) -> Res<()> {
    let Some(path) = c.conf["report"].as_str().map(PathBuf::from) else {
        return Ok(());
    };
    let line = json!({"profile": c.profile, "command": c.command, "containerId": c.id,
                      "ifname": c.ifname, "effects": c.effects, "degraded": c.degraded,
                      "error": error});
    append(&path, &format!("{line}\n"))?;
    if !c.degraded.is_empty() {
        let mut marker = path.into_os_string();
        marker.push(".degraded");
        let text: String = c
            .degraded
            .iter()
            .map(|d| format!("{} {} {}: {d}\n", c.profile, c.command, c.id))
            .collect();
        append(Path::new(&marker), &text)?;
    }
    Ok(())
}

fn append(path: &Path, text: &str) -> Res<()> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("report {}: {e}", path.display()))
}
