//! multus's readiness indicator file (`readinessindicatorfile`): a file
//! the cluster network's agent creates once it is up. ADD, STATUS and GC
//! wait for it (bounded by `readinessIndicatorTimeout`) and then answer
//! code 11 (try again later); DEL and CHECK never wait, as in multus: a
//! DEL must be able to tear down while the network is down (the runtime
//! retries it, and a blocked DEL would hold a slot for every pod being
//! removed), and CHECK only reads what is attached.
//!
//! One task watches the file's directory with inotify (the nearest
//! existing ancestor while the directory does not exist) and publishes
//! whether the file exists on a [`watch`] channel; calls wait on the
//! channel. A coarse periodic re-stat covers anything inotify misses
//! (e.g. a file system that reports no events). The file disappearing
//! later makes calls wait again; the daemon never exits for it (multus
//! does, in auto mode).

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

/// multus's wait for the file (45 attempts, one second apart).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(45);
/// How often the file is looked at even without an inotify event.
const RESTAT_INTERVAL: Duration = Duration::from_secs(5);
/// The same, when inotify is not available.
const RESTAT_WITHOUT_INOTIFY: Duration = Duration::from_millis(500);

/// The readiness indicator file's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The file (`readinessindicatorfile`).
    pub path: PathBuf,
    /// How long a call waits for it (`readinessIndicatorTimeout`).
    pub timeout: Duration,
}

/// Whether the file exists, as the watcher last saw it.
#[derive(Debug, Clone)]
pub struct Indicator {
    config: Config,
    present: watch::Receiver<bool>,
    /// Calls waiting for the file right now.
    waiting: Arc<AtomicUsize>,
}

