//! `plexusd --check-config` checks what start-up checks and what ADDs would
//! then fail on, says what it ignores, and fails (78) when the daemon
//! would fail; `--strict` fails on warnings too. Each case runs the built
//! binary on a file of its own, with Debian's real plugins.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::support::cni::SYSTEM_PLUGINS;
use crate::support::daemon::{TestDir, PLEXUSD};

/// A node's layout: `<dir>/net.d` with network `good` (bridge +
/// host-local) and `<dir>/state`.
fn layout(tag: &str) -> TestDir {
    let dir = TestDir::new(tag);
    std::fs::create_dir_all(dir.join("net.d")).unwrap();
    let good = json!({
        "cniVersion": "1.0.0", "name": "good",
        "plugins": [{"type": "bridge", "bridge": "never-made0",
                     "ipam": {"type": "host-local", "subnet": "10.254.0.0/24"}}]
    });
    std::fs::write(dir.join("net.d/10-good.conflist"), good.to_string()).unwrap();
    dir
}

/// `config` with confDir, stateDir and binDir of `dir`, set unless it
/// sets them itself.
fn with_layout(dir: &TestDir, mut config: Value) -> Value {
    let defaults = [
        ("confDir", json!(dir.join("net.d"))),
        ("stateDir", json!(dir.join("state"))),
        ("binDir", json!(SYSTEM_PLUGINS)),
        ("socketDir", json!(dir.join("sock"))),
    ];
    for (k, v) in defaults {
        if config.get(k).is_none() {
            config[k] = v;
        }
    }
    config
}

/// Runs `plexusd --check-config [extra] --config <file>` on `config`, with
/// the scratch directory under `dir`.
fn check(dir: &TestDir, config: &Value, extra: &[&str]) -> (Option<i32>, String, String) {
    let file = dir.join("daemon-config.json");
    std::fs::write(&file, config.to_string()).unwrap();
    check_file(dir, &file, extra)
}

fn check_file(dir: &TestDir, file: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out: Output = Command::new(PLEXUSD)
        .arg("--check-config")
        .args(extra)
        .arg("--config")
        .arg(file)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    // The scratch directory is gone.
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_usable_configuration_should_pass_and_create_nothing() {
    let dir = layout("chk-ok");
    let config = with_layout(&dir, json!({"clusterNetwork": "good"}));
    let (code, out, err) = check(&dir, &config, &["--strict"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.ends_with("configuration is valid\n"), "{out}");
    assert!(!err.contains("warning") && !err.contains("error"), "{err}");
    // Checking creates neither the state nor the socket directory.
    assert!(!dir.join("state").exists());
    assert!(!dir.join("sock").exists());
}

#[test]
fn networks_the_daemon_would_fail_on_should_fail_the_check() {
    let dir = layout("chk-nets");
    // A cluster network that does not exist.
    let (code, _, err) = check(
        &dir,
        &with_layout(&dir, json!({"clusterNetwork": "nosuch"})),
        &[],
    );
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("nosuch"), "{err}");

    // A default network whose plugin is not in binDir.
    let bad = json!({"cniVersion": "1.0.0", "name": "bad", "type": "no-such-plugin"});
    std::fs::write(dir.join("net.d/20-bad.conf"), bad.to_string()).unwrap();
    let config = with_layout(
        &dir,
        json!({"clusterNetwork": "good", "defaultNetworks": ["bad"]}),
    );
    let (code, _, err) = check(&dir, &config, &[]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("no-such-plugin"), "{err}");

    // confDir missing while networks are named in it.
    let config = with_layout(
        &dir,
        json!({"clusterNetwork": "good", "confDir": dir.join("no-net.d")}),
    );
    let (code, _, err) = check(&dir, &config, &[]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("key \"confDir\""), "{err}");
    assert!(err.contains("is not a directory"), "{err}");

    // No binDir exists at all: the configured network's plugins are not
    // found (an error), and binDir itself is named (a warning).
    let config = with_layout(
        &dir,
        json!({"clusterNetwork": "good", "binDir": format!("{}:{}", dir.join("a").display(), dir.join("b").display())}),
    );
    let (code, _, err) = check(&dir, &config, &[]);
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("plexusd: warning: ") && err.contains("key \"binDir\": none of"),
        "{err}"
    );
    assert!(
        err.contains("plexusd: error: ") && err.contains("\"bridge\""),
        "{err}"
    );
}

