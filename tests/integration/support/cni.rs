//! The daemon's CNI engine end to end: a private confDir/binDir/stateDir in
//! a [`TestDir`], network configs and fake plugins written into it, plexusd
//! started on it, and CNI calls made through the built plexus-shim.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use serde_json::{json, Value};

use super::daemon::{Daemon, TestDir};
use super::netns::{Netns, Subnet};
use super::shim::{self, Run};

/// Where the Debian plugins live.
pub const SYSTEM_PLUGINS: &str = "/usr/lib/cni";
/// `CNI_ARGS` host-local needs to accept the keys runtimes add.
pub const DEFAULT_ARGS: &str = "IgnoreUnknown=1";
/// `PATH` as runtimes give it to a plugin (a minimal one).
pub const PLUGIN_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// What fake plugins answer to VERSION.
pub const FAKE_VERSION: &str =
    r#"{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}"#;

/// One engine setup: `<dir>/conf` (confDir), `<dir>/bin` (fake plugins,
/// searched before /usr/lib/cni), `<dir>/state` (stateDir) and `<dir>/ipam`
/// (host-local's dataDir). Processes left by fake plugins (any process whose
/// command line contains `<dir>/bin/`) are killed on drop.
pub struct Engine {
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub state_dir: PathBuf,
    pub ipam_dir: PathBuf,
    pub dir: TestDir,
}

impl Engine {
    pub fn new(name: &str) -> Self {
        let dir = TestDir::new(name);
        let e = Engine {
            conf_dir: dir.join("conf"),
            bin_dir: dir.join("bin"),
            state_dir: dir.join("state"),
            ipam_dir: dir.join("ipam"),
            dir,
        };
        for d in [&e.conf_dir, &e.bin_dir, &e.state_dir, &e.ipam_dir] {
            fs::create_dir_all(d).unwrap();
        }
        e
    }

    /// [`Engine::new`] with one network, `cluster`: Debian's bridge on a
    /// bridge of its own, host-local on a subnet of its own. The bridge is
    /// removed when the returned [`Link`] is dropped.
    pub fn with_cluster_bridge(name: &str) -> (Self, super::netns::Link, Subnet) {
        let e = Engine::new(name);
        let link = super::netns::Link::planned("b");
        let subnet = Subnet::new();
        e.write_network(
            "10-cluster.conflist",
            &conflist(
                "cluster",
                "1.0.0",
                vec![bridge(&link.name, e.host_local(&subnet))],
            ),
        );
        (e, link, subnet)
    }

    /// The daemon config of the engine contract.
    pub fn config(&self, cluster_network: &str, plugin_timeout: &str) -> Value {
        json!({
            "confDir": self.conf_dir,
            "binDir": format!("{}:{SYSTEM_PLUGINS}", self.bin_dir.display()),
            "stateDir": self.state_dir,
            "clusterNetwork": cluster_network,
            "pluginTimeout": plugin_timeout,
        })
    }

    /// Starts plexusd (config `<dir>/<tag>.json`) and waits until it is ready.
    pub fn start(&self, tag: &str, cluster_network: &str, plugin_timeout: &str) -> Daemon {
        let mut d = Daemon::start(&self.dir, tag, self.config(cluster_network, plugin_timeout));
        d.ready();
        d
    }

    /// Writes a network config file `file_name` into confDir.
    pub fn write_network(&self, file_name: &str, config: &Value) -> PathBuf {
        let p = self.conf_dir.join(file_name);
        fs::write(&p, serde_json::to_vec_pretty(config).unwrap()).unwrap();
        p
    }

    /// host-local IPAM on `subnet` with its store inside the test dir.
    pub fn host_local(&self, subnet: &Subnet) -> Value {
        json!({
            "type": "host-local",
            "dataDir": self.ipam_dir,
            "ranges": [[{"subnet": subnet.cidr()}]],
        })
    }

    /// Writes an executable bash fake plugin `<bin>/<name>`. The preamble
    /// sets PATH, reads all of stdin into `$STDIN` and answers VERSION with
    /// [`FAKE_VERSION`]; `body` handles every other command. `$BIN` is the
    /// fakes' directory, `$DIR` the test dir.
    pub fn fake(&self, name: &str, body: &str) -> PathBuf {
        self.fake_with(name, "", body)
    }

