//! Third-party CNI plugins, as doubles (tests/bins/double.rs), run by
//! plexusd under the shipped unit in a private systemd manager: each must
//! leave on the host what it leaves when the container runtime runs it
//! (its log lines in the host's files, its lock on the host's lock file,
//! its state where its next call and the node's tools look, its request on
//! the agent's socket, its interface and address in the pod), and DEL must
//! take the interface and the state away.
//!
//! Each test starts one manager and serves several networks from one
//! confDir; each call names its network (`clusterNetwork` in the call's
//! configuration), so every plugin gets an ADD and a DEL of its own and a
//! failure of one does not hide the others: a test collects every
//! profile's failures and reports them together.
//!
//! Host paths the plugins use (/var/log/calico, /run/cilium, /tmp/ovscache,
//! ...) are made where missing and removed afterwards only if the test made
//! them, under the host-paths lock.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::netns::{ip, unique_name, Link, Netns, Subnet};
use crate::support::shim::Run;
use crate::support::systemd::SOCKET_UNIT;
use crate::systemd_units::Plexus;

const DOUBLE: &str = env!("CARGO_BIN_EXE_plexus-test-double");
static FILES: AtomicU32 = AtomicU32::new(0);

/// Paths on the host this test makes, each with the directories above it
/// that were missing: on drop the path goes (with what is below it), then
/// those directories, each only if empty (another test may have put
/// something there meanwhile).
#[derive(Default)]
struct HostPaths {
    made: Vec<(PathBuf, Vec<PathBuf>)>,
}

impl HostPaths {
    /// Notes `path` (a file or directory a plugin or the test will make),
    /// if it is missing, as the test's to remove.
    fn claim(&mut self, path: &Path) {
        if path.symlink_metadata().is_ok() {
            return;
        }
        let missing = path
            .ancestors()
            .skip(1)
            .take_while(|a| a.symlink_metadata().is_err())
            .map(Path::to_path_buf)
            .collect();
        self.made.push((path.to_path_buf(), missing));
    }

