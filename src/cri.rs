//! The container runtime's CRI, the little plexusd asks of it: which pod
//! sandboxes exist (`runtime.v1.RuntimeService/ListPodSandbox`, every
//! state), and when the runtime process started, so that a runtime that
//! has just (re)started is told from one that has forgotten a sandbox.
//!
//! The call is gRPC on the runtime's unix socket ([`crate::grpc`], as
//! `k8s::devices` asks the kubelet); the few protobuf messages
//! it needs are declared here with only the fields read (unknown fields are
//! skipped, so newer runtimes answer just as well). Every exchange is
//! bounded by a timeout; file reads go to the blocking pool.
//!
//! A leaf: it knows nothing of records, CNI or Kubernetes objects.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Where runtimes put their CRI socket, in the order plexusd looks when
/// `criSocket` is not set: containerd's, then CRI-O's.
pub const DEFAULT_SOCKETS: &[&str] = &["/run/containerd/containerd.sock", "/run/crio/crio.sock"];
/// The gRPC method that lists the pod sandboxes.
const LIST_PATH: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
/// The largest answer taken from the runtime (the kubelet's own limit).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// The first of [`DEFAULT_SOCKETS`] that exists, if any. Blocking.
pub fn detect() -> Option<PathBuf> {
    DEFAULT_SOCKETS
        .iter()
        .map(PathBuf::from)
        .find(|p| std::fs::symlink_metadata(p).is_ok())
}

/// Why the runtime's sandboxes could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to the runtime's CRI socket {}", .socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the runtime's CRI ({}) failed: {why}", .socket.display())]
    Api { socket: PathBuf, why: String },
    #[error("the runtime's CRI ({}) did not answer within {}", .socket.display(), crate::duration::format(*.after))]
    Timeout { socket: PathBuf, after: Duration },
}

/// The CRI messages plexusd reads (`runtime/v1/api.proto`); other fields
/// are skipped.
pub mod proto {
    /// `PodSandboxMetadata`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxMetadata {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub uid: String,
        #[prost(string, tag = "3")]
        pub namespace: String,
    }

    /// `PodSandbox`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandbox {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(message, optional, tag = "2")]
        pub metadata: Option<PodSandboxMetadata>,
        /// `PodSandboxState`: 0 ready, 1 not ready.
        #[prost(int32, tag = "3")]
        pub state: i32,
        /// Unix nanoseconds.
        #[prost(int64, tag = "4")]
        pub created_at: i64,
    }

    /// `ListPodSandboxResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxResponse {
        #[prost(message, repeated, tag = "1")]
        pub items: Vec<PodSandbox>,
    }
}

/// One pod sandbox as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    pub id: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Ready (`SANDBOX_READY`) or not.
    pub ready: bool,
    /// Unix nanoseconds, as the runtime says.
    pub created_at: i64,
}

/// What one listing found.
#[derive(Debug, Clone)]
pub struct Listing {
    /// Every sandbox, whatever its state.
    pub sandboxes: Vec<Sandbox>,
    /// How long ago the runtime process started: from the start time of
    /// the process at the other end of the socket (`SO_PEERCRED`), else
    /// from the socket file's ctime (when it was created, or replaced);
    /// `None` when neither can be had.
    pub runtime_age: Option<Duration>,
}

/// Lists every pod sandbox of the runtime at `socket`, and how long ago
/// the runtime started; the whole exchange within `timeout`.
pub async fn list_sandboxes(socket: &Path, timeout: Duration) -> Result<Listing, Error> {
    tokio::time::timeout(timeout, list(socket))
        .await
        .map_err(|_| Error::Timeout {
            socket: socket.to_path_buf(),
            after: timeout,
        })?
}

async fn list(socket: &Path) -> Result<Listing, Error> {
    let answer = crate::grpc::call_empty::<proto::ListPodSandboxResponse>(
        socket,
        LIST_PATH,
        MAX_MESSAGE_BYTES,
    )
    .await
    .map_err(|e| match e {
        crate::grpc::CallError::Connect(source) => Error::Connect {
            socket: socket.to_path_buf(),
            source,
        },
        crate::grpc::CallError::Api(why) => Error::Api {
            socket: socket.to_path_buf(),
            why,
        },
    })?;
    let (pid, sock) = (answer.peer_pid, socket.to_path_buf());
    let runtime_age = tokio::task::spawn_blocking(move || runtime_age(pid, &sock))
        .await
        .ok()
        .flatten();
    Ok(Listing {
        sandboxes: answer.message.items.into_iter().map(sandbox).collect(),
        runtime_age,
    })
}

