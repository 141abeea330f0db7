//! The runner and the process lifecycle with real (shell) plugins.

use super::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn script(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The pid a test's plugin wrote to `path`.
fn pid_in(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Waits (10 s at most, else fails with `why`) until `pid`, killed, is
/// gone: once init reaps it /proc no longer lists it, and a zombie reads
/// as state Z meanwhile.
async fn wait_gone(pid: i32, why: &str) {
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !gone() {
        assert!(std::time::Instant::now() < deadline, "{why}");
        tokio::task::yield_now().await;
    }
}

fn env() -> CallEnv {
    CallEnv {
        command: "ADD",
        container_id: "c1".into(),
        netns: "/x".into(),
        ifname: "eth0".into(),
        args: String::new(),
    }
}

/// A test of a plugin run, made on the runtime (the plugin's pipes and
/// exit through its I/O driver) and on a call's own thread (waited for
/// with poll(2), `process_here.rs`).
macro_rules! both_ways {
    ($body:ident, $on_runtime:ident, $on_own_thread:ident) => {
        #[tokio::test]
        async fn $on_runtime() {
            $body().await
        }

        #[tokio::test]
        async fn $on_own_thread() {
            crate::op_thread::OpThreads::new(1).run($body()).await
        }
    };
}

both_ways!(
    told_apart,
    plugin_output_and_errors_should_be_told_apart,
    plugin_output_and_errors_should_be_told_apart_on_a_calls_thread
);

async fn told_apart() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "ok",
        "cat >/dev/null; echo '{\"cniVersion\":\"1.0.0\"}'; echo log >&2",
    );
    script(
        dir.path(),
        "err",
        "echo '{\"code\":7,\"msg\":\"bad\"}'; exit 1",
    );
    script(dir.path(), "crash", "kill -SEGV $$");
    script(dir.path(), "garbage", "echo nope; exit 3");
    script(
        dir.path(),
        "env",
        "echo \"$CNI_COMMAND $CNI_IFNAME $CNI_PATH\"; env | cut -d= -f1 | grep -v '^PWD$' | sort | tr '\\n' ' '",
    );
    let r = Runner::new(vec![dir.path().into()], Duration::from_secs(10), None);
    let run = |name: &'static str| {
        let r = &r;
        async move { r.run(&r.find(name).unwrap(), &env(), b"{}".to_vec()).await }
    };
    assert_eq!(run("ok").await.unwrap(), b"{\"cniVersion\":\"1.0.0\"}\n");
    match run("err").await {
        Err(Error::Failed { error, .. }) => assert_eq!(error.code, 7),
        other => panic!("{other:?}"),
    }
    let e = run("crash").await.unwrap_err();
    assert!(e.to_string().contains("killed by signal 11"), "{e}");
    let e = run("garbage").await.unwrap_err();
    assert!(matches!(e, Error::BadError { .. }), "{e}");
    // Nothing of the daemon's environment (NOTIFY_SOCKET, LISTEN_*,
    // JOURNAL_STREAM, or here cargo's variables) reaches a plugin; the
    // shell adds PWD itself.
    let out = run("env").await.unwrap();
    let expect = format!(
        "ADD eth0 {}\nCNI_ARGS CNI_COMMAND CNI_CONTAINERID CNI_IFNAME CNI_NETNS CNI_PATH PATH ",
        dir.path().display()
    );
    assert_eq!(String::from_utf8_lossy(&out), expect);
    assert!(matches!(r.find("missing"), Err(Error::NotFound { .. })));
}

both_ways!(
    gate_holds_stdin,
    a_gates_work_should_run_while_the_plugin_starts_and_hold_its_stdin,
    a_gates_work_should_hold_the_stdin_on_a_calls_thread
);

