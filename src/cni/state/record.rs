//! The record of a container: its attachments, each with the networks it
//! brought and everything DEL needs, as kept in `attachments/<id>.json`.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Error;

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
    /// Set once a DEL of this attachment failed: what is left of it waits
    /// for the next DEL, the runtime's or plexusd's own (see
    /// docs/records.md, "Pending cleanup").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<Cleanup>,
    /// The configured networks a DEL ran in place of a damaged record or
    /// multus delegate cache (docs/records.md, "Damaged records"): once
    /// they are all DELed, libcni's result caches of the container go
    /// too. Absent in records of earlier versions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fell_back: bool,
}

/// The failed DELs of an attachment, and plexusd's own next attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cleanup {
    /// Unix time in milliseconds of the first failure.
    pub first_failure_ms: u64,
    /// DELs that failed: the runtime's, a failed ADD's rollback, plexusd's.
    pub failures: u32,
    /// Of those, plexusd's own retries (they set the backoff).
    #[serde(default)]
    pub retries: u32,
    /// The runtime's DELs that were answered with the error.
    #[serde(default)]
    pub reported: u32,
    /// The runtime's DEL was answered with success: from then on only
    /// plexusd retries.
    #[serde(default)]
    pub handed_over: bool,
    /// The error of the last failure.
    pub last_error: String,
    /// Failures in a row with that same error while the container's
    /// network namespace was gone.
    #[serde(default)]
    pub same_while_gone: u32,
    /// Unix time in milliseconds when plexusd's own next attempt is due.
    pub next_attempt_ms: u64,
    /// The network namespace at the first failure, as `<dev>:<inode>`: a
    /// later attempt uses the recorded path only while it still names
    /// that namespace (a `/proc/<pid>/ns/net` path may name another
    /// process's by then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_id: Option<String>,
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

/// The size of `record` as [`Store::save`](super::Store::save) writes it.
pub fn encoded_len(record: &Record) -> usize {
    // A Record is strings, maps and JSON values: it always serialises.
    serde_json::to_vec(record).map(|b| b.len()).unwrap_or(0)
}

/// Longest record file read (and written); records are a few KiB.
pub(super) const MAX_RECORD_BYTES: u64 = 16 << 20;
/// Largest record an ADD may start with, before any plugin ran (network
/// configurations and capability arguments); the results that follow add a
/// few KiB per network, far from the `MAX_RECORD_BYTES` read limit.
pub const MAX_NEW_RECORD_BYTES: usize = 256 << 10;

/// Reads the record of `container_id` from `text`, the bytes of `path`.
pub(super) fn parse(container_id: &str, path: &Path, text: &[u8]) -> Result<Record, Error> {
    let damaged = |why: String| Error::Damaged {
        what: super::RECORD,
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    /// A record of container `id` with one network in state `adding`.
    pub(in crate::cni::state) fn record(id: &str) -> Record {
        let mut r = Record::new(id);
        r.attachments.push(Attachment {
            fell_back: false,
            hot_plugged_into: None,
            cleanup: None,
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
}
