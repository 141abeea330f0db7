//! The shipped unit files (systemd/plexusd.socket, systemd/plexusd.service)
//! under a real systemd manager, with the built plexusd.
//!
//! Needs root; skips otherwise (or with PLEXUS_SYSTEMD_TESTS=0). Run alone
//! with `cargo test --test integration systemd_units:: -- --test-threads=1`
//! (managers are serialised by the harness anyway).

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::http::{self, Response};
use crate::support::systemd::{
    analyze_offline, assert_verifies, plexus_units, plugin_units, skip_reason, Manager, ScratchDir,
    PLUGINS_SERVICE_UNIT as PLUGINS_SERVICE, PLUGINS_SOCKET_UNIT as PLUGINS_SOCKET,
    SERVICE_UNIT as SERVICE, SOCKET_UNIT as SOCKET,
};

pub(crate) const STATE_TIMEOUT: Duration = Duration::from_secs(10);

/// A manager with the plexus units installed and `config` (merged over the
/// default `socketDir`/`logLevel`) as daemon-config.json.
pub(crate) struct Plexus {
    pub(crate) m: Manager,
    pub(crate) sock: PathBuf,
}

impl Plexus {
    pub(crate) fn start(config: serde_json::Value) -> Option<Plexus> {
        let m = Manager::start()?;
        let work = m.work_dir().to_path_buf();
        let mut cfg = serde_json::json!({
            "socketDir": work.join("sock"),
            "logLevel": "debug",
            // plexusd creates its stateDir at start: one the unit may write.
            "stateDir": work.join("state/plexus"),
            // As packaged: plugins are started by plexus-plugins.service.
            "pluginSpawner": crate::support::systemd::plugins_socket(&work),
        });
        for (k, v) in config.as_object().expect("config object") {
            cfg[k] = v.clone();
        }
        std::fs::write(
            work.join("daemon-config.json"),
            serde_json::to_vec_pretty(&cfg).unwrap(),
        )
        .unwrap();
        let (socket, service) = plexus_units(&work, true);
        let (plugins_socket, plugins_service) = plugin_units(&work, true);
        m.install_units(&[
            (SOCKET, &socket),
            (SERVICE, &service),
            (PLUGINS_SOCKET, &plugins_socket),
            (PLUGINS_SERVICE, &plugins_service),
        ]);
        Some(Plexus {
            sock: work.join("sock/plexus.sock"),
            m,
        })
    }

    pub(crate) fn get(&self, path: &str) -> io::Result<Response> {
        http::request(&self.sock, "GET", path, b"")
    }

    /// `GET path`, which must answer 200.
    pub(crate) fn get_ok(&self, path: &str) -> Response {
        match self.get(path) {
            Ok(r) if r.status == 200 => r,
            other => panic!("GET {path}: {other:?}\n{}", self.m.describe_failure()),
        }
    }

