//! A real `systemd --user` manager for integration tests, on machines whose
//! PID 1 is not systemd (VMs, containers, CI runners).
//!
//! How one [`Manager`] isolates itself:
//!
//! * Managers are serialised across threads and processes with an `flock` on
//!   [`LOCK_FILE`]; under the lock, leftovers of killed test runs (cgroups and
//!   work dirs named `plexus-sd-<pid>-...` whose pid is gone) are removed.
//! * Every manager gets a fresh work dir `/run/plexus-systemd-tests/plexus-sd-<pid>-<n>-<nanos>`
//!   and cgroup directories of the same name (`systemd/` + `unified/` on hybrid
//!   hosts, the root on pure cgroup v2).
//! * The manager process is forked by this harness; before `exec` it moves
//!   itself into those cgroups (so it never adopts the host's root cgroup),
//!   becomes a session leader, asks for SIGTERM when the test thread dies, and
//!   enters a private mount namespace (`unshare(CLONE_NEWNS)`, `/` made
//!   recursively private) where it bind-mounts `/run` onto itself (sandboxing
//!   options mount an empty tmpfs over a `/run` that is no mount point), mounts
//!   a tmpfs over `/run/systemd` plus the `/run/systemd/system` marker
//!   (`systemd --user` needs it; it must never exist on the host) and the
//!   `inaccessible/` nodes PID 1 would create at boot, a tmpfs as
//!   `XDG_RUNTIME_DIR`, and bind-mounts a pty over `/dev/console`. The manager logs to that console; a thread copies
//!   the pty into `<work>/manager.log`, nothing reaches the machine console.
//!   These mounts exist only inside the namespace and vanish with it.
//! * Private `XDG_*` and `HOME` dirs and `SYSTEMD_UNIT_PATH=<work>/units`, which
//!   holds minimal targets, so only the units a test installs are loaded.
//! * `systemctl --user` runs through `nsenter --mount --target <manager pid>`
//!   with the same `XDG_RUNTIME_DIR`, bounded by `timeout`.
//! * Everything a test must reach from the host (sockets, logs, configs)
//!   lives in the work dir on the host file system; what a unit's
//!   `ProtectSystem=strict` must keep read-only, in a directory on the root
//!   file system ([`Manager::root_fs_dir`]).
//! * `Drop`: `systemctl --user exit` (fallback SIGTERM, then SIGKILL), a
//!   bounded wait, SIGKILL for anything left in the run's cgroups or mount
//!   namespace, `rmdir` of the cgroups deepest first, then host checks (no
//!   `/run/systemd/system`, no harness mount in `/proc/self/mountinfo`, no
//!   foreign process moved into a systemd-made cgroup) and removal of the work
//!   dir. Problems fail the test (unless it already failed: then the logs are
//!   printed instead).
//!
//! Why it takes all that (each learned the hard way):
//!
//! * `systemd --user` refuses to start without `/run/systemd/system`, and
//!   Debian maintainer scripts read that directory as "systemd is PID 1": it
//!   may exist only inside the manager's mount namespace, never on the host.
//! * A manager started from a process in `/init.scope` strips that suffix and
//!   adopts the host's root cgroup, and can then move every process of the
//!   machine into a new `init.scope` group of its own; hence the fresh
//!   cgroups joined before `exec`, and the check that no foreign process
//!   moved.
//! * A root `systemd --user` that is not PID 1 logs to `/dev/console`, and
//!   only if that is a tty (a plain file bind-mounted there receives
//!   nothing); hence the pty. There is no journald either: units under test
//!   need `StandardOutput=append:FILE` ([`plexus_units`] adds it).
//! * `daemon-reload` refuses to run with less than 16 MiB free on
//!   `/run/systemd`; the tmpfs mounts are 64 MiB (a tmpfs only uses what is
//!   written).
//! * `systemctl --user exit` needs `systemd-exit.service` with
//!   `SuccessAction=exit-force` and `Slice=-.slice`, or it fails with
//!   conflicting jobs; the minimal targets in `units/` provide it.
//! * No D-Bus daemon is needed: `systemctl --user` talks to
//!   `$XDG_RUNTIME_DIR/systemd/private` ("Failed to connect to system bus"
//!   in the manager's log is harmless).
//!
//! Files: this one (the manager), `host.rs` (cgroups, processes, mount
//! namespaces, the sweep of killed runs), `units.rs` (the repository's
//! units adapted to a manager, offline verification).
//!
//! Environment knobs: `PLEXUS_SYSTEMD_TESTS=0` skips, `PLEXUS_SYSTEMD_KEEP=1`
//! keeps the work dir, `PLEXUS_SYSTEMD_LOG_LEVEL=debug` raises the manager's
//! log level.

