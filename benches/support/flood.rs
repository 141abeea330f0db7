//! Flooding a unix socket server with connections, and what /proc says
//! about the descriptors the server holds.
//!
//! Everything here is plain libc and /proc: the flood must open thousands
//! of connections quickly and without waiting for the server to accept
//! them, which `UnixStream::connect` cannot do (it blocks without limit on
//! a full listen backlog).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Raises this process's soft `RLIMIT_NOFILE` to at least `want` (and the
/// hard limit with it when needed and allowed, i.e. as root). Returns the
/// soft limit in effect afterwards.
pub fn raise_nofile(want: u64) -> io::Result<u64> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) with a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if l.rlim_cur >= want {
        return Ok(l.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: want,
        rlim_max: l.rlim_max.max(want),
    };
    // SAFETY: setrlimit(2) with a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        return Ok(want);
    }
    // Not allowed above the hard limit: take what it allows.
    let capped = libc::rlimit {
        rlim_cur: l.rlim_max,
        rlim_max: l.rlim_max,
    };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &capped) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(l.rlim_max)
}

fn sockaddr_un(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: all zeroes is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a usable socket path", path.display()),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// One `connect(2)` to `path`. With `wait: None` it never waits: a full
/// listen backlog is `WouldBlock` at once. With `Some(d)` it waits up to
/// `d` for room in the backlog (never for the server's accept: a unix
/// connect completes as soon as the connection is queued).
pub fn connect(path: &Path, wait: Option<Duration>) -> io::Result<UnixStream> {
    let (addr, len) = sockaddr_un(path)?;
    let flags = libc::SOCK_STREAM
        | libc::SOCK_CLOEXEC
        | if wait.is_none() {
            libc::SOCK_NONBLOCK
        } else {
            0
        };
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, flags, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nothing else.
    let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if let Some(w) = wait {
        // The kernel waits for backlog room as long as the send timeout.
        stream.set_write_timeout(Some(w.max(Duration::from_millis(1))))?;
    }
    loop {
        // SAFETY: addr is an initialised sockaddr_un of length len.
        let rc = unsafe {
            libc::connect(
                stream.as_raw_fd(),
                std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
                len,
            )
        };
        if rc == 0 {
            return Ok(stream);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// For each stream, whether the peer has written to it or closed it (a
/// connection the server evicted gets an answer and is closed; an idle one
/// it still holds, or one still in its backlog, shows nothing).
pub fn peer_acted(streams: &[UnixStream]) -> Vec<bool> {
    let mut fds: Vec<libc::pollfd> = streams
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        })
        .collect();
    if fds.is_empty() {
        return Vec::new();
    }
    loop {
        // SAFETY: a valid array of pollfds we own; a zero timeout never
        // blocks.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        if n >= 0 {
            break;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            // Nothing known: say nothing happened.
            return vec![false; streams.len()];
        }
    }
    fds.iter().map(|p| p.revents != 0).collect()
}

/// Idle connections held open against a server: they connect and never
/// send a byte.
#[derive(Default)]
pub struct Flood {
    conns: Vec<UnixStream>,
}

/// What one [`Flood::fill`] did.
#[derive(Debug, Clone, Default)]
pub struct Fill {
    /// Connections opened by this fill.
    pub opened: usize,
    /// Of those, how many found the backlog full and waited for room.
    pub waited: usize,
    pub took: Duration,
    /// Why the fill stopped short of its goal.
    pub error: Option<String>,
}

impl Flood {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops the connections the server closed; returns how many.
    pub fn prune(&mut self) -> usize {
        let acted = peer_acted(&self.conns);
        let before = self.conns.len();
        let mut it = acted.into_iter();
        self.conns.retain(|_| !it.next().unwrap_or(false));
        before - self.conns.len()
    }

    /// Connections the server has neither answered nor closed.
    pub fn still_open(&self) -> usize {
        peer_acted(&self.conns).iter().filter(|a| !**a).count()
    }

    /// Prunes, then opens connections to `sock` until `goal` are held.
    /// Non-blocking connects first; one that finds the backlog full waits
    /// for room (as long as `deadline` allows), so the flood keeps
    /// pushing while the server makes room. Stops at `deadline`.
    pub fn fill(&mut self, sock: &Path, goal: usize, deadline: Instant) -> Fill {
        let t0 = Instant::now();
        self.prune();
        let mut f = Fill::default();
        while self.conns.len() < goal {
            let r = match connect(sock, None) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        f.error = Some("the deadline passed with the backlog full".into());
                        break;
                    }
                    f.waited += 1;
                    connect(sock, Some(left))
                }
                r => r,
            };
            match r {
                Ok(s) => {
                    self.conns.push(s);
                    f.opened += 1;
                }
                Err(e) => {
                    f.error = Some(format!("connect to {}: {e}", sock.display()));
                    break;
                }
            }
        }
        f.took = t0.elapsed();
        f
    }

    /// Closes every connection.
    pub fn clear(&mut self) {
        self.conns.clear();
    }
}

