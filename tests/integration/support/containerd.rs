//! Debian's containerd (1.6) as a process of the test, with its CRI plugin
//! calling plexus-shim: its config, root, state, gRPC socket, runc root,
//! CNI `bin_dir` and `conf_dir` all under the test's directory (never the
//! host's `/run/containerd`, `/var/lib/containerd`, `/etc/cni/net.d`), the
//! sandboxes' network namespaces mounted under its state directory
//! (`netns_mounts_under_state_dir`), and a pause image built here (a static
//! C program, packed as an OCI layout and imported: no registry is needed).
//!
//! [`Containerd`] is the guard: on drop it stops and removes every sandbox
//! still there, stops containerd, force-deletes the runc containers left,
//! kills this containerd's shims (their command line names its socket) and
//! unmounts everything it mounted under the test's directory.
//!
//! The one host path it cannot move: runc shims v2 put their sockets in
//! `/run/containerd/s/<hash of this containerd's address and the id>`; a
//! shim removes its socket when it exits, and the guard removes those of
//! shims it had to kill.
//!
//! Two ways to run it, with the same directories and config:
//! [`Containerd::start`] spawns it as a child of the test (it inherits the
//! test's working directory, environment, limits and descriptors);
//! [`Containerd::start_as_service`] runs it as a node does, as
//! `containerd.service` (a copy of the installed
//! `/lib/systemd/system/containerd.service`, only its `ExecStart=` pointed
//! at this config, its output appended to the log and `WorkingDirectory=/`,
//! see [`containerd_unit`]) in a private systemd manager of its own
//! ([`Manager`]). The unit has no `PrivateTmp=`: it sees the test's
//! directory under /tmp. Its mounts (the sandboxes' network namespaces,
//! rootfs) are then made in the manager's mount namespace and vanish with
//! it.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};

use super::cni::{list_dir, processes_matching, SYSTEM_PLUGINS};
use super::cri_client::{
    CriClient, CriError, LinuxPodSandboxConfig, PodSandboxConfig, PodSandboxMetadata, PortMapping,
    SandboxStatus, SANDBOX_READY,
};
use super::daemon::{poll, wait_until, TestDir};
use super::netns::{parse_addr_json, unique_name, Iface};
use super::shim::SHIM;
use super::systemd::Manager;

/// The sandbox image's name in containerd's `k8s.io` namespace.
pub const PAUSE_IMAGE: &str = "plexus.test/pause:1";
/// The CRI's namespace in containerd.
pub const K8S_NS: &str = "k8s.io";
/// The snapshotter: overlayfs works on this kernel; `native` (copies) is
/// the fallback where it does not.
const SNAPSHOTTER: &str = "overlayfs";
/// Plugins that cannot work here (no btrfs, zfs, devmapper, aufs) or send
/// data elsewhere (tracing).
const DISABLED: &[&str] = &[
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
];
/// How long containerd may take to serve, and a sandbox call to finish.
pub const T: Duration = Duration::from_secs(60);
/// The unit [`Containerd::start_as_service`] copies, and its name.
pub const CONTAINERD_UNIT_FILE: &str = "/lib/systemd/system/containerd.service";
pub const CONTAINERD_UNIT: &str = "containerd.service";
/// The installed unit's `ExecStart=` (adapted to this config).
const CONTAINERD_EXEC_START: &str = "ExecStart=/usr/bin/containerd\n";

/// A pod's identity as the kubelet gives it (PodSandboxConfig.metadata),
/// which containerd passes to CNI as `K8S_POD_*` arguments.
#[derive(Debug, Clone, Default)]
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub annotations: HashMap<String, String>,
    /// The sandbox's attempt (the kubelet counts its retries of a pod).
    pub attempt: u32,
    /// TCP host ports: (container port, host port).
    pub ports: Vec<(u16, u16)>,
}