    /// Makes `conflist` the cluster network, its plugins searched in
    /// `bin_dir`, with the records in the unit's StateDirectory= (under the
    /// user manager: XDG_STATE_HOME), and starts the socket. Returns the
    /// attachment records' directory.
    pub(crate) fn serve_network(&self, conflist: serde_json::Value, bin_dir: &Path) -> PathBuf {
        let work = self.m.work_dir();
        let conf = work.join("net.d");
        std::fs::create_dir_all(&conf).unwrap();
        std::fs::write(conf.join("10-net.conflist"), conflist.to_string()).unwrap();
        let path = work.join("daemon-config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        cfg["confDir"] = serde_json::json!(conf);
        cfg["binDir"] = serde_json::json!(bin_dir);
        cfg["stateDir"] = serde_json::json!(work.join("state/plexus"));
        cfg["clusterNetwork"] = conflist["name"].clone();
        std::fs::write(&path, cfg.to_string()).unwrap();
        self.m.systemctl_ok(&["start", SOCKET]);
        work.join("state/plexus/attachments")
    }

    /// The environment and stdin of a plexus-shim call `cmd` for container
    /// `id` in the network namespace at `netns`, as `eth0`.
    pub(crate) fn shim_call(
        &self,
        cmd: &str,
        id: &str,
        netns: &str,
    ) -> (Vec<(String, String)>, Vec<u8>) {
        let env = [
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", id),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "IgnoreUnknown=1"),
            ("CNI_PATH", "/usr/lib/cni"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let stdin = serde_json::json!({
            "cniVersion": "1.0.0", "name": "plexus", "type": "plexus-shim",
            "daemonSocketDir": self.sock.parent().unwrap(),
        });
        (env, stdin.to_string().into_bytes())
    }

    pub(crate) fn main_pid(&self) -> u32 {
        self.m.show(SERVICE, "MainPID").parse().unwrap()
    }

    pub(crate) fn wait_active(&self) -> u32 {
        self.m
            .wait_property(SERVICE, "ActiveState", "active", STATE_TIMEOUT);
        let pid = self.main_pid();
        assert_ne!(pid, 0, "active plexusd.service without a MainPID");
        pid
    }
}

#[test]
fn socket_first_request_activates_service() {
    let Some(p) = Plexus::start(serde_json::json!({})) else {
        return;
    };
    p.m.systemctl_ok(&["start", SOCKET]);
    assert_eq!(p.m.show(SOCKET, "SubState"), "listening");

    let meta = std::fs::metadata(&p.sock)
        .unwrap_or_else(|e| panic!("socket node {}: {e}", p.sock.display()));
    assert!(
        meta.file_type().is_socket(),
        "{} is not a socket",
        p.sock.display()
    );
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o600,
        "SocketMode=0600 not applied"
    );
    assert_eq!((meta.uid(), meta.gid()), (0, 0), "SocketUser/Group=root");
    let dir = std::fs::metadata(p.sock.parent().unwrap()).unwrap();
    assert_eq!(
        dir.permissions().mode() & 0o7777,
        0o700,
        "DirectoryMode=0700 not applied"
    );
    assert_eq!(p.m.show(SERVICE, "ActiveState"), "inactive");
    assert_eq!(p.main_pid(), 0);

    let r = p.get_ok("/healthz");
    println!("first GET /healthz: {} {:?}", r.status, r.body_str());
    let pid = p.wait_active();
    println!("activated plexusd MainPID {pid}");

    let mut status = String::new();
    let serving = crate::support::systemd::poll_until(STATE_TIMEOUT, || {
        status = p.m.show(SERVICE, "StatusText");
        status.starts_with("serving")
    });
    assert!(
        serving,
        "StatusText {status:?} does not start with \"serving\"\n{}",
        p.m.describe_failure()
    );
    println!("StatusText: {status}");
    assert_eq!(p.get_ok("/readyz").status, 200);
    assert_eq!(
        p.main_pid(),
        pid,
        "a second request must not start another process"
    );
}

#[test]
fn service_invalid_config_fails_without_restart() {
    let Some(p) = Plexus::start(serde_json::json!({ "connectionLimit": 0 })) else {
        return;
    };
    p.m.systemctl_ok(&["start", SOCKET]);
    let out = p.m.systemctl(&["start", SERVICE]);
    assert!(
        !out.status.success(),
        "starting plexusd with an invalid config succeeded\n{}",
        p.m.describe_failure()
    );
    let props = [
        "ActiveState",
        "SubState",
        "Result",
        "ExecMainCode",
        "ExecMainStatus",
        "NRestarts",
        "ActiveEnterTimestampMonotonic",
        "MainPID",
    ];
    let s = p.m.show_all(SERVICE, &props);
    println!("after the failed start: {s:?}");
    // A unit scheduled for a restart would be activating/auto-restart here.
    assert_eq!(
        s["ActiveState"],
        "failed",
        "{s:?}\n{}",
        p.m.describe_failure()
    );
    assert_eq!(s["SubState"], "failed", "{s:?}");
    assert_eq!(s["Result"], "exit-code", "{s:?}");
    assert_eq!(
        s["ExecMainCode"], "1",
        "main process did not exit normally: {s:?}"
    );
    assert_eq!(s["ExecMainStatus"], "78", "{s:?}");
    assert_eq!(
        s["NRestarts"], "0",
        "RestartPreventExitStatus=78 ignored: {s:?}"
    );
    assert_eq!(
        s["ActiveEnterTimestampMonotonic"], "0",
        "it became active: {s:?}"
    );
    assert_eq!(s["MainPID"], "0", "{s:?}");
    // The socket unit itself stays usable for the next (fixed) start.
    assert_eq!(p.m.show(SOCKET, "ActiveState"), "active");
}

#[test]
fn service_restarts_under_load_lose_no_request() {
    const CLIENTS: usize = 4;
    const RESTARTS: usize = 5;
    const MIN_REQUESTS: usize = 500;
    let Some(p) = Plexus::start(serde_json::json!({})) else {
        return;
    };
    p.m.systemctl_ok(&["start", SOCKET]);
    p.get_ok("/healthz");
    let mut pids = vec![p.wait_active()];

    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (stop, total, sock) = (stop.clone(), total.clone(), p.sock.clone());
            thread::spawn(move || {
                let (mut ok, mut failures, mut worst) = (0usize, Vec::new(), Duration::ZERO);
                while !stop.load(Ordering::SeqCst) {
                    let t0 = Instant::now();
                    let r = http::request(&sock, "GET", "/healthz", b"");
                    worst = worst.max(t0.elapsed());
                    match r {
                        Ok(r) if r.status == 200 => ok += 1,
                        Ok(r) => failures.push(format!("status {} {:?}", r.status, r.body_str())),
                        Err(e) => failures.push(e.to_string()),
                    }
                    total.fetch_add(1, Ordering::SeqCst);
                }
                (ok, failures, worst)
            })
        })
        .collect();

