//! One unary gRPC call on a unix socket, as the kubelet's pod-resources
//! API and the runtime's CRI are asked: an empty request message, one
//! uncompressed answer, hyper's HTTP/2 client. The callers declare the
//! protobuf messages they read and bound the call with their timeout.
//!
//! A leaf: it knows nothing of what is asked.

use std::io;
use std::path::Path;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Why a call failed.
#[derive(Debug)]
pub enum CallError {
    /// The socket took no connection.
    Connect(io::Error),
    /// Anything after: HTTP/2, gRPC status, the answer's framing or
    /// decoding, in words.
    Api(String),
}

/// The answer to one call, and the pid of the process at the socket's
/// other end (`SO_PEERCRED`), when the kernel tells it.
#[derive(Debug)]
pub struct Answer<M> {
    pub message: M,
    pub peer_pid: Option<i32>,
}

/// Calls `method` (`/package.Service/Method`) at `socket` with an empty
/// request; the answer is at most `max_bytes`. Unbounded in time: the
/// caller bounds it.
pub async fn call_empty<M: prost::Message + Default>(
    socket: &Path,
    method: &str,
    max_bytes: usize,
) -> Result<Answer<M>, CallError> {
    let api = CallError::Api;
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(CallError::Connect)?;
    let peer_pid = stream.peer_cred().ok().and_then(|c| c.pid());
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| api(format!("HTTP/2 handshake: {e}")))?;
    // The connection ends when `sender` is dropped.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(cause = %e, "gRPC connection ended");
        }
    });
    // An empty request message: uncompressed, length 0.
    let request = hyper::Request::post(format!("http://localhost{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .map_err(|e| api(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| api(format!("request: {e}")))?;
    if response.status() != hyper::StatusCode::OK {
        return Err(api(format!("HTTP status {}", response.status())));
    }
    // A failure may come as headers alone ("trailers-only").
    if let Some(e) = grpc_failure(response.headers()) {
        return Err(api(e));
    }
    let body = Limited::new(response.into_body(), max_bytes + 5)
        .collect()
        .await
        .map_err(|e| api(format!("reading the answer: {e}")))?;
    if let Some(e) = body.trailers().and_then(grpc_failure) {
        return Err(api(e));
    }
    let message = decode(body.to_bytes()).map_err(api)?;
    Ok(Answer { message, peer_pid })
}

/// The message of a gRPC answer's body (one uncompressed message).
pub fn decode<M: prost::Message + Default>(mut bytes: Bytes) -> Result<M, String> {
    if bytes.len() < 5 {
        return Err("the answer holds no message".into());
    }
    if bytes[0] != 0 {
        return Err("the answer is compressed, which was not asked for".into());
    }
    bytes.advance(1);
    let len = bytes.get_u32() as usize;
    if len > bytes.len() {
        return Err(format!(
            "the message says {len} bytes but {} came",
            bytes.len()
        ));
    }
    M::decode(bytes.slice(..len)).map_err(|e| format!("cannot decode the answer: {e}"))
}

/// A non-zero `grpc-status` with its message.
fn grpc_failure(headers: &hyper::HeaderMap) -> Option<String> {
    let status = headers.get("grpc-status")?.to_str().ok()?.trim();
    if status == "0" {
        return None;
    }
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("");
    Some(format!("gRPC status {status}: {message}"))
}
