//! Method + path -> handler, and the one place where outcomes become HTTP
//! status codes and CNI error JSON.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tracing::{info_span, warn, Instrument};

use super::{Call, Failure, FailureKind, Handler, Readiness, Reply, Shared};
use crate::api::{self, code, CniError, Command};
use crate::limit::{BodyBytes, LaneError, LaneKey, Permit, Slots, Turn};
use crate::metrics::{LatencyLabels, MultusLabels, RejectLabels, RequestLabels};

type Body = Full<Bytes>;

/// Known endpoints, so metric labels stay bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Cni,
    Delegate,
    Healthz,
    Readyz,
    Metrics,
    Attachments,
    NotFound,
}

impl Endpoint {
    fn from_path(path: &str) -> Self {
        match path {
            api::PATH_CNI => Self::Cni,
            api::PATH_DELEGATE => Self::Delegate,
            api::PATH_HEALTHZ => Self::Healthz,
            api::PATH_READYZ => Self::Readyz,
            api::PATH_METRICS => Self::Metrics,
            p if p.starts_with(api::PATH_ATTACHMENTS) => Self::Attachments,
            _ => Self::NotFound,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Cni => api::PATH_CNI,
            Self::Delegate => api::PATH_DELEGATE,
            Self::Healthz => api::PATH_HEALTHZ,
            Self::Readyz => api::PATH_READYZ,
            Self::Metrics => api::PATH_METRICS,
            Self::Attachments => "/attachments",
            Self::NotFound => "NotFound",
        }
    }

    fn allowed(self) -> &'static [Method] {
        match self {
            Self::Cni | Self::Delegate => &[Method::POST],
            Self::Healthz | Self::Readyz => &[Method::GET, Method::POST],
            Self::Metrics | Self::Attachments => &[Method::GET],
            Self::NotFound => &[],
        }
    }
}

/// Bounded label for a CNI command taken from a request.
fn command_label(cmd: Option<&str>) -> &'static str {
    match cmd {
        Some(c) => Command::parse(c).map_or("other", Command::as_str),
        None => "",
    }
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::DELETE => "delete",
        Method::HEAD => "head",
        _ => "other",
    }
}

/// Outcome of one request before it is turned into a response.
enum Outcome {
    Empty,
    EmptyJson,
    Json(Vec<u8>),
    Text(&'static str, String),
    Fail(StatusCode, &'static str, CniError),
}

pub(super) async fn route<H: Handler>(
    shared: Arc<Shared<H>>,
    req: Request<Incoming>,
    accepted: Instant,
) -> Result<Response<Body>, Infallible> {
    let endpoint = Endpoint::from_path(req.uri().path());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let mut command = "";

    let outcome = if endpoint == Endpoint::NotFound {
        fail(
            StatusCode::NOT_FOUND,
            "not_found",
            CniError::new(code::INTERNAL, format!("no such endpoint: {path}")),
        )
    } else if !endpoint.allowed().contains(&method) {
        fail(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            CniError::new(
                code::INTERNAL,
                format!("method {method} is not allowed on {path}"),
            ),
        )
    } else {
        match read_body(&shared, req, accepted).await {
            Err(o) => o,
            Ok((body, held)) => match endpoint {
                Endpoint::Healthz => Outcome::Empty,
                Endpoint::Readyz => readyz(&shared),
                Endpoint::Metrics => {
                    Outcome::Text(crate::metrics::CONTENT_TYPE, shared.metrics.render())
                }
                Endpoint::Cni | Endpoint::Delegate => {
                    cni(&shared, endpoint, body, held, &mut command).await
                }
                Endpoint::Attachments => attachments(&shared, &path).await,
                Endpoint::NotFound => Outcome::Empty,
            },
        }
    };

    let (response, outcome_label, status) = respond(outcome, endpoint);
    let labels = RequestLabels {
        endpoint: endpoint.label(),
        command,
        outcome: outcome_label,
    };
    shared.metrics.requests.get_or_create(&labels).inc();
    shared
        .metrics
        .latency
        .get_or_create(&LatencyLabels {
            endpoint: endpoint.label(),
            command,
        })
        .observe(accepted.elapsed().as_secs_f64());
    shared
        .metrics
        .multus_requests
        .get_or_create(&MultusLabels {
            handler: endpoint.label(),
            code: status.as_u16().to_string(),
            method: method_label(&method),
        })
        .inc();
    shared.activity.served_one();
    Ok(response)
}

/// `/readyz`: 503 while draining or not ready, else 200 (naming a
/// degradation, if any).
fn readyz<H: Handler>(shared: &Shared<H>) -> Outcome {
    if shared.draining() {
        return fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            CniError::new(
                code::TRY_AGAIN_LATER,
                "plexusd is shutting down; try again later",
            ),
        );
    }
    match shared.handler.readiness() {
        Readiness::Ready => Outcome::EmptyJson,
        Readiness::Starting(why) => fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting",
            CniError::new(code::TRY_AGAIN_LATER, why),
        ),
        Readiness::NotReady(why) => fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            CniError::new(code::TRY_AGAIN_LATER, why),
        ),
        Readiness::Degraded(why) => Outcome::Json(
            serde_json::json!({ "degraded": why })
                .to_string()
                .into_bytes(),
        ),
    }
}

