//! The reuse of files through spares (`spare.rs`): what the store and the
//! locks guarantee must hold with reused inodes.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::record::tests::record;
use super::spare::MAX_SPARES;
use super::{Durability, Locks, Markers, Record, Store};
use crate::cni::exec::{Group, Journal};

/// The names in `dir` that are spares.
fn spares_in(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".free."))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

fn inode(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().ino()
}

/// `record(id)` with `n` attachments, so that sizes differ.
fn record_of(id: &str, n: usize) -> Record {
    let mut r = record(id);
    let one = r.attachments[0].clone();
    for i in 1..n {
        let mut a = one.clone();
        a.ifname = format!("net{i}");
        r.attachments.push(a);
    }
    r
}

/// A pid no process has: a child that was reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn a_record_replaced_while_read_should_read_whole_and_reuse_its_inodes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let (small, large) = (record_of("c1", 1), record_of("c1", 40));
    store.save(&small, Durability::Synced).unwrap();
    store.save(&large, Durability::Atomic).unwrap();
    // From now on the record and one spare swap places: no new inode.
    let path = store.dir().join("c1.json");
    let known: HashSet<u64> = [inode(&path)]
        .into_iter()
        .chain(spares_in(store.dir()).iter().map(|p| inode(p)))
        .collect();
    assert_eq!(known.len(), 2, "{:?}", spares_in(store.dir()));

    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, done) = (store.clone(), done.clone());
        let (small, large) = (small.clone(), large.clone());
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !done.load(Ordering::Relaxed) || reads < 100 {
                let got = store.load("c1").unwrap().expect("the record vanished");
                assert!(got == small || got == large, "a mix was read");
                reads += 1;
            }
        })
    };
    for i in 0..400 {
        let (r, d) = if i % 2 == 0 {
            (&small, Durability::Atomic)
        } else {
            (&large, Durability::Synced)
        };
        // The file given back is the pool's again once emptied.
        store.spares.settle();
        store.save(r, d).unwrap();
        assert!(known.contains(&inode(&path)), "write {i} made a new file");
    }
    done.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert_eq!(store.load("c1").unwrap().unwrap(), large);
    let names: HashSet<u64> = spares_in(store.dir()).iter().map(|p| inode(p)).collect();
    assert!(names.is_subset(&known));
}

#[test]
fn spares_should_never_be_taken_for_records_locks_or_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let locks = Locks::open(dir.path()).unwrap();
    for id in ["a", "b", "c"] {
        let held = locks.lock(id).unwrap();
        store.save(&record(id), Durability::Synced).unwrap();
        store.save(&record_of(id, 2), Durability::Atomic).unwrap();
        store.remove(id, Durability::Atomic).unwrap();
        held.unlink().unwrap();
    }
    assert!(!spares_in(store.dir()).is_empty());
    assert!(!spares_in(&dir.path().join("locks")).is_empty());
    assert!(store.list().unwrap().is_empty());
    assert!(Store::at(dir.path()).list().unwrap().is_empty());
    assert!(store.temp_files().is_empty());
    assert!(locks.ids().is_empty(), "{:?}", locks.ids());
}

#[test]
fn a_lock_file_given_back_should_name_no_plugin_for_the_next_container() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::open(dir.path()).unwrap();
    let markers = Markers::new();
    let held = locks.lock("a").unwrap();
    let ino = inode(held.path());
    markers.hold("a", &held);
    // The marker of a plugin that still runs (a call cut short): it goes
    // with the file as before, and must not come back with it.
    let me = Group {
        pgid: std::process::id() as i32,
        start_time: 1,
    };
    markers.started("a", me).unwrap();
    assert!(markers.of("a", &held).unwrap().is_some());
    let _ = markers.release("a");
    held.unlink().unwrap();
    assert!(!dir.path().join("locks/a.lock").exists());

    let b = locks.lock("b").unwrap();
    assert_eq!(inode(b.path()), ino, "the spare was not reused");
    assert!(markers.of("b", &b).unwrap().is_none());
    assert!(fs::read(b.path()).unwrap().iter().all(|c| *c == b' '));
}

