//! Network configurations on disk: finding a network by name in `confDir`
//! (or by path) and reading its file. Parsing is [`crate::netconf`]'s job.
//! Everything here blocks (directory listings and reads): call it on the
//! blocking pool.
//!
//! [`Cache`] keeps what a load found together with the identity of every
//! directory and file it read (device, inode, type, size, mtime and ctime
//! to the nanosecond), taken before reading them. A later load of the same
//! network re-stats those paths and reads again as soon as one differs, so
//! a file added, removed, renamed over or edited in place is seen by the
//! next call, as if every call read the files.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use crate::netconf::{ConfigError, NetworkList};

/// What a path was when it was looked at: enough to tell that it changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stamp {
    /// Nothing there (or nothing stat(2) could see).
    Missing,
    Present {
        dev: u64,
        ino: u64,
        mode: u32,
        size: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
    },
}

impl Stamp {
    /// stat(2) of `path`, following symbolic links (a link retargeted
    /// changes the identity seen through it).
    fn of(path: &Path) -> Self {
        match std::fs::metadata(path) {
            Ok(m) => Stamp::Present {
                dev: m.dev(),
                ino: m.ino(),
                mode: m.mode(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            },
            Err(_) => Stamp::Missing,
        }
    }

    fn is_dir(self) -> bool {
        matches!(self, Stamp::Present { mode, .. } if mode & libc::S_IFMT == libc::S_IFDIR)
    }

    /// The change time, as nanoseconds since the epoch.
    fn ctime_ns(self) -> Option<i128> {
        match self {
            Stamp::Missing => None,
            Stamp::Present { ctime: (s, ns), .. } => {
                Some(i128::from(s) * 1_000_000_000 + i128::from(ns))
            }
        }
    }
}

/// The paths one load looked at, each stamped before it was read.
#[derive(Debug, Default)]
struct Seen(Vec<(PathBuf, Stamp)>);

impl Seen {
    fn note(&mut self, path: &Path) -> Stamp {
        let stamp = Stamp::of(path);
        self.0.push((path.to_path_buf(), stamp));
        stamp
    }

    /// Whether every path still looks as it did.
    fn unchanged(&self) -> bool {
        self.0.iter().all(|(p, s)| Stamp::of(p) == *s)
    }

    /// Whether a path changed so recently, relative to `now`, that another
    /// change within the file system's timestamp granularity could leave
    /// its stamp as it is (git's "racily clean" entries).
    fn racy(&self, now: SystemTime, settle: Duration) -> bool {
        let now = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let limit = now - settle.as_nanos() as i128;
        self.0
            .iter()
            .filter_map(|(_, s)| s.ctime_ns())
            .any(|c| c >= limit)
    }
}

/// Networks loaded earlier, per `(confDir, network)`, with the paths their
/// load read; see the module notes. Blocking, like the rest of the module.
#[derive(Debug)]
pub struct Cache {
    entries: Mutex<HashMap<(PathBuf, String), Arc<Entry>>>,
    /// A load whose files changed less than this long ago is not kept.
    settle: Duration,
    /// How many loads read the files (rather than reusing an entry).
    reads: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    seen: Seen,
    list: NetworkList,
}

/// More entries than this (networks from many call-given confDirs) and
/// the cache starts over.
const MAX_ENTRIES: usize = 256;

/// Timestamps of most file systems are taken from a clock that ticks
/// every few milliseconds; a second covers every one of them.
const SETTLE: Duration = Duration::from_secs(1);

impl Default for Cache {
    fn default() -> Self {
        Self::with_settle(SETTLE)
    }
}

impl Cache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache that keeps loads whose files changed at least `settle`
    /// before they were read.
    pub fn with_settle(settle: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            settle,
            reads: AtomicU64::new(0),
        }
    }

    /// How many loads have read the files so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// [`load_network`], reading the files again only when one that the
    /// last load of the same network read has changed (or was added or
    /// removed). Failed loads are not kept.
    pub fn load(&self, conf_dir: &Path, network: &str) -> Result<NetworkList, ConfigError> {
        let key = (conf_dir.to_path_buf(), network.to_string());
        let cached = self
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(entry) = cached {
            if entry.seen.unchanged() {
                return Ok(entry.list.clone());
            }
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let started = SystemTime::now();
        let mut seen = Seen::default();
        let loaded = load_seen(conf_dir, network, &mut seen);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match &loaded {
            Ok(list) if !seen.racy(started, self.settle) => {
                if entries.len() >= MAX_ENTRIES && !entries.contains_key(&key) {
                    entries.clear();
                }
                let list = list.clone();
                entries.insert(key, Arc::new(Entry { seen, list }));
            }
            _ => {
                entries.remove(&key);
            }
        }
        loaded
    }
}

/// File name extensions of network configuration files.
const EXTENSIONS: &[&str] = &["conf", "conflist", "json"];

fn is_single(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()) != Some("conflist")
}

/// The files in `dir` whose name ends in one of `extensions`, in name
/// order (directory entries that are, or link to, regular files). The
/// caller notes `dir` in its [`Seen`] first.
fn files_in(dir: &Path, extensions: &[&str]) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ConfigError::File {
        file: dir.to_path_buf(),
        why: format!("cannot read the directory: {e}"),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let p = Path::new(e.file_name().as_os_str()).to_path_buf();
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| extensions.contains(&x))
                && match e.file_type() {
                    Ok(t) if t.is_symlink() => e.path().is_file(),
                    Ok(t) => t.is_file(),
                    Err(_) => false,
                }
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

