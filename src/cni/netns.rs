//! The guard on `CNI_NETNS`: plugins run only in a network namespace that
//! is not the host's.
//!
//! Without it, an ADD naming `/proc/self/ns/net` configured the host (an
//! interface, an address, a route), the DEL that followed took the host's
//! `lo` down, and a rollback ran the bridge plugin's DEL on a host
//! interface of the same name as `CNI_IFNAME`. The host's namespace is the
//! daemon's own (`/proc/self/ns/net`) and PID 1's (`/proc/1/ns/net`);
//! namespaces are told apart by (st_dev, st_ino) of their nsfs files, so a
//! bind mount or a symbolic link of either is recognised too.
//!
//! Blocking: call [`check`] on the blocking pool.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// `f_type` of nsfs, the file system of namespace files (linux/magic.h).
pub const NSFS_MAGIC: i64 = 0x6e73_6673;
/// The network namespace of this daemon.
pub const SELF_NETNS: &str = "/proc/self/ns/net";
/// The network namespace of PID 1, the host's init.
pub const INIT_NETNS: &str = "/proc/1/ns/net";
/// `NS_GET_NSTYPE`, `_IO(0xb7, 0x3)` (linux/nsfs.h, Linux 4.11).
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// What [`check`] found acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A network namespace other than the host's.
    Namespace,
    /// Nothing at the path: the namespace is gone (DEL only).
    Gone,
    /// Something that is not a namespace (DEL only): no plugin can enter
    /// it, so it cannot lead one into the host.
    NotNamespace,
}

/// Why `CNI_NETNS` is refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CNI_NETNS {path:?} is the network namespace of {whose} ({reference}), the host's own; plugins never run there")]
    Host {
        path: String,
        whose: &'static str,
        reference: &'static str,
    },
    #[error("CNI_NETNS {path:?} does not exist")]
    Missing { path: String },
    #[error("CNI_NETNS {path:?} is not a network namespace: {why}")]
    NotNamespace { path: String, why: String },
    #[error("CNI_NETNS {path:?} cannot be examined: {what}: {source}")]
    Io {
        path: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Checks `path` as the `CNI_NETNS` of a call. It must be a network
/// namespace other than the host's; when `may_be_gone` (DEL), a path that
/// no longer exists, or names something that is not a namespace (a pod's
/// unmounted leftover), is accepted, as plugins handle those, but the host's
/// namespace never is. Blocking.
pub fn check(path: &str, may_be_gone: bool) -> Result<Found, Error> {
    let io_err = |what: &'static str| {
        let path = path.to_string();
        move |source| Error::Io { path, what, source }
    };
    // statfs on the path first: only an nsfs file is opened, so a FIFO or a
    // device named here is never opened.
    match statfs_type(Path::new(path)) {
        Ok(t) if t == NSFS_MAGIC => {}
        Ok(t) if may_be_gone => {
            tracing::warn!(
                netns = path,
                fs_type = format_args!("{t:#x}"),
                "CNI_NETNS is not a namespace; the plugins get it as it is"
            );
            return Ok(Found::NotNamespace);
        }
        Ok(t) => {
            return Err(Error::NotNamespace {
                path: path.to_string(),
                why: format!("its file system type is {t:#x}, not nsfs ({NSFS_MAGIC:#x})"),
            })
        }
        Err(e) if is_gone(&e) && may_be_gone => return Ok(Found::Gone),
        Err(e) if is_gone(&e) => {
            return Err(Error::Missing {
                path: path.to_string(),
            })
        }
        Err(e) => return Err(io_err("statfs")(e)),
    }
    // Everything else on one descriptor, so the answers are about one file.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if is_gone(&e) && may_be_gone => return Ok(Found::Gone),
        Err(e) if is_gone(&e) => {
            return Err(Error::Missing {
                path: path.to_string(),
            })
        }
        Err(e) => return Err(io_err("open")(e)),
    };
    let t = fstatfs_type(&file).map_err(io_err("fstatfs"))?;
    if t != NSFS_MAGIC {
        return Err(Error::NotNamespace {
            path: path.to_string(),
            why: format!("it was replaced by a file of type {t:#x}"),
        });
    }
    match ns_type(&file) {
        Ok(kind) if kind != libc::CLONE_NEWNET => {
            return Err(Error::NotNamespace {
                path: path.to_string(),
                why: format!("it is a namespace of another kind ({})", kind_name(kind)),
            })
        }
        Ok(_) => {}
        // Kernels before 4.11 cannot tell; the plugins' setns will.
        Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => {}
        Err(e) => return Err(io_err("NS_GET_NSTYPE")(e)),
    }
    let meta = file.metadata().map_err(io_err("fstat"))?;
    let id = (meta.dev(), meta.ino());
    for (reference, whose) in [(SELF_NETNS, "plexusd"), (INIT_NETNS, "PID 1")] {
        let host = match std::fs::metadata(reference) {
            Ok(m) => m,
            // PID 1 can be out of sight (a pid namespace, ptrace rules);
            // plexusd's own namespace, the host's in any real setup, still
            // is checked. Anything else fails closed.
            Err(e) if reference == INIT_NETNS && is_hidden(&e) => {
                warn_once_hidden(&e);
                continue;
            }
            Err(source) => {
                return Err(Error::Io {
                    path: path.to_string(),
                    what: if reference == SELF_NETNS {
                        "stat of /proc/self/ns/net (the host's namespace)"
                    } else {
                        "stat of /proc/1/ns/net (the host's namespace)"
                    },
                    source,
                })
            }
        };
        if (host.dev(), host.ino()) == id {
            return Err(Error::Host {
                path: path.to_string(),
                whose,
                reference,
            });
        }
    }
    Ok(Found::Namespace)
}

