//! Named steps of the operations that a unit test can make fail, to see
//! what an operation that stops there leaves behind: its record, the
//! plugin marker in its lock file, its locks (docs/records.md, "What an
//! operation leaves"). Outside test builds no step ever fails and
//! [`Engine::fault`] is an inlined `Ok(())`.

use super::{Engine, Error};

/// A step of an operation that can fail before the operation is done.
/// Each is checked where that step's own error would come from, so an
/// injected failure takes the same way out as a real one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Locating a network's plugins and the version each runs at.
    Prepare,
    /// The synced record write a network's first ADD plugin waits for.
    RecordSync,
    /// A network's ADD chain.
    AddChain,
    /// A record write in the course of an operation.
    RecordWrite,
    /// The operation's last record write, in the trip that releases its
    /// locks.
    LastWrite,
    /// The DEL of one recorded network.
    DelNetwork,
    /// The CHECK of one network.
    CheckNetwork,
    /// Reading multus's delegate cache of a container.
    MultusLoad,
    /// Reading libcni's cached result of a network multus attached.
    MultusResult,
    /// What a DEL finds of a container that has nothing recorded for its
    /// interface (multus's caches, a record set aside).
    Unrecorded,
    /// The check of a namespace GC is about to DEL in.
    Netns,
    /// Making a DEL call from a pending cleanup's record.
    RetryCall,
}

/// The steps a test armed, each failing once.
#[cfg(test)]
#[derive(Debug, Default)]
pub(super) struct Armed(std::sync::Mutex<Vec<Step>>);

#[cfg(test)]
impl Armed {
    /// Makes the next pass at `step` fail.
    pub(super) fn arm(&self, step: Step) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(step);
    }

    /// The armed steps no operation has reached yet.
    pub(super) fn unreached(&self) -> Vec<Step> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn take(&self, step: Step) -> bool {
        let mut armed = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match armed.iter().position(|s| *s == step) {
            Some(i) => {
                armed.remove(i);
                true
            }
            None => false,
        }
    }
}

impl Engine {
    /// An error when a test armed `step`; `Ok` otherwise, and always
    /// outside tests.
    #[inline(always)]
    pub(super) fn fault(&self, step: Step) -> Result<(), Error> {
        #[cfg(test)]
        if self.faults.take(step) {
            return Err(Error::new(
                super::ErrorKind::Failed,
                crate::api::code::INTERNAL,
                format!("injected failure at step {step:?}"),
            ));
        }
        #[cfg(not(test))]
        let _ = step;
        Ok(())
    }
}
