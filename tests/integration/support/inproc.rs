//! The library's HTTP server in-process on a real unix socket, with a
//! handler the test supplies (plugin-free fakes for speed and error paths).

use std::num::NonZeroUsize;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plexus::api;
use plexus::limit::{self, Admission, ConnectionLimit};
use plexus::metrics::Metrics;
use plexus::server::{self, Handler, Shared};
use tokio_util::sync::CancellationToken;

use super::daemon::TestDir;

/// A running server; stopped (and drained) on drop.
pub struct InProcess {
    pub sock: PathBuf,
    pub dir: TestDir,
    stop: CancellationToken,
    rt: tokio::runtime::Runtime,
    task: Option<tokio::task::JoinHandle<server::Drained>>,
}

impl InProcess {
    /// Serves `<TestDir(name)>/plexus.sock` with `handler`, at most
    /// `limit` CNI requests at once (None: no limit), waiting up to `queue`.
    pub fn start<H: Handler>(
        name: &str,
        handler: H,
        limit: Option<usize>,
        queue: Duration,
    ) -> Self {
        let dir = TestDir::new(name);
        let sock = dir.join(api::SOCKET_NAME);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let std_listener = UnixListener::bind(&sock).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        // The cap plexusd would fit to this process's RLIMIT_NOFILE, so that
        // ConnectionLimit never raises the limit of the process every test
        // shares (as plexusd raises its own).
        let max_connections =
            limit::fit_to_descriptors(1024, limit.map(|n| n.saturating_mul(2)), soft_nofile());
        let lcfg = limit::Config {
            connection_limit: limit.and_then(NonZeroUsize::new),
            delete_limit: limit.and_then(NonZeroUsize::new),
            queue_timeout: queue,
            max_connections: NonZeroUsize::new(max_connections).unwrap(),
        };
        let stop = CancellationToken::new();
        let task = {
            let _in_runtime = rt.enter();
            let listener = tokio::net::UnixListener::from_std(std_listener).unwrap();
            let metrics = Arc::new(Metrics::new());
            let shared = Arc::new(Shared::new(
                server::Config {
                    read_timeout: Duration::from_secs(10),
                    max_body_bytes: api::MAX_BODY_BYTES,
                    body_budget_bytes: server::DEFAULT_BODY_BUDGET_BYTES,
                },
                handler,
                Admission::new(&lcfg, metrics.clone()),
                metrics,
            ));
            rt.spawn(server::run(
                vec![listener],
                shared,
                ConnectionLimit::new(&lcfg),
                stop.clone(),
                Duration::from_secs(5),
                false,
            ))
        };
        Self {
            sock,
            dir,
            stop,
            rt,
            task: Some(task),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = self.rt.block_on(t);
        }
    }
}

/// The soft `RLIMIT_NOFILE` of this process.
fn soft_nofile() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(r, 0, "getrlimit: {}", std::io::Error::last_os_error());
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}
