//! Devices the kubelet gave a pod (SR-IOV functions and the like, from
//! device plugins), for NetworkAttachmentDefinitions that carry the
//! `k8s.v1.cni.cncf.io/resourceName` annotation, and the device-info files
//! of the network plumbing specification.
//!
//! As multus: the kubelet's pod-resources API (gRPC `List` on its unix
//! socket, 16 MiB messages) when the socket exists, else the device
//! manager's checkpoint file. Which network takes which device is pod
//! planning's business (`selection::pod`), which asks here at most once
//! per ADD, and only when a network of the pod names a resource.
//!
//! The gRPC call is made with hyper's HTTP/2 client and the few protobuf
//! messages it needs, declared here (unknown fields are skipped, so newer
//! kubelets answer just as well).

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The kubelet's pod-resources socket.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The kubelet device manager's checkpoint, read when the socket is absent.
pub const DEFAULT_CHECKPOINT_FILE: &str =
    "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
/// The gRPC method that lists every pod's resources.
const LIST_PATH: &str = "/v1.PodResourcesLister/List";
/// The largest answer taken from the kubelet (as multus).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// The largest checkpoint file read.
const MAX_CHECKPOINT_BYTES: u64 = 64 << 20;

/// Where the kubelet's device data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSource {
    /// The pod-resources socket; used when it exists.
    pub socket: PathBuf,
    /// The checkpoint file, used otherwise.
    pub checkpoint: PathBuf,
    /// Bound of the whole gRPC exchange (connect, ask, read).
    pub timeout: Duration,
}

impl Default for DeviceSource {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(DEFAULT_POD_RESOURCES_SOCKET),
            checkpoint: PathBuf::from(DEFAULT_CHECKPOINT_FILE),
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why a pod's devices cannot be had from the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to the kubelet's pod-resources socket {}", .socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the kubelet's pod-resources API ({}) failed: {why}", .socket.display())]
    Api { socket: PathBuf, why: String },
    #[error("the kubelet's pod-resources API ({}) did not answer within {}", .socket.display(), crate::duration::format(*.after))]
    Timeout { socket: PathBuf, after: Duration },
    #[error("cannot read the kubelet's device checkpoint {}: {why}", .file.display())]
    Checkpoint { file: PathBuf, why: String },
}

impl Error {
    /// Worth trying again later: the kubelet did not answer in time, or
    /// its socket took no connection (it may be restarting).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Timeout { .. } | Error::Connect { .. })
    }
}

/// The pod-resources v1 messages Plexus reads (kubelet's
/// `podresources/v1/api.proto`); other fields are skipped.
pub mod proto {
    /// `ListPodResourcesResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodResourcesResponse {
        #[prost(message, repeated, tag = "1")]
        pub pod_resources: Vec<PodResources>,
    }

    /// `PodResources`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub namespace: String,
        #[prost(message, repeated, tag = "3")]
        pub containers: Vec<ContainerResources>,
    }

    /// `ContainerResources`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerResources {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub devices: Vec<ContainerDevices>,
    }

    /// `ContainerDevices`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerDevices {
        #[prost(string, tag = "1")]
        pub resource_name: String,
        #[prost(string, repeated, tag = "2")]
        pub device_ids: Vec<String>,
    }
}

