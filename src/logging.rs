//! Log output: journald (structured fields) when stderr is connected to the
//! journal, else plain text on stderr, plus an optional log file.

use std::fs::OpenOptions;
use std::io::{self, IsTerminal};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

pub const ENV_JOURNAL_STREAM: &str = "JOURNAL_STREAM";

/// Log verbosity; accepts the multus names (`verbose`, `panic`) too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "trace" => Self::Trace,
            "debug" => Self::Debug,
            "info" | "verbose" => Self::Info,
            "warn" | "warning" => Self::Warn,
            "error" | "panic" => Self::Error,
            _ => return None,
        })
    }

    fn filter(self) -> LevelFilter {
        match self {
            Self::Trace => LevelFilter::TRACE,
            Self::Debug => LevelFilter::DEBUG,
            Self::Info => LevelFilter::INFO,
            Self::Warn => LevelFilter::WARN,
            Self::Error => LevelFilter::ERROR,
        }
    }
}

/// Settings of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub level: Level,
    pub file: Option<PathBuf>,
    pub to_stderr: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open the log file {path}")]
    OpenFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Whether `JOURNAL_STREAM` names the file stderr is connected to (the
/// variable alone is inherited and survives redirections).
pub fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match nix::sys::stat::fstat(io::stderr().as_fd()) {
        Ok(st) => st.st_dev == dev && st.st_ino == ino,
        Err(_) => false,
    }
}

/// Installs the global subscriber. Call once, early in `main`.
pub fn init(config: &Config) -> Result<(), Error> {
    let filter = config.level.filter();
    let journal =
        config.to_stderr && stderr_is_journal(std::env::var(ENV_JOURNAL_STREAM).ok().as_deref());
    let journald = journal
        .then(|| tracing_journald::layer().ok())
        .flatten()
        .map(|l| l.with_filter(filter));
    let stderr = (config.to_stderr && journald.is_none()).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(io::stderr)
            .with_ansi(io::stderr().is_terminal())
            .with_target(false)
            .with_filter(filter)
    });
    let file = match &config.file {
        None => None,
        Some(path) => {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .map_err(|source| Error::OpenFile {
                    path: path.clone(),
                    source,
                })?;
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(Mutex::new(f))
                    .with_ansi(false)
                    .with_target(false)
                    .with_filter(filter),
            )
        }
    };
    // A second init (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(journald)
        .with(stderr)
        .with(file)
        .try_init();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_should_accept_multus_names() {
        assert_eq!(Level::parse("verbose"), Some(Level::Info));
        assert_eq!(Level::parse("panic"), Some(Level::Error));
        assert_eq!(Level::parse("DEBUG"), Some(Level::Debug));
        assert_eq!(Level::parse("chatty"), None);
    }

    #[test]
    fn journal_stream_mismatch_should_not_count() {
        assert!(!stderr_is_journal(None));
        assert!(!stderr_is_journal(Some("garbage")));
        assert!(!stderr_is_journal(Some("1:1")));
    }
}
