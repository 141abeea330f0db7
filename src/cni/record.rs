//! What the engine keeps in `<stateDir>`, one file per thing:
//!
//! - `attachments/<id>.json`: a container's record, holding everything DEL
//!   needs (each network's config as used at ADD, interface names, results,
//!   CNI_ARGS, capability arguments), so DEL works after a restart, a
//!   crash, or the removal of the network's config file.
//! - `attachments/damaged/<id>/<unix time>.json`: a record that could not
//!   be read, moved aside as it was (bytes, symbolic link or directory). The
//!   directory also tells DEL that the container's record was lost, so DEL
//!   falls back to the configured networks for it.
//! - `locks/<id>.lock`: flock'ed by every plexusd on this stateDir across
//!   each read-modify-write of the container's record and the plugin runs
//!   of that operation; unlinked (while held) once the record is gone.
//!   `locks/.gc.lock` is held shared by every operation and exclusively by
//!   the plugins' GC. While a plugin of the container runs, the lock file
//!   holds its process group ([`Markers`]), so that a daemon started after
//!   a crash can kill what the crashed one left.
//!
//! Writes are atomic: a temporary file in the same directory, renamed over
//! the target. A [`Durability::Synced`] write also fsyncs the file before the
//! rename and the directory after it; docs/records.md says which writes need
//! that and why the others are safe without it. Readers ([`Store::at`],
//! [`Store::load`], [`Store::list`]) never write anything. All functions
//! block: call them on the blocking pool.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::exec::{Group, Journal};
use crate::names::is_valid_name;

/// The `kind` of a record file; readers refuse other kinds.
pub const KIND: &str = "plexusAttachmentsV1";

/// Progress of one network of an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum State {
    /// Not started: no plugin of this network has run.
    Pending,
    /// Started and not finished: some plugins may have run (DEL needed).
    Adding,
    /// Every plugin's ADD succeeded.
    Added,
}

/// One network attached to a container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Delegate {
    /// The network's name.
    pub name: String,
    /// The interface name this network gets in the container.
    pub ifname: String,
    /// Whether this is the network whose result the runtime receives.
    #[serde(default)]
    pub primary: bool,
    pub state: State,
    /// The network configuration list exactly as used at ADD.
    pub config: Value,
    /// This network's own capability arguments, where they differ from
    /// the attachment's (a selection element's ips, mac...); only keys
    /// its plugins declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_args: Option<Map<String, Value>>,
    /// This network's own `CNI_ARGS`, where they differ from the call's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_args: Option<String>,
    /// The final ADD result (recorded once the chain succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

impl Delegate {
    /// The capability arguments this network runs with: its own, else
    /// those of the attachment `att` it belongs to.
    pub fn capability_args_in<'a>(&'a self, att: &'a Attachment) -> &'a Map<String, Value> {
        self.capability_args
            .as_ref()
            .unwrap_or(&att.capability_args)
    }
}

/// One ADD call: the runtime's interface name and the networks it brought.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// `CNI_IFNAME` of the runtime's call.
    pub ifname: String,
    pub netns: String,
    /// `CNI_ARGS` as passed to the plugins.
    #[serde(default)]
    pub cni_args: String,
    /// Capability arguments the runtime supplied (`runtimeConfig`).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub capability_args: Map<String, Value>,
    pub delegates: Vec<Delegate>,
    /// For a network hot-plugged through `/delegate`: the `ifname` of the
    /// runtime's attachment it was added to. The runtime's DEL of that
    /// attachment removes it first. Absent in records of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_plugged_into: Option<String>,
}

/// Everything recorded for one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub kind: String,
    pub container_id: String,
    pub attachments: Vec<Attachment>,
}

impl Record {
    pub fn new(container_id: &str) -> Self {
        Self {
            kind: KIND.to_string(),
            container_id: container_id.to_string(),
            attachments: Vec::new(),
        }
    }

    pub fn attachment(&self, ifname: &str) -> Option<&Attachment> {
        self.attachments.iter().find(|a| a.ifname == ifname)
    }

    pub fn attachment_mut(&mut self, ifname: &str) -> Option<&mut Attachment> {
        self.attachments.iter_mut().find(|a| a.ifname == ifname)
    }

    /// The runtime's own attachment, which hot-plugged networks join: the
    /// one with a primary network, else the first that was not hot-plugged.
    pub fn runtime_attachment(&self) -> Option<&Attachment> {
        let own = || {
            self.attachments
                .iter()
                .filter(|a| a.hot_plugged_into.is_none())
        };
        own()
            .find(|a| a.delegates.iter().any(|d| d.primary))
            .or_else(|| own().next())
    }