fn is_hidden(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::ENOENT)
    )
}

fn warn_once_hidden(e: &io::Error) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(cause = %e, "cannot examine /proc/1/ns/net: CNI_NETNS is compared with plexusd's own network namespace only");
    });
}

fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

fn statfs_type(path: &Path) -> io::Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path holds a NUL byte"))?;
    // SAFETY: a zeroed statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs(2) writes into a struct we own; `c` is a valid
    // NUL-terminated string for the duration of the call.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

fn fstatfs_type(file: &File) -> io::Result<i64> {
    // SAFETY: a zeroed statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs(2) on a descriptor `file` owns, into a struct we own.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

fn ns_type(file: &File) -> io::Result<libc::c_int> {
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the type; the
    // descriptor is owned by `file`.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

fn kind_name(kind: libc::c_int) -> String {
    let name = match kind {
        libc::CLONE_NEWNS => "mnt",
        libc::CLONE_NEWUTS => "uts",
        libc::CLONE_NEWIPC => "ipc",
        libc::CLONE_NEWUSER => "user",
        libc::CLONE_NEWPID => "pid",
        libc::CLONE_NEWCGROUP => "cgroup",
        libc::CLONE_NEWTIME => "time",
        _ => return format!("type {kind:#x}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_namespace_should_be_refused_by_any_name() {
        for p in [SELF_NETNS, INIT_NETNS, "/proc/thread-self/ns/net"] {
            for may_be_gone in [false, true] {
                match check(p, may_be_gone) {
                    Err(Error::Host { .. }) => {}
                    // Where PID 1 is out of sight (some sandboxes), its
                    // namespace cannot be entered either, and is refused.
                    Err(Error::Io { source, .. }) if p == INIT_NETNS && is_hidden(&source) => {}
                    other => panic!("{p}: {other:?}"),
                }
            }
        }
        let own = format!("/proc/{}/ns/net", std::process::id());
        let e = check(&own, false).unwrap_err().to_string();
        assert!(e.contains(&own) && e.contains("plexusd"), "{e}");
    }

    #[test]
    fn other_namespaces_and_files_should_be_refused_for_add() {
        match check("/proc/self/ns/uts", false) {
            Err(Error::NotNamespace { why, .. }) => assert!(why.contains("uts"), "{why}"),
            other => panic!("{other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("netns");
        std::fs::write(&file, b"").unwrap();
        let file = file.to_str().unwrap();
        assert!(matches!(
            check(file, false),
            Err(Error::NotNamespace { .. })
        ));
        assert_eq!(check(file, true).unwrap(), Found::NotNamespace);
        let gone = dir.path().join("gone");
        let gone = gone.to_str().unwrap();
        assert!(matches!(check(gone, false), Err(Error::Missing { .. })));
        assert_eq!(check(gone, true).unwrap(), Found::Gone);
        // A FIFO is never opened (that would block).
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo(3) on a valid path string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            check(fifo.to_str().unwrap(), false),
            Err(Error::NotNamespace { .. })
        ));
    }
}
