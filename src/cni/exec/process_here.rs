//! A plugin run waited for right on the calling thread, with poll(2): for
//! a call on a thread of its own ([`crate::op_thread`]), whose plugin's
//! pipes and exit would otherwise wake the runtime's thread, which would
//! then wake the call's. The same lifecycle as the runtime's way (see the
//! parent module): stdin fed, stdout and stderr read into bounded
//! captures until the plugin exits or the deadline passes (then its group
//! is killed), its group killed before it is reaped, the pipes drained for
//! at most [`PIPE_GRACE`]. The input is written before the first poll,
//! and the output waits in its pipes for [`PATIENCE`] once it is: a quick
//! plugin wakes the thread once, at its exit. Nothing here awaits, so
//! nothing can be dropped half-way; a panic leaves the plugin to the
//! [`Reaper`]'s Drop.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use std::sync::Arc;

use super::{kill_group, Capture, Ended, Reaper, PIPE_GRACE, STDERR_CAP, STDOUT_CAP};
use crate::op_thread::Stop;

/// How long a plugin's output may wait in its pipes once its input is
/// written (see [`run`]).
pub(in crate::cni::exec) const PATIENCE: Duration = Duration::from_millis(50);

/// A plugin's pipes (non-blocking), its pidfd, and the stop of the call's
/// thread.
pub(super) struct Pipes {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    pidfd: OwnedFd,
    stop: Option<Arc<Stop>>,
}

impl Pipes {
    pub(super) fn new(
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
        pidfd: OwnedFd,
        stop: Option<Arc<Stop>>,
    ) -> io::Result<Self> {
        for fd in [&stdin, &stdout, &stderr] {
            set_nonblocking(fd.as_fd())?;
        }
        Ok(Self {
            stdin,
            stdout,
            stderr,
            pidfd,
            stop,
        })
    }

    /// Blocks until the plugin has exited (without reaping it).
    pub(super) fn wait_exit(&self) {
        while !readable(self.pidfd.as_fd(), None) {}
    }
}

/// [`super::Process::run`] on this thread.
pub(super) fn run(
    pid: u32,
    mut reaper: Reaper,
    pipes: Pipes,
    input: Vec<u8>,
    timeout: Duration,
) -> Ended {
    let Pipes {
        stdin,
        stdout,
        stderr,
        pidfd,
        stop,
    } = pipes;
    let stop_fd = stop.as_ref().and_then(|s| s.fd());
    let mut out = Capture::new(STDOUT_CAP);
    let mut err = Capture::new(STDERR_CAP);
    // Most input fits in the pipe: written now, before the first poll.
    let mut feed = write_some((!input.is_empty()).then_some((stdin, input, 0usize)));
    let started = Instant::now();
    let deadline = started + timeout;
    let patient_until = started + PATIENCE;
    let mut timed_out = false;
    let mut stopped = false;
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            timed_out = true;
            break;
        };
        if stop.as_ref().is_some_and(|s| s.given()) {
            stopped = true;
            break;
        }
        let mut fds = vec![poll_fd(pidfd.as_fd(), libc::POLLIN)];
        if let Some((fd, _, _)) = &feed {
            fds.push(poll_fd(fd.as_fd(), libc::POLLOUT));
        }
        // Once the input is written, the output is left in its pipes for
        // a while: a plugin that answers and exits within it wakes this
        // thread once, by its exit, rather than by its answer, its pipes'
        // closing and its exit. One that writes more than a pipe holds
        // waits at most that long to be read.
        let patience = patient_until.checked_duration_since(Instant::now());
        let patient = feed.is_none() && patience.is_some();
        let reading: Vec<BorrowedFd<'_>> = [(&out, &stdout), (&err, &stderr)]
            .into_iter()
            .filter(|(c, _)| !patient && !c.is_done())
            .map(|(_, fd)| fd.as_fd())
            .collect();
        fds.extend(reading.iter().map(|fd| poll_fd(*fd, libc::POLLIN)));
        // Last, so that the indexes above do not depend on it.
        if let Some(fd) = stop_fd {
            fds.push(poll_fd(fd, libc::POLLIN));
        }
        let wait = match patience {
            Some(p) if patient => p.min(left),
            _ => left,
        };
        if let Err(e) = poll(&mut fds, Some(wait)) {
            if e.kind() != io::ErrorKind::Interrupted {
                // Out of memory for the poll table: try again shortly.
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        let exited = fds[0].revents != 0;
        if feed.is_some() && fds[1].revents != 0 {
            feed = write_some(feed);
        }
        let watched = fds.len() - usize::from(stop_fd.is_some());
        if fds[1..watched].iter().any(|p| p.revents != 0) || exited {
            out.take_ready(stdout.as_fd());
            err.take_ready(stderr.as_fd());
        }
        if exited {
            break;
        }
    }
    // A child that inherited stdin could hold it forever.
    drop(feed);
    if timed_out || stopped {
        kill_group(pid);
        while !readable(pidfd.as_fd(), None) {}
    }
    // The plugin is a zombie now, holding its group id: kill whatever it
    // left running in the group, then reap it.
    kill_group(pid);
    let status = reaper.reap_here();
    let drained = drain(&mut out, &stdout, &mut err, &stderr);
    reaper.finish();
    Ended {
        timed_out,
        stopped,
        status,
        stdout: out.into_parts(),
        stderr: err.into_parts().map(|(b, _)| b).unwrap_or_default(),
        drained,
    }
}