    let progress = |n: usize| {
        let target = total.load(Ordering::SeqCst) + n;
        p.m.wait_for(
            &format!("{target} requests"),
            Duration::from_secs(30),
            || total.load(Ordering::SeqCst) >= target,
        );
    };
    let started = Instant::now();
    for i in 0..RESTARTS {
        progress(MIN_REQUESTS / (RESTARTS + 1) / 2);
        let t0 = Instant::now();
        p.m.systemctl_ok(&["restart", SERVICE]);
        let pid = p.main_pid();
        println!(
            "restart {} after {} requests took {:?} -> MainPID {pid}",
            i + 1,
            total.load(Ordering::SeqCst),
            t0.elapsed()
        );
        pids.push(pid);
    }
    let remaining = MIN_REQUESTS.saturating_sub(total.load(Ordering::SeqCst));
    progress(remaining.max(50));
    stop.store(true, Ordering::SeqCst);

    let (mut ok, mut failures, mut worst) = (0, Vec::new(), Duration::ZERO);
    for c in clients {
        let (o, f, w) = c.join().expect("client thread panicked");
        ok += o;
        failures.extend(f);
        worst = worst.max(w);
    }
    let requests = ok + failures.len();
    let distinct: BTreeSet<u32> = pids.iter().copied().filter(|&p| p != 0).collect();
    println!(
        "{requests} requests from {CLIENTS} clients in {:?}, {} failed; longest request {} ms; MainPIDs {pids:?}",
        started.elapsed(),
        failures.len(),
        worst.as_millis()
    );
    assert!(
        failures.is_empty(),
        "{} of {requests} requests failed, first ones: {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(10)],
        p.m.describe_failure()
    );
    assert!(requests >= MIN_REQUESTS, "only {requests} requests");
    assert!(
        distinct.len() > RESTARTS,
        "MainPID did not change on every restart: {pids:?}"
    );
    assert_eq!(
        p.m.show(SERVICE, "NRestarts"),
        "0",
        "restarts were manual only"
    );
}

#[test]
fn service_stop_keeps_socket_listening() {
    let Some(p) = Plexus::start(serde_json::json!({})) else {
        return;
    };
    p.m.systemctl_ok(&["start", SOCKET]);
    let inode = std::fs::metadata(&p.sock).unwrap().ino();
    p.get_ok("/healthz");
    let first = p.wait_active();

    let out = p.m.systemctl(&["stop", SERVICE]);
    assert!(
        out.status.success(),
        "stop: {out:?}\n{}",
        p.m.describe_failure()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.trim().is_empty() {
        println!("systemctl stop said: {}", stderr.trim());
    }
    let s = p.m.show_all(
        SERVICE,
        &["ActiveState", "Result", "ExecMainStatus", "MainPID"],
    );
    assert_eq!(
        s["ActiveState"],
        "inactive",
        "{s:?}\n{}",
        p.m.describe_failure()
    );
    assert_eq!(
        s["Result"], "success",
        "plexusd did not exit cleanly on SIGTERM: {s:?}"
    );
    assert_eq!(s["MainPID"], "0", "{s:?}");
    assert_eq!(p.m.show(SOCKET, "SubState"), "listening");
    let meta = std::fs::metadata(&p.sock).expect("socket node vanished on service stop");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.ino(), inode, "the socket node was re-created");

    p.get_ok("/healthz");
    let second = p.wait_active();
    assert_ne!(second, first, "no new process answered after the stop");
    println!("MainPID {first} stopped, the next request started {second}");
}

