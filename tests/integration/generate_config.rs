//! `plexusd generate-config` (the built binary on real files), and
//! systemd/plexus-config.{path,service} under a private systemd manager
//! (needs root; skips otherwise, or with PLEXUS_SYSTEMD_TESTS=0).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::daemon::{TestDir, PLEXUSD};
use crate::support::systemd::{assert_verifies, plexus_units, skip_reason, Manager, ScratchDir};

const PATH_UNIT: &str = "plexus-config.path";
const SERVICE_UNIT: &str = "plexus-config.service";
const OUTPUT: &str = "00-plexus.conf";
const T: Duration = Duration::from_secs(20);
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/multus-wire/");

/// A configuration directory and a daemon-config.json naming it as both
/// multusAutoconfigDir and cniConfigDir (plus `extra` keys).
struct Node {
    dir: TestDir,
}

impl Node {
    fn new(name: &str, extra: Value) -> Node {
        let dir = TestDir::new(name);
        std::fs::create_dir(dir.join("net.d")).unwrap();
        let mut cfg = json!({
            "multusAutoconfigDir": dir.join("net.d"),
            "cniConfigDir": dir.join("net.d"),
        });
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        std::fs::write(dir.join("daemon-config.json"), cfg.to_string()).unwrap();
        Node { dir }
    }

    fn net(&self, name: &str) -> PathBuf {
        self.dir.join("net.d").join(name)
    }

    fn put(&self, name: &str, text: &str) {
        std::fs::write(self.net(name), text).unwrap();
    }

    fn generate(&self) -> Output {
        Command::new(PLEXUSD)
            .arg("--config")
            .arg(self.dir.join("daemon-config.json"))
            .arg("generate-config")
            .output()
            .unwrap()
    }

