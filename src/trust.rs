//! Whether a path the daemon writes is out of reach of other users.
//!
//! The daemon runs as root and creates sockets, lock files, records and
//! logs. If another user can write a directory on the way to one of them,
//! that user can plant a symlink, a socket or a record there and make the
//! daemon act on it. So, like sshd's `StrictModes`, every existing
//! component of such a path is checked from `/` down, symlinks resolved:
//!
//! - directories and symlinks must be owned by root (or by the daemon's
//!   own effective uid, for unprivileged development runs);
//! - directories must not be writable by group or others, with one
//!   exception: a sticky directory (like `/tmp`) may be, as an *ancestor*
//!   only. The sticky bit stops others from renaming or removing the
//!   root-owned entries below it, so `/tmp/x/sock` is fine when `/tmp/x`
//!   is root's and not writable by others; `/tmp` itself as the directory
//!   the daemon writes into, or holding a file it writes (`/tmp/x.log`),
//!   is not.
//!
//! Components that do not exist yet end the walk: the daemon creates them
//! itself (mode 0700), and callers check again once they exist, so a
//! directory planted in between is caught.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed before giving up, as the kernel's limit.
const MAX_SYMLINKS: u32 = 40;

/// Why a path is not safe to write.
#[derive(Debug, thiserror::Error)]
pub enum Untrusted {
    #[error(
        "{} is owned by uid {uid} (mode {mode:04o}); it must be owned by root",
        path.display()
    )]
    Owner { path: PathBuf, uid: u32, mode: u32 },
    #[error(
        "{} is writable by users other than root (owner uid {uid}, mode {mode:04o})",
        path.display()
    )]
    Writable { path: PathBuf, uid: u32, mode: u32 },
    #[error(
        "{} is a symlink owned by uid {uid}; only root's symlinks are followed",
        path.display()
    )]
    Symlink { path: PathBuf, uid: u32 },
    #[error("{}: too many levels of symbolic links", path.display())]
    Loop { path: PathBuf },
    #[error("cannot inspect {}", path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Checks a directory the daemon creates entries in.
pub fn check_dir(dir: &Path) -> Result<(), Untrusted> {
    walk(dir, Target::Dir)
}

/// Checks a file the daemon writes: its directory must pass
/// [`check_dir`]'s rule; the file itself may be a symlink only if root's.
pub fn check_file(file: &Path) -> Result<(), Untrusted> {
    walk(file, Target::File)
}

/// Checks the path to a file that is only opened or connected to, whose
/// own owner the caller checks (a socket): as [`check_file`], but the
/// file may sit in a sticky directory (its sticky bit keeps others from
/// replacing a root-owned entry).
pub fn check_path_to(file: &Path) -> Result<(), Untrusted> {
    walk(file, Target::Entry)
}

/// Checks a file the daemon reads and trusts (credentials, such as a
/// kubeconfig): [`check_file`]'s rule, and the file itself must be owned
/// by root and writable by no one else, since whoever can change it can
/// point the daemon at an API server of their own.
pub fn check_trusted_input(file: &Path) -> Result<(), Untrusted> {
    walk(file, Target::Input)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Dir,
    File,
    Entry,
    Input,
}

/// Root, or the daemon's own user (for unprivileged development runs).
pub fn trusted_owner(uid: u32) -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    uid == 0 || uid == unsafe { libc::geteuid() }
}

fn walk(path: &Path, target: Target) -> Result<(), Untrusted> {
    let inspect = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Untrusted::Inspect { path, source }
    };
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_err(inspect(path))?.join(path)
    };
    let mut pending: VecDeque<OsString> = components(&absolute);
    let mut current = PathBuf::from("/");
    let root = fs::symlink_metadata(&current).map_err(inspect(&current))?;
    check_dir_meta(&current, &root, pending.is_empty() && target == Target::Dir)?;
    let mut hops = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            // `current` is a resolved path whose components were checked.
            current.pop();
            continue;
        }
        let next = current.join(&name);
        let last = pending.is_empty();
        let meta = match fs::symlink_metadata(&next) {
            Ok(m) => m,
            // Created later by the daemon (and checked again then), or
            // not creatable: the caller's own error names that.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                return Ok(());
            }
            Err(e) => return Err(inspect(&next)(e)),
        };
        let ft = meta.file_type();
        if ft.is_symlink() {
            if !trusted_owner(meta.uid()) {
                return Err(Untrusted::Symlink {
                    path: next,
                    uid: meta.uid(),
                });
            }
            hops += 1;
            if hops > MAX_SYMLINKS {
                return Err(Untrusted::Loop { path: next });
            }
            let link = fs::read_link(&next).map_err(inspect(&next))?;
            if link.is_absolute() {
                current = PathBuf::from("/");
            }
            for c in components(&link).into_iter().rev() {
                pending.push_front(c);
            }
            continue;
        }
        if ft.is_dir() {
            // The directory a written file goes into is as much the target
            // as a directory written into: sticky or not, others must not
            // be able to create entries there (a planted file or symlink
            // under the file's name).
            let holds_file = target == Target::File
                && pending.len() == 1
                && pending.front().is_some_and(|n| n != "..");
            check_dir_meta(&next, &meta, (last && target == Target::Dir) || holds_file)?;
        } else if last && target == Target::Input {
            // Same owner and write rule as a directory the daemon uses.
            check_dir_meta(&next, &meta, true)?;
        } else if !last {
            // A file in the middle of the path: using it fails anyway.
            return Ok(());
        }
        current = next;
    }
    Ok(())
}

