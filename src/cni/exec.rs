//! The plugin process runner: finds a plugin binary, runs it with a
//! controlled environment and stdin, enforces the deadline, and turns what
//! it printed into a result or an error that names the plugin.
//!
//! Every plugin runs in its own process group. The group is killed when the
//! deadline passes, and again after the plugin exits (leftover children),
//! before the plugin itself is reaped: the group id cannot be reused while
//! the unreaped plugin holds it, so the kill never hits a stranger.
//!
//! Plugins are started with posix_spawn (vfork semantics): no `pre_exec`
//! hook, because one forces a real fork, which copies the daemon's page
//! tables and, in a burst, costs more CPU than the plugins themselves. So a
//! daemon killed by SIGKILL does not take its running plugins with it; under
//! systemd, `KillMode=mixed` kills whatever is left in the unit's cgroup
//! before the restart. Nothing here blocks the async runtime: spawning runs
//! on the blocking pool, exits are awaited on a pidfd, pipes are async.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::OnceCell;

use super::types::code;
use crate::metrics::{Metrics, PluginLabels};

/// Most a plugin may print on stdout; results are a few KiB.
pub const STDOUT_CAP: usize = 1 << 20;
/// Most of a plugin's stderr that is kept (for the log and error details).
pub const STDERR_CAP: usize = 64 << 10;
/// How long to wait for pipes to close once the plugin's group is dead.
const PIPE_GRACE: Duration = Duration::from_secs(2);
/// `PATH` for plugins when the daemon has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// libcni retries exec on ETXTBSY (a binary being replaced) this often.
const TXTBSY_RETRIES: u32 = 5;

/// The CNI environment of one plugin call.
#[derive(Debug, Clone, Default)]
pub struct CallEnv {
    pub command: &'static str,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
}

/// A plugin's CNI error object as it printed it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PluginError {
    #[serde(default)]
    pub code: u32,
    #[serde(default)]
    pub msg: String,
    #[serde(default)]
    pub details: String,
}

/// Why running a plugin did not give a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("plugin {plugin:?} not found in {}", dirs.join(":"))]
    NotFound { plugin: String, dirs: Vec<String> },
    #[error("plugin {plugin:?} ({}) could not be started: {source}", path.display())]
    Spawn {
        plugin: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("plugin {plugin:?} ({}) timed out after {} during {command}; its process group was killed", path.display(), crate::duration::format(*after))]
    TimedOut {
        plugin: String,
        path: PathBuf,
        command: &'static str,
        after: Duration,
    },
    #[error("plugin {plugin:?} failed: {}", error.msg)]
    Failed { plugin: String, error: PluginError },
    #[error("plugin {plugin:?} ({}) failed with no error message: {status}", path.display())]
    NoMessage {
        plugin: String,
        path: PathBuf,
        status: String,
        stderr: String,
    },
    #[error("plugin {plugin:?} ({}) failed ({status}) and printed something that is not a CNI error", path.display())]
    BadError {
        plugin: String,
        path: PathBuf,
        status: String,
        stdout: String,
    },
    #[error("plugin {plugin:?} ({}) printed an invalid result: {reason}", path.display())]
    InvalidResult {
        plugin: String,
        path: PathBuf,
        reason: String,
        stdout: String,
    },
    #[error("plugin {plugin:?} ({}) printed more than {cap} bytes", path.display())]
    TooMuchOutput {
        plugin: String,
        path: PathBuf,
        cap: usize,
    },
    #[error("plugin {plugin:?} ({}): {what}: {source}", path.display())]
    Io {
        plugin: String,
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

impl ExecError {
    /// The CNI error code this failure is reported with.
    pub fn code(&self) -> u32 {
        match self {
            ExecError::Failed { error, .. } => error.code,
            ExecError::InvalidResult { .. } | ExecError::BadError { .. } => code::DECODING_FAILURE,
            ExecError::Io { .. } => code::IO_FAILURE,
            _ => code::INTERNAL,
        }
    }

    /// Extra detail for the CNI error's `details`.
    pub fn details(&self) -> String {
        match self {
            ExecError::Failed { error, .. } => error.details.clone(),
            ExecError::NoMessage { stderr, .. } => stderr.clone(),
            ExecError::BadError { stdout, .. } | ExecError::InvalidResult { stdout, .. } => {
                stdout.clone()
            }
            _ => String::new(),
        }
    }
}

/// A plugin's process group, identified against pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// The plugin's pid, which is also its process group id.
    pub pgid: i32,
    /// Field 22 of /proc/<pid>/stat (clock ticks since boot) of the leader.
    pub start_time: u64,
}

