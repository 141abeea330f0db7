//! A stand-in for the kubelet's pod-resources gRPC service on a unix
//! socket: HTTP/2, `POST /v1.PodResourcesLister/List`, the answer as one
//! length-prefixed protobuf message followed by `grpc-status` trailers,
//! as the kubelet's gRPC server sends it. It can fail with a gRPC status
//! (trailers only) or stall.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use plexus::k8s::devices::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
};
use prost::Message;
use tokio::sync::watch;

#[derive(Default)]
struct State {
    pods: Vec<PodResources>,
    calls: usize,
    /// Fail every call with this gRPC status and message.
    fail: Option<(u32, String)>,
}

pub struct FakeKubelet {
    pub socket: PathBuf,
    state: Arc<Mutex<State>>,
    stalled: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeKubelet {
    /// Serves at `socket`.
    pub fn start(socket: &Path) -> Self {
        let listener =
            std::os::unix::net::UnixListener::bind(socket).expect("bind the kubelet socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let state = Arc::new(Mutex::new(State::default()));
        let (stalled, stalled_rx) = watch::channel(false);
        let (shutdown, mut shutdown_rx) = watch::channel(false);
        let thread = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("fake-kubelet".into())
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    rt.block_on(async move {
                        let listener =
                            tokio::net::UnixListener::from_std(listener).expect("listener");
                        loop {
                            tokio::select! {
                                _ = shutdown_rx.changed() => return,
                                accepted = listener.accept() => {
                                    let Ok((stream, _)) = accepted else { continue };
                                    let state = state.clone();
                                    let stalled = stalled_rx.clone();
                                    tokio::spawn(async move {
                                        let service = hyper::service::service_fn(move |req| {
                                            answer(req, state.clone(), stalled.clone())
                                        });
                                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                            .serve_connection(TokioIo::new(stream), service)
                                            .await;
                                    });
                                }
                            }
                        }
                    });
                })
                .expect("spawn the fake kubelet")
        };
        Self {
            socket: socket.to_path_buf(),
            state,
            stalled,
            shutdown,
            thread: Some(thread),
        }
    }

    /// Pod `namespace/name` holds these devices: one container per entry,
    /// each with (resource, device IDs).
    pub fn set_pod(&self, namespace: &str, name: &str, containers: &[&[(&str, &[&str])]]) {
        let pod = PodResources {
            name: name.into(),
            namespace: namespace.into(),
            containers: containers
                .iter()
                .enumerate()
                .map(|(i, devices)| ContainerResources {
                    name: format!("c{i}"),
                    devices: devices
                        .iter()
                        .map(|(r, ids)| ContainerDevices {
                            resource_name: r.to_string(),
                            device_ids: ids.iter().map(|s| s.to_string()).collect(),
                        })
                        .collect(),
                })
                .collect(),
        };
        let mut s = self.state.lock().unwrap();
        s.pods
            .retain(|p| !(p.namespace == namespace && p.name == name));
        s.pods.push(pod);
    }

    /// How many `List` calls were answered or are in progress.
    pub fn calls(&self) -> usize {
        self.state.lock().unwrap().calls
    }

    /// Every later call fails with gRPC status `code`.
    pub fn fail_with(&self, code: u32, message: &str) {
        self.state.lock().unwrap().fail = Some((code, message.into()));
    }

    /// Calls are answered again.
    pub fn succeed(&self) {
        self.state.lock().unwrap().fail = None;
    }

    /// While on, calls wait without answering.
    pub fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stalled.send_replace(false);
        self.shutdown.send_replace(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(
    req: Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
    mut stalled: watch::Receiver<bool>,
) -> Result<Response<Body>, Infallible> {
    let grpc = |status: u32, message: &str| {
        Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", status.to_string())
            .header("grpc-message", message)
            .body(Full::new(Bytes::new()).boxed())
            .unwrap()
    };
    if req.uri().path() != "/v1.PodResourcesLister/List" {
        return Ok(grpc(12, "unknown method"));
    }
    if req.headers().get("content-type").map(|v| v.as_bytes()) != Some(b"application/grpc") {
        return Ok(Response::builder()
            .status(415)
            .body(Full::new(Bytes::new()).boxed())
            .unwrap());
    }
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    // An empty ListPodResourcesRequest: flag 0, length 0.
    if body.as_deref().ok() != Some(&[0u8, 0, 0, 0, 0][..]) {
        return Ok(grpc(
            3,
            "the request is not an empty ListPodResourcesRequest",
        ));
    }
    let (pods, fail) = {
        let mut s = state.lock().unwrap();
        s.calls += 1;
        (s.pods.clone(), s.fail.clone())
    };
    let _ = stalled.wait_for(|on| !*on).await;
    if let Some((code, message)) = fail {
        return Ok(grpc(code, &message));
    }
    let message = ListPodResourcesResponse {
        pod_resources: pods,
    }
    .encode_to_vec();
    let mut framed = BytesMut::with_capacity(message.len() + 5);
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(&message);
    let mut trailers = hyper::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    let body = Full::new(framed.freeze())
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed();
    Ok(Response::builder()
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap())
}