fn fail(status: StatusCode, label: &'static str, error: CniError) -> Outcome {
    Outcome::Fail(status, label, error)
}

/// Reads the whole body within the connection's read deadline and the
/// size cap, holding its bytes in the body budget: the declared length
/// before reading, else each chunk as it arrives. The budget is held until
/// the returned [`BodyBytes`] is dropped.
async fn read_body<H>(
    shared: &Shared<H>,
    req: Request<Incoming>,
    accepted: Instant,
) -> Result<(Bytes, BodyBytes), Outcome> {
    let max = shared.config.max_body_bytes;
    let declared = declared_length(&req);
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large(max));
    }
    let declared = declared.map_or(0, |n| n as usize);
    let deadline = tokio::time::Instant::from_std(accepted + shared.config.read_timeout);
    let mut reading = Reading {
        held: shared.budget.hold(),
        buf: BytesMut::new(),
        waiting_for_budget: false,
    };
    let read = reading.read(req.into_body(), declared, max);
    match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(())) => Ok((reading.buf.freeze(), reading.held)),
        Ok(Err(BodyError::TooLarge)) => Err(too_large(max)),
        Ok(Err(BodyError::Read(e))) => Err(fail(
            StatusCode::BAD_REQUEST,
            "bad_request",
            CniError::new(
                code::IO_FAILURE,
                format!("cannot read the request body: {e}"),
            ),
        )),
        Err(_) => Err(read_timed_out(shared, reading.waiting_for_budget)),
    }
}

/// The `Content-Length` of `req`, when it has a valid one.
fn declared_length<B>(req: &Request<B>) -> Option<u64> {
    req.headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// A body being read, with the budget held for it.
struct Reading {
    held: BodyBytes,
    buf: BytesMut,
    /// Whether the read waits for room in the budget (rather than for the
    /// client), for the answer when the deadline passes.
    waiting_for_budget: bool,
}

impl Reading {
    /// Reads `body` into `buf`, holding `declared` bytes first, then any
    /// further chunk (chunked, or more than declared) as it comes.
    async fn read(
        &mut self,
        mut body: Incoming,
        declared: usize,
        max: usize,
    ) -> Result<(), BodyError> {
        self.grow(declared).await;
        self.buf.reserve(declared);
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(BodyError::Read)?.into_data() else {
                continue;
            };
            let len = self.buf.len() + data.len();
            if len > max {
                return Err(BodyError::TooLarge);
            }
            if len > self.held.len() {
                self.grow(len - self.held.len()).await;
            }
            self.buf.extend_from_slice(&data);
        }
        Ok(())
    }

    async fn grow(&mut self, by: usize) {
        self.waiting_for_budget = true;
        self.held.grow(by).await;
        self.waiting_for_budget = false;
    }
}

/// Why reading a body stopped short.
enum BodyError {
    TooLarge,
    Read(hyper::Error),
}

fn too_large(max: usize) -> Outcome {
    fail(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("request body is larger than {max} bytes"),
        ),
    )
}

