//! The client: one request to the daemon over its unix socket, within the
//! call's deadline. It connects (retrying while the socket is missing,
//! refuses or has a full backlog, up to `connectTimeout`; a STATUS does not
//! wait for a daemon that is not there), writes the request, reads the
//! answer with [`http`], and turns transport failures into CNI errors. What
//! the answer means for the call is the front end's business.

use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::config::Config;
use super::http::{self, Response};
use crate::api::{self, code, CniError, Command};
use crate::{duration, trust};

/// First pause between connection attempts; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// Longest pause between connection attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// One request to the daemon, within the call's deadline.
pub(super) struct Client<'a> {
    config: &'a Config,
    deadline: Instant,
    started: Instant,
    /// Whether a missing or refusing socket is waited for (up to
    /// `connectTimeout`) rather than answered at once.
    waits_for_daemon: bool,
}

impl<'a> Client<'a> {
    /// The client of a `command` call that started at `started`:
    /// everything it does ends by `started` + `timeout`.
    ///
    /// A STATUS does not wait for a daemon that is not there: it asks
    /// whether an ADD could be served now, and a runtime may ask it while
    /// holding a lock every pod's ADD needs (CRI-O does at start), so no
    /// listener is answered at once with [`code::PLUGIN_NOT_AVAILABLE`].
    pub(super) fn new(config: &'a Config, command: Command, started: Instant) -> Self {
        Self {
            config,
            deadline: started + config.timeout,
            started,
            waits_for_daemon: command != Command::Status,
        }
    }

    fn path(&self) -> std::path::Display<'_> {
        self.config.socket.display()
    }

    /// Connects, sends the request and reads the answer.
    pub(super) fn exchange(&self, body: &[u8], log: &mut dyn Write) -> Result<Response, CniError> {
        let mut stream = self.connect(log)?;
        let mut raw = format!(
            "POST {} HTTP/1.1\r\nHost: plexus\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            api::PATH_CNI,
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(body);
        // The write side is never shut down: a server may take a half-close
        // for an abandoned request.
        let sent = write_all(&mut stream, &raw, self.deadline);
        // Even when the write failed, the daemon may have answered (e.g. a
        // 413 before reading the whole body); that answer wins.
        match (http::read_response(&mut stream, self.deadline), sent) {
            (Ok(response), _) => Ok(response),
            (Err(_), Err(e)) => Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!(
                    "the connection to the daemon at {} failed before the request was sent ({e}); try again later",
                    self.path()
                ),
            )),
            (Err(e), Ok(())) => Err(self.read_error(e)),
        }
    }

    /// Connects, retrying while the socket is missing, refuses or has a
    /// full backlog, until `connectTimeout` (bounded by `timeout`). Without
    /// `waits_for_daemon`, a missing or refusing socket ends the call at
    /// once; a full backlog is still waited for (a daemon is there).
    fn connect(&self, log: &mut dyn Write) -> Result<UnixStream, CniError> {
        let until = (self.started + self.config.connect_timeout).min(self.deadline);
        let mut backoff = FIRST_BACKOFF;
        let mut waited = false;
        let refuse = |why: String| {
            CniError::new(
                code::IO_FAILURE,
                format!(
                    "refusing the daemon socket at {}: {why}; only a daemon run by root (or by \
                     this plugin's own user) may answer CNI calls",
                    self.path()
                ),
            )
        };
        loop {
            let window = until
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            check_socket_path(&self.config.socket).map_err(&refuse)?;
            let err = match connect_once(&self.config.socket, window) {
                Ok(stream) => {
                    check_peer(&stream).map_err(&refuse)?;
                    return Ok(stream);
                }
                Err(e) => e,
            };
            if !is_transient(&err) {
                return Err(CniError::new(
                    code::IO_FAILURE,
                    format!("cannot connect to the daemon at {}: {err}", self.path()),
                ));
            }
            if !self.waits_for_daemon && is_no_listener(&err) {
                return Err(self.not_available(&err));
            }
            if !waited {
                waited = true;
                let line = format!(
                    "plexus-shim: waiting for the daemon at {}: {err}\n",
                    self.path()
                );
                // A closed stderr must not fail the call.
                let _ = log.write_all(line.as_bytes());
            }
            let now = Instant::now();
            if now >= until {
                return Err(CniError::new(
                    code::TRY_AGAIN_LATER,
                    format!(
                        "the daemon is not reachable at {}: {err} (retried for {}); try again later",
                        self.path(),
                        duration::format(until.saturating_duration_since(self.started))
                    ),
                ));
            }
            std::thread::sleep(backoff.min(until - now));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// The CNI error of a STATUS that found no daemon listening.
    fn not_available(&self, err: &io::Error) -> CniError {
        CniError::new(
            code::PLUGIN_NOT_AVAILABLE,
            format!(
                "no daemon is listening at {} ({err}); no ADD can be served until one is",
                self.path()
            ),
        )
        .with_details(
            "STATUS does not wait for the daemon; connectTimeout applies to the other commands",
        )
    }

    /// The CNI error for an answer that could not be read after the
    /// request was sent.
    fn read_error(&self, e: http::Error) -> CniError {
        let msg = match e {
            http::Error::Garbage(why) => return bad_answer(&self.config.socket, &why),
            http::Error::TimedOut => format!(
                "no answer from the daemon at {} within {}",
                self.path(),
                duration::format(self.config.timeout)
            ),
            http::Error::Closed(why) => format!(
                "no complete answer from the daemon at {}: {why}",
                self.path()
            ),
            http::Error::Io(err) => format!(
                "no complete answer from the daemon at {}: {err}",
                self.path()
            ),
        };
        CniError::new(code::NO_ANSWER, msg)
            .with_details("the request was sent; whether it took effect is unknown")
    }
}

/// The CNI error for an answer from the daemon at `socket` that is not
/// usable: `why` says what is wrong with it.
pub(super) fn bad_answer(socket: &Path, why: &str) -> CniError {
    CniError::new(
        code::BAD_ANSWER,
        format!(
            "invalid answer from the daemon at {}: {why}",
            socket.display()
        ),
    )
}

/// Refuses a socket path another user controls: a directory on the way
/// that another user owns or may write (a sticky one such as `/tmp` may
/// hold the socket, whose own owner is checked), a symbolic link another
/// user owns, or a socket another user owns. Root and the plugin's own
/// user are trusted ([`trust`]'s rules). A path that does not exist yet
/// passes: the connect says so.
fn check_socket_path(path: &Path) -> Result<(), String> {
    trust::check_path_to(path).map_err(|e| e.to_string())?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !trust::trusted_owner(meta.uid()) => Err(format!(
            "it is owned by uid {} (mode {:04o})",
            meta.uid(),
            meta.mode() & 0o7777
        )),
        _ => Ok(()),
    }
}