#[test]
fn a_typo_should_be_a_warning_with_the_nearest_key_and_strict_should_fail_it() {
    let dir = layout("chk-typo");
    let config = with_layout(&dir, json!({"clusterNetwork": "good", "conectionLimit": 4}));
    let (code, out, err) = check(&dir, &config, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("plexusd: warning: ")
            && err.contains("\"conectionLimit\"")
            && err.contains("did you mean \"connectionLimit\"?"),
        "{err}"
    );
    assert!(out.contains("valid, with 1 warning"), "{out}");
    let (code, out, err) = check(&dir, &config, &["--strict"]);
    assert_eq!(code, Some(78), "{out}{err}");
    assert!(err.contains("error (--strict)"), "{err}");
}

#[test]
fn multus_thick_plugin_configmap_should_be_explained() {
    let dir = layout("chk-multus");
    // multus's own thick-plugin ConfigMap, as shipped, plus keys of its
    // other deployments.
    let multus = json!({
        "chrootDir": "/hostroot",
        "cniVersion": "0.3.1",
        "logLevel": "verbose",
        "logToStderr": true,
        "cniConfigDir": "/host/etc/cni/net.d",
        "multusAutoconfigDir": "/host/etc/cni/net.d",
        "multusConfigFile": "auto",
        "socketDir": "/host/run/multus/",
        "perNodeCertificate": {"enabled": true, "bootstrapKubeconfig": "/var/lib/kubelet/kubeconfig"},
        "logOptions": {"maxAge": 5, "maxSize": 100},
        "enablePprof": true
    });
    let (code, _, err) = check(&dir, &multus, &[]);
    assert_eq!(code, Some(78), "{err}");
    for key in [
        "chrootDir",
        "perNodeCertificate",
        "logOptions",
        "enablePprof",
        "multusConfigFile",
    ] {
        assert!(
            err.contains(&format!("key {key:?} is multus's and is ignored: ")),
            "{key}: {err}"
        );
    }
    // Each container path is an error that names the host's path.
    for (key, host) in [
        ("cniConfigDir", "/etc/cni/net.d"),
        ("multusAutoconfigDir", "/etc/cni/net.d"),
        ("socketDir", "/run/multus/"),
    ] {
        assert!(
            err.lines().any(|l| l.starts_with("plexusd: error: ")
                && l.contains(&format!("key {key:?} is \"/host"))
                && l.contains(&format!("use {host:?}"))),
            "{key}: {err}"
        );
    }
    assert!(
        err.contains("sees the host's file system under /host"),
        "{err}"
    );
}