    fn generate_ok(&self) -> String {
        let out = self.generate();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn output(&self) -> String {
        std::fs::read_to_string(self.net(OUTPUT)).unwrap()
    }

    fn output_json(&self) -> Value {
        serde_json::from_str(&self.output()).unwrap()
    }

    /// (inode, mtime in ns) of the generated file.
    fn stamp(&self) -> (u64, i128) {
        let m = std::fs::metadata(self.net(OUTPUT)).unwrap();
        (
            m.ino(),
            i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        )
    }
}

fn flannel(version: &str, caps: Value) -> String {
    json!({"cniVersion": version, "name": "cbr0", "plugins": [
        {"type": "flannel", "delegate": {"isDefaultGateway": true}},
        {"type": "portmap", "capabilities": caps}]})
    .to_string()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn output_should_have_the_shape_of_multus_generated_file() {
    // The captured multus-shim was given the file multus-daemon generated;
    // the same daemon-config keys must give the same bytes, but for `type`.
    let n = Node::new(
        "gencfg-shape",
        json!({"binDir": "/usr/lib/cni", "cniVersion": "0.3.1",
               "logFile": "/run/example/multus-daemon.log", "logLevel": "error",
               "cniDir": "/run/example/cache", "daemonSocketDir": "/run/example/capsock",
               "multusConfigFile": "auto", "socketDir": "/run/example/capsock"}),
    );
    n.put(
        "10-loopback.conf",
        r#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#,
    );
    n.generate_ok();
    let multus = std::fs::read_to_string(format!("{FIXTURES}shim-stdin-config.json")).unwrap();
    let want = multus
        .replace("\"multus-shim\"", "\"plexus-shim\"")
        .replace(
            "/run/example/net.d/10-loopback.conf",
            n.net("10-loopback.conf").to_str().unwrap(),
        );
    assert_eq!(n.output(), want);
    let mode = std::fs::metadata(n.net(OUTPUT))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600, "multus writes 0600");
}

#[test]
fn primary_should_be_the_first_conf_or_conflist_by_name_that_is_no_thick_plugin() {
    let n = Node::new("gencfg-choice", json!({}));
    n.put(
        "30-late.conf",
        r#"{"cniVersion":"1.0.0","name":"late","type":"bridge"}"#,
    );
    n.put(
        "20-main.conflist",
        &flannel("1.0.0", json!({"portMappings": true})),
    );
    // Not candidates: libcni's .json (multus ignores it), our own names,
    // thick plugins' configurations, a directory.
    n.put(
        "01-first.json",
        r#"{"cniVersion":"1.0.0","name":"j","type":"bridge"}"#,
    );
    n.put(
        "00-plexus.conflist",
        r#"{"cniVersion":"1.0.0","name":"plexus","plugins":[{"type":"plexus-shim"}]}"#,
    );
    n.put(
        "05-multus.conf",
        r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus-shim"}"#,
    );
    n.put(
        "06-chained.conflist",
        r#"{"cniVersion":"1.0.0","name":"p","plugins":[{"type":"plexus-shim"},{"type":"tuning"}]}"#,
    );
    std::fs::create_dir(n.net("02-dir.conf")).unwrap();
    let said = n.generate_ok();
    let main = n.net("20-main.conflist");
    assert_eq!(
        n.output(),
        format!(
            r#"{{"capabilities":{{"portMappings":true}},"cniVersion":"1.0.0","name":"multus-cni-network","clusterNetwork":"{}","type":"plexus-shim"}}"#,
            main.display()
        )
    );
    assert!(said.contains("05-multus.conf"), "{said}");

    // Our own output is never its own primary, whatever else is there.
    std::fs::remove_file(&main).unwrap();
    std::fs::remove_file(n.net("30-late.conf")).unwrap();
    let before = (n.output(), n.stamp());
    let out = n.generate();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let e = stderr(&out);
    assert!(e.contains("no primary CNI configuration in"), "{e}");
    assert!(e.contains("05-multus.conf"), "{e}");
    assert_eq!((n.output(), n.stamp()), before, "the file was touched");

    // multusMasterCNI names the primary; a thick plugin's is refused.
    let cfg = n.dir.join("daemon-config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    c["multusMasterCNI"] = json!("05-multus.conf");
    std::fs::write(&cfg, c.to_string()).unwrap();
    let out = n.generate();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("thick plugin"), "{}", stderr(&out));
    c["multusMasterCNI"] = json!("01-first.json");
    std::fs::write(&cfg, c.to_string()).unwrap();
    n.generate_ok();
    assert_eq!(
        n.output_json()["clusterNetwork"],
        json!(n.net("01-first.json"))
    );
}

#[test]
fn unchanged_content_should_not_rewrite_the_file() {
    let n = Node::new("gencfg-same", json!({"logLevel": "verbose"}));
    n.put("10-main.conflist", &flannel("0.4.0", json!({})));
    let said = n.generate_ok();
    assert!(said.starts_with("wrote "), "{said}");
    let first = n.stamp();
    for _ in 0..3 {
        let said = n.generate_ok();
        assert!(said.starts_with("unchanged: "), "{said}");
        assert_eq!(n.stamp(), first, "rewritten with the same content");
    }
    // A change of the primary is followed.
    n.put(
        "10-main.conflist",
        &flannel("1.0.0", json!({"portMappings": true})),
    );
    n.generate_ok();
    assert_ne!(n.stamp().0, first.0);
    assert_eq!(n.output_json()["cniVersion"], "1.0.0");
    assert_eq!(
        n.output_json()["capabilities"],
        json!({"portMappings": true})
    );
}

#[test]
fn replacing_should_be_atomic_readers_never_see_a_partial_file() {
    let n = Node::new("gencfg-atomic", json!({}));
    let versions = ["0.4.0", "1.0.0"];
    n.put("10-main.conflist", &flannel(versions[0], json!({})));
    n.generate_ok();
    let expected: Vec<String> = versions
        .iter()
        .map(|v| {
            n.put("10-main.conflist", &flannel(v, json!({})));
            n.generate_ok();
            n.output()
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, path, expected) = (stop.clone(), n.net(OUTPUT), expected.clone());
        std::thread::spawn(move || {
            let (mut reads, mut bad) = (0usize, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                match std::fs::read_to_string(&path) {
                    Ok(text) if expected.contains(&text) => {}
                    Ok(text) => bad.push(text),
                    Err(e) => bad.push(format!("read error: {e}")),
                }
                reads += 1;
            }
            (reads, bad)
        })
    };
    let mut inodes = std::collections::BTreeSet::new();
    for i in 0..40 {
        n.put("10-main.conflist", &flannel(versions[i % 2], json!({})));
        n.generate_ok();
        inodes.insert(n.stamp().0);
        assert_eq!(n.output(), expected[i % 2]);
    }
    stop.store(true, Ordering::SeqCst);
    let (reads, bad) = reader.join().unwrap();
    println!("{reads} reads during 40 replacements");
    assert!(
        bad.is_empty(),
        "{} of {reads} reads saw something else, first: {:?}",
        bad.len(),
        bad.first()
    );
    assert!(
        inodes.len() > 1,
        "the file was never replaced by a new inode"
    );
    // No temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(n.dir.join("net.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn unreadable_primary_or_none_should_keep_the_last_good_file() {
    let n = Node::new("gencfg-keep", json!({}));
    n.put("10-main.conflist", &flannel("1.0.0", json!({})));
    n.generate_ok();
    let good = (n.output(), n.stamp());

    // A half-written primary that now sorts first.
    n.put("05-new.conflist", r#"{"cniVersion":"1.0.0","name":"#);
    let out = n.generate();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let e = stderr(&out);
    assert!(
        e.contains(n.net("05-new.conflist").to_str().unwrap()),
        "{e}"
    );
    assert!(e.contains("not valid JSON"), "{e}");
    assert_eq!(
        (n.output(), n.stamp()),
        good,
        "the last good file was replaced"
    );

    // A primary that fails multus's version check (a generated cniVersion
    // of 0.4.0 or newer wants a primary of 0.4.0 or newer).
    n.put("05-new.conflist", &flannel("0.3.1", json!({})));
    let cfg = n.dir.join("daemon-config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    c["cniVersion"] = json!("1.0.0");
    std::fs::write(&cfg, c.to_string()).unwrap();
    let out = n.generate();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr(&out).contains("older than 0.4.0"),
        "{}",
        stderr(&out)
    );
    assert_eq!((n.output(), n.stamp()), good);

    // No primary at all.
    std::fs::remove_file(n.net("05-new.conflist")).unwrap();
    std::fs::remove_file(n.net("10-main.conflist")).unwrap();
    let out = n.generate();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("no primary"), "{}", stderr(&out));
    assert_eq!((n.output(), n.stamp()), good);

    // A readiness indicator file that is missing: nothing is written.
    n.put(
        "10-main.conflist",
        &flannel("1.0.0", json!({"portMappings": true})),
    );
    c["readinessindicatorfile"] = json!(n.dir.join("ready"));
    std::fs::write(&cfg, c.to_string()).unwrap();
    let out = n.generate();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr(&out).contains("readiness indicator"),
        "{}",
        stderr(&out)
    );
    assert_eq!((n.output(), n.stamp()), good);
    std::fs::write(n.dir.join("ready"), "").unwrap();
    n.generate_ok();
    assert_eq!(n.output_json()["capabilities"]["portMappings"], true);

