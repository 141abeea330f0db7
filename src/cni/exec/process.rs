//! One plugin process from spawn to reap: the kill-before-reap lifecycle.
//! The process runs in its own group; its stdin is fed and its output read
//! until it exits or the deadline passes; its group is killed before it is
//! reaped, so the group id cannot be reused by a stranger in between; and
//! whatever happens to the call (a timeout, a dropped future), the
//! [`Reaper`] kills and reaps it and closes its journal entry.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use super::error::io_error;
use super::remote::Remote;
use super::{Error, Gate, Group, Journal, Plugin, PluginError, SpawnClock};

#[path = "process_here.rs"]
mod here;
#[cfg(test)]
pub(super) use here::PATIENCE;
#[path = "process_reaper.rs"]
mod reaper;

use reaper::{Handle, Note, Reaper};

/// Most a plugin may print on stdout; results are a few KiB.
pub const STDOUT_CAP: usize = 1 << 20;
/// Most of a plugin's stderr that is kept (for the log and error details).
pub const STDERR_CAP: usize = 64 << 10;
/// How long to keep reading once the plugin has exited and its group was
/// killed: what it printed is in the pipe already, and the killed members
/// close their ends within microseconds. Only a process outside the group
/// that inherited the pipes keeps them open past this.
const PIPE_GRACE: Duration = Duration::from_millis(100);

/// Most the plugin spawner may take to reap a plugin that has exited.
const REMOTE_REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// libcni retries exec on ETXTBSY (a binary being replaced) this often.
const TXTBSY_RETRIES: u32 = 5;

/// How a command run by [`run_command`] ended.
#[derive(Debug)]
pub struct Finished {
    /// Killed with its group at the deadline.
    pub timed_out: bool,
    /// `None` when it could not be reaped here.
    pub status: Option<std::process::ExitStatus>,
    /// What it wrote to stderr, at most [`STDERR_CAP`] bytes.
    pub stderr: Vec<u8>,
}

/// Runs `cmd`, a helper command rather than a plugin (`name` names it in
/// errors), exactly as a plugin is run: in a process group of its own,
/// with an empty stdin, its output read until it exits or `timeout`
/// passes, its group killed before it is reaped, and nothing of it left
/// when this returns or is dropped. Its stdout is read and dropped. The
/// caller sets its environment and directory.
pub async fn run_command(
    mut cmd: std::process::Command,
    name: &str,
    timeout: Duration,
) -> Result<Finished, Error> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let plugin = Plugin::unlocated(name, PathBuf::from(cmd.get_program()));
    let (process, _) = Process::start(cmd, &plugin, None, None, None).await?;
    let ended = process.run(Vec::new(), timeout).await;
    Ok(Finished {
        timed_out: ended.timed_out,
        status: ended.status,
        stderr: ended.stderr,
    })
}

/// A spawned plugin and its pipes. Dropped at any point, its [`Reaper`]
/// kills and reaps it.
pub(super) struct Process {
    pid: u32,
    reaper: Reaper,
    pipes: Pipes,
}

/// How the plugin's pipes and exit are waited for.
enum Pipes {
    /// Through the runtime's I/O driver.
    Async {
        stdin: pipe::Sender,
        output: Box<Output>,
    },
    /// With poll(2), right on this thread: a call's own thread
    /// ([`crate::op_thread`]) running a plugin (its own child, or the spawner's).
    Here(here::Pipes),
}

impl Process {
    /// Spawns `cmd` (see [`spawn`], which also does `work`) and takes its
    /// pipes; with the outcome of `work`, when there was one.
    /// With `spawner`, the plugin spawner at that socket starts it.
    pub(super) async fn start(
        cmd: std::process::Command,
        plugin: &Plugin,
        journal: Option<(Arc<dyn Journal>, String)>,
        work: Option<Gate>,
        spawner: Option<Arc<Path>>,
    ) -> Result<(Self, Option<Result<(), String>>), Error> {
        let stop = crate::op_thread::stop_of_this_call();
        if stop.as_ref().is_some_and(|s| s.given()) {
            return Err(Error::Stopped {
                plugin: plugin.name.clone(),
            });
        }
        let ((pipes, reaper), worked) = spawn(cmd, plugin, journal, work, spawner).await?;
        let [stdin, stdout, stderr] = pipes;
        let pid = reaper.pid();
        let pipes = match stop.is_some().then(|| reaper.pidfd()).flatten() {
            Some(pidfd) => {
                let take = |fd: Option<OwnedFd>, what| {
                    fd.ok_or_else(|| io::Error::other("pipe missing"))
                        .map_err(io_error(plugin, what))
                };
                Pipes::Here(
                    here::Pipes::new(
                        take(stdin, "stdin")?,
                        take(stdout, "stdout")?,
                        take(stderr, "stderr")?,
                        pidfd,
                        stop,
                    )
                    .map_err(io_error(plugin, "its pipes"))?,
                )
            }
            None => {
                let stdin = take_pipe(stdin, pipe::Sender::from_owned_fd)
                    .map_err(io_error(plugin, "stdin"))?;
                let stdout = take_pipe(stdout, pipe::Receiver::from_owned_fd)
                    .map_err(io_error(plugin, "stdout"))?;
                let stderr = take_pipe(stderr, pipe::Receiver::from_owned_fd)
                    .map_err(io_error(plugin, "stderr"))?;
                Pipes::Async {
                    stdin,
                    output: Box::new(Output::new(stdout, stderr)),
                }
            }
        };
        Ok((Self { pid, reaper, pipes }, worked))
    }

