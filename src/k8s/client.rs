//! The Kubernetes client every call goes through, whose credentials follow
//! their files: kubelet replaces its client certificate (a new dated PEM
//! file, the `kubelet-client-current.pem` symlink renamed over), and
//! tokens in a `tokenFile` are rewritten before they expire. A client
//! built once would be refused (401) from then on until a restart.
//!
//! - Before each request, the kubeconfig and every file it names
//!   (client-certificate, client-key, certificate-authority, tokenFile;
//!   in a cluster: the service account's token and ca.crt) are looked at
//!   (device, inode, size, mtime of what each path leads to, symlinks
//!   followed; a few `stat` calls: about 2 µs for four files, 19 µs with
//!   the trip through `spawn_blocking`, measured in a release build, well
//!   under an API round trip). When any changed, the client is built
//!   again from the files and the old one dropped, so its pooled
//!   connections close; requests in flight finish on theirs.
//! - An answer 401 Unauthorized makes the client be built again (once per
//!   client, whoever saw it first) and the request be sent once more.
//! - A build that fails (a file missing, unreadable or invalid) keeps the
//!   previous client; the problem is logged once and shown by
//!   [`Reloading::problem`] (and in the daemon's `STATUS=` line through
//!   [`problems`]) until the files are good again.
//! - Every 403 answer is shown to [`Refusals`] with (at most 64 KiB of)
//!   its body.
//!
//! Must not: block the async runtime (file reads and builds run in
//! `spawn_blocking`), nor hold a lock across a request.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use kube::client::Body;

use super::refusal::Refusals;
use super::{client_config, Config, Error, IN_CLUSTER_TOKEN};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every answer handed to the outer [`kube::Client`].
pub type AnswerBody = UnsyncBoxBody<Bytes, BoxError>;

/// How much of a 403 answer's body is read for [`Refusals`].
const REFUSAL_BODY_LIMIT: usize = 64 * 1024;
/// Request bodies up to this size are kept to be sent again after a 401
/// (those kube builds are in memory already; a larger streamed body is
/// sent once).
const REPLAY_LIMIT: u64 = 1024 * 1024;
/// A 401 makes the files be read again only when they were last read at
/// least this long ago.
const MIN_FORCED_INTERVAL: Duration = Duration::from_secs(1);
/// The in-cluster service account's CA certificate.
const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// What one file looked like: device, inode, size, mtime (seconds and
/// nanoseconds) of what its path leads to; `None`: cannot be looked at.
type Stamp = Option<(u64, u64, u64, i64, i64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// The files credentials are read from, each with its role
/// (`client-certificate`...), the kubeconfig first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Files(Vec<(&'static str, PathBuf)>);

impl Files {
    fn stamps(&self) -> Vec<Stamp> {
        self.0.iter().map(|(_, p)| stamp(p)).collect()
    }

    /// The files whose stamps differ, as `role path` words.
    fn changed(&self, old: &Files, old_stamps: &[Stamp], new_stamps: &[Stamp]) -> String {
        let before: BTreeMap<_, _> = old.0.iter().zip(old_stamps).collect();
        let changed: Vec<String> = self
            .0
            .iter()
            .zip(new_stamps)
            .filter(|(f, s)| before.get(f) != Some(s))
            .map(|((role, path), _)| format!("{role} {}", path.display()))
            .collect();
        changed.join(", ")
    }

    /// The first file that cannot be read or does not hold what its role
    /// needs, as a problem naming it. The contents are only glanced at
    /// (a PEM block of the right kind, a token): the build says the rest.
    fn unusable(&self) -> Option<String> {
        self.0.iter().find_map(|(role, path)| {
            let problem = match std::fs::read(path) {
                Err(e) => e.to_string(),
                Ok(text) => lacks(role, &text)?.to_string(),
            };
            Some(format!(
                "cannot read the {role} {}: {problem}",
                path.display()
            ))
        })
    }
}

/// What a file of `role` lacks, if it lacks what that role needs.
fn lacks(role: &str, text: &[u8]) -> Option<&'static str> {
    let has = |needle: &[u8]| text.windows(needle.len()).any(|w| w == needle);
    match role {
        "client-certificate" | "certificate-authority" | "service account CA"
            if !has(b"-----BEGIN CERTIFICATE-----") =>
        {
            Some("no PEM certificate in it")
        }
        "client-key" if !has(b"PRIVATE KEY-----") => Some("no PEM private key in it"),
        "tokenFile" | "service account token" if text.trim_ascii().is_empty() => {
            Some("it is empty")
        }
        _ => None,
    }
}

