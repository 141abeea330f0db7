//! Runs the built `plexusd` in a private directory and watches what it
//! tells its service manager, so tests wait on events instead of sleeping.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const PLEXUSD: &str = env!("CARGO_BIN_EXE_plexusd");

/// A directory of its own for one test, removed on drop.
pub struct TestDir {
    pub path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "plexus-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create test dir");
        Self { path }
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.path.join(p)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Polls `cond` (every `step`) until it holds or `timeout` passes; whether
/// it held.
pub fn poll(timeout: Duration, step: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(step);
    }
}

/// Runs `call` again while it fails with EINTR. A socket call with a
/// timeout (`SO_RCVTIMEO`, `SO_SNDTIMEO`) fails so whenever a signal wakes
/// the thread, even one the process ignores and even under `SA_RESTART`:
/// with many tests in one process, a child of another test that exits
/// while the thread that started it blocks signals (as `posix_spawn` does
/// for a moment) leaves its SIGCHLD to whichever other thread the kernel
/// wakes for it. (`read_to_end` and `write_all` retry on their own.)
pub fn retry_interrupted<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match call() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// Polls `cond` until it holds; fails the test when `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, cond: impl FnMut() -> bool) {
    assert!(
        poll(timeout, Duration::from_millis(5), cond),
        "timed out waiting for {what}"
    );
}

/// A running plexusd; killed on drop if still running.
pub struct Daemon {
    pub child: Child,
    pub sock: PathBuf,
    pub log: PathBuf,
    notify: UnixDatagram,
    seen: Vec<String>,
}

impl Daemon {
    /// Writes `config` to `<dir>/<tag>.json` and starts plexusd binding
    /// `<dir>/sock/plexus.sock` itself (unless `config` names a socketDir).
    pub fn start(dir: &TestDir, tag: &str, config: serde_json::Value) -> Self {
        Self::start_env(dir, tag, config, &[])
    }

    /// [`Daemon::start`] with extra environment variables.
    pub fn start_env(
        dir: &TestDir,
        tag: &str,
        config: serde_json::Value,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_wrapped(dir, tag, config, env, &[])
    }

    /// [`Daemon::start_env`] with plexusd run by `wrapper` (a command and
    /// its arguments, plexusd's path and arguments appended; none: plexusd
    /// itself).
    pub fn start_wrapped(
        dir: &TestDir,
        tag: &str,
        mut config: serde_json::Value,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Self {
        let obj = config.as_object_mut().expect("config object");
        obj.entry("socketDir")
            .or_insert_with(|| dir.join("sock").to_string_lossy().into());
        obj.entry("logLevel").or_insert_with(|| "debug".into());
        let sock = PathBuf::from(obj["socketDir"].as_str().unwrap()).join("plexus.sock");
        Self::spawn(dir, tag, &config, sock, None, env, wrapper)
    }

    /// Starts plexusd as systemd would: `listener` as fd 3, `LISTEN_FDS=1`,
    /// `LISTEN_PID` set to the daemon's own pid.
    pub fn start_activated(
        dir: &TestDir,
        tag: &str,
        config: serde_json::Value,
        listener: &UnixListener,
        sock: &Path,
    ) -> Self {
        Self::spawn(
            dir,
            tag,
            &config,
            sock.to_path_buf(),
            Some(listener),
            &[],
            &[],
        )
    }

    fn spawn(
        dir: &TestDir,
        tag: &str,
        config: &serde_json::Value,
        sock: PathBuf,
        listener: Option<&UnixListener>,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Self {
        let cfg = dir.join(&format!("{tag}.json"));
        // plexusd creates its stateDir at start: never the host's.
        let mut config = config.clone();
        if let Some(obj) = config.as_object_mut() {
            obj.entry("stateDir")
                .or_insert_with(|| dir.join("state").to_string_lossy().into());
        }
        fs::write(&cfg, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        let notify_path = dir.join(&format!("{tag}.notify"));
        let _ = fs::remove_file(&notify_path);
        let notify = UnixDatagram::bind(&notify_path).expect("bind notify socket");
        let log = dir.join(&format!("{tag}.log"));
        let logf = fs::File::create(&log).unwrap();
        let mut cmd = match listener {
            None if !wrapper.is_empty() => {
                let mut c = Command::new(wrapper[0]);
                c.args(&wrapper[1..]).arg(PLEXUSD);
                c
            }
            None => Command::new(PLEXUSD),
            Some(_) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(r#"LISTEN_PID=$$ exec "$0" "$@""#)
                    .arg(PLEXUSD)
                    .env("LISTEN_FDS", "1");
                c
            }
        };
        cmd.arg("--config")
            .arg(&cfg)
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("LISTEN_FDS_FIRST_FD")
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf);
        if listener.is_none() {
            cmd.env_remove("LISTEN_FDS").env_remove("LISTEN_PID");
        }
        cmd.env_remove("WATCHDOG_USEC").env_remove("WATCHDOG_PID");
        // Static networks only, unless a test gives a kubeconfig.
        cmd.env_remove("KUBERNETES_SERVICE_HOST");
        cmd.envs(env.iter().copied());
        if let Some(l) = listener {
            pass_as_fd3(&mut cmd, l.as_raw_fd());
        }
        let child = cmd.spawn().expect("spawn plexusd");
        Self {
            child,
            sock,
            log,
            notify,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for a notification datagram containing `needle` (e.g.
    /// `READY=1`) and returns it; earlier datagrams are kept in `seen`.
    pub fn wait_notify(&mut self, needle: &str, timeout: Duration) -> String {
        if let Some(s) = self.seen.iter().find(|s| s.contains(needle)) {
            return s.clone();
        }
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                panic!(
                    "no {needle:?} notification within {timeout:?}; seen {:?}; log:\n{}",
                    self.seen,
                    self.log_text()
                );
            }
            self.notify.set_read_timeout(Some(left)).unwrap();
            match self.notify.recv(&mut buf) {
                Ok(n) => {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    self.seen.push(msg.clone());
                    if msg.contains(needle) {
                        return msg;
                    }
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut
                        || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("notify recv: {e}"),
            }
        }
    }

    /// Every notification received so far, draining the socket.
    pub fn notifications(&mut self) -> Vec<String> {
        self.notify.set_nonblocking(true).unwrap();
        let mut buf = vec![0u8; 4096];
        loop {
            match self.notify.recv(&mut buf) {
                Ok(n) => self
                    .seen
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.notify.set_nonblocking(false).unwrap();
        self.seen.clone()
    }

    pub fn ready(&mut self) -> &mut Self {
        self.wait_notify("READY=1", Duration::from_secs(20));
        self
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "plexusd did not exit within {timeout:?}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Makes `fd` the child's fd 3, inheritable across exec.
pub fn pass_as_fd3(cmd: &mut Command, fd: i32) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                // dup2 onto itself would keep FD_CLOEXEC.
                if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Inode of a path (not following symlinks).
pub fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(path).ok().map(|m| m.ino())
}
