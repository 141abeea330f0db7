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
}

/// A held lock, released when dropped (its descriptor closes).
#[derive(Debug)]
pub struct Held {
    /// Kept open for the lock: closing it releases the lock. Shared with
    /// [`Markers`](super::Markers), which keeps the running plugin's group in it.
    pub(super) file: Arc<File>,
    pub(super) path: PathBuf,
}

impl Held {
    /// Removes the lock file while still holding it, then releases it.
    /// Safe because every taker checks, once it holds a lock, that the
    /// path still names the file it locked, and starts over if not.
    pub fn unlink(self) -> Result<(), Error> {
        match fs::remove_file(&self.path) {
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
        Ok(Self { dir })
    }

    fn path(&self, container_id: &str) -> PathBuf {
        self.dir.join(format!("{container_id}.lock"))
    }

    /// Locks container `container_id`, waiting as long as it takes.
    pub fn lock(&self, container_id: &str) -> Result<Held, Error> {
        acquire(&self.path(container_id), libc::LOCK_EX, true)
    }

    /// Locks container `container_id` if nobody holds it; `None` if
    /// someone does.
    pub fn try_lock(&self, container_id: &str) -> Result<Option<Held>, Error> {
        let path = self.path(container_id);
        match acquire(&path, libc::LOCK_EX | libc::LOCK_NB, false) {
            Ok(h) => Ok(Some(h)),
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The lock every operation holds shared while it runs.
    pub fn gc_shared(&self) -> Result<Held, Error> {
        acquire(&self.dir.join(GC_LOCK), libc::LOCK_SH, true)
    }

    /// The lock the plugins' GC holds exclusively.
    pub fn gc_exclusive(&self) -> Result<Held, Error> {
        acquire(&self.dir.join(GC_LOCK), libc::LOCK_EX, true)
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

/// Opens (creating it 0600, never through a symbolic link) and flocks
/// `path`. Without LOCK_NB it tries a non-blocking lock first, then waits.
/// With LOCK_NB, a lock held elsewhere is an `Io` error of kind
/// `WouldBlock`.
fn acquire(path: &Path, op: i32, wait: bool) -> Result<Held, Error> {
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
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
        // The previous holder may have unlinked the file (the container's
        // record went away), and someone may have made a new one since: a
        // lock on an unlinked file excludes nobody, so start over.
        let mine = file
            .metadata()
            .map_err(io_error(path, "cannot stat the lock file"))?;
        match fs::symlink_metadata(path) {
            Ok(m) if m.dev() == mine.dev() && m.ino() == mine.ino() => {
                return Ok(Held {
                    file: Arc::new(file),
                    path: path.to_path_buf(),
                })
            }
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(path, "cannot look up the lock file")(e)),
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