/// A gate's blocking work runs in the trip that spawned the plugin:
/// the plugin is already running (blocked on its stdin) while the work
/// runs, reads nothing before it is done, and is stopped and reaped
/// unread when it fails. The work runs once, even when the spawn fails.
async fn gate_holds_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let got = dir.path().join("got");
    script(
        dir.path(),
        "gated",
        &format!(
            "echo $$ > {s}.tmp; mv {s}.tmp {s}; IN=$(cat); printf %s \"$IN\" > {g}; echo '{{\"cniVersion\":\"1.0.0\"}}'",
            s = started.display(),
            g = got.display()
        ),
    );
    let r = Runner::new(vec![dir.path().into()], Duration::from_secs(10), None);
    let plugin = r.find("gated").unwrap();
    for open in [true, false] {
        let _ = std::fs::remove_file(&started);
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let work: Gate = {
            let (started, got, ran) = (started.clone(), got.clone(), ran.clone());
            Box::new(move || {
                // The plugin runs already; it has read nothing.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while !started.exists() {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the plugin never started"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert!(!got.exists(), "the plugin read its stdin before the work");
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if open {
                    Ok(())
                } else {
                    Err("the disk is full".into())
                }
            })
        };
        let out = r.run_gated(&plugin, &env(), b"config".to_vec(), work).await;
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
        let pid = pid_in(&started);
        if open {
            assert_eq!(out.unwrap(), b"{\"cniVersion\":\"1.0.0\"}\n");
            assert_eq!(std::fs::read(&got).unwrap(), b"config");
            std::fs::remove_file(&got).unwrap();
        } else {
            let e = out.unwrap_err();
            assert!(matches!(e, Error::Held { .. }), "{e}");
            assert!(e.to_string().contains("the disk is full"), "{e}");
            assert!(!got.exists(), "read its stdin");
            assert!(!Path::new(&format!("/proc/{pid}")).exists(), "not reaped");
        }
    }
    // A plugin that cannot be executed: the spawn fails, the work ran.
    let broken = dir.path().join("broken");
    std::fs::write(&broken, "not a program").unwrap();
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let work: Gate = {
        let ran = ran.clone();
        Box::new(move || {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
    };
    let e = r
        .run_gated(
            &Plugin::unlocated("broken", broken),
            &env(),
            b"config".to_vec(),
            work,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Spawn { .. }), "{e}");
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
}

both_ways!(
    timeout_kills_group,
    timeout_should_kill_the_whole_group,
    timeout_should_kill_the_whole_group_on_a_calls_thread
);

async fn timeout_kills_group() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("child.pid");
    script(
        dir.path(),
        "hang",
        &format!("sleep 1000 & echo $! > {}; wait", marker.display()),
    );
    let r = Runner::new(vec![dir.path().into()], Duration::from_millis(300), None);
    let e = r
        .run(&r.find("hang").unwrap(), &env(), Vec::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::TimedOut { .. }), "{e}");
    let pid = pid_in(&marker);
    // The grandchild was SIGKILLed with its group.
    wait_gone(pid, "sleep survived").await;
}

both_ways!(
    big_streams,
    big_input_and_output_should_flow_and_be_bounded,
    big_input_and_output_should_flow_and_be_bounded_on_a_calls_thread
);

