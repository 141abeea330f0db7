//! The reloading client against a plain-HTTP API server in this process.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use kube::client::Body;

use super::*;

#[test]
fn a_replaced_symlink_should_change_the_stamp_and_be_named() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("cert-a.pem");
    let b = dir.path().join("cert-b.pem");
    std::fs::write(&a, "a").unwrap();
    std::fs::write(&b, "b").unwrap();
    let current = dir.path().join("current.pem");
    std::os::unix::fs::symlink(&a, &current).unwrap();
    let files = Files(vec![("client-certificate", current.clone())]);
    let before = files.stamps();
    let tmp = dir.path().join("current.tmp");
    std::os::unix::fs::symlink(&b, &tmp).unwrap();
    std::fs::rename(&tmp, &current).unwrap();
    let after = files.stamps();
    assert_ne!(before, after);
    assert_eq!(
        files.changed(&files, &before, &after),
        format!("client-certificate {}", current.display())
    );
    std::fs::remove_file(&b).unwrap();
    assert_eq!(files.stamps(), vec![None]);
    assert!(files.unusable().unwrap().contains("client-certificate"));
    std::fs::write(&b, "not a certificate").unwrap();
    let problem = files.unusable().unwrap();
    assert!(problem.contains("no PEM certificate"), "{problem}");
    std::fs::write(&b, "-----BEGIN CERTIFICATE-----\n").unwrap();
    assert_eq!(files.unusable(), None);
}

/// Replaces `path` with `text` as kubelet does: a new file renamed over.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A server taking bearer token `new` only; a request with another token
/// first rewrites `token_file` to `new` (the rotation racing the request),
/// then gets 401. `/forbidden` gets 403 with a 100 KiB body. Counts the
/// requests.
async fn server(token_file: PathBuf, requests: Arc<AtomicUsize>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (token_file, requests) = (token_file.clone(), requests.clone());
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                requests.fetch_add(1, Ordering::SeqCst);
                let auth = req.headers().get("authorization").cloned();
                let (status, body) =
                    if auth.as_ref().and_then(|a| a.to_str().ok()) != Some("Bearer new") {
                        replace(&token_file, "new");
                        (
                            401,
                            Bytes::from_static(b"{\"kind\":\"Status\",\"code\":401}"),
                        )
                    } else if req.uri().path() == "/forbidden" {
                        (403, Bytes::from(vec![b'x'; 100 * 1024]))
                    } else {
                        (200, Bytes::from_static(b"{}"))
                    };
                // In 4 KiB chunks: more than one frame reaches the client.
                let chunks: Vec<_> = body
                    .chunks(4096)
                    .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(c))))
                    .collect();
                let body = StreamBody::new(futures_util::stream::iter(chunks));
                let answer = Response::builder().status(status).body(body);
                async move { Ok::<_, Infallible>(answer.unwrap()) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    addr
}

/// A source's config whose kubeconfig (in `dir`) names `addr` and the
/// token file `token`.
fn config(dir: &Path, addr: SocketAddr, token: &Path) -> Config {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
             current-context: c\nusers:\n- name: u\n  user:\n    tokenFile: {}\n",
            token.display()
        ),
    )
    .unwrap();
    Config {
        kubeconfig: Some(kubeconfig),
        node_name: "node-1".into(),
        sync_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(5),
        devices: Default::default(),
        device_info_dir: dir.join("devinfo"),
        pod_events: false,
    }
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn a_401_should_read_the_credentials_again_and_send_once_more() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    replace(&token, "old");
    let requests = Arc::new(AtomicUsize::new(0));
    let addr = server(token.clone(), requests.clone()).await;
    let reloading = Reloading::start(&config(dir.path(), addr, &token), Default::default())
        .await
        .unwrap();
    let client = reloading.client();
    let answer = client.send(get("/ok")).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "refused once, then sent again"
    );
    assert_eq!(reloading.problem(), None);
}

#[tokio::test]
async fn a_403_should_be_handed_on_whole_past_what_is_read_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    replace(&token, "new");
    let addr = server(token.clone(), Default::default()).await;
    let reloading = Reloading::start(&config(dir.path(), addr, &token), Default::default())
        .await
        .unwrap();
    let answer = reloading.client().send(get("/forbidden")).await.unwrap();
    assert_eq!(answer.status(), 403);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 100 * 1024);
    assert!(body.iter().all(|b| *b == b'x'));
}
