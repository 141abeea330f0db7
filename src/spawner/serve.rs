//! The spawner's side: accept connections, check who asks and for what,
//! start the plugin, keep it unreaped until the client says so, and kill
//! and reap whatever a closed connection leaves. Blocking code, a thread
//! per connection at a time, kept a while for the next one (a plugin run is
//! one connection; plexusd bounds how many run at once).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};

use nix::sys::socket::{self, sockopt};

use super::{inherited_env, recv, send, Reap, Reaped, Request, Started};

/// Most connections (plugin runs) served at once; past it, accepting waits.
pub const MAX_CONNECTIONS: usize = 4096;
const THREAD_STACK: usize = 256 << 10;

/// Where plugins may come from: the `binDir` directories, asked again for
/// every request (the operator may change the configuration between
/// plexusd's restarts without restarting the spawner).
pub type BinDirs = Arc<dyn Fn() -> Result<Vec<PathBuf>, String> + Send + Sync>;

/// What a connection is held to.
#[derive(Clone)]
pub struct Rules {
    /// Where plugins may come from.
    pub bin_dirs: BinDirs,
    /// How long a connection may take to send its request before it is
    /// dropped ([`DEFAULT_REQUEST_TIMEOUT`] unless told otherwise).
    pub request_timeout: std::time::Duration,
}