/// The normal components of `path` and its `..`s, in order.
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

fn check_dir_meta(path: &Path, meta: &fs::Metadata, is_target: bool) -> Result<(), Untrusted> {
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    if !trusted_owner(uid) {
        return Err(Untrusted::Owner {
            path: path.to_path_buf(),
            uid,
            mode,
        });
    }
    let shared = mode & 0o022 != 0;
    let sticky = mode & 0o1000 != 0;
    if shared && (is_target || !sticky) {
        return Err(Untrusted::Writable {
            path: path.to_path_buf(),
            uid,
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn private_tempdir() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        chmod(t.path(), 0o755);
        t
    }

    #[test]
    fn trusted_inputs_should_be_roots_and_writable_by_no_one_else() {
        let t = private_tempdir();
        let f = t.path().join("kubeconfig");
        fs::write(&f, "x").unwrap();
        chmod(&f, 0o600);
        check_trusted_input(&f).unwrap();
        chmod(&f, 0o666);
        assert!(matches!(
            check_trusted_input(&f),
            Err(Untrusted::Writable { .. })
        ));
        // A file the daemon writes only needs a safe directory.
        check_file(&f).unwrap();
        chmod(&f, 0o644);
        // SAFETY: geteuid(2) takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            assert!(matches!(
                check_trusted_input(&f),
                Err(Untrusted::Owner { uid: 65534, .. })
            ));
        }
    }

    #[test]
    fn private_dirs_and_missing_components_should_pass() {
        let t = private_tempdir();
        let d = t.path().join("a");
        fs::create_dir(&d).unwrap();
        chmod(&d, 0o700);
        check_dir(&d).unwrap();
        check_dir(&d.join("not/yet")).unwrap();
        check_file(&d.join("log")).unwrap();
    }

    #[test]
    fn writable_target_should_fail_even_when_sticky() {
        let t = private_tempdir();
        let d = t.path().join("w");
        fs::create_dir(&d).unwrap();
        chmod(&d, 0o777);
        assert!(matches!(
            check_dir(&d),
            Err(Untrusted::Writable { mode: 0o777, .. })
        ));
        assert!(matches!(
            check_file(&d.join("log")),
            Err(Untrusted::Writable { .. })
        ));
        chmod(&d, 0o1777);
        assert!(matches!(check_dir(&d), Err(Untrusted::Writable { .. })));
        // A file directly in a sticky directory (a logFile in /tmp).
        assert!(matches!(
            check_file(&d.join("log")),
            Err(Untrusted::Writable { mode: 0o1777, .. })
        ));
        // Only connected to (a socket whose owner the caller checks): fine.
        check_path_to(&d.join("sock")).unwrap();
        // Below a private directory of it, fine.
        let below = d.join("private");
        fs::create_dir(&below).unwrap();
        chmod(&below, 0o755);
        check_file(&below.join("log")).unwrap();
        chmod(&d, 0o775);
        assert!(matches!(check_dir(&d), Err(Untrusted::Writable { .. })));
    }

    #[test]
    fn sticky_ancestor_should_pass_but_plain_writable_ancestor_should_not() {
        let t = private_tempdir();
        let a = t.path().join("anc");
        let d = a.join("sock");
        fs::create_dir_all(&d).unwrap();
        chmod(&d, 0o755);
        chmod(&a, 0o1777);
        check_dir(&d).unwrap();
        chmod(&a, 0o777);
        let err = check_dir(&d).unwrap_err();
        assert!(
            matches!(&err, Untrusted::Writable { path, .. } if *path == a),
            "{err}"
        );
    }

    #[test]
    fn symlinks_should_be_resolved_and_their_targets_checked() {
        let t = private_tempdir();
        let open = t.path().join("open");
        fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        let link = t.path().join("link");
        std::os::unix::fs::symlink("open", &link).unwrap();
        assert!(matches!(check_dir(&link), Err(Untrusted::Writable { .. })));
        let good = t.path().join("good");
        fs::create_dir(&good).unwrap();
        let link2 = t.path().join("link2");
        std::os::unix::fs::symlink(&good, &link2).unwrap();
        check_dir(&link2).unwrap();
        check_dir(&link2.join("..").join("good")).unwrap();
        let loop_ = t.path().join("loop");
        std::os::unix::fs::symlink("loop", &loop_).unwrap();
        assert!(matches!(check_dir(&loop_), Err(Untrusted::Loop { .. })));
    }

    #[test]
    fn foreign_owner_should_fail_when_running_as_root() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let t = private_tempdir();
        let d = t.path().join("theirs");
        fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        assert!(matches!(
            check_dir(&d),
            Err(Untrusted::Owner { uid: 65534, .. })
        ));
        let link = t.path().join("link");
        std::os::unix::fs::symlink("/", &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        assert!(matches!(
            check_dir(&link),
            Err(Untrusted::Symlink { uid: 65534, .. })
        ));
    }
}