/// More input than a pipe holds, fed to a plugin that reads it and to one
/// that exits without reading it; more output than is kept; and output
/// held open by a process that left the plugin's group.
async fn big_streams() {
    let dir = tempfile::tempdir().unwrap();
    let holder = dir.path().join("holder.pid");
    script(dir.path(), "echo", "cat");
    script(dir.path(), "deaf", "echo '{}'");
    script(
        dir.path(),
        "flood",
        &format!("head -c {} /dev/zero", STDOUT_CAP + 4096),
    );
    script(
        dir.path(),
        "held",
        &format!(
            "setsid sh -c 'echo $$ > {h}.tmp; mv {h}.tmp {h}; exec sleep 1000' & \
             while [ ! -e {h} ]; do :; done; echo '{{}}'",
            h = holder.display()
        ),
    );
    let r = Runner::new(vec![dir.path().into()], Duration::from_secs(20), None);
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let out = r
        .run(&r.find("echo").unwrap(), &env(), big.clone())
        .await
        .unwrap();
    assert!(out == big, "{} bytes back of {}", out.len(), big.len());
    let out = r
        .run(&r.find("deaf").unwrap(), &env(), big.clone())
        .await
        .unwrap();
    assert_eq!(out, b"{}\n");
    let e = r
        .run(&r.find("flood").unwrap(), &env(), Vec::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::TooMuchOutput { .. }), "{e}");
    // The holder keeps the pipes open past the grace: the answer is what
    // the plugin printed.
    let out = r
        .run(&r.find("held").unwrap(), &env(), Vec::new())
        .await
        .unwrap();
    assert_eq!(out, b"{}\n");
    let pid = pid_in(&holder);
    // SAFETY: kill(2) of the holder this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// How many times this thread has slept so far.
fn sleeps_of_this_thread() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// On a call's own thread, a plugin that answers in several writes and
/// exits soon after wakes the thread by its exit, not once per write (nor
/// again as its pipes close); its whole answer is still read.
#[tokio::test(flavor = "current_thread")]
async fn a_quick_plugins_writes_should_not_each_wake_a_calls_thread() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "chatty",
        "cat >/dev/null; for i in 1 2 3 4 5 6; do echo $i; echo e$i >&2; sleep 0.002; done",
    );
    let r = Arc::new(Runner::new(
        vec![dir.path().into()],
        Duration::from_secs(20),
        None,
    ));
    let ops = crate::op_thread::OpThreads::new(1);
    let mut judged = 0;
    for _ in 0..5 {
        let r = r.clone();
        let (out, sleeps, took) = ops
            .run(async move {
                let plugin = r.find("chatty").unwrap();
                let before = sleeps_of_this_thread();
                let started = std::time::Instant::now();
                let out = r.run(&plugin, &env(), b"{}".to_vec()).await.unwrap();
                (out, sleeps_of_this_thread() - before, started.elapsed())
            })
            .await;
        assert_eq!(out, b"1\n2\n3\n4\n5\n6\n");
        // Only a run that ended within the patience says anything (a
        // loaded machine can stretch the plugin past it): its start, its
        // exit, at most a little more; one wake per write would be 12.
        if took < super::process::PATIENCE {
            assert!(sleeps <= 4, "the call's thread slept {sleeps} times");
            judged += 1;
        }
    }
    if judged == 0 {
        eprintln!("no run ended within the patience: nothing judged");
    }
}

/// On a call's own thread the plugin run needs nothing of the runtime's
/// thread: with that thread blocked, a plugin still runs to its answer.
#[tokio::test(flavor = "current_thread")]
async fn a_plugin_run_on_a_calls_thread_should_not_need_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    script(dir.path(), "ok", "cat >/dev/null; echo '{}'");
    let r = Arc::new(Runner::new(
        vec![dir.path().into()],
        Duration::from_secs(20),
        None,
    ));
    let (done_tx, done) = std::sync::mpsc::channel();
    let call = tokio::spawn({
        let r = r.clone();
        async move {
            crate::op_thread::OpThreads::new(1)
                .run(async move {
                    let out = r.run(&r.find("ok").unwrap(), &env(), b"{}".to_vec()).await;
                    done_tx.send(out.is_ok()).unwrap();
                })
                .await
        }
    });
    // Let the call reach its thread, then block this one, the runtime's.
    tokio::task::yield_now().await;
    let answered = done.recv_timeout(Duration::from_secs(20));
    assert_eq!(answered, Ok(true), "the plugin run waited for the runtime");
    call.await.unwrap();
}

