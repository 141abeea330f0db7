//! The directory of records, `attachments/`: load, save, remove, list,
//! and set aside what cannot be read.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::atomic::{
    create_private_dir, move_aside, read_regular, sync_dir, temp_files_in, write_atomically,
    Unreadable,
};
use super::record::{parse, MAX_RECORD_BYTES};
use super::spare::Spares;
use super::{io_error, Durability, Error, Record, RECORD};
use crate::names::is_valid_name;

/// The directory of records.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    /// Files kept for the next writes, so that a write creates no file and
    /// a removal frees none (see `spare.rs`).
    pub(super) spares: Spares,
}

impl Store {
    /// Opens `<state_dir>/attachments` for writing, creating it (0700).
    /// When it is created, the directories holding its name are synced
    /// once, so that a synced record is never lost with its directory.
    pub fn open(state_dir: &Path) -> Result<Self, Error> {
        let state_existed = fs::symlink_metadata(state_dir).is_ok();
        let store = Self::at(state_dir);
        if fs::symlink_metadata(&store.dir).is_err() {
            create_private_dir(&store.dir)?;
            sync_dir(state_dir)?;
            if !state_existed {
                if let Some(parent) = state_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    sync_dir(parent)?;
                }
            }
        }
        // What a daemon no longer running kept: reused, not left behind.
        store.spares.adopt(|_| Ok(()));
        Ok(store)
    }

    /// A read-only view of `<state_dir>/attachments`: creates nothing, and
    /// a missing directory simply holds no records.
    pub fn at(state_dir: &Path) -> Self {
        let dir = state_dir.join("attachments");
        Self {
            spares: Spares::emptied(dir.clone()),
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, container_id: &str) -> PathBuf {
        self.dir.join(format!("{container_id}.json"))
    }

    fn damaged_dir(&self, container_id: &str) -> PathBuf {
        self.dir.join("damaged").join(container_id)
    }

    /// How long ago `container_id`'s record file was last written; None
    /// without one (or a clock that went back).
    pub fn age(&self, container_id: &str) -> Option<std::time::Duration> {
        let written = fs::symlink_metadata(self.path(container_id))
            .ok()?
            .modified()
            .ok()?;
        std::time::SystemTime::now().duration_since(written).ok()
    }

    /// Whether `container_id` has a record file, readable or not.
    pub fn exists(&self, container_id: &str) -> bool {
        fs::symlink_metadata(self.path(container_id)).is_ok()
    }

    /// The record of `container_id`, if there is one. A record that is not
    /// a regular file (a symbolic link is never followed), is empty, does
    /// not parse, or names another container is [`Error::Damaged`].
    pub fn load(&self, container_id: &str) -> Result<Option<Record>, Error> {
        let path = self.path(container_id);
        match read_regular(&path, MAX_RECORD_BYTES) {
            Ok(None) => Ok(None),
            Ok(Some(text)) => parse(container_id, &path, &text).map(Some),
            Err(Unreadable::Damaged(why)) => Err(Error::Damaged {
                what: RECORD,
                path,
                why,
            }),
            Err(Unreadable::Io(what, e)) => Err(io_error(&path, what)(e)),
        }
    }

    /// Writes `record` atomically; an empty record removes the file.
    pub fn save(&self, record: &Record, durability: Durability) -> Result<(), Error> {
        if record.attachments.is_empty() {
            return self.remove(&record.container_id, durability);
        }
        let synced = durability == Durability::Synced;
        let path = self.path(&record.container_id);
        // A Record is strings, maps and JSON values: it always serialises.
        let body = serde_json::to_vec(record).unwrap_or_default();
        // What could not be read back would count as damaged.
        if body.len() as u64 > MAX_RECORD_BYTES {
            return Err(io_error(&path, "cannot write the attachment record")(
                io::Error::other(format!(
                    "it would be {} bytes, more than the {MAX_RECORD_BYTES} a record may have",
                    body.len()
                )),
            ));
        }
        write_atomically(&self.spares, &path, &body, synced)?;
        if synced {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Removes the record of `container_id` (no error when absent): its
    /// file becomes a spare for a later write, or is unlinked when the
    /// pool is full or the rename finds no space. Either needs no new
    /// space.
    pub fn remove(&self, container_id: &str, durability: Durability) -> Result<(), Error> {
        let path = self.path(container_id);
        match self.spares.retire(&path) {
            Ok(()) if durability == Durability::Synced => sync_dir(&self.dir),
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path, "cannot remove the attachment record")(e)),
        }
    }

    /// The ids of every container with a record file (readable or not),
    /// sorted; none when the directory does not exist. Only reads:
    /// temporary files of writes in progress are left alone.
    pub fn list(&self) -> Result<Vec<String>, Error> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(&self.dir, "cannot list the attachment records")(e)),
        };
        let mut ids = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name();
            if let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) {
                if is_valid_name(id) {
                    ids.push(id.to_string());
                }
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// Temporary files of record writes, as (container id, path), which
    /// earlier plexusd versions wrote through: the ones whose container is
    /// not locked are leftovers. (Records are now written through spares.)
    pub fn temp_files(&self) -> Vec<(String, PathBuf)> {
        temp_files_in(&self.dir)
    }

    /// Moves the record of `container_id` aside as it is (a symbolic link
    /// or a directory is moved itself, never followed) to
    /// `damaged/<id>/<unix time>.json`, and returns that path. Call it
    /// with the container locked.
    pub fn set_aside(&self, container_id: &str) -> Result<PathBuf, Error> {
        move_aside(
            &self.path(container_id),
            &self.damaged_dir(container_id),
            ".json",
        )
    }

    /// Moves `from`, another file about `container_id` found damaged (one
    /// of multus's caches), aside next to its damaged records, as
    /// `damaged/<id>/<unix time><suffix>`; where it went. From then on
    /// [`Store::was_set_aside`] is true for the container. Call it with
    /// the container locked.
    pub fn set_aside_file(
        &self,
        container_id: &str,
        from: &Path,
        suffix: &str,
    ) -> Result<PathBuf, Error> {
        move_aside(from, &self.damaged_dir(container_id), suffix)
    }

    /// Whether a damaged record of `container_id` was ever moved aside.
    pub fn was_set_aside(&self, container_id: &str) -> bool {
        fs::symlink_metadata(self.damaged_dir(container_id)).is_ok_and(|m| m.is_dir())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::state::record::tests::record;
    use std::os::unix::fs::symlink;

    #[test]
    fn records_should_round_trip_and_empty_ones_vanish() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.load("c1").unwrap().is_none());
        let mut r = record("c1");
        store.save(&r, Durability::Synced).unwrap();
        assert_eq!(store.load("c1").unwrap().unwrap(), r);
        assert_eq!(store.list().unwrap(), vec!["c1".to_string()]);
        r.attachments.clear();
        store.save(&r, Durability::Atomic).unwrap();
        assert!(store.load("c1").unwrap().is_none());
        assert!(store.list().unwrap().is_empty());
        // Only spares are left: no record, no temporary file.
        for e in fs::read_dir(store.dir()).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            assert!(name.starts_with(".free."), "{name}");
        }
        assert!(store.temp_files().is_empty());
    }

    #[test]
    fn every_kind_of_damage_should_be_reported_and_set_aside_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.save(&record("good"), Durability::Atomic).unwrap();
        let good = fs::read(store.path("good")).unwrap();
        let other = serde_json::to_vec(&record("good")).unwrap();
        let mut kind = record("kind");
        kind.kind = "somethingElse".into();
        let kind = serde_json::to_vec(&kind).unwrap();
        let files: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("truncated", good[..good.len() / 2].to_vec()),
            ("garbage", b"\x00\xffnot json".to_vec()),
            ("other", other),
            ("kind", kind),
        ];
        for (id, bytes) in &files {
            fs::write(store.path(id), bytes).unwrap();
        }
        fs::create_dir(store.path("adir")).unwrap();
        fs::write(store.path("adir").join("inside"), b"x").unwrap();
        symlink(store.path("good"), store.path("alink")).unwrap();

        for id in [
            "empty",
            "truncated",
            "garbage",
            "other",
            "kind",
            "adir",
            "alink",
        ] {
            let e = store.load(id).unwrap_err();
            assert!(e.is_damaged(), "{id}: {e}");
            assert!(e.to_string().contains(&format!("{id}.json")), "{e}");
            let to = store.set_aside(id).unwrap();
            assert!(
                to.starts_with(store.dir().join("damaged").join(id)),
                "{to:?}"
            );
            assert!(store.load(id).unwrap().is_none(), "{id} is still there");
            assert!(store.was_set_aside(id));
            match id {
                "adir" => assert_eq!(fs::read(to.join("inside")).unwrap(), b"x"),
                "alink" => assert_eq!(fs::read_link(&to).unwrap(), store.path("good")),
                _ => {
                    let bytes = &files.iter().find(|(i, _)| *i == id).unwrap().1;
                    assert_eq!(&fs::read(&to).unwrap(), bytes, "{id}");
                }
            }
        }
        // The record the link and the copy pointed at is untouched.
        assert_eq!(fs::read(store.path("good")).unwrap(), good);
        assert!(!store.was_set_aside("good"));
        // A second damaged record the same second gets a name of its own.
        fs::write(store.path("empty"), b"").unwrap();
        let second = store.set_aside("empty").unwrap();
        assert_eq!(
            fs::read_dir(second.parent().unwrap()).unwrap().count(),
            2,
            "{second:?}"
        );
    }

    #[test]
    fn readers_should_create_and_remove_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("state");
        let store = Store::at(&missing);
        assert!(store.list().unwrap().is_empty());
        assert!(store.load("c1").unwrap().is_none());
        assert!(!missing.exists());

        let store = Store::open(&missing).unwrap();
        store.save(&record("c1"), Durability::Atomic).unwrap();
        let tmp = store.dir().join(".c.1.2.3.4.tmp");
        fs::write(&tmp, b"half").unwrap();
        assert_eq!(Store::at(&missing).list().unwrap(), vec!["c1".to_string()]);
        assert!(tmp.exists(), "a reader removed a write in progress");
        assert_eq!(store.temp_files(), vec![("c.1.2".to_string(), tmp)]);
    }
}