/// How long a connection may take to send its request, by default.
pub const DEFAULT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves `listener` (a listening `SOCK_SEQPACKET` unix socket) until
/// `stop` becomes readable (a byte or a close), then waits for the plugins
/// of open connections to be reaped. The listener is only polled and
/// accepted on, never shut down: systemd shares it and serves the next
/// activation with it.
pub fn serve(listener: OwnedFd, rules: Rules, stop: OwnedFd) -> io::Result<()> {
    let active = Arc::new((Mutex::new(0usize), Condvar::new()));
    let mut workers = Workers::new(rules, active.clone());
    loop {
        wait_below(&active, MAX_CONNECTIONS);
        if !wait_readable(listener.as_fd(), stop.as_fd())? {
            break;
        }
        let conn = match socket::accept4(listener.as_raw_fd(), socket::SockFlag::SOCK_CLOEXEC) {
            // SAFETY: accept4 just returned this descriptor; we own it.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::ECONNABORTED) => continue,
            Err(nix::errno::Errno::EMFILE | nix::errno::Errno::ENFILE) => {
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        {
            let (count, _) = &*active;
            *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        }
        workers.hand(conn);
    }
    // Idle workers leave; busy ones finish their plugin first.
    drop(workers);
    wait_below(&active, 1);
    Ok(())
}

/// The threads that serve connections: one per connection at a time,
/// kept for [`WORKER_IDLE`] after their last one so that the next plugin
/// run does not pay for a new thread.
struct Workers {
    tx: Option<mpsc::Sender<OwnedFd>>,
    rx: Arc<Mutex<mpsc::Receiver<OwnedFd>>>,
    /// Workers waiting for a connection that no handed connection has
    /// claimed yet.
    idle: Arc<AtomicUsize>,
    rules: Rules,
    active: Arc<(Mutex<usize>, Condvar)>,
}

/// How long a worker waits for its next connection before it leaves.
const WORKER_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

impl Workers {
    fn new(rules: Rules, active: Arc<(Mutex<usize>, Condvar)>) -> Self {
        let (tx, rx) = mpsc::channel();
        Self {
            tx: Some(tx),
            rx: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
            rules,
            active,
        }
    }

    /// Gives `conn` to an idle worker, or to a new one when none is idle.
    fn hand(&mut self, conn: OwnedFd) {
        let claimed = self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !claimed {
            if let Err(e) = self.start() {
                eprintln!("plexus-spawner: cannot start a thread for a connection: {e}");
                // Dropped unserved: the client sees the connection close.
                drop(conn);
                leave(&self.active);
                return;
            }
        }
        if let Some(tx) = &self.tx {
            // The receiver lives as long as self: this cannot fail.
            let _ = tx.send(conn);
        }
    }

    fn start(&self) -> io::Result<()> {
        let (rx, idle) = (self.rx.clone(), self.idle.clone());
        let (rules, active) = (self.rules.clone(), self.active.clone());
        std::thread::Builder::new()
            .name("plugin".into())
            .stack_size(THREAD_STACK)
            .spawn(move || loop {
                let next = rx
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .recv_timeout(WORKER_IDLE);
                match next {
                    Ok(conn) => {
                        // Counted out however the connection ends.
                        let counted = Leave(active.clone());
                        if let Err(e) = connection(conn.as_fd(), &rules) {
                            eprintln!("plexus-spawner: {e}");
                        }
                        drop(conn);
                        drop(counted);
                        idle.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        // Leave unless a connection is on its way to a
                        // waiting worker (all idle ones claimed).
                        let left = idle
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                        if left {
                            return;
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            })
            .map(drop)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Waiting workers see the channel close and leave.
        self.tx = None;
    }
}

/// Counts a connection's end when dropped.
struct Leave(Arc<(Mutex<usize>, Condvar)>);

impl Drop for Leave {
    fn drop(&mut self) {
        leave(&self.0);
    }
}

/// Counts a connection's end.
fn leave(active: &(Mutex<usize>, Condvar)) {
    let (count, cv) = active;
    let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
    *n = n.saturating_sub(1);
    cv.notify_all();
}

/// Waits until `listener` has a connection (true) or `stop` is readable
/// (false).
fn wait_readable(listener: BorrowedFd<'_>, stop: BorrowedFd<'_>) -> io::Result<bool> {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll(2) on two valid pollfd structs we own.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if fds[0].revents != 0 {
            return Ok(false);
        }
        if fds[1].revents & libc::POLLIN != 0 {
            return Ok(true);
        }
        if fds[1].revents != 0 {
            return Err(io::Error::other("the listening socket failed"));
        }
    }
}

fn wait_below(active: &(Mutex<usize>, Condvar), limit: usize) {
    let (count, cv) = active;
    let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
    while *n >= limit {
        n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
    }
}

/// One plugin run, from request to reap.
fn connection(conn: BorrowedFd<'_>, rules: &Rules) -> io::Result<()> {
    let peer = socket::getsockopt(&conn, sockopt::PeerCredentials)?;
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let own = unsafe { libc::geteuid() };
    if peer.uid() != own {
        let why = format!(
            "refused: the peer (pid {}) runs as uid {}, not {own}",
            peer.pid(),
            peer.uid()
        );
        let _ = send(conn, &failed(why.clone(), Some(libc::EPERM)), &[]);
        return Err(io::Error::other(why));
    }
    // A client sends its request at once: one that does not is dropped
    // rather than holding a thread.
    set_receive_timeout(conn, Some(rules.request_timeout))?;
    let packet = recv(conn, 3).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock => io::Error::other(format!(
            "pid {} sent no request within {:?}: dropped",
            peer.pid(),
            rules.request_timeout
        )),
        _ => e,
    })?;
    set_receive_timeout(conn, None)?;
    if packet.bytes.is_empty() {
        return Ok(());
    }
    let req: Request = match packet.decode() {
        Ok(r) => r,
        Err(e) => {
            let _ = send(conn, &failed(format!("bad request: {e}"), None), &[]);
            return Err(e);
        }
    };
    let Ok([stdin, stdout, stderr]) = <[OwnedFd; 3]>::try_from(packet.fds) else {
        let why = "a request needs three descriptors (stdin, stdout, stderr)".to_string();
        let _ = send(conn, &failed(why.clone(), None), &[]);
        return Err(io::Error::other(why));
    };
    let checked = (rules.bin_dirs)().and_then(|dirs| {
        let program = allowed(Path::new(&req.program), &dirs)?;
        let env = plugin_env(&req, &dirs)?;
        Ok((program, env))
    });
    let (program, env) = match checked {
        Ok(c) => c,
        Err(why) => {
            let _ = send(conn, &failed(why.clone(), Some(libc::EACCES)), &[]);
            return Err(io::Error::other(why));
        }
    };
    let mut cmd = Command::new(&program);
    cmd.env_clear()
        .envs(inherited_env())
        .envs(env)
        .current_dir("/")
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let why = format!("cannot start {}: {e}", program.display());
            send(conn, &failed(why, e.raw_os_error()), &[])?;
            return Ok(());
        }
    };
    drop(cmd);
    let pid = child.id();
    let mut plugin = Unreaped(Some(pid));
    // The child is unreaped: the pidfd names it and no other process.
    let pidfd = pidfd_open(pid)?;
    send(conn, &Started::Pid(pid), &[pidfd.as_raw_fd()])?;
    drop(pidfd);
    // Until the client says reap, or goes away.
    let reap = recv(conn, 0)
        .ok()
        .and_then(|p| p.decode::<Reap>().ok())
        .is_some_and(|r| r.reap);
    let status = plugin.kill_and_reap();
    if reap {
        let answer = match status {
            Ok(s) => Reaped::Status(s),
            Err(e) => Reaped::Failed(e.to_string()),
        };
        send(conn, &answer, &[])?;
    }
    Ok(())
}