    /// The interface names of networks hot-plugged into attachment
    /// `ifname`, in the order they were added.
    pub fn hot_plugged(&self, ifname: &str) -> Vec<String> {
        self.attachments
            .iter()
            .filter(|a| a.hot_plugged_into.as_deref() == Some(ifname))
            .map(|a| a.ifname.clone())
            .collect()
    }

    /// What holds interface `ifname` in the container, if anything: the
    /// attachment and the network of that name.
    pub fn holder_of(&self, ifname: &str) -> Option<(&Attachment, Option<&Delegate>)> {
        self.attachments.iter().find_map(|a| {
            let d = a.delegates.iter().find(|d| d.ifname == ifname);
            (a.ifname == ifname || d.is_some()).then_some((a, d))
        })
    }
}

/// The size of `record` as [`Store::save`] writes it.
pub fn encoded_len(record: &Record) -> usize {
    // A Record is strings, maps and JSON values: it always serialises.
    serde_json::to_vec(record).map(|b| b.len()).unwrap_or(0)
}

/// Whether a write must survive a power loss (see docs/records.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync of the file and the directory.
    Synced,
    /// Atomic only: survives a crash of the process, not of the machine.
    Atomic,
}

/// Longest record file read (and written); records are a few KiB.
const MAX_RECORD_BYTES: u64 = 16 << 20;
/// Largest record an ADD may start with, before any plugin ran (network
/// configurations and capability arguments); the results that follow add a
/// few KiB per network, far from the `MAX_RECORD_BYTES` read limit.
pub const MAX_NEW_RECORD_BYTES: usize = 256 << 10;
/// Held shared by every operation, exclusively by the plugins' GC. A
/// container id starts with a letter or digit, so no container's lock file
/// can have this name.
const GC_LOCK: &str = ".gc.lock";

/// Why something in the state directory could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The record's content (or the kind of file) is unusable; its bytes
    /// are intact and can be moved aside with [`Store::set_aside`].
    #[error("attachment record {} is damaged: {why}", path.display())]
    Damaged { path: PathBuf, why: String },
}

impl Error {
    pub fn is_damaged(&self) -> bool {
        matches!(self, Error::Damaged { .. })
    }
}

fn io_error(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { path, what, source }
}

/// Creates `dir` and its parents (mode 0700 for the ones made here).
fn create_private_dir(dir: &Path) -> Result<(), Error> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_error(dir, "cannot create the directory"))
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir, "cannot sync the directory"))
}

/// Writes `body` to `tmp` (replacing a leftover of the same name, never
/// following a symbolic link) and renames it over `path`.
fn write_atomically(tmp: &Path, path: &Path, body: &[u8], sync: bool) -> Result<(), Error> {
    let write = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)?;
        f.write_all(body)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(tmp);
        return Err(io_error(tmp, "cannot write the temporary file")(e));
    }
    if let Err(e) = fs::rename(tmp, path) {
        let _ = fs::remove_file(tmp);
        return Err(io_error(path, "cannot rename into place")(e));
    }
    Ok(())
}

/// Temporary files in `dir` named `.<id>.<n>.<n>.tmp`, as (id, path).
fn temp_files_in(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(inner) = name
            .to_str()
            .and_then(|n| n.strip_prefix('.'))
            .and_then(|n| n.strip_suffix(".tmp"))
        else {
            continue;
        };
        let mut parts = inner.rsplitn(3, '.');
        let (Some(seq), Some(pid), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if numeric(seq) && numeric(pid) && is_valid_name(id) {
            out.push((id.to_string(), e.path()));
        }
    }
    out
}