    /// Writes `path`, which must not exist: a host that has its own (a
    /// real calico node, say) is left alone.
    fn provide(&mut self, path: &Path, contents: &str) {
        assert!(
            !path.exists(),
            "{} exists on this host: not touching it",
            path.display()
        );
        self.claim(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }
}

impl Drop for HostPaths {
    fn drop(&mut self) {
        for (path, missing) in self.made.iter().rev() {
            if path.is_dir() {
                let _ = fs::remove_dir_all(path);
            } else {
                let _ = fs::remove_file(path);
            }
            for dir in missing {
                let _ = fs::remove_dir(dir);
            }
        }
    }
}

/// What an agent's socket received, one entry per request.
type Requests = Arc<Mutex<Vec<String>>>;

/// An agent double: answers each request on a unix socket or on a TCP
/// port, HTTP/1.1 (200, `{}`) or one OVSDB JSON-RPC line, and keeps them.
struct Agent {
    requests: Requests,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Agent {
    fn unix(paths: &mut HostPaths, path: &str) -> Agent {
        let p = Path::new(path);
        assert!(
            !p.exists(),
            "{path} exists on this host (a real agent?): not touching it"
        );
        paths.claim(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let l = UnixListener::bind(p).unwrap_or_else(|e| panic!("bind {path}: {e}"));
        Self::serve(Listener::Unix(l))
    }

    fn tcp(addr: &str) -> Agent {
        let l = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        Self::serve(Listener::Tcp(l))
    }

    fn serve(l: Listener) -> Agent {
        let requests: Requests = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (requests.clone(), stop.clone());
        let thread = thread::spawn(move || {
            match &l {
                Listener::Unix(l) => l.set_nonblocking(true).unwrap(),
                Listener::Tcp(l) => l.set_nonblocking(true).unwrap(),
            }
            while !s.load(Ordering::Relaxed) {
                let accepted: io::Result<Box<dyn ReadWrite>> = match &l {
                    Listener::Unix(l) => l.accept().map(|(c, _)| {
                        c.set_nonblocking(false).unwrap();
                        Box::new(c) as Box<dyn ReadWrite>
                    }),
                    Listener::Tcp(l) => l.accept().map(|(c, _)| {
                        c.set_nonblocking(false).unwrap();
                        Box::new(c) as Box<dyn ReadWrite>
                    }),
                };
                match accepted {
                    Ok(c) => {
                        if let Ok(req) = answer(c) {
                            r.lock().unwrap().push(req);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => break,
                }
            }
        });
        Agent {
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn got(&self, needle: &str) -> bool {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.contains(needle))
    }

    fn seen(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Reads one request and answers it; returns the request's text.
fn answer(c: Box<dyn ReadWrite>) -> io::Result<String> {
    let mut r = BufReader::new(c);
    let mut first = String::new();
    r.read_line(&mut first)?;
    if first.starts_with('{') {
        // OVSDB JSON-RPC: one line in, one line out.
        let req: Value = serde_json::from_str(first.trim()).unwrap_or(Value::Null);
        let reply = json!({"id": req["id"], "result": [{}], "error": null});
        r.get_mut().write_all(format!("{reply}\n").as_bytes())?;
        return Ok(first);
    }
    let mut text = first;
    let mut length = 0;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        text.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body)?;
    text.push_str(&String::from_utf8_lossy(&body));
    r.get_mut().write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\
          Connection: close\r\n\r\n{}",
    )?;
    Ok(text)
}

/// One manager with plexusd serving the networks written by
/// [`Bench::network`], their plugins the double under each type name.
struct Bench {
    p: Plexus,
    conf: PathBuf,
    report: PathBuf,
}

impl Bench {
    fn start(types: &[&str]) -> Option<Bench> {
        let p = Plexus::start(json!({}))?;
        let work = p.m.work_dir().to_path_buf();
        let bin = work.join("bin");
        fs::create_dir_all(&bin).unwrap();
        for t in types {
            let dst = bin.join(t);
            fs::copy(DOUBLE, &dst).unwrap();
            fs::set_permissions(&dst, fs::Permissions::from_mode(0o755)).unwrap();
        }
        let conf = work.join("net.d");
        fs::create_dir_all(&conf).unwrap();
        // As Plexus::serve_network, but with no clusterNetwork: each call
        // names its own.
        let path = work.join("daemon-config.json");
        let mut cfg: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        cfg["confDir"] = json!(conf);
        cfg["binDir"] = json!(bin);
        fs::write(&path, cfg.to_string()).unwrap();
        p.m.systemctl_ok(&["start", SOCKET_UNIT]);
        Some(Bench {
            report: work.join("report.jsonl"),
            conf,
            p,
        })
    }

    /// Writes network `name` with `plugins` (each given `report`).
    fn network(&self, name: &str, mut plugins: Vec<Value>) {
        for p in &mut plugins {
            p["report"] = json!(self.report);
        }
        let list = json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins});
        fs::write(self.conf.join(format!("{name}.conflist")), list.to_string()).unwrap();
    }

    fn call(&self, cmd: &str, id: &str, ns: &Netns, network: &str) -> Run {
        let (env, _) = self.p.shim_call(cmd, id, &ns.path);
        let stdin = json!({
            "cniVersion": "1.0.0", "name": "plexus", "type": "plexus-shim",
            "daemonSocketDir": self.p.sock.parent().unwrap(),
            "clusterNetwork": network,
        });
        crate::support::shim::run(env, stdin.to_string().as_bytes())
    }

    /// The report lines of container `id` for `profile` and `command`.
    fn lines(&self, id: &str, profile: &str, command: &str) -> Vec<Value> {
        fs::read_to_string(&self.report)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["containerId"] == id && v["profile"] == profile)
            .filter(|v| v["command"] == command)
            .collect()
    }

    /// The effect of `profile`'s `command` for `id` that has key `key`.
    fn effect(&self, id: &str, profile: &str, command: &str, key: &str) -> Option<Value> {
        self.lines(id, profile, command)
            .iter()
            .flat_map(|l| l["effects"].as_array().cloned().unwrap_or_default())
            .find(|e| !e[key].is_null())
    }

    /// Everything any plugin reported as degraded.
    fn degraded(&self) -> String {
        let mut marker = self.report.clone().into_os_string();
        marker.push(".degraded");
        fs::read_to_string(marker).unwrap_or_default()
    }

    /// What the plugins reported as degraded for container `id`.
    fn degraded_for(&self, id: &str) -> String {
        self.degraded()
            .lines()
            .filter(|l| l.contains(&format!(" {id}: ")))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    fn plexusd_log(&self) -> String {
        let log = fs::read_to_string(self.p.m.work_dir().join("plexusd.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

/// `Err(message)` unless `cond`.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// A call that must have succeeded.
fn ok(run: &Run, what: &str) -> Result<(), String> {
    ensure!(
        run.code == Some(0),
        "{what} failed: exit {:?}, stdout {}, stderr {}",
        run.code,
        run.stdout.trim(),
        run.stderr.trim()
    );
    Ok(())
}

/// The pod's interface `ifname` carries `addr`, the host side exists.
fn attached(ns: &Netns, ifname: &str, addr: &str, host: &str) -> Result<(), String> {
    let iface = ns.iface(ifname);
    ensure!(
        iface.as_ref().is_some_and(|i| i.has_addr(addr)),
        "{ifname} with {addr} not in {}: {iface:?}",
        ns.name
    );
    ensure!(
        crate::support::netns::host_link_exists(host),
        "no host veth {host}"
    );
    Ok(())
}

fn detached(ns: &Netns, ifname: &str, host: &str) -> Result<(), String> {
    ensure!(!ns.has_link(ifname), "{ifname} still in {}", ns.name);
    ensure!(
        !crate::support::netns::host_link_exists(host),
        "host veth {host} still there"
    );
    Ok(())
}

/// Whether `path` on the host has a line naming container `id`.
fn logged(path: &str, id: &str) -> Result<(), String> {
    let text = fs::read_to_string(path).map_err(|e| format!("host {path}: {e}"))?;
    ensure!(
        text.lines()
            .any(|l| l.contains(&format!("ContainerID={id}"))),
        "host {path} has no line for {id}"
    );
    Ok(())
}

/// Every check's failure, or success if none failed.
fn every(results: Vec<Result<(), String>>) -> Result<(), String> {
    let failed: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(())
}

/// Fails once with every profile's failure (and what the plugins reported
/// as degraded, and the end of plexusd's log), if any failed.
fn all_pass(results: Vec<(&str, Result<(), String>)>, bench: &Bench, started: Instant) {
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(what, r)| r.as_ref().err().map(|e| format!("{what}: {e}")))
        .collect();
    println!("{} profiles in {:?}", results.len(), started.elapsed());
    assert!(
        failed.is_empty(),
        "{}\n--- degraded:\n{}--- plexusd.log (tail):\n{}",
        failed.join("\n"),
        bench.degraded(),
        bench.plexusd_log()
    );
}

fn unique_file(tag: &str) -> String {
    format!(
        "/tmp/plexus-{tag}-{}-{}.log",
        std::process::id(),
        FILES.fetch_add(1, Ordering::Relaxed)
    )
}

fn netns_sysctl(ns: &Netns, key: &str, value: Option<&str>) -> String {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let script = match value {
        Some(v) => format!("echo {v} > {path}"),
        None => format!("cat {path}"),
    };
    let out = ip(&["netns", "exec", &ns.name, "sh", "-c", &script]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Calico with calico-ipam, and flannel: the log, the nodename file and
/// the host-wide IPAM lock under /var/{log,lib,run}/calico; flannel's
/// subnet.env and its state in /var/lib/cni/flannel.
#[test]
fn calico_and_flannel_doubles_should_work_as_under_the_runtime() {
    if crate::support::systemd::skip_reason().is_some() {
        println!("skipping: no private systemd manager here");
        return;
    }
    let started = Instant::now();
    let _host = crate::support::lock::host_paths();
    let mut paths = HostPaths::default();
    let (calico_ns, flannel_ns) = (Netns::new(), Netns::new());
    let (calico_veth, flannel_veth) = (Link::planned("dc"), Link::planned("df"));
    let subnet = Subnet::new();
    let nodename = unique_name("nn");
    paths.provide(Path::new("/var/lib/calico/nodename"), &nodename);
    paths.provide(
        Path::new("/run/flannel/subnet.env"),
        &format!(
            "FLANNEL_NETWORK={0}.0/16\nFLANNEL_SUBNET={0}.1/24\nFLANNEL_MTU=1450\n\
             FLANNEL_IPMASQ=true\n",
            subnet.prefix
        ),
    );
    for p in [
        "/var/log/calico/cni/cni.log",
        "/var/run/calico/ipam.lock",
        "/var/lib/cni/flannel",
    ] {
        paths.claim(Path::new(p));
    }
    let Some(b) = Bench::start(&["calico", "calico-ipam", "flannel"]) else {
        return;
    };
    let (calico_addr, flannel_addr) = (
        format!("{}.10/24", subnet.prefix),
        format!("{}.11/24", subnet.prefix),
    );
    b.network(
        "dbl-calico",
        vec![
            json!({"type": "calico", "log_file_path": "/var/log/calico/cni/cni.log",
                    "hostVeth": calico_veth.name,
                    "ipam": {"type": "calico-ipam", "address": calico_addr}}),
        ],
    );
    b.network(
        "dbl-flannel",
        vec![json!({"type": "flannel", "hostVeth": flannel_veth.name,
                    "address": flannel_addr})],
    );
    let calico_id = unique_name("ci");
    let flannel_id = unique_name("fi");

    let calico = (|| {
        ok(&b.call("ADD", &calico_id, &calico_ns, "dbl-calico"), "ADD")?;
        attached(&calico_ns, "eth0", &calico_addr, &calico_veth.name)?;
        logged("/var/log/calico/cni/cni.log", &calico_id)?;
        let read = b.effect(&calico_id, "calico", "ADD", "read");
        ensure!(
            read.as_ref()
                .is_some_and(|r| r["content"] == nodename.as_str()),
            "calico did not read the host's nodename {nodename}: {read:?}"
        );
        let lock = b
            .effect(&calico_id, "calico-ipam", "ADD", "lock")
            .ok_or(format!(
                "calico-ipam took no lock: {:?}",
                b.lines(&calico_id, "calico-ipam", "ADD")
            ))?;
        let host = fs::metadata("/var/run/calico/ipam.lock")
            .map_err(|e| format!("host /var/run/calico/ipam.lock: {e}"))?;
        ensure!(
            lock["dev"] == host.dev() && lock["ino"] == host.ino(),
            "calico-ipam locked another file than the host's /var/run/calico/ipam.lock: {lock}"
        );
        ok(&b.call("DEL", &calico_id, &calico_ns, "dbl-calico"), "DEL")?;
        detached(&calico_ns, "eth0", &calico_veth.name)?;
        let degraded = b.degraded_for(&calico_id);
        ensure!(degraded.is_empty(), "degraded: {degraded}");
        Ok(())
    })();
    let _ = b.call("DEL", &calico_id, &calico_ns, "dbl-calico");

    let flannel = (|| {
        let state = format!("/var/lib/cni/flannel/{flannel_id}");
        ok(
            &b.call("ADD", &flannel_id, &flannel_ns, "dbl-flannel"),
            "ADD",
        )?;
        attached(&flannel_ns, "eth0", &flannel_addr, &flannel_veth.name)?;
        let saved = fs::read_to_string(&state).map_err(|e| format!("host {state}: {e}"))?;
        ensure!(
            saved.contains(&format!("{}.1/24", subnet.prefix)),
            "{state} holds no delegate with the subnet from subnet.env: {saved}"
        );
        ok(
            &b.call("DEL", &flannel_id, &flannel_ns, "dbl-flannel"),
            "DEL",
        )?;
        detached(&flannel_ns, "eth0", &flannel_veth.name)?;
        ensure!(!Path::new(&state).exists(), "{state} left after DEL");
        Ok(())
    })();
    let _ = b.call("DEL", &flannel_id, &flannel_ns, "dbl-flannel");

    all_pass(vec![("calico", calico), ("flannel", flannel)], &b, started);
}

/// The AWS VPC CNI (aws-cni, then egress-cni, then cilium-cni chained as
/// in Cilium's aws-cni chaining), and Cilium alone: the logs in
/// /var/log/aws-routed-eni and /var/run/cilium, ipamd on 127.0.0.1:50051,
/// the Cilium agent's socket, rp_filter in the pod.
#[test]
fn aws_and_cilium_doubles_should_work_as_under_the_runtime() {
    if crate::support::systemd::skip_reason().is_some() {
        println!("skipping: no private systemd manager here");
        return;
    }
    let started = Instant::now();
    let _host = crate::support::lock::host_paths();
    let mut paths = HostPaths::default();
    let (aws_ns, cilium_ns) = (Netns::new(), Netns::new());
    for ns in [&aws_ns, &cilium_ns] {
        netns_sysctl(ns, "net.ipv4.conf.default.rp_filter", Some("1"));
    }
    let (aws_veth, cilium_veth) = (Link::planned("da"), Link::planned("dl"));
    let subnet = Subnet::new();
    for p in [
        "/var/log/aws-routed-eni/plugin.log",
        "/var/log/aws-routed-eni/egress-v6-plugin.log",
        "/var/run/cilium/cilium-cni.log",
    ] {
        paths.claim(Path::new(p));
    }
    let agent = Agent::unix(&mut paths, "/var/run/cilium/cilium.sock");
    let ipamd = Agent::tcp("127.0.0.1:50051");
    let Some(b) = Bench::start(&["aws-cni", "egress-cni", "cilium-cni"]) else {
        return;
    };
    let (aws_addr, cilium_addr) = (
        format!("{}.10/24", subnet.prefix),
        format!("{}.11/24", subnet.prefix),
    );
    b.network(
        "dbl-aws",
        vec![
            json!({"type": "aws-cni", "pluginLogFile": "/var/log/aws-routed-eni/plugin.log",
                   "hostVeth": aws_veth.name, "address": aws_addr}),
            json!({"type": "egress-cni",
                   "pluginLogFile": "/var/log/aws-routed-eni/egress-v6-plugin.log"}),
            json!({"type": "cilium-cni", "chaining-mode": "aws-cni",
                   "log-file": "/var/run/cilium/cilium-cni.log"}),
        ],
    );
    b.network(
        "dbl-cilium",
        vec![
            json!({"type": "cilium-cni", "log-file": "/var/run/cilium/cilium-cni.log",
                   "hostVeth": cilium_veth.name, "address": cilium_addr}),
        ],
    );
    let aws_id = unique_name("ai");
    let cilium_id = unique_name("li");

    let aws = (|| {
        ok(&b.call("ADD", &aws_id, &aws_ns, "dbl-aws"), "ADD")?;
        attached(&aws_ns, "eth0", &aws_addr, &aws_veth.name)?;
        logged("/var/log/aws-routed-eni/plugin.log", &aws_id)?;
        logged("/var/log/aws-routed-eni/egress-v6-plugin.log", &aws_id)?;
        ensure!(
            ipamd.got("AddNetwork") && ipamd.got(&aws_id),
            "ipamd got no AddNetwork for {aws_id}: {:?}",
            ipamd.seen()
        );
        ensure!(
            agent.got(&aws_id),
            "the Cilium agent got nothing from the chained cilium-cni: {:?}",
            agent.seen()
        );
        let rp = netns_sysctl(&aws_ns, "net.ipv4.conf.eth0.rp_filter", None);
        ensure!(rp == "0", "chained cilium-cni: eth0 rp_filter is {rp:?}");
        ok(&b.call("DEL", &aws_id, &aws_ns, "dbl-aws"), "DEL")?;
        detached(&aws_ns, "eth0", &aws_veth.name)?;
        ensure!(
            ipamd.got("DelNetwork"),
            "ipamd got no DelNetwork: {:?}",
            ipamd.seen()
        );
        let degraded = b.degraded_for(&aws_id);
        ensure!(degraded.is_empty(), "degraded: {degraded}");
        Ok(())
    })();
    let _ = b.call("DEL", &aws_id, &aws_ns, "dbl-aws");

    let cilium = (|| {
        ok(&b.call("ADD", &cilium_id, &cilium_ns, "dbl-cilium"), "ADD")?;
        attached(&cilium_ns, "eth0", &cilium_addr, &cilium_veth.name)?;
        logged("/var/run/cilium/cilium-cni.log", &cilium_id)?;
        ensure!(
            agent.got("POST /v1/ipam") && agent.got(&cilium_id),
            "the Cilium agent got no request for {cilium_id}: {:?}",
            agent.seen()
        );
        let rp = netns_sysctl(&cilium_ns, "net.ipv4.conf.eth0.rp_filter", None);
        ensure!(rp == "0", "eth0 rp_filter is {rp:?}");
        ok(&b.call("DEL", &cilium_id, &cilium_ns, "dbl-cilium"), "DEL")?;
        detached(&cilium_ns, "eth0", &cilium_veth.name)?;
        let degraded = b.degraded_for(&cilium_id);
        ensure!(degraded.is_empty(), "degraded: {degraded}");
        Ok(())
    })();
    let _ = b.call("DEL", &cilium_id, &cilium_ns, "dbl-cilium");

    all_pass(
        vec![
            ("aws-cni+egress-cni+cilium-cni", aws),
            ("cilium-cni", cilium),
        ],
        &b,
        started,
    );
}

/// Antrea, OVN-Kubernetes, OVS (with whereabouts as its IPAM) and SR-IOV:
/// the agents' sockets, OVSDB, whereabouts' log in the host's /tmp and its
/// flat config file, the caches in /tmp/ovscache and /var/lib/cni/sriov.
#[test]
fn antrea_ovn_ovs_and_sriov_doubles_should_work_as_under_the_runtime() {
    if crate::support::systemd::skip_reason().is_some() {
        println!("skipping: no private systemd manager here");
        return;
    }
    let started = Instant::now();
    let _host = crate::support::lock::host_paths();
    let mut paths = HostPaths::default();
    let nss: Vec<Netns> = (0..4).map(|_| Netns::new()).collect();
    let veths: Vec<Link> = (0..4).map(|_| Link::planned("dv")).collect();
    let subnet = Subnet::new();
    let wb_log = unique_file("whereabouts");
    let wb_conf = json!({"datastore": "kubernetes", "log_level": "debug",
                         "kubernetes": {"kubeconfig": unique_name("kc")}})
    .to_string();
    paths.claim(Path::new(&wb_log));
    paths.provide(
        Path::new("/etc/cni/net.d/whereabouts.d/whereabouts.conf"),
        &wb_conf,
    );
    paths.claim(Path::new("/tmp/ovscache"));
    paths.claim(Path::new("/var/lib/cni/sriov"));
    let antrea = Agent::unix(&mut paths, "/var/run/antrea/cni.sock");
    let ovn = Agent::unix(
        &mut paths,
        "/var/run/ovn-kubernetes/cni/ovn-cni-server.sock",
    );
    let ovsdb = Agent::unix(&mut paths, "/var/run/openvswitch/db.sock");
    let Some(b) = Bench::start(&[
        "antrea",
        "ovn-k8s-cni-overlay",
        "ovs",
        "whereabouts",
        "sriov",
    ]) else {
        return;
    };
    let addr = |i: usize| format!("{}.{}/24", subnet.prefix, 10 + i);
    b.network(
        "dbl-antrea",
        vec![json!({"type": "antrea", "hostVeth": veths[0].name, "address": addr(0)})],
    );
    b.network(
        "dbl-ovn",
        vec![
            json!({"type": "ovn-k8s-cni-overlay", "hostVeth": veths[1].name,
                    "address": addr(1)}),
        ],
    );
    b.network(
        "dbl-ovs",
        vec![
            json!({"type": "ovs", "bridge": "br1", "hostVeth": veths[2].name,
                    "ipam": {"type": "whereabouts", "log_file": wb_log, "address": addr(2)}}),
        ],
    );
    b.network(
        "dbl-sriov",
        vec![json!({"type": "sriov", "hostVeth": veths[3].name, "address": addr(3)})],
    );
    let ids: Vec<String> = (0..4).map(|_| unique_name("xi")).collect();

    // ADD, the profile's own checks, DEL, the checks after DEL.
    type Check<'a> = Box<dyn Fn() -> Result<(), String> + 'a>;
    let case = |i: usize, net: &str, after_add: Check<'_>, after_del: Check<'_>| {
        let r = (|| {
            ok(&b.call("ADD", &ids[i], &nss[i], net), "ADD")?;
            attached(&nss[i], "eth0", &addr(i), &veths[i].name)?;
            after_add()?;
            ok(&b.call("DEL", &ids[i], &nss[i], net), "DEL")?;
            detached(&nss[i], "eth0", &veths[i].name)?;
            after_del()
        })();
        let _ = b.call("DEL", &ids[i], &nss[i], net);
        r
    };
    let none = || -> Check<'_> { Box::new(|| Ok(())) };

    let antrea_r = case(
        0,
        "dbl-antrea",
        Box::new(|| {
            ensure!(
                antrea.got("Cni/CmdAdd") && antrea.got(&ids[0]),
                "the Antrea agent got no CmdAdd: {:?}",
                antrea.seen()
            );
            Ok(())
        }),
        Box::new(|| {
            ensure!(antrea.got("Cni/CmdDel"), "no CmdDel: {:?}", antrea.seen());
            Ok(())
        }),
    );
    let ovn_r = case(
        1,
        "dbl-ovn",
        Box::new(|| {
            ensure!(
                ovn.got("POST / ") && ovn.got(&ids[1]),
                "the OVN CNI server got no ADD: {:?}",
                ovn.seen()
            );
            Ok(())
        }),
        none(),
    );
    let cache = format!("/tmp/ovscache/{}_eth0", ids[2]);
    let ovs_r = case(
        2,
        "dbl-ovs",
        Box::new(|| {
            ensure!(
                ovsdb.got("\"insert\"") && ovsdb.got(&ids[2]),
                "OVSDB got no transact: {:?}",
                ovsdb.seen()
            );
            let cache_kept = || {
                ensure!(
                    Path::new(&cache).is_file(),
                    "ovs-cni's cache {cache} is not in the host's /tmp"
                );
                Ok(())
            };
            let flat_read = || {
                let read = b.effect(&ids[2], "whereabouts", "ADD", "read");
                ensure!(
                    read.as_ref()
                        .is_some_and(|r| r["content"] == wb_conf.as_str()),
                    "whereabouts did not read the host's flat config: {read:?}"
                );
                Ok(())
            };
            every(vec![cache_kept(), logged(&wb_log, &ids[2]), flat_read()])
        }),
        Box::new(|| {
            ensure!(!Path::new(&cache).exists(), "{cache} left after DEL");
            Ok(())
        }),
    );
    let state = format!("/var/lib/cni/sriov/{}-eth0", ids[3]);
    let sriov_r = case(
        3,
        "dbl-sriov",
        Box::new(|| {
            ensure!(Path::new(&state).is_file(), "no host {state}");
            Ok(())
        }),
        Box::new(|| {
            ensure!(!Path::new(&state).exists(), "{state} left after DEL");
            ensure!(b.degraded().is_empty(), "degraded: {}", b.degraded());
            Ok(())
        }),
    );

    all_pass(
        vec![
            ("antrea", antrea_r),
            ("ovn-k8s-cni-overlay", ovn_r),
            ("ovs+whereabouts", ovs_r),
            ("sriov", sriov_r),
        ],
        &b,
        started,
    );
}
