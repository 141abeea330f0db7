//! A failed engine operation as a CNI error: its kind (for the caller's
//! status), code, message and details, and how several DEL or GC failures
//! are reported as one.

use std::fmt;

use crate::api::{code, Command};
use crate::cni::{exec, state};
use crate::netconf;
use crate::netconf::Invocation;

/// What kind of failure an [`Error`] is, for the caller's status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The call or a network configuration is invalid: nothing ran.
    Invalid,
    /// A plugin failed, or the operation could not complete.
    Failed,
    /// The daemon's own state could not be read or written.
    Internal,
}

/// A failed engine operation, as a CNI error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl Error {
    pub fn new(kind: ErrorKind, code: u32, msg: impl Into<String>) -> Self {
        Self {
            kind,
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub(super) fn details(mut self, d: impl Into<String>) -> Self {
        self.details = d.into();
        self
    }

    pub(super) fn config(e: netconf::ConfigError) -> Self {
        Self::new(
            ErrorKind::Invalid,
            code::INVALID_NETWORK_CONFIG,
            e.to_string(),
        )
    }

    /// A file of the state (or of multus's caches) that could not be read
    /// or written.
    pub(super) fn state(e: state::Error) -> Self {
        Self::new(ErrorKind::Internal, code::IO_FAILURE, e.to_string())
    }

    pub(super) fn plugin(command: Command, network: &str, e: exec::Error) -> Self {
        Self::new(
            ErrorKind::Failed,
            e.code(),
            format!("{command} network {network:?}: {e}"),
        )
        .details(e.details())
    }

    /// Several errors as one: the first one's code, every message.
    /// `Ok` when `errors` is empty, else all of them as one [`Error::join`].
    pub(super) fn all_ok(
        command: Command,
        what: impl FnOnce() -> String,
        errors: Vec<Error>,
    ) -> Result<(), Self> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Self::join(command, &what(), errors))
        }
    }

    /// [`Error::all_ok`] for the DEL of the attachment `inv` names.
    pub(super) fn dels_ok(inv: &Invocation, errors: Vec<Error>) -> Result<(), Self> {
        Self::all_ok(
            Command::Del,
            || format!("container {:?} ifname {:?}", inv.container_id, inv.ifname),
            errors,
        )
    }

    pub(super) fn join(command: Command, what: &str, errors: Vec<Error>) -> Self {
        let first = errors.first().map(|e| e.code).unwrap_or(code::INTERNAL);
        let n = errors.len();
        let all: Vec<String> = errors
            .iter()
            .map(|e| {
                if e.details.is_empty() {
                    e.msg.clone()
                } else {
                    format!("{} ({})", e.msg, e.details)
                }
            })
            .collect();
        Self::new(
            ErrorKind::Failed,
            first,
            format!(
                "{command} of {what} failed with {n} error(s): {}",
                all.join("; ")
            ),
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}