    /// [`Engine::fake`] that runs `first` right after reading stdin, for
    /// every command (VERSION included).
    pub fn fake_with(&self, name: &str, first: &str, body: &str) -> PathBuf {
        let p = self.bin_dir.join(name);
        let script = format!(
            "#!/bin/bash\n\
             export PATH=/usr/sbin:/usr/bin:/sbin:/bin\n\
             BIN='{bin}'\n\
             DIR='{dir}'\n\
             STDIN=$(cat)\n\
             {first}\n\
             if [ \"$CNI_COMMAND\" = VERSION ]; then\n\
             \x20 echo '{FAKE_VERSION}'\n\
             \x20 exit 0\n\
             fi\n\
             {body}\n",
            bin = self.bin_dir.display(),
            dir = self.dir.path.display(),
        );
        let tmp = self.bin_dir.join(format!(".{name}.tmp"));
        fs::write(&tmp, script).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        // Renamed into place so that no one ever execs a half-written file
        // (ETXTBSY).
        fs::rename(&tmp, &p).unwrap();
        p
    }

    /// What a pass-through fake prints on ADD: its prevResult (or an empty
    /// result) labelled with the version it was called with.
    pub fn pass_through() -> &'static str {
        r#"printf '%s' "$STDIN" | jq -c '(.prevResult // {}) + {cniVersion: .cniVersion}'"#
    }

    /// The attachment record of `container_id`.
    pub fn record(&self, container_id: &str) -> PathBuf {
        self.state_dir
            .join("attachments")
            .join(format!("{container_id}.json"))
    }

    /// Every file in `<stateDir>/attachments` (empty when it is absent).
    pub fn records(&self) -> Vec<String> {
        list_dir(&self.state_dir.join("attachments"))
    }

    /// host-local's store of network `network`, minus the bookkeeping
    /// files (`lock`, `last_reserved_ip.*`): the reserved addresses.
    pub fn reservations(&self, network: &str) -> Vec<String> {
        list_dir(&self.ipam_dir.join(network))
            .into_iter()
            .filter(|f| f != "lock" && !f.starts_with("last_reserved_ip."))
            .collect()
    }

    /// Processes started from the fakes' directory (cmdline contains
    /// `<bin>/`), e.g. sleepers named with `exec -a "$BIN/..."`.
    pub fn fake_processes(&self) -> Vec<(i32, String)> {
        processes_matching(&format!("{}/", self.bin_dir.display()))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for (pid, _) in self.fake_processes() {
            // SAFETY: kill(2) on a process this test started (its command
            // line names this test's private directory).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Sorted names in `dir`; empty when it does not exist.
pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            // plexusd's spare files (docs/records.md) are no one's.
            .filter(|n| !n.starts_with(".free."))
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// A conflist.
pub fn conflist(name: &str, version: &str, plugins: Vec<Value>) -> Value {
    json!({"cniVersion": version, "name": name, "plugins": plugins})
}

/// A bridge plugin entry (no isGateway/ipMasq: host sysctls and iptables
/// stay untouched).
pub fn bridge(bridge_name: &str, ipam: Value) -> Value {
    json!({"type": "bridge", "bridge": bridge_name, "ipam": ipam})
}

/// One CNI call through plexus-shim.
#[derive(Debug, Clone)]
pub struct Call {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    /// `cniVersion` of the shim's stdin.
    pub cni_version: String,
}

impl Call {
    pub fn new(command: &str, container_id: &str, netns: &Netns, ifname: &str) -> Self {
        Call {
            command: command.into(),
            container_id: container_id.into(),
            netns: netns.path.clone(),
            ifname: ifname.into(),
            args: DEFAULT_ARGS.into(),
            cni_version: "1.0.0".into(),
        }
    }

    pub fn version(mut self, v: &str) -> Self {
        self.cni_version = v.into();
        self
    }

    pub fn args(mut self, a: &str) -> Self {
        self.args = a.into();
        self
    }

    pub fn env(&self) -> Vec<(String, String)> {
        call_env(
            &self.command,
            &self.container_id,
            &self.netns,
            &self.ifname,
            &self.args,
        )
    }

    /// The shim's stdin: the runtime's view of the plexus network.
    pub fn stdin(&self, daemon: &Daemon) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "cniVersion": self.cni_version,
            "name": "plexus",
            "type": "plexus-shim",
            "daemonSocketDir": daemon.sock.parent().unwrap(),
        }))
        .unwrap()
    }

    /// Starts the call without waiting for it.
    pub fn spawn(&self, daemon: &Daemon) -> Pending {
        Pending(Some(shim::spawn(self.env(), &self.stdin(daemon))))
    }

    pub fn run(&self, daemon: &Daemon) -> Run {
        shim::run(self.env(), &self.stdin(daemon))
    }
}