use std::collections::{BTreeSet, HashMap};
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::lock::FileLock;

mod host;
mod lifecycle;
use lifecycle::{write_minimal_units, Console};
mod units;

use host::{
    cgroup_pids, cgroup_roots, find_in_path, foreign_cgroups, is_executable, looks_systemd_made,
    pids_in_mount_ns, remove_cgroup_tree, sweep_stale,
};
pub use units::{
    analyze_offline, assert_verifies, plexus_units, plugin_units, plugins_socket, repo_unit,
    reroot_read_write_paths, shim_link_unit, ScratchDir, PLUGINS_SERVICE_UNIT, PLUGINS_SOCKET_UNIT,
    SERVICE_UNIT, SHIM_LINK_UNIT, SOCKET_UNIT,
};

/// Serialises managers across all test processes and threads.
pub const LOCK_FILE: &str = "/tmp/plexus-systemd-tests.lock";
/// Prefix of work dirs and cgroup names.
pub const PREFIX: &str = "plexus-sd-";
/// Parent of the managers' work dirs. Not /tmp: systemd (even a user manager,
/// when it runs as root) honours `PrivateTmp=yes` of plexusd.service, so the
/// daemon would see neither its config nor a binary below /tmp or /var/tmp.
pub const WORK_BASE: &str = "/run/plexus-systemd-tests";
/// Parent of the managers' directories on the root file system
/// ([`Manager::root_fs_dir`]).
pub const ROOT_FS_BASE: &str = "/var/lib/plexus-systemd-tests";
/// Source name of the harness's tmpfs mounts (visible in mountinfo).
const MOUNT_SOURCE: &str = "plexus-sd";
const SYSTEMD_BIN: &str = "/lib/systemd/systemd";
const MARKER: &str = "/run/systemd/system";
const PATH_ENV: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Upper bound for one `systemctl` call.
const SYSTEMCTL_TIMEOUT: &str = "30";
/// How long the manager may take to come up / to exit.
const START_TIMEOUT: Duration = Duration::from_secs(20);
const EXIT_TIMEOUT: Duration = Duration::from_secs(40);
const POLL: Duration = Duration::from_millis(10);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Why systemd tests cannot run here, or `None` when they can.
pub fn skip_reason() -> Option<String> {
    if std::env::var("PLEXUS_SYSTEMD_TESTS").as_deref() == Ok("0") {
        return Some("PLEXUS_SYSTEMD_TESTS=0".into());
    }
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (needs mount namespaces and cgroups)".into());
    }
    if !is_executable(Path::new(SYSTEMD_BIN)) {
        return Some(format!("{SYSTEMD_BIN} is missing"));
    }
    for tool in [
        "unshare",
        "nsenter",
        "timeout",
        "systemctl",
        "systemd-analyze",
    ] {
        if find_in_path(tool).is_none() {
            return Some(format!("`{tool}` is not installed"));
        }
    }
    if cgroup_roots().is_empty() {
        return Some("no usable cgroup hierarchy under /sys/fs/cgroup".into());
    }
    None
}

/// Polls `cond` every few milliseconds until it holds or `timeout` passes.
pub fn poll_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    super::daemon::poll(timeout, POLL, cond)
}