    /// Kills the plugin's group before it was given any input, and reaps
    /// it.
    pub(super) async fn stop(self) {
        let Process {
            pid,
            mut reaper,
            pipes,
        } = self;
        match pipes {
            Pipes::Async { stdin, output } => {
                drop(stdin);
                kill_group(pid);
                reaper.exited().await;
                let _ = reaper.reap().await;
                drop(output.close());
            }
            Pipes::Here(pipes) => {
                kill_group(pid);
                pipes.wait_exit();
                let _ = reaper.reap_here();
            }
        }
        reaper.finish();
    }

    /// Gives the plugin `input` and reads its output until it exits, or
    /// until `timeout`, when its group is killed. Then kills whatever it
    /// left running in its group, reaps it, and reads what is left in the
    /// pipes (for at most [`PIPE_GRACE`]).
    ///
    /// The pipes are driven right here, not in tasks of their own: when
    /// this returns (or is dropped) nothing of the call is left running.
    pub(super) async fn run(self, input: Vec<u8>, timeout: Duration) -> Ended {
        let Process { pid, reaper, pipes } = self;
        match pipes {
            Pipes::Async { stdin, output } => {
                run_async(pid, reaper, stdin, *output, input, timeout).await
            }
            Pipes::Here(pipes) => here::run(pid, reaper, pipes, input, timeout),
        }
    }
}

/// [`Process::run`] through the runtime's I/O driver.
async fn run_async(
    pid: u32,
    mut reaper: Reaper,
    stdin: pipe::Sender,
    mut output: Output,
    input: Vec<u8>,
    timeout: Duration,
) -> Ended {
    let timed_out = until_exit(&reaper, Feed::new(stdin, input), &mut output, timeout).await;
    // The plugin is a zombie now, holding its group id: kill whatever
    // it left running in the group, then reap it.
    kill_group(pid);
    let status = reaper.reap().await;
    // What the plugin printed is in the pipes: read it. Only a process
    // that left the group can keep them open past the grace; it is
    // neither waited for nor killed.
    let drained = output.drain().await;
    let (stdout, stderr) = output.close();
    reaper.finish();
    Ended {
        timed_out,
        stopped: false,
        status,
        stdout: stdout.into_parts(),
        stderr: stderr.into_parts().map(|(b, _)| b).unwrap_or_default(),
        drained,
    }
}

/// Feeds the plugin's stdin and reads its output until it exits; when
/// `timeout` passes first, kills its group and waits for the exit. Whether
/// it timed out.
async fn until_exit(
    reaper: &Reaper,
    mut feed: Feed,
    output: &mut Output,
    timeout: Duration,
) -> bool {
    let pid = reaper.pid();
    let exited = reaper.exited();
    tokio::pin!(exited);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let timed_out = loop {
        tokio::select! {
            () = &mut exited => break false,
            () = &mut deadline => break true,
            () = feed.run(), if feed.is_open() => {}
            () = output.read(), if !output.is_done() => {}
        }
    };
    // A child that inherited stdin could hold this write forever.
    drop(feed);
    if timed_out {
        kill_group(pid);
        exited.await;
    }
    timed_out
}

/// A plugin's stdout and stderr, each read into a bounded [`Capture`].
struct Output {
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    out: Capture,
    err: Capture,
}

impl Output {
    fn new(stdout: pipe::Receiver, stderr: pipe::Receiver) -> Self {
        Self {
            stdout,
            stderr,
            out: Capture::new(STDOUT_CAP),
            err: Capture::new(STDERR_CAP),
        }
    }

