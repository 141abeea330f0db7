//! The plugin spawner: a small process outside plexusd's sandbox that starts
//! CNI plugins on plexusd's behalf, so that a plugin sees what it would see
//! as a child of the container runtime (the host's file system, every
//! capability, no system call filter, the runtime's umask and limits)
//! while plexusd itself keeps its hardening. `plexus-spawner` serves it
//! ([`serve`]); plexusd's plugin runner is the client (`cni::exec`).
//!
//! The protocol, one `SOCK_SEQPACKET` connection per plugin run (each
//! message one packet of JSON, at most [`MAX_MESSAGE`] bytes):
//!
//! 1. The client sends a [`Request`] (the plugin's path, its CNI variables,
//!    its directory) with three descriptors: the plugin's stdin, stdout and
//!    stderr (pipe ends the client made).
//! 2. The spawner starts the plugin in a process group of its own, with its
//!    own environment under the request's variables, and answers
//!    [`Started`]: the pid, with a pidfd of the plugin (taken while the
//!    plugin is unreaped, so it names that process and no other), or why
//!    the start failed and its errno.
//! 3. The plugin is not reaped until the client says so, so its process
//!    group id cannot be reused meanwhile: the client watches the pidfd,
//!    kills the group itself when it must (same user), and sends
//!    [`Reap`]; the spawner kills whatever is left in the group, reaps the
//!    plugin and answers [`Reaped`] with its wait status.
//! 4. A connection that closes first (the client gave up, or plexusd died)
//!    has its plugin's group killed and the plugin reaped: nothing a dead
//!    daemon started keeps running.
//!
//! Who may ask: only a peer with the spawner's own user id (root), and
//! only for a program in one of the configured `binDir` directories that
//! no other user can change (see [`serve::allowed`]): a compromised
//! plexusd can run the node's plugins, as the runtime can, but nothing
//! else outside its sandbox.

pub mod serve;

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use serde::{Deserialize, Serialize};

/// Largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 256 << 10;
/// Where the packaged `plexus-plugins.socket` listens.
pub const DEFAULT_SOCKET: &str = "/run/plexus/plugins.sock";

/// Start a plugin.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// Absolute path of the plugin binary; also its `argv[0]`.
    pub program: String,
    /// Variables set over the spawner's own environment.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub dir: String,
}

/// The answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Started {
    /// Running; a pidfd of it comes with the message.
    Pid(u32),
    /// Not started: why, and the errno when there is one.
    Failed { error: String, errno: Option<i32> },
}

/// The client's word that the plugin may be reaped.
#[derive(Debug, Serialize, Deserialize)]
pub struct Reap {
    pub reap: bool,
}

/// The plugin's wait status (as `waitpid(2)` gives it), or why there is
/// none.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Reaped {
    Status(i32),
    Failed(String),
}

/// Sends `msg` as one packet, with `fds`.
pub fn send<T: Serialize>(sock: BorrowedFd<'_>, msg: &T, fds: &[RawFd]) -> io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(io::Error::other(format!(
            "message of {} bytes is over the {MAX_MESSAGE}-byte limit",
            bytes.len()
        )));
    }
    let iov = [IoSlice::new(&bytes)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    loop {
        match socket::sendmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(n) => {
                return Err(io::Error::other(format!(
                    "sent {n} of {} bytes",
                    bytes.len()
                )))
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// One received packet: its bytes (empty at end of stream) and the
/// descriptors that came with it (close-on-exec).
pub struct Packet {
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Packet {
    /// The packet as JSON of type `T`.
    pub fn decode<T: for<'de> Deserialize<'de>>(&self) -> io::Result<T> {
        if self.bytes.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the other side closed the connection",
            ));
        }
        serde_json::from_slice(&self.bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

/// Receives one packet with at most `max_fds` descriptors (more, or a cut
/// packet, is an error: their descriptors are closed).
pub fn recv(sock: BorrowedFd<'_>, max_fds: usize) -> io::Result<Packet> {
    // Sized to the packet: a buffer of MAX_MESSAGE for every packet costs
    // more than the rest of a plugin run's bookkeeping.
    let mut buf = vec![0u8; next_len(sock)?.clamp(1, MAX_MESSAGE + 1)];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match socket::recvmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => msg,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut fds = Vec::new();
        let mut cut = msg.flags.contains(MsgFlags::MSG_CTRUNC);
        for cmsg in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                for fd in raw {
                    // SAFETY: the kernel just installed this descriptor in
                    // our table for us; nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        cut |= msg.flags.contains(MsgFlags::MSG_TRUNC);
        let n = msg.bytes;
        if cut {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message or its descriptors were cut short",
            ));
        }
        if fds.len() > max_fds {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} descriptors sent, at most {max_fds} expected", fds.len()),
            ));
        }
        buf.truncate(n);
        return Ok(Packet { bytes: buf, fds });
    }
}

