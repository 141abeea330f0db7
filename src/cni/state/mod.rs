//! What the engine keeps in `<stateDir>`, one file per thing:
//!
//! - `attachments/<id>.json`: a container's record, holding everything DEL
//!   needs (each network's config as used at ADD, interface names, results,
//!   CNI_ARGS, capability arguments), so DEL works after a restart, a
//!   crash, or the removal of the network's config file.
//! - `attachments/damaged/<id>/<unix time>.json`: a record that could not
//!   be read, moved aside as it was (bytes, symbolic link or directory). The
//!   directory also tells DEL that the container's record was lost, so DEL
//!   falls back to the configured networks for it.
//! - `locks/<id>.lock`: flock'ed by every plexusd on this stateDir across
//!   each read-modify-write of the container's record and the plugin runs
//!   of that operation; taken away from its name (while held, its marker
//!   blanked, kept as a spare) once the record is gone.
//!   `locks/.gc.lock` is held shared by every operation and exclusively by
//!   the plugins' GC. While a plugin of the container runs, the lock file
//!   holds its process group ([`Markers`]), so that a daemon started after
//!   a crash can kill what the crashed one left.
//!
//! Writes are atomic: a file in the same directory (a spare one, kept
//! from an earlier write or removal, so that no inode is allocated or
//! freed per call), renamed over the target. A [`Durability::Synced`] write also fsyncs the file before the
//! rename and the directory after it; docs/records.md says which writes need
//! that and why the others are safe without it. Readers ([`Store::at`],
//! [`Store::load`], [`Store::list`]) never write anything. All functions
//! block: call them on the blocking pool.

mod atomic;
mod lock;
mod marker;
mod record;
mod spare;
#[cfg(test)]
mod spare_tests;
mod store;

use std::io;
use std::path::{Path, PathBuf};

pub use atomic::{move_aside, read_regular, Unreadable};
pub use lock::{Held, Locks};
pub use marker::{Marker, MarkerState, Markers, Released};
pub use record::{
    encoded_len, Attachment, Cleanup, Delegate, Record, State, KIND, MAX_NEW_RECORD_BYTES,
};
pub use store::Store;

/// Whether a write must survive a power loss (see docs/records.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync of the file and the directory.
    Synced,
    /// Atomic only: survives a crash of the process, not of the machine.
    Atomic,
}

/// What a damaged file of an attachment record is, in messages.
pub const RECORD: &str = "attachment record";

/// Why something in the state directory, or in a cache of files read the
/// same way (multus's), could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The file's content (or the kind of file) is unusable; its bytes are
    /// intact (a record's can be moved aside with [`Store::set_aside`]).
    /// `what` names the kind of file ([`RECORD`], a multus cache).
    #[error("{what} {} is damaged: {why}", path.display())]
    Damaged {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
}

impl Error {
    pub fn is_damaged(&self) -> bool {
        matches!(self, Error::Damaged { .. })
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Error::Io { path, .. } | Error::Damaged { path, .. } => path,
        }
    }
}

/// An [`Error::Io`] about `path` while doing `what`.
fn io_error(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { path, what, source }
}
