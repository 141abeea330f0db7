//! An engine as the daemon builds it ([`Engine::build`]: the real plugin
//! runner, noting each plugin's group in the container's lock file, and
//! the real record store, in a temporary directory), running two shell
//! plugins that do what a CNI plugin must and note the stdin of every GC
//! they get.

use std::os::unix::fs::PermissionsExt;

use base64::Engine as _;

use super::*;

/// A plugin at 1.1.0 that reads its configuration, prints a result on
/// ADD naming its interface, and appends the stdin of each GC it gets to
/// `<itself>.gc`, one line each.
const PLUGIN: &str = r#"#!/bin/sh
stdin=$(cat)
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}' ;;
ADD) echo '{"cniVersion":"1.1.0","interfaces":[{"name":"'"$CNI_IFNAME"'"}]}' ;;
GC) printf '%s\n' "$stdin" >> "$0.gc" ;;
esac
"#;

/// The plugins every scripted engine has.
pub(super) const PLUGINS: [&str; 2] = ["fa", "fb"];

pub(super) struct Scripted {
    pub(super) engine: Engine,
    pub(super) dir: tempfile::TempDir,
}

pub(super) fn scripted() -> Scripted {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for name in PLUGINS {
        let path = bin.join(name);
        std::fs::write(&path, PLUGIN).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let state = dir.path().join("state");
    let config = Config {
        bin_dirs: vec![bin],
        conf_dir: dir.path().join("conf"),
        state_dir: state,
        plugin_timeout: Duration::from_secs(20),
        device_info_dir: dir.path().join("devinfo"),
        cni_dir: dir.path().join("multus"),
        cleanup: Default::default(),
        plugin_spawner: None,
    };
    let engine = Engine::build(config, None, exec::kill_stale_group).unwrap();
    Scripted { engine, dir }
}

impl Scripted {
    pub(super) fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The record of `id` as it is on disk.
    pub(super) fn record(&self, id: &str) -> Option<Record> {
        Store::at(&self.state_dir()).load(id).unwrap()
    }

    /// The lock file of `id`.
    pub(super) fn lock_file(&self, id: &str) -> PathBuf {
        self.state_dir().join("locks").join(format!("{id}.lock"))
    }

    /// The stdin of every GC plugin `name` got, in order.
    pub(super) fn gcs_of(&self, name: &str) -> Vec<Value> {
        let path = self.dir.path().join("bin").join(format!("{name}.gc"));
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// An ADD of network "n" (plugins fa, fb) on `ifname`.
    pub(super) async fn add(&self, id: &str, ifname: &str) -> Result<Value, Error> {
        add(
            &self.engine,
            id,
            ifname,
            vec![plan(net("n", &PLUGINS), ifname, true)],
        )
        .await
    }

    /// A runtime's DEL of `ifname`; the configured network "n" when it
    /// falls back.
    pub(super) async fn del(&self, id: &str, ifname: &str) -> Result<(), Error> {
        let fallback = || async { Ok::<_, Error>(vec![plan(net("n", &PLUGINS), "eth0", true)]) };
        self.engine
            .del(&call(Command::Del, id, ifname), Map::new(), fallback)
            .await
    }

    /// multus's caches of container `id` attached to network "n" on eth0,
    /// as multus and libcni write them.
    pub(super) fn multus_attached(&self, id: &str) {
        let dir = self.dir.path().join("multus");
        std::fs::create_dir_all(dir.join("results")).unwrap();
        let list = net("n", &PLUGINS);
        let b64 = base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(&list.to_value()).unwrap());
        let delegates = json!([{"Name": "n", "ConfList": {"plugins": [{"type": "fa"}, {"type": "fb"}]},
                                "Bytes": b64}]);
        std::fs::write(dir.join(id), delegates.to_string()).unwrap();
        let cached = json!({"kind": "cniCacheV1", "containerId": id, "ifName": "eth0",
                            "networkName": "n",
                            "result": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}]}});
        std::fs::write(
            dir.join("results").join(format!("n-{id}-eth0")),
            cached.to_string(),
        )
        .unwrap();
    }

    /// Whether multus's delegate cache of `id` is still there.
    pub(super) fn multus_cached(&self, id: &str) -> bool {
        self.dir.path().join("multus").join(id).is_file()
    }
}
