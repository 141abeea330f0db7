//! plexusd with `pluginSpawner`: the built plexus-spawner starts every
//! plugin (Debian's bridge + host-local for real, and fakes for the
//! process lifecycle), a plugin is the spawner's child and not plexusd's,
//! and what the spawner refuses, it refuses with a reason.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::support::cni::{address, bridge, cni, conflist, failed, ok, processes_matching, Engine};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::netns::{Link, Netns, Subnet};

pub const SPAWNER: &str = env!("CARGO_BIN_EXE_plexus-spawner");
const T: Duration = Duration::from_secs(10);

/// A plexus-spawner bound at `<dir>/spawner.sock`, reading binDir from
/// `config`; killed and reaped on drop.
pub struct Spawner {
    pub child: Child,
    pub sock: PathBuf,
}

impl Spawner {
    pub fn start(dir: &Path, config: &Path) -> Self {
        Self::start_with(dir, config, &[])
    }

    /// [`Spawner::start`] with more arguments.
    pub fn start_with(dir: &Path, config: &Path, args: &[&str]) -> Self {
        let sock = dir.join("spawner.sock");
        let child = Command::new(SPAWNER)
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(&sock)
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        wait_until(T, "the spawner's socket", || sock.exists());
        Spawner { child, sock }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The parent pid of `pid`, from /proc.
fn ppid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(1)?.parse().ok()
}

/// An engine whose daemon starts plugins through a spawner; the spawner
/// reads the same configuration file, so binDir agrees.
fn start(e: &Engine, net: &str, timeout: &str) -> (Spawner, Daemon) {
    start_with(e, net, timeout, &[])
}

/// [`start`], the spawner with more arguments.
fn start_with(e: &Engine, net: &str, timeout: &str, args: &[&str]) -> (Spawner, Daemon) {
    let config_path = e.dir.join("d.json");
    let mut config = e.config(net, timeout);
    let spawner_sock = e.dir.join("spawner.sock");
    config["pluginSpawner"] = json!(spawner_sock);
    // Written first for the spawner; Daemon::start writes it again, the same.
    std::fs::write(&config_path, config.to_string()).unwrap();
    let s = Spawner::start_with(&e.dir.path, &config_path, args);
    let mut d = Daemon::start(&e.dir, "d", config);
    d.ready();
    (s, d)
}

#[test]
fn real_plugins_should_run_as_children_of_the_spawner() {
    let e = Engine::new("spawn-real");
    let br = Link::planned("sp");
    let subnet = Subnet::new();
    let net = "spawned";
    e.write_network(
        "10-net.conflist",
        &conflist(net, "1.0.0", vec![bridge(&br.name, e.host_local(&subnet))]),
    );
    let ns = Netns::new();
    let (s, d) = start(&e, net, "10s");

    let r = ok(&d, &cni(&d, "ADD", "sp-1", &ns, "eth0"));
    let addr = address(&r);
    assert!(subnet.holds(&addr), "{addr}");
    let eth0 = ns.iface("eth0").expect("no eth0 in the namespace");
    assert!(eth0.has_addr(&addr), "{eth0:?}");
    ok(&d, &cni(&d, "CHECK", "sp-1", &ns, "eth0"));
    ok(&d, &cni(&d, "DEL", "sp-1", &ns, "eth0"));
    assert!(!ns.has_link("eth0"));
    assert!(e.reservations(net).is_empty());
    drop(s);
}

#[test]
fn a_plugin_should_be_the_spawners_child_and_die_with_a_killed_daemon() {
    let e = Engine::new("spawn-kill");
    let started = e.dir.join("started");
    let sleeper = format!("{}/sleepy-sleep", e.bin_dir.display());
    e.fake(
        "sleepy",
        &format!(
            "case \"$CNI_COMMAND\" in\n\
             ADD) echo $$ > '{}'; exec -a '{sleeper}' sleep 1000 ;;\n\
             *) echo '{{}}' ;;\nesac",
            started.display()
        ),
    );
    e.write_network(
        "10-net.conflist",
        &conflist("sleepy", "1.0.0", vec![json!({"type": "sleepy"})]),
    );
    let ns = Netns::new();
    let (s, mut d) = start(&e, "sleepy", "60s");
    let add = crate::support::cni::Call::new("ADD", "sp-kill", &ns, "eth0").spawn(&d);
    // The script writes `started` before it execs the sleeper: wait for
    // the sleeper itself, not the file.
    wait_until(T, "the plugin to start", || {
        started.exists() && !processes_matching(&sleeper).is_empty()
    });
    let plugins = processes_matching(&sleeper);
    assert_eq!(plugins.len(), 1, "{plugins:?}");
    let (pid, _) = plugins[0];
    assert_eq!(
        ppid(pid),
        Some(s.pid()),
        "the plugin's parent is not the spawner"
    );
    assert_ne!(ppid(pid), Some(d.pid()));

    // plexusd dies: its connection to the spawner closes, and the spawner
    // kills the plugin's group and reaps it.
    d.signal(libc::SIGKILL);
    d.wait_exit(T);
    wait_until(T, "the plugin to be killed", || {
        processes_matching(&sleeper).is_empty()
    });
    let run = add.finish();
    assert_ne!(run.code, Some(0), "{run:?}");
    // No zombie left under the spawner.
    assert!(crate::support::cni::children(s.pid()).is_empty());
}

#[test]
fn a_hung_plugin_should_be_killed_at_the_deadline_through_the_spawner() {
    let e = Engine::new("spawn-hang");
    let sleeper = format!("{}/hang-sleep", e.bin_dir.display());
    e.fake("hang", &format!("exec -a '{sleeper}' sleep 1000"));
    e.write_network(
        "10-net.conflist",
        &conflist("hang", "1.0.0", vec![json!({"type": "hang"})]),
    );
    let ns = Netns::new();
    let (s, d) = start(&e, "hang", "1s");
    let run = cni(&d, "ADD", "sp-hang", &ns, "eth0");
    let (_, msg, _) = failed(&d, &run);
    assert!(msg.contains("hang"), "{msg}");
    assert!(processes_matching(&sleeper).is_empty());
    assert!(crate::support::cni::children(s.pid()).is_empty());
}

/// Asks the spawner directly, as plexusd would, to run `program`.
fn ask(sock: &Path, program: &str) -> plexus::spawner::Started {
    ask_with(sock, program, &[("CNI_COMMAND", "VERSION")])
}

/// [`ask`] with the variables `env`.
fn ask_with(sock: &Path, program: &str, env: &[(&str, &str)]) -> plexus::spawner::Started {
    ask_open(sock, program, env).1
}

/// [`ask_with`], returning the connection too: the spawner keeps serving
/// it (and its plugin unreaped) until it is dropped.
fn ask_open(
    sock: &Path,
    program: &str,
    env: &[(&str, &str)],
) -> (OwnedFd, plexus::spawner::Started) {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
    let fd: OwnedFd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::connect(fd.as_raw_fd(), &UnixAddr::new(sock).unwrap()).unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    let req = plexus::spawner::Request {
        program: program.to_string(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        dir: "/".into(),
    };
    plexus::spawner::send(
        fd.as_fd(),
        &req,
        &[r.as_raw_fd(), w.as_raw_fd(), w.as_raw_fd()],
    )
    .unwrap();
    let answer = plexus::spawner::recv(fd.as_fd(), 1).unwrap();
    let started = answer.decode().unwrap();
    (fd, started)
}

#[test]
fn the_spawner_should_run_only_what_is_in_bin_dir() {
    let e = Engine::new("spawn-refuse");
    e.fake("fine", "echo '{}'");
    e.write_network(
        "10-net.conflist",
        &conflist("fine", "1.0.0", vec![json!({"type": "fine"})]),
    );
    let (s, _d) = start(&e, "fine", "10s");
    let outside = e.dir.join("outside");
    std::fs::write(&outside, "#!/bin/sh\ntouch /tmp/never\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    for program in [
        outside.to_str().unwrap(),
        "/bin/sh",
        "fine",
        "/usr/lib/cni/../../../bin/sh",
    ] {
        match ask(&s.sock, program) {
            plexus::spawner::Started::Failed { error, .. } => {
                assert!(
                    error.contains("refused") || error.contains("absolute"),
                    "{error}"
                )
            }
            other => panic!("{program} was started: {other:?}"),
        }
    }
    let fine = e.bin_dir.join("fine");
    // A binDir plugin with anything but CNI variables: a library to
    // preload, or a CNI_PATH of its own, would run what binDir does not
    // hold.
    let planted = e.dir.join("evil.so");
    std::fs::write(&planted, b"").unwrap();
    let preload = [("LD_PRELOAD", planted.to_str().unwrap())];
    match ask_with(&s.sock, fine.to_str().unwrap(), &preload) {
        plexus::spawner::Started::Failed { error, .. } => {
            assert!(error.contains("may not set LD_PRELOAD"), "{error}")
        }
        other => panic!("started with LD_PRELOAD: {other:?}"),
    }
    match ask(&s.sock, fine.to_str().unwrap()) {
        plexus::spawner::Started::Pid(_) => {}
        other => panic!("a binDir plugin was refused: {other:?}"),
    }
    // The connection closed: the spawner reaped it (no zombie).
    wait_until(T, "the spawner to reap its child", || {
        crate::support::cni::children(s.pid()).is_empty()
    });
}

/// A client that connects and never asks is dropped (within the
/// spawner's request timeout, `--request-timeout 1s` here) instead of
/// holding a thread, while others are served meanwhile.
#[test]
fn a_silent_client_should_be_dropped_and_not_block_others() {
    use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
    let e = Engine::new("spawn-silent");
    e.fake("fine", "echo '{}'");
    e.write_network(
        "10-net.conflist",
        &conflist("fine", "1.0.0", vec![json!({"type": "fine"})]),
    );
    let (s, _d) = start_with(&e, "fine", "10s", &["--request-timeout", "1s"]);
    let silent: OwnedFd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::connect(silent.as_raw_fd(), &UnixAddr::new(&s.sock).unwrap()).unwrap();
    // Served meanwhile.
    let fine = e.bin_dir.join("fine");
    assert!(matches!(
        ask(&s.sock, fine.to_str().unwrap()),
        plexus::spawner::Started::Pid(_)
    ));
    // The silent one is closed: its read ends.
    let timeout = nix::sys::time::TimeVal::new(10, 0);
    socket::setsockopt(&silent, socket::sockopt::ReceiveTimeout, &timeout).unwrap();
    let started = std::time::Instant::now();
    let end = plexus::spawner::recv(silent.as_fd(), 0).expect("the spawner closed it");
    assert!(end.bytes.is_empty(), "the spawner answered a silent client");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// binDir is read again when plexusd's configuration changes, without a
/// restart of the spawner; plugin runs one after another reuse one
/// thread.
#[test]
fn a_changed_bin_dir_should_count_at_once_and_threads_should_be_reused() {
    let e = Engine::new("spawn-rebin");
    e.fake("fine", "echo '{}'");
    let other = e.dir.join("other-bin");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(e.bin_dir.join("fine"), other.join("later")).unwrap();
    let config = e.dir.join("spawner.json");
    let write = |bin: &Path| {
        let tmp = e.dir.join("spawner.json.tmp");
        std::fs::write(&tmp, json!({"binDir": bin}).to_string()).unwrap();
        std::fs::rename(&tmp, &config).unwrap();
    };
    write(&e.bin_dir);
    let s = Spawner::start(&e.dir.path, &config);
    let later = other.join("later");
    assert!(matches!(
        ask(&s.sock, later.to_str().unwrap()),
        plexus::spawner::Started::Failed { .. }
    ));
    write(&other);
    let threads = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir(format!("/proc/{}/task", s.pid()))
            .unwrap()
            .map(|t| t.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..5 {
        let (conn, started) = ask_open(&s.sock, later.to_str().unwrap(), &[]);
        match started {
            plexus::spawner::Started::Pid(_) => {}
            other => panic!("refused after binDir changed: {other:?}"),
        }
        // While the connection is open, a worker serves it.
        seen.extend(threads());
        drop(conn);
        // Closed: its plugin is reaped and its worker idle again.
        wait_until(T, "the spawner to reap its child", || {
            crate::support::cni::children(s.pid()).is_empty()
        });
    }
    // The main thread, the signal thread and the workers, reused: one,
    // or two when a connection came in while the first worker had
    // answered but not yet gone back to waiting (a thread per connection
    // would be five, and six with the refused one).
    assert!(
        seen.len() <= 4,
        "threads {seen:?} for five runs one after another"
    );
}

/// A socket at pluginSpawner that another user listens on is never
/// trusted with a plugin: the ADD fails naming it, and nothing runs.
#[test]
fn a_spawner_of_another_user_should_be_refused() {
    use std::os::unix::fs::PermissionsExt;
    let e = Engine::new("spawn-nobody");
    let ran = e.dir.join("ran");
    e.fake("fine", &format!("touch '{}'; echo '{{}}'", ran.display()));
    e.write_network(
        "10-net.conflist",
        &conflist("fine", "1.0.0", vec![json!({"type": "fine"})]),
    );
    // A directory another user may bind in, and an impostor there: the
    // built spawner itself, run as 65534.
    let open = e.dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sock = open.join("spawner.sock");
    let config_path = e.dir.join("d.json");
    let mut config = e.config("fine", "10s");
    config["pluginSpawner"] = json!(sock);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let mut impostor = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", SPAWNER])
        .arg("--config")
        .arg(&config_path)
        .arg("--listen")
        .arg(&sock)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let impostor = Reap(&mut impostor);
    wait_until(T, "the impostor's socket", || sock.exists());
    let mut d = Daemon::start(&e.dir, "d", config);
    d.ready();
    let ns = Netns::new();
    let (_, msg, _) = failed(&d, &cni(&d, "ADD", "sp-nobody", &ns, "eth0"));
    assert!(
        msg.contains("refused the plugin spawner") && msg.contains("uid 65534"),
        "{msg}"
    );
    assert!(!ran.exists(), "a plugin ran through another user's spawner");
    assert!(crate::support::cni::children(impostor.0.id() as i32).is_empty());
}
