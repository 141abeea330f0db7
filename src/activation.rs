//! The listening socket: inherited from systemd (socket activation), or, as
//! a fallback, bound by the daemon itself without ever racing a successor.
//!
//! Under activation the socket node belongs to systemd and is never touched.
//! In self-bind mode the daemon binds the socket inside a fresh private
//! directory (mode 0700, random name, made with `mkdir`, so it cannot have
//! been planted) in the socket directory, chmods it 0600 there, renames it
//! over the socket path and removes the empty directory. Nobody but root can
//! reach the socket before its mode is final, whatever the umask. (A 0177
//! umask around `bind` would also do, but the umask is process-wide and the
//! bind comes last in start-up, after the runtime's threads exist.)
//!
//! Binding is split in two, [`stage`] and [`Pending::publish`], so that the
//! rename over the path is the last step that can fail: a successor that
//! fails never takes the path from a working daemon. The daemon remembers
//! the (device, inode) of the path and unlinks it at exit only if it still
//! names that inode. Renames and the exit-time check-and-unlink happen under
//! an exclusive `flock` on a lock file beside the socket (opened without
//! following symlinks), so a successor's socket is never removed.
//!
//! Only a socket owned by root (or by the daemon's own user) counts as a
//! successor's: anything else found at the path is an impostor, and
//! [`OwnedPath::restore`] puts a socket of ours back over it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::{api, trust};