/// The descriptors a process holds, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fds {
    pub total: usize,
    pub pipes: usize,
    pub sockets: usize,
}

impl Fds {
    /// `12 (pipes 3, sockets 5, other 4)`.
    pub fn describe(&self) -> String {
        format!(
            "{} (pipes {}, sockets {}, other {})",
            self.total,
            self.pipes,
            self.sockets,
            self.total - self.pipes - self.sockets
        )
    }
}

/// What `/proc/<pid>/fd` links to; `None` when the process is gone.
fn fd_links(pid: i32) -> Option<Vec<String>> {
    let dir = fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        dir.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .map(|l| l.to_string_lossy().into_owned())
            .collect(),
    )
}

/// Counts `/proc/<pid>/fd`; `None` when the process is gone.
pub fn fds(pid: i32) -> Option<Fds> {
    let links = fd_links(pid)?;
    Some(Fds {
        total: links.len(),
        pipes: links.iter().filter(|l| l.starts_with("pipe:")).count(),
        sockets: links.iter().filter(|l| l.starts_with("socket:")).count(),
    })
}

/// The process's sockets that are accepted connections of one of its own
/// listening unix sockets (its clients). Exact only while connections do
/// not come and go: a socket closed or opened between the reads of
/// `/proc/<pid>/fd` and `/proc/net/unix` counts as a connection, so that
/// "none" is only ever seen in a consistent snapshot.
pub fn client_connections(pid: i32) -> Option<usize> {
    let links = fd_links(pid)?;
    // /proc/net/unix: "Num RefCount Protocol Flags Type St Inode Path";
    // flag 00010000 marks a listening socket. An accepted socket carries
    // its listener's address (the path at bind time).
    let table = fs::read_to_string("/proc/net/unix").ok()?;
    let mut by_inode: HashMap<&str, (bool, &str)> = HashMap::new();
    for l in table.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 7 {
            by_inode.insert(f[6], (f[3] == "00010000", f.get(7).copied().unwrap_or("")));
        }
    }
    let inodes: Vec<&str> = links
        .iter()
        .filter_map(|l| l.strip_prefix("socket:[")?.strip_suffix(']'))
        .collect();
    let listening: Vec<&str> = inodes
        .iter()
        .filter_map(|i| by_inode.get(i))
        .filter(|(listen, path)| *listen && !path.is_empty())
        .map(|(_, path)| *path)
        .collect();
    Some(
        inodes
            .iter()
            .filter(|i| {
                by_inode
                    .get(*i)
                    .is_none_or(|(listen, path)| !*listen && listening.contains(path))
            })
            .count(),
    )
}

/// Connections waiting in the listen backlog of the unix sockets bound
/// under `dir` (`ss`'s Recv-Q of a listening socket); `None` when `ss`
/// cannot tell.
pub fn listen_queue(dir: &Path) -> Option<usize> {
    let out = crate::procs::output_of("ss", &["-xlnH"])?;
    let prefix = format!("{}/", dir.display());
    // "u_str LISTEN <Recv-Q> <Send-Q> <path> <inode> * 0"
    Some(
        out.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 5 && f[1] == "LISTEN" && f[4].starts_with(&prefix))
                    .then(|| f[2].parse::<usize>().ok())?
            })
            .sum(),
    )
}

/// [`fds`] once the process holds no client connection and none waits in
/// the backlog of its sockets under `sock_dir`, waiting (by polling /proc
/// and `ss`) at most `timeout`; `Err` with the last count if that did not
/// happen.
pub fn fds_without_clients(
    pid: i32,
    sock_dir: &Path,
    timeout: Duration,
) -> Result<Fds, Option<Fds>> {
    let deadline = Instant::now() + timeout;
    let quiet = || client_connections(pid) == Some(0);
    loop {
        let f = fds(pid);
        // Nothing accepted between the looks: the count is one without
        // clients.
        if f.is_some() && quiet() && listen_queue(sock_dir).unwrap_or(0) == 0 {
            let again = fds(pid);
            if again == f && quiet() {
                return f.ok_or(None);
            }
        }
        if Instant::now() >= deadline {
            return Err(f);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
