//! What the scenarios share: the environment and stdin of a CNI call (as a
//! runtime gives them to plexus-shim, and plexusd to a plugin), the
//! networks, a running plexusd, scratch directories on tmpfs, and a tally
//! of failed calls.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::procs::{Call, Outcome};
use crate::report::{Section, Table};
use crate::support::cni::{self as cnisup, Engine};
use crate::support::daemon::Daemon;

pub use crate::support::cni::{DEFAULT_ARGS as CNI_ARGS, SYSTEM_PLUGINS as CNI_BIN};
pub use crate::support::daemon::PLEXUSD;
pub use crate::support::shim::SHIM;

/// The daemon's log level in every scenario (its default).
pub const LOG_LEVEL: &str = "info";

/// The environment of one CNI call, as a runtime gives it to a plugin (and
/// as plexusd gives it to the delegate), with `CNI_ARGS` [`CNI_ARGS`].
pub fn cni_env(
    command: &str,
    container_id: &str,
    netns: &str,
    ifname: &str,
) -> Vec<(String, String)> {
    cnisup::call_env(command, container_id, netns, ifname, CNI_ARGS)
}

/// The shim's stdin: the runtime's view of the Plexus network.
pub fn shim_stdin(sock: &Path) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "cniVersion": "1.0.0",
        "name": "plexus",
        "type": "plexus-shim",
        "socketPath": sock,
        "timeout": "60s",
    }))
    .unwrap()
}

/// plexus-shim linked statically, as packaging/build.sh builds it for the
/// packages; the reason when the build fails.
pub fn build_static_shim() -> Result<PathBuf, String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = manifest.join("target/bench-static-shim");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "rustc",
            "--release",
            "--locked",
            "--quiet",
            "--bin",
            "plexus-shim",
        ])
        .arg("--target-dir")
        .arg(&target)
        .args(["--", "-C", "target-feature=+crt-static"])
        .current_dir(manifest)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(target.join("release/plexus-shim"))
}

/// The plexus-shim the scenarios' `plexus` sides execute: the statically
/// linked build, as the packages install it (the runtime executes that
/// one), else the `cargo build` one.
pub fn shim() -> &'static Path {
    static SHIM_PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SHIM_PATH.get_or_init(|| {
        eprintln!("building the static plexus-shim (as packaged)…");
        match build_static_shim() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("cannot build the static plexus-shim ({e}); the scenarios use {SHIM}");
                PathBuf::from(SHIM)
            }
        }
    })
}

/// Which plexus-shim [`shim`] is, for the report.
pub fn shim_kind() -> &'static str {
    if shim() == Path::new(SHIM) {
        "dynamically linked (`cargo build`; the static build failed)"
    } else {
        "statically linked, as packaged"
    }
}

/// One burst's calls of `command` for containers `ids` in `netns`: through
/// the plexusd at `sock`, or the plugin called directly (`None`, with the
/// ADD results `prev` as `prevResult`).
pub fn burst_calls(
    net: &Network,
    sock: Option<&Path>,
    netns: &str,
    command: &str,
    ids: &[String],
    prev: &[Option<Value>],
) -> Vec<Call> {
    ids.iter()
        .enumerate()
        .map(|(i, cid)| match sock {
            None => net.direct(command, cid, netns, prev.get(i).and_then(|p| p.as_ref())),
            Some(sock) => shim_call(sock, command, cid, netns, &net.ifname),
        })
        .collect()
}

pub fn shim_call(sock: &Path, command: &str, cid: &str, netns: &str, ifname: &str) -> Call {
    Call::new(
        shim(),
        cni_env(command, cid, netns, ifname),
        shim_stdin(sock),
    )
}

/// [`shim_call`] with `CNI_ARGS` `args` instead of [`CNI_ARGS`].
pub fn shim_call_args(
    sock: &Path,
    command: &str,
    cid: &str,
    netns: &str,
    ifname: &str,
    args: &str,
) -> Call {
    Call::new(
        shim(),
        cnisup::call_env(command, cid, netns, ifname, args),
        shim_stdin(sock),
    )
}

/// A network as Plexus sees it (a file in confDir) and as the direct
/// baseline calls its one plugin.
pub struct Network {
    /// Name in confDir and for `clusterNetwork`.
    pub name: String,
    pub file: String,
    pub config: Value,
    /// The plugin the baseline executes.
    pub plugin: PathBuf,
    /// The plugin's stdin at ADD, as plexusd builds it: the plugin's entry
    /// with the list's `name` and the negotiated `cniVersion`.
    pub stdin: Value,
    pub ifname: String,
}

impl Network {
    pub fn loopback() -> Self {
        let conf = json!({"cniVersion": "1.0.0", "name": "lo", "type": "loopback"});
        Self {
            name: "lo".into(),
            file: "lo.conf".into(),
            config: conf.clone(),
            plugin: Path::new(CNI_BIN).join("loopback"),
            stdin: conf,
            ifname: "lo".into(),
        }
    }

