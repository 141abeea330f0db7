//! An upgrade in place during a pod storm: the built .deb installed with
//! dpkg under a private systemd manager, then a newer build of it (the
//! same package, version bumped) installed over it 20 times while CNI
//! calls run without a pause, then removed and purged.
//!
//! How dpkg is kept off the host: dpkg, its maintainer scripts and the
//! daemon all run in the manager's private mount namespace, where `/etc`,
//! `/usr` and `/var` are overlays whose writable layers live in the
//! manager's work dir. dpkg sees the host's database (so the package's
//! dependencies are met) but writes only to the overlay; the host's
//! database never lists plexus. The maintainer scripts' `systemctl`,
//! `deb-systemd-helper` and `deb-systemd-invoke` go to the private manager
//! (the wrappers of [`crate::packaging_scripts::write_tools`]). The manager loads
//! the installed units through links to `/lib/systemd/system` plus
//! drop-ins that only move the socket into the work dir and the output
//! into a log file: the ExecStart is the package's own `/usr/bin/plexusd`
//! with `/etc/plexus/daemon-config.json`, both replaced by every upgrade.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::packaging::packages;
use crate::packaging_scripts::write_tools;
use crate::support::netns::Netns;
use crate::support::systemd::{skip_reason, Manager};

const UPGRADES: usize = 20;
const CLIENTS: usize = 4;
const SOCKET: &str = "plexusd.socket";
const SERVICE: &str = "plexusd.service";
const PLUGINS_SOCKET: &str = "plexus-plugins.socket";
const PLUGINS_SERVICE: &str = "plexus-plugins.service";
const CONFFILE: &str = "/etc/plexus/daemon-config.json";
/// Longest one dpkg run may take.
const DPKG_TIMEOUT: &str = "60";

/// Runs `args` in the manager's mount namespace with the wrappers in
/// `tools` first on PATH, stdin closed (a dpkg conffile prompt would fail
/// the run rather than wait).
fn in_manager(m: &Manager, tools: &Path, args: &[&str]) -> Output {
    Command::new("nsenter")
        .arg("--mount")
        .arg(format!("--target={}", m.pid()))
        .args(["--", "timeout", "-k", "5", DPKG_TIMEOUT])
        .args(args)
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", tools.display()),
        )
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .output()
        .expect("run nsenter")
}

fn in_manager_ok(m: &Manager, tools: &Path, args: &[&str]) -> String {
    let out = in_manager(m, tools, args);
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        m.describe_failure()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The package with `Version:` set to `version`, built from the unpacked
/// tree `tree` into `out` (uncompressed: quick to build and to unpack).
fn repack(tree: &Path, version: &str, out: &Path) {
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("Version:") {
                format!("Version: {version}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&control, text).unwrap();
    let st = Command::new("dpkg-deb")
        .args(["-Znone", "--build"])
        .arg(tree)
        .arg(out)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "dpkg-deb --build {version}");
}

/// The lines of `ss -xlpn` for sockets listening at `path`.
fn listening(path: &Path) -> Vec<String> {
    let out = Command::new("ss").args(["-xlpn"]).output().unwrap();
    assert!(out.status.success(), "ss -xlpn");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().any(|f| Path::new(f) == path))
        .map(str::to_string)
        .collect()
}

fn plexusd_processes(m: &Manager) -> BTreeSet<u32> {
    m.processes()
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() == "plexusd")
                .unwrap_or(false)
        })
        .collect()
}

fn host_has_plexus() -> bool {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "plexus"])
        .output()
        .unwrap();
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("installed")
}

/// What the CNI call threads saw.
#[derive(Default)]
struct Tally {
    calls: usize,
    failures: Vec<String>,
    longest: Duration,
}