/// The files `config`'s credentials come from, and whose they are
/// (`kubeconfig <path>, user "<name>"`). Blocking: reads the kubeconfig.
fn named_files(config: &Config) -> (Files, String) {
    let Some(path) = &config.kubeconfig else {
        let files = vec![
            ("service account token", PathBuf::from(IN_CLUSTER_TOKEN)),
            ("service account CA", PathBuf::from(IN_CLUSTER_CA)),
        ];
        return (Files(files), "the in-cluster service account".into());
    };
    let mut files = vec![("kubeconfig", path.clone())];
    let Ok(kubeconfig) = kube::config::Kubeconfig::read_from(path) else {
        // The build that follows says why.
        return (Files(files), format!("kubeconfig {}", path.display()));
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| Some(&c.name) == kubeconfig.current_context.as_ref())
        .and_then(|c| c.context.clone());
    let user = context.as_ref().and_then(|c| c.user.clone());
    let cluster = context.as_ref().map(|c| c.cluster.clone());
    let auth = kubeconfig
        .auth_infos
        .iter()
        .find(|a| Some(&a.name) == user.as_ref())
        .and_then(|a| a.auth_info.as_ref());
    let ca = kubeconfig
        .clusters
        .iter()
        .find(|c| Some(&c.name) == cluster.as_ref())
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority.clone());
    let mut add = |role, file: Option<&String>| {
        if let Some(f) = file {
            files.push((role, dir.join(f)));
        }
    };
    if let Some(a) = auth {
        add("client-certificate", a.client_certificate.as_ref());
        add("client-key", a.client_key.as_ref());
        add("tokenFile", a.token_file.as_ref());
    }
    add("certificate-authority", ca.as_ref());
    let whose = match user {
        Some(u) => format!("kubeconfig {}, user {u:?}", path.display()),
        None => format!("kubeconfig {}", path.display()),
    };
    (Files(files), whose)
}

/// One built inner client and what it was built from.
struct Current {
    client: kube::Client,
    generation: u64,
    files: Files,
    /// The stamps last acted on (those of a failed build too, so that it
    /// is tried again only when something changes or after a 401).
    stamps: Vec<Stamp>,
    credentials: String,
    /// When the files were last read.
    built_at: Instant,
}

/// A built client, or why not, with what the files looked like before
/// they were read.
struct Built {
    client: Result<kube::Client, String>,
    files: Files,
    stamps: Vec<Stamp>,
    credentials: String,
}

/// Reads the files and builds a client, off the async runtime.
async fn build(config: &Config) -> Result<Built, Error> {
    let config = config.clone();
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let (files, credentials) = named_files(&config);
        // Looked at before reading: a change while reading is seen next
        // time.
        let stamps = files.stamps();
        let client = match files.unusable() {
            Some(problem) => Err(problem),
            None => runtime
                .block_on(client_config(&config))
                .and_then(|c| {
                    let _entered = runtime.enter();
                    kube::Client::try_from(c).map_err(Error::Client)
                })
                .map_err(|e| format!("cannot use {credentials}: {}", crate::causes::chain(&e))),
        };
        Built {
            client,
            files,
            stamps,
            credentials,
        }
    })
    .await
    .map_err(|e| Error::Client(kube::Error::Service(Box::new(e))))
}

/// What [`Reloading`] clones share.
struct Shared {
    config: Config,
    current: Mutex<Current>,
    /// One build at a time.
    building: tokio::sync::Mutex<()>,
    /// The problem of the last build, while it lasts.
    problem: Mutex<Option<String>>,
    refusals: Arc<Refusals>,
}

