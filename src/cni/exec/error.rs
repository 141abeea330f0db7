//! Why running a plugin did not give a usable answer, and the CNI code
//! each failure is reported with.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::Plugin;
use crate::api::code;

/// A plugin's CNI error object as it printed it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PluginError {
    #[serde(default)]
    pub code: u32,
    #[serde(default)]
    pub msg: String,
    #[serde(default)]
    pub details: String,
}

/// Why running a plugin did not give a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("plugin {plugin:?} not found in {}", dirs.join(":"))]
    NotFound { plugin: String, dirs: Vec<String> },
    #[error("plugin {plugin:?} ({}) could not be started: {source}", path.display())]
    Spawn {
        plugin: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("plugin {plugin:?} ({}) timed out after {} during {command}; its process group was killed", path.display(), crate::duration::format(*after))]
    TimedOut {
        plugin: String,
        path: PathBuf,
        command: &'static str,
        after: Duration,
    },
    #[error("plugin {plugin:?} failed: {}", error.msg)]
    Failed { plugin: String, error: PluginError },
    #[error("plugin {plugin:?} ({}) failed with no error message: {status}", path.display())]
    NoMessage {
        plugin: String,
        path: PathBuf,
        status: String,
        stderr: String,
    },
    #[error("plugin {plugin:?} ({}) failed ({status}) and printed something that is not a CNI error", path.display())]
    BadError {
        plugin: String,
        path: PathBuf,
        status: String,
        stdout: String,
    },
    #[error("plugin {plugin:?} ({}) printed an invalid result: {reason}", path.display())]
    InvalidResult {
        plugin: String,
        path: PathBuf,
        reason: String,
        stdout: String,
    },
    #[error("plugin {plugin:?} ({}) printed more than {cap} bytes", path.display())]
    TooMuchOutput {
        plugin: String,
        path: PathBuf,
        cap: usize,
    },
    #[error("plugin {plugin:?} ({}): {what}: {source}", path.display())]
    Io {
        plugin: String,
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// What had to happen before the plugin may read its configuration
    /// (the record reaching the disk) failed; the plugin was stopped
    /// before it read anything.
    #[error("plugin {plugin:?} was stopped before it read its configuration: {why}")]
    Held { plugin: String, why: String },
    /// plexusd is stopping and its grace ran out: the plugin was killed,
    /// or not started.
    #[error("plugin {plugin:?} was cut off: plexusd is stopping and its shutdownTimeout ran out")]
    Stopped { plugin: String },
}

impl Error {
    /// The CNI error code this failure is reported with.
    pub fn code(&self) -> u32 {
        match self {
            // 0 is "unknown": a plugin that printed none failed all the same.
            Error::Failed { error, .. } if error.code == 0 => code::INTERNAL,
            Error::Failed { error, .. } => error.code,
            Error::InvalidResult { .. } | Error::BadError { .. } => code::DECODING_FAILURE,
            Error::Io { .. } | Error::Held { .. } => code::IO_FAILURE,
            // Hung or slow, not broken: the runtime retries the call.
            Error::TimedOut { .. } | Error::Stopped { .. } => code::TRY_AGAIN_LATER,
            _ => code::INTERNAL,
        }
    }

    /// Extra detail for the CNI error's `details`.
    pub fn details(&self) -> String {
        match self {
            Error::Failed { error, .. } => error.details.clone(),
            Error::NoMessage { stderr, .. } => stderr.clone(),
            Error::BadError { stdout, .. } | Error::InvalidResult { stdout, .. } => stdout.clone(),
            _ => String::new(),
        }
    }
}

/// An [`Error::Io`] of `plugin` while doing `what`.
pub(super) fn io_error(plugin: &Plugin, what: &'static str) -> impl FnOnce(io::Error) -> Error {
    let (plugin, path) = (plugin.name.clone(), plugin.path.clone());
    move |source| Error::Io {
        plugin,
        path,
        what,
        source,
    }
}