    // A wrong key is a configuration error (EX_CONFIG), naming the key.
    c["capabilities"] = json!(["portMappings"]);
    std::fs::write(&cfg, c.to_string()).unwrap();
    let out = n.generate();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        stderr(&out).contains("\"capabilities\""),
        "{}",
        stderr(&out)
    );
}

// ---------------------------------------------------------------------------
// The units

fn repo_unit(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("systemd")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn substitute(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} in {text}");
    text.replacen(from, to, 1)
}

/// The repository's plexus-config units pointed at `net_d`, a copy of
/// `plexusd` in `work` and `config`; with `log`, output appended there.
fn config_units(work: &Path, net_d: &Path, config: &Path, log: Option<&Path>) -> (String, String) {
    let bin = work.join("plexusd");
    if !bin.exists() {
        std::fs::copy(PLEXUSD, &bin).unwrap();
    }
    let path = substitute(
        &repo_unit(PATH_UNIT),
        "PathChanged=/etc/cni/net.d",
        &format!("PathChanged={}", net_d.display()),
    );
    let mut service = substitute(
        &repo_unit(SERVICE_UNIT),
        "ExecStart=/usr/bin/plexusd --config /etc/plexus/daemon-config.json generate-config",
        &format!(
            "ExecStart={} --config {} generate-config",
            bin.display(),
            config.display()
        ),
    );
    service = substitute(
        &service,
        "ReadWritePaths=-/etc/cni/net.d",
        &format!("ReadWritePaths={}", net_d.display()),
    );
    if let Some(log) = log {
        service = substitute(
            &service,
            "[Service]\n",
            &format!(
                "[Service]\nStandardOutput=append:{0}\nStandardError=append:{0}\n",
                log.display()
            ),
        );
    }
    (path, service)
}