/// The tower service under the outer [`kube::Client`]: each request goes
/// to the current inner client, built again when the credentials' files
/// change or after a 401.
#[derive(Clone)]
pub struct Reloading {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Reloading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("problem", &self.problem())
            .finish_non_exhaustive()
    }
}

impl Reloading {
    /// Builds the first client; its failure is start-up's (the same
    /// errors as [`client_config`]).
    pub async fn start(config: &Config, refusals: Arc<Refusals>) -> Result<Self, Error> {
        let (files, credentials) = {
            let c = config.clone();
            tokio::task::spawn_blocking(move || named_files(&c))
                .await
                .map_err(|e| Error::Client(kube::Error::Service(Box::new(e))))?
        };
        let stamps = {
            let f = files.clone();
            tokio::task::spawn_blocking(move || f.stamps())
                .await
                .map_err(|e| Error::Client(kube::Error::Service(Box::new(e))))?
        };
        let client_config = client_config(config).await?;
        let client = kube::Client::try_from(client_config).map_err(Error::Client)?;
        let current = Current {
            client,
            generation: 0,
            files,
            stamps,
            credentials,
            built_at: Instant::now(),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                config: config.clone(),
                current: Mutex::new(current),
                building: tokio::sync::Mutex::new(()),
                problem: Mutex::new(None),
                refusals,
            }),
        })
    }

    /// The client every caller uses, on top of this service.
    pub fn client(&self) -> kube::Client {
        let namespace = self.shared.current().0.default_namespace().to_string();
        kube::Client::new(self.clone(), namespace)
    }

    /// Why the credentials' files could not be read again, while that
    /// lasts (the previous client is used meanwhile).
    pub fn problem(&self) -> Option<String> {
        self.shared
            .problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Shared {
    fn built_at(&self) -> Instant {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .built_at
    }

    fn current(&self) -> (kube::Client, u64, String) {
        let c = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (c.client.clone(), c.generation, c.credentials.clone())
    }

    /// Builds the client again if the files changed since the last look.
    async fn refresh(self: &Arc<Self>) -> Result<(), BoxError> {
        let files = {
            let c = self.current.lock().unwrap_or_else(|e| e.into_inner());
            c.files.clone()
        };
        let stamps = tokio::task::spawn_blocking(move || files.stamps()).await?;
        let (generation, same) = {
            let c = self.current.lock().unwrap_or_else(|e| e.into_inner());
            (c.generation, c.stamps == stamps)
        };
        if !same {
            self.rebuild(generation, None).await?;
        }
        Ok(())
    }

    /// Builds the client again unless another caller did since
    /// `generation`; `why`: a reason other than changed files.
    async fn rebuild(self: &Arc<Self>, generation: u64, why: Option<&str>) -> Result<(), BoxError> {
        let _building = self.building.lock().await;
        if self.current().1 != generation {
            return Ok(());
        }
        if why.is_some() && self.built_at().elapsed() < MIN_FORCED_INTERVAL {
            // Refused again right after a build: the files are what they
            // were a moment ago, reading them again would not help.
            return Ok(());
        }
        let built = build(&self.config).await?;
        let mut c = self.current.lock().unwrap_or_else(|e| e.into_inner());
        c.built_at = Instant::now();
        let changed = built.files.changed(&c.files, &c.stamps, &built.stamps);
        c.stamps = built.stamps;
        c.generation += 1;
        match built.client {
            Ok(client) => {
                // The old client goes: its idle connections close.
                c.client = client;
                c.files = built.files;
                c.credentials = built.credentials;
                if changed.is_empty() {
                    tracing::debug!(
                        reason = why.unwrap_or(""),
                        "Kubernetes credentials read again, unchanged"
                    );
                } else {
                    tracing::info!(changed = %changed, "Kubernetes credentials read again");
                }
                self.set_problem(None);
            }
            Err(problem) => self.set_problem(Some(problem)),
        }
        Ok(())
    }

    fn set_problem(&self, problem: Option<String>) {
        let mut current = self.problem.lock().unwrap_or_else(|e| e.into_inner());
        if *current == problem {
            return;
        }
        match &problem {
            Some(p) => {
                tracing::warn!(problem = %p, "cannot read the Kubernetes credentials again; still using those read before");
            }
            None if current.is_some() => {
                tracing::info!("Kubernetes credentials readable again");
            }
            None => {}
        }
        *current = problem;
    }

    /// One request: sent with the current credentials, once more after a
    /// 401 with those read again.
    async fn send(self: Arc<Self>, req: Request<Body>) -> Result<Response<AnswerBody>, BoxError> {
        self.refresh().await?;
        let (parts, body) = req.into_parts();
        let (body, replay) = replayable(body).await?;
        let (client, generation, mut credentials) = self.current();
        let mut answer = client.send(copy(&parts, body)).await?;
        if answer.status() == StatusCode::UNAUTHORIZED {
            if let Some(replay) = replay {
                // Files changed since the look before sending (kubelet
                // renamed its symlink meanwhile): read again whenever;
                // else read again unless that was just done.
                self.refresh().await?;
                self.rebuild(generation, Some("401 Unauthorized")).await?;
                let (client, now, whose) = self.current();
                if now != generation {
                    credentials = whose;
                    answer = client.send(copy(&parts, replay)).await?;
                }
            }
        }
        if answer.status() == StatusCode::FORBIDDEN {
            let path = parts.uri.path_and_query().map_or("", |p| p.as_str());
            return Ok(self
                .refused(parts.method.as_str(), path, answer, &credentials)
                .await);
        }
        Ok(answer.map(|b| b.map_err(BoxError::from).boxed_unsync()))
    }

    /// Shows a 403 answer to [`Refusals`], then hands it on whole.
    async fn refused(
        &self,
        method: &str,
        path: &str,
        answer: Response<Body>,
        credentials: &str,
    ) -> Response<AnswerBody> {
        let (parts, mut body) = answer.into_parts();
        let mut head = BytesMut::new();
        let mut failed = None;
        let mut ended = false;
        while head.len() < REFUSAL_BODY_LIMIT {
            match body.frame().await {
                None => {
                    ended = true;
                    break;
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        head.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    failed = Some(BoxError::from(e));
                    break;
                }
            }
        }
        let seen = &head[..head.len().min(REFUSAL_BODY_LIMIT)];
        self.refusals
            .observe(method, path, parts.status.as_u16(), seen, credentials);
        let head = head.freeze();
        let body = match (failed, ended) {
            (None, true) => Full::new(head).map_err(BoxError::from).boxed_unsync(),
            (failed, _) => {
                let first = futures_util::stream::iter([Ok(Frame::data(head))]);
                let rest: Pin<Box<dyn futures_util::Stream<Item = _> + Send>> = match failed {
                    Some(e) => Box::pin(futures_util::stream::iter([Err(e)])),
                    None => Box::pin(BodyStream::new(body.map_err(BoxError::from))),
                };
                StreamBody::new(first.chain(rest)).boxed_unsync()
            }
        };
        Response::from_parts(parts, body)
    }
}

/// The body, and a copy to send again when it is small enough to keep.
async fn replayable(body: Body) -> Result<(Body, Option<Body>), BoxError> {
    if let Some(copy) = body.try_clone() {
        return Ok((body, Some(copy)));
    }
    if hyper::body::Body::size_hint(&body)
        .upper()
        .is_some_and(|n| n <= REPLAY_LIMIT)
    {
        let bytes = body.collect_bytes().await?;
        return Ok((Body::from(bytes.clone()), Some(Body::from(bytes))));
    }
    Ok((body, None))
}

/// A request with `parts`' method, URI, version and headers.
fn copy(parts: &hyper::http::request::Parts, body: Body) -> Request<Body> {
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    req
}

impl tower_service::Service<Request<Body>> for Reloading {
    type Response = Response<AnswerBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        Box::pin(self.shared.clone().send(req))
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
