//! The markers of running plugin process groups, kept in the lock files.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use super::lock::Held;
use super::{io_error, Error};
use crate::cni::exec::{Group, Journal};

/// The markers of running plugin process groups. A container's marker is
/// the content of its lock file (`locks/<id>.lock`): the runner writes
/// `<pgid> <start time> <boot id>` there before a plugin reads its stdin,
/// and empties it once the plugin is reaped. Only the holder of the lock
/// runs that container's plugins, one at a time, so one marker per
/// container is enough, and it costs no file of its own (no directory
/// entry to create and remove per plugin run). A marker found by the next
/// holder names plugins nobody waits for: their daemon died.
#[derive(Debug)]
pub struct Markers {
    /// This boot's id: a marker from an earlier boot names nothing alive.
    boot_id: String,
    /// The lock files of the containers this daemon holds, each with
    /// whether it still names a plugin that has been reaped since.
    held: Mutex<HashMap<String, HeldMarker>>,
}

/// A held lock file and the state of the marker in it.
#[derive(Debug)]
struct HeldMarker {
    file: Arc<File>,
    /// The marker names a plugin that was reaped: it is emptied when the
    /// next plugin is noted or the lock is released, whichever is first,
    /// in a trip to the blocking pool that is made anyway.
    stale: bool,
}

/// One marker found in a lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub container_id: String,
    pub path: PathBuf,
    pub state: MarkerState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerState {
    /// A group of this boot that may still run.
    Running(Group),
    /// Written before the last reboot: nothing of it can be alive.
    EarlierBoot,
    /// Unreadable: the group cannot be identified safely (killing by pgid
    /// alone could hit a stranger), so the marker is only removed. A torn
    /// write is one of these, and harmless: it was cut before the plugin
    /// was given its stdin.
    Unreadable,
}

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// Longest marker read back; a real one is under 64 bytes.
const MARKER_MAX: usize = 256;
/// The marker's slot: every marker is written padded with blanks to this
/// size, and an emptied one is this many blanks. The file keeps its one
/// block from the first marker on, so noting a plugin later needs no new
/// space: a DEL on a full file system can still note its plugins. (A
/// truncation to 0 would free the block, and the next write would need it
/// back.)
const MARKER_SLOT: usize = 128;
/// An emptied marker.
const BLANK: [u8; MARKER_SLOT] = [b' '; MARKER_SLOT];

impl Markers {
    pub fn new() -> Self {
        let boot_id = fs::read_to_string(BOOT_ID)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Self {
            boot_id,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// The marker left in `held`, the lock of `container_id`, if any.
    /// Blocking.
    pub fn of(&self, container_id: &str, held: &Held) -> Result<Option<Marker>, Error> {
        let mut buf = [0u8; MARKER_MAX];
        let n = read_at_start(&held.file, &mut buf)
            .map_err(io_error(&held.path, "cannot read the lock file"))?;
        // Empty, or emptied: blanks (NULs as well, which a torn first
        // write may leave).
        if buf[..n].iter().all(|b| b.is_ascii_whitespace() || *b == 0) {
            return Ok(None);
        }
        Ok(Some(Marker {
            container_id: container_id.to_string(),
            path: held.path.clone(),
            state: self.parse(&buf[..n]),
        }))
    }

    fn parse(&self, bytes: &[u8]) -> MarkerState {
        let text = String::from_utf8_lossy(bytes);
        let mut words = text.split_whitespace();
        let pgid = words.next().and_then(|w| w.parse::<i32>().ok());
        let start_time = words.next().and_then(|w| w.parse::<u64>().ok());
        let (Some(pgid), Some(start_time)) = (pgid, start_time) else {
            return MarkerState::Unreadable;
        };
        if pgid <= 1 {
            return MarkerState::Unreadable;
        }
        match words.next() {
            Some(boot) if !self.boot_id.is_empty() && boot != self.boot_id => {
                MarkerState::EarlierBoot
            }
            _ => MarkerState::Running(Group { pgid, start_time }),
        }
    }

    /// Empties the marker in `held`. Blocking.
    pub fn clear(&self, held: &Held) -> Result<(), Error> {
        blank(&held.file).map_err(io_error(&held.path, "cannot empty the lock file"))
    }

    /// From now until [`Markers::release`], plugins run for
    /// `container_id` are noted in `held`.
    pub fn hold(&self, container_id: &str, held: &Held) {
        self.hold_marked(container_id, held, Released::Clean);
    }

    /// [`Markers::hold`] again after a [`Markers::release`] whose lock was
    /// kept after all; `released` is what that release answered.
    pub fn hold_marked(&self, container_id: &str, held: &Held, released: Released) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                container_id.to_string(),
                HeldMarker {
                    file: held.file.clone(),
                    stale: released == Released::Stale,
                },
            );
    }

    /// Ends [`Markers::hold`]; whether the lock file still holds the
    /// marker of a reaped plugin, which [`Released::settle`] empties before
    /// the lock is given up.
    pub fn release(&self, container_id: &str) -> Released {
        match self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(container_id)
        {
            Some(HeldMarker { stale: true, .. }) => Released::Stale,
            _ => Released::Clean,
        }
    }

    /// The held lock file of `container_id`, its stale mark cleared (the
    /// caller replaces the marker).
    fn file(&self, container_id: &str) -> Option<Arc<File>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let m = held.get_mut(container_id)?;
        m.stale = false;
        Some(m.file.clone())
    }
}

/// What [`Markers::release`] found in a lock file about to be given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Released {
    /// Empty, or naming a plugin that may still run (a call cut short,
    /// whose plugin is killed and reaped on its own): left as it is.
    Clean,
    /// Naming a plugin that has been reaped.
    Stale,
}