    pub fn bridge(bridge: &str, ipam: Value) -> Self {
        let entry = cnisup::bridge(bridge, ipam);
        let name = "plexus-bench-br";
        let mut stdin = entry.clone();
        stdin["name"] = json!(name);
        stdin["cniVersion"] = json!("1.0.0");
        Self {
            name: name.into(),
            file: "10-bench-br.conflist".into(),
            config: cnisup::conflist(name, "1.0.0", vec![entry]),
            plugin: Path::new(CNI_BIN).join("bridge"),
            stdin,
            ifname: "eth0".into(),
        }
    }

    /// The same network under another `name`, config file and CNI_IFNAME
    /// (a second network for one container).
    pub fn renamed(mut self, name: &str, file: &str, ifname: &str) -> Self {
        self.name = name.into();
        self.file = file.into();
        self.config["name"] = json!(name);
        self.stdin["name"] = json!(name);
        self.ifname = ifname.into();
        self
    }

    /// The direct call: ADD with the conf, DEL with the ADD's result as
    /// `prevResult` (as plexusd does from its record).
    pub fn direct(&self, command: &str, cid: &str, netns: &str, prev: Option<&Value>) -> Call {
        let mut stdin = self.stdin.clone();
        if let Some(p) = prev {
            stdin["prevResult"] = p.clone();
        }
        Call::new(
            &self.plugin,
            cni_env(command, cid, netns, &self.ifname),
            serde_json::to_vec(&stdin).unwrap(),
        )
    }
}

/// Starts plexusd on `engine` with `network` as the cluster network and
/// waits for READY=1. `extra` is merged into the config.
pub fn start_daemon(
    engine: &Engine,
    tag: &str,
    network: &Network,
    state_dir: &Path,
    extra: Value,
) -> Daemon {
    let cfg = daemon_config(engine, tag, network, state_dir, extra);
    let mut d = Daemon::start(&engine.dir, tag, cfg);
    d.ready();
    d
}

/// The configuration [`start_daemon`] gives plexusd (which writes it to
/// `<engine dir>/<tag>.json`).
pub fn daemon_config(
    engine: &Engine,
    tag: &str,
    network: &Network,
    state_dir: &Path,
    extra: Value,
) -> Value {
    let mut cfg = json!({
        "confDir": engine.conf_dir,
        "binDir": CNI_BIN,
        "stateDir": state_dir,
        "clusterNetwork": network.name,
        "logLevel": LOG_LEVEL,
        "socketDir": engine.dir.join(&format!("sock-{tag}")),
    });
    for (k, v) in extra.as_object().expect("extra config object") {
        cfg[k] = v.clone();
    }
    cfg
}

pub fn write_network(engine: &Engine, net: &Network) {
    engine.write_network(&net.file, &net.config);
}

/// Failed calls: how many, and the first few messages.
#[derive(Default)]
pub struct Failures {
    pub count: usize,
    pub first: Vec<String>,
}

impl Failures {
    pub fn note(&mut self, what: &str, o: &Outcome) {
        if !o.ok() {
            self.count += 1;
            if self.first.len() < 3 {
                self.first.push(format!("{what}: {}", o.describe()));
            }
        }
    }

    pub fn note_msg(&mut self, msg: String) {
        self.count += 1;
        if self.first.len() < 3 {
            self.first.push(msg);
        }
    }

    pub fn report(&self, sec: &mut Section, what: &str) {
        if self.count > 0 {
            sec.para(&format!(
                "**{} failed {what} call(s).** First: {}",
                self.count,
                self.first.join(" / ")
            ));
        }
    }
}

/// A directory removed on drop (for paths outside a [`TestDir`]).
pub struct RemoveDir(pub PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory on tmpfs (/dev/shm), if there is one.
pub fn tmpfs_dir(tag: &str) -> Option<RemoveDir> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    let is_tmpfs = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2 && f[1] == "/dev/shm" && f[2] == "tmpfs"
    });
    if !is_tmpfs {
        return None;
    }
    let p = PathBuf::from(format!(
        "/dev/shm/plexus-bench-{}-{tag}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&p);
    fs::create_dir_all(&p).ok()?;
    Some(RemoveDir(p))
}

/// ADD and DEL, in ms, of one row of a "where the time goes" table.
pub type AddDel = [Option<f64>; 2];

/// `a − b` for ADD and DEL, where both are known.
pub fn minus(a: AddDel, b: AddDel) -> AddDel {
    [0, 1].map(|i| Some(a[i]? - b[i]?))
}

/// The rows every Plexus side's breakdown starts with: the shim call end
/// to end (`e2e`, as the bench timed it) and the daemon's request time.
pub fn side_rows(label: &str, e2e: AddDel, req: AddDel) -> [(String, AddDel); 2] {
    [
        (format!("{label}: shim call end to end (bench)"), e2e),
        (
            format!("{label}: daemon request time (`plexus_request_duration_seconds`)"),
            req,
        ),
    ]
}

/// The "where the time goes" table: a row per label, `n/a` where unknown.
pub fn breakdown_table(rows: Vec<(String, AddDel)>) -> Table {
    let mut b = Table::new(&["mean per call (ms)", "ADD", "DEL"]);
    for (label, v) in rows {
        let f = |x: Option<f64>| x.map_or_else(|| "n/a".into(), |x| format!("{x:.2}"));
        b.row(vec![label, f(v[0]), f(v[1])]);
    }
    b
}