/// The daemon's stop cuts off a call on its own thread: its hung plugin's
/// group is killed at once (not at the plugin's deadline), and no plugin
/// starts after it.
#[tokio::test(flavor = "current_thread")]
async fn a_stop_should_kill_the_plugin_of_a_call_on_its_own_thread_and_start_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("child.pid");
    let ran = dir.path().join("ran");
    script(
        dir.path(),
        "hang",
        &format!(
            "sleep 1000 & echo $! > {m}.tmp; mv {m}.tmp {m}; wait",
            m = marker.display()
        ),
    );
    script(
        dir.path(),
        "later",
        &format!("touch {}; echo '{{}}'", ran.display()),
    );
    let r = Arc::new(Runner::new(
        vec![dir.path().into()],
        Duration::from_secs(600),
        None,
    ));
    let ops = crate::op_thread::OpThreads::new(2);
    let started = std::time::Instant::now();
    let call = tokio::spawn({
        let (r, ops) = (r.clone(), ops.clone());
        async move {
            ops.run(async move {
                let hung = r.run(&r.find("hang").unwrap(), &env(), Vec::new()).await;
                let later = r.run(&r.find("later").unwrap(), &env(), Vec::new()).await;
                (hung, later)
            })
            .await
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the plugin never started"
        );
        tokio::task::yield_now().await;
    }
    ops.stop();
    let (hung, later) = call.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "waited for the deadline"
    );
    assert!(matches!(hung, Err(Error::Stopped { .. })), "{hung:?}");
    assert!(matches!(later, Err(Error::Stopped { .. })), "{later:?}");
    assert!(!ran.exists(), "a plugin started after the stop");
    let pid = pid_in(&marker);
    wait_gone(pid, "the plugin's child survived").await;
}

#[tokio::test]
async fn versions_should_be_cached_until_the_binary_changes() {
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let body = |v: &str| {
        format!(
            "echo x >> {}; echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"{v}\"]}}'",
            count.display()
        )
    };
    script(dir.path(), "p", &body("0.4.0"));
    let r = Runner::new(vec![dir.path().into()], Duration::from_secs(10), None);
    let p = r.find("p").unwrap();
    assert_eq!(*r.versions(&p).await.unwrap(), vec!["0.4.0".to_string()]);
    assert_eq!(*r.versions(&p).await.unwrap(), vec!["0.4.0".to_string()]);
    assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1);
    script(dir.path(), "p", &format!("{}   ", body("1.0.0")));
    let p = r.find("p").unwrap();
    assert_eq!(*r.versions(&p).await.unwrap(), vec!["1.0.0".to_string()]);
}

#[tokio::test]
async fn failed_version_should_cost_one_bounded_call_for_a_while() {
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let calls = || std::fs::read_to_string(&count).unwrap().lines().count();
    script(
        dir.path(),
        "p",
        &format!("echo x >> {}; exec sleep 1000", count.display()),
    );
    let mut r = Runner::new(vec![dir.path().into()], Duration::from_secs(30), None);
    assert_eq!(r.version_timeout, VERSION_TIMEOUT);
    r.version_timeout = Duration::from_millis(300);
    let p = r.find("p").unwrap();

    // Concurrent callers share the one (bounded) VERSION call.
    let t = std::time::Instant::now();
    let (a, b, c) = tokio::join!(r.versions(&p), r.versions(&p), r.versions(&p));
    assert!(a.is_none() && b.is_none() && c.is_none());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(calls(), 1);
    // Remembered: no call, no wait.
    for _ in 0..3 {
        let t = std::time::Instant::now();
        assert!(r.versions(&p).await.is_none());
        assert!(
            t.elapsed() < Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
    }
    assert_eq!(calls(), 1);
    // Once the failure is old, the plugin is asked again.
    r.version_retry = Duration::ZERO;
    assert!(r.versions(&p).await.is_none());
    assert_eq!(calls(), 2);
    let short = Runner::new(Vec::new(), Duration::from_secs(1), None);
    assert_eq!(short.version_timeout, Duration::from_secs(1));
}
