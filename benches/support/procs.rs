//! Running plugin and shim processes with timing (one at a time or in
//! bursts), process guards, and what /proc says about a process or socket.
//!
//! A call is timed from just before `spawn` to the return of `waitpid`,
//! with stdin piped in and stdout/stderr captured: what a container runtime
//! pays for one CNI plugin execution.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use crate::support::daemon::poll;

/// One process execution: program, exact environment, stdin.
#[derive(Debug, Clone)]
pub struct Call {
    pub program: PathBuf,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
}

/// What one execution did and how long it took.
#[derive(Debug)]
pub struct Outcome {
    pub elapsed: Duration,
    /// Exit code; `None` when it could not be spawned or died of a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.stdout).ok()
    }

    /// One line for a report: exit code and the start of the output.
    pub fn describe(&self) -> String {
        let cut = |s: &str| {
            let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
            if s.chars().count() > 160 {
                format!("{}…", s.chars().take(160).collect::<String>())
            } else {
                s
            }
        };
        format!(
            "exit {:?}; stdout: {}; stderr: {}",
            self.code,
            cut(&self.stdout),
            cut(&self.stderr)
        )
    }
}

impl Call {
    pub fn new(program: impl Into<PathBuf>, env: Vec<(String, String)>, stdin: Vec<u8>) -> Self {
        Self {
            program: program.into(),
            env,
            stdin,
        }
    }

    fn command(&self) -> Command {
        crate::support::shim::command(&self.program, self.env.iter().cloned())
    }

    /// Runs the call to completion, timed from spawn to exit.
    pub fn run(&self) -> Outcome {
        let cmd = self.command();
        execute(cmd, &self.stdin, Instant::now())
    }
}

fn execute(mut cmd: Command, stdin: &[u8], t0: Instant) -> Outcome {
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome {
                elapsed: t0.elapsed(),
                code: None,
                stdout: String::new(),
                stderr: format!("cannot spawn {:?}: {e}", cmd.get_program()),
            }
        }
    };
    if let Some(mut input) = child.stdin.take() {
        // A process that exits without reading gives EPIPE; its exit code
        // and output tell what happened.
        let _ = input.write_all(stdin);
    }
    // Reads stdout and stderr to EOF, then waitpid.
    let out = child.wait_with_output();
    let elapsed = t0.elapsed();
    match out {
        Ok(o) => Outcome {
            elapsed,
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        },
        Err(e) => Outcome {
            elapsed,
            code: None,
            stdout: String::new(),
            stderr: format!("wait: {e}"),
        },
    }
}

/// Every call of a burst, started together.
#[derive(Debug)]
pub struct Burst {
    /// From the release of the start barrier to the last exit.
    pub wall: Duration,
    pub outcomes: Vec<Outcome>,
}

/// Starts every call at once (one thread per call, released by a barrier)
/// and waits for all of them.
pub fn burst(calls: &[Call]) -> Burst {
    let barrier = Arc::new(Barrier::new(calls.len() + 1));
    let handles: Vec<_> = calls
        .iter()
        .cloned()
        .map(|c| {
            let b = barrier.clone();
            thread::Builder::new()
                .name("burst".into())
                .stack_size(256 << 10)
                .spawn(move || {
                    let cmd = c.command();
                    b.wait();
                    let t0 = Instant::now();
                    let o = execute(cmd, &c.stdin, t0);
                    (t0 + o.elapsed, o)
                })
                .expect("spawn a burst thread")
        })
        .collect();
    // Taken before the release: the main thread may get the CPU back only
    // after many calls are done, so a clock read after the barrier would
    // start the wall time late.
    let start = Instant::now();
    barrier.wait();
    let mut end = start;
    let mut outcomes = Vec::with_capacity(handles.len());
    for h in handles {
        let (e, o) = h.join().expect("burst thread panicked");
        end = end.max(e);
        outcomes.push(o);
    }
    Burst {
        wall: end - start,
        outcomes,
    }
}