/// The variables a request may set: the CNI ones, except `CNI_PATH`.
const REQUEST_VARS: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
];

/// The variables a plugin of `req` gets over the spawner's environment:
/// the request's CNI variables, and `CNI_PATH` from binDir, where plugins
/// look for their delegates (IPAM and the like). Anything else a request
/// names (`LD_PRELOAD`, say, or its own `CNI_PATH`), or a directory other
/// than `/`, is refused: a plugin runs nothing but what binDir holds.
fn plugin_env(req: &Request, dirs: &[PathBuf]) -> Result<Vec<(String, String)>, String> {
    if req.dir != "/" {
        return Err(format!("refused: a plugin runs in /, not {:?}", req.dir));
    }
    let mut env = Vec::with_capacity(req.env.len() + 1);
    for (k, v) in &req.env {
        if k == "CNI_PATH" {
            continue;
        }
        if !REQUEST_VARS.contains(&k.as_str()) {
            return Err(format!("refused: a request may not set {k}"));
        }
        env.push((k.clone(), v.clone()));
    }
    let path: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    env.push(("CNI_PATH".to_string(), path.join(":")));
    Ok(env)
}

fn set_receive_timeout(
    conn: BorrowedFd<'_>,
    timeout: Option<std::time::Duration>,
) -> io::Result<()> {
    let tv = match timeout {
        Some(t) => nix::sys::time::TimeVal::new(t.as_secs() as _, t.subsec_micros() as _),
        None => nix::sys::time::TimeVal::new(0, 0),
    };
    socket::setsockopt(&conn, sockopt::ReceiveTimeout, &tv)?;
    Ok(())
}

fn failed(error: String, errno: Option<i32>) -> Started {
    Started::Failed { error, errno }
}

/// A started plugin: killed with its group and reaped when dropped.
struct Unreaped(Option<u32>);