/// The answer when the body did not arrive within the read timeout: the
/// budget had no room for it (503, try again later), or the client was
/// too slow (408).
fn read_timed_out<H>(shared: &Shared<H>, waiting_for_budget: bool) -> Outcome {
    let reason = if waiting_for_budget {
        "body_budget"
    } else {
        "read_timeout"
    };
    shared
        .metrics
        .rejected
        .get_or_create(&RejectLabels { reason })
        .inc();
    let within = crate::duration::format(shared.config.read_timeout);
    if waiting_for_budget {
        fail(
            StatusCode::SERVICE_UNAVAILABLE,
            "rejected",
            CniError::new(
                code::TRY_AGAIN_LATER,
                format!(
                    "too many request bodies in memory: no room for this one within {within}; \
                     try again later"
                ),
            ),
        )
    } else {
        fail(
            StatusCode::REQUEST_TIMEOUT,
            "read_timeout",
            CniError::new(
                code::IO_FAILURE,
                format!("the request did not arrive within {within}"),
            ),
        )
    }
}

/// A CNI request (`/cni`, or `/delegate` for hot-plug): parsed, admitted
/// (its container's turn, then a slot), run as work of its own, answered.
/// `command` is set to the request's command label once it is known.
async fn cni<H: Handler>(
    shared: &Arc<Shared<H>>,
    endpoint: Endpoint,
    body: Bytes,
    held: BodyBytes,
    command: &mut &'static str,
) -> Outcome {
    let parsed = serde_json::from_slice::<api::Request>(&body);
    // The parsed request is what waits for admission; the budget (`held`)
    // still counts it until the work takes it.
    drop(body);
    let request: api::Request = match parsed {
        Ok(r) => r,
        Err(e) => {
            return fail(
                StatusCode::BAD_REQUEST,
                "bad_request",
                CniError::new(
                    code::DECODING_FAILURE,
                    format!("the request body is not a valid CNI request: {e}"),
                ),
            )
        }
    };
    *command = command_label(request.env_var("CNI_COMMAND"));
    let span = info_span!(
        "request",
        endpoint = endpoint.label(),
        command = request.env_var("CNI_COMMAND").unwrap_or(""),
        container_id = request.env_var("CNI_CONTAINERID").unwrap_or(""),
        netns = request.env_var("CNI_NETNS").unwrap_or(""),
        ifname = request.env_var("CNI_IFNAME").unwrap_or(""),
    );
    let call = match endpoint {
        Endpoint::Delegate => Call::Delegate,
        _ => Call::Cni,
    };
    async move {
        let (turn, permit) = match admit(shared, &request).await {
            Ok(admitted) => admitted,
            Err(f) => return failure(f),
        };
        let work = shared.spawn_work(call, request, permit, turn, tracing::Span::current());
        drop(held);
        let result = match work.await {
            Ok(r) => r,
            Err(e) => Err(Failure::new(
                FailureKind::Internal,
                code::INTERNAL,
                format!("the CNI work failed: {e}"),
            )),
        };
        reply_outcome(result)
    }
    .instrument(span)
    .await
}

/// Admits `request`: its container's turn first, then a slot of its
/// command's pool (a DEL's never waits behind ADDs), both within one
/// queueTimeout, so a container whose calls wait for each other holds one
/// slot at most. A client that hangs up meanwhile gives up its place
/// (this future is dropped): nothing has started yet.
async fn admit<H>(
    shared: &Shared<H>,
    request: &api::Request,
) -> Result<(Option<Turn>, Permit), Failure> {
    let deadline = tokio::time::Instant::now() + shared.admission.queue_timeout();
    let lane = LaneKey::of(
        request.env_var("CNI_COMMAND"),
        request.env_var("CNI_CONTAINERID"),
    );
    let turn = match lane {
        None => None,
        Some(key) => match shared.lanes.turn(key, deadline).await {
            Ok(t) => Some(t),
            Err(e) => {
                let reason = match e {
                    LaneError::Busy { .. } => "container_busy",
                    LaneError::Timeout { .. } => "container_wait",
                };
                shared
                    .metrics
                    .rejected
                    .get_or_create(&RejectLabels { reason })
                    .inc();
                return Err(not_admitted(e));
            }
        },
    };
    let pool = Slots::of(request.env_var("CNI_COMMAND"));
    match shared.admission.admit_to(pool, deadline).await {
        Ok(permit) => Ok((turn, permit)),
        Err(e) => Err(not_admitted(e)),
    }
}

