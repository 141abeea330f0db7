//! The listening socket: inherited from systemd (socket activation), or, as
//! a fallback, bound by the daemon itself without ever racing a successor.
//!
//! Under activation the socket node belongs to systemd and is never touched.
//! In self-bind mode the daemon binds a temporary name in the socket
//! directory, chmods it 0600 and renames it over the socket path, so the
//! path always names a live socket; it remembers the (device, inode) of the
//! path and unlinks it at exit only if it still names that inode. Renames
//! and the exit-time check-and-unlink happen under an exclusive `flock` on a
//! lock file beside the socket, so a successor's socket can never be removed.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::api;

pub const ENV_LISTEN_FDS: &str = "LISTEN_FDS";
pub const ENV_LISTEN_PID: &str = "LISTEN_PID";
pub const ENV_LISTEN_FDNAMES: &str = "LISTEN_FDNAMES";
/// The first fd systemd passes.
const LISTEN_FDS_START: i32 = 3;

/// Settings of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Directory of `plexus.sock` in self-bind mode.
    pub socket_dir: PathBuf,
}

impl Config {
    pub fn socket_path(&self) -> PathBuf {
        self.socket_dir.join(api::SOCKET_NAME)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("LISTEN_FDS={0:?} is not a number of file descriptors")]
    BadListenFds(String),
    #[error("LISTEN_PID={0:?} is not a process id")]
    BadListenPid(String),
    #[error(
        "LISTEN_PID={listen_pid} names another process (this is {own_pid}): \
         the inherited sockets were meant for that process"
    )]
    NotOurs { listen_pid: u32, own_pid: u32 },
    #[error("LISTEN_FDS=0: socket activation passed no socket")]
    NoFds,
    #[error("fd {fd} passed by systemd is not a unix stream socket")]
    BadFd {
        fd: i32,
        #[source]
        source: io::Error,
    },
    #[error("fd {fd} passed by systemd is a unix stream socket that is not listening")]
    NotListening { fd: i32 },
    #[error("cannot create the socket directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("cannot bind the socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How many sockets systemd passed to this process (0: not activated).
///
/// Pure: the caller supplies the variables and its own pid. A missing
/// `LISTEN_PID` is accepted (some launchers cannot know the pid before
/// exec); one naming another process is an error rather than a silent
/// fallback to binding, which could race the process the sockets are for.
pub fn passed_fds(
    listen_fds: Option<&str>,
    listen_pid: Option<&str>,
    own_pid: u32,
) -> Result<usize> {
    let Some(fds) = listen_fds.filter(|s| !s.is_empty()) else {
        return Ok(0);
    };
    let n: usize = fds
        .trim()
        .parse()
        .map_err(|_| Error::BadListenFds(fds.to_string()))?;
    if let Some(pid) = listen_pid.filter(|s| !s.is_empty()) {
        let listen_pid: u32 = pid
            .trim()
            .parse()
            .map_err(|_| Error::BadListenPid(pid.to_string()))?;
        if listen_pid != own_pid {
            return Err(Error::NotOurs {
                listen_pid,
                own_pid,
            });
        }
    }
    if n == 0 {
        return Err(Error::NoFds);
    }
    Ok(n)
}

/// The daemon's listening sockets and, in self-bind mode, the path it owns.
#[derive(Debug)]
pub struct Listeners {
    pub sockets: Vec<UnixListener>,
    pub owned: Option<OwnedPath>,
}

impl Listeners {
    /// Whether the sockets came from systemd.
    pub fn activated(&self) -> bool {
        self.owned.is_none()
    }
}

/// Takes the listeners: the inherited ones under socket activation, else a
/// safely self-bound `<socketDir>/plexus.sock`.
///
/// Must run before any other thread exists: it removes the `LISTEN_*`
/// variables from the environment so no child inherits them.
pub fn take(config: &Config) -> Result<Listeners> {
    let fds = std::env::var(ENV_LISTEN_FDS).ok();
    let pid = std::env::var(ENV_LISTEN_PID).ok();
    let n = passed_fds(fds.as_deref(), pid.as_deref(), std::process::id())?;
    if n == 0 {
        let (socket, owned) = bind(&config.socket_path())?;
        return Ok(Listeners {
            sockets: vec![socket],
            owned: Some(owned),
        });
    }
    let mut listenfd = listenfd::ListenFd::from_env();
    std::env::remove_var(ENV_LISTEN_FDNAMES);
    let mut sockets = Vec::with_capacity(n);
    for i in 0..n {
        let fd = LISTEN_FDS_START + i as i32;
        let socket = match listenfd.take_unix_listener(i) {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Err(Error::BadFd {
                    fd,
                    source: io::Error::new(io::ErrorKind::NotFound, "fd already taken"),
                })
            }
            Err(source) => return Err(Error::BadFd { fd, source }),
        };
        let listening =
            nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::AcceptConn).map_err(
                |e| Error::BadFd {
                    fd,
                    source: e.into(),
                },
            )?;
        if !listening {
            return Err(Error::NotListening { fd });
        }
        // systemd passes blocking fds on every start; tokio needs non-blocking.
        socket
            .set_nonblocking(true)
            .map_err(|source| Error::BadFd { fd, source })?;
        sockets.push(socket);
    }
    Ok(Listeners {
        sockets,
        owned: None,
    })
}