/// Where the runner notes each plugin's process group before the plugin is
/// given its stdin, so that a later daemon can kill what a crashed one left.
pub trait Journal: Send + Sync + std::fmt::Debug + 'static {
    /// Blocking (runs on the blocking pool). Called right after the spawn and
    /// before a single byte of stdin is written. An error fails the call: the
    /// plugin is killed and reaped without having read its config.
    fn started(&self, container_id: &str, group: Group) -> io::Result<()>;
    /// Blocking. Called once the group has been killed and the plugin reaped
    /// (also when the call's future is dropped half-way).
    fn finished(&self, container_id: &str, group: Group);
}

/// The start time of `pid` (field 22 of /proc/<pid>/stat), if it exists.
pub fn start_time(pid: i32) -> Option<u64> {
    let _ = pid;
    None
}

/// Kills a group recorded by an earlier daemon: SIGKILL to the group if its
/// leader is still the recorded process (same start time), or, when the
/// leader is gone, to members of that group that started no earlier than the
/// leader; then waits, up to `wait`, until no live (non-zombie) member
/// remains. Blocking. Ok(true) when something was killed, Ok(false) when
/// nothing of the group was left, Err when members survived `wait`.
pub fn kill_stale_group(group: Group, wait: Duration) -> io::Result<bool> {
    let _ = (group, wait);
    Ok(false)
}

/// A located plugin binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugin {
    pub name: String,
    pub path: PathBuf,
    stamp: Stamp,
}

/// Identity of a binary's content as far as the version cache cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: Option<SystemTime>,
}

type VersionCell = Arc<OnceCell<Arc<Vec<String>>>>;

/// Runs plugins from a search path with one deadline per call.
#[derive(Debug)]
pub struct Runner {
    dirs: Vec<PathBuf>,
    cni_path: String,
    path_env: String,
    timeout: Duration,
    versions: Mutex<HashMap<PathBuf, (Stamp, VersionCell)>>,
    metrics: Option<Arc<Metrics>>,
    journal: Option<Arc<dyn Journal>>,
}