impl Indicator {
    /// Starts the watcher task; must be called within a tokio runtime,
    /// but not from one of its tasks: the first look at the file is made
    /// here, blocking.
    pub fn watch(config: Config) -> Self {
        let (tx, rx) = watch::channel(config.path.exists());
        tokio::spawn(run(config.path.clone(), tx));
        Self {
            config,
            present: rx,
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.config.path
    }

    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// Whether the file exists.
    pub fn present(&self) -> bool {
        *self.present.borrow()
    }

    /// Why the daemon is not ready, while the file is absent.
    pub fn not_ready(&self) -> Option<String> {
        if self.present() {
            return None;
        }
        let n = self.waiting.load(Ordering::Relaxed);
        Some(format!(
            "the readiness indicator file {} does not exist; ADD, STATUS and GC wait up to {} \
             for it ({n} call{} waiting)",
            self.config.path.display(),
            crate::duration::format(self.config.timeout),
            if n == 1 { "" } else { "s" },
        ))
    }

    /// Waits until the file exists, at most the configured time; false
    /// when it did not appear in time.
    pub async fn wait(&self) -> bool {
        if self.present() {
            return true;
        }
        let _counted = Waiting::new(&self.waiting);
        let mut rx = self.present.clone();
        let waited = tokio::time::timeout(self.config.timeout, rx.wait_for(|p| *p)).await;
        matches!(waited, Ok(Ok(_)))
    }
}

/// Counts one waiting call for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Self(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An inotify instance tokio can wait on.
struct Events(Inotify);

impl AsRawFd for Events {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The directory being watched and its watch.
type Watched = Option<(PathBuf, WatchDescriptor)>;

/// The watcher: publishes whether `path` exists until every receiver is
/// gone.
async fn run(path: PathBuf, tx: watch::Sender<bool>) {
    let events = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(std::io::Error::from)
        .and_then(|i| {
            // SAFETY: the AsyncFd owns the Inotify, whose descriptor stays
            // open and the same for the AsyncFd's whole life.
            unsafe { AsyncFd::register_with_interest(Events(i), tokio::io::Interest::READABLE) }
                .map_err(std::io::Error::from)
        }) {
        Ok(fd) => Some(Arc::new(fd)),
        Err(e) => {
            tracing::warn!(
                path = %path.display(),
                cause = %e,
                "cannot watch the readiness indicator file with inotify; looking at it every {}",
                crate::duration::format(RESTAT_WITHOUT_INOTIFY)
            );
            None
        }
    };
    let interval = if events.is_some() {
        RESTAT_INTERVAL
    } else {
        RESTAT_WITHOUT_INOTIFY
    };
    // The first look is the loop's own: no tick right away.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watched: Watched = None;
    loop {
        // Reading events, moving the watch and the stat: off the runtime.
        let refreshed = tokio::task::spawn_blocking({
            let events = events.clone();
            let path = path.clone();
            move || refresh(events.as_deref(), &path, watched)
        })
        .await;
        let present;
        (present, watched) = match refreshed {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(cause = %e, "the readiness indicator file's watcher failed");
                (false, None)
            }
        };
        let changed = tx.send_if_modified(|p| std::mem::replace(p, present) != present);
        if changed {
            if present {
                tracing::info!(path = %path.display(), "the readiness indicator file exists");
            } else {
                tracing::warn!(path = %path.display(), "the readiness indicator file does not exist; ADD, STATUS and GC wait for it");
            }
        }
        tokio::select! {
            _ = tx.closed() => return,
            _ = tick.tick() => {}
            ready = async {
                match &events {
                    Some(fd) => fd.readable().await.map(|mut g| g.clear_ready()),
                    None => std::future::pending().await,
                }
            } => {
                if let Err(e) = ready {
                    tracing::warn!(cause = %e, "inotify failed; the readiness indicator file is looked at periodically");
                }
            }
        }
    }
}

/// Drains pending events, moves the watch to the nearest existing
/// directory on the way to `path`, and says whether `path` exists.
/// Blocking.
fn refresh(events: Option<&AsyncFd<Events>>, path: &Path, mut watched: Watched) -> (bool, Watched) {
    let Some(fd) = events else {
        return (path.exists(), None);
    };
    let inotify = &fd.get_ref().0;
    // That something happened is what matters; but a watched directory
    // that was removed or moved away must be watched anew (its path may
    // already exist again).
    let gone =
        AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF;
    let mut stale = false;
    while let Ok(events) = inotify.read_events() {
        if events.is_empty() {
            break;
        }
        stale |= events.iter().any(|e| e.mask.intersects(gone));
    }
    if stale {
        if let Some((_, wd)) = watched.take() {
            let _ = inotify.rm_watch(wd);
        }
    }
    // The watch goes on before the look, so a change in between is an
    // event; if the nearest directory changed meanwhile, again.
    for _ in 0..8 {
        let dir = nearest_dir(path);
        if watched.as_ref().map(|(d, _)| d) != Some(&dir) {
            if let Some((_, wd)) = watched.take() {
                // Fails harmlessly when the directory is gone.
                let _ = inotify.rm_watch(wd);
            }
            let mask = AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF
                | AddWatchFlags::IN_ONLYDIR;
            match inotify.add_watch(&dir, mask) {
                Ok(wd) => watched = Some((dir.clone(), wd)),
                Err(e) => {
                    tracing::debug!(dir = %dir.display(), cause = %e, "cannot watch the directory");
                }
            }
        }
        let present = path.exists();
        if present || nearest_dir(path) == dir {
            return (present, watched);
        }
    }
    (path.exists(), watched)
}

/// The file's directory, or its nearest ancestor that exists.
fn nearest_dir(path: &Path) -> PathBuf {
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d.as_os_str().is_empty() {
            break;
        }
        if d.is_dir() {
            return d.to_path_buf();
        }
        dir = d.parent();
    }
    PathBuf::from("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_existing_directory_should_be_watched() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("a/b/ready");
        assert_eq!(nearest_dir(&file), t.path());
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        assert_eq!(nearest_dir(&file), t.path().join("a/b"));
    }

    /// Waits (bounded) until the indicator says `present`.
    async fn until(ind: &Indicator, present: bool) {
        let mut rx = ind.present.clone();
        tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|p| *p == present))
            .await
            .expect("the indicator did not change")
            .unwrap();
    }

    #[tokio::test]
    async fn presence_should_follow_the_file_through_a_missing_directory() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("later");
        let file = top.join("dir/ready");
        let ind = Indicator::watch(Config {
            path: file.clone(),
            timeout: Duration::from_secs(20),
        });
        assert!(!ind.present());
        let waiter = {
            let ind = ind.clone();
            tokio::spawn(async move { ind.wait().await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ind.waiting.load(Ordering::Relaxed) == 0 {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::task::yield_now().await;
        }
        assert!(ind.not_ready().unwrap().contains("1 call waiting"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"").unwrap();
        assert!(waiter.await.unwrap());
        // The whole directory goes, then comes back: seen through the
        // watch on the nearest existing directory, well before the
        // periodic look.
        std::fs::remove_dir_all(&top).unwrap();
        until(&ind, false).await;
        assert!(ind.not_ready().unwrap().contains("0 calls waiting"));
        let started = tokio::time::Instant::now();
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, b"").unwrap();
        until(&ind, true).await;
        assert!(
            started.elapsed() < RESTAT_INTERVAL,
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_wait_should_end_at_the_timeout() {
        let t = tempfile::tempdir().unwrap();
        let ind = Indicator::watch(Config {
            path: t.path().join("never"),
            timeout: Duration::from_millis(200),
        });
        assert!(!ind.wait().await);
    }
}
