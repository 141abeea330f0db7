//! Leftovers of a crashed daemon: plugin groups it left running (killed
//! before the next call, a survivor fails it), its files at start-up, and a
//! DEL whose record was lost.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::netconf::Invocation;

/// Groups the fake killer was asked to kill; pgids are unique per test.
static KILLED: Mutex<Vec<Group>> = Mutex::new(Vec::new());
/// The pgid the fake killer cannot kill.
const SURVIVOR: i32 = 999_001;

fn fake_kill(group: Group, _deadline: Duration, _wait: Duration) -> std::io::Result<bool> {
    KILLED.lock().unwrap().push(group);
    if group.pgid == SURVIVOR {
        return Err(std::io::Error::other("members still alive"));
    }
    Ok(true)
}

fn killed(pgid: i32) -> Vec<Group> {
    let all = KILLED.lock().unwrap();
    all.iter().filter(|g| g.pgid == pgid).copied().collect()
}

fn engine_config(state: &Path) -> Config {
    Config {
        bin_dirs: Vec::new(),
        conf_dir: state.join("conf"),
        state_dir: state.to_path_buf(),
        plugin_timeout: Duration::from_secs(5),
        device_info_dir: state.join("devinfo"),
        cni_dir: state.join("multus"),
        cleanup: Default::default(),
        plugin_spawner: None,
    }
}

/// Writes a marker as the runner would for a group of this boot: into
/// the container's lock file, as a daemon that died holding it left it.
fn marker(state: &Path, id: &str, pgid: i32, start_time: u64) -> PathBuf {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let dir = state.join("locks");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{id}.lock"));
    std::fs::write(&path, format!("{pgid} {start_time} {}\n", boot.trim())).unwrap();
    path
}

/// Whether the marker in a lock file was emptied (or the file is gone).
fn cleared(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.len() == 0)
        .unwrap_or(true)
}

fn del_call(id: &str) -> Invocation {
    Invocation {
        command: Command::Del,
        container_id: id.into(),
        netns: String::new(),
        ifname: "eth0".into(),
        args: String::new(),
        arg_pairs: Vec::new(),
    }
}

#[tokio::test]
async fn stale_groups_should_be_killed_before_a_call_and_a_survivor_should_fail_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::build(engine_config(dir.path()), None, fake_kill).unwrap();
    let m = marker(dir.path(), "c1", 999_002, 42);
    let no_fallback = || async { Ok::<_, Error>(Vec::new()) };
    engine
        .del(&del_call("c1"), Map::new(), no_fallback)
        .await
        .unwrap();
    assert_eq!(
        killed(999_002),
        vec![Group {
            pgid: 999_002,
            start_time: 42
        }]
    );
    assert!(cleared(&m), "the marker of a killed group stayed");

    let m = marker(dir.path(), "c2", SURVIVOR, 7);
    let e = engine
        .del(&del_call("c2"), Map::new(), no_fallback)
        .await
        .unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    assert!(
        e.msg.contains("c2") && e.msg.contains(&SURVIVOR.to_string()),
        "{e}"
    );
    assert!(!cleared(&m), "the marker of a surviving group was removed");
    // Nothing is left locked: the lock file of a container without a
    // record is gone, and the next call is not stuck.
    assert!(!dir.path().join("locks/c1.lock").exists());
    assert!(engine.locks.try_lock("c2").unwrap().is_some());
}

#[test]
fn start_up_should_clean_up_only_containers_nobody_holds() {
    let dir = tempfile::tempdir().unwrap();
    let locks = Locks::open(dir.path()).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let free = marker(dir.path(), "free", 999_003, 1);
    let busy = marker(dir.path(), "busy", 999_004, 1);
    let free_tmp = store.dir().join(".free.1.2.tmp");
    let busy_tmp = store.dir().join(".busy.1.2.tmp");
    std::fs::write(&free_tmp, "x").unwrap();
    std::fs::write(&busy_tmp, "x").unwrap();
    // A live predecessor working on "busy" holds its lock.
    let held = locks.lock("busy").unwrap();
    drop(locks.lock("orphan").unwrap());

    let _engine = Engine::build(engine_config(dir.path()), None, fake_kill).unwrap();
    assert_eq!(killed(999_003).len(), 1);
    assert!(cleared(&free) && !free_tmp.exists());
    assert!(
        killed(999_004).is_empty(),
        "a held container's plugins were killed"
    );
    assert!(!cleared(&busy) && busy_tmp.exists());
    // Lock files of containers without a record go, unless held.
    assert!(!dir.path().join("locks/orphan.lock").exists());
    assert!(!dir.path().join("locks/free.lock").exists());
    assert!(held.path().exists());
}

#[tokio::test]
async fn del_should_load_configs_only_for_a_container_whose_record_was_lost() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::build(engine_config(dir.path()), None, fake_kill).unwrap();
    let called = AtomicBool::new(false);
    let fallback = || async {
        called.store(true, Ordering::SeqCst);
        Ok::<_, Error>(Vec::new())
    };
    engine
        .del(&del_call("never-added"), Map::new(), fallback)
        .await
        .unwrap();
    assert!(
        !called.load(Ordering::SeqCst),
        "a DEL of nothing loaded configs"
    );

    let store = Store::at(dir.path());
    std::fs::write(store.dir().join("lost.json"), b"{garbage").unwrap();
    engine
        .del(&del_call("lost"), Map::new(), fallback)
        .await
        .unwrap();
    assert!(called.swap(false, Ordering::SeqCst));
    assert!(store.was_set_aside("lost"));
    // Later DELs (another ifname, a retry) still fall back.
    engine
        .del(&del_call("lost"), Map::new(), fallback)
        .await
        .unwrap();
    assert!(called.load(Ordering::SeqCst));
}