pub const ENV_LISTEN_FDS: &str = "LISTEN_FDS";
pub const ENV_LISTEN_PID: &str = "LISTEN_PID";
pub const ENV_LISTEN_FDNAMES: &str = "LISTEN_FDNAMES";
/// Not systemd's: honoured by the `listenfd` crate, removed before it reads.
pub const ENV_LISTEN_FDS_FIRST_FD: &str = "LISTEN_FDS_FIRST_FD";
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
    #[error("LISTEN_FDS={listen_fds:?} was set but no socket could be taken from it")]
    Refused { listen_fds: String },
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
    #[error("refusing to bind in the socket directory")]
    Untrusted {
        #[source]
        source: trust::Untrusted,
    },
    #[error("cannot lock {path}")]
    Lock {
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

/// Why `listenfd` took no socket although `LISTEN_FDS` is set: the crate
/// silently treats a malformed `LISTEN_FDS`, a malformed `LISTEN_PID` or
/// one naming another process as "not activated", and falling back to
/// binding the path then could race the process the sockets were meant
/// for. `None` when `LISTEN_FDS` is unset or empty (not activated).
///
/// Pure: the caller supplies the variables as they were before `listenfd`
/// cleared them, and its own pid. Parses as the crate does (no trimming).
pub fn refused(listen_fds: Option<&str>, listen_pid: Option<&str>, own_pid: u32) -> Option<Error> {
    let fds = listen_fds.filter(|s| !s.is_empty())?;
    let Ok(n) = fds.parse::<usize>() else {
        return Some(Error::BadListenFds(fds.to_string()));
    };
    if let Some(pid) = listen_pid.filter(|s| !s.is_empty()) {
        let Ok(listen_pid) = pid.parse::<u32>() else {
            return Some(Error::BadListenPid(pid.to_string()));
        };
        if listen_pid != own_pid {
            return Some(Error::NotOurs {
                listen_pid,
                own_pid,
            });
        }
    }
    if n == 0 {
        return Some(Error::NoFds);
    }
    Some(Error::Refused {
        listen_fds: fds.to_string(),
    })
}

/// The sockets systemd passed, or `None` when the daemon was not socket
/// activated (it then binds its path itself, with [`stage`]).
///
/// `LISTEN_FDS`/`LISTEN_PID` are read by the `listenfd` crate alone; when it
/// takes nothing although `LISTEN_FDS` is set, [`refused`] says why and
/// start-up fails. Each socket must be a listening (`SO_ACCEPTCONN`) unix
/// stream socket. Only systemd's protocol counts: the fds start at 3
/// (the non-systemd `LISTEN_FDS_FIRST_FD` is removed first).
///
/// Must run before any other thread exists: it removes the `LISTEN_*`
/// variables from the environment so no child inherits them.
pub fn inherited() -> Result<Option<Vec<UnixListener>>> {
    let fds = std::env::var(ENV_LISTEN_FDS).ok();
    let pid = std::env::var(ENV_LISTEN_PID).ok();
    std::env::remove_var(ENV_LISTEN_FDS_FIRST_FD);
    // Reads and removes LISTEN_FDS and LISTEN_PID.
    let mut listenfd = listenfd::ListenFd::from_env();
    std::env::remove_var(ENV_LISTEN_FDNAMES);
    let n = listenfd.len();
    if n == 0 {
        return match refused(fds.as_deref(), pid.as_deref(), std::process::id()) {
            Some(e) => Err(e),
            None => Ok(None),
        };
    }
    let mut sockets = Vec::with_capacity(n);
    for i in 0..n {
        let fd = LISTEN_FDS_START + i32::try_from(i).unwrap_or(i32::MAX - LISTEN_FDS_START);
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
    Ok(Some(sockets))
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

/// What a socket path names, seen from the daemon that bound it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathState {
    /// Still the socket this process bound.
    Ours,
    /// Another socket owned by root (or by our own user): a successor's.
    Successor,
    /// Something placed by another user, or not a socket at all.
    Foreign { uid: u32, mode: u32, socket: bool },
    /// Nothing.
    Missing,
}

impl PathProbe {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path still names the socket this process bound (false
    /// once a successor renamed its own socket over it, or it was removed).
    pub fn still_ours(&self) -> bool {
        self.state() == PathState::Ours
    }

    /// What the path names now. Blocking (a `stat`).
    pub fn state(&self) -> PathState {
        let m = match fs::symlink_metadata(&self.path) {
            Ok(m) => m,
            Err(_) => return PathState::Missing,
        };
        if m.dev() == self.dev && m.ino() == self.ino {
            return PathState::Ours;
        }
        let socket = m.file_type().is_socket();
        if socket && trust::trusted_owner(m.uid()) {
            PathState::Successor
        } else {
            PathState::Foreign {
                uid: m.uid(),
                mode: m.mode() & 0o7777,
                socket,
            }
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

    /// Puts a fresh socket of ours back over the path when it names a
    /// socket of another user, or nothing; returns the new socket, which
    /// the path now names (and which [`OwnedPath::release`] will unlink).
    ///
    /// `Ok(None)` when there is nothing to restore: the path is still ours,
    /// a successor's (checked under the lock, so a takeover is never
    /// undone), or something that is not a socket (never replaced), or this
    /// path was already released. Blocking.
    pub fn restore(&mut self) -> Result<Option<UnixListener>> {
        if self.released {
            return Ok(None);
        }
        let (dir, name) = split(&self.path);
        let _lock = lock(&self.lock_path).map_err(|source| Error::Lock {
            path: self.lock_path.clone(),
            source,
        })?;
        match self.probe().state() {
            PathState::Ours | PathState::Successor => return Ok(None),
            PathState::Foreign { socket: false, .. } => return Ok(None),
            PathState::Foreign { socket: true, .. } | PathState::Missing => {}
        }
        let (socket, pending) = stage_locked(&self.path, &dir, &name, None)?;
        let mut placed = pending.publish()?;
        // The identity moves to `self`; `placed` must not unlink it.
        placed.released = true;
        self.dev = placed.dev;
        self.ino = placed.ino;
        Ok(Some(socket))
    }
}

impl Drop for OwnedPath {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// Opens and locks the lock file: never through a symlink (`O_NOFOLLOW`),
/// never a FIFO or device (`O_NONBLOCK`, then checked), never a file of
/// another user.
fn lock(lock_path: &Path) -> io::Result<Flock<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(lock_path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::other("it is a symlink; lock files are never opened through one")
            } else {
                e
            }
        })?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || !trust::trusted_owner(meta.uid()) {
        return Err(io::Error::other(format!(
            "it is not a regular file owned by root (owner uid {}, mode {:04o})",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))
}

/// The directory of `path` and the socket's file name.
fn split(path: &Path) -> (PathBuf, String) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| api::SOCKET_NAME.to_string());
    (dir, name)
}

/// 16 hex digits from the kernel's random source.
fn random_hex() -> io::Result<String> {
    let mut buf = [0u8; 8];
    // SAFETY: getrandom writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if usize::try_from(n).ok() != Some(buf.len()) {
        File::open("/dev/urandom")?.read_exact(&mut buf)?;
    }
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// A socket bound and chmodded in a private directory, not yet renamed
/// over its path. Dropping it removes the socket and the directory.
#[derive(Debug)]
pub struct Pending {
    path: PathBuf,
    lock_path: PathBuf,
    tmp_dir: PathBuf,
    tmp: PathBuf,
    dev: u64,
    ino: u64,
    published: bool,
    /// Held from staging to publishing (`None` when the caller holds it).
    _lock: Option<Flock<File>>,
}

impl Pending {
    /// The path the socket will be renamed over.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the socket over its path: the one step that changes what
    /// the path names, and the last one that can fail.
    pub fn publish(mut self) -> Result<OwnedPath> {
        fs::rename(&self.tmp, &self.path).map_err(|source| Error::Bind {
            path: self.path.clone(),
            source,
        })?;
        self.published = true;
        // Empty now; a failure leaves only an empty private directory.
        let _ = fs::remove_dir(&self.tmp_dir);
        Ok(OwnedPath {
            path: self.path.clone(),
            lock_path: self.lock_path.clone(),
            dev: self.dev,
            ino: self.ino,
            released: false,
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_file(&self.tmp);
        }
        let _ = fs::remove_dir(&self.tmp_dir);
    }
}

/// Binds `<socketDir>/plexus.sock` in a private directory, ready for
/// [`Pending::publish`]. Creates the socket directory (0700) if missing and
/// checks that no other user can write it. Holds the lock until published.
pub fn stage(config: &Config) -> Result<(UnixListener, Pending)> {
    stage_path(&config.socket_path())
}

/// [`stage`] for an explicit socket path.
pub fn stage_path(path: &Path) -> Result<(UnixListener, Pending)> {
    let (dir, name) = split(path);
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| Error::CreateDir {
                path: dir.clone(),
                source,
            })?;
    }
    // Again now that it exists: a directory planted before ours is caught.
    trust::check_dir(&dir).map_err(|source| Error::Untrusted { source })?;
    let lock_path = dir.join(format!(".{name}.lock"));
    let guard = lock(&lock_path).map_err(|source| Error::Lock {
        path: lock_path.clone(),
        source,
    })?;
    stage_locked(path, &dir, &name, Some(guard))
}

fn stage_locked(
    path: &Path,
    dir: &Path,
    name: &str,
    guard: Option<Flock<File>>,
) -> Result<(UnixListener, Pending)> {
    let bind_err = |source: io::Error| Error::Bind {
        path: path.to_path_buf(),
        source,
    };
    check_replaceable(path)?;
    let tmp_dir = private_dir(dir, name).map_err(bind_err)?;
    let tmp = tmp_dir.join(name);
    let mut pending = Pending {
        path: path.to_path_buf(),
        lock_path: dir.join(format!(".{name}.lock")),
        tmp_dir,
        tmp,
        dev: 0,
        ino: 0,
        published: false,
        _lock: guard,
    };
    let socket = UnixListener::bind(&pending.tmp).map_err(bind_err)?;
    fs::set_permissions(&pending.tmp, fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
    socket.set_nonblocking(true).map_err(bind_err)?;
    // rename keeps the inode: this is the identity the path will have.
    let meta = fs::symlink_metadata(&pending.tmp).map_err(bind_err)?;
    pending.dev = meta.dev();
    pending.ino = meta.ino();
    Ok((socket, pending))
}

/// Creates `<dir>/.<name>.<random>.d`, mode 0700; `mkdir` fails on any
/// existing entry, so a planted name is never used.
fn private_dir(dir: &Path, name: &str) -> io::Result<PathBuf> {
    let mut last = None;
    for _ in 0..8 {
        let candidate = dir.join(format!(".{name}.{}.d", random_hex()?));
        match fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free temporary name")))
}

/// Binds `path` at once: [`stage_path`] then [`Pending::publish`].
pub fn bind(path: &Path) -> Result<(UnixListener, OwnedPath)> {
    let (socket, pending) = stage_path(path)?;
    Ok((socket, pending.publish()?))
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
#[path = "activation_tests.rs"]
mod tests;