/// Why [`read_regular`] gave no bytes.
#[derive(Debug)]
pub enum Unreadable {
    /// Not a file to read: a symbolic link (never followed), a directory
    /// or another special file, or larger than allowed. Left as it is.
    Damaged(String),
    /// Reading failed: worth a retry.
    Io(&'static str, io::Error),
}

/// The bytes of regular file `path`, at most `max` of them; `None` when
/// there is no such file. A symbolic link is never followed and a FIFO
/// never waited on. Blocking.
pub fn read_regular(path: &Path, max: u64) -> Result<Option<Vec<u8>>, Unreadable> {
    let damaged = |why: &str| Unreadable::Damaged(why.to_string());
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Unreadable::Io("cannot look it up", e)),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(damaged("it is a symbolic link"));
    }
    if kind.is_dir() {
        return Err(damaged("it is a directory"));
    }
    if !kind.is_file() {
        return Err(damaged("it is not a regular file"));
    }
    // O_NOFOLLOW and O_NONBLOCK: whatever replaced the file since the
    // lstat is neither followed nor waited on (a FIFO).
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(damaged("it is a symbolic link"))
        }
        Err(e) => return Err(Unreadable::Io("cannot open it", e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| Unreadable::Io("cannot stat it", e))?;
    if !meta.is_file() {
        return Err(damaged("it is not a regular file"));
    }
    if meta.len() > max {
        return Err(damaged(&format!("it is larger than {max} bytes")));
    }
    let mut text = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1)
        .read_to_end(&mut text)
        .map_err(|e| Unreadable::Io("cannot read it", e))?;
    if text.len() as u64 > max {
        return Err(damaged(&format!("it is larger than {max} bytes")));
    }
    Ok(Some(text))
}

/// Moves `from` as it is (a symbolic link or a directory is moved itself,
/// never followed) into `dir` (created 0700), named `<unix time><suffix>`
/// (`<unix time>.<n><suffix>` when taken), and returns the new path.
pub fn move_aside(from: &Path, dir: &Path, suffix: &str) -> Result<PathBuf, Error> {
    create_private_dir(dir)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for n in 0..1000 {
        let name = if n == 0 {
            format!("{now}{suffix}")
        } else {
            format!("{now}.{n}{suffix}")
        };
        let to = dir.join(name);
        if fs::symlink_metadata(&to).is_ok() {
            continue;
        }
        fs::rename(from, &to).map_err(io_error(from, "cannot move the damaged file aside"))?;
        return Ok(to);
    }
    Err(io_error(dir, "cannot move the damaged file aside")(
        io::Error::other("too many damaged files this second"),
    ))
}

/// The directory of records.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    seq: AtomicU64,
}

