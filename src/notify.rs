//! sd_notify: tells the service manager about readiness, status, stopping
//! and liveness. A no-op when no notify socket was given, so the same binary
//! runs outside systemd.
//!
//! The protocol's vocabulary (`READY=1`, `STATUS=...`, ...) comes from the
//! `sd-notify` crate ([`NotifyState`]). Its `notify` function is not used:
//! it reads `NOTIFY_SOCKET` on every call, sends on a blocking socket and
//! knows only path names. This wrapper adds what the daemon needs on top:
//! the socket is resolved once (a path, or `@name` in the abstract
//! namespace, which the crate does not handle) and can be given explicitly,
//! so tests need not touch the process environment; sends never block (a
//! full queue drops a status update instead of stalling the caller); and
//! STATUS text is folded onto one line, as the protocol is line based.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

pub use sd_notify::NotifyState;

pub const ENV_NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
pub const ENV_WATCHDOG_USEC: &str = "WATCHDOG_USEC";
pub const ENV_WATCHDOG_PID: &str = "WATCHDOG_PID";

/// Sends notifications to one socket (or nowhere).
#[derive(Debug)]
pub struct Notifier {
    target: Option<(SocketAddr, UnixDatagram)>,
}

impl Notifier {
    /// A notifier that sends nothing.
    pub fn disabled() -> Self {
        Self { target: None }
    }

    /// A notifier for the socket `NOTIFY_SOCKET` names: a path, or `@name`
    /// for the abstract namespace. `None` or empty: disabled.
    pub fn new(socket: Option<&str>) -> io::Result<Self> {
        let Some(socket) = socket.filter(|s| !s.is_empty()) else {
            return Ok(Self::disabled());
        };
        let addr = if let Some(name) = socket.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        } else {
            SocketAddr::from_pathname(socket)?
        };
        let sock = UnixDatagram::unbound()?;
        // Never block the caller: a full queue drops a status update.
        sock.set_nonblocking(true)?;
        Ok(Self {
            target: Some((addr, sock)),
        })
    }

    /// From `NOTIFY_SOCKET` as `lookup` reports it (the environment, or a
    /// test's stand-in for it).
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> io::Result<Self> {
        Self::new(lookup(ENV_NOTIFY_SOCKET).as_deref())
    }

    /// From `NOTIFY_SOCKET` in this process's environment.
    pub fn from_env() -> io::Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends the states as one datagram, one `KEY=VALUE` a line.
    pub fn send(&self, states: &[NotifyState<'_>]) -> io::Result<()> {
        let Some((addr, sock)) = &self.target else {
            return Ok(());
        };
        let msg = states
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        let sent = sock.send_to_addr(msg.as_bytes(), addr)?;
        if sent != msg.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "notify socket took part of a datagram",
            ));
        }
        Ok(())
    }

    pub fn ready(&self, status: &str) -> io::Result<()> {
        let status = one_line(status);
        self.send(&[NotifyState::Ready, NotifyState::Status(&status)])
    }

    pub fn status(&self, status: &str) -> io::Result<()> {
        let status = one_line(status);
        self.send(&[NotifyState::Status(&status)])
    }

    pub fn stopping(&self, status: &str) -> io::Result<()> {
        let status = one_line(status);
        self.send(&[NotifyState::Stopping, NotifyState::Status(&status)])
    }

    pub fn watchdog(&self) -> io::Result<()> {
        self.send(&[NotifyState::Watchdog])
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// The watchdog interval systemd expects pings within, if enabled for this
/// process. Pure: the caller supplies the variables and its pid.
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid.filter(|p| !p.is_empty()) {
        if pid.trim().parse::<u32>().ok()? != own_pid {
            return None;
        }
    }
    Some(Duration::from_micros(usec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_everything(n: &Notifier) {
        n.ready("x").unwrap();
        n.status("y").unwrap();
        n.stopping("z").unwrap();
        n.watchdog().unwrap();
        n.send(&[NotifyState::Ready]).unwrap();
    }

    #[test]
    fn disabled_notifier_should_send_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_nonblocking(true).unwrap();
        let p = path.to_str().unwrap().to_string();
        // Every other variable names the live socket: only NOTIFY_SOCKET may
        // enable the notifier.
        let without = |k: &str| (k != ENV_NOTIFY_SOCKET).then(|| p.clone());
        let disabled = [
            Notifier::disabled(),
            Notifier::new(None).unwrap(),
            Notifier::new(Some("")).unwrap(),
            Notifier::from_vars(without).unwrap(),
            Notifier::from_vars(|k| (k == ENV_NOTIFY_SOCKET).then(String::new)).unwrap(),
        ];
        for n in &disabled {
            assert!(!n.enabled());
            call_everything(n);
        }
        let mut buf = [0u8; 256];
        let got = rx.recv(&mut buf);
        assert!(
            matches!(&got, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "a disabled notifier sent {got:?}"
        );
        // The socket does receive: an enabled notifier's datagrams arrive.
        let on = Notifier::from_vars(|k| (k == ENV_NOTIFY_SOCKET).then(|| p.clone())).unwrap();
        assert!(on.enabled());
        on.watchdog().unwrap();
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }

    #[test]
    fn ready_should_arrive_as_one_datagram() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.to_str()).unwrap();
        n.ready("serving\nnow").unwrap();
        let mut buf = [0u8; 256];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving now");
        n.stopping("bye").unwrap();
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1\nSTATUS=bye");
    }

    #[test]
    fn watchdog_interval_should_honour_pid() {
        assert_eq!(
            watchdog_interval(Some("3000000"), Some("5"), 5),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            watchdog_interval(Some("3000000"), None, 5),
            Some(Duration::from_secs(3))
        );
        assert_eq!(watchdog_interval(Some("3000000"), Some("6"), 5), None);
        assert_eq!(watchdog_interval(Some("0"), None, 5), None);
        assert_eq!(watchdog_interval(None, None, 5), None);
    }
}
