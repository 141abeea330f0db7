//! Attachment records: one JSON file per container under
//! `<stateDir>/attachments/`, holding everything DEL needs (each network's
//! config as used at ADD, interface names, results, CNI_ARGS, capability
//! arguments), so DEL works after a restart, a crash, or the removal of the
//! network's config file.
//!
//! Writes are atomic: a temporary file in the same directory, rename over
//! the record. A [`Durability::Synced`] write also fsyncs the file before the
//! rename and the directory after it, so it survives a power loss: the
//! engine asks for that before plugins of a network run, because after a
//! reboot the record is what lets DEL release what they reserved on disk
//! (host-local's addresses). Later updates (results, removals) need only
//! atomicity: losing one leaves an older record, and DEL from an older
//! record is still correct (DEL is idempotent and tolerates a missing
//! prevResult). All functions block: call them on the blocking pool.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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
    /// The final ADD result (recorded once the chain succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
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
}

/// What a user wants to know about a container: its networks, interfaces
/// and addresses, from the recorded results.
pub fn summary(record: &Record) -> Value {
    let attachments: Vec<Value> = record
        .attachments
        .iter()
        .map(|a| {
            let networks: Vec<Value> = a.delegates.iter().map(delegate_summary).collect();
            serde_json::json!({
                "ifname": a.ifname,
                "netns": a.netns,
                "networks": networks,
            })
        })
        .collect();
    serde_json::json!({
        "containerId": record.container_id,
        "attachments": attachments,
    })
}

fn delegate_summary(d: &Delegate) -> Value {
    let mut out = Map::new();
    out.insert("network".into(), Value::String(d.name.clone()));
    out.insert("interface".into(), Value::String(d.ifname.clone()));
    out.insert("primary".into(), Value::Bool(d.primary));
    let state = match d.state {
        State::Pending => "pending",
        State::Adding => "adding",
        State::Added => "added",
    };
    out.insert("state".into(), Value::String(state.into()));
    let Some(result) = &d.result else {
        return Value::Object(out);
    };
    let empty = Vec::new();
    let interfaces = result
        .get("interfaces")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    // The container-side interface: the one in a sandbox with our name.
    let index = interfaces.iter().position(|i| {
        i.get("name").and_then(Value::as_str) == Some(d.ifname.as_str())
            && i.get("sandbox").is_some()
    });
    if let Some(mac) = index
        .and_then(|i| interfaces[i].get("mac"))
        .and_then(Value::as_str)
    {
        out.insert("mac".into(), Value::String(mac.into()));
    }
    let ips: Vec<Value> = result
        .get("ips")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
        .iter()
        .filter(
            |ip| match (ip.get("interface").and_then(Value::as_u64), index) {
                (Some(n), Some(i)) => n as usize == i,
                _ => true,
            },
        )
        .filter_map(|ip| ip.get("address").cloned())
        .collect();
    out.insert("ips".into(), Value::Array(ips));
    let gateways: Vec<Value> = result
        .get("ips")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
        .iter()
        .filter_map(|ip| ip.get("gateway").cloned())
        .collect();
    if !gateways.is_empty() {
        out.insert("gateways".into(), Value::Array(gateways));
    }
    Value::Object(out)
}

/// Whether a write must survive a power loss (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync of the file and the directory.
    Synced,
    /// Atomic only: survives a crash of the process, not of the machine.
    Atomic,
}

/// Why a record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("attachment record {}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("attachment record {} is unreadable: {why}", path.display())]
    Corrupt { path: PathBuf, why: String },
}

/// The directory of records.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    seq: AtomicU64,
}

impl Store {
    /// Opens (and creates, mode 0700) `<state_dir>/attachments`.
    pub fn open(state_dir: &Path) -> Result<Self, Error> {
        let dir = state_dir.join("attachments");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| Error::Io {
                path: dir.clone(),
                what: "cannot create the directory",
                source,
            })?;
        Ok(Self {
            dir,
            seq: AtomicU64::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, container_id: &str) -> PathBuf {
        self.dir.join(format!("{container_id}.json"))
    }

    /// The record of `container_id`, if there is one.
    pub fn load(&self, container_id: &str) -> Result<Option<Record>, Error> {
        let path = self.path(container_id);
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(Error::Io {
                    path,
                    what: "cannot read",
                    source,
                })
            }
        };
        parse(&path, &text).map(Some)
    }

    /// Writes `record` atomically; an empty record removes the file.
    pub fn save(&self, record: &Record, durability: Durability) -> Result<(), Error> {
        if record.attachments.is_empty() {
            return self.remove(&record.container_id, durability);
        }
        let synced = durability == Durability::Synced;
        let path = self.path(&record.container_id);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            record.container_id,
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        let io = |what: &'static str, p: &Path| {
            let p = p.to_path_buf();
            move |source| Error::Io {
                path: p,
                what,
                source,
            }
        };
        let body = serde_json::to_vec(record).map_err(|e| Error::Corrupt {
            path: path.clone(),
            why: e.to_string(),
        })?;
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&body)?;
            if synced {
                f.sync_all()?;
            }
            Ok(())
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io("cannot write the temporary file", &tmp)(e));
        }
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io("cannot rename into place", &path)(e));
        }
        if synced {
            self.sync_dir()?;
        }
        Ok(())
    }

    /// Removes the record of `container_id` (no error when absent).
    pub fn remove(&self, container_id: &str, durability: Durability) -> Result<(), Error> {
        let path = self.path(container_id);
        match fs::remove_file(&path) {
            Ok(()) if durability == Durability::Synced => self.sync_dir(),
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io {
                path,
                what: "cannot remove",
                source,
            }),
        }
    }

    /// The ids of every container with a record, sorted. Temporary files
    /// left by a crash are removed on the way.
    pub fn list(&self) -> Result<Vec<String>, Error> {
        let entries = fs::read_dir(&self.dir).map_err(|source| Error::Io {
            path: self.dir.clone(),
            what: "cannot list",
            source,
        })?;
        let mut ids = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = fs::remove_file(e.path());
            } else if let Some(id) = name.strip_suffix(".json") {
                ids.push(id.to_string());
            }
        }
        ids.sort();
        Ok(ids)
    }

    fn sync_dir(&self) -> Result<(), Error> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| Error::Io {
                path: self.dir.clone(),
                what: "cannot sync the directory",
                source,
            })
    }
}

fn parse(path: &Path, text: &[u8]) -> Result<Record, Error> {
    let record: Record = serde_json::from_slice(text).map_err(|e| Error::Corrupt {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    if record.kind != KIND {
        return Err(Error::Corrupt {
            path: path.to_path_buf(),
            why: format!("unknown kind {:?}", record.kind),
        });
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_should_round_trip_and_empty_ones_vanish() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.load("c1").unwrap().is_none());
        let mut r = Record::new("c1");
        r.attachments.push(Attachment {
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
                result: None,
            }],
        });
        store.save(&r, Durability::Synced).unwrap();
        assert_eq!(store.load("c1").unwrap().unwrap(), r);
        assert_eq!(store.list().unwrap(), vec!["c1".to_string()]);
        r.attachments.clear();
        store.save(&r, Durability::Atomic).unwrap();
        assert!(store.load("c1").unwrap().is_none());
        assert!(fs::read_dir(store.dir()).unwrap().next().is_none());
    }

    #[test]
    fn a_corrupt_record_should_be_reported_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        fs::write(store.dir().join("c2.json"), b"{").unwrap();
        let e = store.load("c2").unwrap_err().to_string();
        assert!(e.contains("c2.json"), "{e}");
    }
}
