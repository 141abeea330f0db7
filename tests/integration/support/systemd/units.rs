//! Unit files as the tests use them: the repository's units adapted to a
//! private manager, `systemd-analyze verify` run offline, scratch dirs.

use std::fs::{self};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;

use super::{skip_reason, COUNTER, MOUNT_SOURCE, PREFIX};
use crate::support::daemon::PLEXUSD;

pub const SOCKET_UNIT: &str = "plexusd.socket";
pub const SERVICE_UNIT: &str = "plexusd.service";
pub const SHIM_LINK_UNIT: &str = "plexus-shim-link.service";
pub const PLUGINS_SOCKET_UNIT: &str = "plexus-plugins.socket";
pub const PLUGINS_SERVICE_UNIT: &str = "plexus-plugins.service";
const REPO_PLUGINS_SOCKET_PATH: &str = "/run/plexus/plugins.sock";
const REPO_SPAWNER_EXEC_START: &str =
    "ExecStart=/usr/libexec/plexus/plexus-spawner --config /etc/plexus/daemon-config.json";
pub const SPAWNER: &str = env!("CARGO_BIN_EXE_plexus-spawner");
const REPO_SOCKET_PATH: &str = "/run/plexus/plexus.sock";
const REPO_EXEC_START: &str = "ExecStart=/usr/bin/plexusd --config /etc/plexus/daemon-config.json";
/// The runtime's plugin directory that plexus-shim-link.service links into.
const REPO_LINK_DIR: &str = "/opt/cni/bin";
/// The shim as the Debian package installs it (the link's target).
const REPO_SHIM: &str = "/usr/lib/cni/plexus-shim";

/// Runs `systemd-analyze ARGS` in a throw-away mount namespace with a tmpfs
/// over /run/systemd, so that its side effects (`/run/systemd/systemd-units-load`)
/// never reach the host. `None` (after printing why) when it cannot run here.
pub fn analyze_offline(args: &[&str]) -> Option<Output> {
    if let Some(why) = skip_reason() {
        println!("skipping: {why}");
        return None;
    }
    assert!(
        Path::new("/run/systemd").is_dir(),
        "/run/systemd is missing on the host; cannot mount over it"
    );
    let script =
        format!("mount -t tmpfs -o mode=0755,size=16m {MOUNT_SOURCE} /run/systemd && exec \"$@\"");
    let out = Command::new("timeout")
        .args([
            "-k",
            "5",
            "60",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
        ])
        .args(["/bin/sh", "-c", &script, "sh", "systemd-analyze"])
        .args(args)
        .env("SYSTEMD_PAGER", "cat")
        .env("SYSTEMD_COLORS", "0")
        .stdin(Stdio::null())
        .output()
        .expect("run unshare/systemd-analyze");
    Some(out)
}