    fn is_done(&self) -> bool {
        self.out.is_done() && self.err.is_done()
    }

    /// Reads both until EOF or an error. Can be abandoned at any point and
    /// resumed: what was read stays.
    async fn read(&mut self) {
        tokio::join!(
            self.out.fill(&mut self.stdout),
            self.err.fill(&mut self.stderr)
        );
    }

    /// [`Output::read`] for at most [`PIPE_GRACE`]; false when something
    /// still held the pipes open then.
    async fn drain(&mut self) -> bool {
        tokio::time::timeout(PIPE_GRACE, self.read()).await.is_ok()
    }

    /// Closes the pipes; what was read from each.
    fn close(self) -> (Capture, Capture) {
        (self.out, self.err)
    }
}

/// How a plugin run ended, before it is judged.
pub(super) struct Ended {
    pub(super) timed_out: bool,
    /// Killed because plexusd stops ([`crate::op_thread::OpThreads::stop`]).
    pub(super) stopped: bool,
    /// `None` when the plugin could not be reaped here.
    pub(super) status: Option<std::process::ExitStatus>,
    /// What it printed and whether some was dropped, or the read error.
    pub(super) stdout: io::Result<(Vec<u8>, bool)>,
    pub(super) stderr: Vec<u8>,
    /// Whether the pipes were closed within [`PIPE_GRACE`] of the exit.
    pub(super) drained: bool,
}

impl Ended {
    /// The plugin's answer to `command`: its stdout when it exited 0, else
    /// why not: a timeout, unreadable or oversized output, its CNI error,
    /// or its exit status.
    pub(super) fn judge(
        self,
        plugin: &Plugin,
        command: &'static str,
        timeout: Duration,
    ) -> Result<Vec<u8>, Error> {
        if self.stopped {
            return Err(Error::Stopped {
                plugin: plugin.name.clone(),
            });
        }
        if self.timed_out {
            return Err(Error::TimedOut {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                command,
                after: timeout,
            });
        }
        let (stdout, stdout_cut) = self.stdout.map_err(io_error(plugin, "reading stdout"))?;
        if stdout_cut {
            return Err(Error::TooMuchOutput {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                cap: STDOUT_CAP,
            });
        }
        let Some(status) = self.status else {
            return Err(io_error(plugin, "waiting for the plugin")(
                io::Error::other("exit status unavailable"),
            ));
        };
        if status.success() {
            return Ok(stdout);
        }
        let status_text = describe(status);
        if stdout.iter().all(|b| b.is_ascii_whitespace()) {
            return Err(Error::NoMessage {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                status: status_text,
                stderr: snippet(&self.stderr),
            });
        }
        match serde_json::from_slice::<PluginError>(&stdout) {
            Ok(error) => Err(Error::Failed {
                plugin: plugin.name.clone(),
                error,
            }),
            Err(_) => Err(Error::BadError {
                plugin: plugin.name.clone(),
                path: plugin.path.clone(),
                status: status_text,
                stdout: snippet(&stdout),
            }),
        }
    }
}

/// Why [`spawn`]'s blocking part failed.
enum SpawnFailure {
    Exec(io::Error),
    Journal(io::Error),
}