/// The length of the next packet, without taking it (0 at end of stream).
fn next_len(sock: BorrowedFd<'_>) -> io::Result<usize> {
    loop {
        // SAFETY: recv(2) with a null buffer of length 0 writes nothing;
        // MSG_PEEK | MSG_TRUNC only reports the packet's real length.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_PEEK | libc::MSG_TRUNC,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// The environment a plugin gets from the spawner besides the request's
/// variables: the spawner's own (as a runtime's plugins get the runtime's),
/// less what systemd handed the spawner itself.
pub fn inherited_env() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    const SPAWNER_ONLY: &[&str] = &[
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
        "NOTIFY_SOCKET",
        "WATCHDOG_PID",
        "WATCHDOG_USEC",
    ];
    std::env::vars_os()
        .filter(|(k, _)| !SPAWNER_ONLY.iter().any(|s| k == s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        socket::socketpair(
            socket::AddressFamily::Unix,
            socket::SockType::SeqPacket,
            None,
            socket::SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    #[test]
    fn a_request_and_its_descriptors_should_arrive_whole() {
        let (a, b) = pair();
        let (r, w) = nix::unistd::pipe().unwrap();
        let req = Request {
            program: "/usr/lib/cni/bridge".into(),
            env: vec![("CNI_COMMAND".into(), "ADD".into())],
            dir: "/".into(),
        };
        send(a.as_fd(), &req, &[r.as_raw_fd(), w.as_raw_fd()]).unwrap();
        let got = recv(b.as_fd(), 3).unwrap();
        let back: Request = got.decode().unwrap();
        assert_eq!(back.program, req.program);
        assert_eq!(back.env, req.env);
        assert_eq!(got.fds.len(), 2);
    }

    #[test]
    fn too_many_descriptors_or_a_closed_peer_should_be_errors() {
        let (a, b) = pair();
        let (r, w) = nix::unistd::pipe().unwrap();
        send(
            a.as_fd(),
            &Reap { reap: true },
            &[r.as_raw_fd(), w.as_raw_fd()],
        )
        .unwrap();
        assert!(recv(b.as_fd(), 1).is_err());
        drop(a);
        let end = recv(b.as_fd(), 0).unwrap();
        assert!(end.bytes.is_empty());
        assert!(end.decode::<Reap>().is_err());
    }

    #[test]
    fn packets_of_any_size_should_arrive_whole_one_by_one() {
        let (a, b) = pair();
        let big = Request {
            program: "/usr/lib/cni/bridge".into(),
            env: vec![("CNI_ARGS".into(), "x".repeat(100 << 10))],
            dir: "/".into(),
        };
        send(a.as_fd(), &big, &[]).unwrap();
        send(a.as_fd(), &Reap { reap: true }, &[]).unwrap();
        let got: Request = recv(b.as_fd(), 0).unwrap().decode().unwrap();
        assert_eq!(got.env[0].1.len(), 100 << 10);
        assert!(recv(b.as_fd(), 0).unwrap().decode::<Reap>().unwrap().reap);
        // Over the limit: refused by the sender.
        let over = Request {
            env: vec![("CNI_ARGS".into(), "x".repeat(MAX_MESSAGE))],
            ..big
        };
        assert!(send(a.as_fd(), &over, &[]).is_err());
    }

    #[test]
    fn the_spawners_own_systemd_variables_should_not_reach_plugins() {
        let env = inherited_env();
        assert!(env
            .iter()
            .all(|(k, _)| k != "LISTEN_FDS" && k != "NOTIFY_SOCKET"));
    }
}
