//! The per-container locks, `locks/<id>.lock`, flock'ed across every
//! read-modify-write of a record and the plugin runs of that operation,
//! and the GC lock every operation holds shared.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::atomic::create_private_dir;
use super::marker::blank;
use super::spare::{rename2, unsupported, Spares};
use super::{io_error, Error};
use crate::names::is_valid_name;

/// Held shared by every operation, exclusively by the plugins' GC. A
/// container id starts with a letter or digit, so no container's lock file
/// can have this name.
const GC_LOCK: &str = ".gc.lock";

/// The per-container lock files, `<stateDir>/locks/<id>.lock`.
#[derive(Debug)]
pub struct Locks {
    dir: PathBuf,
    /// Lock files given up by containers that have no record any more,
    /// their markers blanked, kept for the next new container (see
    /// `spare.rs`).
    spares: Arc<Spares>,
}

/// A held lock, released when dropped (its descriptor closes).
#[derive(Debug)]
pub struct Held {
    /// Kept open for the lock: closing it releases the lock. Shared with
    /// [`Markers`](super::Markers), which keeps the running plugin's group in it.
    pub(super) file: Arc<File>,
    pub(super) path: PathBuf,
    /// Where the file goes when it is given up; None for the GC lock.
    spares: Option<Arc<Spares>>,
}

impl Held {
    /// Takes the lock file away from its name while still holding it, then
    /// releases it: its marker is blanked (whatever it named, no later
    /// holder of the file may act on it) and it is renamed to a spare for
    /// a later container's lock, or unlinked when the pool is full or the
    /// blanking or the rename fails (an unlink needs no space). Safe
    /// because every taker checks, once it holds a lock, that the path
    /// still names the file it locked, and starts over if not.
    pub fn unlink(self) -> Result<(), Error> {
        let result = match &self.spares {
            Some(spares) if blank(&self.file).is_ok() => spares.retire(&self.path),
            _ => fs::remove_file(&self.path),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&self.path, "cannot remove the lock file")(e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Locks {
    /// Opens `<state_dir>/locks`, creating it (0700).
    pub fn open(state_dir: &Path) -> Result<Self, Error> {
        let dir = state_dir.join("locks");
        create_private_dir(&dir)?;
        let spares = Arc::new(Spares::new(dir.clone()));
        // A dead daemon's spares are blank already; blanked again all the
        // same, so that no marker can come back with one.
        spares.adopt(|path| {
            let f = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)?;
            if !f.metadata()?.is_file() {
                return Err(io::ErrorKind::InvalidInput.into());
            }
            blank(&f)
        });
        Ok(Self { dir, spares })
    }

    fn path(&self, container_id: &str) -> PathBuf {
        self.dir.join(format!("{container_id}.lock"))
    }

    /// Locks container `container_id`, waiting as long as it takes.
    pub fn lock(&self, container_id: &str) -> Result<Held, Error> {
        acquire(
            &self.path(container_id),
            libc::LOCK_EX,
            true,
            Some(&self.spares),
        )
    }

    /// Locks container `container_id` if nobody holds it; `None` if
    /// someone does.
    pub fn try_lock(&self, container_id: &str) -> Result<Option<Held>, Error> {
        let path = self.path(container_id);
        match acquire(
            &path,
            libc::LOCK_EX | libc::LOCK_NB,
            false,
            Some(&self.spares),
        ) {
            Ok(h) => Ok(Some(h)),
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The lock every operation holds shared while it runs.
    pub fn gc_shared(&self) -> Result<Held, Error> {
        acquire(&self.dir.join(GC_LOCK), libc::LOCK_SH, true, None)
    }

    /// The lock the plugins' GC holds exclusively.
    pub fn gc_exclusive(&self) -> Result<Held, Error> {
        acquire(&self.dir.join(GC_LOCK), libc::LOCK_EX, true, None)
    }

    /// Container ids that have a lock file.
    pub fn ids(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let id = name.to_str()?.strip_suffix(".lock")?;
                is_valid_name(id).then(|| id.to_string())
            })
            .collect()
    }
}

/// Opens (never through a symbolic link) and flocks `path`: when it does
/// not exist, a spare of `spares` is renamed to it (never over a file made
/// meanwhile), else it is created (0600). Without LOCK_NB it tries a
/// non-blocking lock first, then waits. With LOCK_NB, a lock held
/// elsewhere is an `Io` error of kind `WouldBlock`.
fn acquire(path: &Path, op: i32, wait: bool, spares: Option<&Arc<Spares>>) -> Result<Held, Error> {
    loop {
        let file = open_lock_file(path, spares.map(|s| &**s))
            .map_err(io_error(path, "cannot open the lock file"))?;
        let taken = flock(&file, op | libc::LOCK_NB).map_err(io_error(path, "cannot lock"))?;
        if !taken {
            if !wait {
                return Err(io_error(path, "locked by another operation")(
                    io::ErrorKind::WouldBlock.into(),
                ));
            }
            flock(&file, op).map_err(io_error(path, "cannot lock"))?;
        }
        // The previous holder may have taken the file away from its name
        // (the container's record went away; the file may even be back
        // under it, as a spare taken for the same container), and someone
        // may have made a new one since: a lock on a file the path does
        // not name excludes nobody, so start over.
        let mine = file
            .metadata()
            .map_err(io_error(path, "cannot stat the lock file"))?;
        match fs::symlink_metadata(path) {
            Ok(m) if m.dev() == mine.dev() && m.ino() == mine.ino() => {
                return Ok(Held {
                    file: Arc::new(file),
                    path: path.to_path_buf(),
                    spares: spares.cloned(),
                })
            }
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(path, "cannot look up the lock file")(e)),
        }
    }
}

/// The lock file `path`, opened read-write without following a symbolic
/// link; a missing one is a spare renamed to it, or a new file.
fn open_lock_file(path: &Path, spares: Option<&Spares>) -> io::Result<File> {
    let open = |create: bool| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    };
    let Some(spares) = spares else {
        return open(true);
    };
    loop {
        match open(false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            r => return r,
        }
        let Some(spare) = spares.take() else {
            return open(true);
        };
        // Only a regular file is ever given a lock's name.
        if !fs::symlink_metadata(&spare).is_ok_and(|m| m.is_file()) {
            continue;
        }
        match rename2(&spare, path, libc::RENAME_NOREPLACE) {
            // Opened at the top of the loop: it may be gone again already.
            Ok(()) => {}
            // Someone made it meanwhile: open theirs, keep the spare.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => spares.put(spare),
            // The spare is gone: try the next.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if unsupported(&e) => {
                spares.put(spare);
                return open(true);
            }
            Err(e) => {
                spares.put(spare);
                return Err(e);
            }
        }
    }
}