impl Runner {
    pub fn new(dirs: Vec<PathBuf>, timeout: Duration, metrics: Option<Arc<Metrics>>) -> Self {
        let cni_path = dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        let path_env = std::env::var("PATH")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_PATH.to_string());
        Self {
            dirs,
            cni_path,
            path_env,
            timeout,
            versions: Mutex::new(HashMap::new()),
            metrics,
            journal: None,
        }
    }

    /// Notes every plugin run that has a container id in `journal`.
    pub fn with_journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Finds `name` in the search path: the first regular file. Blocking
    /// (stat calls): run it on the blocking pool.
    pub fn find(&self, name: &str) -> Result<Plugin, ExecError> {
        if !name.contains('/') {
            for dir in &self.dirs {
                let path = dir.join(name);
                if let Ok(md) = std::fs::metadata(&path) {
                    if md.is_file() {
                        let stamp = Stamp {
                            dev: md.dev(),
                            ino: md.ino(),
                            size: md.size(),
                            mtime: md.modified().ok(),
                        };
                        return Ok(Plugin {
                            name: name.to_string(),
                            path,
                            stamp,
                        });
                    }
                }
            }
        }
        Err(ExecError::NotFound {
            plugin: name.to_string(),
            dirs: self.dirs.iter().map(|d| d.display().to_string()).collect(),
        })
    }

    /// The versions `plugin` supports, from its VERSION answer, cached per
    /// binary until the file changes. A plugin that does not answer
    /// VERSION usefully gives `None` (the caller falls back to the list's
    /// own version, as libcni does).
    pub async fn versions(&self, plugin: &Plugin) -> Option<Arc<Vec<String>>> {
        let cell = {
            let mut map = self.versions.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&plugin.path) {
                Some((stamp, cell)) if *stamp == plugin.stamp => cell.clone(),
                _ => {
                    let cell: VersionCell = Arc::new(OnceCell::new());
                    map.insert(plugin.path.clone(), (plugin.stamp, cell.clone()));
                    cell
                }
            }
        };
        let got = cell
            .get_or_try_init(|| async {
                match self.ask_version(plugin).await {
                    Ok(v) => Ok(Arc::new(v)),
                    Err(e) => {
                        tracing::warn!(plugin = %plugin.name, cause = %e, "VERSION failed; using the network's version");
                        Err(())
                    }
                }
            })
            .await;
        got.ok().cloned()
    }

    async fn ask_version(&self, plugin: &Plugin) -> Result<Vec<String>, ExecError> {
        // libcni sends dummy values for very old skel versions.
        let env = CallEnv {
            command: "VERSION",
            container_id: String::new(),
            netns: "dummy".into(),
            ifname: "dummy".into(),
            args: String::new(),
        };
        let out = match self
            .run(plugin, &env, br#"{"cniVersion":"1.1.0"}"#.to_vec())
            .await
        {
            Ok(out) => out,
            Err(ExecError::Failed { error, .. })
                if error.msg.contains("unknown CNI_COMMAND: VERSION") =>
            {
                return Ok(vec!["0.1.0".into()])
            }
            Err(e) => return Err(e),
        };
        #[derive(Deserialize)]
        struct Info {
            #[serde(rename = "cniVersion", default)]
            cni_version: String,
            #[serde(rename = "supportedVersions", default)]
            supported: Option<Vec<String>>,
        }
        let bad = |reason: String| ExecError::InvalidResult {
            plugin: plugin.name.clone(),
            path: plugin.path.clone(),
            reason,
            stdout: snippet(&out),
        };
        let info: Info =
            serde_json::from_slice(&out).map_err(|e| bad(format!("VERSION answer: {e}")))?;
        match info.supported {
            Some(v) if !v.is_empty() => Ok(v),
            _ if info.cni_version == "0.2.0" => Ok(vec!["0.1.0".into(), "0.2.0".into()]),
            _ => Err(bad("VERSION answer lists no supportedVersions".into())),
        }
    }

    /// Runs `plugin` once and returns its stdout on success (exit 0).
    /// A non-zero exit becomes an error: the plugin's CNI error JSON when
    /// it printed one, else its exit status and stderr.
    pub async fn run(
        &self,
        plugin: &Plugin,
        env: &CallEnv,
        stdin: Vec<u8>,
    ) -> Result<Vec<u8>, ExecError> {
        let started = std::time::Instant::now();
        let out = self.run_once(plugin, env, stdin).await;
        if let Some(m) = &self.metrics {
            let outcome = match &out {
                Ok(_) => "success",
                Err(ExecError::TimedOut { .. }) => "timeout",
                Err(_) => "error",
            };
            m.plugin_calls
                .get_or_create(&PluginLabels {
                    plugin: plugin.name.clone(),
                    command: env.command,
                    outcome,
                })
                .observe(started.elapsed().as_secs_f64());
        }
        out
    }

    async fn run_once(
        &self,
        plugin: &Plugin,
        env: &CallEnv,
        stdin: Vec<u8>,
    ) -> Result<Vec<u8>, ExecError> {
        let mut cmd = std::process::Command::new(&plugin.path);
        cmd.env_clear()
            .env("PATH", &self.path_env)
            .env("CNI_COMMAND", env.command)
            .env("CNI_CONTAINERID", &env.container_id)
            .env("CNI_NETNS", &env.netns)
            .env("CNI_IFNAME", &env.ifname)
            .env("CNI_ARGS", &env.args)
            .env("CNI_PATH", &self.cni_path)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let name = plugin.name.clone();
        let path = plugin.path.clone();
        let io_err = |what: &'static str| {
            let (plugin, path) = (name.clone(), path.clone());
            move |source: io::Error| ExecError::Io {
                plugin,
                path,
                what,
                source,
            }
        };
        let mut child = spawn(cmd, &plugin.name, &plugin.path).await?;
        let guard = Reaper::new(child.id());
        let stdin_pipe = take_pipe(
            child.stdin.take().map(OwnedFd::from),
            pipe::Sender::from_owned_fd,
        )
        .map_err(io_err("stdin"))?;
        let stdout_pipe = take_pipe(
            child.stdout.take().map(OwnedFd::from),
            pipe::Receiver::from_owned_fd,
        )
        .map_err(io_err("stdout"))?;
        let stderr_pipe = take_pipe(
            child.stderr.take().map(OwnedFd::from),
            pipe::Receiver::from_owned_fd,
        )
        .map_err(io_err("stderr"))?;

        let io = async move {
            let feed = async move {
                let mut tx = stdin_pipe;
                // A plugin may exit without reading stdin: EPIPE is fine.
                let _ = tx.write_all(&stdin).await;
                drop(tx);
            };
            let ((), out, err) = tokio::join!(
                feed,
                read_capped(stdout_pipe, STDOUT_CAP),
                read_capped(stderr_pipe, STDERR_CAP)
            );
            (out, err)
        };
        let io = tokio::spawn(io);

        let pid = child.id();
        let exited = wait_exit(pid);
        tokio::pin!(exited);
        let timed_out = match tokio::time::timeout(self.timeout, &mut exited).await {
            Ok(_) => false,
            Err(_) => {
                kill_group(pid);
                (&mut exited).await;
                true
            }
        };
        // The plugin is a zombie now, holding its group id: kill whatever
        // it left running in the group, then reap it.
        kill_group(pid);
        let status = guard.reap(&mut child);
        let (out, err) = match tokio::time::timeout(PIPE_GRACE, io).await {
            Ok(Ok((out, err))) => (out, err),
            // Something outside the group kept a pipe open: give up on it.
            _ => (Ok((Vec::new(), false)), Ok((Vec::new(), false))),
        };
        let (stdout, stdout_cut) = out.map_err(io_err("reading stdout"))?;
        let (stderr, _) = err.unwrap_or_default();
        if !stderr.is_empty() {
            tracing::info!(
                plugin = %plugin.name,
                command = env.command,
                container_id = %env.container_id,
                ifname = %env.ifname,
                stderr = %String::from_utf8_lossy(&stderr).trim_end(),
                "plugin wrote to stderr"
            );
        }
        if timed_out {
            return Err(ExecError::TimedOut {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                command: env.command,
                after: self.timeout,
            });
        }
        if stdout_cut {
            return Err(ExecError::TooMuchOutput {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                cap: STDOUT_CAP,
            });
        }
        let status = match status {
            Some(s) => s,
            None => {
                return Err(ExecError::Io {
                    plugin: plugin.name.clone(),
                    path: plugin.path.clone(),
                    what: "waiting for the plugin",
                    source: io::Error::other("exit status unavailable"),
                })
            }
        };
        if status.success() {
            return Ok(stdout);
        }
        let status_text = describe(status);
        if stdout.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(ExecError::NoMessage {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                status: status_text,
                stderr: snippet(&stderr),
            });
        }
        match serde_json::from_slice::<PluginError>(&stdout) {
            Ok(error) => Err(ExecError::Failed {
                plugin: plugin.name.clone(),
                error,
            }),
            Err(_) => Err(ExecError::BadError {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                status: status_text,
                stdout: snippet(&stdout),
            }),
        }
    }
}