fn load_file(path: &Path, seen: &mut Seen) -> Result<NetworkList, ConfigError> {
    seen.note(path);
    let text = std::fs::read(path).map_err(|e| ConfigError::File {
        file: path.to_path_buf(),
        why: format!("cannot read the file: {e}"),
    })?;
    if is_single(path) {
        return NetworkList::parse(path, &text, true);
    }
    let mut value: Value = serde_json::from_slice(&text).map_err(|e| ConfigError::File {
        file: path.to_path_buf(),
        why: format!("not valid JSON: {e}"),
    })?;
    if let Some(obj) = value.as_object_mut() {
        let inlined_only = matches!(obj.get("loadOnlyInlinedPlugins"), Some(Value::Bool(true)));
        if !inlined_only {
            if let (Some(Value::String(name)), Some(dir)) = (obj.get("name"), path.parent()) {
                let more = plugins_in_subdirectory(path, dir, name, seen)?;
                if !more.is_empty() {
                    let plugins = obj
                        .entry("plugins")
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(list) = plugins {
                        list.extend(more.into_iter().map(Value::Object));
                    }
                }
            }
        }
    }
    NetworkList::from_value(path, value, false)
}

/// A name libcni accepts as a plugin directory: an alphanumeric, then
/// alphanumerics, `_`, `.` and `-`.
pub fn is_plugin_dir_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// libcni's subdirectory plugin loading: the plugin configs in
/// `<dir>/<name>/*.conf`, in name order, appended to list `name` (read
/// from `file`). No such directory: none. The name must then be one that
/// can name a directory.
pub fn subdirectory_plugins(
    file: &Path,
    dir: &Path,
    name: &str,
) -> Result<Vec<Map<String, Value>>, ConfigError> {
    plugins_in_subdirectory(file, dir, name, &mut Seen::default())
}

fn plugins_in_subdirectory(
    file: &Path,
    dir: &Path,
    name: &str,
    seen: &mut Seen,
) -> Result<Vec<Map<String, Value>>, ConfigError> {
    let sub = dir.join(name);
    // Noted also when missing: a directory made later must be seen.
    if !seen.note(&sub).is_dir() {
        return Ok(Vec::new());
    }
    if !is_plugin_dir_name(name) {
        return Err(ConfigError::Field {
            file: file.to_path_buf(),
            key: "name".into(),
            why: format!("{name:?} cannot name a plugin directory"),
        });
    }
    let files = files_in(&sub, &["conf"])?;
    let mut plugins = Vec::with_capacity(files.len());
    for f in files {
        seen.note(&f);
        let text = std::fs::read(&f).map_err(|e| ConfigError::File {
            file: f.clone(),
            why: format!("cannot read the file: {e}"),
        })?;
        match serde_json::from_slice::<Value>(&text) {
            Ok(Value::Object(m))
                if m.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.is_empty()) =>
            {
                plugins.push(m)
            }
            Ok(_) => {
                return Err(ConfigError::File {
                    file: f,
                    why: "a plugin config must be a JSON object with a type".into(),
                })
            }
            Err(e) => {
                return Err(ConfigError::File {
                    file: f,
                    why: format!("not valid JSON: {e}"),
                })
            }
        }
    }
    Ok(plugins)
}

/// multus's auxiliary CNI chain: a list `name` of `cniVersion` made of
/// `passthru` followed by the plugins in `<directory of
/// cluster_network>/<name>/*.conf`; `None` when that adds no plugin (the
/// chain is then not run). `cluster_network` must be a path.
pub fn aux_chain(
    cluster_network: &str,
    name: &str,
    cni_version: &str,
) -> Result<Option<NetworkList>, ConfigError> {
    let file = Path::new(cluster_network);
    let dir = file.parent().unwrap_or(Path::new("/"));
    let plugins = subdirectory_plugins(file, dir, name)?;
    if plugins.is_empty() {
        return Ok(None);
    }
    let mut all = vec![serde_json::json!({"type": "passthru", "name": "passthru-cni"})];
    all.extend(plugins.into_iter().map(Value::Object));
    let value = serde_json::json!({"cniVersion": cni_version, "name": name, "plugins": all});
    NetworkList::from_value(&dir.join(name), value, false).map(Some)
}

/// Loads a network by name from `conf_dir` (the first file, in name order,
/// whose `name` matches), or from a path when `network` contains a `/`
/// (a file, or a directory whose first config file is used). Blocking.
pub fn load_network(conf_dir: &Path, network: &str) -> Result<NetworkList, ConfigError> {
    load_seen(conf_dir, network, &mut Seen::default())
}

/// [`load_network`], noting in `seen` every path it reads.
fn load_seen(conf_dir: &Path, network: &str, seen: &mut Seen) -> Result<NetworkList, ConfigError> {
    if network.contains('/') {
        let path = Path::new(network);
        if Stamp::of(path).is_dir() {
            seen.note(path);
            let first = files_in(path, EXTENSIONS)?
                .into_iter()
                .next()
                .ok_or_else(|| ConfigError::File {
                    file: path.to_path_buf(),
                    why: "the directory holds no .conf, .conflist or .json file".into(),
                })?;
            return load_file(&first, seen);
        }
        return load_file(path, seen);
    }
    let mut skipped = Vec::new();
    seen.note(conf_dir);
    for file in files_in(conf_dir, EXTENSIONS)? {
        match load_file(&file, seen) {
            Ok(list) if list.name == network => return Ok(list),
            Ok(_) => {}
            Err(e) => skipped.push(e.to_string()),
        }
    }
    Err(ConfigError::NotFound {
        name: network.to_string(),
        dir: conf_dir.to_path_buf(),
        skipped,
    })
}

#[cfg(test)]
#[path = "confdir_tests.rs"]
mod tests;
