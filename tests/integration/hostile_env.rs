//! An unprivileged user (uid 65534, run through `setpriv`) against the paths
//! plexusd writes: directories it can write are refused at start-up (exit
//! 78, naming the path, its owner and mode), symlinks it plants are never
//! followed, a socket it renames over the path does not make the daemon
//! step down, and it never gets a connection while the daemon binds under
//! umask 000.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::daemon::{inode, retry_interrupted, wait_until, Daemon, TestDir, PLEXUSD};
use crate::support::http;

const T: Duration = Duration::from_secs(20);
const NOBODY: u32 = 65534;
const ROLE_ENV: &str = "PLEXUS_HOSTILE_ROLE";
const ARG_ENV: &str = "PLEXUS_HOSTILE_ARG";

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mkdir(p: &Path, mode: u32) -> PathBuf {
    std::fs::create_dir_all(p).unwrap();
    chmod(p, mode);
    p.to_path_buf()
}

/// A command run as uid/gid 65534 without supplementary groups.
fn as_nobody(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
        "--".into(),
    ])
    .arg(program);
    c
}

/// Runs a shell command as 65534 and asserts it succeeded.
fn nobody_sh(script: &str) {
    let out = as_nobody("sh").arg("-c").arg(script).output().unwrap();
    assert!(
        out.status.success(),
        "as uid {NOBODY}: {script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// This test binary run as 65534 in one of the roles of [`helper_process`];
/// its stdout lines arrive on a channel.
struct Helper {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Helper {
    fn start(role: &str, arg: &Path) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut child = as_nobody(exe)
            .arg(helper_test_name())
            .args([
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env(ROLE_ENV, role)
            .env(ARG_ENV, arg)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn wait_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + T;
        loop {
            if let Some(l) = self.seen.iter().find(|l| l.starts_with(prefix)) {
                return l.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!("helper never printed {prefix:?}; seen {:?}", self.seen),
            }
        }
    }

    /// Kills the helper and returns everything it printed.
    fn finish(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        self.seen.clone()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The name the test harness knows [`helper_process`] by (its path in the
/// test binary, without the crate's name), for running it alone.
fn helper_test_name() -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::helper_process")
}

/// The unprivileged side of the tests, run by [`Helper`] as 65534.
#[test]
#[ignore = "run as an unprivileged helper process by the other tests"]
fn helper_process() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let arg = PathBuf::from(std::env::var_os(ARG_ENV).unwrap());
    match role.as_str() {
        "connector" => connector(&arg),
        "impostor" => impostor(&arg),
        other => panic!("unknown role {other}"),
    }
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Watches `dir` with inotify and connects to every entry the moment it
/// appears (and to a socket inside it, if it is a directory), printing
/// `CONNECTED <path>` on success. It spins on the inotify fd rather than
/// sleeping in `read`, to be as quick as an attacker can be.
fn connector(dir: &Path) {
    use std::ffi::{CString, OsStr};
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain syscalls on a buffer we own.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    assert!(fd >= 0);
    let cdir = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: `fd` is the inotify instance made above and `cdir` a valid C string.
    let wd =
        unsafe { libc::inotify_add_watch(fd, cdir.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) };
    assert!(wd >= 0, "cannot watch {}", dir.display());
    say("READY");
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: read(2) into `buf`, at most its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock {
            std::hint::spin_loop();
            continue;
        }
        assert!(n > 0, "inotify read");
        let mut off = 0usize;
        let header = std::mem::size_of::<libc::inotify_event>();
        while off + header <= n as usize {
            // SAFETY: the kernel wrote a whole event here.
            let ev: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
            let name = &buf[off + header..off + header + ev.len as usize];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            off += header + ev.len as usize;
            let entry = dir.join(OsStr::from_bytes(name));
            for target in [entry.clone(), entry.join("plexus.sock")] {
                if UnixStream::connect(&target).is_ok() {
                    say(&format!("CONNECTED {}", target.display()));
                }
            }
            // Created in place (not renamed in), and not a directory: a
            // socket bound right here, reachable before its chmod.
            let created = ev.mask & libc::IN_CREATE != 0;
            if created && ev.mask & libc::IN_ISDIR == 0 && !name.ends_with(b".lock") {
                say(&format!("CREATED_IN_PLACE {}", entry.display()));
            }
            if created && ev.mask & libc::IN_ISDIR != 0 && std::fs::read_dir(&entry).is_ok() {
                say(&format!("LISTED {}", entry.display()));
            }
            say(&format!("SAW {}", entry.display()));
        }
    }
}

/// Binds a socket beside `path`, renames it over `path`, prints `PLACED
/// <inode>`, then prints `ACCEPTED` for every connection it gets.
fn impostor(path: &Path) {
    let fake = path.with_file_name(".impostor.sock");
    let _ = std::fs::remove_file(&fake);
    let listener = UnixListener::bind(&fake).unwrap();
    std::fs::rename(&fake, path).unwrap();
    say(&format!("PLACED {}", inode(path).unwrap()));
    for c in listener.incoming() {
        if c.is_ok() {
            say("ACCEPTED");
        }
    }
}

/// A root-only directory and the path an attack tries to create in it.
fn secret(dir: &TestDir) -> PathBuf {
    mkdir(&dir.join("secret"), 0o700).join("victim")
}

fn refused(d: &mut Daemon, key: &str, path: &Path, owner_mode: &str) {
    let st = d.wait_exit(T);
    let log = d.log_text();
    assert_eq!(st.code(), Some(78), "{log}");
    assert!(log.contains(&format!("key \"{key}\"")), "{log}");
    assert!(log.contains(&path.display().to_string()), "{log}");
    assert!(log.contains(owner_mode), "{log}");
}

#[test]
fn world_writable_socket_dir_should_refuse_to_start_and_not_follow_a_planted_lock() {
    let dir = TestDir::new("hostile-sockdir");
    let victim = secret(&dir);
    let sock = mkdir(&dir.join("sock"), 0o777);
    let lock = sock.join(".plexus.sock.lock");
    nobody_sh(&format!("ln -s {} {}", victim.display(), lock.display()));
    let mut d = Daemon::start(&dir, "d", json!({"socketDir": sock}));
    refused(&mut d, "socketDir", &sock, "owner uid 0, mode 0777");
    assert!(!victim.exists(), "plexusd followed the planted symlink");
    assert!(!sock.join("plexus.sock").exists());
    assert!(std::fs::symlink_metadata(&lock).unwrap().is_symlink());
}

#[test]
fn socket_dir_of_another_user_should_refuse_to_start() {
    let dir = TestDir::new("hostile-owner");
    let sock = mkdir(&dir.join("sock"), 0o755);
    std::os::unix::fs::chown(&sock, Some(NOBODY), Some(NOBODY)).unwrap();
    let mut d = Daemon::start(&dir, "d", json!({"socketDir": sock}));
    refused(&mut d, "socketDir", &sock, "owned by uid 65534");
}

#[test]
fn socket_dir_through_a_symlink_of_another_user_should_refuse_to_start() {
    let dir = TestDir::new("hostile-link");
    let real = mkdir(&dir.join("real"), 0o755);
    let link = dir.join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(NOBODY), Some(NOBODY)).unwrap();
    let mut d = Daemon::start(&dir, "d", json!({"socketDir": link.join("sock")}));
    refused(&mut d, "socketDir", &link, "symlink owned by uid 65534");
    assert!(!real.join("sock").exists());
}

#[test]
fn state_dir_another_user_can_write_should_refuse_to_start() {
    let dir = TestDir::new("hostile-state");
    let state = mkdir(&dir.join("state"), 0o777);
    // A record planted for GC or DEL to act on.
    nobody_sh(&format!(
        "mkdir -m 0777 {0}/attachments && echo '{{}}' > {0}/attachments/planted.json",
        state.display()
    ));
    let cfg = json!({"stateDir": state, "clusterNetwork": "none", "socketDir": dir.join("sock")});
    let mut d = Daemon::start(&dir, "d", cfg.clone());
    refused(&mut d, "stateDir", &state, "owner uid 0, mode 0777");
    // stateDir itself private, its attachments/ another user's.
    chmod(&state, 0o700);
    let mut d = Daemon::start(&dir, "d2", cfg);
    refused(
        &mut d,
        "stateDir",
        &state.join("attachments"),
        "owned by uid 65534",
    );
    assert!(state.join("attachments/planted.json").exists());
    assert!(!dir.join("sock/plexus.sock").exists());
}

#[test]
fn log_dir_another_user_can_write_should_refuse_to_start_and_not_follow_a_planted_link() {
    let dir = TestDir::new("hostile-log");
    let victim = secret(&dir);
    let logs = mkdir(&dir.join("logs"), 0o777);
    let file = logs.join("plexusd.log");
    nobody_sh(&format!("ln -s {} {}", victim.display(), file.display()));
    let mut d = Daemon::start(&dir, "d", json!({"logFile": file, "logToStderr": true}));
    refused(&mut d, "logFile", &logs, "owner uid 0, mode 0777");
    assert!(!victim.exists(), "plexusd followed the planted symlink");
}

#[test]
fn sticky_dir_should_be_accepted_above_the_socket_dir_only() {
    let dir = TestDir::new("hostile-sticky");
    let sticky = mkdir(&dir.join("tmp"), 0o1777);
    let sock = mkdir(&sticky.join("sock"), 0o755);
    let mut d = Daemon::start(&dir, "d", json!({"socketDir": sock}));
    d.ready();
    assert_eq!(http::healthz(&d.sock), 200);
    d.terminate();
    assert!(d.wait_exit(T).success());
    let mut d = Daemon::start(&dir, "d2", json!({"socketDir": sticky}));
    refused(&mut d, "socketDir", &sticky, "mode 1777");
}

#[test]
fn check_config_should_report_unsafe_paths() {
    let dir = TestDir::new("hostile-check");
    let sock = mkdir(&dir.join("sock"), 0o777);
    let cfg = dir.join("c.json");
    std::fs::write(&cfg, json!({"socketDir": sock}).to_string()).unwrap();
    let out = Command::new(PLEXUSD)
        .args(["--check-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("key \"socketDir\""), "{err}");
    assert!(err.contains("mode 0777"), "{err}");
    chmod(&sock, 0o755);
    let out = Command::new(PLEXUSD)
        .args(["--check-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(out.status.success());
}

/// Even in a directory only root can write, a symlink found as the lock
/// file (say, left by an earlier attack) is not followed.
#[test]
fn symlinked_lock_file_should_not_be_followed() {
    let dir = TestDir::new("hostile-lock");
    let victim = secret(&dir);
    let sock = mkdir(&dir.join("sock"), 0o755);
    std::os::unix::fs::symlink(&victim, sock.join(".plexus.sock.lock")).unwrap();
    let mut d = Daemon::start(&dir, "d", json!({"socketDir": sock}));
    let st = d.wait_exit(T);
    let log = d.log_text();
    assert_eq!(st.code(), Some(78), "{log}");
    assert!(log.contains(".plexus.sock.lock"), "{log}");
    assert!(log.contains("symlink"), "{log}");
    assert!(!victim.exists(), "plexusd followed the symlink");
    assert!(!sock.join("plexus.sock").exists());
}

#[test]
fn impostor_socket_should_not_make_the_daemon_step_down() {
    let dir = TestDir::new("hostile-impostor");
    let sock = mkdir(&dir.join("sock"), 0o755);
    let mut d = Daemon::start(&dir, "d", json!({"socketDir": sock}));
    d.ready();
    let path = d.sock.clone();
    let ours = inode(&path).unwrap();
    // A mistake that lets another user write the directory at run time.
    chmod(&sock, 0o777);
    let mut imp = Helper::start("impostor", &path);
    let placed: u64 = imp.wait_line("PLACED ")["PLACED ".len()..].parse().unwrap();
    assert_ne!(placed, ours);
    wait_until(T, "the daemon to put its socket back", || {
        std::fs::symlink_metadata(&path)
            .map(|m| m.file_type().is_socket() && m.uid() == 0 && m.ino() != placed)
            .unwrap_or(false)
    });
    assert!(d.running(), "the daemon stepped down:\n{}", d.log_text());
    assert_eq!(http::healthz(&path), 200);
    let ready = http::request(&path, "GET", "/readyz", b"").unwrap();
    assert_eq!(ready.status, 200, "the daemon is draining");
    assert_eq!(
        std::fs::symlink_metadata(&path).unwrap().mode() & 0o777,
        0o600
    );
    assert!(d.log_text().contains("possible attack"), "{}", d.log_text());
    let printed = imp.finish();
    assert!(
        !printed.iter().any(|l| l == "ACCEPTED"),
        "the impostor got a connection: {printed:?}"
    );
    d.terminate();
    assert!(d.wait_exit(T).success());
    assert!(!path.exists(), "the restored socket is removed at exit");
}

/// plexusd as a self-binding daemon under umask 000, signalling readiness
/// to `notify`.
fn start_umask0(config: &Path, notify: &Path) -> Child {
    let mut cmd = Command::new(PLEXUSD);
    cmd.arg("--config")
        .arg(config)
        .env("NOTIFY_SOCKET", notify)
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS_FIRST_FD")
        .env_remove("WATCHDOG_USEC")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

#[test]
fn bind_under_umask_000_should_never_let_another_user_connect() {
    const STARTS: usize = 200;
    let dir = TestDir::new("hostile-umask");
    let sock = mkdir(&dir.join("sock"), 0o755);
    let config = dir.join("c.json");
    std::fs::write(
        &config,
        json!({"socketDir": sock, "stateDir": dir.join("state")}).to_string(),
    )
    .unwrap();
    let notify_path = dir.join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(T)).unwrap();
    let mut connector = Helper::start("connector", &sock);
    connector.wait_line("READY");
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    for i in 0..STARTS {
        let mut child = start_umask0(&config, &notify_path);
        loop {
            let n = retry_interrupted(|| notify.recv(&mut buf))
                .unwrap_or_else(|e| panic!("start {i}: no READY=1: {e}"));
            if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let elapsed = started.elapsed();
    let m = std::fs::symlink_metadata(sock.join("plexus.sock")).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.mode() & 0o777, 0o600);
    let mut names: Vec<String> = std::fs::read_dir(&sock)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".plexus.sock.lock", "plexus.sock"]);
    let lock_mode = std::fs::metadata(sock.join(".plexus.sock.lock"))
        .unwrap()
        .mode()
        & 0o777;
    assert_eq!(lock_mode, 0o600);
    // Every start has been seen by the connector before it is stopped.
    wait_until(T, "the connector to see every start", || {
        while let Ok(l) = connector.lines.try_recv() {
            connector.seen.push(l);
        }
        connector
            .seen
            .iter()
            .filter(|l| l.starts_with("SAW "))
            .count()
            >= STARTS
    });
    let printed = connector.finish();
    let connected: Vec<_> = printed
        .iter()
        .filter(|l| l.starts_with("CONNECTED"))
        .collect();
    assert!(
        connected.is_empty(),
        "uid {NOBODY} connected during start-up: {connected:?}"
    );
    // By construction, not by luck: the window between bind and chmod is
    // microseconds, so the connector rarely wins it even against a daemon
    // that binds in the shared directory. What it always sees is where
    // sockets are created: never in the directory others can read, only
    // in private directories it cannot even list.
    let in_place: Vec<_> = printed
        .iter()
        .filter(|l| l.starts_with("CREATED_IN_PLACE") || l.starts_with("LISTED"))
        .collect();
    assert!(
        in_place.is_empty(),
        "sockets were bound where uid {NOBODY} can reach them: {in_place:?}"
    );
    eprintln!("{STARTS} starts under umask 000 in {elapsed:?}, no foreign connection");
}

/// A pod's ADD through the shim to the socket at `sock`.
fn shim_add(sock: &Path) -> crate::support::shim::Run {
    let config = json!({
        "cniVersion": "1.0.0",
        "name": "plexus-net",
        "type": "plexus-shim",
        "socketPath": sock,
        "connectTimeout": "2s",
    });
    crate::support::shim::run(
        [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "impostor-target"),
            ("CNI_NETNS", "/run/netns/impostor-target"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
        ],
        serde_json::to_vec(&config).unwrap().as_slice(),
    )
}

/// With no plexusd running, another user places a socket where the shim
/// looks for the daemon (a sticky, world-writable directory like /tmp, or
/// a directory of that user's own): the shim, run as root by the runtime,
/// sends nothing there and says why.
#[test]
fn the_shim_should_talk_to_no_socket_another_user_placed() {
    let dir = TestDir::new("hostile-shim");
    let sticky = mkdir(&dir.join("sticky"), 0o1777);
    let path = sticky.join("plexus.sock");
    let mut imp = Helper::start("impostor", &path);
    imp.wait_line("PLACED ");
    let run = shim_add(&path);
    let err = run.error(5);
    let msg = err["msg"].as_str().unwrap();
    assert!(
        msg.contains(&path.display().to_string()) && msg.contains("owned by uid 65534"),
        "{msg}"
    );
    let printed = imp.finish();
    assert!(
        !printed.iter().any(|l| l == "ACCEPTED"),
        "the impostor got a connection: {printed:?}"
    );

    // A directory of the other user's own on the socket's path.
    let theirs = mkdir(&dir.join("theirs"), 0o755);
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let path = theirs.join("plexus.sock");
    let mut imp = Helper::start("impostor", &path);
    imp.wait_line("PLACED ");
    let err = shim_add(&path).error(5);
    let msg = err["msg"].as_str().unwrap();
    assert!(
        msg.contains(&theirs.display().to_string()) && msg.contains("uid 65534"),
        "{msg}"
    );
    assert!(!imp.finish().iter().any(|l| l == "ACCEPTED"));
}

/// The socket file passes every check (root's, in root's directory) but
/// the process listening on it is another user's, as after a swap between
/// the shim's checks and its connect: the kernel's record of the listener
/// refuses it, before a byte of the request is sent.
#[test]
fn the_shim_should_refuse_a_listener_another_user_runs() {
    let dir = TestDir::new("hostile-shim-peer");
    let sticky = mkdir(&dir.join("sticky"), 0o1777);
    let path = sticky.join("plexus.sock");
    let mut imp = Helper::start("impostor", &path);
    imp.wait_line("PLACED ");
    std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
    chmod(&sticky, 0o755);
    let err = shim_add(&path).error(5);
    let msg = err["msg"].as_str().unwrap();
    assert!(
        msg.contains("served by process") && msg.contains("uid 65534"),
        "{msg}"
    );
}
