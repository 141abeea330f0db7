//! The plugin process runner when plugins misbehave in ways that cost the
//! daemon more than one call: children that keep a plugin's pipes open, a
//! VERSION that hangs, a network that would make the daemon call itself;
//! and the journal of process groups that lets a restarted daemon kill what
//! a crashed one left running. Needs root for the daemon tests (netns).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plexus::cni::exec::{
    self, kill_stale_group, start_time, CallEnv, Group, Journal, Runner, VERSION_TIMEOUT,
};
use serde_json::json;

use crate::support::cni::{address, cni, conflist, failed, ok, processes_matching, Engine, SETTLE};
use crate::support::daemon::{wait_until, TestDir};
use crate::support::netns::Netns;

/// What the fakes print on ADD: a result with a known address.
const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"192.0.2.7/24"}]}"#;

/// Open descriptors of `pid`.
fn fd_count(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// Descriptors of `pid` other than sockets (the daemon's connections come
/// and go with the shims): pipes, pidfds, files.
fn non_socket_fds(pid: i32) -> Vec<String> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut v: Vec<String> = dir
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .filter(|l| !l.starts_with("socket:"))
        .collect();
    v.sort();
    v
}

/// Whether `pid` is gone or a zombie (this machine's PID 1 may leave
/// killed orphans unreaped).
fn dead(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.contains(") Z ") || s.contains(") X "))
        .unwrap_or(true)
}

