//! A CRI client for tests: the few `runtime.v1.RuntimeService` calls the
//! tests make, as gRPC over a unix socket (HTTP/2 with hyper, messages with
//! prost; field numbers from the CRI's `api.proto`), blocking.
//!
//! Hand-written rather than generated: the generated bindings
//! (`k8s-cri`) need `protoc` at build time and tonic, for five calls.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

/// Longest one call may take (RunPodSandbox runs the CNI ADD).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
}

/// A host port of the pod (protocol 0: TCP).
#[derive(Clone, PartialEq, Message)]
pub struct PortMapping {
    #[prost(int32, tag = "1")]
    pub protocol: i32,
    #[prost(int32, tag = "2")]
    pub container_port: i32,
    #[prost(int32, tag = "3")]
    pub host_port: i32,
    #[prost(string, tag = "4")]
    pub host_ip: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(message, repeated, tag = "5")]
    pub port_mappings: Vec<PortMapping>,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(map = "string, string", tag = "7")]
    pub annotations: HashMap<String, String>,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, Message)]
struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    runtime_handler: String,
}

/// The request of StopPodSandbox, RemovePodSandbox (field 1: the id), and
/// the answer of RunPodSandbox (field 1: the new id).
#[derive(Clone, PartialEq, Message)]
struct SandboxId {
    #[prost(string, tag = "1")]
    id: String,
}

#[derive(Clone, PartialEq, Message)]
struct Empty {}

#[derive(Clone, PartialEq, Message)]
struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(bool, tag = "2")]
    verbose: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodIp {
    #[prost(string, tag = "1")]
    pub ip: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxNetworkStatus {
    #[prost(string, tag = "1")]
    pub ip: String,
    #[prost(message, repeated, tag = "2")]
    pub additional_ips: Vec<PodIp>,
}

/// `PodSandboxState`: 0 ready, 1 not ready.
pub const SANDBOX_READY: i32 = 0;

#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(int32, tag = "3")]
    pub state: i32,
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    status: Option<PodSandboxStatus>,
    #[prost(map = "string, string", tag = "2")]
    info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(int32, tag = "3")]
    pub state: i32,
}

#[derive(Clone, PartialEq, Message)]
struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    items: Vec<PodSandbox>,
}

#[derive(Clone, PartialEq, Message)]
struct StatusRequest {
    #[prost(bool, tag = "1")]
    verbose: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct RuntimeCondition {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(bool, tag = "2")]
    pub status: bool,
    #[prost(string, tag = "3")]
    pub reason: String,
    #[prost(string, tag = "4")]
    pub message: String,
}

#[derive(Clone, PartialEq, Message)]
struct RuntimeStatus {
    #[prost(message, repeated, tag = "1")]
    conditions: Vec<RuntimeCondition>,
}

#[derive(Clone, PartialEq, Message)]
struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    status: Option<RuntimeStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct ImageSpec {
    #[prost(string, tag = "1")]
    image: String,
}

#[derive(Clone, PartialEq, Message)]
struct ImageStatusRequest {
    #[prost(message, optional, tag = "1")]
    image: Option<ImageSpec>,
    #[prost(bool, tag = "2")]
    verbose: bool,
}

/// `Image`, its id only.
#[derive(Clone, PartialEq, Message)]
struct ImageId {
    #[prost(string, tag = "1")]
    id: String,
}

#[derive(Clone, PartialEq, Message)]
struct ImageStatusResponse {
    #[prost(message, optional, tag = "1")]
    image: Option<ImageId>,
}

/// A failed call: the gRPC status (0 when the transport failed) and message.
#[derive(Debug, Clone)]
pub struct CriError {
    pub code: u32,
    pub message: String,
}

impl fmt::Display for CriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gRPC status {}: {}", self.code, self.message)
    }
}

/// One sandbox's status, with containerd's verbose `info` (JSON).
#[derive(Debug, Clone)]
pub struct SandboxStatus {
    pub status: PodSandboxStatus,
    pub info: serde_json::Value,
}

impl SandboxStatus {
    /// Every IP the runtime reports for the pod (`ip`, then the others).
    pub fn ips(&self) -> Vec<String> {
        let Some(n) = &self.status.network else {
            return Vec::new();
        };
        std::iter::once(n.ip.clone())
            .chain(n.additional_ips.iter().map(|i| i.ip.clone()))
            .filter(|ip| !ip.is_empty())
            .collect()
    }

    /// The sandbox's network namespace path (from the runtime spec in the
    /// verbose info).
    pub fn netns(&self) -> Option<String> {
        self.info["runtimeSpec"]["linux"]["namespaces"]
            .as_array()?
            .iter()
            .find(|n| n["type"] == "network")?["path"]
            .as_str()
            .map(str::to_string)
    }
}

/// A RuntimeService client on a unix socket; one connection per call, so
/// that threads may call at once.
pub struct CriClient {
    socket: PathBuf,
    rt: tokio::runtime::Runtime,
}