/// Reads what is left in the pipes until both are closed, for at most
/// [`PIPE_GRACE`]; false when something still held them open then.
fn drain(out: &mut Capture, stdout: &OwnedFd, err: &mut Capture, stderr: &OwnedFd) -> bool {
    let until = Instant::now() + PIPE_GRACE;
    loop {
        out.take_ready(stdout.as_fd());
        err.take_ready(stderr.as_fd());
        if out.is_done() && err.is_done() {
            return true;
        }
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            return false;
        };
        let mut fds: Vec<libc::pollfd> = [(&*out, stdout), (&*err, stderr)]
            .into_iter()
            .filter(|(c, _)| !c.is_done())
            .map(|(_, fd)| poll_fd(fd.as_fd(), libc::POLLIN))
            .collect();
        let _ = poll(&mut fds, Some(left));
    }
}

/// Writes what the pipe takes of the rest of the input; the feed, or
/// `None` once all of it was written or the plugin closed its stdin (a
/// plugin may exit without reading it).
fn write_some(feed: Option<(OwnedFd, Vec<u8>, usize)>) -> Option<(OwnedFd, Vec<u8>, usize)> {
    let (fd, data, mut sent) = feed?;
    while sent < data.len() {
        let rest = &data[sent..];
        // SAFETY: write(2) from a live slice into a descriptor we own.
        let n = unsafe { libc::write(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        if n > 0 {
            sent += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Some((fd, data, sent)),
            _ => return None,
        }
    }
    None
}

impl Capture {
    /// Reads what the pipe holds now, until it would block, EOF or an
    /// error (see [`Capture::fill`]).
    fn take_ready(&mut self, fd: BorrowedFd<'_>) {
        // On this thread's stack: no allocation per plugin run.
        let mut chunk = [0u8; 16 << 10];
        while !self.is_done() {
            // SAFETY: read(2) into our own buffer, within its length.
            let n = unsafe { libc::read(fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n == 0 {
                self.eof = true;
            } else if n > 0 {
                self.keep_read(&chunk[..n as usize]);
            } else {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => {}
                    io::ErrorKind::WouldBlock => return,
                    _ => self.error = Some(e),
                }
            }
        }
    }
}

fn poll_fd(fd: BorrowedFd<'_>, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }
}

/// poll(2) for at most `timeout` (rounded up to a millisecond; `None`:
/// no bound).
fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = match timeout {
        None => -1,
        Some(t) => {
            let ms = t.as_micros().div_ceil(1000);
            i32::try_from(ms).unwrap_or(i32::MAX)
        }
    };
    // SAFETY: poll(2) over a slice of pollfd we own, its length as nfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Whether `fd` became readable within `timeout` (`None`: no bound).
fn readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> bool {
    let mut fds = [poll_fd(fd, libc::POLLIN)];
    matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl(2) on a descriptor we own; F_SETFL with O_NONBLOCK
    // changes no other status flag of a pipe (it has none but its access
    // mode, which F_SETFL ignores).
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