impl Pod {
    /// A pod `name` in namespace `namespace` with a uid made from both.
    pub fn new(namespace: &str, name: &str) -> Self {
        Pod {
            name: name.into(),
            namespace: namespace.into(),
            uid: format!("uid-{namespace}-{name}"),
            annotations: HashMap::new(),
            attempt: 0,
            ports: Vec::new(),
        }
    }

    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    fn config(&self, cgroup_parent: &str) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: self.attempt,
            }),
            hostname: String::new(),
            port_mappings: self
                .ports
                .iter()
                .map(|&(container, host)| PortMapping {
                    protocol: 0,
                    container_port: container.into(),
                    host_port: host.into(),
                    host_ip: String::new(),
                })
                .collect(),
            labels: HashMap::new(),
            annotations: self.annotations.clone(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.into(),
            }),
        }
    }
}

/// A running containerd; see the module documentation.
pub struct Containerd {
    /// Its directory (`<test dir>/<tag>`): everything it writes is here.
    pub dir: PathBuf,
    pub sock: PathBuf,
    /// The CRI plugin's CNI `conf_dir` (empty unless a test writes to it).
    pub conf_dir: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub cri: CriClient,
    runc_root: PathBuf,
    /// The sandboxes' cgroup parent, `/<unique name>` in every hierarchy,
    /// removed on drop (rather than containerd's shared `/k8s.io`).
    cgroup: String,
    runner: Runner,
}

/// What runs containerd.
enum Runner {
    /// A child of the test.
    Child(Child),
    /// [`CONTAINERD_UNIT`] in a private manager, dropped after the guard's
    /// own clean-up (in a mutex: the guard is shared between threads, the
    /// manager may not be).
    Unit(Box<std::sync::Mutex<Manager>>),
}

