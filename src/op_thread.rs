//! CNI calls run on a thread of their own, where their file work is done
//! in place instead of being handed to the blocking pool.
//!
//! An ADD made four trips to the blocking pool and a DEL three (the
//! network's configuration checked, the locks and the record, the spawn of
//! each plugin with the synced record write, the last write with the
//! release), each a hand-off to another thread and back: two wake-ups,
//! which on a VM cost several times the work they carry. [`OpThreads::run`]
//! instead polls the whole call on one thread of the blocking pool, with
//! the runtime's handle entered: timers and sockets stay the runtime's (its
//! thread relays their events), a plugin's pipes and pidfd are waited for
//! right there with poll(2) (`cni::exec`), tasks the call spawns
//! (the Kubernetes client's connections, posted events) go to the runtime
//! as before, and [`off_runtime`] runs the blocking work right there, as
//! the thread may block. 300 loopback ADD+DEL pairs: see BENCHMARKS.md.
//!
//! Such threads are few ([`OP_THREADS`]) so that the pool keeps threads
//! for everything else that blocks (the Kubernetes client's own calls, the
//! calls' trips when they run on the runtime): past the bound a call runs
//! on the runtime's thread as before. A call is never cancelled half-way
//! (the server lets it finish when its client hangs up); at shutdown, once
//! the runtime stops its timers and I/O, what a call still waits on fails
//! and it ends, its plugins killed as on any failure.

use std::cell::RefCell;
use std::future::Future;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use tokio::sync::Semaphore;
use tracing::Instrument;

/// How many calls may run on threads of their own at once: fewer than the
/// blocking pool's threads (64), which also serve the Kubernetes client and
/// the calls that run on the runtime, and as many as the default limit of
/// concurrent ADDs, so that a node's usual load never falls back.
pub const OP_THREADS: usize = 16;

thread_local! {
    /// While this thread runs a call for [`OpThreads::run`]: the stop of
    /// the calls it belongs to.
    static CALL: RefCell<Option<Arc<Stop>>> = const { RefCell::new(None) };
}

/// Runs `f`, blocking work: in place on a call's own thread, else on the
/// blocking pool. `Err` (with why) when it panicked or the pool could not
/// run it (the runtime is shutting down).
pub async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    if on_op_thread() {
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .map_err(|_| "it panicked".to_string());
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())
}

/// Whether this thread runs a call for [`OpThreads::run`].
pub fn on_op_thread() -> bool {
    CALL.with(|c| c.borrow().is_some())
}

/// On a call's own thread, the stop of its calls ([`OpThreads::stop`]):
/// whether it was given, and a descriptor that polls readable once it is.
pub fn stop_of_this_call() -> Option<Arc<Stop>> {
    CALL.with(|c| c.borrow().clone())
}

/// The signal that cuts off the calls still running on their own threads
/// when the daemon stops: the runtime's way of dropping a call's future,
/// which these threads cannot see (a plugin waited for with poll(2) does
/// not await). Their plugins are killed and no other one starts.
#[derive(Debug)]
pub struct Stop {
    given: AtomicBool,
    /// Readable once the stop is given: a byte is written, never read.
    read: Option<OwnedFd>,
    write: Option<OwnedFd>,
}

impl Stop {
    fn new() -> Self {
        let mut fds = [0; 2];
        // SAFETY: pipe2(2) fills the two descriptors of a new pipe.
        let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
        let (read, write) = if made == 0 {
            // SAFETY: the kernel just made both; nothing else owns them.
            unsafe {
                (
                    Some(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[0])),
                    Some(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1])),
                )
            }
        } else {
            // Without a pipe, a stop is seen before each plugin starts and
            // plugins run to their own deadline.
            (None, None)
        };
        Self {
            given: AtomicBool::new(false),
            read,
            write,
        }
    }

    /// Whether the stop was given.
    pub fn given(&self) -> bool {
        self.given.load(Ordering::Acquire)
    }

    /// Polls readable once the stop is given.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.read.as_ref().map(|fd| fd.as_fd())
    }

    fn give(&self) {
        if self.given.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(w) = &self.write {
            // SAFETY: write(2) of one byte from a local into our pipe.
            let _ = unsafe {
                libc::write(std::os::fd::AsRawFd::as_raw_fd(w), [1u8].as_ptr().cast(), 1)
            };
        }
    }
}

/// The bound on calls running on threads of their own.
#[derive(Debug, Clone)]
pub struct OpThreads {
    permits: Arc<Semaphore>,
    stop: Arc<Stop>,
}

impl Default for OpThreads {
    fn default() -> Self {
        Self::new(OP_THREADS)
    }
}

impl OpThreads {
    pub fn new(threads: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(threads)),
            stop: Arc::new(Stop::new()),
        }
    }

    /// Cuts off the calls still running on their own threads (the daemon
    /// stops and its grace ran out): their running plugins are killed as
    /// at a timeout, and no plugin starts after this.
    pub fn stop(&self) {
        self.stop.give();
    }

    /// Runs `call` to its end on a thread of its own (see the module
    /// notes), or here when [`OP_THREADS`] calls run so already or the
    /// runtime is shutting down. A panic in `call` resumes here.
    ///
    /// `call` is boxed before anything awaits it: a CNI call's future is
    /// tens of kilobytes, and held inline it would be copied into every
    /// future that awaits this one and into the task that runs them.
    pub fn run<F, T>(&self, call: F) -> impl Future<Output = T> + Send + '_
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.run_boxed(Box::pin(call))
    }

    async fn run_boxed<T>(&self, call: Pin<Box<dyn Future<Output = T> + Send>>) -> T
    where
        T: Send + 'static,
    {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return call.await;
        };
        let handle = tokio::runtime::Handle::current();
        let stop = self.stop.clone();
        let call = call.instrument(tracing::Span::current());
        // The call stays here when the pool cannot start the thread (the
        // runtime is shutting down): it then runs here.
        let parked = Arc::new(std::sync::Mutex::new(Some(call)));
        let taken = parked.clone();
        let thread = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let call = taken.lock().unwrap_or_else(|e| e.into_inner()).take()?;
            let _entered = handle.enter();
            let _flag = Flag::set(stop);
            Some(block_on(call))
        });
        match thread.await {
            Ok(Some(out)) => out,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Never started: the call is still parked.
            _ => {
                let call = parked.lock().unwrap_or_else(|e| e.into_inner()).take();
                match call {
                    Some(call) => call.await,
                    // Taken but neither finished nor panicked: cannot be.
                    None => unreachable_call(),
                }
            }
        }
    }
}

/// A call taken by its thread always ends in an answer or a panic.
fn unreachable_call() -> ! {
    panic!("a call's own thread ended without an answer")
}

/// [`CALL`] for as long as this lives (a panic included).
struct Flag;

impl Flag {
    fn set(stop: Arc<Stop>) -> Self {
        CALL.with(|c| *c.borrow_mut() = Some(stop));
        Flag
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        CALL.with(|c| *c.borrow_mut() = None);
    }
}

/// Wakes the thread that polls a call.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `fut` to its end on this thread, parking it in between. The
/// future lives on the heap, not on this thread's stack, whose touched
/// pages would stay resident for as long as the pool keeps the thread.
fn block_on<F: Future + Unpin>(mut fut: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = Pin::new(&mut fut).poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

#[cfg(test)]
#[path = "op_thread_tests.rs"]
mod tests;