fn sandbox(s: proto::PodSandbox) -> Sandbox {
    let m = s.metadata.unwrap_or_default();
    Sandbox {
        id: s.id,
        namespace: m.namespace,
        name: m.name,
        uid: m.uid,
        ready: s.state == 0,
        created_at: s.created_at,
    }
}

/// How long ago the runtime started: process `pid`'s start time when it
/// can be read (a pid of 0 is a peer in another pid namespace), else the
/// age of the socket file's inode change. Blocking.
fn runtime_age(pid: Option<i32>, socket: &Path) -> Option<Duration> {
    pid.filter(|p| *p > 0)
        .and_then(process_age)
        .or_else(|| socket_age(socket))
}

/// How long ago process `pid` started (`/proc/<pid>/stat` field 22, in
/// clock ticks since boot, against `/proc/uptime`). Blocking.
fn process_age(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    // SAFETY: sysconf(3) reads a constant of the system; no memory is
    // handed over.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    age_from_proc(&stat, &uptime, u64::try_from(ticks).ok()?)
}

/// A process's age from its `stat` line, the system's `uptime` line and
/// the clock ticks per second.
pub fn age_from_proc(stat: &str, uptime: &str, ticks_per_second: u64) -> Option<Duration> {
    // The command name (field 2) is in parentheses and may hold anything:
    // the fields after its last ')' start at field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let start: u64 = rest.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let up: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    if ticks_per_second == 0 || !up.is_finite() || up < 0.0 {
        return None;
    }
    let started = Duration::from_secs_f64(start as f64 / ticks_per_second as f64);
    Some(Duration::from_secs_f64(up).saturating_sub(started))
}

/// How long ago the socket file's inode last changed (it is created when
/// the runtime starts listening). Blocking.
fn socket_age(socket: &Path) -> Option<Duration> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(socket).ok()?;
    let ctime = SystemTime::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(m.ctime()).ok()?)
        + Duration::from_nanos(u64::try_from(m.ctime_nsec()).ok()?);
    Some(SystemTime::now().duration_since(ctime).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::decode;
    use bytes::Bytes;
    use prost::Message;

    #[test]
    fn a_process_age_should_come_from_its_start_ticks_and_the_uptime() {
        // Field 22 is 500 ticks: 5 s after boot at 100 ticks per second.
        let stat = "42 (a) odd) name) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 500 1 1";
        assert_eq!(
            age_from_proc(stat, "65.50 100.0\n", 100),
            Some(Duration::from_millis(60_500))
        );
        assert_eq!(age_from_proc(stat, "1.0 1.0", 100), Some(Duration::ZERO));
        assert_eq!(age_from_proc("42 (x) S 1", "65.5 1", 100), None);
        assert_eq!(age_from_proc(stat, "nonsense", 100), None);
        assert_eq!(age_from_proc(stat, "65.5 1", 0), None);
    }

    #[test]
    fn this_process_should_be_younger_than_the_system() {
        let age = process_age(std::process::id() as i32).unwrap();
        assert!(age < Duration::from_secs(24 * 3600), "{age:?}");
    }

    #[test]
    fn answers_should_decode_with_every_field_read_and_others_skipped() {
        let answer = proto::ListPodSandboxResponse {
            items: vec![proto::PodSandbox {
                id: "abc".into(),
                metadata: Some(proto::PodSandboxMetadata {
                    name: "web".into(),
                    uid: "u1".into(),
                    namespace: "ns".into(),
                }),
                state: 1,
                created_at: 7,
            }],
        };
        let msg = answer.encode_to_vec();
        let mut framed = vec![0];
        framed.extend((msg.len() as u32).to_be_bytes());
        framed.extend(&msg);
        let got: proto::ListPodSandboxResponse = decode(Bytes::from(framed.clone())).unwrap();
        let s = sandbox(got.items[0].clone());
        assert_eq!(
            s,
            Sandbox {
                id: "abc".into(),
                namespace: "ns".into(),
                name: "web".into(),
                uid: "u1".into(),
                ready: false,
                created_at: 7,
            }
        );
        assert!(decode::<proto::ListPodSandboxResponse>(Bytes::from_static(&[0, 0, 0])).is_err());
        let mut short = framed.clone();
        short[4] += 1;
        assert!(decode::<proto::ListPodSandboxResponse>(Bytes::from(short)).is_err());
        framed[0] = 1;
        assert!(decode::<proto::ListPodSandboxResponse>(Bytes::from(framed)).is_err());
    }
}