impl Unreaped {
    fn kill_and_reap(&mut self) -> io::Result<i32> {
        let Some(pid) = self.0.take() else {
            return Err(io::Error::other("already reaped"));
        };
        let pid = pid as libc::pid_t;
        // SAFETY: kill(2) on the group our unreaped child leads: the id
        // cannot have been reused while the child is unreaped.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let mut status = 0;
        loop {
            // SAFETY: waitpid(2) on our own child with a valid pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r == pid {
                return Ok(status);
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

impl Drop for Unreaped {
    fn drop(&mut self) {
        if self.0.is_some() {
            let _ = self.kill_and_reap();
        }
    }
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `program` when it may be run: an absolute path, without `..`, that
/// lies directly in one of `dirs` (compared after symbolic links in the
/// directories are resolved), which no other user can change, and whose
/// file (after symbolic links, which may lead anywhere: only root can make
/// them there) is a regular file owned by root (or the spawner's user),
/// writable by no one else, in a directory that no one else can write.
pub fn allowed(program: &Path, dirs: &[PathBuf]) -> Result<PathBuf, String> {
    use std::path::Component;
    if !program.is_absolute() {
        return Err(format!("{} is not an absolute path", program.display()));
    }
    let refuse = |why: &str| format!("refused to run {}: {why}", program.display());
    if program
        .components()
        .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(refuse("the path has .. in it"));
    }
    let parent = program
        .parent()
        .and_then(|p| p.canonicalize().ok())
        .ok_or_else(|| refuse("its directory cannot be resolved"))?;
    let in_bin_dir = dirs
        .iter()
        .filter_map(|d| d.canonicalize().ok())
        .any(|d| d == parent);
    if !in_bin_dir {
        let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(refuse(&format!(
            "it is not in a binDir directory ({})",
            list.join(":")
        )));
    }
    let real = program.canonicalize().map_err(|e| refuse(&e.to_string()))?;
    let real_dir = real
        .parent()
        .ok_or_else(|| refuse("it has no directory"))?
        .to_path_buf();
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let own = unsafe { libc::geteuid() };
    for (path, what) in [
        (parent.as_path(), "its binDir directory"),
        (real_dir.as_path(), "the directory of its file"),
        (real.as_path(), "the file"),
    ] {
        let md = std::fs::metadata(path).map_err(|e| refuse(&e.to_string()))?;
        if md.uid() != 0 && md.uid() != own {
            return Err(refuse(&format!("{what} is owned by uid {}", md.uid())));
        }
        let sticky_dir = md.is_dir() && md.mode() & 0o1000 != 0;
        if md.permissions().mode() & 0o022 != 0 && !sticky_dir {
            return Err(refuse(&format!("{what} is writable by other users")));
        }
        if path == real && !md.is_file() {
            return Err(refuse("it is not a regular file"));
        }
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_request_should_set_only_cni_variables_and_cni_path_should_be_bin_dir() {
        let dirs = vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")];
        let req = |env: &[(&str, &str)], dir: &str| Request {
            program: "/usr/lib/cni/bridge".into(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            dir: dir.into(),
        };
        let env = plugin_env(
            &req(
                &[("CNI_COMMAND", "ADD"), ("CNI_PATH", "/var/lib/plexus/evil")],
                "/",
            ),
            &dirs,
        )
        .unwrap();
        assert_eq!(
            env,
            [
                ("CNI_COMMAND".to_string(), "ADD".to_string()),
                (
                    "CNI_PATH".to_string(),
                    "/opt/cni/bin:/usr/lib/cni".to_string()
                )
            ]
        );
        for bad in ["LD_PRELOAD", "PATH", "GCONV_PATH", "cni_command"] {
            let e = plugin_env(&req(&[(bad, "/x")], "/"), &dirs).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        assert!(plugin_env(&req(&[], "/tmp"), &dirs).is_err());
    }

    #[test]
    fn only_programs_in_a_bin_dir_that_no_one_else_can_change_should_be_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plugin = bin.join("bridge");
        std::fs::write(&plugin, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dirs = vec![bin.clone()];
        assert_eq!(
            allowed(&plugin, &dirs).unwrap(),
            plugin.canonicalize().unwrap()
        );

        // Elsewhere, relative, or through a link out of the directory.
        let other = dir.path().join("other");
        std::fs::write(&other, "#!/bin/sh\n").unwrap();
        assert!(allowed(&other, &dirs)
            .unwrap_err()
            .contains("not in a binDir"));
        assert!(allowed(Path::new("bridge"), &dirs).is_err());
        assert!(allowed(&bin.join("../other"), &dirs).is_err());
        // A link in binDir may lead elsewhere (only root can make it), to
        // a file no one else can change.
        let link = bin.join("linked");
        std::os::unix::fs::symlink(&other, &link).unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            allowed(&link, &dirs).unwrap(),
            other.canonicalize().unwrap()
        );
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o757)).unwrap();
        assert!(allowed(&link, &dirs).unwrap_err().contains("writable"));
        // A binDir reached through a link of its own.
        let alias = dir.path().join("alias");
        std::os::unix::fs::symlink(&bin, &alias).unwrap();
        assert!(allowed(&alias.join("bridge"), &dirs).is_ok());

        // Writable by others: the file, then the directory.
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(allowed(&plugin, &dirs).unwrap_err().contains("writable"));
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(allowed(&plugin, &dirs).unwrap_err().contains("writable"));
    }
}