#[test]
fn deb_upgrades_in_place_under_a_pod_storm_should_lose_no_call() {
    if let Some(why) = skip_reason() {
        println!("skipping: {why}");
        return;
    }
    for tool in ["dpkg", "dpkg-deb", "ss"] {
        if Command::new(tool).arg("--version").output().is_err() {
            println!("skipping: {tool} is not installed");
            return;
        }
    }
    assert!(!host_has_plexus(), "plexus is installed on this host");
    let (deb, _) = packages();
    let base = String::from_utf8_lossy(
        &Command::new("dpkg-deb")
            .args(["-f"])
            .arg(deb)
            .arg("Version")
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .to_string();

    // Before the manager: its mount namespace sees only the network
    // namespaces that exist when it starts.
    let namespaces: Vec<Netns> = (0..CLIENTS).map(|_| Netns::new()).collect();
    let Some(m) = Manager::start() else {
        return;
    };
    let work = m.work_dir().to_path_buf();
    let tools = work.join("tools");
    write_tools(&m, &tools);

    // The newer builds: the same package, version <base>+upN.
    let debs = work.join("debs");
    let tree = work.join("debs/tree");
    std::fs::create_dir_all(&debs).unwrap();
    let st = Command::new("dpkg-deb")
        .arg("-R")
        .arg(deb)
        .arg(&tree)
        .status()
        .unwrap();
    assert!(st.success(), "dpkg-deb -R");
    let first = debs.join("plexus-0.deb");
    std::fs::copy(deb, &first).unwrap();
    let newer: Vec<(String, PathBuf)> = (1..=UPGRADES)
        .map(|i| {
            let version = format!("{base}+up{i}");
            let out = debs.join(format!("plexus-{i}.deb"));
            repack(&tree, &version, &out);
            (version, out)
        })
        .collect();

    // Overlays over /etc, /usr and /var in the manager's namespace only.
    let ov = work.join("overlay");
    let mut mounts = String::from("set -e");
    for d in ["etc", "usr", "var"] {
        let (u, w) = (ov.join(d).join("upper"), ov.join(d).join("work"));
        std::fs::create_dir_all(&u).unwrap();
        std::fs::create_dir_all(&w).unwrap();
        mounts.push_str(&format!(
            "; mount -t overlay plexus-upgrade -o lowerdir=/{d},upperdir={},workdir={} /{d}",
            u.display(),
            w.display()
        ));
    }
    // man-db's trigger would rebuild its index on every install.
    mounts.push_str("; rm -f /var/lib/man-db/auto-update");
    in_manager_ok(&m, &tools, &["sh", "-c", &mounts]);

    // The manager's unit directory: links to the installed units, and
    // drop-ins that move the socket and the output.
    let units = work.join("units");
    let sock = work.join("sock/plexus.sock");
    let plugins_sock = work.join("sock/plugins.sock");
    let log = work.join("plexusd.log");
    for unit in [SOCKET, SERVICE, PLUGINS_SOCKET, PLUGINS_SERVICE] {
        std::os::unix::fs::symlink(
            Path::new("/lib/systemd/system").join(unit),
            units.join(unit),
        )
        .unwrap();
    }
    std::fs::create_dir_all(units.join("plexusd.socket.d")).unwrap();
    std::fs::write(
        units.join("plexusd.socket.d/test.conf"),
        format!("[Socket]\nListenStream=\nListenStream={}\n", sock.display()),
    )
    .unwrap();
    std::fs::create_dir_all(units.join("plexus-plugins.socket.d")).unwrap();
    std::fs::write(
        units.join("plexus-plugins.socket.d/test.conf"),
        format!(
            "[Socket]\nListenSequentialPacket=\nListenSequentialPacket={}\n",
            plugins_sock.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(units.join("plexus-plugins.service.d")).unwrap();
    std::fs::write(
        units.join("plexus-plugins.service.d/test.conf"),
        format!(
            "[Unit]\nStartLimitIntervalSec=0\n[Service]\nStandardOutput=append:{0}\nStandardError=append:{0}\n",
            work.join("plexus-plugins.log").display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(units.join("plexusd.service.d")).unwrap();
    std::fs::write(
        units.join("plexusd.service.d/test.conf"),
        format!(
            "[Unit]\nStartLimitIntervalSec=0\n[Service]\nStandardOutput=append:{0}\nStandardError=append:{0}\n",
            log.display()
        ),
    )
    .unwrap();

    let dpkg = |args: &[&str]| -> Duration {
        let t0 = Instant::now();
        let mut a = vec!["dpkg", "--log=/dev/null"];
        a.extend_from_slice(args);
        in_manager_ok(&m, &tools, &a);
        t0.elapsed()
    };

    // Install; the postinst enables and starts the socket.
    dpkg(&["--install", first.to_str().unwrap()]);
    assert_eq!(m.show(SOCKET, "SubState"), "listening");
    // The admin's change to the conffile: this node's socket, networks and
    // a cluster network of loopback only.
    let conf_in_ns = PathBuf::from(format!("/proc/{}/root{CONFFILE}", m.pid()));
    let net_d = work.join("net.d");
    std::fs::create_dir_all(&net_d).unwrap();
    std::fs::write(
        net_d.join("10-lo.conflist"),
        serde_json::json!({"cniVersion": "1.0.0", "name": "upgrade-lo",
                           "plugins": [{"type": "loopback"}]})
        .to_string(),
    )
    .unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conf_in_ns).unwrap()).unwrap();
    cfg["socketDir"] = serde_json::json!(sock.parent().unwrap());
    // The package's plugin spawner, at this node's socket.
    assert_eq!(cfg["pluginSpawner"], "/run/plexus/plugins.sock");
    cfg["pluginSpawner"] = serde_json::json!(plugins_sock);
    cfg["confDir"] = serde_json::json!(net_d);
    cfg["clusterNetwork"] = serde_json::json!("upgrade-lo");
    cfg["logLevel"] = serde_json::json!("debug");
    // The unit's StateDirectory= (under a user manager: XDG_STATE_HOME);
    // ProtectSystem=strict leaves /var/lib/plexus read-only here.
    cfg["stateDir"] = serde_json::json!(work.join("state/plexus"));
    let modified = serde_json::to_string_pretty(&cfg).unwrap();
    std::fs::write(&conf_in_ns, &modified).unwrap();

    let socket_props = ["ActiveEnterTimestampMonotonic", "NRefused", "InvocationID"];
    let socket_before = m.show_all(SOCKET, &socket_props);
    let inode_before = std::fs::metadata(&sock).unwrap().ino();
    let listening_before = listening(&sock);
    assert_eq!(listening_before.len(), 1, "{listening_before:?}");

    // The storm: each client ADDs and DELs a fresh container in its own
    // namespace, without a pause.
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = namespaces
        .iter()
        .enumerate()
        .map(|(c, ns)| {
            let (stop, total) = (stop.clone(), total.clone());
            let netns = ns.path.clone();
            let stdin = serde_json::json!({
                "cniVersion": "1.0.0", "name": "plexus", "type": "plexus-shim",
                "daemonSocketDir": sock.parent().unwrap(),
            })
            .to_string();
            thread::spawn(move || {
                let mut t = Tally::default();
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let id = format!("upgrade-{c}-{i}");
                    for cmd in ["ADD", "DEL"] {
                        let env = [
                            ("CNI_COMMAND", cmd),
                            ("CNI_CONTAINERID", id.as_str()),
                            ("CNI_NETNS", netns.as_str()),
                            ("CNI_IFNAME", "eth0"),
                            ("CNI_PATH", "/usr/lib/cni"),
                        ];
                        let t0 = Instant::now();
                        let run = crate::support::shim::run(env, stdin.as_bytes());
                        t.longest = t.longest.max(t0.elapsed());
                        t.calls += 1;
                        if run.code != Some(0) {
                            t.failures
                                .push(format!("{cmd} {id}: {:?} {}", run.code, run.stdout));
                        }
                        total.fetch_add(1, Ordering::SeqCst);
                    }
                }
                t
            })
        })
        .collect();
    let progress = |n: usize| {
        let target = total.load(Ordering::SeqCst) + n;
        m.wait_for(
            &format!("{target} CNI calls"),
            Duration::from_secs(30),
            || total.load(Ordering::SeqCst) >= target,
        );
    };
    progress(20);
    let first_pid = m.show(SERVICE, "MainPID");
    assert_ne!(first_pid, "0", "the calls did not start plexusd");

    let started = Instant::now();
    let calls_before = total.load(Ordering::SeqCst);
    let mut pids = vec![first_pid];
    // Each start of the service has an invocation id of its own (pids may
    // be reused once they wrap).
    let mut invocations = vec![m.show(SERVICE, "InvocationID")];
    let mut spawner_invocations = vec![m.show(PLUGINS_SERVICE, "InvocationID")];
    let mut times = Vec::new();
    for (version, deb) in &newer {
        times.push(dpkg(&["--install", deb.to_str().unwrap()]));
        let installed = in_manager_ok(
            &m,
            &tools,
            &["dpkg-query", "-W", "-f=${Version} ${Status}", "plexus"],
        );
        assert_eq!(installed, format!("{version} install ok installed"));
        pids.push(m.show(SERVICE, "MainPID"));
        invocations.push(m.show(SERVICE, "InvocationID"));
        spawner_invocations.push(m.show(PLUGINS_SERVICE, "InvocationID"));
        // Calls keep flowing between upgrades, so every upgrade meets a
        // running daemon with work in flight.
        progress(2 * CLIENTS);
    }
    let upgrades_took = started.elapsed();
    let calls_during = total.load(Ordering::SeqCst) - calls_before;
    stop.store(true, Ordering::SeqCst);
    let mut tally = Tally::default();
    for c in clients {
        let t = c.join().expect("client thread panicked");
        tally.calls += t.calls;
        tally.failures.extend(t.failures);
        tally.longest = tally.longest.max(t.longest);
    }
    let slowest = times.iter().max().copied().unwrap_or_default();
    println!(
        "{UPGRADES} upgrades in {upgrades_took:?} ({:?} each on average, slowest dpkg run {slowest:?}); \
         {} CNI calls from {CLIENTS} clients ({calls_during} during the upgrades), {} failed; \
         longest call {} ms; MainPIDs {pids:?}",
        upgrades_took / UPGRADES as u32,
        tally.calls,
        tally.failures.len(),
        tally.longest.as_millis()
    );
    assert!(
        tally.failures.is_empty(),
        "{} of {} calls failed, first ones: {:#?}\n{}",
        tally.failures.len(),
        tally.calls,
        &tally.failures[..tally.failures.len().min(10)],
        m.describe_failure()
    );
    // Every upgrade restarted the daemon (the new binary runs)...
    let distinct: BTreeSet<&String> = invocations.iter().filter(|i| !i.is_empty()).collect();
    assert_eq!(
        distinct.len(),
        UPGRADES + 1,
        "not every upgrade restarted plexusd: invocations {invocations:?}, MainPIDs {pids:?}"
    );
    // ... and the plugin spawner (the new binary starts the plugins)...
    let distinct: BTreeSet<&String> = spawner_invocations
        .iter()
        .filter(|i| !i.is_empty())
        .collect();
    assert_eq!(
        distinct.len(),
        UPGRADES + 1,
        "not every upgrade restarted the plugin spawner: {spawner_invocations:?}"
    );
    // ... and none the socket.
    assert_eq!(m.show_all(SOCKET, &socket_props), socket_before);
    assert_eq!(
        std::fs::metadata(&sock).unwrap().ino(),
        inode_before,
        "the socket node was recreated"
    );
    let listening_after = listening(&sock);
    let kernel_inode = |l: &[String]| -> Vec<String> {
        l.iter()
            .filter_map(|l| l.split_whitespace().nth(6).map(str::to_string))
            .collect()
    };
    assert_eq!(
        kernel_inode(&listening_after),
        kernel_inode(&listening_before),
        "another listening socket: {listening_before:?} -> {listening_after:?}"
    );
    // The admin's conffile survived every upgrade, without a prompt (stdin
    // is closed: a prompt would have failed dpkg).
    assert_eq!(std::fs::read_to_string(&conf_in_ns).unwrap(), modified);
    // One daemon: the last one.
    let daemons = plexusd_processes(&m);
    let main: u32 = m.show(SERVICE, "MainPID").parse().unwrap();
    assert_eq!(
        daemons,
        BTreeSet::from([main]),
        "plexusd processes of this manager"
    );

    // Removal stops everything; purge leaves nothing.
    dpkg(&["--remove", "plexus"]);
    m.wait_for("plexusd to exit", Duration::from_secs(30), || {
        plexusd_processes(&m).is_empty()
    });
    let left = listening(&sock);
    assert!(left.is_empty(), "still listening after remove: {left:?}");
    dpkg(&["--purge", "plexus"]);
    assert!(plexusd_processes(&m).is_empty());
    assert!(listening(&sock).is_empty());
    assert!(
        std::fs::symlink_metadata(&sock).is_err(),
        "{} is left after purge",
        sock.display()
    );
    assert!(
        std::fs::symlink_metadata(&plugins_sock).is_err(),
        "{} is left after purge",
        plugins_sock.display()
    );
    for unit in [SOCKET, SERVICE, PLUGINS_SOCKET, PLUGINS_SERVICE] {
        assert_eq!(m.show(unit, "LoadState"), "not-found", "{unit}");
    }
    let status = in_manager(&m, &tools, &["dpkg-query", "-W", "plexus"]);
    assert!(!status.status.success(), "dpkg still knows plexus");
    let gone = [
        "/usr/bin/plexusd",
        "/usr/lib/cni/plexus-shim",
        "/usr/libexec/plexus/plexus-spawner",
        CONFFILE,
    ];
    for path in gone {
        let p = PathBuf::from(format!("/proc/{}/root{path}", m.pid()));
        assert!(std::fs::symlink_metadata(&p).is_err(), "{path} is left");
    }
    drop(m);
    assert!(!host_has_plexus(), "the host's dpkg database lists plexus");
}
