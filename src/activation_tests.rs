//! Unit tests of [`super`].

use super::*;

#[test]
fn unset_listen_fds_should_mean_not_activated() {
    assert!(refused(None, None, 7).is_none());
    assert!(refused(Some(""), Some("7"), 7).is_none());
    assert!(refused(None, Some("8"), 7).is_none());
}

#[test]
fn listen_pid_of_another_process_should_be_refused() {
    assert!(matches!(
        refused(Some("1"), Some("8"), 7),
        Some(Error::NotOurs {
            listen_pid: 8,
            own_pid: 7
        })
    ));
}

#[test]
fn malformed_variables_should_be_named() {
    for fds in ["x", " 1", "-1", "1.0"] {
        assert!(
            matches!(refused(Some(fds), None, 7), Some(Error::BadListenFds(ref v)) if v == fds),
            "{fds:?}"
        );
    }
    assert!(matches!(
        refused(Some("1"), Some("y"), 7),
        Some(Error::BadListenPid(_))
    ));
    assert!(matches!(
        refused(Some("0"), Some("7"), 7),
        Some(Error::NoFds)
    ));
}

#[test]
fn well_formed_variables_listenfd_did_not_take_should_still_fail() {
    assert!(matches!(
        refused(Some("2"), Some("7"), 7),
        Some(Error::Refused { .. })
    ));
    assert!(matches!(
        refused(Some("1"), None, 7),
        Some(Error::Refused { .. })
    ));
}

#[test]
fn bind_should_create_private_dir_and_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sub/plexus.sock");
    let (_l, owned) = bind(&path).unwrap();
    let dir_mode = fs::metadata(tmp.path().join("sub")).unwrap().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
    let m = fs::symlink_metadata(&path).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.mode() & 0o777, 0o600);
    assert!(owned.still_ours());
}

#[test]
fn bind_over_regular_file_should_refuse_and_keep_it() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("plexus.sock");
    fs::write(&path, b"precious").unwrap();
    assert!(matches!(bind(&path), Err(Error::NotASocket { .. })));
    assert_eq!(fs::read(&path).unwrap(), b"precious");
}

#[test]
fn release_should_spare_a_successors_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("plexus.sock");
    let (_a, mut owned_a) = bind(&path).unwrap();
    let (_b, owned_b) = bind(&path).unwrap();
    assert!(!owned_a.still_ours());
    assert!(!owned_a.release().unwrap());
    assert!(owned_b.still_ours());
}

#[test]
fn release_should_unlink_own_socket_once() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("plexus.sock");
    let (_a, mut owned) = bind(&path).unwrap();
    assert!(owned.release().unwrap());
    assert!(!path.exists());
    assert!(!owned.release().unwrap());
}

#[test]
fn symlinked_lock_file_should_not_be_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("victim");
    let path = tmp.path().join("plexus.sock");
    std::os::unix::fs::symlink(&victim, tmp.path().join(".plexus.sock.lock")).unwrap();
    let err = bind(&path).unwrap_err();
    assert!(matches!(err, Error::Lock { .. }), "{err:?}");
    assert!(!victim.exists(), "the symlink was followed");
    assert!(!path.exists());
}

#[test]
fn fifo_lock_file_should_be_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let lock = tmp.path().join(".plexus.sock.lock");
    nix::unistd::mkfifo(&lock, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let err = bind(&tmp.path().join("plexus.sock")).unwrap_err();
    assert!(matches!(err, Error::Lock { .. }), "{err:?}");
}

#[test]
fn staging_should_use_a_private_random_directory_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("plexus.sock");
    let (_a, pa) = stage_path(&path).unwrap();
    let dir_a = pa.tmp_dir.clone();
    let m = fs::symlink_metadata(&dir_a).unwrap();
    assert!(m.is_dir());
    assert_eq!(m.mode() & 0o777, 0o700);
    assert_eq!(fs::symlink_metadata(&pa.tmp).unwrap().mode() & 0o777, 0o600);
    assert!(!path.exists(), "nothing is published before publish()");
    drop(pa);
    assert!(!dir_a.exists(), "an unpublished stage is cleaned up");
    let (_b, pb) = stage_path(&path).unwrap();
    assert_ne!(pb.tmp_dir, dir_a, "temporary names are not reused");
    let owned = pb.publish().unwrap();
    assert!(owned.still_ours());
    let names: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, [".plexus.sock.lock", "plexus.sock"]);
}

#[test]
fn failed_stage_should_leave_the_path_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("plexus.sock");
    let (_a, owned) = bind(&path).unwrap();
    let (_b, pending) = stage_path(&path).unwrap();
    drop(pending);
    assert!(owned.still_ours());
}

#[test]
fn successor_and_foreign_sockets_should_be_told_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("plexus.sock");
    let (_a, mut owned) = bind(&path).unwrap();
    assert_eq!(owned.probe().state(), PathState::Ours);
    let (_b, _owned_b) = bind(&path).unwrap();
    assert_eq!(owned.probe().state(), PathState::Successor);
    // A successor's takeover is never undone.
    assert!(owned.restore().unwrap().is_none());
    assert_eq!(owned.probe().state(), PathState::Successor);
}

#[test]
fn restore_should_replace_an_impostor_socket() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("plexus.sock");
    let (_a, mut owned) = bind(&path).unwrap();
    let fake = tmp.path().join("fake.sock");
    let _impostor = UnixListener::bind(&fake).unwrap();
    std::os::unix::fs::lchown(&fake, Some(65534), Some(65534)).unwrap();
    fs::rename(&fake, &path).unwrap();
    assert!(matches!(
        owned.probe().state(),
        PathState::Foreign {
            uid: 65534,
            socket: true,
            ..
        }
    ));
    let fresh = owned.restore().unwrap().expect("restored");
    assert_eq!(owned.probe().state(), PathState::Ours);
    assert_eq!(fs::symlink_metadata(&path).unwrap().uid(), 0);
    fresh.set_nonblocking(false).unwrap();
    let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
    assert!(fresh.accept().is_ok());
    assert!(owned.release().unwrap());
    assert!(!path.exists());
}

#[test]
fn restore_should_never_replace_a_non_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("plexus.sock");
    let (_a, mut owned) = bind(&path).unwrap();
    fs::remove_file(&path).unwrap();
    fs::write(&path, b"precious").unwrap();
    assert!(owned.restore().unwrap().is_none());
    assert_eq!(fs::read(&path).unwrap(), b"precious");
}