/// The environment of one CNI call, as a runtime gives it to a plugin (and
/// plexusd to the plugins it runs): the CNI variables, with `CNI_PATH` the
/// Debian plugins, and [`PLUGIN_PATH`]. VERSION gets only `CNI_COMMAND` and
/// `PATH`.
pub fn call_env(
    command: &str,
    container_id: &str,
    netns: &str,
    ifname: &str,
    args: &str,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("CNI_COMMAND".to_string(), command.to_string()),
        ("PATH".to_string(), PLUGIN_PATH.to_string()),
    ];
    if command != "VERSION" {
        env.extend([
            ("CNI_CONTAINERID".to_string(), container_id.to_string()),
            ("CNI_NETNS".to_string(), netns.to_string()),
            ("CNI_IFNAME".to_string(), ifname.to_string()),
            ("CNI_ARGS".to_string(), args.to_string()),
            ("CNI_PATH".to_string(), SYSTEM_PLUGINS.to_string()),
        ]);
    }
    env
}

/// A shim run in progress; killed and reaped on drop unless finished.
pub struct Pending(Option<Child>);

impl Pending {
    /// Waits (bounded) for the shim and collects its output.
    pub fn finish(mut self) -> Run {
        shim::finish(self.0.take().unwrap())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `command` for `container_id` in `netns` with `CNI_IFNAME=ifname`.
pub fn cni(daemon: &Daemon, command: &str, container_id: &str, netns: &Netns, ifname: &str) -> Run {
    Call::new(command, container_id, netns, ifname).run(daemon)
}

/// Asserts `run` succeeded; returns its JSON output (Null when empty).
/// The failure message carries the daemon's log.
pub fn ok(daemon: &Daemon, run: &Run) -> Value {
    if run.code != Some(0) {
        panic!(
            "CNI call failed: {run:?}\n--- plexusd log ---\n{}",
            daemon.log_text()
        );
    }
    if run.stdout.trim().is_empty() {
        Value::Null
    } else {
        run.json()
    }
}

/// Asserts `run` failed with a CNI error (exit 1, non-zero code, non-empty
/// msg); returns (code, msg, the whole error as text).
pub fn failed(daemon: &Daemon, run: &Run) -> (u64, String, String) {
    let parsed: Option<Value> = serde_json::from_str(&run.stdout).ok();
    let good = run.code == Some(1)
        && parsed
            .as_ref()
            .is_some_and(|v| v["code"].as_u64().is_some_and(|c| c != 0) && v["msg"].is_string());
    if !good {
        panic!(
            "expected a CNI error, got {run:?}\n--- plexusd log ---\n{}",
            daemon.log_text()
        );
    }
    let v = parsed.unwrap();
    (
        v["code"].as_u64().unwrap(),
        v["msg"].as_str().unwrap().to_string(),
        v.to_string(),
    )
}

/// `ips[0].address` of a result.
pub fn address(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("result has no ips[0].address: {result}"))
        .to_string()
}

/// The address without its prefix length (host-local's file name).
pub fn bare(address: &str) -> String {
    address.split('/').next().unwrap().to_string()
}

/// Asserts the result lists `ifname` with `sandbox` = the netns path.
pub fn assert_sandbox_iface(result: &Value, ifname: &str, netns: &Netns) {
    let found = result["interfaces"].as_array().is_some_and(|a| {
        a.iter()
            .any(|i| i["name"] == ifname && i["sandbox"] == netns.path.as_str())
    });
    assert!(
        found,
        "result lists no {ifname} in sandbox {}: {result}",
        netns.path
    );
}

/// Direct children of `pid` (all its threads').
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.filter_map(|t| t.ok()) {
        if let Ok(s) = fs::read_to_string(t.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Processes whose command line (arguments joined by spaces) contains
/// `needle`, as (pid, command line); zombies have none and are skipped.
pub fn processes_matching(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw)
            .trim_end_matches('\0')
            .replace('\0', " ");
        if cmdline.contains(needle) {
            out.push((pid, cmdline));
        }
    }
    out
}

/// How long tests wait for the system to settle (processes to go away).
pub const SETTLE: Duration = Duration::from_secs(10);

/// The lines of `<dir>/runs`, where a test's recording fake plugin notes
/// each of its runs.
pub fn runs(e: &Engine) -> Vec<String> {
    fs::read_to_string(e.dir.join("runs"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A GC through plexus-shim with `valid` as the valid attachments, run to
/// completion.
pub fn gc(daemon: &Daemon, valid: Value) -> Run {
    shim::finish(gc_call(daemon, valid))
}

/// A GC through plexus-shim (started, not waited for) with `valid` as the
/// valid attachments.
pub fn gc_call(daemon: &Daemon, valid: Value) -> Child {
    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus-shim",
        "daemonSocketDir": daemon.sock.parent().unwrap(),
        "cni.dev/valid-attachments": valid,
    }))
    .unwrap();
    shim::spawn(
        [("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")],
        &stdin,
    )
}
