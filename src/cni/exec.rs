//! The plugin process runner: finds a plugin binary, runs it with a
//! controlled environment and stdin, enforces the deadline, and turns what
//! it printed into a result or an error that names the plugin.
//!
//! Every plugin runs in its own process group. The group is killed when the
//! deadline passes, and again after the plugin exits (leftover children),
//! before the plugin itself is reaped: the group id cannot be reused while
//! the unreaped plugin holds it, so the kill never hits a stranger. The
//! answer is what the plugin printed by the time it exited: a process that
//! left the group (setsid) and inherited the pipes is neither waited for nor
//! killed (under systemd the unit's cgroup takes care of it), and no task,
//! buffer or descriptor of the call outlives it.
//!
//! With a [`Journal`], each plugin's process group is noted before the
//! plugin gets a byte of its config, so a daemon restarted after a crash can
//! kill what the old one left running ([`kill_stale_group`]); a plugin whose
//! daemon died before its config was written reads EOF and does nothing.
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
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::Mutex as AsyncMutex;

use crate::api::code;
use crate::metrics::{Metrics, PluginLabels};

/// Most a plugin may print on stdout; results are a few KiB.
pub const STDOUT_CAP: usize = 1 << 20;
/// Most of a plugin's stderr that is kept (for the log and error details).
pub const STDERR_CAP: usize = 64 << 10;
/// How long to keep reading once the plugin has exited and its group was
/// killed: what it printed is in the pipe already, and the killed members
/// close their ends within microseconds. Only a process outside the group
/// that inherited the pipes keeps them open past this.
const PIPE_GRACE: Duration = Duration::from_millis(100);
/// Most a VERSION call may take (less when `pluginTimeout` is shorter).
/// Plugins answer it in milliseconds without touching the system, and it
/// runs before the ADD it serves: a hung VERSION must not cost a whole
/// `pluginTimeout` on top of the call.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a failed VERSION is remembered for a binary; meanwhile the
/// network's own version is used without asking again.
pub const VERSION_RETRY: Duration = Duration::from_secs(60);
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
    /// What had to happen before the plugin may read its configuration
    /// (the record reaching the disk) failed; the plugin was stopped
    /// before it read anything.
    #[error("plugin {plugin:?} was stopped before it read its configuration: {why}")]
    Held { plugin: String, why: String },
}

/// What must be done before a plugin may read its configuration (see
/// [`Runner::run_gated`]): blocking work, done in the spawn's own trip to
/// the blocking pool right after the plugin started (and was noted in the
/// journal), so it overlaps the plugin's start without a hand-off of its
/// own. It runs even when the spawn fails, and only once (not again when
/// the spawn is retried). `Ok` lets the plugin go on, `Err` stops it.
pub type Gate = Box<dyn FnOnce() -> Result<(), String> + Send>;

impl ExecError {
    /// The CNI error code this failure is reported with.
    pub fn code(&self) -> u32 {
        match self {
            // 0 is "unknown": a plugin that printed none failed all the same.
            ExecError::Failed { error, .. } if error.code == 0 => code::INTERNAL,
            ExecError::Failed { error, .. } => error.code,
            ExecError::InvalidResult { .. } | ExecError::BadError { .. } => code::DECODING_FAILURE,
            ExecError::Io { .. } | ExecError::Held { .. } => code::IO_FAILURE,
            // Hung or slow, not broken: the runtime retries the call.
            ExecError::TimedOut { .. } => code::TRY_AGAIN_LATER,
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
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot) of the leader.
    pub start_time: u64,
}

/// Where the runner notes each plugin's process group before the plugin is
/// given its stdin, so that a later daemon can kill what a crashed one left.
pub trait Journal: Send + Sync + std::fmt::Debug + 'static {
    /// Blocking (runs on the blocking pool). Called right after the spawn and
    /// before a single byte of stdin is written. An error fails the call: the
    /// plugin is killed and reaped without having read its config.
    fn started(&self, container_id: &str, group: Group) -> io::Result<()>;
    /// Called once the group has been killed and the plugin reaped (also
    /// when the call's future is dropped half-way, then on the blocking
    /// pool). Must not block: it runs on the async runtime, so a journal
    /// that needs I/O to close the entry defers it (the [`Markers`] of the
    /// engine empty the entry in their next trip to the file).
    ///
    /// [`Markers`]: crate::cni::state::Markers
    fn finished(&self, container_id: &str, group: Group);
}