/// A socket path this process bound, identified by the inode it created.
#[derive(Debug)]
pub struct OwnedPath {
    path: PathBuf,
    lock_path: PathBuf,
    dev: u64,
    ino: u64,
    released: bool,
}

/// Identity of a bound socket path, to check whether it is still ours.
#[derive(Debug, Clone)]
pub struct PathProbe {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl PathProbe {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path still names the socket this process bound (false
    /// once a successor renamed its own socket over it, or it was removed).
    pub fn still_ours(&self) -> bool {
        match fs::symlink_metadata(&self.path) {
            Ok(m) => m.dev() == self.dev && m.ino() == self.ino,
            Err(_) => false,
        }
    }
}

impl OwnedPath {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn probe(&self) -> PathProbe {
        PathProbe {
            path: self.path.clone(),
            dev: self.dev,
            ino: self.ino,
        }
    }

    pub fn still_ours(&self) -> bool {
        self.probe().still_ours()
    }

    /// Unlinks the path if it still names our socket; never touches a
    /// successor's. Returns whether it unlinked. Idempotent.
    pub fn release(&mut self) -> io::Result<bool> {
        if self.released {
            return Ok(false);
        }
        self.released = true;
        let _lock = lock(&self.lock_path)?;
        if !self.still_ours() {
            return Ok(false);
        }
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Drop for OwnedPath {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

fn lock(lock_path: &Path) -> io::Result<Flock<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(lock_path)?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))
}

/// Binds `path` without a window in which it is missing and without ever
/// removing anything that is not a socket.
pub fn bind(path: &Path) -> Result<(UnixListener, OwnedPath)> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| api::SOCKET_NAME.to_string());
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| Error::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    let bind_err = |source: io::Error| Error::Bind {
        path: path.to_path_buf(),
        source,
    };
    let lock_path = dir.join(format!(".{name}.lock"));
    let _lock = lock(&lock_path).map_err(bind_err)?;
    check_replaceable(path)?;

    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    // A leftover of an earlier process that had our pid; only ever a socket.
    if let Ok(m) = fs::symlink_metadata(&tmp) {
        if m.file_type().is_socket() {
            let _ = fs::remove_file(&tmp);
        }
    }
    let socket = UnixListener::bind(&tmp).map_err(bind_err)?;
    let placed = fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))
        .and_then(|()| fs::rename(&tmp, path))
        .and_then(|()| fs::symlink_metadata(path));
    let meta = match placed {
        Ok(m) => m,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(bind_err(e));
        }
    };
    socket.set_nonblocking(true).map_err(bind_err)?;
    Ok((
        socket,
        OwnedPath {
            path: path.to_path_buf(),
            lock_path,
            dev: meta.dev(),
            ino: meta.ino(),
            released: false,
        },
    ))
}

/// A path may be replaced only when it is missing or is a socket.
fn check_replaceable(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => Ok(()),
        Ok(_) => Err(Error::NotASocket {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Bind {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passed_fds_without_variables_should_be_zero() {
        assert_eq!(passed_fds(None, None, 7).unwrap(), 0);
        assert_eq!(passed_fds(Some(""), Some("7"), 7).unwrap(), 0);
    }

    #[test]
    fn passed_fds_for_us_should_count() {
        assert_eq!(passed_fds(Some("2"), Some("7"), 7).unwrap(), 2);
        assert_eq!(passed_fds(Some("1"), None, 7).unwrap(), 1);
    }

    #[test]
    fn passed_fds_for_another_pid_should_fail() {
        assert!(matches!(
            passed_fds(Some("1"), Some("8"), 7),
            Err(Error::NotOurs {
                listen_pid: 8,
                own_pid: 7
            })
        ));
    }

    #[test]
    fn passed_fds_garbage_should_fail() {
        assert!(matches!(
            passed_fds(Some("x"), None, 7),
            Err(Error::BadListenFds(_))
        ));
        assert!(matches!(
            passed_fds(Some("1"), Some("y"), 7),
            Err(Error::BadListenPid(_))
        ));
        assert!(matches!(
            passed_fds(Some("0"), Some("7"), 7),
            Err(Error::NoFds)
        ));
    }

    #[test]
    fn bind_should_create_private_dir_and_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sub/plexus.sock");
        let (_l, owned) = bind(&path).unwrap();
        let dir_mode = fs::metadata(tmp.path().join("sub")).unwrap().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        let m = fs::symlink_metadata(&path).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.mode() & 0o777, 0o600);
        assert!(owned.still_ours());
    }

    #[test]
    fn bind_over_regular_file_should_refuse_and_keep_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("plexus.sock");
        fs::write(&path, b"precious").unwrap();
        assert!(matches!(bind(&path), Err(Error::NotASocket { .. })));
        assert_eq!(fs::read(&path).unwrap(), b"precious");
    }

    #[test]
    fn release_should_spare_a_successors_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("plexus.sock");
        let (_a, mut owned_a) = bind(&path).unwrap();
        let (_b, owned_b) = bind(&path).unwrap();
        assert!(!owned_a.still_ours());
        assert!(!owned_a.release().unwrap());
        assert!(owned_b.still_ours());
    }

    #[test]
    fn release_should_unlink_own_socket_once() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("plexus.sock");
        let (_a, mut owned) = bind(&path).unwrap();
        assert!(owned.release().unwrap());
        assert!(!path.exists());
        assert!(!owned.release().unwrap());
    }
}