#[test]
fn config_units_should_pass_systemd_analyze_verify() {
    if let Some(why) = skip_reason() {
        println!("skipping: {why}");
        return;
    }
    let scratch = ScratchDir::new("analyze-config");
    let dir = scratch.path();
    let (path, service) = config_units(dir, Path::new("/etc/cni/net.d"), &dir.join("c.json"), None);
    // plexus_units copies plexusd into `dir` too.
    let (socket, daemon) = plexus_units(dir, false);
    let mut files = Vec::new();
    for (name, text) in [
        (PATH_UNIT, path),
        (SERVICE_UNIT, service),
        ("plexusd.socket", socket),
        ("plexusd.service", daemon),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
        files.push(dir.join(name).display().to_string());
    }
    let files: Vec<&str> = files.iter().map(String::as_str).collect();
    assert_verifies(&files);
}

/// The service's runs so far, by the start of its last one.
fn last_run(m: &Manager) -> (String, String, String) {
    let s = m.show_all(
        SERVICE_UNIT,
        &["ExecMainStartTimestampMonotonic", "ActiveState", "Result"],
    );
    (
        s["ExecMainStartTimestampMonotonic"].clone(),
        s["ActiveState"].clone(),
        s["Result"].clone(),
    )
}

/// Waits for a run that started after `after` to finish; its state.
fn wait_run_after(m: &Manager, after: &str) -> (String, String, String) {
    let mut last = last_run(m);
    m.wait_for(&format!("a run of {SERVICE_UNIT} after {after}"), T, || {
        last = last_run(m);
        last.0 != after && last.0 != "0" && last.1 != "activating"
    });
    last
}

/// Asserts that no further run starts and the path unit keeps watching
/// for `quiet` (the observation window; nothing is waited for).
fn assert_settled(m: &Manager, quiet: Duration, output: &Path) -> (String, u64) {
    let run = last_run(m).0;
    let inode = std::fs::metadata(output).unwrap().ino();
    let changed = crate::support::systemd::poll_until(quiet, || {
        last_run(m).0 != run
            || std::fs::metadata(output).map(|md| md.ino()).ok() != Some(inode)
            || m.show(PATH_UNIT, "ActiveState") != "active"
    });
    assert!(
        !changed,
        "it did not settle: {:?}, path unit {}\n{}",
        last_run(m),
        m.show(PATH_UNIT, "ActiveState"),
        m.describe_failure()
    );
    (run, inode)
}