#[test]
fn a_log_file_directly_in_a_sticky_directory_should_be_refused() {
    let dir = layout("chk-log");
    let sticky = dir.join("tmpdir");
    std::fs::create_dir(&sticky).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let config = with_layout(
        &dir,
        json!({"clusterNetwork": "good", "logFile": sticky.join("plexus.log")}),
    );
    let (code, _, err) = check(&dir, &config, &[]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("key \"logFile\""), "{err}");
    assert!(err.contains("mode 1777"), "{err}");
    // In a private directory below it: fine.
    let private = sticky.join("plexus");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = with_layout(
        &dir,
        json!({"clusterNetwork": "good", "logFile": private.join("plexus.log")}),
    );
    let (code, _, err) = check(&dir, &config, &[]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_kubeconfig_that_cannot_be_used_should_fail_the_check() {
    let dir = layout("chk-kube");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [oops\n",
    )
    .unwrap();
    let config = with_layout(
        &dir,
        json!({"clusterNetwork": "good", "kubeconfig": kubeconfig, "nodeName": "node-1"}),
    );
    let (code, _, err) = check(&dir, &config, &[]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("kubeconfig"), "{err}");
}

#[test]
fn options_should_work_after_a_subcommand() {
    let dir = layout("chk-after");
    let config = with_layout(&dir, json!({"clusterNetwork": "good"}));
    let file = dir.join("daemon-config.json");
    std::fs::write(&file, config.to_string()).unwrap();
    // The state dir of this file holds nothing: show says so (exit 0)
    // rather than reading the default stateDir.
    let out = Command::new(PLEXUSD)
        .args(["show", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&dir.join("state").display().to_string()),
        "{err}"
    );
}

/// Without pluginSpawner, plugins the check recognises by type and that
/// need more than plexusd's sandbox are named, each with its network,
/// and one note gives the drop-in that would give them all they need.
#[test]
fn plugins_that_need_more_than_the_sandbox_should_be_named_with_the_drop_in() {
    let dir = layout("chk-needs");
    // Plugin binaries under the names of the real ones: only their types
    // matter to the check (VERSION answered by Debian's loopback).
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["calico", "calico-ipam", "tuning"] {
        std::fs::copy(Path::new(SYSTEM_PLUGINS).join("loopback"), bin.join(name)).unwrap();
    }
    let cluster = json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network",
        "plugins": [{"type": "calico", "ipam": {"type": "calico-ipam"}},
                    {"type": "tuning"}]
    });
    std::fs::write(dir.join("net.d/10-calico.conflist"), cluster.to_string()).unwrap();
    let bin_dirs = format!("{}:{SYSTEM_PLUGINS}", bin.display());
    let config = with_layout(
        &dir,
        json!({"clusterNetwork": "k8s-pod-network", "defaultNetworks": ["good"], "binDir": bin_dirs}),
    );
    let (code, out, err) = check(&dir, &config, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    for plugin in ["calico", "calico-ipam", "tuning"] {
        assert!(
            err.contains(&format!(
                "warning: network \"k8s-pod-network\": plugin \"{plugin}\" runs inside \
                 plexusd.service's sandbox (no pluginSpawner)"
            )),
            "{plugin}: {err}"
        );
    }
    // bridge and host-local (network "good") need nothing more.
    assert!(!err.contains("plugin \"bridge\""), "{err}");
    assert!(
        err.contains("set \"pluginSpawner\": \"/run/plexus/plugins.sock\""),
        "{err}"
    );
    assert!(
        err.contains(
            "[Service]\nReadWritePaths=-/run/calico -/run/cni -/var/log/calico\n\
             ProtectKernelTunables=no\n\
             CapabilityBoundingSet=CAP_NET_ADMIN CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_DAC_OVERRIDE"
        ),
        "{err}"
    );
    // --strict: they count.
    let (code, _, _) = check(&dir, &config, &["--strict"]);
    assert_eq!(code, Some(78));

    // With pluginSpawner they run as the runtime would: no such warning,
    // but one for a socket that is not there.
    let mut spawned = config.clone();
    spawned["pluginSpawner"] = json!(dir.join("plugins.sock"));
    let (code, out, err) = check(&dir, &spawned, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!err.contains("runs inside"), "{err}");
    assert!(
        err.contains(&format!(
            "key \"pluginSpawner\": {} is not a socket",
            dir.join("plugins.sock").display()
        )),
        "{err}"
    );
    // A listening spawner: nothing to say.
    let spawner = crate::spawner::Spawner::start(&dir.path, &dir.join("daemon-config.json"));
    spawned["pluginSpawner"] = json!(spawner.sock);
    let (code, out, err) = check(&dir, &spawned, &["--strict"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.ends_with("configuration is valid\n"), "{out}{err}");
}

/// plexus-spawner runs nothing from a binDir directory that others can
/// write: the check says so before a plugin fails.
#[test]
fn a_bin_dir_others_can_write_should_be_named_for_the_spawner() {
    use std::os::unix::fs::PermissionsExt;
    let dir = layout("chk-spawnbin");
    let open = dir.join("open-bin");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin_dirs = format!("{}:{SYSTEM_PLUGINS}", open.display());
    let config = with_layout(
        &dir,
        json!({"clusterNetwork": "good", "binDir": bin_dirs,
               "pluginSpawner": dir.join("plugins.sock")}),
    );
    let (_, out, err) = check(&dir, &config, &[]);
    assert!(
        err.contains(&format!(
            "plexus-spawner runs no plugin from {}: it must be root's and writable by no one else",
            open.display()
        )),
        "{out}{err}"
    );
    assert!(!err.contains(&format!("from {SYSTEM_PLUGINS}")), "{err}");
}