impl Store {
    /// Opens `<state_dir>/attachments` for writing, creating it (0700).
    /// When it is created, the directories holding its name are synced
    /// once, so that a synced record is never lost with its directory.
    pub fn open(state_dir: &Path) -> Result<Self, Error> {
        let state_existed = fs::symlink_metadata(state_dir).is_ok();
        let store = Self::at(state_dir);
        if fs::symlink_metadata(&store.dir).is_err() {
            create_private_dir(&store.dir)?;
            sync_dir(state_dir)?;
            if !state_existed {
                if let Some(parent) = state_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    sync_dir(parent)?;
                }
            }
        }
        Ok(store)
    }

    /// A read-only view of `<state_dir>/attachments`: creates nothing, and
    /// a missing directory simply holds no records.
    pub fn at(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join("attachments"),
            seq: AtomicU64::new(0),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, container_id: &str) -> PathBuf {
        self.dir.join(format!("{container_id}.json"))
    }

    fn damaged_dir(&self, container_id: &str) -> PathBuf {
        self.dir.join("damaged").join(container_id)
    }

    /// Whether `container_id` has a record file, readable or not.
    pub fn exists(&self, container_id: &str) -> bool {
        fs::symlink_metadata(self.path(container_id)).is_ok()
    }

    /// The record of `container_id`, if there is one. A record that is not
    /// a regular file (a symbolic link is never followed), is empty, does
    /// not parse, or names another container is [`Error::Damaged`].
    pub fn load(&self, container_id: &str) -> Result<Option<Record>, Error> {
        let path = self.path(container_id);
        match read_regular(&path, MAX_RECORD_BYTES) {
            Ok(None) => Ok(None),
            Ok(Some(text)) => parse(container_id, &path, &text).map(Some),
            Err(Unreadable::Damaged(why)) => Err(Error::Damaged { path, why }),
            Err(Unreadable::Io(what, e)) => Err(io_error(&path, what)(e)),
        }
    }

    /// Writes `record` atomically; an empty record removes the file.
    pub fn save(&self, record: &Record, durability: Durability) -> Result<(), Error> {
        if record.attachments.is_empty() {
            return self.remove(&record.container_id, durability);
        }
        let synced = durability == Durability::Synced;
        let path = self.path(&record.container_id);
        // The pid and a counter make the name unique among live writers.
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            record.container_id,
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        // A Record is strings, maps and JSON values: it always serialises.
        let body = serde_json::to_vec(record).unwrap_or_default();
        // What could not be read back would count as damaged.
        if body.len() as u64 > MAX_RECORD_BYTES {
            return Err(io_error(&path, "cannot write the attachment record")(
                io::Error::other(format!(
                    "it would be {} bytes, more than the {MAX_RECORD_BYTES} a record may have",
                    body.len()
                )),
            ));
        }
        write_atomically(&tmp, &path, &body, synced)?;
        if synced {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Removes the record of `container_id` (no error when absent).
    pub fn remove(&self, container_id: &str, durability: Durability) -> Result<(), Error> {
        let path = self.path(container_id);
        match fs::remove_file(&path) {
            Ok(()) if durability == Durability::Synced => sync_dir(&self.dir),
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path, "cannot remove the attachment record")(e)),
        }
    }

    /// The ids of every container with a record file (readable or not),
    /// sorted; none when the directory does not exist. Only reads:
    /// temporary files of writes in progress are left alone.
    pub fn list(&self) -> Result<Vec<String>, Error> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(&self.dir, "cannot list the attachment records")(e)),
        };
        let mut ids = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name();
            if let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) {
                if is_valid_name(id) {
                    ids.push(id.to_string());
                }
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Temporary files of record writes, as (container id, path): after a
    /// crash, the ones whose container is not locked are leftovers.
    pub fn temp_files(&self) -> Vec<(String, PathBuf)> {
        temp_files_in(&self.dir)
    }

    /// Moves the record of `container_id` aside as it is (a symbolic link
    /// or a directory is moved itself, never followed) to
    /// `damaged/<id>/<unix time>.json`, and returns that path. Call it
    /// with the container locked.
    pub fn set_aside(&self, container_id: &str) -> Result<PathBuf, Error> {
        move_aside(
            &self.path(container_id),
            &self.damaged_dir(container_id),
            ".json",
        )
    }

    /// Moves `from`, another file about `container_id` found damaged (one
    /// of multus's caches), aside next to its damaged records, as
    /// `damaged/<id>/<unix time><suffix>`; where it went. From then on
    /// [`Store::was_set_aside`] is true for the container. Call it with
    /// the container locked.
    pub fn set_aside_file(
        &self,
        container_id: &str,
        from: &Path,
        suffix: &str,
    ) -> Result<PathBuf, Error> {
        move_aside(from, &self.damaged_dir(container_id), suffix)
    }

    /// Whether a damaged record of `container_id` was ever moved aside.
    pub fn was_set_aside(&self, container_id: &str) -> bool {
        fs::symlink_metadata(self.damaged_dir(container_id)).is_ok_and(|m| m.is_dir())
    }
}

fn parse(container_id: &str, path: &Path, text: &[u8]) -> Result<Record, Error> {
    let damaged = |why: String| Error::Damaged {
        path: path.to_path_buf(),
        why,
    };
    if text.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(damaged("it is empty".into()));
    }
    let record: Record =
        serde_json::from_slice(text).map_err(|e| damaged(format!("it does not parse: {e}")))?;
    if record.kind != KIND {
        return Err(damaged(format!("unknown kind {:?}", record.kind)));
    }
    // A record under another container's name would make its DEL rewrite
    // that container's record.
    if record.container_id != container_id {
        return Err(damaged(format!(
            "it holds the record of container {:?}",
            record.container_id
        )));
    }
    Ok(record)
}

/// The per-container lock files, `<stateDir>/locks/<id>.lock`.
#[derive(Debug)]
pub struct Locks {
    dir: PathBuf,
}

/// A held lock, released when dropped (its descriptor closes).
#[derive(Debug)]
pub struct Held {
    /// Kept open for the lock: closing it releases the lock. Shared with
    /// [`Markers`], which keeps the running plugin's group in it.
    file: Arc<File>,
    path: PathBuf,
}