/// Spawns off the runtime (fork+exec waits for the exec; see
/// [`crate::op_thread::off_runtime`]), retrying
/// "text file busy" like libcni. With a journal, the plugin's group is
/// noted there before this returns, that is before its stdin is written.
/// The reaper is made on the blocking pool too: if this future is dropped
/// while the spawn runs, dropping its output there kills and reaps the
/// plugin.
///
/// `work` runs in the same trip to the blocking pool, right after the
/// first spawn attempt, whether it worked or not: its disk waits (an ADD's
/// synced record) overlap the plugin's start-up, which follows the exec,
/// and the trip wakes one blocking thread, not two. Its outcome comes back
/// with the child.
async fn spawn(
    mut cmd: std::process::Command,
    plugin: &Plugin,
    journal: Option<(Arc<dyn Journal>, String)>,
    mut work: Option<Gate>,
    spawner: Option<Arc<Path>>,
) -> Result<(([Option<OwnedFd>; 3], Reaper), Option<Result<(), String>>), Error> {
    let mut tries = 0;
    // The work's outcome, from the first trip (the only one it runs in).
    let mut worked: Option<Result<(), String>> = None;
    loop {
        let journal = journal.clone();
        let spawner = spawner.clone();
        let work_now = work.take();
        let trip = crate::op_thread::off_runtime(move || {
            let clock = SpawnClock::start();
            let spawned = match &spawner {
                Some(socket) => Remote::spawn(socket, &cmd).map(|(remote, p)| {
                    let pipes = [Some(p.stdin), Some(p.stdout), Some(p.stderr)];
                    (pipes, Handle::Remote(remote))
                }),
                None => cmd.spawn().map(|mut child| {
                    let pipes = [
                        child.stdin.take().map(OwnedFd::from),
                        child.stdout.take().map(OwnedFd::from),
                        child.stderr.take().map(OwnedFd::from),
                    ];
                    (pipes, Handle::Local(child))
                }),
            };
            let clock = clock.stop();
            let r = match spawned {
                Ok((pipes, handle)) => start(handle, journal, clock).map(|reaper| (pipes, reaper)),
                Err(e) => Err(SpawnFailure::Exec(e)),
            };
            // The plugin starts up (or the spawn failed) while this runs;
            // its stdin is not written before the caller has the outcome.
            let worked = work_now.map(|w| w());
            (cmd, r, worked)
        })
        .await;
        let (back, res, now) = match trip {
            Ok(done) => done,
            Err(e) => {
                return Err(Error::Spawn {
                    plugin: plugin.name.clone(),
                    path: plugin.path.clone(),
                    source: io::Error::other(e),
                });
            }
        };
        cmd = back;
        if now.is_some() {
            worked = now;
        }
        if let Err(SpawnFailure::Exec(e)) = &res {
            if e.raw_os_error() == Some(libc::ETXTBSY) && tries < TXTBSY_RETRIES {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        // Whatever the spawn did, the work is over before the caller goes
        // on (a failed ADD's rollback must not race the record's write):
        // it ran in the first trip, and a lost trip returned above.
        match res {
            Ok(started) => return Ok((started, worked)),
            Err(SpawnFailure::Exec(source)) => {
                return Err(Error::Spawn {
                    plugin: plugin.name.clone(),
                    path: plugin.path.clone(),
                    source,
                })
            }
            Err(SpawnFailure::Journal(source)) => {
                return Err(Error::Io {
                    plugin: plugin.name.clone(),
                    path: plugin.path.clone(),
                    what: "noting the plugin's process group before giving it its config",
                    source,
                })
            }
        }
    }
}

/// Blocking: notes a just spawned plugin in the journal. When that fails,
/// the plugin is killed and reaped before it has read anything (its stdin
/// was not written). Its start time is `clock`'s when the spawn took no
/// tick boundary (see [`SpawnClock::start_time_of`]), else read from /proc.
fn start(
    handle: Handle,
    journal: Option<(Arc<dyn Journal>, String)>,
    clock: SpawnClock,
) -> Result<Reaper, SpawnFailure> {
    let pid = handle.id();
    let Some((journal, container_id)) = journal else {
        return Ok(Reaper::new(handle, None));
    };
    let noted = i32::try_from(pid)
        .ok()
        .and_then(|pgid| {
            // The unreaped child is still in /proc, even if it exited.
            let start_time = clock.start_time_of(pgid)?;
            Some(Group { pgid, start_time })
        })
        .ok_or_else(|| {
            io::Error::other(format!(
                "cannot read the start time of pid {pid} in /proc/{pid}/stat"
            ))
        })
        .and_then(|group| {
            journal.started(&container_id, group)?;
            Ok(group)
        });
    match noted {
        Ok(group) => {
            let note = Note {
                journal,
                container_id,
                group,
            };
            Ok(Reaper::new(handle, Some(note)))
        }
        Err(e) => {
            kill_group(pid);
            // We are on the blocking pool; the plugin is dead or dying.
            handle.reap_blocking();
            Err(SpawnFailure::Journal(e))
        }
    }
}

fn take_pipe<T>(fd: Option<OwnedFd>, wrap: impl FnOnce(OwnedFd) -> io::Result<T>) -> io::Result<T> {
    wrap(fd.ok_or_else(|| io::Error::other("pipe missing"))?)
}

/// A plugin's stdin being written. Every step can be abandoned (the select
/// loop drops it) without losing track of what was sent.
struct Feed {
    pipe: Option<pipe::Sender>,
    data: Vec<u8>,
    sent: usize,
}

impl Feed {
    fn new(pipe: pipe::Sender, data: Vec<u8>) -> Self {
        let mut feed = Self {
            pipe: Some(pipe),
            data,
            sent: 0,
        };
        if feed.data.is_empty() {
            feed.close();
        }
        feed
    }

    fn is_open(&self) -> bool {
        self.pipe.is_some()
    }

    /// Writes the rest, then closes the pipe so the plugin sees EOF.
    async fn run(&mut self) {
        while let Some(tx) = &mut self.pipe {
            match tx.write(&self.data[self.sent..]).await {
                Ok(n) if n > 0 => {
                    self.sent += n;
                    if self.sent >= self.data.len() {
                        self.close();
                    }
                }
                // A plugin may exit without reading stdin: EPIPE is fine.
                _ => self.close(),
            }
        }
    }

    fn close(&mut self) {
        self.pipe = None;
        self.data = Vec::new();
    }
}

/// Output of a plugin being read, keeping at most `cap` bytes (and draining
/// the rest so the writer never blocks). Reading can be abandoned at any
/// point and resumed: what was read stays here.
struct Capture {
    buf: Vec<u8>,
    cap: usize,
    cut: bool,
    eof: bool,
    error: Option<io::Error>,
    chunk: Vec<u8>,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
            cut: false,
            eof: false,
            error: None,
            chunk: Vec::new(),
        }
    }

    fn is_done(&self) -> bool {
        self.eof || self.error.is_some()
    }

    /// Reads until EOF or an error.
    async fn fill(&mut self, r: &mut pipe::Receiver) {
        // A plugin's answer is a few KiB at most: a larger chunk only for
        // one that prints more.
        if self.chunk.is_empty() {
            self.chunk = vec![0u8; 4 << 10];
        }
        while !self.is_done() {
            match r.read(&mut self.chunk).await {
                Ok(0) => self.eof = true,
                Ok(n) => self.keep(n),
                Err(e) => self.error = Some(e),
            }
        }
    }

    /// Keeps what fits of the `n` bytes just read into the chunk; a full
    /// chunk makes the next read larger.
    fn keep(&mut self, n: usize) {
        let chunk = std::mem::take(&mut self.chunk);
        self.keep_read(&chunk[..n]);
        self.chunk = chunk;
        if n == self.chunk.len() && n < 16 << 10 {
            self.chunk.resize(16 << 10, 0);
        }
    }

    /// Keeps what fits of `read`, bytes read elsewhere.
    fn keep_read(&mut self, read: &[u8]) {
        let room = self.cap.saturating_sub(self.buf.len());
        if read.len() > room {
            self.cut = true;
        }
        self.buf.extend_from_slice(&read[..read.len().min(room)]);
    }

    /// What was read and whether some was dropped; the read error if any.
    fn into_parts(self) -> io::Result<(Vec<u8>, bool)> {
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.buf, self.cut)),
        }
    }
}