impl DeviceSource {
    /// The devices of pod `namespace/name` (uid `uid`) by resource: from
    /// the pod-resources API when its socket exists (matched by namespace
    /// and name, as the API reports pods), else from the checkpoint
    /// (matched by uid).
    pub async fn pod_devices(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<BTreeMap<String, Vec<String>>, Error> {
        if tokio::fs::metadata(&self.socket).await.is_ok() {
            let answer = tokio::time::timeout(self.timeout, self.list())
                .await
                .map_err(|_| Error::Timeout {
                    socket: self.socket.clone(),
                    after: self.timeout,
                })??;
            return Ok(from_pod_resources(&answer, namespace, name));
        }
        let file = self.checkpoint.clone();
        let uid = uid.to_string();
        let read = tokio::task::spawn_blocking(move || {
            crate::device_info::read_bounded(&file, MAX_CHECKPOINT_BYTES)
                .map_err(|e| e.to_string())
                .and_then(|bytes| from_checkpoint(&bytes, &uid))
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        read.map_err(|why| Error::Checkpoint {
            file: self.checkpoint.clone(),
            why,
        })
    }

    /// One gRPC `List` call.
    async fn list(&self) -> Result<proto::ListPodResourcesResponse, Error> {
        crate::grpc::call_empty(&self.socket, LIST_PATH, MAX_MESSAGE_BYTES)
            .await
            .map(|answer| answer.message)
            .map_err(|e| match e {
                crate::grpc::CallError::Connect(source) => Error::Connect {
                    socket: self.socket.clone(),
                    source,
                },
                crate::grpc::CallError::Api(why) => Error::Api {
                    socket: self.socket.clone(),
                    why,
                },
            })
    }
}

/// The devices of `namespace/name` in a pod-resources answer, by resource.
pub fn from_pod_resources(
    answer: &proto::ListPodResourcesResponse,
    namespace: &str,
    name: &str,
) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in answer
        .pod_resources
        .iter()
        .filter(|p| p.namespace == namespace && p.name == name)
    {
        for device in pod.containers.iter().flat_map(|c| &c.devices) {
            map.entry(device.resource_name.clone())
                .or_default()
                .extend(device.device_ids.iter().cloned());
        }
    }
    map
}

#[derive(Deserialize)]
struct CheckpointFile {
    #[serde(rename = "Data")]
    data: CheckpointData,
}

#[derive(Deserialize)]
struct CheckpointData {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<CheckpointEntry>>,
}

#[derive(Deserialize)]
struct CheckpointEntry {
    #[serde(rename = "PodUID", default)]
    pod_uid: String,
    #[serde(rename = "ResourceName", default)]
    resource_name: String,
    /// NUMA node → device IDs.
    #[serde(rename = "DeviceIDs", default)]
    device_ids: Option<BTreeMap<String, Option<Vec<String>>>>,
}

/// The devices of pod `uid` in the kubelet's checkpoint, by resource.
pub fn from_checkpoint(bytes: &[u8], uid: &str) -> Result<BTreeMap<String, Vec<String>>, String> {
    let file: CheckpointFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in file
        .data
        .entries
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.pod_uid == uid)
    {
        let ids = map.entry(entry.resource_name).or_default();
        for per_node in entry.device_ids.unwrap_or_default().into_values() {
            ids.extend(per_node.unwrap_or_default());
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_should_give_the_pods_devices_by_uid() {
        let text = br#"{"Data":{"PodDeviceEntries":[
            {"PodUID":"u1","ContainerName":"c","ResourceName":"r/a","DeviceIDs":{"0":["d2"],"1":["d1"]},"AllocResp":"eA=="},
            {"PodUID":"u1","ContainerName":"c2","ResourceName":"r/a","DeviceIDs":{"-1":["d3"]},"AllocResp":null},
            {"PodUID":"u2","ContainerName":"c","ResourceName":"r/a","DeviceIDs":{"0":["x"]}}
          ],"RegisteredDevices":{"r/a":["d1","d2","d3","x"]}},"Checksum":1234}"#;
        let mut map = from_checkpoint(text, "u1").unwrap();
        // Every NUMA node's devices of the pod, whatever their order.
        map.get_mut("r/a").unwrap().sort();
        assert_eq!(map["r/a"], ["d1", "d2", "d3"]);
        assert_eq!(map.len(), 1);
        assert!(
            from_checkpoint(br#"{"Data":{"PodDeviceEntries":null}}"#, "u1")
                .unwrap()
                .is_empty()
        );
        assert!(from_checkpoint(b"{", "u1").is_err());
    }

    #[test]
    fn pod_resources_should_be_matched_by_namespace_and_name() {
        use proto::*;
        let dev = |r: &str, ids: &[&str]| ContainerDevices {
            resource_name: r.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        let answer = ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "p".into(),
                    namespace: "ns".into(),
                    containers: vec![
                        ContainerResources {
                            name: "a".into(),
                            devices: vec![dev("r", &["2"])],
                        },
                        ContainerResources {
                            name: "b".into(),
                            devices: vec![dev("r", &["1"]), dev("s", &["9"])],
                        },
                    ],
                },
                PodResources {
                    name: "p".into(),
                    namespace: "other".into(),
                    containers: vec![ContainerResources {
                        name: "a".into(),
                        devices: vec![dev("r", &["0"])],
                    }],
                },
            ],
        };
        let map = from_pod_resources(&answer, "ns", "p");
        assert_eq!(map["r"], ["2", "1"]);
        assert_eq!(map["s"], ["9"]);
        assert_eq!(map.len(), 2);
    }
}