impl Held {
    /// Removes the lock file while still holding it, then releases it.
    /// Safe because every taker checks, once it holds a lock, that the
    /// path still names the file it locked, and starts over if not.
    pub fn unlink(self) -> Result<(), Error> {
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&self.path, "cannot remove the lock file")(e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Locks {
    /// Opens `<state_dir>/locks`, creating it (0700).
    pub fn open(state_dir: &Path) -> Result<Self, Error> {
        let dir = state_dir.join("locks");
        create_private_dir(&dir)?;
        Ok(Self { dir })
    }

    fn path(&self, container_id: &str) -> PathBuf {
        self.dir.join(format!("{container_id}.lock"))
    }

    /// Locks container `container_id`, waiting as long as it takes.
    pub fn lock(&self, container_id: &str) -> Result<Held, Error> {
        acquire(&self.path(container_id), libc::LOCK_EX, true)
    }

    /// Locks container `container_id` if nobody holds it; `None` if
    /// someone does.
    pub fn try_lock(&self, container_id: &str) -> Result<Option<Held>, Error> {
        let path = self.path(container_id);
        match acquire(&path, libc::LOCK_EX | libc::LOCK_NB, false) {
            Ok(h) => Ok(Some(h)),
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The lock every operation holds shared while it runs.
    pub fn gc_shared(&self) -> Result<Held, Error> {
        acquire(&self.dir.join(GC_LOCK), libc::LOCK_SH, true)
    }

    /// The lock the plugins' GC holds exclusively.
    pub fn gc_exclusive(&self) -> Result<Held, Error> {
        acquire(&self.dir.join(GC_LOCK), libc::LOCK_EX, true)
    }

    /// Container ids that have a lock file.
    pub fn ids(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let id = name.to_str()?.strip_suffix(".lock")?;
                is_valid_name(id).then(|| id.to_string())
            })
            .collect()
    }
}

/// Opens (creating it 0600, never through a symbolic link) and flocks
/// `path`. Without LOCK_NB it tries a non-blocking lock first, then waits.
/// With LOCK_NB, a lock held elsewhere is an `Io` error of kind
/// `WouldBlock`.
fn acquire(path: &Path, op: i32, wait: bool) -> Result<Held, Error> {
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(io_error(path, "cannot open the lock file"))?;
        let taken = flock(&file, op | libc::LOCK_NB).map_err(io_error(path, "cannot lock"))?;
        if !taken {
            if !wait {
                return Err(io_error(path, "locked by another operation")(
                    io::ErrorKind::WouldBlock.into(),
                ));
            }
            flock(&file, op).map_err(io_error(path, "cannot lock"))?;
        }
        // The previous holder may have unlinked the file (the container's
        // record went away), and someone may have made a new one since: a
        // lock on an unlinked file excludes nobody, so start over.
        let mine = file
            .metadata()
            .map_err(io_error(path, "cannot stat the lock file"))?;
        match fs::symlink_metadata(path) {
            Ok(m) if m.dev() == mine.dev() && m.ino() == mine.ino() => {
                return Ok(Held {
                    file: Arc::new(file),
                    path: path.to_path_buf(),
                })
            }
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error(path, "cannot look up the lock file")(e)),
        }
    }
}