/// The start time of `pid` (field 22 of `/proc/<pid>/stat`), if it exists.
pub fn start_time(pid: i32) -> Option<u64> {
    read_stat(pid).map(|s| s.start_time)
}

/// What the runner needs of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    zombie: bool,
    pgrp: i32,
    start_time: u64,
}

fn read_stat(pid: i32) -> Option<Stat> {
    if pid <= 0 {
        return None;
    }
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses a stat line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is index 0 here, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        // X (dead) is on its way out like a zombie.
        zombie: matches!(*fields.first()?, "Z" | "X"),
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Live (non-zombie) members of `group`: processes in process group
/// `group.pgid` that started no earlier than its leader.
fn live_members(group: Group) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            read_stat(pid).is_some_and(|s| {
                !s.zombie && s.pgrp == group.pgid && s.start_time >= group.start_time
            })
        })
        .collect()
}

/// Kills a group recorded by an earlier daemon: SIGKILL to the group if its
/// leader is still the recorded process (same start time), or, when the
/// leader is gone, to members of that group (pgrp == pgid in /proc/*/stat)
/// that started no earlier than the leader; then waits, up to `wait`, until
/// no live (non-zombie) member remains. Blocking. Ok(true) when something was
/// killed, Ok(false) when nothing of the group was left, Err when members
/// survived `wait`.
///
/// A pid that names a live process with another start time was reused: the
/// kernel frees a pid only once no process has it as its group id either,
/// so the recorded group is gone and nothing is killed. A pgid below 2 is
/// refused (InvalidInput): no plugin has it, and kill(-1) would signal every
/// process.
pub fn kill_stale_group(group: Group, wait: Duration) -> io::Result<bool> {
    if group.pgid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a plugin's process group id", group.pgid),
        ));
    }
    let leader_is_ours = match read_stat(group.pgid) {
        Some(s) if s.start_time == group.start_time => true,
        Some(_) => return Ok(false),
        None => false,
    };
    let deadline = std::time::Instant::now() + wait;
    let mut killed = false;
    loop {
        let members = live_members(group);
        if members.is_empty() {
            return Ok(killed);
        }
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "process group {} (leader start time {}): {members:?} still alive {} after SIGKILL",
                    group.pgid,
                    group.start_time,
                    crate::duration::format(wait)
                ),
            ));
        }
        if leader_is_ours {
            // One signal to the group also gets children forked meanwhile.
            // SAFETY: kill(2) with a negative pid signals a process group;
            // no memory is involved.
            unsafe { libc::kill(-group.pgid, libc::SIGKILL) };
        } else {
            for pid in members {
                kill_member(pid, group);
            }
        }
        killed = true;
        // Killed processes go away within milliseconds; this bounds how
        // often /proc is scanned meanwhile.
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGKILL to `pid` through a pidfd, after checking (on that pidfd's
/// process) that it still belongs to `group`, so a pid reused between the
/// scan and the kill is never hit.
fn kill_member(pid: i32, group: Group) {
    let Some(fd) = u32::try_from(pid).ok().and_then(pidfd_open) else {
        return;
    };
    let ours =
        read_stat(pid).is_some_and(|s| s.pgrp == group.pgid && s.start_time >= group.start_time);
    if ours {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal(2) on a pidfd we own, with no siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }
}

/// A located plugin binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plugin {
    pub name: String,
    pub path: PathBuf,
    stamp: Stamp,
}

impl Plugin {
    /// A plugin known by name and path only, with no file behind it: what
    /// a [`super::parts::PluginRunner`] that runs no binaries (a test's
    /// fake) hands out. The real [`Runner`] locates its own.
    pub fn unlocated(name: &str, path: PathBuf) -> Self {
        Self {
            name: name.to_string(),
            path,
            stamp: Stamp {
                dev: 0,
                ino: 0,
                size: 0,
                mtime: None,
            },
        }
    }
}

