//! The [`Runner`]: finds plugin binaries on the search path, asks and
//! caches their VERSION answer per binary, and runs them with the CNI
//! environment and a deadline.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tokio::sync::Mutex as AsyncMutex;

use super::process::{snippet, Process};
use super::{Error, Gate, Journal};
use crate::metrics::{Metrics, PluginLabels};

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

/// The CNI environment of one plugin call.
#[derive(Debug, Clone, Default)]
pub struct CallEnv {
    pub command: &'static str,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
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
    /// a [`crate::cni::backends::PluginRunner`] that runs no binaries (a test's
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
    pub(super) version_timeout: Duration,
    pub(super) version_retry: Duration,
    versions: Mutex<HashMap<PathBuf, (Stamp, VersionCell)>>,
    metrics: Option<Arc<Metrics>>,
    journal: Option<Arc<dyn Journal>>,
    /// The plugin spawner's socket, when plugins are started there.
    spawner: Option<Arc<Path>>,
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
            spawner: None,
        }
    }

    /// Has the plugin spawner listening at `socket` start every plugin
    /// (see [`crate::spawner`]), so that plugins run outside plexusd's
    /// sandbox; `None` starts them here.
    pub fn with_spawner(mut self, socket: Option<PathBuf>) -> Self {
        self.spawner = socket.map(Arc::from);
        self
    }

    /// Notes every plugin run that has a container id in `journal`.
    pub fn with_journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Finds `name` in the search path: the first regular file. Blocking
    /// (stat calls): run it on the blocking pool.
    pub fn find(&self, name: &str) -> Result<Plugin, Error> {
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
        Err(Error::NotFound {
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

    async fn ask_version(&self, plugin: &Plugin) -> Result<Vec<String>, Error> {
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
            Err(Error::Failed { error, .. })
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
        let bad = |reason: String| Error::InvalidResult {
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
    ) -> Result<Vec<u8>, Error> {
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
    ) -> Result<Vec<u8>, Error> {
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
    ) -> Result<Vec<u8>, Error> {
        let started = std::time::Instant::now();
        let out = self.run_once(plugin, env, stdin, gate, timeout).await;
        if let Some(m) = &self.metrics {
            let outcome = match &out {
                Ok(_) => "success",
                Err(Error::TimedOut { .. }) => "timeout",
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
    ) -> Result<Vec<u8>, Error> {
        let cmd = self.command(plugin, env);
        // Named in the log lines of the plugin's stderr.
        let network = network_name(&stdin);
        let (process, worked) = Process::start(
            cmd,
            plugin,
            self.journal_for(env),
            gate,
            self.spawner.clone(),
        )
        .await?;
        let why = worked.and_then(Result::err);
        if let Some(why) = why {
            process.stop().await;
            return Err(Error::Held {
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
            log_stderr(plugin, env, &network, &ended.stderr);
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

/// Most lines of one plugin run's stderr that are logged, and most bytes
/// of one line; the rest is counted in one last line.
pub const STDERR_LINES: usize = 64;
pub const STDERR_LINE_BYTES: usize = 2048;

/// The network a plugin's configuration names (its `name`), for the log.
fn network_name(stdin: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Named {
        #[serde(default)]
        name: String,
    }
    serde_json::from_slice::<Named>(stdin)
        .map(|n| n.name)
        .unwrap_or_default()
}

/// Logs what a plugin wrote to stderr, a log line per line (at most
/// [`STDERR_LINES`], each cut at [`STDERR_LINE_BYTES`]), with the plugin,
/// the network, the container and the command as fields of their own (in
/// the journal: `F_PLUGIN`, `F_NETWORK`, `F_CONTAINER_ID`, ...), as a
/// runtime's journal would have them from its plugins' stderr.
fn log_stderr(plugin: &Plugin, env: &CallEnv, network: &str, stderr: &[u8]) {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    let kept = lines
        .iter()
        .take(STDERR_LINES)
        .map(|line| cut(line, STDERR_LINE_BYTES).to_string());
    let left = lines.get(STDERR_LINES..).unwrap_or_default();
    let rest = (!left.is_empty()).then(|| {
        let bytes: usize = left.iter().map(|l| l.len() + 1).sum();
        format!(
            "{} more lines of stderr ({bytes} bytes) not logged",
            left.len()
        )
    });
    for line in kept.chain(rest) {
        tracing::info!(
            plugin = %plugin.name,
            network,
            command = env.command,
            container_id = %env.container_id,
            ifname = %env.ifname,
            "{}: {line}",
            plugin.name
        );
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
