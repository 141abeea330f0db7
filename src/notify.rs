//! sd_notify: tells the service manager about readiness, status, stopping
//! and liveness. A no-op when no notify socket was given, so the same binary
//! runs outside systemd.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

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
    /// for the abstract namespace.
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

    /// From `NOTIFY_SOCKET` in this process's environment.
    pub fn from_env() -> io::Result<Self> {
        Self::new(std::env::var(ENV_NOTIFY_SOCKET).ok().as_deref())
    }

    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends newline-separated `KEY=VALUE` assignments as one datagram.
    pub fn send(&self, assignments: &[&str]) -> io::Result<()> {
        let Some((addr, sock)) = &self.target else {
            return Ok(());
        };
        let msg = assignments.join("\n");
        sock.send_to_addr(msg.as_bytes(), addr).map(|_| ())
    }

    pub fn ready(&self, status: &str) -> io::Result<()> {
        self.send(&["READY=1", &format!("STATUS={}", one_line(status))])
    }

    pub fn status(&self, status: &str) -> io::Result<()> {
        self.send(&[&format!("STATUS={}", one_line(status))])
    }

    pub fn stopping(&self, status: &str) -> io::Result<()> {
        self.send(&["STOPPING=1", &format!("STATUS={}", one_line(status))])
    }

    pub fn watchdog(&self) -> io::Result<()> {
        self.send(&["WATCHDOG=1"])
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

    #[test]
    fn disabled_notifier_should_send_nothing() {
        let n = Notifier::new(None).unwrap();
        assert!(!n.enabled());
        n.ready("x").unwrap();
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