/// A child process that is killed (SIGKILL) and reaped on drop unless it
/// was taken out or has already exited.
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    pub fn pid(&self) -> i32 {
        self.0.as_ref().map_or(0, |c| c.id() as i32)
    }

    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("child already taken")
    }

    /// Sends `sig` to the child.
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.0 {
            // SAFETY: kill(2) on our own, not yet reaped child.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }

    /// Sends `sig` and waits for the child to exit (blocking waitpid; past
    /// `timeout` it is killed). Returns the time from the signal to the
    /// return of waitpid, and the exit code.
    pub fn stop_timed(&mut self, sig: i32, timeout: Duration) -> (Duration, Option<i32>) {
        let pid = self.pid();
        let done = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let done = done.clone();
            thread::spawn(move || {
                let deadline = Instant::now() + timeout;
                while !done.load(Ordering::SeqCst) {
                    if Instant::now() >= deadline {
                        // SAFETY: the waiter has not returned, so the
                        // child is not reaped and the pid is still ours.
                        unsafe {
                            libc::kill(pid, libc::SIGKILL);
                        }
                        return;
                    }
                    thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let t0 = Instant::now();
        self.signal(sig);
        let status = self.child().wait();
        let elapsed = t0.elapsed();
        done.store(true, Ordering::SeqCst);
        let _ = watchdog.join();
        self.0 = None;
        (elapsed, status.ok().and_then(|s| s.code()))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: i32, key: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Whether a unix socket bound to `path` is listening (`/proc/net/unix`
/// flag `__SO_ACCEPTCON`), without connecting to it.
pub fn unix_listening(path: &Path) -> bool {
    let Ok(text) = fs::read_to_string("/proc/net/unix") else {
        return false;
    };
    let want = path.to_string_lossy();
    text.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 8 && f[7] == want && f[3] == "00010000"
    })
}

/// Runs a command and returns its trimmed stdout, if it succeeded.
pub fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// CPU time of a process itself and of its reaped children
/// (`/proc/<pid>/stat` utime+stime, cutime+cstime).
pub fn proc_cpu(pid: i32) -> Option<(Duration, Duration)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // After the state: ppid pgrp session tty tpgid flags minflt cminflt
    // majflt cmajflt utime stime cutime cstime.
    let (utime, stime, cutime, cstime) = (*f.get(10)?, *f.get(11)?, *f.get(12)?, *f.get(13)?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let d = |ticks: u64| Duration::from_secs_f64(ticks as f64 / hz);
    Some((d(utime + stime), d(cutime + cstime)))
}

/// CPU time (user + system) of every reaped child of this process.
pub fn children_cpu() -> Duration {
    // SAFETY: a zeroed rusage is a valid out-parameter for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: plain getrusage(2) with a valid pointer.
    unsafe {
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU (user + system) the calling thread used so far
/// (CLOCK_THREAD_CPUTIME_ID, exact to the nanosecond): what the bench
/// itself spends to run a call.
pub fn thread_cpu() -> Duration {
    // SAFETY: a zeroed timespec is a valid out-parameter for clock_gettime.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: plain clock_gettime(2) with a valid pointer.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Run time so far of each thread of process `pid`, in nanoseconds
/// (`/proc/<pid>/task/<tid>/schedstat`: exact, where `/proc/<pid>/stat`
/// counts clock ticks).
pub fn thread_times(pid: i32) -> Vec<(u32, u64)> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let tid: u32 = e.file_name().to_str()?.parse().ok()?;
        let text = fs::read_to_string(e.path().join("schedstat")).ok()?;
        let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
        Some((tid, ns))
    })
    .collect()
}

/// CPU a process's threads used between two [`thread_times`] readings:
/// threads started in between count whole; those that ended in between
/// are missed (plexusd's pool threads live on for seconds when idle).
pub fn threads_cpu_between(before: &[(u32, u64)], after: &[(u32, u64)]) -> Duration {
    let ns: u64 = after
        .iter()
        .map(|(tid, t)| {
            let was = before.iter().find(|(b, _)| b == tid).map_or(0, |(_, v)| *v);
            t.saturating_sub(was)
        })
        .sum();
    Duration::from_nanos(ns)
}
