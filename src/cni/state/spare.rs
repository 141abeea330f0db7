//! Spare files: inodes a directory keeps for reuse, so that writing a
//! record or taking a new container's lock does not create a file, and
//! removing one does not free it. A file system pays for each inode it
//! allocates (ext4 without a journal scans past every recently freed one)
//! and each creation holds the directory's lock; a rename within the
//! directory allocates nothing.
//!
//! A spare is named `.free.<pid>.<pool>.<n>`, in the directory it serves
//! (a rename into another directory would take the file system's global
//! rename lock). No container id starts with a dot, so no reader takes a
//! spare for a record, a lock or a temporary file, and older plexusd
//! versions leave them alone. A spare's content means nothing and is never
//! read. Each pool uses only the names it made (its process id and its
//! own number are in them), and copes with a name that vanished or is
//! taken (another daemon on the same directory adopting a dead daemon's
//! spares, or a planted file): a spare that is not a regular file is never
//! used, followed or written through.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// What every spare's name starts with.
const PREFIX: &str = ".free.";
/// Spares kept per directory by one daemon; past it, a file given back is
/// unlinked, as before there were spares.
pub(super) const MAX_SPARES: usize = 64;

/// Numbers the pools of this process, so that two pools on one directory
/// (two stores of one process) never make the same name.
static POOLS: AtomicU64 = AtomicU64::new(0);

/// The spare files of one directory that this pool made or adopted.
#[derive(Debug)]
pub(super) struct Spares {
    dir: PathBuf,
    /// `.free.<pid>.<pool>.`
    prefix: String,
    seq: AtomicU64,
    free: Mutex<Vec<PathBuf>>,
}

impl Spares {
    /// An empty pool for `dir`; touches nothing on disk.
    pub(super) fn new(dir: PathBuf) -> Self {
        let pool = POOLS.fetch_add(1, Ordering::Relaxed);
        Self {
            dir,
            prefix: format!("{PREFIX}{}.{pool}.", std::process::id()),
            seq: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
        }
    }

    /// A name of this pool that it has not used yet.
    pub(super) fn fresh_name(&self) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("{}{n}", self.prefix))
    }

    /// Takes a spare out of the pool: its name is the caller's until it
    /// gives it back with [`Spares::put`] or renames it away. The file
    /// may have vanished or been replaced since: check what is opened.
    pub(super) fn take(&self) -> Option<PathBuf> {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    /// Gives `spare`, a name of this pool, back; unlinked when the pool is
    /// full.
    pub(super) fn put(&self, spare: PathBuf) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < MAX_SPARES {
            free.push(spare);
            return;
        }
        drop(free);
        let _ = fs::remove_file(&spare);
    }

    /// How many spares the pool holds.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Takes `path`, a regular file of the directory no longer wanted
    /// under its name, away from that name: renamed to a spare when the
    /// pool has room, else (or when the rename cannot be made, for
    /// instance for want of space on a full file system) unlinked, which
    /// needs no space. NotFound when there is no such file. Anything but
    /// a regular file (a symbolic link, never followed) is unlinked.
    pub(super) fn retire(&self, path: &Path) -> io::Result<()> {
        let meta = fs::symlink_metadata(path)?;
        let room = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            < MAX_SPARES;
        if meta.is_file() && room {
            let spare = self.fresh_name();
            match rename2(path, &spare, libc::RENAME_NOREPLACE) {
                Ok(()) => {
                    self.put(spare);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
                // No space for the new name, a file system without
                // renameat2's flags, a planted file of that name: unlink.
                Err(_) => {}
            }
        }
        fs::remove_file(path)
    }

    /// Start-up: the spares that daemons no longer alive left in the
    /// directory become this pool's (renamed to its names, each first
    /// passed to `prepare`, which may refuse it) while it has room; the
    /// others are unlinked. Spares of live processes (a daemon sharing the
    /// directory) and whatever is not a regular file are left alone.
    pub(super) fn adopt(&self, prepare: impl Fn(&Path) -> io::Result<()>) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut alive: HashSet<u32> = HashSet::new();
        let mut dead: HashSet<u32> = HashSet::new();
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(spare_pid) else {
                continue;
            };
            if alive.contains(&pid) || (!dead.contains(&pid) && process_alive(pid)) {
                alive.insert(pid);
                continue;
            }
            dead.insert(pid);
            let path = e.path();
            if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
                continue;
            }
            let full = self
                .free
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
                >= MAX_SPARES;
            if full || prepare(&path).is_err() {
                let _ = fs::remove_file(&path);
                continue;
            }
            let spare = self.fresh_name();
            if rename2(&path, &spare, libc::RENAME_NOREPLACE).is_ok() {
                self.put(spare);
            }
        }
    }
}

/// The pid in a spare's name, `.free.<pid>.<pool>.<n>`; None for any other
/// name.
fn spare_pid(name: &str) -> Option<u32> {
    let mut parts = name.strip_prefix(PREFIX)?.split('.');
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (pid, pool, n) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !numeric(pool) || !numeric(n) || !numeric(pid) {
        return None;
    }
    pid.parse().ok()
}

/// Whether process `pid` exists (ours included). When unsure, alive: a
/// live daemon's spares must never be taken.
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    if pid <= 0 {
        return true;
    }
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// renameat2(2) within the file system, with `flags` (RENAME_NOREPLACE,
/// RENAME_EXCHANGE); never follows a symbolic link (renames never do).
pub(super) fn rename2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both are NUL-terminated strings that outlive the call; the
    // syscall reads them and nothing else of our memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `e` says renameat2's flags are not supported here (an old kernel,
/// a file system without them): the caller falls back to a plain rename.
pub(super) fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_spare_names_should_give_a_pid() {
        assert_eq!(spare_pid(".free.12.0.3"), Some(12));
        for name in [
            ".free.12.0",
            ".free.12.0.3.4",
            ".free.a.0.3",
            ".free..0.3",
            "free.12.0.3",
            ".gc.lock",
            ".c1.12.3.tmp",
            "c1.json",
        ] {
            assert_eq!(spare_pid(name), None, "{name}");
        }
    }
}