#[test]
fn the_pools_should_stay_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let locks = Locks::open(dir.path()).unwrap();
    let n = MAX_SPARES * 3;
    let ids: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
    let held: Vec<_> = ids.iter().map(|id| locks.lock(id).unwrap()).collect();
    for id in &ids {
        store.save(&record(id), Durability::Atomic).unwrap();
    }
    for id in &ids {
        store.remove(id, Durability::Atomic).unwrap();
    }
    for h in held {
        h.unlink().unwrap();
    }
    assert_eq!(spares_in(store.dir()).len(), MAX_SPARES);
    assert_eq!(spares_in(&dir.path().join("locks")).len(), MAX_SPARES);
    assert_eq!(store.spares.len(), MAX_SPARES);
    assert!(store.list().unwrap().is_empty() && locks.ids().is_empty());
}

#[test]
fn planted_files_named_like_spares_should_never_be_followed_or_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let locks = Locks::open(dir.path()).unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, b"untouched").unwrap();
    type Plant = fn(&Path, &Path);
    let plants: [(&str, Plant); 3] = [
        ("link", |at, victim| symlink(victim, at).unwrap()),
        ("fifo", |at, _| {
            let c = CString::new(at.as_os_str().as_bytes()).unwrap();
            // SAFETY: mkfifo(3) on a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }),
        ("dir", |at, _| fs::create_dir(at).unwrap()),
    ];
    for (what, plant) in plants {
        // A spare of each pool, then something else in its place.
        let held = locks.lock("x").unwrap();
        store.save(&record("x"), Durability::Atomic).unwrap();
        store.remove("x", Durability::Atomic).unwrap();
        held.unlink().unwrap();
        store.spares.settle();
        for d in [store.dir().to_path_buf(), dir.path().join("locks")] {
            let spares = spares_in(&d);
            assert_eq!(spares.len(), 1, "{what}: {spares:?}");
            fs::remove_file(&spares[0]).unwrap();
            plant(&spares[0], &victim);
        }
        let held = locks.lock("y").unwrap();
        assert!(
            fs::symlink_metadata(held.path()).unwrap().is_file(),
            "{what}"
        );
        store.save(&record("y"), Durability::Synced).unwrap();
        assert_eq!(store.load("y").unwrap().unwrap(), record("y"), "{what}");
        assert_eq!(fs::read(&victim).unwrap(), b"untouched", "{what}");
        for p in spares_in(store.dir())
            .into_iter()
            .chain(spares_in(&dir.path().join("locks")))
        {
            let m = fs::symlink_metadata(&p).unwrap();
            assert!(!m.is_file(), "{what}: the plant was replaced: {p:?}");
            if m.is_dir() {
                fs::remove_dir(&p).unwrap();
            } else {
                fs::remove_file(&p).unwrap();
            }
        }
        store.remove("y", Durability::Atomic).unwrap();
        held.unlink().unwrap();
        for d in [store.dir().to_path_buf(), dir.path().join("locks")] {
            for p in spares_in(&d) {
                fs::remove_file(p).unwrap();
            }
        }
        // Drain what the pools still think they hold.
        store.spares.settle();
        while store.spares.take().is_some() {}
    }
}

#[test]
fn start_up_should_adopt_only_dead_daemons_spares_and_blank_them() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap();
    let first_locks = Locks::open(dir.path()).unwrap();
    let held = first_locks.lock("a").unwrap();
    first.save(&record("a"), Durability::Atomic).unwrap();
    first.remove("a", Durability::Atomic).unwrap();
    held.unlink().unwrap();
    let live: Vec<PathBuf> = spares_in(first.dir());
    assert_eq!(live.len(), 1);

    let dead = dead_pid();
    let att = dir.path().join("attachments");
    let lck = dir.path().join("locks");
    fs::write(att.join(format!(".free.{dead}.0.0")), b"old record").unwrap();
    fs::write(lck.join(format!(".free.{dead}.0.0")), b"12 34 boot\n").unwrap();
    symlink(
        dir.path().join("victim"),
        att.join(format!(".free.{dead}.0.1")),
    )
    .unwrap();

    // A second daemon on the same directory while the first runs.
    let second = Store::open(dir.path()).unwrap();
    let second_locks = Locks::open(dir.path()).unwrap();
    assert_eq!(
        second.spares.len(),
        1,
        "adopted the dead daemon's file only"
    );
    assert!(
        live.iter().all(|p| p.exists()),
        "a live daemon's spare was taken"
    );
    assert!(fs::symlink_metadata(att.join(format!(".free.{dead}.0.1")))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!att.join(format!(".free.{dead}.0.0")).exists());
    // The adopted lock file is blank: a new container finds no marker.
    let b = second_locks.lock("b").unwrap();
    assert!(fs::read(b.path()).unwrap().iter().all(|c| *c == b' '));
    assert!(Markers::new().of("b", &b).unwrap().is_none());
}