const SERVICE: &str = "/runtime.v1.RuntimeService/";
const IMAGES: &str = "/runtime.v1.ImageService/";

impl CriClient {
    pub fn new(socket: &Path) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        CriClient {
            socket: socket.to_path_buf(),
            rt,
        }
    }

    fn call<Q: Message, A: Message + Default>(&self, method: &str, req: &Q) -> Result<A, CriError> {
        let path = if method.starts_with('/') {
            method.to_string()
        } else {
            format!("{SERVICE}{method}")
        };
        let fut = unary(&self.socket, path, req.encode_to_vec());
        let bytes = self
            .rt
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, fut).await })
            .map_err(|_| transport(format!("{method}: no answer within {CALL_TIMEOUT:?}")))??;
        A::decode(bytes).map_err(|e| transport(format!("{method}: cannot decode: {e}")))
    }

    /// RunPodSandbox; the new sandbox's id.
    pub fn run_pod_sandbox(&self, config: PodSandboxConfig) -> Result<String, CriError> {
        let req = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        self.call::<_, SandboxId>("RunPodSandbox", &req)
            .map(|r| r.id)
    }

    pub fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = SandboxId { id: id.into() };
        self.call::<_, Empty>("StopPodSandbox", &req).map(drop)
    }

    pub fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = SandboxId { id: id.into() };
        self.call::<_, Empty>("RemovePodSandbox", &req).map(drop)
    }

    /// PodSandboxStatus, verbose.
    pub fn pod_sandbox_status(&self, id: &str) -> Result<SandboxStatus, CriError> {
        let req = PodSandboxStatusRequest {
            id: id.into(),
            verbose: true,
        };
        let r: PodSandboxStatusResponse = self.call("PodSandboxStatus", &req)?;
        let info = r
            .info
            .get("info")
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        Ok(SandboxStatus {
            status: r.status.unwrap_or_default(),
            info,
        })
    }

    /// ListPodSandbox without a filter.
    pub fn list_pod_sandbox(&self) -> Result<Vec<PodSandbox>, CriError> {
        let r: ListPodSandboxResponse = self.call("ListPodSandbox", &Empty {})?;
        Ok(r.items)
    }

    /// The runtime's conditions (`RuntimeReady`, `NetworkReady`).
    pub fn conditions(&self) -> Result<Vec<RuntimeCondition>, CriError> {
        let r: StatusResponse = self.call("Status", &StatusRequest { verbose: false })?;
        Ok(r.status.unwrap_or_default().conditions)
    }

    /// Whether the CRI's image store holds `image`.
    pub fn image_present(&self, image: &str) -> bool {
        let req = ImageStatusRequest {
            image: Some(ImageSpec {
                image: image.into(),
            }),
            verbose: false,
        };
        self.call::<_, ImageStatusResponse>(&format!("{IMAGES}ImageStatus"), &req)
            .is_ok_and(|r| r.image.is_some_and(|i| !i.id.is_empty()))
    }

    /// Whether the runtime reports condition `kind` as true.
    pub fn condition(&self, kind: &str) -> bool {
        self.conditions()
            .is_ok_and(|c| c.iter().any(|c| c.r#type == kind && c.status))
    }
}

fn transport(message: String) -> CriError {
    CriError { code: 0, message }
}

/// One unary gRPC call: the answer's message bytes.
async fn unary(socket: &Path, method: String, msg: Vec<u8>) -> Result<Bytes, CriError> {
    let fail = |what: &str, e: &dyn fmt::Display| transport(format!("{method}: {what}: {e}"));
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| fail("connect", &e))?;
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| fail("handshake", &e))?;
    tokio::spawn(conn);
    let mut body = BytesMut::with_capacity(msg.len() + 5);
    body.put_u8(0);
    body.put_u32(msg.len() as u32);
    body.put_slice(&msg);
    let req = hyper::Request::post(format!("http://localhost{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(body.freeze()))
        .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| fail("request", &e))?;
    if resp.status() != hyper::StatusCode::OK {
        return Err(fail("HTTP status", &resp.status()));
    }
    if let Some(e) = grpc_error(resp.headers()) {
        return Err(e);
    }
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| fail("body", &e))?;
    if let Some(e) = collected.trailers().and_then(grpc_error) {
        return Err(e);
    }
    let mut bytes = collected.to_bytes();
    if bytes.len() < 5 || bytes[0] != 0 {
        return Err(fail(
            "answer",
            &format!("{} bytes, not a message", bytes.len()),
        ));
    }
    bytes.advance(1);
    let len = bytes.get_u32() as usize;
    Ok(bytes.slice(..len.min(bytes.len())))
}

/// A non-zero `grpc-status` with its (percent-encoded) message.
fn grpc_error(headers: &hyper::HeaderMap) -> Option<CriError> {
    let code: u32 = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    if code == 0 {
        return None;
    }
    let raw = headers
        .get("grpc-message")
        .map(|m| m.as_bytes().to_vec())
        .unwrap_or_default();
    Some(CriError {
        code,
        message: percent_decode(&raw),
    })
}

fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = raw
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (raw[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