/// A running `systemd --user` manager in its own mount namespace and cgroups.
///
/// Create and drop it on the same thread: the manager gets SIGTERM when the
/// thread that started it ends (`PR_SET_PDEATHSIG`), so that a killed test
/// process does not leave it behind.
pub struct Manager {
    work: PathBuf,
    name: String,
    pid: u32,
    child: Option<Child>,
    /// `mnt:[inode]` of the manager's namespace.
    mnt_ns: String,
    cgroups: Vec<PathBuf>,
    console: Option<Console>,
    host_had_marker: bool,
    created_run_systemd: bool,
    foreign_before: HashMap<u32, (String, String)>,
    /// [`Manager::root_fs_dir`], once asked for.
    root_fs_dir: std::cell::OnceCell<PathBuf>,
    // Dropped last: the next manager may start only after the cleanup.
    _lock: FileLock,
}

impl Manager {
    /// Starts a manager, or prints `skipping: <why>` and returns `None` when
    /// this machine cannot run one. Panics when set-up fails for another
    /// reason (the environment claims to support it but does not).
    pub fn start() -> Option<Manager> {
        if let Some(why) = skip_reason() {
            println!("skipping: {why}");
            return None;
        }
        let lock = FileLock::acquire(Path::new(LOCK_FILE));
        sweep_stale();

        let host_had_marker = Path::new(MARKER).exists();
        let created_run_systemd = !Path::new("/run/systemd").exists();
        if created_run_systemd {
            fs::create_dir_all("/run/systemd").expect("create /run/systemd");
        }

        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "{PREFIX}{}-{}-{nanos:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        fs::create_dir_all(WORK_BASE).expect("create the work base dir");
        let work = Path::new(WORK_BASE).join(&name);
        fs::create_dir(&work).unwrap_or_else(|e| panic!("create {}: {e}", work.display()));
        // From here on, Drop cleans up whatever happens.
        let mut m = Manager {
            work,
            name,
            pid: 0,
            child: None,
            mnt_ns: String::new(),
            cgroups: Vec::new(),
            console: None,
            host_had_marker,
            created_run_systemd,
            foreign_before: HashMap::new(),
            root_fs_dir: std::cell::OnceCell::new(),
            _lock: lock,
        };
        fs::set_permissions(&m.work, fs::Permissions::from_mode(0o755)).unwrap();
        for d in ["run", "config", "data", "state", "cache", "home", "units"] {
            fs::create_dir(m.work.join(d)).unwrap();
        }
        write_minimal_units(&m.work.join("units"));
        for root in cgroup_roots() {
            let dir = root.join(&m.name);
            fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            m.cgroups.push(dir);
        }
        m.foreign_before = foreign_cgroups(&m.name);
        let console = Console::open(&m.work.join("manager.log"));
        let console = match console {
            Ok(c) => Some(c),
            Err(e) => {
                // Without a tty console the manager would log nowhere useful;
                // --log-target=null below keeps it off the real console.
                eprintln!("systemd harness: no pty for the manager log ({e}), logging to null");
                None
            }
        };
        m.console = console;
        m.spawn_manager();
        m.wait_until_running();
        Some(m)
    }

    /// The run's private directory on the host (sockets, logs, configs).
    pub fn work_dir(&self) -> &Path {
        &self.work
    }

    /// A directory of this run on the root file system
    /// (`/var/lib/plexus-systemd-tests/<name>`), removed with the manager.
    ///
    /// The work dir is no place to test what `ProtectSystem=strict` keeps
    /// read-only: a unit that implies `MountAPIVFS=` (`ProtectControlGroups=`,
    /// `ProtectKernelTunables=`) keeps the whole of /run writable, because
    /// systemd leaves the /run mount point out of its read-only remount. Paths
    /// outside /run, /tmp (`PrivateTmp=`) and the home directories
    /// (`ProtectHome=`) are read-only to such a unit unless it lists them.
    pub fn root_fs_dir(&self) -> &Path {
        self.root_fs_dir.get_or_init(|| {
            let dir = Path::new(ROOT_FS_BASE).join(&self.name);
            fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            fs::set_permissions(ROOT_FS_BASE, fs::Permissions::from_mode(0o755)).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
            dir
        })
    }

