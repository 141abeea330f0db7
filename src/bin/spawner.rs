//! `plexus-spawner`: starts CNI plugins for plexusd outside plexusd's
//! sandbox (see `plexus::spawner`). Run by `plexus-plugins.service`, which
//! gives it its listening socket (`plexus-plugins.socket`); `--listen PATH`
//! binds one itself instead (development).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use nix::sys::socket::{self, sockopt};
use plexus::spawner::serve::{self, BinDirs};

const HELP: &str = "\
plexus-spawner: starts the CNI plugins of plexusd outside plexusd's sandbox, with the
environment a container runtime gives its plugins. Run by plexus-plugins.service; it
takes its socket from systemd (plexus-plugins.socket) and answers only root, for
programs in the binDir directories of plexusd's configuration.

Options:
  --config FILE   plexusd's configuration, for binDir (default /etc/plexus/daemon-config.json)
  --listen PATH   bind PATH (mode 0600) instead of taking a socket from systemd
  --request-timeout DURATION
                  how long a connection may take to send its request before it
                  is dropped (default 10s)
  --version       print the version and exit
  --help          print this and exit
";

struct Args {
    config: PathBuf,
    listen: Option<PathBuf>,
    request_timeout: std::time::Duration,
}

fn parse() -> Result<Option<Args>, String> {
    let mut args = Args {
        config: PathBuf::from("/etc/plexus/daemon-config.json"),
        listen: None,
        request_timeout: serve::DEFAULT_REQUEST_TIMEOUT,
    };
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--version" | "-V") => {
                println!("plexus-spawner {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            Some("--help" | "-h") => {
                print!("{HELP}");
                return Ok(None);
            }
            Some("--config" | "-c") => {
                args.config = it.next().ok_or("--config needs a file")?.into();
            }
            Some("--listen") => {
                args.listen = Some(it.next().ok_or("--listen needs a path")?.into());
            }
            Some("--request-timeout") => {
                let text = it.next().ok_or("--request-timeout needs a duration")?;
                let text = text.to_str().ok_or("--request-timeout: not UTF-8")?;
                args.request_timeout = match plexus::duration::parse(text) {
                    Ok(d) if !d.is_zero() => d,
                    Ok(_) => return Err("--request-timeout must be above 0".into()),
                    Err(e) => return Err(format!("--request-timeout: {e}")),
                };
            }
            _ => return Err(format!("unknown argument {a:?} (see --help)")),
        }
    }
    Ok(Some(args))
}

/// The socket systemd passed (fd 3), checked to be a listening unix
/// `SOCK_SEQPACKET` socket, or one bound at `path`.
fn listener(path: Option<&PathBuf>) -> Result<OwnedFd, String> {
    if let Some(path) = path {
        let fd = socket::socket(
            socket::AddressFamily::Unix,
            socket::SockType::SeqPacket,
            socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| format!("socket: {e}"))?;
        let addr = socket::UnixAddr::new(path.as_path()).map_err(|e| format!("{e}"))?;
        // Bound under a umask that leaves it to root alone.
        // SAFETY: umask(2) only swaps the process's mask.
        let old = unsafe { libc::umask(0o177) };
        let bound = socket::bind(fd.as_raw_fd(), &addr);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        bound.map_err(|e| format!("bind {}: {e}", path.display()))?;
        socket::listen(&fd, socket::Backlog::new(128).map_err(|e| e.to_string())?)
            .map_err(|e| format!("listen: {e}"))?;
        return Ok(fd);
    }
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() != 1 {
        return Err(format!(
            "expected one socket from systemd (LISTEN_FDS), got {}; use --listen PATH to bind one",
            fds.len()
        ));
    }
    let raw = fds
        .take_raw_fd(0)
        .map_err(|e| e.to_string())?
        .ok_or("the socket from systemd was already taken")?;
    // SAFETY: systemd passed this descriptor to us (LISTEN_FDS) and nothing
    // else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let kind = socket::getsockopt(&fd, sockopt::SockType).map_err(|e| e.to_string())?;
    let listening = socket::getsockopt(&fd, sockopt::AcceptConn).map_err(|e| e.to_string())?;
    if kind != socket::SockType::SeqPacket || !listening {
        return Err(format!(
            "the socket from systemd is a {kind:?} socket{}; plexus-plugins.socket must use ListenSequentialPacket=",
            if listening { "" } else { " that is not listening" }
        ));
    }
    // SAFETY: fcntl(2) on a descriptor we own.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(fd)
}

/// binDir as plexusd's configuration at `config` gives it, read again
/// whenever the file changes (checked on every request, a stat).
fn bin_dirs(config: PathBuf) -> BinDirs {
    type Stamp = (u64, u64, u64, i64, i64);
    let cache: Mutex<Option<(Stamp, Vec<PathBuf>)>> = Mutex::new(None);
    Arc::new(move || {
        let stamp = std::fs::metadata(&config)
            .ok()
            .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()));
        let mut cached = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(stamp), Some((seen, dirs))) = (stamp, cached.as_ref()) {
            if stamp == *seen {
                return Ok(dirs.clone());
            }
        }
        let dirs = plexus::config::Config::load(&config, true)
            .map(|c| c.cni.bin_dirs)
            .map_err(|e| format!("cannot read binDir from {}: {e}", config.display()))?;
        *cached = stamp.map(|s| (s, dirs.clone()));
        Ok(dirs)
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plexus-spawner: {e}");
            return ExitCode::from(64);
        }
    };
    // Blocked in every thread (the plugins get an empty mask): the signal
    // thread below takes them.
    let mut stop_signals = nix::sys::signal::SigSet::empty();
    for s in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
    ] {
        stop_signals.add(s);
    }
    if let Err(e) = stop_signals.thread_block() {
        eprintln!("plexus-spawner: cannot block SIGTERM: {e}");
        return ExitCode::from(71);
    }
    let listener = match listener(args.listen.as_ref()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("plexus-spawner: {e}");
            return ExitCode::from(78);
        }
    };
    let rules = serve::Rules {
        bin_dirs: bin_dirs(args.config.clone()),
        request_timeout: args.request_timeout,
    };
    let (stop, stopper) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("plexus-spawner: {e}");
            return ExitCode::from(71);
        }
    };
    let _signals = std::thread::spawn(move || {
        if stop_signals.wait().is_ok() {
            // Closing the write end makes `stop` readable.
            drop(stopper);
        }
    });
    match serve::serve(listener, rules, stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plexus-spawner: {e}");
            ExitCode::from(1)
        }
    }
}