/// Waits until our child `pid` has exited, without reaping it: on a pidfd
/// (readable once the process exits; no thread is held), or, on kernels
/// without pidfd_open(2), with waitid(WNOWAIT) on the blocking pool.
async fn wait_exit(pid: u32) {
    if let Some(fd) = pidfd_open(pid) {
        if wait_pidfd_ok(fd).await {
            return;
        }
    }
    let _ = tokio::task::spawn_blocking(move || wait_exit_nowait(pid)).await;
}

/// Waits until the process of pidfd `fd` has exited (or the fd cannot
/// tell).
async fn wait_pidfd(fd: OwnedFd) {
    let _ = wait_pidfd_ok(fd).await;
}

/// [`wait_pidfd`]: false when the fd could not tell.
async fn wait_pidfd_ok(fd: OwnedFd) -> bool {
    // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open
    // and the same for the AsyncFd's whole life.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    match registered {
        // Readable means exited.
        Ok(fd) => fd.readable().await.is_ok(),
        Err(_) => false,
    }
}

/// A pidfd of `pid` (readable once it exits); `None` where the kernel
/// has none (before 5.3).
pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Some(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// Blocks until `pid` has exited, without reaping it (WNOWAIT).
fn wait_exit_nowait(pid: u32) {
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: plain waitid(2) on our own child with a valid pointer.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// SIGKILLs the process group our unreaped child `pid` leads.
pub(crate) fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals the process group our
        // (still unreaped) child leads; no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    if let Some(sig) = status.signal() {
        format!("killed by signal {sig}")
    } else if let Some(code) = status.code() {
        format!("exit status {code}")
    } else {
        status.to_string()
    }
}

/// The first 4 KiB of some output, as text.
pub(super) fn snippet(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(4096)];
    String::from_utf8_lossy(cut).trim().to_string()
}
