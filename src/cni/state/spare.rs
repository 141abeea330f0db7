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
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};

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
    free: Arc<Mutex<Vec<PathBuf>>>,
    /// Empties the spares given back before they return to `free`, when
    /// the pool was made with [`Spares::emptied`].
    emptier: Option<Emptier>,
}

impl Spares {
    /// An empty pool for `dir`; touches nothing on disk.
    pub(super) fn new(dir: PathBuf) -> Self {
        let pool = POOLS.fetch_add(1, Ordering::Relaxed);
        Self {
            dir,
            prefix: format!("{PREFIX}{}.{pool}.", std::process::id()),
            seq: AtomicU64::new(0),
            free: Arc::new(Mutex::new(Vec::new())),
            emptier: None,
        }
    }

    /// [`Spares::new`] for files written without a sync (records): a
    /// spare given back is cut to nothing by a thread of the pool (shortly
    /// after, see [`EMPTY_AFTER`]) before it can be taken again, so that
    /// such a write finds it empty and need not free its blocks itself, on
    /// the caller's time (freeing blocks can wait on the disk: ext4 mounted
    /// with `discard`, without a journal, discards them before the truncate
    /// returns). A writer still empties a spare it finds full: the thread
    /// may be behind, or may not have started.
    pub(super) fn emptied(dir: PathBuf) -> Self {
        let mut spares = Self::new(dir);
        spares.emptier = Some(Emptier::default());
        spares
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
        if !self.has_room() {
            let _ = fs::remove_file(&spare);
            return;
        }
        let spare = match &self.emptier {
            Some(emptier) => match emptier.send(spare, &self.free) {
                Ok(()) => return,
                Err(spare) => spare,
            },
            None => spare,
        };
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(spare);
    }

    /// Whether the pool holds fewer than [`MAX_SPARES`], those being
    /// emptied included.
    fn has_room(&self) -> bool {
        let emptying = self.emptier.as_ref().map_or(0, Emptier::pending);
        let free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        free.len() + emptying < MAX_SPARES
    }

    /// Waits (10 s at most) until no spare is being emptied.
    #[cfg(test)]
    pub(super) fn settle(&self) {
        let Some(emptier) = &self.emptier else {
            return;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while emptier.pending() > 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
    }

    /// How many spares the pool holds, once none is being emptied.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.settle();
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
        if meta.is_file() && self.has_room() {
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
            if !self.has_room() || prepare(&path).is_err() {
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

/// How long the thread of [`Spares::emptied`] waits before it empties
/// spares just given back (and those given back meanwhile). Each round
/// wakes the thread twice, a context switch that costs tens of µs of CPU
/// on a VM: one round per 100 ms spans a dozen sequential calls, where one
/// per 20 ms took a round for every one or two. The spares being emptied
/// meanwhile (two or three per call) stay well under [`MAX_SPARES`].
/// The unit tests, which wait for the thread between steps, wait less.
const EMPTY_AFTER: std::time::Duration = if cfg!(test) {
    std::time::Duration::from_millis(5)
} else {
    std::time::Duration::from_millis(100)
};

/// The thread of a pool that empties the spares given back, started with
/// the first one, and ended when the pool is dropped.
#[derive(Debug, Default)]
struct Emptier {
    to_empty: Mutex<Option<mpsc::Sender<PathBuf>>>,
    /// Spares sent and not back in the pool yet.
    pending: Arc<AtomicUsize>,
}

impl Emptier {
    fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Hands `spare` to the thread, which puts it in `free` once empty;
    /// the spare back when there is no thread (it could not be started).
    fn send(&self, spare: PathBuf, free: &Arc<Mutex<Vec<PathBuf>>>) -> Result<(), PathBuf> {
        let mut to_empty = self.to_empty.lock().unwrap_or_else(PoisonError::into_inner);
        if to_empty.is_none() {
            let (tx, rx) = mpsc::channel::<PathBuf>();
            let (free, pending) = (free.clone(), self.pending.clone());
            let started = std::thread::Builder::new()
                .name("plexusd-spares".into())
                .stack_size(64 << 10)
                .spawn(move || {
                    while let Ok(first) = rx.recv() {
                        // The call that gave the spare back is still
                        // answering: the disk wait of emptying it would
                        // share the machine with that answer.
                        std::thread::sleep(EMPTY_AFTER);
                        for spare in std::iter::once(first).chain(rx.try_iter()) {
                            empty(&spare);
                            free.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(spare);
                            pending.fetch_sub(1, Ordering::AcqRel);
                        }
                    }
                });
            if started.is_err() {
                return Err(spare);
            }
            *to_empty = Some(tx);
        }
        let Some(tx) = to_empty.as_ref() else {
            return Err(spare);
        };
        self.pending.fetch_add(1, Ordering::AcqRel);
        tx.send(spare).map_err(|back| {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            back.0
        })
    }
}

/// Cuts the spare at `path` to nothing, when it is a regular file: never
/// through a symbolic link, never waiting on a FIFO. Best effort: a writer
/// checks the spare's size again.
pub(super) fn empty(path: &Path) {
    let opened = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    if let Ok(f) = opened {
        if f.metadata().is_ok_and(|m| m.is_file() && m.len() > 0) {
            let _ = f.set_len(0);
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