/// A fresh scratch directory under /tmp named after this process, removed on
/// drop (for tests that need files but no manager).
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> ScratchDir {
        let dir = Path::new("/tmp").join(format!(
            "{PREFIX}{}-{}-{tag}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        ScratchDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------
// helpers

pub fn repo_unit(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("systemd")
        .join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

pub(super) fn replace_once(text: &str, from: &str, to: &str, unit: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "{unit} no longer contains exactly one {from:?}; update the substitutions in \
         tests/integration/support/systemd.rs"
    );
    text.replacen(from, to, 1)
}

/// Inserts `lines` right after the `[section]` header.
pub(super) fn add_to_section(text: &str, section: &str, lines: &str, unit: &str) -> String {
    let header = format!("[{section}]\n");
    replace_once(text, &header, &format!("{header}{lines}"), unit)
}

/// The repository's units ([`SOCKET_UNIT`], [`SERVICE_UNIT`]) with only the
/// paths substituted: the socket node and the config in `work`, ExecStart a
/// copy of the built plexusd. With `for_manager`, output goes to
/// `<work>/plexusd.log` (there is no journald) and the start rate limit is
/// off (tests and the bench restart on purpose).
pub fn plexus_units(work: &Path, for_manager: bool) -> (String, String) {
    let sock = work.join("sock/plexus.sock");
    let socket = replace_once(
        &repo_unit(SOCKET_UNIT),
        REPO_SOCKET_PATH,
        sock.to_str().unwrap(),
        SOCKET_UNIT,
    );
    // The unit runs with PrivateTmp=yes: a binary built under /tmp (a
    // checkout there) would be invisible to it, so run a copy from the
    // work dir, which is outside /tmp.
    let bin = work.join("plexusd");
    fs::copy(PLEXUSD, &bin).expect("copy plexusd into the work dir");
    let exec = format!(
        "ExecStart={} --config {}",
        bin.display(),
        work.join("daemon-config.json").display()
    );
    let mut service = replace_once(
        &repo_unit(SERVICE_UNIT),
        REPO_EXEC_START,
        &exec,
        SERVICE_UNIT,
    );
    if for_manager {
        let log = work.join("plexusd.log");
        service = add_to_section(&service, "Unit", "StartLimitIntervalSec=0\n", SERVICE_UNIT);
        let output = format!(
            "StandardOutput=append:{0}\nStandardError=append:{0}\n",
            log.display()
        );
        service = add_to_section(&service, "Service", &output, SERVICE_UNIT);
    }
    (socket, service)
}

/// The repository's plugin spawner units ([`PLUGINS_SOCKET_UNIT`],
/// [`PLUGINS_SERVICE_UNIT`]) with only the paths substituted: the socket
/// at [`plugins_socket`]`(work)`, ExecStart a copy of the built
/// plexus-spawner reading `<work>/daemon-config.json`. With `for_manager`,
/// output goes to `<work>/plexus-plugins.log`.
pub fn plugin_units(work: &Path, for_manager: bool) -> (String, String) {
    let socket = replace_once(
        &repo_unit(PLUGINS_SOCKET_UNIT),
        REPO_PLUGINS_SOCKET_PATH,
        plugins_socket(work).to_str().unwrap(),
        PLUGINS_SOCKET_UNIT,
    );
    let bin = work.join("plexus-spawner");
    fs::copy(SPAWNER, &bin).expect("copy plexus-spawner into the work dir");
    let exec = format!(
        "ExecStart={} --config {}",
        bin.display(),
        work.join("daemon-config.json").display()
    );
    let mut service = replace_once(
        &repo_unit(PLUGINS_SERVICE_UNIT),
        REPO_SPAWNER_EXEC_START,
        &exec,
        PLUGINS_SERVICE_UNIT,
    );
    if for_manager {
        let log = work.join("plexus-plugins.log");
        service = add_to_section(
            &service,
            "Unit",
            "StartLimitIntervalSec=0\n",
            PLUGINS_SERVICE_UNIT,
        );
        let output = format!(
            "StandardOutput=append:{0}\nStandardError=append:{0}\n",
            log.display()
        );
        service = add_to_section(&service, "Service", &output, PLUGINS_SERVICE_UNIT);
    }
    (socket, service)
}

/// Where [`plugin_units`]' socket listens for a manager's `work` dir.
pub fn plugins_socket(work: &Path) -> PathBuf {
    work.join("sock/plugins.sock")
}

/// `unit` (a plexus-shim-link.service) linking into `link_dir` instead
/// of /opt/cni/bin, to `shim` instead of the packaged shim, its output
/// appended to `log` (there is no journald).
pub fn shim_link_unit(unit: &str, link_dir: &Path, shim: &Path, log: &Path) -> String {
    assert!(
        unit.contains(REPO_LINK_DIR) && unit.contains(REPO_SHIM),
        "{SHIM_LINK_UNIT} no longer names {REPO_LINK_DIR} and {REPO_SHIM}; update \
         tests/integration/support/systemd/units.rs"
    );
    let unit = unit
        .replace(REPO_LINK_DIR, link_dir.to_str().unwrap())
        .replace(REPO_SHIM, shim.to_str().unwrap());
    let output = format!(
        "StandardOutput=append:{0}\nStandardError=append:{0}\n",
        log.display()
    );
    add_to_section(&unit, "Service", &output, SHIM_LINK_UNIT)
}

/// `unit` with each of its `ReadWritePaths=` moved below `root` (`-/run/x`
/// becomes `-<root>/run/x`), for a test that recreates those paths there;
/// the other sandbox options stay as they are.
pub fn reroot_read_write_paths(unit: &str, root: &Path) -> String {
    let mut found = false;
    let lines: Vec<String> = unit
        .lines()
        .map(|line| {
            let Some(paths) = line.strip_prefix("ReadWritePaths=") else {
                return line.to_string();
            };
            found = true;
            let moved: Vec<String> = paths
                .split_whitespace()
                .map(|p| {
                    let (dash, path) = match p.strip_prefix('-') {
                        Some(rest) => ("-", rest),
                        None => ("", p),
                    };
                    let path = path
                        .strip_prefix('/')
                        .unwrap_or_else(|| panic!("ReadWritePaths= entry {p:?} is not absolute"));
                    format!("{dash}{}", root.join(path).display())
                })
                .collect();
            format!("ReadWritePaths={}", moved.join(" "))
        })
        .collect();
    assert!(found, "no ReadWritePaths= in the unit");
    lines.join("\n") + "\n"
}

/// Asserts that `systemd-analyze verify` accepts `files` (unit files) and
/// prints nothing; does nothing where systemd-analyze cannot run.
pub fn assert_verifies(files: &[&str]) {
    let mut args = vec!["verify", "--man=no"];
    args.extend_from_slice(files);
    let Some(out) = analyze_offline(&args) else {
        return;
    };
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && printed.trim().is_empty(),
        "systemd-analyze verify ({}) printed:\n{printed}",
        out.status
    );
}