/// Refuses a connection whose listening end another user made: the
/// kernel's record of who called listen(2) (SO_PEERCRED), which no file
/// swapped in after [`check_socket_path`] can change.
fn check_peer(stream: &UnixStream) -> Result<(), String> {
    // SAFETY: ucred is plain old data, for which all zeroes is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(2) on a descriptor `stream` owns, writing at most
    // `len` bytes into `cred`, which we own.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(format!(
            "cannot tell who listens on it: {}",
            io::Error::last_os_error()
        ));
    }
    if !trust::trusted_owner(cred.uid) {
        return Err(format!(
            "it is served by process {} of uid {}",
            cred.pid, cred.uid
        ));
    }
    Ok(())
}

/// Whether a failed connect may succeed later: no socket yet, nobody
/// listening (daemon restarting without socket activation), backlog full.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::Interrupted
    )
}

/// Whether a failed connect means that nobody listens at the path: no
/// socket there, or a socket without a listener.
fn is_no_listener(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
    )
}

/// One `connect(2)` that waits at most `wait` for room in the listener's
/// backlog.
///
/// `UnixStream::connect` would block without limit on a full backlog: the
/// kernel waits for room for as long as the socket's send timeout, which
/// is infinite by default. So the socket is made by hand and gets
/// `SO_SNDTIMEO` first; then a full backlog ends in EAGAIN, which is
/// retried like a refused connection.
fn connect_once(path: &Path, wait: Duration) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data, for which all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a usable socket path (empty, longer than {} bytes, or with a NUL byte)",
                addr.sun_path.len() - 1
            ),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nothing else.
    let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    stream.set_write_timeout(Some(wait))?;
    loop {
        // SAFETY: `addr` is an initialised sockaddr_un and `len` lies within
        // it (the path is shorter than sun_path, checked above).
        let rc = unsafe {
            libc::connect(
                stream.as_raw_fd(),
                std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
                len as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(stream);
        }
        let err = io::Error::last_os_error();
        // An interrupted unix-socket connect leaves the socket unconnected,
        // so it may simply be repeated.
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Writes all of `buf` before `deadline`.
fn write_all(stream: &mut UnixStream, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        let left = http::remaining(deadline).ok_or(io::ErrorKind::TimedOut)?;
        stream.set_write_timeout(Some(left))?;
        match stream.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