/// flock(2), retried on EINTR; Ok(false) when LOCK_NB was asked and the
/// lock is held elsewhere.
fn flock(file: &File, op: i32) -> io::Result<bool> {
    loop {
        // SAFETY: flock(2) on a descriptor `file` owns; no memory involved.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if op & libc::LOCK_NB != 0 => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// The markers of running plugin process groups. A container's marker is
/// the content of its lock file (`locks/<id>.lock`): the runner writes
/// `<pgid> <start time> <boot id>` there before a plugin reads its stdin,
/// and empties it once the plugin is reaped. Only the holder of the lock
/// runs that container's plugins, one at a time, so one marker per
/// container is enough, and it costs no file of its own (no directory
/// entry to create and remove per plugin run). A marker found by the next
/// holder names plugins nobody waits for: their daemon died.
#[derive(Debug)]
pub struct Markers {
    /// This boot's id: a marker from an earlier boot names nothing alive.
    boot_id: String,
    /// The lock files of the containers this daemon holds, each with
    /// whether it still names a plugin that has been reaped since.
    held: Mutex<HashMap<String, HeldMarker>>,
}

/// A held lock file and the state of the marker in it.
#[derive(Debug)]
struct HeldMarker {
    file: Arc<File>,
    /// The marker names a plugin that was reaped: it is emptied when the
    /// next plugin is noted or the lock is released, whichever is first,
    /// in a trip to the blocking pool that is made anyway.
    stale: bool,
}

/// One marker found in a lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub container_id: String,
    pub path: PathBuf,
    pub state: MarkerState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerState {
    /// A group of this boot that may still run.
    Running(Group),
    /// Written before the last reboot: nothing of it can be alive.
    EarlierBoot,
    /// Unreadable: the group cannot be identified safely (killing by pgid
    /// alone could hit a stranger), so the marker is only removed. A torn
    /// write is one of these, and harmless: it was cut before the plugin
    /// was given its stdin.
    Unreadable,
}

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// Longest marker read back; a real one is under 64 bytes.
const MARKER_MAX: usize = 256;

impl Markers {
    pub fn new() -> Self {
        let boot_id = fs::read_to_string(BOOT_ID)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Self {
            boot_id,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// The marker left in `held`, the lock of `container_id`, if any.
    /// Blocking.
    pub fn of(&self, container_id: &str, held: &Held) -> Result<Option<Marker>, Error> {
        let mut buf = [0u8; MARKER_MAX];
        let n = read_at_start(&held.file, &mut buf)
            .map_err(io_error(&held.path, "cannot read the lock file"))?;
        if n == 0 {
            return Ok(None);
        }
        Ok(Some(Marker {
            container_id: container_id.to_string(),
            path: held.path.clone(),
            state: self.parse(&buf[..n]),
        }))
    }

    fn parse(&self, bytes: &[u8]) -> MarkerState {
        let text = String::from_utf8_lossy(bytes);
        let mut words = text.split_whitespace();
        let pgid = words.next().and_then(|w| w.parse::<i32>().ok());
        let start_time = words.next().and_then(|w| w.parse::<u64>().ok());
        let (Some(pgid), Some(start_time)) = (pgid, start_time) else {
            return MarkerState::Unreadable;
        };
        if pgid <= 1 {
            return MarkerState::Unreadable;
        }
        match words.next() {
            Some(boot) if !self.boot_id.is_empty() && boot != self.boot_id => {
                MarkerState::EarlierBoot
            }
            _ => MarkerState::Running(Group { pgid, start_time }),
        }
    }

    /// Empties the marker in `held`. Blocking.
    pub fn clear(&self, held: &Held) -> Result<(), Error> {
        held.file
            .set_len(0)
            .map_err(io_error(&held.path, "cannot empty the lock file"))
    }

    /// From now until [`Markers::release`], plugins run for
    /// `container_id` are noted in `held`.
    pub fn hold(&self, container_id: &str, held: &Held) {
        self.hold_marked(container_id, held, Released::Clean);
    }

    /// [`Markers::hold`] again after a [`Markers::release`] whose lock was
    /// kept after all; `released` is what that release answered.
    pub fn hold_marked(&self, container_id: &str, held: &Held, released: Released) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                container_id.to_string(),
                HeldMarker {
                    file: held.file.clone(),
                    stale: released == Released::Stale,
                },
            );
    }

    /// Ends [`Markers::hold`]; whether the lock file still holds the
    /// marker of a reaped plugin, which [`Released::settle`] empties before
    /// the lock is given up.
    pub fn release(&self, container_id: &str) -> Released {
        match self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(container_id)
        {
            Some(HeldMarker { stale: true, .. }) => Released::Stale,
            _ => Released::Clean,
        }
    }

    /// The held lock file of `container_id`; with `fresh`, also clears the
    /// stale mark, telling whether it was set.
    fn file(&self, container_id: &str, fresh: bool) -> Option<(Arc<File>, bool)> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let m = held.get_mut(container_id)?;
        let stale = m.stale;
        if fresh {
            m.stale = false;
        }
        Some((m.file.clone(), stale))
    }
}

/// What [`Markers::release`] found in a lock file about to be given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Released {
    /// Empty, or naming a plugin that may still run (a call cut short,
    /// whose plugin is killed and reaped on its own): left as it is.
    Clean,
    /// Naming a plugin that has been reaped.
    Stale,
}

impl Released {
    /// Empties the marker of a reaped plugin in `held`, which is about to
    /// be given up but stays in place (its container keeps a record): the
    /// next holder must not find a marker of a plugin that finished.
    /// Blocking. A failure is logged: the next holder then finds the group
    /// gone and clears the marker itself.
    pub fn settle(self, held: &Held) {
        if self == Released::Stale {
            if let Err(e) = held.file.set_len(0) {
                tracing::warn!(path = %held.path.display(), cause = %e, "cannot empty the plugin marker in the lock file");
            }
        }
    }
}

impl Default for Markers {
    fn default() -> Self {
        Self::new()
    }
}