/// Identity of a binary's content as far as the version cache cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: Option<SystemTime>,
}

/// What is known of a binary's VERSION answer.
#[derive(Debug)]
enum Known {
    Supports(Arc<Vec<String>>),
    /// It failed at this time: not asked again for a while.
    Failed(tokio::time::Instant),
}

/// One binary's entry. Held across the VERSION call, so concurrent calls
/// for a binary ask it once and share the answer (or the failure).
type VersionCell = Arc<AsyncMutex<Option<Known>>>;

/// Runs plugins from a search path with one deadline per call.
#[derive(Debug)]
pub struct Runner {
    dirs: Vec<PathBuf>,
    cni_path: String,
    path_env: String,
    timeout: Duration,
    version_timeout: Duration,
    version_retry: Duration,
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
            version_timeout: timeout.min(VERSION_TIMEOUT),
            version_retry: VERSION_RETRY,
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
    /// own version, as libcni does), and is not asked again for
    /// [`VERSION_RETRY`]: a hung or broken VERSION costs once, not on every
    /// call.
    pub async fn versions(&self, plugin: &Plugin) -> Option<Arc<Vec<String>>> {
        let cell = {
            let mut map = self.versions.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&plugin.path) {
                Some((stamp, cell)) if *stamp == plugin.stamp => cell.clone(),
                _ => {
                    let cell = VersionCell::default();
                    map.insert(plugin.path.clone(), (plugin.stamp, cell.clone()));
                    cell
                }
            }
        };
        let mut known = cell.lock().await;
        match &*known {
            Some(Known::Supports(v)) => return Some(v.clone()),
            Some(Known::Failed(at)) if at.elapsed() < self.version_retry => return None,
            _ => {}
        }
        match self.ask_version(plugin).await {
            Ok(v) => {
                let v = Arc::new(v);
                *known = Some(Known::Supports(v.clone()));
                Some(v)
            }
            Err(e) => {
                tracing::warn!(
                    plugin = %plugin.name,
                    cause = %e,
                    retry_after = %crate::duration::format(self.version_retry),
                    "VERSION failed; using the network's version"
                );
                *known = Some(Known::Failed(tokio::time::Instant::now()));
                None
            }
        }
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
        let stdin = br#"{"cniVersion":"1.1.0"}"#.to_vec();
        let out = match self
            .run_within(plugin, &env, stdin, None, self.version_timeout)
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
        self.run_within(plugin, env, stdin, None, self.timeout)
            .await
    }

    /// [`Runner::run`] whose plugin is started at once but given its
    /// stdin only once `gate` is `Ok`: the process start (exec, the Go
    /// runtime's start-up, several hundred microseconds) overlaps the
    /// gate's work, and the plugin still acts on nothing before it, since
    /// a CNI plugin reads its whole configuration before it does anything.
    /// When `gate` fails, the plugin's group is killed and reaped before it
    /// read a byte.
    pub async fn run_gated(
        &self,
        plugin: &Plugin,
        env: &CallEnv,
        stdin: Vec<u8>,
        gate: Gate,
    ) -> Result<Vec<u8>, ExecError> {
        self.run_within(plugin, env, stdin, Some(gate), self.timeout)
            .await
    }

    /// [`Runner::run`] with its own deadline.
    async fn run_within(
        &self,
        plugin: &Plugin,
        env: &CallEnv,
        stdin: Vec<u8>,
        gate: Option<Gate>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ExecError> {
        let started = std::time::Instant::now();
        let out = self.run_once(plugin, env, stdin, gate, timeout).await;
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

    /// One run of `plugin`: spawn (noting its group in the journal), feed
    /// its stdin and read its output until it exits or `timeout` passes,
    /// clean up its group, then judge what it did.
    async fn run_once(
        &self,
        plugin: &Plugin,
        env: &CallEnv,
        stdin: Vec<u8>,
        gate: Option<Gate>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ExecError> {
        let cmd = self.command(plugin, env);
        let (process, worked) = Process::start(cmd, plugin, self.journal_for(env), gate).await?;
        let why = worked.and_then(Result::err);
        if let Some(why) = why {
            process.stop().await;
            return Err(ExecError::Held {
                plugin: plugin.name.clone(),
                why,
            });
        }
        let ended = process.run(stdin, timeout).await;
        if !ended.drained {
            tracing::debug!(
                plugin = %plugin.name,
                command = env.command,
                container_id = %env.container_id,
                "a process outside the plugin's group kept its output open; answering from what the plugin printed"
            );
        }
        if !ended.stderr.is_empty() {
            tracing::info!(
                plugin = %plugin.name,
                command = env.command,
                container_id = %env.container_id,
                ifname = %env.ifname,
                stderr = %String::from_utf8_lossy(&ended.stderr).trim_end(),
                "plugin wrote to stderr"
            );
        }
        ended.judge(plugin, env.command, timeout)
    }

    /// The plugin's process: a clean environment holding the CNI variables
    /// and `PATH`, `/` as its directory, three pipes, and a process group
    /// of its own.
    fn command(&self, plugin: &Plugin, env: &CallEnv) -> std::process::Command {
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
        cmd
    }

    /// Where a run with `env` is noted, and under which container: nowhere
    /// without a container id, as VERSION, STATUS and GC leave nothing
    /// behind worth a journal entry.
    fn journal_for(&self, env: &CallEnv) -> Option<(Arc<dyn Journal>, String)> {
        match &self.journal {
            Some(j) if !env.container_id.is_empty() => Some((j.clone(), env.container_id.clone())),
            _ => None,
        }
    }
}

/// An [`ExecError::Io`] of `plugin` while doing `what`.
fn io_error(plugin: &Plugin, what: &'static str) -> impl FnOnce(io::Error) -> ExecError {
    let (plugin, path) = (plugin.name.clone(), plugin.path.clone());
    move |source| ExecError::Io {
        plugin,
        path,
        what,
        source,
    }
}

/// A spawned plugin and its pipes. Dropped at any point, its [`Reaper`]
/// kills and reaps it.
struct Process {
    child: Child,
    reaper: Reaper,
    stdin: pipe::Sender,
    output: Output,
}

impl Process {
    /// Spawns `cmd` (see [`spawn`], which also does `work`) and takes its
    /// pipes; with the outcome of `work`, when there was one.
    async fn start(
        cmd: std::process::Command,
        plugin: &Plugin,
        journal: Option<(Arc<dyn Journal>, String)>,
        work: Option<Gate>,
    ) -> Result<(Self, Option<Result<(), String>>), ExecError> {
        let ((mut child, reaper), worked) = spawn(cmd, plugin, journal, work).await?;
        let stdin = take_pipe(
            child.stdin.take().map(OwnedFd::from),
            pipe::Sender::from_owned_fd,
        )
        .map_err(io_error(plugin, "stdin"))?;
        let stdout = take_pipe(
            child.stdout.take().map(OwnedFd::from),
            pipe::Receiver::from_owned_fd,
        )
        .map_err(io_error(plugin, "stdout"))?;
        let stderr = take_pipe(
            child.stderr.take().map(OwnedFd::from),
            pipe::Receiver::from_owned_fd,
        )
        .map_err(io_error(plugin, "stderr"))?;
        let process = Self {
            child,
            reaper,
            stdin,
            output: Output::new(stdout, stderr),
        };
        Ok((process, worked))
    }

    /// Kills the plugin's group before it was given any input, and reaps
    /// it.
    async fn stop(self) {
        let Process {
            mut child,
            mut reaper,
            stdin,
            output,
        } = self;
        drop(stdin);
        let pid = child.id();
        kill_group(pid);
        wait_exit(pid).await;
        let _ = reaper.reap(&mut child);
        drop(output.close());
        reaper.finish();
    }

    /// Gives the plugin `input` and reads its output until it exits, or
    /// until `timeout`, when its group is killed. Then kills whatever it
    /// left running in its group, reaps it, and reads what is left in the
    /// pipes (for at most [`PIPE_GRACE`]).
    ///
    /// The pipes are driven right here, not in tasks of their own: when
    /// this returns (or is dropped) nothing of the call is left running.
    async fn run(self, input: Vec<u8>, timeout: Duration) -> Ended {
        let Process {
            mut child,
            mut reaper,
            stdin,
            mut output,
        } = self;
        let pid = child.id();
        let timed_out = until_exit(pid, Feed::new(stdin, input), &mut output, timeout).await;
        // The plugin is a zombie now, holding its group id: kill whatever
        // it left running in the group, then reap it.
        kill_group(pid);
        let status = reaper.reap(&mut child);
        // What the plugin printed is in the pipes: read it. Only a process
        // that left the group can keep them open past the grace; it is
        // neither waited for nor killed.
        let drained = output.drain().await;
        let (stdout, stderr) = output.close();
        reaper.finish();
        Ended {
            timed_out,
            status,
            stdout: stdout.into_parts(),
            stderr: stderr.into_parts().map(|(b, _)| b).unwrap_or_default(),
            drained,
        }
    }
}

/// Feeds the plugin's stdin and reads its output until it exits; when
/// `timeout` passes first, kills its group and waits for the exit. Whether
/// it timed out.
async fn until_exit(pid: u32, mut feed: Feed, output: &mut Output, timeout: Duration) -> bool {
    let exited = wait_exit(pid);
    tokio::pin!(exited);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let timed_out = loop {
        tokio::select! {
            () = &mut exited => break false,
            () = &mut deadline => break true,
            () = feed.run(), if feed.is_open() => {}
            () = output.read(), if !output.is_done() => {}
        }
    };
    // A child that inherited stdin could hold this write forever.
    drop(feed);
    if timed_out {
        kill_group(pid);
        exited.await;
    }
    timed_out
}

/// A plugin's stdout and stderr, each read into a bounded [`Capture`].
struct Output {
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    out: Capture,
    err: Capture,
}

impl Output {
    fn new(stdout: pipe::Receiver, stderr: pipe::Receiver) -> Self {
        Self {
            stdout,
            stderr,
            out: Capture::new(STDOUT_CAP),
            err: Capture::new(STDERR_CAP),
        }
    }

    fn is_done(&self) -> bool {
        self.out.is_done() && self.err.is_done()
    }

    /// Reads both until EOF or an error. Can be abandoned at any point and
    /// resumed: what was read stays.
    async fn read(&mut self) {
        tokio::join!(
            self.out.fill(&mut self.stdout),
            self.err.fill(&mut self.stderr)
        );
    }

    /// [`Output::read`] for at most [`PIPE_GRACE`]; false when something
    /// still held the pipes open then.
    async fn drain(&mut self) -> bool {
        tokio::time::timeout(PIPE_GRACE, self.read()).await.is_ok()
    }

    /// Closes the pipes; what was read from each.
    fn close(self) -> (Capture, Capture) {
        (self.out, self.err)
    }
}

/// How a plugin run ended, before it is judged.
struct Ended {
    timed_out: bool,
    /// `None` when the plugin could not be reaped here.
    status: Option<std::process::ExitStatus>,
    /// What it printed and whether some was dropped, or the read error.
    stdout: io::Result<(Vec<u8>, bool)>,
    stderr: Vec<u8>,
    /// Whether the pipes were closed within [`PIPE_GRACE`] of the exit.
    drained: bool,
}

impl Ended {
    /// The plugin's answer to `command`: its stdout when it exited 0, else
    /// why not: a timeout, unreadable or oversized output, its CNI error,
    /// or its exit status.
    fn judge(
        self,
        plugin: &Plugin,
        command: &'static str,
        timeout: Duration,
    ) -> Result<Vec<u8>, ExecError> {
        if self.timed_out {
            return Err(ExecError::TimedOut {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                command,
                after: timeout,
            });
        }
        let (stdout, stdout_cut) = self.stdout.map_err(io_error(plugin, "reading stdout"))?;
        if stdout_cut {
            return Err(ExecError::TooMuchOutput {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                cap: STDOUT_CAP,
            });
        }
        let Some(status) = self.status else {
            return Err(io_error(plugin, "waiting for the plugin")(
                io::Error::other("exit status unavailable"),
            ));
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
                stderr: snippet(&self.stderr),
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

/// Why [`spawn`]'s blocking part failed.
enum SpawnFailure {
    Exec(io::Error),
    Journal(io::Error),
}

/// Spawns on the blocking pool (fork+exec waits for the exec), retrying
/// "text file busy" like libcni. With a journal, the plugin's group is
/// noted there before this returns, that is before its stdin is written.
/// The reaper is made on the blocking pool too: if this future is dropped
/// while the spawn runs, dropping its output there kills and reaps the
/// plugin.
///
/// `work` is done in the first trip, right after the spawn and the note
/// (whether they worked or not); its outcome comes back with the child.
async fn spawn(
    mut cmd: std::process::Command,
    plugin: &Plugin,
    journal: Option<(Arc<dyn Journal>, String)>,
    mut work: Option<Gate>,
) -> Result<((Child, Reaper), Option<Result<(), String>>), ExecError> {
    let mut tries = 0;
    let mut worked = None;
    loop {
        let journal = journal.clone();
        let work = work.take();
        let (back, res, done) = tokio::task::spawn_blocking(move || {
            let r = match cmd.spawn() {
                Ok(child) => start(child, journal),
                Err(e) => Err(SpawnFailure::Exec(e)),
            };
            let done = work.map(|w| w());
            (cmd, r, done)
        })
        .await
        .map_err(|e| ExecError::Spawn {
            plugin: plugin.name.clone(),
            path: plugin.path.clone(),
            source: io::Error::other(e.to_string()),
        })?;
        cmd = back;
        if done.is_some() {
            worked = done;
        }
        match res {
            Ok(started) => return Ok((started, worked)),
            Err(SpawnFailure::Exec(e))
                if e.raw_os_error() == Some(libc::ETXTBSY) && tries < TXTBSY_RETRIES =>
            {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(SpawnFailure::Exec(source)) => {
                return Err(ExecError::Spawn {
                    plugin: plugin.name.clone(),
                    path: plugin.path.clone(),
                    source,
                })
            }
            Err(SpawnFailure::Journal(source)) => {
                return Err(ExecError::Io {
                    plugin: plugin.name.clone(),
                    path: plugin.path.clone(),
                    what: "noting the plugin's process group before giving it its config",
                    source,
                })
            }
        }
    }
}

/// Blocking: notes a just spawned plugin in the journal. When that fails,
/// the plugin is killed and reaped before it has read anything (its stdin
/// was not written).
fn start(
    mut child: Child,
    journal: Option<(Arc<dyn Journal>, String)>,
) -> Result<(Child, Reaper), SpawnFailure> {
    let pid = child.id();
    let Some((journal, container_id)) = journal else {
        return Ok((child, Reaper::new(pid, None)));
    };
    let noted = i32::try_from(pid)
        .ok()
        .and_then(|pgid| {
            // The unreaped child is still in /proc, even if it exited.
            start_time(pgid).map(|start_time| Group { pgid, start_time })
        })
        .ok_or_else(|| {
            io::Error::other(format!(
                "cannot read the start time of pid {pid} in /proc/{pid}/stat"
            ))
        })
        .and_then(|group| {
            journal.started(&container_id, group)?;
            Ok(group)
        });
    match noted {
        Ok(group) => {
            let note = Note {
                journal,
                container_id,
                group,
            };
            Ok((child, Reaper::new(pid, Some(note))))
        }
        Err(e) => {
            kill_group(pid);
            // We are on the blocking pool; the plugin is dead or dying.
            let _ = child.wait();
            Err(SpawnFailure::Journal(e))
        }
    }
}

fn take_pipe<T>(fd: Option<OwnedFd>, wrap: impl FnOnce(OwnedFd) -> io::Result<T>) -> io::Result<T> {
    wrap(fd.ok_or_else(|| io::Error::other("pipe missing"))?)
}

/// A plugin's stdin being written. Every step can be abandoned (the select
/// loop drops it) without losing track of what was sent.
struct Feed {
    pipe: Option<pipe::Sender>,
    data: Vec<u8>,
    sent: usize,
}

impl Feed {
    fn new(pipe: pipe::Sender, data: Vec<u8>) -> Self {
        let mut feed = Self {
            pipe: Some(pipe),
            data,
            sent: 0,
        };
        if feed.data.is_empty() {
            feed.close();
        }
        feed
    }

    fn is_open(&self) -> bool {
        self.pipe.is_some()
    }

    /// Writes the rest, then closes the pipe so the plugin sees EOF.
    async fn run(&mut self) {
        while let Some(tx) = &mut self.pipe {
            match tx.write(&self.data[self.sent..]).await {
                Ok(n) if n > 0 => {
                    self.sent += n;
                    if self.sent >= self.data.len() {
                        self.close();
                    }
                }
                // A plugin may exit without reading stdin: EPIPE is fine.
                _ => self.close(),
            }
        }
    }

    fn close(&mut self) {
        self.pipe = None;
        self.data = Vec::new();
    }
}

/// Output of a plugin being read, keeping at most `cap` bytes (and draining
/// the rest so the writer never blocks). Reading can be abandoned at any
/// point and resumed: what was read stays here.
struct Capture {
    buf: Vec<u8>,
    cap: usize,
    cut: bool,
    eof: bool,
    error: Option<io::Error>,
    chunk: Vec<u8>,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
            cut: false,
            eof: false,
            error: None,
            chunk: Vec::new(),
        }
    }

    fn is_done(&self) -> bool {
        self.eof || self.error.is_some()
    }

    /// Reads until EOF or an error.
    async fn fill(&mut self, r: &mut pipe::Receiver) {
        if self.chunk.is_empty() {
            self.chunk = vec![0u8; 16 << 10];
        }
        while !self.is_done() {
            match r.read(&mut self.chunk).await {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.buf.len());
                    if n > room {
                        self.cut = true;
                    }
                    self.buf.extend_from_slice(&self.chunk[..n.min(room)]);
                }
                Err(e) => self.error = Some(e),
            }
        }
    }

    /// What was read and whether some was dropped; the read error if any.
    fn into_parts(self) -> io::Result<(Vec<u8>, bool)> {
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.buf, self.cut)),
        }
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

/// A pidfd of `pid` (readable once it exits); `None` where the kernel
/// has none (before 5.3).
pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
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

/// SIGKILLs the process group our unreaped child `pid` leads.
pub(crate) fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals the process group our
        // (still unreaped) child leads; no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// A plugin run noted in a journal, to be closed once the plugin is reaped.
struct Note {
    journal: Arc<dyn Journal>,
    container_id: String,
    group: Group,
}

impl Note {
    /// Does not block (see [`Journal::finished`]).
    fn finished(self) {
        self.journal.finished(&self.container_id, self.group);
    }
}

/// Makes sure a plugin is killed and reaped, and its journal entry closed,
/// even when the call is dropped half-way (its future cancelled).
struct Reaper {
    pid: Option<u32>,
    note: Option<Note>,
}

impl Reaper {
    fn new(pid: u32, note: Option<Note>) -> Self {
        Self {
            pid: Some(pid),
            note,
        }
    }

    /// Reaps the exited child without blocking; `None` if it cannot.
    fn reap(&mut self, child: &mut Child) -> Option<std::process::ExitStatus> {
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

    /// Closes the journal entry of a reaped plugin.
    fn finish(mut self) {
        if self.pid.is_none() {
            if let Some(note) = self.note.take() {
                note.finished();
            }
        }
        // Otherwise Drop kills, reaps and closes the entry.
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let pid = self.pid.take();
        let note = self.note.take();
        if pid.is_none() && note.is_none() {
            return;
        }
        if let Some(pid) = pid {
            kill_group(pid);
        }
        let reap = move || {
            if let Some(pid) = pid {
                let mut status = 0;
                // SAFETY: waitpid(2) on our own child, valid pointer.
                unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
            }
            if let Some(note) = note {
                note.finished();
            }
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(tokio::task::spawn_blocking(reap));
        } else {
            reap();
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
    use std::path::Path;

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

    /// A gate's blocking work runs in the trip that spawned the plugin:
    /// the plugin is already running (blocked on its stdin) while the work
    /// runs, reads nothing before it is done, and is stopped and reaped
    /// unread when it fails. The work runs once, even when the spawn fails.
    #[tokio::test]
    async fn a_gates_work_should_run_while_the_plugin_starts_and_hold_its_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let started = dir.path().join("started");
        let got = dir.path().join("got");
        script(
            dir.path(),
            "gated",
            &format!(
                "echo $$ > {s}.tmp; mv {s}.tmp {s}; IN=$(cat); printf %s \"$IN\" > {g}; echo '{{\"cniVersion\":\"1.0.0\"}}'",
                s = started.display(),
                g = got.display()
            ),
        );
        let r = Runner::new(vec![dir.path().into()], Duration::from_secs(10), None);
        let plugin = r.find("gated").unwrap();
        for open in [true, false] {
            let _ = std::fs::remove_file(&started);
            let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let work: Gate = {
                let (started, got, ran) = (started.clone(), got.clone(), ran.clone());
                Box::new(move || {
                    // The plugin runs already; it has read nothing.
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    while !started.exists() {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "the plugin never started"
                        );
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    assert!(!got.exists(), "the plugin read its stdin before the work");
                    ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if open {
                        Ok(())
                    } else {
                        Err("the disk is full".into())
                    }
                })
            };
            let out = r.run_gated(&plugin, &env(), b"config".to_vec(), work).await;
            assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
            let pid: i32 = std::fs::read_to_string(&started)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            if open {
                assert_eq!(out.unwrap(), b"{\"cniVersion\":\"1.0.0\"}\n");
                assert_eq!(std::fs::read(&got).unwrap(), b"config");
                std::fs::remove_file(&got).unwrap();
            } else {
                let e = out.unwrap_err();
                assert!(matches!(e, ExecError::Held { .. }), "{e}");
                assert!(e.to_string().contains("the disk is full"), "{e}");
                assert!(!got.exists(), "read its stdin");
                assert!(!Path::new(&format!("/proc/{pid}")).exists(), "not reaped");
            }
        }
        // A plugin that cannot be executed: the spawn fails, the work ran.
        let broken = dir.path().join("broken");
        std::fs::write(&broken, "not a program").unwrap();
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let work: Gate = {
            let ran = ran.clone();
            Box::new(move || {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
        };
        let e = r
            .run_gated(
                &Plugin::unlocated("broken", broken),
                &env(),
                b"config".to_vec(),
                work,
            )
            .await
            .unwrap_err();
        assert!(matches!(e, ExecError::Spawn { .. }), "{e}");
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
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

    #[tokio::test]
    async fn failed_version_should_cost_one_bounded_call_for_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let calls = || std::fs::read_to_string(&count).unwrap().lines().count();
        script(
            dir.path(),
            "p",
            &format!("echo x >> {}; exec sleep 1000", count.display()),
        );
        let mut r = Runner::new(vec![dir.path().into()], Duration::from_secs(30), None);
        assert_eq!(r.version_timeout, VERSION_TIMEOUT);
        r.version_timeout = Duration::from_millis(300);
        let p = r.find("p").unwrap();

        // Concurrent callers share the one (bounded) VERSION call.
        let t = std::time::Instant::now();
        let (a, b, c) = tokio::join!(r.versions(&p), r.versions(&p), r.versions(&p));
        assert!(a.is_none() && b.is_none() && c.is_none());
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        assert_eq!(calls(), 1);
        // Remembered: no call, no wait.
        for _ in 0..3 {
            let t = std::time::Instant::now();
            assert!(r.versions(&p).await.is_none());
            assert!(
                t.elapsed() < Duration::from_millis(150),
                "{:?}",
                t.elapsed()
            );
        }
        assert_eq!(calls(), 1);
        // Once the failure is old, the plugin is asked again.
        r.version_retry = Duration::ZERO;
        assert!(r.versions(&p).await.is_none());
        assert_eq!(calls(), 2);
        let short = Runner::new(Vec::new(), Duration::from_secs(1), None);
        assert_eq!(short.version_timeout, Duration::from_secs(1));
    }
}