    /// The manager's pid (also the target for `nsenter`).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Writes several unit files, then reloads the manager once.
    pub fn install_units(&self, units: &[(&str, &str)]) {
        for (name, contents) in units {
            assert!(!name.contains('/'), "unit name {name:?}");
            let path = self.work.join("units").join(name);
            let tmp = path.with_extension("tmp~");
            fs::write(&tmp, contents).unwrap();
            fs::rename(&tmp, &path).unwrap();
        }
        self.systemctl_ok(&["daemon-reload"]);
    }

    /// Runs `systemctl --user ARGS` inside the manager's mount namespace.
    pub fn systemctl(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg("--mount")
            .arg(format!("--target={}", self.pid))
            .args(["--", "timeout", "-k", "5", SYSTEMCTL_TIMEOUT, "systemctl"])
            .args(["--user", "--no-pager", "--no-ask-password"])
            .args(args)
            .env_clear()
            .envs(self.client_env())
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter/systemctl")
    }

    /// Like [`Manager::systemctl`] but panics (with the manager log) unless it
    /// succeeds; returns stdout.
    pub fn systemctl_ok(&self, args: &[&str]) -> String {
        let out = self.systemctl(args);
        if !out.status.success() {
            panic!(
                "systemctl --user {} failed ({}):\nstdout: {}\nstderr: {}\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.describe_failure(),
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// One property of a unit (`systemctl show -p PROP --value UNIT`).
    pub fn show(&self, unit: &str, property: &str) -> String {
        let p = format!("--property={property}");
        self.systemctl_ok(&["show", &p, "--value", unit])
            .trim_end_matches('\n')
            .to_string()
    }

    /// Several properties of a unit in one call.
    pub fn show_all(&self, unit: &str, properties: &[&str]) -> HashMap<String, String> {
        let mut args = vec!["show".to_string()];
        args.extend(properties.iter().map(|p| format!("--property={p}")));
        args.push(unit.to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.systemctl_ok(&args)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Polls `cond` until it holds; panics with `what` and the logs after
    /// `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
        if !poll_until(timeout, cond) {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                self.describe_failure()
            );
        }
    }

    /// Waits until `unit`'s `property` equals `value`.
    pub fn wait_property(&self, unit: &str, property: &str, value: &str, timeout: Duration) {
        let mut last = String::new();
        if !poll_until(timeout, || {
            last = self.show(unit, property);
            last == value
        }) {
            panic!(
                "timed out after {timeout:?} waiting for {unit} {property}={value} (last: {last:?})\n{}",
                self.describe_failure()
            );
        }
    }

    /// Tails of the manager log and of every `*.log`/`*.out` file in the work
    /// dir, for failure messages.
    pub fn describe_failure(&self) -> String {
        let mut s = String::new();
        let mut files: Vec<PathBuf> = fs::read_dir(&self.work)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            let ext = f.extension().and_then(OsStr::to_str).unwrap_or("");
            if ext != "log" && ext != "out" {
                continue;
            }
            let text = fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            s.push_str(&format!(
                "---- {} (last {} lines)\n{}\n",
                f.display(),
                tail.len(),
                tail.join("\n")
            ));
        }
        s
    }

    /// Every process in this manager's cgroups (the manager, its units and
    /// whatever they started).
    pub fn processes(&self) -> BTreeSet<u32> {
        cgroup_pids(&self.cgroups)
    }

    pub fn client_env(&self) -> Vec<(String, String)> {
        let w = |d: &str| self.work.join(d).display().to_string();
        vec![
            ("PATH".into(), PATH_ENV.into()),
            ("HOME".into(), w("home")),
            ("XDG_RUNTIME_DIR".into(), w("run")),
            ("XDG_CONFIG_HOME".into(), w("config")),
            ("XDG_DATA_HOME".into(), w("data")),
            ("XDG_STATE_HOME".into(), w("state")),
            ("XDG_CACHE_HOME".into(), w("cache")),
            ("SYSTEMD_UNIT_PATH".into(), w("units")),
            ("SYSTEMD_PAGER".into(), "cat".into()),
            ("SYSTEMD_COLORS".into(), "0".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ]
    }
}