#[test]
fn path_unit_should_follow_the_primary_keep_the_last_good_file_and_settle() {
    let Some(m) = Manager::start() else {
        return;
    };
    let work = m.work_dir().to_path_buf();
    let net_d = work.join("net.d");
    std::fs::create_dir(&net_d).unwrap();
    let config = work.join("daemon-config.json");
    std::fs::write(
        &config,
        json!({"multusAutoconfigDir": net_d, "cniConfigDir": net_d}).to_string(),
    )
    .unwrap();
    let primary = net_d.join("10-flannel.conflist");
    std::fs::write(&primary, flannel("0.4.0", json!({"portMappings": true}))).unwrap();
    let output = net_d.join(OUTPUT);
    let (path, service) = config_units(&work, &net_d, &config, Some(&work.join("config.log")));
    m.install_units(&[(PATH_UNIT, &path), (SERVICE_UNIT, &service)]);

    // Starting the watch generates the file once.
    m.systemctl_ok(&["start", PATH_UNIT]);
    let run = wait_run_after(&m, "0");
    assert_eq!((run.1.as_str(), run.2.as_str()), ("inactive", "success"));
    let read = || serde_json::from_slice::<Value>(&std::fs::read(&output).unwrap()).unwrap();
    assert_eq!(
        read(),
        json!({"capabilities": {"portMappings": true}, "cniVersion": "0.4.0",
               "name": "multus-cni-network", "clusterNetwork": primary, "type": "plexus-shim"})
    );
    assert_eq!(m.show(PATH_UNIT, "SubState"), "waiting");
    let (_, inode) = assert_settled(&m, Duration::from_secs(2), &output);

    // The primary changes: ours follows, and the write of ours into the
    // watched directory does not start a loop.
    std::fs::write(&primary, flannel("1.0.0", json!({"bandwidth": true}))).unwrap();
    m.wait_for("the new cniVersion and capabilities in ours", T, || {
        let v = read();
        v["cniVersion"] == "1.0.0" && v["capabilities"] == json!({"bandwidth": true})
    });
    let settled = assert_settled(&m, Duration::from_secs(2), &output);
    assert_ne!(settled.1, inode, "not replaced by rename");
    let (run, inode) = settled;

    // Something else changes in the directory: a run, and ours is not
    // rewritten (same inode).
    std::fs::write(net_d.join("README"), "not a network").unwrap();
    let after = wait_run_after(&m, &run);
    assert_eq!(after.2, "success", "{after:?}");
    assert_eq!(
        std::fs::metadata(&output).unwrap().ino(),
        inode,
        "rewritten"
    );
    let (run, _) = assert_settled(&m, Duration::from_secs(1), &output);

    // A broken primary sorting first: the run fails, the last good file stays.
    let good = std::fs::read(&output).unwrap();
    std::fs::write(net_d.join("05-broken.conflist"), "{\"cniVersion\":").unwrap();
    let failed = wait_run_after(&m, &run);
    assert_eq!(
        (failed.1.as_str(), failed.2.as_str()),
        ("failed", "exit-code")
    );
    assert_eq!(std::fs::read(&output).unwrap(), good);
    assert_eq!(std::fs::metadata(&output).unwrap().ino(), inode);
    assert_eq!(
        m.show(PATH_UNIT, "ActiveState"),
        "active",
        "the watch stopped"
    );

    // Fixed: followed again.
    std::fs::write(
        net_d.join("05-broken.conflist"),
        flannel("1.0.0", json!({"portMappings": true})),
    )
    .unwrap();
    m.wait_for("the fixed primary in ours", T, || {
        read()["clusterNetwork"] == json!(net_d.join("05-broken.conflist"))
    });

    // Stopping the watch leaves the file in place.
    m.systemctl_ok(&["stop", PATH_UNIT]);
    assert_eq!(m.show(PATH_UNIT, "ActiveState"), "inactive");
    assert!(output.exists(), "stopping removed the generated file");
    let log = std::fs::read_to_string(work.join("config.log")).unwrap_or_default();
    println!(
        "runs: {} wrote, {} unchanged, {} failed",
        log.lines().filter(|l| l.starts_with("wrote ")).count(),
        log.lines().filter(|l| l.starts_with("unchanged: ")).count(),
        log.lines()
            .filter(|l| l.starts_with("plexusd: ") && !l.starts_with("plexusd: warning"))
            .count(),
    );
}