#[test]
fn plugin_whose_child_keeps_its_pipes_should_answer_at_once_and_hold_nothing() {
    let e = Engine::new("runner-setsid");
    // The child leaves the plugin's process group (setsid) with stdin,
    // stdout and stderr inherited, and outlives the plugin, which exits
    // once the child is out of its group (the fifo).
    e.fake(
        "fake-setsid",
        &format!(
            r#"if [ "$CNI_COMMAND" = ADD ]; then
  ready="$DIR/ready-$CNI_CONTAINERID"
  mkfifo "$ready"
  setsid bash -c 'echo > "$1"; exec -a "$0" sleep 120' "$BIN/fake-setsid-child" "$ready" <&0 &
  read -r _ < "$ready"
  echo '{RESULT}'
fi
exit 0"#
        ),
    );
    e.write_network(
        "10-setsid.conflist",
        &conflist("setsid-net", "1.0.0", vec![json!({"type": "fake-setsid"})]),
    );
    let ns = Netns::new();
    let d = e.start("d", "setsid-net", "10s");
    let child_needle = format!("{}/fake-setsid-child", e.bin_dir.display());
    // A first call waits for the daemon's start-up check (it runs the
    // fake's VERSION) and opens whatever is opened once.
    let r = ok(&d, &cni(&d, "ADD", "setsid-0", &ns, "eth0"));
    assert_eq!(address(&r), "192.0.2.7/24");
    let before = fd_count(d.pid());
    let before_other = non_socket_fds(d.pid());

    let all = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 1..=20 {
        let t = Instant::now();
        let r = ok(&d, &cni(&d, "ADD", &format!("setsid-{i}"), &ns, "eth0"));
        slowest = slowest.max(t.elapsed());
        assert_eq!(address(&r), "192.0.2.7/24", "ADD {i}: {r}");
    }
    let took = all.elapsed();
    eprintln!("20 ADDs took {took:?}, the slowest {slowest:?}");
    // Before, each one waited 2 s for pipes that never closed, and failed
    // when the child kept them open longer.
    assert!(
        slowest < Duration::from_millis(1500),
        "slowest ADD {slowest:?}"
    );
    assert!(took < Duration::from_secs(15), "20 ADDs took {took:?}");

    // Nothing of the calls is held: the pipes went with the plugins, the
    // connections close as the shims exit.
    let settled = Instant::now() + SETTLE;
    let (mut after, mut after_other) = (0, Vec::new());
    while Instant::now() < settled {
        (after, after_other) = (fd_count(d.pid()), non_socket_fds(d.pid()));
        if after <= before && after_other == before_other {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("plexusd's descriptors: {before} before, {after} after");
    assert_eq!(
        after_other, before_other,
        "plexusd's non-socket descriptors"
    );
    assert!(
        after <= before,
        "plexusd's descriptors: {before} before, {after} after"
    );
    // The children were not killed (the Engine's drop does that).
    let children = processes_matching(&child_needle);
    assert_eq!(children.len(), 21, "{children:?}");
    assert!(children.iter().all(|(pid, _)| !dead(*pid)));
}

#[test]
fn hung_version_should_cost_one_bounded_wait_not_one_per_call() {
    let e = Engine::new("runner-version");
    let calls = e.dir.join("version.calls");
    e.fake_with(
        "fake-version-hang",
        r#"if [ "$CNI_COMMAND" = VERSION ]; then
  echo VERSION >> "$DIR/version.calls"
  exec -a "$BIN/fake-version-sleep" sleep 1000
fi"#,
        &format!("echo '{RESULT}'"),
    );
    e.write_network(
        "10-ver.conflist",
        &conflist(
            "ver-net",
            "1.0.0",
            vec![json!({"type": "fake-version-hang"})],
        ),
    );
    let ns = Netns::new();
    // The daemon's start-up check may start the VERSION call before the
    // first ADD; either way it is made once and bounded.
    let d = e.start("d", "ver-net", "30s");

    let t = Instant::now();
    let r = ok(&d, &cni(&d, "ADD", "ver-0", &ns, "eth0"));
    let first = t.elapsed();
    assert_eq!(address(&r), "192.0.2.7/24");
    // Bounded by VERSION_TIMEOUT, not by pluginTimeout (30 s).
    assert!(first < VERSION_TIMEOUT * 3, "first ADD took {first:?}");
    let mut rest = Vec::new();
    for i in 1..=3 {
        let t = Instant::now();
        ok(&d, &cni(&d, "ADD", &format!("ver-{i}"), &ns, "eth0"));
        rest.push(t.elapsed());
    }
    eprintln!("first ADD {first:?}, then {rest:?}");
    for took in &rest {
        assert!(*took < VERSION_TIMEOUT / 2, "later ADD took {took:?}");
    }
    let n = fs::read_to_string(&calls)
        .unwrap_or_default()
        .lines()
        .count();
    assert_eq!(n, 1, "VERSION calls");
    // The hung VERSION was killed with its group at the bound.
    let needle = format!("{}/fake-version-sleep", e.bin_dir.display());
    wait_until(SETTLE, "the hung VERSION to be killed", || {
        processes_matching(&needle).is_empty()
    });
}

#[test]
fn network_running_the_shim_itself_should_be_refused_with_code_7() {
    let e = Engine::new("runner-self");
    // Records every exec, VERSION included.
    e.fake_with(
        "fake-record",
        r#"echo "$CNI_COMMAND $CNI_CONTAINERID" >> "$DIR/record.calls""#,
        Engine::pass_through(),
    );
    e.write_network(
        "10-self.conflist",
        &conflist(
            "self-net",
            "1.0.0",
            vec![
                json!({"type": "fake-record"}),
                json!({"type": "plexus-shim"}),
            ],
        ),
    );
    let ns = Netns::new();
    let d = e.start("d", "self-net", "10s");

    let t = Instant::now();
    let (code, msg, _) = failed(&d, &cni(&d, "ADD", "self-1", &ns, "eth0"));
    let took = t.elapsed();
    assert_eq!(code, 7, "{msg}");
    assert!(
        msg.contains("plexus-shim") && msg.contains("call itself"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(2), "ADD took {took:?}");
    assert!(
        !e.dir.join("record.calls").exists(),
        "a plugin ran: {:?}",
        fs::read_to_string(e.dir.join("record.calls"))
    );
    assert_eq!(e.records(), Vec::<String>::new());
}

// ---- the runner on its own (library API) ----

/// Processes a test started, SIGKILLed on drop when still the same process
/// (same start time), so that a failed assertion leaves nothing running.
#[derive(Default)]
struct Cleanup(Vec<(i32, u64)>);

impl Cleanup {
    fn add(&mut self, pid: i32) {
        if let Some(t) = start_time(pid) {
            self.0.push((pid, t));
        }
    }
}

/// Kills, on drop, processes whose command line contains a test's own
/// directory.
struct KillMatching(String);

impl Drop for KillMatching {
    fn drop(&mut self) {
        for (pid, _) in processes_matching(&self.0) {
            // SAFETY: kill(2) on a process named after this test's directory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for &(pid, t) in &self.0 {
            if start_time(pid) == Some(t) {
                // SAFETY: kill(2) on a process this test started (its start
                // time still matches).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn script(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
}

fn add_env(container_id: &str) -> CallEnv {
    CallEnv {
        command: "ADD",
        container_id: container_id.into(),
        netns: "/x".into(),
        ifname: "eth0".into(),
        args: String::new(),
    }
}

#[tokio::test]
async fn plugin_that_leaves_a_stdin_holder_should_answer_at_once() {
    let dir = TestDir::new("runner-stdin-holder");
    let needle = format!("{}/holder", dir.path.display());
    // It never reads its (1 MiB) stdin; the child it leaves behind
    // inherits it and never reads it either. The plugin exits only once
    // the child has left its process group (the fifo).
    script(
        &dir.path,
        "p",
        &format!(
            r#"mkfifo {d}/ready
setsid bash -c 'echo > "$1"; exec -a "$0" sleep 120' {needle} {d}/ready <&0 &
read -r _ < {d}/ready
echo '{RESULT}'"#,
            d = dir.path.display()
        ),
    );
    let _cleanup = KillMatching(needle.clone());
    let r = Runner::new(vec![dir.path.clone()], Duration::from_secs(10), None);
    let t = Instant::now();
    let out = r
        .run(&r.find("p").unwrap(), &add_env("c1"), vec![b' '; 1 << 20])
        .await
        .unwrap();
    let took = t.elapsed();
    assert_eq!(String::from_utf8_lossy(&out).trim(), RESULT);
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let holders = processes_matching(&needle);
    assert_eq!(holders.len(), 1, "{holders:?}");
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// Group, and the bytes already in the plugin's stdin at that time.
    Started(String, Group, usize),
    /// Group, and whether its leader was gone from /proc (reaped).
    Finished(String, Group, bool),
}

/// Notes events; writes `<dir>/started-<pgid>` in `started`; fails
/// `started` when `fail` is set.
#[derive(Debug)]
struct Recorder {
    dir: PathBuf,
    fail: bool,
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    fn new(dir: &Path, fail: bool) -> Arc<Self> {
        Arc::new(Self {
            dir: dir.to_path_buf(),
            fail,
            events: Mutex::new(Vec::new()),
        })
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }
}

/// Bytes waiting in the pipe that is `pid`'s stdin (FIONREAD on a second
/// descriptor of it, opened through /proc).
fn stdin_pending(pid: i32) -> usize {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(format!("/proc/{pid}/fd/0")).unwrap();
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through a valid pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(r, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    n as usize
}

impl Journal for Recorder {
    fn started(&self, container_id: &str, group: Group) -> std::io::Result<()> {
        let pending = stdin_pending(group.pgid);
        fs::write(self.dir.join(format!("started-{}", group.pgid)), b"")?;
        self.events
            .lock()
            .unwrap()
            .push(Event::Started(container_id.into(), group, pending));
        if self.fail {
            return Err(std::io::Error::other("journal full"));
        }
        Ok(())
    }

    fn finished(&self, container_id: &str, group: Group) {
        let reaped = !Path::new(&format!("/proc/{}", group.pgid)).exists();
        self.events
            .lock()
            .unwrap()
            .push(Event::Finished(container_id.into(), group, reaped));
    }
}

#[tokio::test]
async fn journal_should_note_each_group_before_its_stdin_and_close_it_after_the_reap() {
    let dir = TestDir::new("runner-journal");
    let d = dir.path.display();
    // After its config arrived it checks that the journal entry existed
    // (VERSION is not journaled), and prints its pid, process group and
    // start time.
    script(
        &dir.path,
        "p",
        &format!(
            r#"cat > /dev/null
[ "$CNI_COMMAND" = VERSION ] || test -e {d}/started-$$ || {{ echo '{{"code":99,"msg":"not noted before stdin"}}'; exit 1; }}
read -r line < /proc/$$/stat
set -- $line
echo "$1 $5 ${{22}}""#
        ),
    );
    let journal = Recorder::new(&dir.path, false);
    let r = Runner::new(vec![dir.path.clone()], Duration::from_secs(10), None)
        .with_journal(journal.clone());
    let p = r.find("p").unwrap();
    let mut expect = Vec::new();
    for id in ["c1", "c2"] {
        let out = r.run(&p, &add_env(id), b"{}".to_vec()).await.unwrap();
        let out = String::from_utf8(out).unwrap();
        let f: Vec<&str> = out.split_whitespace().collect();
        let group = Group {
            pgid: f[0].parse().unwrap(),
            start_time: f[2].parse().unwrap(),
        };
        assert_eq!(f[1], f[0], "the plugin leads its own group");
        expect.push(Event::Started(id.into(), group, 0));
        expect.push(Event::Finished(id.into(), group, true));
    }
    // VERSION (no container id) is not journaled.
    let version = CallEnv {
        command: "VERSION",
        ..CallEnv::default()
    };
    r.run(&p, &version, b"{}".to_vec()).await.unwrap();
    assert_eq!(journal.events(), expect);
}

#[tokio::test]
async fn failing_journal_should_fail_the_run_before_the_plugin_reads_its_config() {
    let dir = TestDir::new("runner-journal-fail");
    let got = dir.path.join("got-config");
    // The file is created only once its stdin reached EOF.
    script(
        &dir.path,
        "p",
        &format!("IN=$(cat); echo \"$IN\" > {}", got.display()),
    );
    let journal = Recorder::new(&dir.path, true);
    let r = Runner::new(vec![dir.path.clone()], Duration::from_secs(10), None)
        .with_journal(journal.clone());
    let e = r
        .run(&r.find("p").unwrap(), &add_env("c1"), b"{}".to_vec())
        .await
        .unwrap_err();
    assert!(matches!(e, exec::Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("process group"), "{e}");
    assert!(
        format!("{:?}", std::error::Error::source(&e)).contains("journal full"),
        "{e:?}"
    );
    let events = journal.events();
    let [Event::Started(_, group, 0)] = events.as_slice() else {
        panic!("{events:?}");
    };
    // Killed and reaped before it could read anything: had its stdin
    // been closed instead, `cat` would have created the file.
    assert!(!Path::new(&format!("/proc/{}", group.pgid)).exists());
    assert!(!got.exists());
}

#[tokio::test]
async fn dropped_call_should_kill_the_plugin_and_close_its_journal_entry() {
    let dir = TestDir::new("runner-journal-drop");
    script(&dir.path, "p", "cat > /dev/null; exec sleep 1000");
    let journal = Recorder::new(&dir.path, false);
    let r = Runner::new(vec![dir.path.clone()], Duration::from_secs(60), None)
        .with_journal(journal.clone());
    let p = r.find("p").unwrap();
    let env = add_env("c1");
    let mut call = Box::pin(r.run(&p, &env, b"{}".to_vec()));
    // Drive the call until the plugin runs, then drop it half-way.
    let noted = async {
        while journal.events().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        r = &mut call => panic!("the call ended: {r:?}"),
        () = noted => {}
    }
    drop(call);
    wait_until(SETTLE, "the journal entry to be closed", || {
        journal.events().len() == 2
    });
    let events = journal.events();
    let [Event::Started(_, g1, _), Event::Finished(_, g2, true)] = events.as_slice() else {
        panic!("{events:?}");
    };
    assert_eq!(g1, g2);
}

/// Starts `sh -c script` as the leader of a new process group; returns
/// the child and its group.
fn group_leader(script: &str) -> (std::process::Child, Group) {
    let child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id() as i32;
    // Readable until we reap it, even once it exited.
    let start_time = start_time(pgid).unwrap();
    (child, Group { pgid, start_time })
}

/// The first line the child printed, as a pid.
fn printed_pid(child: &mut std::process::Child) -> i32 {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim().parse().unwrap()
}

#[test]
fn kill_stale_group_should_kill_leader_and_children() {
    let (mut leader, group) = group_leader("sleep 1000 & echo $!; wait");
    let child = printed_pid(&mut leader);
    let mut cleanup = Cleanup::default();
    cleanup.add(group.pgid);
    cleanup.add(child);
    assert!(!dead(group.pgid) && !dead(child));
    assert!(kill_stale_group(group, Duration::ZERO, SETTLE).unwrap());
    assert!(dead(group.pgid) && dead(child));
    leader.wait().unwrap();
    // Nothing is left of it now.
    assert!(!kill_stale_group(group, Duration::ZERO, SETTLE).unwrap());
}

#[test]
fn kill_stale_group_should_let_a_group_younger_than_its_deadline_finish() {
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    // A plugin a crashed plexusd left mid-call: it ends on its own within
    // its deadline, and is not killed half-way.
    let (mut leader, group) = group_leader(&format!("sleep 0.3; touch {}", done.display()));
    let mut cleanup = Cleanup::default();
    cleanup.add(group.pgid);
    assert!(!kill_stale_group(group, Duration::from_secs(60), SETTLE).unwrap());
    assert!(done.exists(), "the group was killed before it finished");
    leader.wait().unwrap();
    // Past its deadline: killed at once.
    let late = dir.path().join("late");
    let (mut leader, group) = group_leader(&format!("sleep 0.3; touch {}", late.display()));
    cleanup.add(group.pgid);
    assert!(kill_stale_group(group, Duration::ZERO, SETTLE).unwrap());
    leader.wait().unwrap();
    assert!(!late.exists(), "a group past its deadline ran on");
}

#[test]
fn kill_stale_group_should_kill_members_of_a_group_whose_leader_is_gone() {
    let (mut leader, group) = group_leader("sleep 1000 & echo $!");
    let member = printed_pid(&mut leader);
    let mut cleanup = Cleanup::default();
    cleanup.add(member);
    leader.wait().unwrap();
    assert!(!Path::new(&format!("/proc/{}", group.pgid)).exists());
    assert!(!dead(member));
    assert!(kill_stale_group(group, Duration::ZERO, SETTLE).unwrap());
    assert!(dead(member));
}

#[test]
fn kill_stale_group_should_spare_a_group_whose_leader_started_at_another_time() {
    let (mut leader, group) = group_leader("exec sleep 1000");
    let mut cleanup = Cleanup::default();
    cleanup.add(group.pgid);
    let other = Group {
        start_time: group.start_time + 1,
        ..group
    };
    assert!(!kill_stale_group(other, Duration::ZERO, SETTLE).unwrap());
    assert!(
        !dead(group.pgid),
        "a process that is not the recorded one was killed"
    );
    leader.kill().unwrap();
    leader.wait().unwrap();
    // A group that exited is nothing to kill.
    let (mut gone, group) = group_leader("true");
    gone.wait().unwrap();
    assert!(!kill_stale_group(group, Duration::ZERO, SETTLE).unwrap());
}
