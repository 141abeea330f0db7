//! The guard on `CNI_NETNS`: plugins run only in a network namespace that
//! is not the host's.
//!
//! Without it, an ADD naming `/proc/self/ns/net` configured the host (an
//! interface, an address, a route), the DEL that followed took the host's
//! `lo` down, and a rollback ran the bridge plugin's DEL on a host
//! interface of the same name as `CNI_IFNAME`. The host's namespace is the
//! daemon's own (`/proc/self/ns/net`) and PID 1's (`/proc/1/ns/net`);
//! namespaces are told apart by (st_dev, st_ino) of their nsfs files, so a
//! bind mount or a symbolic link of either is recognised too. PID 1's is
//! examined once per process, by the first check.
//!
//! Blocking: call [`check`] on the blocking pool.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::OnceLock;

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
    let own = own_netns().map_err(|source| Error::Io {
        path: path.to_string(),
        what: "stat of /proc/self/ns/net (the host's namespace)",
        source,
    })?;
    // PID 1 can be out of sight (a pid namespace, ptrace rules); plexusd's
    // own namespace, the host's in any real setup, still is checked.
    // Anything else fails closed.
    let init = INIT.id(examine_init).map_err(|source| Error::Io {
        path: path.to_string(),
        what: "stat of /proc/1/ns/net (the host's namespace)",
        source,
    })?;
    for (host, reference, whose) in [
        (Some(own), SELF_NETNS, "plexusd"),
        (init, INIT_NETNS, "PID 1"),
    ] {
        if host == Some(id) {
            return Err(Error::Host {
                path: path.to_string(),
                whose,
                reference,
            });
        }
    }
    Ok(Found::Namespace)
}

/// A namespace file's identity: (st_dev, st_ino).
type NsId = (u64, u64);

/// PID 1's network namespace, as the whole process sees it.
static INIT: InitNetns = InitNetns::new();

/// What is known of PID 1's network namespace: examined until the answer
/// is its identity or that it is out of sight, then kept, as neither
/// changes while PID 1 lives. So a PID 1 out of sight is warned about once
/// per process, not on every call.
struct InitNetns(OnceLock<Option<NsId>>);

impl InitNetns {
    const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The identity of PID 1's network namespace, `None` when it is out of
    /// sight (warned about once). `examine` stats it while nothing is
    /// known; an error other than "out of sight" is returned and not kept,
    /// so the caller fails closed and the next call examines again.
    fn id(&self, examine: impl FnOnce() -> io::Result<NsId>) -> io::Result<Option<NsId>> {
        if let Some(known) = self.0.get() {
            return Ok(*known);
        }
        let found = match examine() {
            Ok(id) => Some(id),
            Err(e) if is_hidden(&e) => {
                if self.0.set(None).is_ok() {
                    warn_hidden(&e);
                }
                None
            }
            Err(e) => return Err(e),
        };
        let _ = self.0.set(found);
        // A concurrent first examination may have been kept instead.
        Ok(self.0.get().copied().unwrap_or(found))
    }
}

/// plexusd's own network namespace, stated once: plexusd never enters
/// another (its plugins do, in processes of their own). A failed stat is
/// not kept.
fn own_netns() -> io::Result<NsId> {
    static OWN: OnceLock<NsId> = OnceLock::new();
    if let Some(id) = OWN.get() {
        return Ok(*id);
    }
    let m = std::fs::metadata(SELF_NETNS)?;
    Ok(*OWN.get_or_init(|| (m.dev(), m.ino())))
}

/// Stats `/proc/1/ns/net`.
fn examine_init() -> io::Result<NsId> {
    #[cfg(test)]
    tests::INIT_EXAMINED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::fs::metadata(INIT_NETNS).map(|m| (m.dev(), m.ino()))
}

fn is_hidden(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::ENOENT)
    )
}

/// Says what a PID 1 out of sight means for the guard.
fn warn_hidden(e: &io::Error) {
    tracing::warn!(
        cause = %e,
        "cannot examine /proc/1/ns/net (PID 1's network namespace), so CNI_NETNS is compared \
         with plexusd's own network namespace only: a call may not name that namespace, by \
         any path, but a CNI_NETNS naming the host's namespace is refused only when it is \
         plexusd's own, as it is when plexusd runs in the host's network namespace"
    );
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// How often this process examined `/proc/1/ns/net`.
    pub(super) static INIT_EXAMINED: AtomicUsize = AtomicUsize::new(0);

    #[test]
    fn pid_1s_namespace_should_be_examined_once_per_process() {
        for _ in 0..12 {
            assert!(matches!(check(SELF_NETNS, false), Err(Error::Host { .. })));
        }
        assert_eq!(INIT_EXAMINED.load(Ordering::Relaxed), 1);
    }

    /// A log writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_hidden_pid_1_should_be_examined_and_warned_about_once() {
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let init = InitNetns::new();
        let mut examined = 0;
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..12 {
                let found = init.id(|| {
                    examined += 1;
                    Err(io::Error::from_raw_os_error(libc::EACCES))
                });
                assert_eq!(found.unwrap(), None);
            }
        });
        assert_eq!(examined, 1);
        let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            log.matches("cannot examine /proc/1/ns/net").count(),
            1,
            "{log}"
        );
        assert!(
            log.contains("refused only when it is plexusd's own"),
            "{log}"
        );
    }

    #[test]
    fn another_failure_to_examine_pid_1_should_fail_closed_and_be_retried() {
        let init = InitNetns::new();
        let e = init.id(|| Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(init.id(|| Ok((1, 2))).unwrap(), Some((1, 2)));
        assert_eq!(init.id(|| panic!("examined again")).unwrap(), Some((1, 2)));
    }

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