/// The files of one containerd under `<dir>/<tag>`, made by [`prepare`].
struct Layout {
    base: PathBuf,
    state: PathBuf,
    conf_dir: PathBuf,
    runc_root: PathBuf,
    sock: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

/// Makes containerd's directories under `<dir>/<tag>`, its CNI `bin_dir`
/// (the shim and loopback) and its config.
fn prepare(dir: &TestDir, tag: &str) -> Layout {
    let base = dir.join(tag);
    let (root, state) = (base.join("root"), base.join("state"));
    let (conf_dir, bin_dir) = (base.join("net.d"), base.join("cni-bin"));
    let runc_root = base.join("runc");
    for d in [&root, &state, &conf_dir, &bin_dir, &runc_root] {
        fs::create_dir_all(d).unwrap();
    }
    std::os::unix::fs::symlink(SHIM, bin_dir.join("plexus-shim")).unwrap();
    // The CRI plugin adds the loopback network to every sandbox.
    std::os::unix::fs::symlink(
        Path::new(SYSTEM_PLUGINS).join("loopback"),
        bin_dir.join("loopback"),
    )
    .unwrap();
    let sock = base.join("c.sock");
    let config = base.join("config.toml");
    fs::write(
        &config,
        config_toml(&root, &state, &sock, &conf_dir, &bin_dir, &runc_root),
    )
    .unwrap();
    let log = base.join("containerd.log");
    Layout {
        base,
        state,
        conf_dir,
        runc_root,
        sock,
        config,
        log,
    }
}

/// The installed `containerd.service` (`unit`) as [`Containerd::start_as_service`]
/// runs it: `ExecStart=` with `--config <config>`; output appended to
/// `log` (a private manager has no journald); `WorkingDirectory=/`, what
/// the system manager gives every unit and a user manager (the private
/// one) would replace with its home directory. Every other line as it is.
pub fn containerd_unit(unit: &str, config: &Path, log: &Path) -> String {
    assert_eq!(
        unit.matches(CONTAINERD_EXEC_START).count(),
        1,
        "{CONTAINERD_UNIT_FILE} no longer has one {CONTAINERD_EXEC_START:?}; update \
         tests/integration/support/containerd.rs"
    );
    let exec = format!(
        "ExecStart=/usr/bin/containerd --config {}\n\
         StandardOutput=append:{}\nStandardError=append:{}\nWorkingDirectory=/\n",
        config.display(),
        log.display(),
        log.display()
    );
    unit.replacen(CONTAINERD_EXEC_START, &exec, 1)
}

impl Containerd {
    /// Starts containerd in `<dir>/<tag>` with an empty CNI `conf_dir`,
    /// imports the pause image and waits until the CRI reports the runtime
    /// ready (the network is not ready until a config is in `conf_dir`).
    pub fn start(dir: &TestDir, tag: &str) -> Self {
        let l = prepare(dir, tag);
        let logf = fs::File::create(&l.log).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&l.config)
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf)
            .spawn()
            .expect("spawn containerd (apt-get install containerd)");
        Self::serving(l, Runner::Child(child))
    }

    /// As [`Containerd::start`], but containerd runs as a node runs it:
    /// [`CONTAINERD_UNIT`], the installed unit with only its `ExecStart=`
    /// and output adapted ([`containerd_unit`]), in a private systemd
    /// manager started for it and stopped on drop. `None` (after printing
    /// why) where no private manager can run, or the unit is not
    /// installed.
    pub fn start_as_service(dir: &TestDir, tag: &str) -> Option<Self> {
        let Ok(unit) = fs::read_to_string(CONTAINERD_UNIT_FILE) else {
            println!("skipping: no {CONTAINERD_UNIT_FILE} (apt-get install containerd)");
            return None;
        };
        let m = Manager::start()?;
        let l = prepare(dir, tag);
        fs::File::create(&l.log).unwrap();
        m.install_units(&[(CONTAINERD_UNIT, &containerd_unit(&unit, &l.config, &l.log))]);
        // Type=notify: returns once containerd has said READY=1.
        let out = m.systemctl(&["start", CONTAINERD_UNIT]);
        assert!(
            out.status.success(),
            "systemctl start {CONTAINERD_UNIT}: {out:?}\n{}\ncontainerd log:\n{}",
            m.describe_failure(),
            fs::read_to_string(&l.log).unwrap_or_default()
        );
        Some(Self::serving(
            l,
            Runner::Unit(Box::new(std::sync::Mutex::new(m))),
        ))
    }

    /// The guard for containerd started by `runner` on `l`, once its CRI
    /// serves and the pause image is imported.
    fn serving(l: Layout, runner: Runner) -> Self {
        let cri = CriClient::new(&l.sock);
        let mut c = Containerd {
            dir: l.base,
            sock: l.sock,
            conf_dir: l.conf_dir,
            state: l.state,
            log: l.log,
            cri,
            runc_root: l.runc_root,
            cgroup: format!("/{}", unique_name("cg")),
            runner,
        };
        let served = poll(T, Duration::from_millis(20), || {
            c.cri.condition("RuntimeReady") || !c.running()
        });
        assert!(
            served && c.running(),
            "containerd did not serve the CRI; log:\n{}{}",
            c.log_text(),
            c.manager_logs()
        );
        c.import_pause_image();
        c
    }

    /// Whether containerd still runs.
    fn running(&mut self) -> bool {
        match &mut self.runner {
            Runner::Child(child) => child.try_wait().ok().flatten().is_none(),
            Runner::Unit(m) => {
                let m = m.get_mut().unwrap_or_else(|e| e.into_inner());
                let state = m.show(CONTAINERD_UNIT, "ActiveState");
                state == "active" || state == "reloading"
            }
        }
    }

    /// The private manager's logs when [`Containerd::start_as_service`]
    /// started containerd (for failure messages), else nothing.
    pub fn manager_logs(&self) -> String {
        match &self.runner {
            Runner::Child(_) => String::new(),
            Runner::Unit(m) => m
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .describe_failure(),
        }
    }

    fn import_pause_image(&self) {
        let tar = self.dir.join("pause.tar");
        fs::write(&tar, pause_image()).unwrap();
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.sock)
            .args([
                "-n",
                K8S_NS,
                "images",
                "import",
                "--snapshotter",
                SNAPSHOTTER,
            ])
            .arg(&tar)
            .output()
            .unwrap();
        assert!(out.status.success(), "ctr images import: {out:?}");
        // The CRI learns of images from containerd's events.
        wait_until(T, "the CRI to see the pause image", || {
            self.cri.image_present(PAUSE_IMAGE)
        });
    }

    /// Writes the shim's network config (`00-plexus.conflist`) for a
    /// plexusd serving in `daemon_socket_dir` into `conf_dir` and waits
    /// until the CRI reports the network ready.
    pub fn use_plexus(&self, daemon_socket_dir: &Path) {
        self.use_plexus_with(daemon_socket_dir, json!({}));
    }

    /// [`Containerd::use_plexus`] with `extra` keys in the shim's plugin
    /// config (such as `capabilities`).
    pub fn use_plexus_with(&self, daemon_socket_dir: &Path, extra: Value) {
        let mut plugin = json!({
            "type": "plexus-shim",
            "daemonSocketDir": daemon_socket_dir,
            // Short: a test sees a dead daemon's calls fail quickly.
            "connectTimeout": "2s",
            "timeout": "50s",
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            plugin[k] = v.clone();
        }
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": "plexus",
            "plugins": [plugin],
        });
        let tmp = self.conf_dir.join(".00-plexus.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(&conf).unwrap()).unwrap();
        fs::rename(&tmp, self.conf_dir.join("00-plexus.conflist")).unwrap();
        self.wait_network_ready();
    }

    /// Waits until the CRI reports `NetworkReady` (a config loaded).
    pub fn wait_network_ready(&self) {
        wait_until(T, "containerd's CNI config to load", || {
            self.cri.condition("NetworkReady")
        });
    }

    /// RunPodSandbox for `pod`; the sandbox id, or the call's error.
    pub fn try_run(&self, pod: &Pod) -> Result<String, CriError> {
        self.cri.run_pod_sandbox(pod.config(&self.cgroup))
    }

    /// RunPodSandbox that must fail: its error, and the id of the sandbox
    /// containerd keeps for it (not ready, for the kubelet to stop and
    /// remove), if it kept one.
    pub fn run_failing(&self, pod: &Pod) -> (CriError, Option<String>) {
        let Err(e) = self.try_run(pod) else {
            panic!("RunPodSandbox {}/{} succeeded", pod.namespace, pod.name);
        };
        let kept = self.cri.list_pod_sandbox().unwrap().into_iter().find(|s| {
            s.metadata
                .as_ref()
                .is_some_and(|m| m.name == pod.name && m.namespace == pod.namespace)
        });
        if let Some(s) = &kept {
            assert_ne!(s.state, SANDBOX_READY, "failed sandbox is ready: {s:?}");
        }
        (e, kept.map(|s| s.id))
    }

    /// RunPodSandbox that must succeed.
    pub fn run(&self, pod: &Pod) -> String {
        self.try_run(pod).unwrap_or_else(|e| {
            panic!(
                "RunPodSandbox {}/{}: {e}; containerd log:\n{}",
                pod.namespace,
                pod.name,
                self.log_tail()
            )
        })
    }

    /// StopPodSandbox then RemovePodSandbox; both must succeed.
    pub fn stop_remove(&self, id: &str) {
        self.cri
            .stop_pod_sandbox(id)
            .unwrap_or_else(|e| panic!("StopPodSandbox {id}: {e}\n{}", self.log_tail()));
        self.cri
            .remove_pod_sandbox(id)
            .unwrap_or_else(|e| panic!("RemovePodSandbox {id}: {e}\n{}", self.log_tail()));
    }

    /// Calls StopPodSandbox `times` times; how many calls failed.
    pub fn stop_failures(&self, id: &str, times: usize) -> usize {
        (0..times)
            .filter(|_| self.cri.stop_pod_sandbox(id).is_err())
            .count()
    }

    pub fn status(&self, id: &str) -> SandboxStatus {
        self.cri
            .pod_sandbox_status(id)
            .unwrap_or_else(|e| panic!("PodSandboxStatus {id}: {e}"))
    }

    /// The sandbox's network namespace (a file under the state directory).
    pub fn netns(&self, id: &str) -> String {
        let st = self.status(id);
        let ns = st
            .netns()
            .unwrap_or_else(|| panic!("no netns in {id}'s status: {:#}", st.info));
        assert!(
            ns.starts_with(&*self.state.to_string_lossy()),
            "netns {ns} is not under the state dir"
        );
        ns
    }

    /// The sandbox's cgroup in the `pids` hierarchy (under this
    /// containerd's cgroup parent).
    pub fn sandbox_cgroup(&self, id: &str) -> PathBuf {
        Path::new("/sys/fs/cgroup/pids")
            .join(&self.cgroup[1..])
            .join(id)
    }

    /// Ids of the sandboxes the CRI lists.
    pub fn sandboxes(&self) -> Vec<String> {
        self.cri
            .list_pod_sandbox()
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect()
    }

    /// Network namespace files under the state directory (containerd's
    /// `netns_mounts_under_state_dir` puts them in `<state>/…/netns/`).
    pub fn netns_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        find_named_dir(&self.state, "netns", 3, &mut |d| {
            out.extend(list_dir(d).into_iter().map(|f| d.join(f)));
        });
        out
    }

    /// Mounts under this containerd's directory (netns, rootfs, shm), in
    /// the mount namespace containerd runs in.
    pub fn mounts(&self) -> Vec<String> {
        match &self.runner {
            Runner::Child(_) => mounts_under(&self.dir),
            Runner::Unit(m) => {
                let pid = m.lock().unwrap_or_else(|e| e.into_inner()).pid();
                mounts_under_in(&self.dir, Path::new(&format!("/proc/{pid}/mountinfo")))
            }
        }
    }

    /// Shims serving this containerd (their command line names its socket).
    pub fn shims(&self) -> Vec<(i32, String)> {
        processes_matching(&format!("-address {} ", self.sock.display()))
    }

    /// Containers runc still knows in this containerd's runc root.
    pub fn runc_containers(&self) -> Vec<String> {
        list_dir(&self.runc_root.join(K8S_NS))
    }

    /// Asserts that no sandbox, netns, mount, shim or runc container of
    /// this containerd is left.
    pub fn assert_empty(&self) {
        assert_eq!(self.sandboxes(), Vec::<String>::new(), "sandboxes left");
        wait_until(T, "the shims to exit", || self.shims().is_empty());
        assert_eq!(self.netns_files(), Vec::<PathBuf>::new(), "netns left");
        assert_eq!(self.mounts(), Vec::<String>::new(), "mounts left");
        assert_eq!(self.runc_containers(), Vec::<String>::new(), "runc left");
        let cgroups = Path::new("/sys/fs/cgroup/pids").join(&self.cgroup[1..]);
        let left: Vec<String> = list_dir(&cgroups)
            .into_iter()
            .filter(|f| cgroups.join(f).is_dir())
            .collect();
        assert_eq!(left, Vec::<String>::new(), "cgroups left");
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of containerd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.running() {
            for id in self
                .cri
                .list_pod_sandbox()
                .map(|l| l.into_iter().map(|s| s.id).collect())
                .unwrap_or_else(|_| Vec::<String>::new())
            {
                let _ = self.cri.stop_pod_sandbox(&id);
                let _ = self.cri.remove_pod_sandbox(&id);
            }
        }
        match &mut self.runner {
            Runner::Child(child) => {
                if child.try_wait().ok().flatten().is_none() {
                    signal(child.id() as i32, libc::SIGTERM);
                    if !poll(Duration::from_secs(10), Duration::from_millis(10), || {
                        child.try_wait().ok().flatten().is_some()
                    }) {
                        let _ = child.kill();
                    }
                    let _ = child.wait();
                }
            }
            // KillMode=process: only containerd; its shims are killed below,
            // before the manager (dropped after this) finds them.
            Runner::Unit(m) => {
                let m = m.get_mut().unwrap_or_else(|e| e.into_inner());
                let _ = m.systemctl(&["stop", CONTAINERD_UNIT]);
            }
        }
        for id in self.runc_containers() {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(self.runc_root.join(K8S_NS))
                .args(["delete", "--force", &id])
                .output();
        }
        let sockets = shim_sockets(&self.state);
        for (pid, _) in self.shims() {
            signal(pid, libc::SIGKILL);
        }
        let _ = poll(Duration::from_secs(5), Duration::from_millis(10), || {
            self.shims().is_empty()
        });
        for s in sockets {
            let _ = fs::remove_file(s);
        }
        for h in list_dir(Path::new("/sys/fs/cgroup")) {
            let _ = fs::remove_dir(format!("/sys/fs/cgroup/{h}{}", self.cgroup));
        }
        // Under a manager, what containerd mounted is in the manager's mount
        // namespace, which goes with the manager (dropped after this).
        let mounts = match self.runner {
            Runner::Child(_) => self.mounts(),
            Runner::Unit(_) => Vec::new(),
        };
        for m in mounts.iter().rev() {
            if let Ok(c) = std::ffi::CString::new(m.as_str()) {
                // SAFETY: umount2(2) with a valid C string, on a mount
                // under this test's own directory.
                unsafe {
                    libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                }
            }
        }
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// containerd's config (version 2).
fn config_toml(
    root: &Path,
    state: &Path,
    sock: &Path,
    conf_dir: &Path,
    bin_dir: &Path,
    runc_root: &Path,
) -> String {
    let q = |p: &Path| json!(p).to_string();
    let disabled = json!(DISABLED).to_string();
    let (root_q, state_q, sock_q) = (q(root), q(state), q(sock));
    let (conf_q, bin_q, runc_q) = (q(conf_dir), q(bin_dir), q(runc_root));
    let opt_q = q(&root.join("opt"));
    format!(
        r#"version = 2
root = {root_q}
state = {state_q}
disabled_plugins = {disabled}

[grpc]
  address = {sock_q}
[debug]
  level = "info"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {opt_q}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # The test may not lower its children's oom_score_adj (the sandbox
  # asks for -998): at most down to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{SNAPSHOTTER}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = {runc_q}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {bin_q}
    conf_dir = {conf_q}
    max_conf_num = 1
"#
    )
}

/// The pause image as an OCI layout tarball, built once per test process:
/// a static C program that waits for SIGTERM/SIGINT.
pub fn pause_image() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(build_pause_image)
}