#[test]
fn two_daemons_sharing_the_directory_should_lose_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let daemons: Vec<_> = (0..2)
        .map(|_| {
            (
                Arc::new(Store::open(dir.path()).unwrap()),
                Arc::new(Locks::open(dir.path()).unwrap()),
            )
        })
        .collect();
    let ids = ["a", "b", "c"];
    // How many attachments each record has, as the last holder of its lock
    // left it: every holder must find exactly that.
    let expected = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (store, locks) = daemons[t % 2].clone();
            let expected = expected.clone();
            std::thread::spawn(move || {
                for i in 0..150 {
                    let id = ids[(i + t) % ids.len()];
                    let held = locks.lock(id).unwrap();
                    let mut r = store.load(id).unwrap().unwrap_or_else(|| Record::new(id));
                    let before = *expected.lock().unwrap().get(id).unwrap_or(&0);
                    assert_eq!(r.attachments.len(), before, "{id}: a write was lost");
                    // Every fifth visit removes the record: lock file and
                    // record go back to the pools.
                    if i % 5 == 4 {
                        r.attachments.clear();
                    } else {
                        let mut a = record(id).attachments.remove(0);
                        a.ifname = format!("t{t}i{i}");
                        r.attachments.push(a);
                    }
                    store.save(&r, Durability::Atomic).unwrap();
                    assert_eq!(
                        store.load(id).unwrap().unwrap_or_else(|| Record::new(id)),
                        r
                    );
                    expected.lock().unwrap().insert(id, r.attachments.len());
                    if r.attachments.is_empty() {
                        held.unlink().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for id in ids {
        let want = *expected.lock().unwrap().get(id).unwrap_or(&0);
        for (store, _) in &daemons {
            let got = store.load(id).unwrap().map_or(0, |r| r.attachments.len());
            assert_eq!(got, want, "{id}");
        }
    }
}

#[test]
fn a_record_file_given_back_should_be_empty_before_it_is_taken_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .save(&record_of("c1", 40), Durability::Synced)
        .unwrap();
    // The exchange gives the synced file back; the removal the other one.
    store.save(&record_of("c1", 1), Durability::Atomic).unwrap();
    store.remove("c1", Durability::Atomic).unwrap();
    store.spares.settle();
    let spares = spares_in(store.dir());
    assert_eq!(spares.len(), 2, "{spares:?}");
    for p in &spares {
        let len = fs::metadata(p).unwrap().len();
        assert_eq!(len, 0, "{p:?} was given back with {len} bytes");
    }
    // The next unsynced write takes one of them: nothing new is made.
    store.save(&record_of("c2", 3), Durability::Atomic).unwrap();
    assert_eq!(store.load("c2").unwrap().unwrap(), record_of("c2", 3));
    assert_eq!(spares_in(store.dir()).len(), 1);
}

#[test]
fn emptying_should_never_follow_a_link_or_wait_on_a_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, b"untouched").unwrap();
    let link = dir.path().join(".free.1.0.0");
    symlink(&victim, &link).unwrap();
    super::spare::empty(&link);
    let fifo = dir.path().join(".free.1.0.1");
    let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Would block forever on a FIFO opened without O_NONBLOCK.
    super::spare::empty(&fifo);
    let sub = dir.path().join(".free.1.0.2");
    fs::create_dir(&sub).unwrap();
    super::spare::empty(&sub);
    assert_eq!(fs::read(&victim).unwrap(), b"untouched");
    let file = dir.path().join(".free.1.0.3");
    fs::write(&file, b"old record").unwrap();
    super::spare::empty(&file);
    assert_eq!(fs::metadata(&file).unwrap().len(), 0);
}