#[test]
fn units_offline_analysis_reports_nothing() {
    if let Some(why) = skip_reason() {
        println!("skipping: {why}");
        return;
    }
    let side_effect = Path::new("/run/systemd/systemd-units-load");
    let had_side_effect = side_effect.exists();
    let scratch = ScratchDir::new("analyze");
    let dir = scratch.path();
    let (socket, service) = plexus_units(dir, false);
    std::fs::write(dir.join(SOCKET), socket).unwrap();
    std::fs::write(dir.join(SERVICE), service).unwrap();
    let link = crate::support::systemd::SHIM_LINK_UNIT;
    std::fs::write(dir.join(link), crate::support::systemd::repo_unit(link)).unwrap();
    let (plugins_socket, plugins_service) = plugin_units(dir, false);
    std::fs::write(dir.join(PLUGINS_SOCKET), plugins_socket).unwrap();
    std::fs::write(dir.join(PLUGINS_SERVICE), plugins_service).unwrap();
    let socket_file = dir.join(SOCKET).display().to_string();
    let service_file = dir.join(SERVICE).display().to_string();
    let link_file = dir.join(link).display().to_string();
    let plugins_socket_file = dir.join(PLUGINS_SOCKET).display().to_string();
    let plugins_service_file = dir.join(PLUGINS_SERVICE).display().to_string();

    if skip_reason().is_some() {
        return;
    }
    assert_verifies(&[
        &socket_file,
        &service_file,
        &link_file,
        &plugins_socket_file,
        &plugins_service_file,
    ]);

    let out = analyze_offline(&["security", "--offline=yes", "--no-pager", &service_file])
        .expect("analyze ran once already");
    let text = String::from_utf8_lossy(&out.stdout);
    let overall = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("<no overall exposure line>");
    println!(
        "systemd-analyze security --offline=yes plexusd.service ({}): {}",
        out.status,
        overall.trim()
    );
    assert!(
        text.contains("Overall exposure level"),
        "systemd-analyze security did not run: {out:?}"
    );
    assert!(
        had_side_effect || !side_effect.exists(),
        "systemd-analyze left {} on the host",
        side_effect.display()
    );
}

/// The unit's sandbox (read-only file system, reduced capabilities, system
/// call filter) must still let Debian's plugins do their work: a real
/// bridge + host-local ADD and DEL through plexus-shim into a network
/// namespace, with host-local's store in its default place (/var/lib/cni,
/// one of the unit's ReadWritePaths).
#[test]
fn real_plugins_should_work_under_the_unit_sandbox() {
    use crate::support::netns::{Link, Netns, Subnet};
    if crate::support::systemd::skip_reason().is_some() {
        println!("skipping: no private systemd manager here");
        return;
    }
    // Held until /var/lib/cni is as this test found it.
    let _host = crate::support::lock::host_paths();
    let made_var_lib_cni = !Path::new("/var/lib/cni").exists();
    std::fs::create_dir_all("/var/lib/cni").unwrap();
    let bridge = Link::planned("b");
    let subnet = Subnet::new();
    let network = format!("sandbox-{}", bridge.name);
    let store = PathBuf::from("/var/lib/cni/networks").join(&network);
    struct Cleanup(PathBuf, bool);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
            if self.1 {
                let _ = std::fs::remove_dir("/var/lib/cni/networks");
                let _ = std::fs::remove_dir("/var/lib/cni");
            }
        }
    }
    let _cleanup = Cleanup(store.clone(), made_var_lib_cni);

    // Before the manager: the harness runs it in a private mount namespace,
    // which sees the host's mounts (this namespace's bind mount among them)
    // only as they were when it started. A system manager's services are
    // mount slaves of the host and see later namespaces too.
    let ns = Netns::new();
    let Some(p) = Plexus::start(serde_json::json!({})) else {
        return;
    };
    let work = p.m.work_dir().to_path_buf();
    let records = p.serve_network(
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": network,
            "plugins": [{"type": "bridge", "bridge": bridge.name,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet.cidr()}]]}}]
        }),
        Path::new("/usr/lib/cni"),
    );
    let call = |cmd: &str| {
        let (env, stdin) = p.shim_call(cmd, "sandboxed-1", &ns.path);
        crate::support::shim::run(env, &stdin)
    };
    let add = call("ADD");
    assert_eq!(
        add.code,
        Some(0),
        "{add:?}\n{}\n{}",
        p.m.describe_failure(),
        std::fs::read_to_string(work.join("plexusd.log")).unwrap_or_default()
    );
    let addr = add.json()["ips"][0]["address"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(subnet.holds(&addr), "{addr}");
    let eth0 = ns.iface("eth0").expect("no eth0 in the namespace");
    assert!(eth0.has_addr(&addr), "{eth0:?}");
    assert!(store.join(addr.split('/').next().unwrap()).exists());
    assert!(records.join("sandboxed-1.json").exists());
    // The plugins ran in plexus-plugins.service, started by the first ADD.
    assert_eq!(p.m.show(PLUGINS_SERVICE, "ActiveState"), "active");

    let del = call("DEL");
    assert_eq!(del.code, Some(0), "{del:?}");
    assert!(!ns.has_link("eth0"));
    assert!(!store.join(addr.split('/').next().unwrap()).exists());
    assert!(!records.join("sandboxed-1.json").exists());
}