fn build_pause_image() -> Vec<u8> {
    let dir = TestDir::new("pause-image");
    let run = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {out:?}");
    };
    fs::write(
        dir.join("pause.c"),
        "#include <signal.h>\n#include <unistd.h>\n\
         static void stop(int s) { (void)s; _exit(0); }\n\
         int main(void) { signal(SIGTERM, stop); signal(SIGINT, stop);\n\
         for (;;) pause(); }\n",
    )
    .unwrap();
    fs::create_dir_all(dir.join("rootfs")).unwrap();
    run(Command::new("gcc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(dir.join("rootfs/pause"))
        .arg(dir.join("pause.c")));
    fs::set_permissions(dir.join("rootfs/pause"), fs::Permissions::from_mode(0o755)).unwrap();
    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    run(Command::new("tar")
        .args([
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-C",
        ])
        .arg(dir.join("rootfs"))
        .arg("-cf")
        .arg(dir.join("layer.tar"))
        .arg("pause"));
    let layer = fs::read(dir.join("layer.tar")).unwrap();
    let blob = |bytes: &[u8]| -> Value {
        let digest = format!("sha256:{}", sha256(&dir, bytes));
        fs::write(blobs.join(&digest[7..]), bytes).unwrap();
        json!({"digest": digest, "size": bytes.len()})
    };
    let layer_desc = blob(&layer);
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    });
    let mut config_desc = blob(&serde_json::to_vec(&config).unwrap());
    config_desc["mediaType"] = json!("application/vnd.oci.image.config.v1+json");
    let mut layer_desc = layer_desc;
    layer_desc["mediaType"] = json!("application/vnd.oci.image.layer.v1.tar");
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc, "layers": [layer_desc],
    });
    let mut manifest_desc = blob(&serde_json::to_vec(&manifest).unwrap());
    manifest_desc["mediaType"] = json!("application/vnd.oci.image.manifest.v1+json");
    manifest_desc["annotations"] = json!({"io.containerd.image.name": PAUSE_IMAGE});
    let index = json!({"schemaVersion": 2, "manifests": [manifest_desc]});
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(dir.join("image.tar"))
        .args(["oci-layout", "index.json", "blobs"]));
    fs::read(dir.join("image.tar")).unwrap()
}