impl Released {
    /// Empties the marker of a reaped plugin in `held`, which is about to
    /// be given up but stays in place (its container keeps a record): the
    /// next holder must not find a marker of a plugin that finished.
    /// Blocking. A failure is logged: the next holder then finds the group
    /// gone and clears the marker itself.
    pub fn settle(self, held: &Held) {
        if self == Released::Stale {
            if let Err(e) = blank(&held.file) {
                tracing::warn!(path = %held.path.display(), cause = %e, "cannot empty the plugin marker in the lock file");
            }
        }
    }
}

impl Default for Markers {
    fn default() -> Self {
        Self::new()
    }
}

/// Empties a marker in place: blanks over the slot, the file cut to the
/// slot (a longer one is an older daemon's or damaged). Writes over the
/// block the file already holds; a file that never held a marker is left
/// empty (nothing to empty, and no space to take).
pub(super) fn blank(file: &File) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    file.write_all_at(&BLANK, 0)?;
    if len != MARKER_SLOT as u64 {
        file.set_len(MARKER_SLOT as u64)?;
    }
    Ok(())
}

/// pread(2) from offset 0, retried on EINTR.
fn read_at_start(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    loop {
        match file.read_at(buf, 0) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

impl Journal for Markers {
    fn started(&self, container_id: &str, group: Group) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        // Every plugin with a container id runs under that container's
        // lock; one without would run unrecorded, so it does not run.
        let file = self.file(container_id).ok_or_else(|| {
            io::Error::other(format!(
                "no lock is held for container {container_id:?}: cannot note the plugin's process group"
            ))
        })?;
        // Not synced: a power loss kills the plugins too, and a marker that
        // survives one is told apart by its boot id. One write of the
        // whole slot replaces whatever it held (blanks, or the previous
        // plugin of this operation); after the first, it needs no space.
        let mut slot = BLANK;
        let body = format!("{} {} {}\n", group.pgid, group.start_time, self.boot_id);
        let n = body.len().min(MARKER_SLOT);
        slot[..n].copy_from_slice(&body.as_bytes()[..n]);
        file.write_all_at(&slot, 0)?;
        Ok(())
    }

    fn finished(&self, container_id: &str, _group: Group) {
        // Only noted here (no I/O on the async runtime): the marker is
        // emptied by the next plugin's note or when the lock is released.
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = held.get_mut(container_id) {
            m.stale = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::state::Locks;

    #[test]
    fn markers_should_name_their_group_until_finished() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::open(dir.path()).unwrap();
        let m = Markers::new();
        let g = Group {
            pgid: 4242,
            start_time: 777,
        };
        // No lock held for the container: the plugin must not run.
        assert!(m.started("a", g).is_err());
        let a = locks.lock("a").unwrap();
        let b = locks.lock("a.1").unwrap();
        m.hold("a", &a);
        m.hold("a.1", &b);
        m.started("a", g).unwrap();
        m.started("a.1", Group { pgid: 7, ..g }).unwrap();
        let of_a = m.of("a", &a).unwrap().unwrap();
        assert_eq!(of_a.state, MarkerState::Running(g));
        assert_eq!(of_a.container_id, "a");
        assert_eq!(
            m.of("a.1", &b).unwrap().unwrap().state,
            MarkerState::Running(Group { pgid: 7, ..g })
        );
        // A reaped plugin's marker is emptied by the next trip to the
        // file, not at once: the next plugin's note replaces it whole...
        m.finished("a", g);
        assert_eq!(
            m.of("a", &a).unwrap().unwrap().state,
            MarkerState::Running(g)
        );
        let shorter = Group {
            pgid: 9,
            start_time: 1,
        };
        m.started("a", shorter).unwrap();
        let text = fs::read_to_string(a.path()).unwrap();
        assert_eq!(text.len(), MARKER_SLOT, "{text:?}");
        assert_eq!(text.trim_end(), format!("9 1 {}", m.boot_id));
        // ...and releasing the lock empties it.
        m.finished("a", shorter);
        let released = m.release("a");
        assert_eq!(released, Released::Stale);
        released.settle(&a);
        assert!(m.of("a", &a).unwrap().is_none());
        // Blanked, not cut: the file keeps its block for the next marker.
        assert_eq!(fs::read(a.path()).unwrap(), BLANK);
        // A plugin not reaped (a call cut short) keeps its marker.
        let released = m.release("a.1");
        assert_eq!(released, Released::Clean);
        released.settle(&b);
        assert!(m.of("a.1", &b).unwrap().is_some());

        // What a later holder finds, written by hand.
        drop(a);
        fs::write(dir.path().join("locks/a.lock"), "12 34 another-boot\n").unwrap();
        fs::write(dir.path().join("locks/c.lock"), "garbage").unwrap();
        let a = locks.lock("a").unwrap();
        let c = locks.lock("c").unwrap();
        assert_eq!(
            m.of("a", &a).unwrap().unwrap().state,
            MarkerState::EarlierBoot
        );
        assert_eq!(
            m.of("c", &c).unwrap().unwrap().state,
            MarkerState::Unreadable
        );
        m.clear(&c).unwrap();
        assert!(m.of("c", &c).unwrap().is_none());
        assert_eq!(fs::read(dir.path().join("locks/c.lock")).unwrap(), BLANK);
        // A file that never held a marker stays empty.
        let e = locks.lock("e").unwrap();
        m.clear(&e).unwrap();
        assert_eq!(fs::metadata(e.path()).unwrap().len(), 0);
    }
}