/// pread(2) from offset 0, retried on EINTR.
fn read_at_start(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    loop {
        match file.read_at(buf, 0) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

impl Journal for Markers {
    fn started(&self, container_id: &str, group: Group) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        // Every plugin with a container id runs under that container's
        // lock; one without would run unrecorded, so it does not run.
        let (file, stale) = self.file(container_id, true).ok_or_else(|| {
            io::Error::other(format!(
                "no lock is held for container {container_id:?}: cannot note the plugin's process group"
            ))
        })?;
        let body = format!("{} {} {}\n", group.pgid, group.start_time, self.boot_id);
        // Not synced: a power loss kills the plugins too, and a marker that
        // survives one is told apart by its boot id. The file is empty
        // unless it still names the previous plugin of this operation:
        // then it is overwritten and cut to the new marker (a crash in
        // between leaves the new marker followed by bytes nobody reads).
        file.write_all_at(body.as_bytes(), 0)?;
        if stale {
            file.set_len(body.len() as u64)?;
        }
        Ok(())
    }

    fn finished(&self, container_id: &str, _group: Group) {
        // Only noted here (no I/O on the async runtime): the marker is
        // emptied by the next plugin's note or when the lock is released.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = held.get_mut(container_id) {
            m.stale = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::symlink;
    use std::sync::mpsc;
    use std::time::Duration;

    fn record(id: &str) -> Record {
        let mut r = Record::new(id);
        r.attachments.push(Attachment {
            hot_plugged_into: None,
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
            cni_args: "IgnoreUnknown=1".into(),
            capability_args: Map::new(),
            delegates: vec![Delegate {
                name: "n".into(),
                ifname: "eth0".into(),
                primary: true,
                state: State::Adding,
                config: json!({"name":"n"}),
                capability_args: None,
                cni_args: None,
                result: None,
            }],
        });
        r
    }

    #[test]
    fn records_should_round_trip_and_empty_ones_vanish() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.load("c1").unwrap().is_none());
        let mut r = record("c1");
        store.save(&r, Durability::Synced).unwrap();
        assert_eq!(store.load("c1").unwrap().unwrap(), r);
        assert_eq!(store.list().unwrap(), vec!["c1".to_string()]);
        r.attachments.clear();
        store.save(&r, Durability::Atomic).unwrap();
        assert!(store.load("c1").unwrap().is_none());
        assert!(fs::read_dir(store.dir()).unwrap().next().is_none());
    }

    #[test]
    fn every_kind_of_damage_should_be_reported_and_set_aside_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.save(&record("good"), Durability::Atomic).unwrap();
        let good = fs::read(store.path("good")).unwrap();
        let other = serde_json::to_vec(&record("good")).unwrap();
        let mut kind = record("kind");
        kind.kind = "somethingElse".into();
        let kind = serde_json::to_vec(&kind).unwrap();
        let files: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("truncated", good[..good.len() / 2].to_vec()),
            ("garbage", b"\x00\xffnot json".to_vec()),
            ("other", other),
            ("kind", kind),
        ];
        for (id, bytes) in &files {
            fs::write(store.path(id), bytes).unwrap();
        }
        fs::create_dir(store.path("adir")).unwrap();
        fs::write(store.path("adir").join("inside"), b"x").unwrap();
        symlink(store.path("good"), store.path("alink")).unwrap();

        for id in [
            "empty",
            "truncated",
            "garbage",
            "other",
            "kind",
            "adir",
            "alink",
        ] {
            let e = store.load(id).unwrap_err();
            assert!(e.is_damaged(), "{id}: {e}");
            assert!(e.to_string().contains(&format!("{id}.json")), "{e}");
            let to = store.set_aside(id).unwrap();
            assert!(
                to.starts_with(store.dir().join("damaged").join(id)),
                "{to:?}"
            );
            assert!(store.load(id).unwrap().is_none(), "{id} is still there");
            assert!(store.was_set_aside(id));
            match id {
                "adir" => assert_eq!(fs::read(to.join("inside")).unwrap(), b"x"),
                "alink" => assert_eq!(fs::read_link(&to).unwrap(), store.path("good")),
                _ => {
                    let bytes = &files.iter().find(|(i, _)| *i == id).unwrap().1;
                    assert_eq!(&fs::read(&to).unwrap(), bytes, "{id}");
                }
            }
        }
        // The record the link and the copy pointed at is untouched.
        assert_eq!(fs::read(store.path("good")).unwrap(), good);
        assert!(!store.was_set_aside("good"));
        // A second damaged record the same second gets a name of its own.
        fs::write(store.path("empty"), b"").unwrap();
        let second = store.set_aside("empty").unwrap();
        assert_eq!(
            fs::read_dir(second.parent().unwrap()).unwrap().count(),
            2,
            "{second:?}"
        );
    }

    #[test]
    fn readers_should_create_and_remove_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("state");
        let store = Store::at(&missing);
        assert!(store.list().unwrap().is_empty());
        assert!(store.load("c1").unwrap().is_none());
        assert!(!missing.exists());

        let store = Store::open(&missing).unwrap();
        store.save(&record("c1"), Durability::Atomic).unwrap();
        let tmp = store.dir().join(".c.1.2.3.4.tmp");
        fs::write(&tmp, b"half").unwrap();
        assert_eq!(Store::at(&missing).list().unwrap(), vec!["c1".to_string()]);
        assert!(tmp.exists(), "a reader removed a write in progress");
        assert_eq!(store.temp_files(), vec![("c.1.2".to_string(), tmp)]);
    }

    #[test]
    fn a_lock_should_exclude_others_and_survive_being_unlinked() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Arc::new(Locks::open(dir.path()).unwrap());
        let held = locks.lock("c1").unwrap();
        assert!(locks.try_lock("c1").unwrap().is_none());
        assert!(locks.try_lock("c2").unwrap().is_some());

        let (tx, rx) = mpsc::channel();
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || {
                let h = locks.lock("c1").unwrap();
                tx.send(()).unwrap();
                // Held until the main thread has checked it is exclusive.
                std::thread::park();
                drop(h);
            })
        };
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        let path = held.path().to_path_buf();
        held.unlink().unwrap();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the waiter never got the lock");
        // The waiter locked a fresh file at the same path, so it still
        // excludes whoever comes next.
        assert!(path.exists());
        assert!(locks.try_lock("c1").unwrap().is_none());
        waiter.thread().unpark();
        waiter.join().unwrap();
        assert!(locks.try_lock("c1").unwrap().is_some());
        assert_eq!(locks.ids().len(), 2);
    }

    #[test]
    fn markers_should_name_their_group_until_finished() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::open(dir.path()).unwrap();
        let m = Markers::new();
        let g = Group {
            pgid: 4242,
            start_time: 777,
        };
        // No lock held for the container: the plugin must not run.
        assert!(m.started("a", g).is_err());
        let a = locks.lock("a").unwrap();
        let b = locks.lock("a.1").unwrap();
        m.hold("a", &a);
        m.hold("a.1", &b);
        m.started("a", g).unwrap();
        m.started("a.1", Group { pgid: 7, ..g }).unwrap();
        let of_a = m.of("a", &a).unwrap().unwrap();
        assert_eq!(of_a.state, MarkerState::Running(g));
        assert_eq!(of_a.container_id, "a");
        assert_eq!(
            m.of("a.1", &b).unwrap().unwrap().state,
            MarkerState::Running(Group { pgid: 7, ..g })
        );
        // A reaped plugin's marker is emptied by the next trip to the
        // file, not at once: the next plugin's note replaces it whole...
        m.finished("a", g);
        assert_eq!(
            m.of("a", &a).unwrap().unwrap().state,
            MarkerState::Running(g)
        );
        let shorter = Group {
            pgid: 9,
            start_time: 1,
        };
        m.started("a", shorter).unwrap();
        assert_eq!(
            fs::read_to_string(a.path()).unwrap(),
            format!("9 1 {}\n", m.boot_id)
        );
        // ...and releasing the lock empties it.
        m.finished("a", shorter);
        let released = m.release("a");
        assert_eq!(released, Released::Stale);
        released.settle(&a);
        assert!(m.of("a", &a).unwrap().is_none());
        assert_eq!(fs::metadata(a.path()).unwrap().len(), 0);
        // A plugin not reaped (a call cut short) keeps its marker.
        let released = m.release("a.1");
        assert_eq!(released, Released::Clean);
        released.settle(&b);
        assert!(m.of("a.1", &b).unwrap().is_some());

        // What a later holder finds, written by hand.
        drop(a);
        fs::write(dir.path().join("locks/a.lock"), "12 34 another-boot\n").unwrap();
        fs::write(dir.path().join("locks/c.lock"), "garbage").unwrap();
        let a = locks.lock("a").unwrap();
        let c = locks.lock("c").unwrap();
        assert_eq!(
            m.of("a", &a).unwrap().unwrap().state,
            MarkerState::EarlierBoot
        );
        assert_eq!(
            m.of("c", &c).unwrap().unwrap().state,
            MarkerState::Unreadable
        );
        m.clear(&c).unwrap();
        assert!(m.of("c", &c).unwrap().is_none());
    }
}
