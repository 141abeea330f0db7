//! A plugin started by the plugin spawner (`plexus-spawner`, see
//! [`crate::spawner`]) instead of by plexusd itself: the client's side of
//! the protocol. The plugin's lifecycle is the same as a local one's: its
//! exit is seen on a pidfd, its group is killed by plexusd before it is
//! reaped (the spawner keeps it unreaped until asked), and a run abandoned
//! half-way closes the connection, on which the spawner kills and reaps it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, SockFlag, SockType, UnixAddr};
use std::os::unix::process::ExitStatusExt;

use crate::spawner::{self, Reap, Reaped, Request, Started};

/// How long the spawner may take to accept and answer a start (it answers
/// in microseconds; a spawner that is being started by systemd, a few
/// milliseconds).
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A plugin the spawner started, unreaped until [`Remote::reap`].
#[derive(Debug)]
pub(super) struct Remote {
    conn: OwnedFd,
    pid: u32,
    pidfd: OwnedFd,
}

/// Plexusd's ends of a remote plugin's stdin, stdout and stderr.
pub(super) struct Pipes {
    pub(super) stdin: OwnedFd,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
}

impl Remote {
    /// Blocking: asks the spawner at `socket` to start `cmd` (its program,
    /// the variables set on it, its directory; `PATH` comes from the
    /// spawner's environment, as a runtime's plugins get the runtime's).
    pub(super) fn spawn(socket: &Path, cmd: &std::process::Command) -> io::Result<(Self, Pipes)> {
        let program = cmd
            .get_program()
            .to_str()
            .ok_or_else(|| io::Error::other("the plugin's path is not UTF-8"))?
            .to_string();
        let env = cmd
            .get_envs()
            .filter(|(k, _)| *k != "PATH")
            .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string())))
            .collect();
        let dir = cmd
            .get_current_dir()
            .and_then(Path::to_str)
            .unwrap_or("/")
            .to_string();
        let request = Request { program, env, dir };

        let conn = connect(socket)?;
        let (child_stdin, stdin) = pipe()?;
        let (stdout, child_stdout) = pipe()?;
        let (stderr, child_stderr) = pipe()?;
        spawner::send(
            conn.as_fd(),
            &request,
            &[
                child_stdin.as_raw_fd(),
                child_stdout.as_raw_fd(),
                child_stderr.as_raw_fd(),
            ],
        )
        .map_err(|e| unreachable_spawner(socket, &e))?;
        drop((child_stdin, child_stdout, child_stderr));
        let mut answer =
            spawner::recv(conn.as_fd(), 1).map_err(|e| unreachable_spawner(socket, &e))?;
        match answer.decode::<Started>()? {
            Started::Pid(pid) => {
                let pidfd = answer
                    .fds
                    .pop()
                    .ok_or_else(|| io::Error::other("the spawner sent no pidfd"))?;
                nix::fcntl::fcntl(
                    &conn,
                    nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
                )?;
                let remote = Self { conn, pid, pidfd };
                Ok((
                    remote,
                    Pipes {
                        stdin,
                        stdout,
                        stderr,
                    },
                ))
            }
            Started::Failed { error, errno } => Err(match errno {
                // Retried like a local exec's ETXTBSY.
                Some(libc::ETXTBSY) => io::Error::from_raw_os_error(libc::ETXTBSY),
                _ => io::Error::other(format!("the plugin spawner: {error}")),
            }),
        }
    }

    pub(super) fn id(&self) -> u32 {
        self.pid
    }

    /// A pidfd of the plugin, readable once it exits.
    pub(super) fn pidfd(&self) -> io::Result<OwnedFd> {
        self.pidfd.try_clone()
    }

    /// Once the plugin has exited and its group was killed: has the
    /// spawner reap it, and returns its status.
    pub(super) async fn reap(self) -> io::Result<ExitStatus> {
        spawner::send(self.conn.as_fd(), &Reap { reap: true }, &[])?;
        // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays
        // open and the same for the AsyncFd's whole life.
        let conn = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                self.conn,
                tokio::io::Interest::READABLE,
            )
        }?;
        let packet = loop {
            let mut ready = conn.readable().await?;
            match ready.try_io(|fd| spawner::recv(fd.as_fd(), 0)) {
                Ok(result) => break result?,
                Err(_would_block) => continue,
            }
        };
        match packet.decode::<Reaped>()? {
            Reaped::Status(raw) => Ok(ExitStatus::from_raw(raw)),
            Reaped::Failed(why) => Err(io::Error::other(format!("the plugin spawner: {why}"))),
        }
    }
}