/// flock(2), retried on EINTR; Ok(false) when LOCK_NB was asked and the
/// lock is held elsewhere.
fn flock(file: &File, op: i32) -> io::Result<bool> {
    loop {
        // SAFETY: flock(2) on a descriptor `file` owns; no memory involved.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if op & libc::LOCK_NB != 0 => return Ok(false),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_lock_should_exclude_others_and_survive_being_unlinked() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Arc::new(Locks::open(dir.path()).unwrap());
        let held = locks.lock("c1").unwrap();
        assert!(locks.try_lock("c1").unwrap().is_none());
        assert!(locks.try_lock("c2").unwrap().is_some());

        let (tx, rx) = mpsc::channel();
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || {
                let h = locks.lock("c1").unwrap();
                tx.send(()).unwrap();
                // Held until the main thread has checked it is exclusive.
                std::thread::park();
                drop(h);
            })
        };
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        let path = held.path().to_path_buf();
        held.unlink().unwrap();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the waiter never got the lock");
        // The waiter locked a fresh file at the same path, so it still
        // excludes whoever comes next.
        assert!(path.exists());
        assert!(locks.try_lock("c1").unwrap().is_none());
        waiter.thread().unpark();
        waiter.join().unwrap();
        assert!(locks.try_lock("c1").unwrap().is_some());
        assert_eq!(locks.ids().len(), 2);
    }
}
