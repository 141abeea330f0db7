//! Locks around what tests share with other tests, in this process and in
//! other test runs on the machine: `flock(2)` on a file, which two threads
//! of one process contend for as two processes do (each opens the file).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

/// The lock of the host's own paths and names that some tests create,
/// use and remove as they find them: README's quick start
/// (`/run/plexus`, `/var/lib/plexus`, `/var/lib/cni`, bridges `plexusbr0`
/// and `plexusbr1`) and host-local's default store `/var/lib/cni` under
/// plexusd.service's sandbox. Two of them at once would remove what the
/// other still uses.
pub const HOST_PATHS: &str = "/tmp/plexus-host-paths-tests.lock";

/// Holds [`HOST_PATHS`] until dropped.
pub fn host_paths() -> FileLock {
    FileLock::acquire(Path::new(HOST_PATHS))
}

/// flock(2) on a file; released when dropped (the lock lasts as long as
/// the descriptor is open).
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Waits for the lock on `path` (created if missing); panics after 10
    /// minutes.
    pub fn acquire(path: &Path) -> FileLock {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o644)
            .open(path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut told = false;
        loop {
            // SAFETY: flock(2) on a descriptor `file` owns; no memory involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return FileLock { _file: file };
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                panic!("flock {}: {e}", path.display());
            }
            if Instant::now() >= deadline {
                panic!("another test held {} for 10 minutes", path.display());
            }
            if !told {
                told = true;
                eprintln!("waiting for {}", path.display());
            }
            thread::sleep(Duration::from_millis(25));
        }
    }
}