fn not_admitted(e: impl std::fmt::Display) -> Failure {
    warn!(cause = %e, "request not admitted");
    Failure::new(
        FailureKind::Unavailable,
        code::TRY_AGAIN_LATER,
        e.to_string(),
    )
}

/// The answer of finished CNI work.
fn reply_outcome(result: Result<Reply, Failure>) -> Outcome {
    match result {
        Ok(Reply::Done) => Outcome::Empty,
        Ok(Reply::Result(result)) => match serde_json::to_vec(&api::AddResponse { result }) {
            Ok(body) => Outcome::Json(body),
            Err(e) => failure(Failure::new(
                FailureKind::Internal,
                code::INTERNAL,
                format!("cannot encode the result: {e}"),
            )),
        },
        Err(f) => {
            warn!(code = f.error.code, msg = %f.error.msg, "request failed");
            failure(f)
        }
    }
}

async fn attachments<H: Handler>(shared: &Shared<H>, path: &str) -> Outcome {
    let id = path.strip_prefix(api::PATH_ATTACHMENTS).unwrap_or("");
    let not_found = || {
        fail(
            StatusCode::NOT_FOUND,
            "not_found",
            CniError::new(
                code::UNKNOWN_CONTAINER,
                format!("nothing is recorded for container {id:?}"),
            ),
        )
    };
    if id.is_empty() || id.contains('/') {
        return not_found();
    }
    match shared.handler.attachments(id.to_string()).await {
        Ok(Some(v)) => match serde_json::to_vec_pretty(&v) {
            Ok(body) => Outcome::Json(body),
            Err(e) => failure(Failure::new(
                FailureKind::Internal,
                code::INTERNAL,
                format!("cannot encode the attachments: {e}"),
            )),
        },
        Ok(None) => not_found(),
        Err(f) => failure(f),
    }
}

fn failure(f: Failure) -> Outcome {
    let (status, label) = match f.kind {
        FailureKind::InvalidRequest => (StatusCode::BAD_REQUEST, "invalid"),
        FailureKind::Failed => (StatusCode::BAD_REQUEST, "error"),
        FailureKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "rejected"),
        FailureKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    };
    fail(status, label, f.error)
}

/// The answer of the TCP metrics listener.
pub(super) fn metrics_only<B>(
    metrics: &crate::metrics::Metrics,
    req: &Request<B>,
) -> Response<Body> {
    let outcome = if req.uri().path() != api::PATH_METRICS {
        fail(
            StatusCode::NOT_FOUND,
            "not_found",
            CniError::new(
                code::INTERNAL,
                format!("no such endpoint: {}", req.uri().path()),
            ),
        )
    } else if req.method() != Method::GET {
        fail(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            CniError::new(code::INTERNAL, "only GET is allowed on /metrics"),
        )
    } else {
        Outcome::Text(crate::metrics::CONTENT_TYPE, metrics.render())
    };
    respond(outcome, Endpoint::Metrics).0
}

fn respond(outcome: Outcome, endpoint: Endpoint) -> (Response<Body>, &'static str, StatusCode) {
    const JSON: HeaderValue = HeaderValue::from_static("application/json");
    let (status, label, content_type, body) = match outcome {
        Outcome::Empty => (StatusCode::OK, "success", None, Bytes::new()),
        Outcome::EmptyJson => (StatusCode::OK, "success", Some(JSON), Bytes::new()),
        Outcome::Json(b) => (StatusCode::OK, "success", Some(JSON), Bytes::from(b)),
        Outcome::Text(ct, s) => (
            StatusCode::OK,
            "success",
            Some(HeaderValue::from_static(ct)),
            Bytes::from(s),
        ),
        Outcome::Fail(status, label, err) => {
            (status, label, Some(JSON), Bytes::from(err.to_json()))
        }
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    if let Some(ct) = content_type {
        response.headers_mut().insert(CONTENT_TYPE, ct);
    }
    if status == StatusCode::METHOD_NOT_ALLOWED {
        let allow = match endpoint.allowed() {
            [Method::POST] => "POST",
            [Method::GET] => "GET",
            _ => "GET, POST",
        };
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static(allow));
    }
    (response, label, status)
}
