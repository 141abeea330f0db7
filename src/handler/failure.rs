//! The failures the handler answers with, from each part's error: the
//! kind (for the HTTP status), the CNI code and the message.

use crate::api::code;
use crate::cni::{self, ErrorKind};
use crate::k8s::{self, PodRef};
use crate::selection::pod;
use crate::server::{Failure, FailureKind};

/// The engine's error as it is.
pub(super) fn failure(e: cni::Error) -> Failure {
    let kind = match e.kind {
        ErrorKind::Invalid => FailureKind::InvalidRequest,
        ErrorKind::Failed => FailureKind::Failed,
        ErrorKind::Internal => FailureKind::Internal,
    };
    Failure::new(kind, e.code, e.msg).with_details(e.details)
}

/// Code 11: worth trying again later.
pub(super) fn unavailable(msg: impl Into<String>) -> Failure {
    Failure::new(FailureKind::Unavailable, code::TRY_AGAIN_LATER, msg)
}

/// Code 7: a network configuration that cannot be used.
pub(super) fn bad_config(msg: impl Into<String>) -> Failure {
    Failure::new(FailureKind::Failed, code::INVALID_NETWORK_CONFIG, msg)
}

/// Code 4: the call's environment is wrong.
pub(super) fn bad_env(msg: impl Into<String>) -> Failure {
    Failure::new(FailureKind::InvalidRequest, code::INVALID_ENVIRONMENT, msg)
}

/// Code 999, ours.
pub(super) fn internal(msg: impl Into<String>) -> Failure {
    Failure::new(FailureKind::Internal, code::INTERNAL, msg)
}

/// The Kubernetes API's error about `pod`: a pod recreated under its
/// name is the call's environment, an outage worth a retry, anything
/// else ours.
pub(super) fn api_failure(pod: &PodRef, e: k8s::Error) -> Failure {
    let prefix = format!("pod {}/{}", pod.namespace, pod.name);
    let msg = format!("{prefix}: {}", crate::causes::chain(&e));
    match e {
        k8s::Error::UidMismatch { .. } => Failure::new(
            FailureKind::Failed,
            code::INVALID_ENVIRONMENT,
            format!("{prefix}: {e}"),
        ),
        e if e.is_transient() => unavailable(format!("{msg}; try again later")),
        _ => Failure::new(FailureKind::Failed, code::INTERNAL, msg),
    }
}

/// A pod's networks that cannot be planned: a kubelet that did not answer
/// is worth a retry, one whose answer is unusable is not; a configured
/// network keeps the engine's error; everything else is the pod's or a
/// NAD's configuration.
pub(super) fn plan_failure(e: pod::Error<cni::Error>) -> Failure {
    match e {
        pod::Error::Load(e) => failure(e),
        e if e.is_transient() => unavailable(format!("{e}; try again later")),
        e @ pod::Error::Devices { .. } => {
            Failure::new(FailureKind::Failed, code::INTERNAL, e.to_string())
        }
        e => bad_config(e.to_string()),
    }
}
