//! The host as the harness sees it: tools on PATH, cgroups and the
//! processes in them, mount namespaces, and the sweep of what killed runs
//! left.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{poll_until, PATH_ENV, PREFIX, ROOT_FS_BASE, WORK_BASE};

pub(super) fn is_executable(p: &Path) -> bool {
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

pub(super) fn find_in_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_else(|_| PATH_ENV.into());
    path.split(':')
        .chain(PATH_ENV.split(':'))
        .map(|d| Path::new(d).join(tool))
        .find(|p| is_executable(p))
}

/// Cgroup hierarchies the manager must be placed in: `systemd` (named v1) and
/// `unified` on hybrid hosts, the root on pure cgroup v2.
pub(super) fn cgroup_roots() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.to_path_buf()];
    }
    let mut roots = Vec::new();
    if base.join("systemd/cgroup.procs").exists() {
        roots.push(base.join("systemd"));
    }
    if base.join("unified/cgroup.controllers").exists() {
        roots.push(base.join("unified"));
    }
    roots
}

pub(super) fn cgroup_pids(dirs: &[PathBuf]) -> BTreeSet<u32> {
    fn walk(dir: &Path, out: &mut BTreeSet<u32>) {
        if let Ok(s) = fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(rd) = fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    walk(&e.path(), out);
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for d in dirs {
        walk(d, &mut out);
    }
    out
}

/// rmdir a cgroup and its children, deepest first.
pub(super) fn remove_cgroup_tree(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for e in fs::read_dir(dir)?.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_cgroup_tree(&e.path())?;
        }
    }
    // A cgroup whose last process just died can be busy for a moment.
    let mut last = Ok(());
    poll_until(Duration::from_secs(5), || {
        last = fs::remove_dir(dir);
        last.is_ok() || !dir.exists()
    });
    if dir.exists() {
        last
    } else {
        Ok(())
    }
}

fn proc_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn pids_in_mount_ns(ns: &str) -> BTreeSet<u32> {
    proc_pids()
        .into_iter()
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .map(|p| p.as_os_str() == OsStr::new(ns))
                .unwrap_or(false)
        })
        .collect()
}

/// pid -> (start time, /proc/pid/cgroup) of every process not in our run.
pub(super) fn foreign_cgroups(name: &str) -> HashMap<u32, (String, String)> {
    let mut map = HashMap::new();
    for pid in proc_pids() {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Ok(cg) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if cg.contains(name) {
            continue;
        }
        // Field 22 (starttime), counted after the parenthesised comm.
        let start = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(19))
            .unwrap_or("")
            .to_string();
        map.insert(pid, (start, cg));
    }
    map
}

/// A cgroup path as a systemd manager would create it.
pub(super) fn looks_systemd_made(cgroups: &str) -> bool {
    cgroups.lines().any(|l| {
        let path = l.splitn(3, ':').nth(2).unwrap_or("");
        [".scope", ".slice", ".service", ".socket"]
            .iter()
            .any(|s| path.ends_with(s))
    })
}

/// Removes leftovers of test processes that died without cleaning up. Only
/// called under the lock, so no live manager of ours can be affected.
pub(super) fn sweep_stale() {
    let stale_pid = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix(PREFIX) else {
            return false;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            return false;
        };
        // SAFETY: kill(2) with signal 0 only asks whether the pid exists.
        pid != std::process::id() as i32
            && unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    };
    for root in cgroup_roots() {
        let Ok(rd) = fs::read_dir(&root) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(PREFIX) {
                continue;
            }
            // Under the lock every harness cgroup is stale, whoever made it.
            let dir = e.path();
            eprintln!("systemd harness: removing stale cgroup {}", dir.display());
            poll_until(Duration::from_secs(5), || {
                let pids = cgroup_pids(std::slice::from_ref(&dir));
                for pid in &pids {
                    // SAFETY: kill(2) of a leftover process of an earlier run; no memory involved.
                    unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
                }
                pids.is_empty()
            });
            let _ = remove_cgroup_tree(&dir);
        }
    }
    for base in [WORK_BASE, ROOT_FS_BASE, "/tmp"] {
        let Ok(rd) = fs::read_dir(base) else { continue };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale_pid(&name) && !e.path().join("KEEP").exists() && e.path().is_dir() {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}