impl Remote {
    /// Blocking, for a call's own thread: [`Remote::reap`] with poll(2),
    /// waiting at most `timeout` for the spawner's answer, and no longer
    /// once `stop` (the call thread's stop) is readable: the connection
    /// then closes, on which the spawner kills and reaps the plugin itself.
    pub(super) fn reap_here(
        self,
        timeout: Duration,
        stop: Option<BorrowedFd<'_>>,
    ) -> io::Result<ExitStatus> {
        spawner::send(self.conn.as_fd(), &Reap { reap: true }, &[])?;
        let deadline = Instant::now() + timeout;
        let packet = loop {
            match spawner::recv(self.conn.as_fd(), 0) {
                Ok(packet) => break packet,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the plugin spawner did not answer the reap",
                ));
            };
            let watch = |fd: i32| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // Without a stop, -1: poll(2) ignores the entry.
            let mut fds = [
                watch(self.conn.as_raw_fd()),
                watch(stop.map_or(-1, |s| s.as_raw_fd())),
            ];
            let ms = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
            // SAFETY: poll(2) of two pollfds we own, their count as nfds.
            // The connection's outcome is read back by the recv above (an
            // error or hang-up included).
            unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            if fds[1].revents != 0 {
                return Err(io::Error::other(
                    "the daemon stops: the plugin spawner reaps the plugin itself",
                ));
            }
        };
        match packet.decode::<Reaped>()? {
            Reaped::Status(raw) => Ok(ExitStatus::from_raw(raw)),
            Reaped::Failed(why) => Err(io::Error::other(format!("the plugin spawner: {why}"))),
        }
    }
}

fn connect(socket: &Path) -> io::Result<OwnedFd> {
    let fd = socket::socket(
        socket::AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let timeout = nix::sys::time::TimeVal::new(START_TIMEOUT.as_secs() as _, 0);
    socket::setsockopt(&fd, socket::sockopt::ReceiveTimeout, &timeout)?;
    socket::setsockopt(&fd, socket::sockopt::SendTimeout, &timeout)?;
    let addr = UnixAddr::new(socket)?;
    loop {
        match socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(unreachable_spawner(socket, &e.into())),
        }
    }
    // A plugin's pipes, its CNI variables and the kill of the group it
    // names go only to a spawner of our own user (root): never to one that
    // another user bound at a misconfigured path.
    let peer = socket::getsockopt(&fd, socket::sockopt::PeerCredentials)?;
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let own = unsafe { libc::geteuid() };
    if peer.uid() != own {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "refused the plugin spawner at {}: it runs as uid {} (pid {}), not {own}",
                socket.display(),
                peer.uid(),
                peer.pid()
            ),
        ));
    }
    Ok(fd)
}

fn unreachable_spawner(socket: &Path, e: &io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "cannot reach the plugin spawner at {} ({e}): is plexus-plugins.socket running?",
            socket.display()
        ),
    )
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Plexusd's end of a connection to a spawner (non-blocking, as after
    /// a start) and the spawner's end.
    fn connection() -> (Remote, OwnedFd) {
        let (ours, spawner) = socket::socketpair(
            socket::AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .unwrap();
        nix::fcntl::fcntl(
            &spawner,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        )
        .unwrap();
        // The pidfd plays no part in the reap.
        let pidfd = ours.try_clone().unwrap();
        let remote = Remote {
            conn: ours,
            pid: 0,
            pidfd,
        };
        (remote, spawner)
    }

    #[test]
    fn a_reap_on_a_calls_thread_should_ask_the_spawner_and_read_its_answer() {
        let (remote, spawner) = connection();
        let answer = std::thread::spawn(move || {
            let asked = spawner::recv(spawner.as_fd(), 0).unwrap();
            assert!(asked.decode::<Reap>().unwrap().reap);
            spawner::send(spawner.as_fd(), &Reaped::Status(3 << 8), &[]).unwrap();
            spawner
        });
        let status = remote.reap_here(Duration::from_secs(10), None).unwrap();
        assert_eq!(status.code(), Some(3));
        drop(answer.join().unwrap());
    }

    #[tokio::test]
    async fn a_stop_should_end_a_reap_that_the_spawner_leaves_unanswered() {
        let (remote, _spawner) = connection();
        let ops = crate::op_thread::OpThreads::new(1);
        ops.stop();
        let (took, out) = ops
            .run(async move {
                let stop = crate::op_thread::stop_of_this_call().unwrap();
                let started = Instant::now();
                let out = remote.reap_here(Duration::from_secs(10), stop.fd());
                (started.elapsed(), out)
            })
            .await;
        assert!(out.is_err());
        assert!(took < Duration::from_secs(5), "the reap waited {took:?}");
    }
}