/// A manager with the plexus units, a fresh network namespace (made
/// before the manager: it sees the namespaces of that moment), the work
/// dir and an empty `<work>/bin` for plugins; `None` (after saying why)
/// where no private manager can run.
fn plexus_with_bin() -> Option<(crate::support::netns::Netns, Plexus, PathBuf, PathBuf)> {
    if crate::support::systemd::skip_reason().is_some() {
        println!("skipping: no private systemd manager here");
        return None;
    }
    let ns = crate::support::netns::Netns::new();
    let p = Plexus::start(serde_json::json!({}))?;
    let work = p.m.work_dir().to_path_buf();
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    Some((ns, p, work, bin))
}

/// Writes an executable bash CNI plugin at `path` that reads its stdin,
/// answers VERSION (0.4.0 and 1.0.0) and runs `cases` (arms of a `case` on
/// `$CNI_COMMAND`); other commands do nothing and succeed.
fn script_plugin(path: &Path, cases: &str) {
    let script = format!(
        "#!/bin/bash\ncat >/dev/null\ncase \"$CNI_COMMAND\" in\n\
         VERSION) echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}}' ;;\n\
         {cases}\n*) ;;\nesac\nexit 0\n"
    );
    std::fs::write(path, script).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A daemon killed by SIGKILL in the middle of an ADD: systemd kills the
/// plugin it left running (KillMode=mixed, the unit's cgroup) and restarts
/// the daemon, and the next DEL cleans up from the attachment record.
#[test]
fn plugins_of_a_killed_daemon_should_die_with_it_and_del_should_clean_up() {
    let Some((ns, p, work, bin)) = plexus_with_bin() else {
        return;
    };
    let marker = work.join("slow.started");
    let del_log = work.join("slow.del");
    let sleeper = format!("{}/slow-sleep", bin.display());
    script_plugin(
        &bin.join("slow"),
        &format!(
            "ADD) touch '{}'; exec -a '{sleeper}' sleep 1000 ;;\n\
             DEL) echo \"DEL $CNI_CONTAINERID\" >> '{}' ;;",
            marker.display(),
            del_log.display()
        ),
    );
    let records = p.serve_network(
        serde_json::json!({"cniVersion": "1.0.0", "name": "slow", "plugins": [{"type": "slow"}]}),
        &bin,
    );
    let (add_env, stdin) = p.shim_call("ADD", "killed-1", &ns.path);
    let (del_env, _) = p.shim_call("DEL", "killed-1", &ns.path);
    let add = crate::support::shim::spawn(add_env, &stdin);
    let orphans = || crate::support::cni::processes_matching(&sleeper);
    // The script touches the marker before it execs the sleeper: wait for
    // the sleeper itself.
    let started = crate::support::systemd::poll_until(STATE_TIMEOUT, || {
        marker.exists() && !orphans().is_empty()
    });
    assert!(
        started,
        "the slow plugin never ran\n{}",
        p.m.describe_failure()
    );
    let first = p.wait_active();
    assert_eq!(orphans().len(), 1, "{:?}", orphans());
    // SAFETY: kill(2) on the service's main process, which this test runs.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    let gone = crate::support::systemd::poll_until(STATE_TIMEOUT, || orphans().is_empty());
    assert!(gone, "systemd left the plugin running: {:?}", orphans());
    let add = crate::support::shim::finish(add);
    assert_eq!(add.code, Some(1), "{add:?}");

    // The next call reaches a new daemon (socket activation), whose DEL
    // works from the record the killed one wrote before the plugin ran.
    let del = crate::support::shim::run(del_env, &stdin);
    assert_eq!(del.code, Some(0), "{del:?}\n{}", p.m.describe_failure());
    assert_ne!(p.main_pid(), first);
    let dels = std::fs::read_to_string(&del_log).unwrap_or_default();
    assert_eq!(dels.trim(), "DEL killed-1");
    assert!(!records.join("killed-1.json").exists());
}

/// The plugin spawner killed by SIGKILL while a plugin runs: systemd kills
/// the plugin with it, the ADD fails and is rolled back, and the next
/// call starts a new spawner (socket activation) and works.
#[test]
fn a_killed_spawner_should_fail_its_calls_and_the_next_should_start_a_new_one() {
    let Some((ns, p, work, bin)) = plexus_with_bin() else {
        return;
    };
    let marker = work.join("slow.started");
    let sleeper = format!("{}/slowspawn-sleep", bin.display());
    // The first ADD hangs; the later ones answer at once.
    script_plugin(
        &bin.join("slowspawn"),
        &format!(
            "ADD) if [ ! -e '{m}' ]; then touch '{m}'; exec -a '{sleeper}' sleep 1000; fi\n\
             echo '{{\"cniVersion\":\"1.0.0\"}}' ;;",
            m = marker.display(),
        ),
    );
    let records = p.serve_network(
        serde_json::json!({"cniVersion": "1.0.0", "name": "slowspawn",
                           "plugins": [{"type": "slowspawn"}]}),
        &bin,
    );
    let (add_env, stdin) = p.shim_call("ADD", "spawnkill-1", &ns.path);
    let add = crate::support::shim::spawn(add_env, &stdin);
    let plugins = || crate::support::cni::processes_matching(&sleeper);
    // The marker is touched before the exec: wait for the sleeper itself.
    let started = crate::support::systemd::poll_until(STATE_TIMEOUT, || {
        marker.exists() && !plugins().is_empty()
    });
    assert!(started, "the plugin never ran\n{}", p.m.describe_failure());
    p.m.wait_property(PLUGINS_SERVICE, "ActiveState", "active", STATE_TIMEOUT);
    let spawner: u32 = p.m.show(PLUGINS_SERVICE, "MainPID").parse().unwrap();
    assert_eq!(plugins().len(), 1, "{:?}", plugins());
    let daemon = p.main_pid();
    // SAFETY: kill(2) on the spawner's main process, which this test runs.
    unsafe { libc::kill(spawner as i32, libc::SIGKILL) };
    let gone = crate::support::systemd::poll_until(STATE_TIMEOUT, || plugins().is_empty());
    assert!(gone, "the plugin outlived its spawner: {:?}", plugins());
    let add = crate::support::shim::finish(add);
    assert_eq!(add.code, Some(1), "{add:?}");
    assert!(add.stdout.contains("slowspawn"), "{add:?}");
    // The failed ADD was rolled back (its DEL through a new spawner).
    assert!(!records.join("spawnkill-1.json").exists());
    // plexusd stayed; the next ADD starts a new spawner and works.
    let (env, stdin) = p.shim_call("ADD", "spawnkill-2", &ns.path);
    let next = crate::support::shim::run(env, &stdin);
    assert_eq!(next.code, Some(0), "{next:?}\n{}", p.m.describe_failure());
    assert_eq!(p.main_pid(), daemon);
    let new_spawner: u32 = p.m.show(PLUGINS_SERVICE, "MainPID").parse().unwrap();
    assert_ne!(new_spawner, spawner);
    let (env, stdin) = p.shim_call("DEL", "spawnkill-2", &ns.path);
    assert_eq!(crate::support::shim::run(env, &stdin).code, Some(0));
}

/// plexus-shim-link.service (pointed at a directory of the work dir instead
/// of /opt/cni/bin): no directory, no link and no directory made; an
/// existing directory gets the link; a file or link of another owner at
/// the name is never replaced.
#[test]
fn shim_link_unit_should_link_only_into_an_existing_dir_and_replace_nothing() {
    use crate::support::systemd::{repo_unit, shim_link_unit, SHIM_LINK_UNIT as UNIT};
    let Some(m) = Manager::start() else {
        return;
    };
    let work = m.work_dir().to_path_buf();
    let opt = work.join("opt");
    let dir = opt.join("cni/bin");
    let link = dir.join("plexus-shim");
    let shim = work.join("usr/lib/cni/plexus-shim");
    std::fs::create_dir_all(shim.parent().unwrap()).unwrap();
    std::fs::copy(crate::support::shim::SHIM, &shim).unwrap();
    let unit = shim_link_unit(&repo_unit(UNIT), &dir, &shim, &work.join("shim-link.log"));
    m.install_units(&[(UNIT, &unit)]);
    // `systemctl start` waits for the oneshot; its status says whether the
    // unit failed (a unit that ended well is unloaded at once, so its
    // properties would say nothing).
    let start = |what: &str| {
        let out = m.systemctl(&["start", UNIT]);
        println!("{what}: {}", out.status);
        out.status.success()
    };

    // No /opt/cni/bin: skipped, and nothing is created.
    assert!(start("no directory"), "{}", m.describe_failure());
    assert!(!opt.exists(), "the unit created {}", opt.display());

    // The directory exists: the link is made.
    std::fs::create_dir_all(&dir).unwrap();
    assert!(start("directory"), "{}", m.describe_failure());
    assert_eq!(
        std::fs::read_link(&link).ok(),
        Some(shim.clone()),
        "{}",
        m.describe_failure()
    );
    // Later runs (every boot) find it there and leave it.
    assert!(start("linked already"), "{}", m.describe_failure());
    assert_eq!(std::fs::read_link(&link).unwrap(), shim);

    // Someone else's file or link at the name is left as it is.
    std::fs::remove_file(&link).unwrap();
    std::fs::write(&link, "another plexus-shim").unwrap();
    assert!(start("a file of another owner"), "{}", m.describe_failure());
    let md = std::fs::symlink_metadata(&link).unwrap();
    assert!(md.file_type().is_file(), "{md:?}");
    assert_eq!(
        std::fs::read_to_string(&link).unwrap(),
        "another plexus-shim"
    );
    std::fs::remove_file(&link).unwrap();
    let other = work.join("other-shim");
    std::fs::write(&other, "").unwrap();
    std::os::unix::fs::symlink(&other, &link).unwrap();
    assert!(start("a link of another owner"), "{}", m.describe_failure());
    assert_eq!(std::fs::read_link(&link).unwrap(), other);
    // Even one that points nowhere: the unit fails, visibly, and the link
    // stays.
    std::fs::remove_file(&other).unwrap();
    assert!(!start("a dangling link of another owner"));
    assert_eq!(m.show(UNIT, "Result"), "exit-code");
    assert_eq!(std::fs::read_link(&link).unwrap(), other);
}

/// The shipped sandbox (ProtectSystem=strict with the unit's
/// ReadWritePaths=) must let plexusd write what it writes by default:
/// here the device-info file of a NetworkAttachmentDefinition with a
/// `resourceName`, copied from the device plugin's before the network's
/// plugin runs, shown in the pod's network-status and removed by DEL.
/// The unit's ReadWritePaths= and the package's tmpfiles.d are moved into
/// a root on the root file system (`<root>/var/run` a link to `../run`, as
/// on a host), and deviceInfoDir is the default path below that root. Not
/// below /run: under this unit systemd 252 keeps all of /run writable
/// (see [`Manager::root_fs_dir`]), an accident the unit must not rely on.
#[test]
fn the_unit_sandbox_should_let_plexusd_write_device_info_files() {
    use crate::support::kube::{pod_args, FakeApi, NODE};
    use crate::support::kubelet::FakeKubelet;
    use crate::support::netns::Netns;
    use crate::support::systemd::reroot_read_write_paths;
    const RESOURCE: &str = "example.com/nic";
    const DEVICE: &str = "0000:00:0a.0";
    if skip_reason().is_some() {
        println!("skipping: no private systemd manager here");
        return;
    }
    // Before the manager, whose mount namespace sees only the netns
    // mounts made before it started.
    let ns = Netns::new();
    let Some(m) = Manager::start() else {
        return;
    };
    let work = m.work_dir().to_path_buf();
    let root = m.root_fs_dir().join("root");
    std::fs::create_dir_all(root.join("var")).unwrap();
    std::os::unix::fs::symlink("../run", root.join("var/run")).unwrap();
    let tmpfiles = std::process::Command::new("systemd-tmpfiles")
        .arg("--create")
        .arg(format!("--root={}", root.display()))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/plexus.tmpfiles"))
        .output()
        .unwrap();
    assert!(tmpfiles.status.success(), "{tmpfiles:?}");
    let devinfo = root.join(plexus::device_info::DEFAULT_DIR.strip_prefix('/').unwrap());
    // A fake plugin for both networks, in a directory plexusd only reads.
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let plugin = "#!/bin/bash\ncat >/dev/null\ncase \"$CNI_COMMAND\" in\n\
         VERSION) echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.4.0\",\"1.0.0\"]}' ;;\n\
         ADD) echo \"{\\\"cniVersion\\\":\\\"1.0.0\\\",\\\"interfaces\\\":[{\\\"name\\\":\\\"$CNI_IFNAME\\\",\\\"sandbox\\\":\\\"$CNI_NETNS\\\"}]}\" ;;\n\
         esac\nexit 0\n";
    std::fs::write(bin.join("fake"), plugin).unwrap();
    std::fs::set_permissions(bin.join("fake"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let net = |name: &str| {
        serde_json::json!({"cniVersion": "1.0.0", "name": name,
            "plugins": [{"type": "fake", "capabilities": {"deviceID": true}}]})
    };
    let conf = work.join("net.d");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("10-cluster.conflist"), net("cluster").to_string()).unwrap();

    let api = FakeApi::start();
    api.put_nad(
        "ns1",
        "red",
        Some(&net("red-net").to_string()),
        serde_json::json!({"k8s.v1.cni.cncf.io/resourceName": RESOURCE}),
    );
    api.put_pod(
        "ns1",
        "p",
        "uid-p",
        NODE,
        serde_json::json!({"k8s.v1.cni.cncf.io/networks": "red"}),
    );
    let kubelet = FakeKubelet::start(&work.join("kubelet.sock"));
    kubelet.set_pod("ns1", "p", &[&[(RESOURCE, &[DEVICE])]]);
    api.write_kubeconfig(&work.join("kubeconfig"));

    let config = serde_json::json!({
        "socketDir": work.join("sock"),
        "stateDir": work.join("state/plexus"),
        "logLevel": "debug",
        "confDir": conf,
        // As packaged: /opt/cni/bin first, which this node lacks.
        "binDir": format!("{}:{}", root.join("opt/cni/bin").display(), bin.display()),
        "clusterNetwork": "cluster",
        "kubeconfig": work.join("kubeconfig"),
        "nodeName": NODE,
        "kubernetesRequestTimeout": "5s",
        "podResourcesSocket": work.join("kubelet.sock"),
        "deviceCheckpointFile": work.join("no-checkpoint"),
        "deviceInfoDir": root.join("var/run/k8s.cni.cncf.io/devinfo"),
    });
    std::fs::write(work.join("daemon-config.json"), config.to_string()).unwrap();
    let (socket, service) = plexus_units(&work, true);
    let sandboxed = reroot_read_write_paths(&service, &root);
    // The sandbox itself is the shipped one.
    for option in ["ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=yes"] {
        assert!(sandboxed.contains(option), "{option} is gone:\n{sandboxed}");
    }
    m.install_units(&[(SOCKET, &socket), (SERVICE, &sandboxed)]);
    m.systemctl_ok(&["start", SOCKET]);
    let sock = work.join("sock/plexus.sock");
    // plexusd runs before the device plugin writes its first file: the
    // directories it may write are fixed when it starts.
    let healthz = crate::support::http::request(&sock, "GET", "/healthz", b"");
    assert!(
        healthz.as_ref().is_ok_and(|r| r.status == 200),
        "{healthz:?}\n{}",
        m.describe_failure()
    );
    m.wait_property(SERVICE, "ActiveState", "active", STATE_TIMEOUT);
    // Then the device plugin's file (the plugin runs outside plexusd's
    // sandbox).
    let dp = devinfo.join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let device_info = r#"{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:00:0a.0"}}"#;
    std::fs::write(
        dp.join(format!("example.com-nic-{DEVICE}-device.json")),
        device_info,
    )
    .unwrap();

    let call = |command: &str| {
        let env: Vec<(String, String)> = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "devinfo-1"),
            ("CNI_NETNS", ns.path.as_str()),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", &pod_args("ns1", "p", "uid-p")),
            ("CNI_PATH", "/usr/lib/cni"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let stdin = serde_json::json!({"cniVersion": "1.0.0", "name": "plexus",
            "type": "plexus-shim", "daemonSocketDir": sock.parent().unwrap()});
        crate::support::shim::run(env, stdin.to_string().as_bytes())
    };
    let log = || std::fs::read_to_string(work.join("plexusd.log")).unwrap_or_default();

    let add = call("ADD");
    assert_eq!(add.code, Some(0), "{add:?}\n{}", m.describe_failure());
    let file = devinfo.join("cni").join("ns1-red-devinfo-1_net1");
    assert_eq!(
        std::fs::read_to_string(&file).ok().as_deref(),
        Some(device_info),
        "plexusd did not write {} under the sandbox\n{}",
        file.display(),
        log()
    );
    let status: serde_json::Value =
        serde_json::from_str(&api.network_status("ns1", "p").expect("no network-status")).unwrap();
    let net1 = status
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["interface"] == "net1")
        .unwrap_or_else(|| panic!("no net1 in {status}"));
    assert_eq!(
        net1["device-info"]["pci"]["pci-address"], DEVICE,
        "{status}"
    );

    let del = call("DEL");
    assert_eq!(del.code, Some(0), "{del:?}\n{}", m.describe_failure());
    assert!(!file.exists(), "DEL left {}\n{}", file.display(), log());
    assert!(
        !log().contains("cannot copy a device plugin's device-info file"),
        "{}",
        log()
    );
}