/// sha256 of `bytes` in hex (with `sha256sum`).
fn sha256(dir: &TestDir, bytes: &[u8]) -> String {
    let f = dir.join("digest.in");
    fs::write(&f, bytes).unwrap();
    let out = Command::new("sha256sum").arg(&f).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

/// Calls `f` on every directory named `name` under `dir`, `depth` levels
/// down at most.
fn find_named_dir(dir: &Path, name: &str, depth: usize, f: &mut dyn FnMut(&Path)) {
    for e in list_dir(dir) {
        let p = dir.join(&e);
        if !p.is_dir() || p.is_symlink() {
            continue;
        }
        if e == name {
            f(&p);
        } else if depth > 0 {
            find_named_dir(&p, name, depth - 1, f);
        }
    }
}

/// Mount points under `dir`, in the order the kernel lists them.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    mounts_under_in(dir, Path::new("/proc/self/mountinfo"))
}

/// Mount points under `dir` in the mount namespace whose `mountinfo` is
/// given.
fn mounts_under_in(dir: &Path, mountinfo: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    fs::read_to_string(mountinfo)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// The sockets of the shims of containerd with state dir `state`
/// (`<state>/io.containerd.runtime.v2.task/k8s.io/<id>/address`).
fn shim_sockets(state: &Path) -> Vec<PathBuf> {
    let tasks = state.join("io.containerd.runtime.v2.task").join(K8S_NS);
    list_dir(&tasks)
        .into_iter()
        .filter_map(|id| fs::read_to_string(tasks.join(id).join("address")).ok())
        .filter_map(|a| a.trim().strip_prefix("unix://").map(PathBuf::from))
        .collect()
}

/// The interfaces in the network namespace `netns` (a file).
pub fn ifaces_in(netns: &str) -> Vec<Iface> {
    try_ifaces_in(netns).unwrap_or_else(|e| panic!("{e}"))
}

/// [`ifaces_in`], with an error naming the namespace when it cannot be
/// entered (it may be gone).
pub fn try_ifaces_in(netns: &str) -> Result<Vec<Iface>, String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ip", "-j", "addr", "show"])
        .output()
        .map_err(|e| format!("nsenter: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nsenter --net={netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(parse_addr_json(&String::from_utf8_lossy(&out.stdout)))
}

/// The IPv4 addresses (`a.b.c.d/len`) of `ifname` in `netns`.
pub fn ipv4_in(netns: &str, ifname: &str) -> Vec<String> {
    ifaces_in(netns)
        .into_iter()
        .find(|i| i.name == ifname)
        .map(|i| i.addrs.into_iter().filter(|a| a.contains('.')).collect())
        .unwrap_or_default()
}