/// Spawns on the blocking pool (fork+exec waits for the exec), retrying
/// "text file busy" like libcni.
async fn spawn(
    mut cmd: std::process::Command,
    name: &str,
    path: &Path,
) -> Result<Child, ExecError> {
    let mut tries = 0;
    loop {
        let (back, res) = tokio::task::spawn_blocking(move || {
            let r = cmd.spawn();
            (cmd, r)
        })
        .await
        .map_err(|e| ExecError::Spawn {
            plugin: name.to_string(),
            path: path.to_path_buf(),
            source: io::Error::other(e.to_string()),
        })?;
        cmd = back;
        match res {
            Ok(child) => return Ok(child),
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < TXTBSY_RETRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(source) => {
                return Err(ExecError::Spawn {
                    plugin: name.to_string(),
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
}

fn take_pipe<T>(fd: Option<OwnedFd>, wrap: impl FnOnce(OwnedFd) -> io::Result<T>) -> io::Result<T> {
    wrap(fd.ok_or_else(|| io::Error::other("pipe missing"))?)
}

/// Reads to EOF, keeping at most `cap` bytes (and draining the rest so the
/// writer never blocks); the flag says whether anything was dropped.
async fn read_capped<R: AsyncRead + Unpin>(mut r: R, cap: usize) -> io::Result<(Vec<u8>, bool)> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 << 10];
    let mut cut = false;
    loop {
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Ok((buf, cut));
        }
        let room = cap.saturating_sub(buf.len());
        if n > room {
            cut = true;
        }
        buf.extend_from_slice(&chunk[..n.min(room)]);
    }
}

/// Waits until our child `pid` has exited, without reaping it: on a pidfd
/// (readable once the process exits; no thread is held), or, on kernels
/// without pidfd_open(2), with waitid(WNOWAIT) on the blocking pool.
async fn wait_exit(pid: u32) {
    if let Some(fd) = pidfd_open(pid) {
        // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open
        // and the same for the AsyncFd's whole life.
        let registered = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        if let Ok(fd) = registered {
            // Readable means exited; an error means the fd cannot tell, so
            // fall through to waitid.
            if fd.readable().await.is_ok() {
                return;
            }
        }
    }
    let _ = tokio::task::spawn_blocking(move || wait_exit_nowait(pid)).await;
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Some(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// Blocks until `pid` has exited, without reaping it (WNOWAIT).
fn wait_exit_nowait(pid: u32) {
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: plain waitid(2) on our own child with a valid pointer.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals the process group our
        // (still unreaped) child leads; no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// Makes sure a plugin is killed and reaped even when the call is dropped
/// half-way (its future cancelled).
struct Reaper {
    pid: Option<u32>,
}

impl Reaper {
    fn new(pid: u32) -> Self {
        Self { pid: Some(pid) }
    }

    /// Reaps the exited child without blocking; `None` if it cannot.
    fn reap(mut self, child: &mut Child) -> Option<std::process::ExitStatus> {
        match child.try_wait() {
            Ok(Some(s)) => {
                self.pid = None;
                Some(s)
            }
            // Not expected once the exit was seen; never wait here (this
            // runs on the async runtime): Drop kills and reaps it on the
            // blocking pool instead.
            _ => None,
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            kill_group(pid);
            let reap = move || {
                let mut status = 0;
                // SAFETY: waitpid(2) on our own child, valid pointer.
                unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
            };
            if tokio::runtime::Handle::try_current().is_ok() {
                drop(tokio::task::spawn_blocking(reap));
            } else {
                reap();
            }
        }
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    if let Some(sig) = status.signal() {
        format!("killed by signal {sig}")
    } else if let Some(code) = status.code() {
        format!("exit status {code}")
    } else {
        status.to_string()
    }
}

/// The first 4 KiB of some output, as text.
fn snippet(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(4096)];
    String::from_utf8_lossy(cut).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn env() -> CallEnv {
        CallEnv {
            command: "ADD",
            container_id: "c1".into(),
            netns: "/x".into(),
            ifname: "eth0".into(),
            args: String::new(),
        }
    }

    #[tokio::test]
    async fn plugin_output_and_errors_should_be_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        script(
            dir.path(),
            "ok",
            "cat >/dev/null; echo '{\"cniVersion\":\"1.0.0\"}'; echo log >&2",
        );
        script(
            dir.path(),
            "err",
            "echo '{\"code\":7,\"msg\":\"bad\"}'; exit 1",
        );
        script(dir.path(), "crash", "kill -SEGV $$");
        script(dir.path(), "garbage", "echo nope; exit 3");
        script(
            dir.path(),
            "env",
            "echo \"$CNI_COMMAND $CNI_IFNAME $CNI_PATH\"; env | cut -d= -f1 | grep -v '^PWD$' | sort | tr '\\n' ' '",
        );
        let r = Runner::new(vec![dir.path().into()], Duration::from_secs(10), None);
        let run = |name: &'static str| {
            let r = &r;
            async move { r.run(&r.find(name).unwrap(), &env(), b"{}".to_vec()).await }
        };
        assert_eq!(run("ok").await.unwrap(), b"{\"cniVersion\":\"1.0.0\"}\n");
        match run("err").await {
            Err(ExecError::Failed { error, .. }) => assert_eq!(error.code, 7),
            other => panic!("{other:?}"),
        }
        let e = run("crash").await.unwrap_err();
        assert!(e.to_string().contains("killed by signal 11"), "{e}");
        let e = run("garbage").await.unwrap_err();
        assert!(matches!(e, ExecError::BadError { .. }), "{e}");
        // Nothing of the daemon's environment (NOTIFY_SOCKET, LISTEN_*,
        // JOURNAL_STREAM, or here cargo's variables) reaches a plugin; the
        // shell adds PWD itself.
        let out = run("env").await.unwrap();
        let expect = format!(
            "ADD eth0 {}\nCNI_ARGS CNI_COMMAND CNI_CONTAINERID CNI_IFNAME CNI_NETNS CNI_PATH PATH ",
            dir.path().display()
        );
        assert_eq!(String::from_utf8_lossy(&out), expect);
        assert!(matches!(r.find("missing"), Err(ExecError::NotFound { .. })));
    }

    #[tokio::test]
    async fn timeout_should_kill_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("child.pid");
        script(
            dir.path(),
            "hang",
            &format!("sleep 1000 & echo $! > {}; wait", marker.display()),
        );
        let r = Runner::new(vec![dir.path().into()], Duration::from_millis(300), None);
        let e = r
            .run(&r.find("hang").unwrap(), &env(), Vec::new())
            .await
            .unwrap_err();
        assert!(matches!(e, ExecError::TimedOut { .. }), "{e}");
        let pid: i32 = std::fs::read_to_string(&marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild was SIGKILLed with its group; once init reaps it,
        // /proc no longer lists it (a zombie reads as state Z meanwhile).
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !gone() {
            assert!(std::time::Instant::now() < deadline, "sleep survived");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn versions_should_be_cached_until_the_binary_changes() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let body = |v: &str| {
            format!(
                "echo x >> {}; echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"{v}\"]}}'",
                count.display()
            )
        };
        script(dir.path(), "p", &body("0.4.0"));
        let r = Runner::new(vec![dir.path().into()], Duration::from_secs(10), None);
        let p = r.find("p").unwrap();
        assert_eq!(*r.versions(&p).await.unwrap(), vec!["0.4.0".to_string()]);
        assert_eq!(*r.versions(&p).await.unwrap(), vec!["0.4.0".to_string()]);
        assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1);
        script(dir.path(), "p", &format!("{}   ", body("1.0.0")));
        let p = r.find("p").unwrap();
        assert_eq!(*r.versions(&p).await.unwrap(), vec!["1.0.0".to_string()]);
    }
}
