//! Every way out of an operation's locked part but its answer: an error
//! injected at each step that can fail ([`Step`]), or the condition that
//! makes it return early. Whichever it is, the operation must leave what
//! docs/records.md ("What an operation leaves") says: its locks released
//! (another daemon takes the container's lock at once, and this daemon's
//! next call on the container is served), no plugin marker in the lock
//! file (and no lock file when no record is left), and the record as
//! documented for that failure.

use std::io::ErrorKind as IoKind;

use super::scripted::{scripted, Scripted, PLUGINS};
use super::*;
use crate::cni::engine::fault::Step;

/// How long the call after a failed one may take: it runs no plugin.
const SERVED: Duration = Duration::from_secs(5);

/// Checks what `what` left of container `id` (its locks, its marker) and
/// answers its record.
async fn left(s: &Scripted, id: &str, what: &str) -> Option<Record> {
    let unreached = s.engine.faults.unreached();
    assert!(unreached.is_empty(), "{what}: never reached {unreached:?}");
    let record = s.record(id);
    match std::fs::read(s.lock_file(id)) {
        Ok(marker) => {
            assert!(
                record.is_some(),
                "{what}: the lock file of a container without a record is left"
            );
            assert!(
                marker.iter().all(u8::is_ascii_whitespace),
                "{what}: the lock file still names a plugin: {:?}",
                String::from_utf8_lossy(&marker)
            );
        }
        Err(e) => assert_eq!(e.kind(), IoKind::NotFound, "{what}: {e}"),
    }
    taken_at_once(s, id, what).await;
    let probe = call(Command::Check, id, "probe0");
    let next = s.engine.check(&probe);
    assert!(
        timeout(SERVED, next).await.is_ok(),
        "{what}: the next call on the container was not served"
    );
    taken_at_once(s, id, &format!("{what}, then CHECK")).await;
    record
}

/// Whether another daemon on the same stateDir can take the lock of
/// container `id`. Polled: a plugin another test is starting holds a copy
/// of every descriptor of this process, and so of this lock, until its
/// exec.
async fn taken_at_once(s: &Scripted, id: &str, what: &str) {
    let other = Locks::open(&s.state_dir()).unwrap();
    let deadline = tokio::time::Instant::now() + SERVED;
    while other.try_lock(id).unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the container's lock is still held"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `result` failed with the error injected at `step`.
fn injected<T: std::fmt::Debug>(result: Result<T, Error>, step: Step) {
    let e = result.unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("injected failure at step {step:?}")),
        "{step:?}: {e}"
    );
}

#[tokio::test]
async fn add_should_leave_no_lock_no_marker_and_only_what_it_could_not_roll_back() {
    // Before any plugin ran, or rolled back: nothing recorded.
    for step in [
        Step::Prepare,
        Step::RecordSync,
        Step::AddChain,
        Step::LastWrite,
    ] {
        let s = scripted();
        s.engine.faults.arm(step);
        injected(s.add("c1", "eth0").await, step);
        let record = left(&s, "c1", &format!("ADD, {step:?}")).await;
        assert_eq!(record, None, "{step:?}");
    }
    // Next to an attachment recorded before: exactly that one is left.
    for step in [
        Step::Prepare,
        Step::RecordSync,
        Step::AddChain,
        Step::LastWrite,
    ] {
        let s = scripted();
        s.add("c1", "eth0").await.unwrap();
        let before = s.record("c1");
        s.engine.faults.arm(step);
        injected(s.add("c1", "net1").await, step);
        let record = left(&s, "c1", &format!("second ADD, {step:?}")).await;
        assert_eq!(record, before, "{step:?}");
    }

    // A rollback that fails too: the attachment stays, its failure noted
    // (not as one the runtime was answered with).
    let s = scripted();
    s.engine.faults.arm(Step::AddChain);
    s.engine.faults.arm(Step::DelNetwork);
    injected(s.add("c1", "eth0").await, Step::AddChain);
    let record = left(&s, "c1", "ADD whose rollback failed").await.unwrap();
    let c = record.attachment("eth0").unwrap().cleanup.clone().unwrap();
    assert_eq!((c.failures, c.reported, c.handed_over), (1, 0, false));

    // The interface is taken: nothing runs, nothing changes.
    let s = scripted();
    s.add("c1", "eth0").await.unwrap();
    let before = s.record("c1");
    let e = s.add("c1", "eth0").await.unwrap_err();
    assert_eq!(e.code, code::INVALID_ENVIRONMENT, "{e}");
    assert_eq!(left(&s, "c1", "ADD on a taken interface").await, before);

    // The record would be too large: refused before anything ran.
    let big = NetworkList::from_value(
        Path::new("test"),
        json!({"cniVersion": "1.1.0", "name": "big",
               "plugins": [{"type": "fa", "pad": "x".repeat(300 << 10)}]}),
        false,
    )
    .unwrap();
    let e = add(&s.engine, "c2", "eth0", vec![plan(big, "eth0", true)])
        .await
        .unwrap_err();
    assert_eq!(e.code, code::INVALID_NETWORK_CONFIG, "{e}");
    assert_eq!(left(&s, "c2", "ADD of a record too large").await, None);
}

#[tokio::test]
async fn add_over_a_pending_del_should_leave_it_pending_when_it_fails_again() {
    let s = scripted();
    s.add("c1", "eth0").await.unwrap();
    // Reported twice, then handed over to plexusd's retries.
    for _ in 0..3 {
        s.engine.faults.arm(Step::DelNetwork);
        let _ = s.del("c1", "eth0").await;
    }
    let handed_over = |r: Option<Record>| {
        r.and_then(|r| r.attachment("eth0")?.cleanup.clone())
            .is_some_and(|c| c.handed_over)
    };
    assert!(handed_over(s.record("c1")));
    let before = s.record("c1");

    // The runtime's ADD over it retries that DEL first, which fails.
    s.engine.faults.arm(Step::DelNetwork);
    let e = s.add("c1", "eth0").await.unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    let record = left(&s, "c1", "ADD over a pending DEL that failed").await;
    assert!(handed_over(record), "the pending DEL is still pending");

    // It succeeds, but what it left cannot be written: the record stays.
    s.engine.faults.arm(Step::RecordWrite);
    injected(s.add("c1", "eth0").await, Step::RecordWrite);
    let record = left(&s, "c1", "ADD over a pending DEL, write failed").await;
    assert_eq!(record, before);
}

#[tokio::test]
async fn del_should_leave_no_lock_no_marker_and_what_failed_recorded() {
    // multus's delegate cache is damaged, so nothing was read with the
    // lock; looking again fails.
    for step in [Step::Unrecorded, Step::MultusLoad] {
        let s = scripted();
        std::fs::create_dir_all(s.dir.path().join("multus")).unwrap();
        std::fs::write(s.dir.path().join("multus/c1"), "[{").unwrap();
        s.engine.faults.arm(step);
        injected(s.del("c1", "eth0").await, step);
        assert_eq!(left(&s, "c1", &format!("DEL, {step:?}")).await, None);
    }

    // The record was damaged and the configured networks cannot be read.
    let s = scripted();
    std::fs::create_dir_all(s.state_dir().join("attachments")).unwrap();
    std::fs::write(s.state_dir().join("attachments/c1.json"), "{").unwrap();
    let unreadable = || async {
        Err::<Vec<Planned>, _>(Error::new(
            ErrorKind::Invalid,
            code::INVALID_NETWORK_CONFIG,
            "no such network",
        ))
    };
    let e = s
        .engine
        .del(&call(Command::Del, "c1", "eth0"), Map::new(), unreadable)
        .await
        .unwrap_err();
    assert!(e.msg.contains("no such network"), "{e}");
    assert_eq!(left(&s, "c1", "DEL falling back").await, None);

    // A network's DEL fails: it stays, its failure noted and reported.
    let s = scripted();
    s.add("c1", "eth0").await.unwrap();
    s.engine.faults.arm(Step::DelNetwork);
    injected(s.del("c1", "eth0").await, Step::DelNetwork);
    let record = left(&s, "c1", "DEL, DelNetwork").await.unwrap();
    let c = record.attachment("eth0").unwrap().cleanup.clone().unwrap();
    assert_eq!((c.failures, c.reported), (1, 1));

    // What is left cannot be written: the record stays as it was, and the
    // answer is the first failure.
    for steps in [
        &[Step::LastWrite][..],
        &[Step::DelNetwork, Step::LastWrite][..],
    ] {
        let s = scripted();
        s.add("c1", "eth0").await.unwrap();
        let before = s.record("c1");
        for step in steps {
            s.engine.faults.arm(*step);
        }
        injected(s.del("c1", "eth0").await, steps[0]);
        let record = left(&s, "c1", &format!("DEL, {steps:?}")).await;
        assert_eq!(record, before, "{steps:?}");
    }

    // A container multus attached: its caches stay for the next DEL.
    let s = scripted();
    s.multus_attached("m1");
    s.engine.faults.arm(Step::MultusResult);
    injected(s.del("m1", "eth0").await, Step::MultusResult);
    assert_eq!(left(&s, "m1", "DEL of multus's").await, None);
    assert!(s.multus_cached("m1"));
}

#[tokio::test]
async fn check_should_leave_no_lock_no_marker_and_the_record_as_it_was() {
    let s = scripted();
    s.add("c1", "eth0").await.unwrap();
    let before = s.record("c1");
    for step in [Step::Prepare, Step::CheckNetwork] {
        s.engine.faults.arm(step);
        injected(
            s.engine.check(&call(Command::Check, "c1", "eth0")).await,
            step,
        );
        let record = left(&s, "c1", &format!("CHECK, {step:?}")).await;
        assert_eq!(record, before, "{step:?}");
    }
    let e = s
        .engine
        .check(&call(Command::Check, "c1", "net9"))
        .await
        .unwrap_err();
    assert_eq!(e.code, code::UNKNOWN_CONTAINER, "{e}");
    assert_eq!(left(&s, "c1", "CHECK of nothing").await, before);

    s.multus_attached("m1");
    for step in [Step::MultusLoad, Step::MultusResult] {
        s.engine.faults.arm(step);
        injected(
            s.engine.check(&call(Command::Check, "m1", "eth0")).await,
            step,
        );
        let record = left(&s, "m1", &format!("CHECK of multus's, {step:?}")).await;
        assert_eq!(record, None, "{step:?}");
        assert!(s.multus_cached("m1"));
    }
}

#[tokio::test]
async fn gc_should_release_each_container_it_failed_to_sweep() {
    // The stale attachment's DEL does not happen or fails: it stays.
    for step in [Step::Netns, Step::DelNetwork, Step::RecordWrite] {
        let s = scripted();
        s.add("c1", "eth0").await.unwrap();
        let before = s.record("c1");
        s.engine.faults.arm(step);
        injected(s.engine.gc(&valid(&[]), &[]).await, step);
        let record = left(&s, "c1", &format!("GC, {step:?}")).await;
        assert_eq!(record, before, "{step:?}");
    }
    // A stale container multus attached: its caches stay.
    for step in [Step::MultusLoad, Step::Netns, Step::MultusResult] {
        let s = scripted();
        s.multus_attached("m1");
        s.engine.faults.arm(step);
        injected(s.engine.gc(&valid(&[]), &[]).await, step);
        let record = left(&s, "m1", &format!("GC of multus's, {step:?}")).await;
        assert_eq!(record, None, "{step:?}");
        assert!(s.multus_cached("m1"), "{step:?}");
    }
}

/// A container with the runtime's attachment (network "n" on eth0, and
/// "m" on net1) and network "h" hot-plugged on net5.
async fn with_hot_plugged(s: &Scripted) {
    let planned = vec![
        plan(net("n", &PLUGINS), "eth0", true),
        plan(net("m", &["fb"]), "net1", false),
    ];
    add(&s.engine, "c1", "eth0", planned).await.unwrap();
    s.engine
        .hot_plug(&call(Command::Add, "c1", "net5"), hot("net5"))
        .await
        .unwrap();
    assert!(left(s, "c1", "hot-plug").await.is_some());
}

fn hot(ifname: &str) -> Planned {
    plan(net("h", &["fa"]), ifname, false)
}

#[tokio::test]
async fn hot_plug_should_leave_no_lock_no_marker_and_the_record_as_it_was() {
    let s = scripted();
    let e = s
        .engine
        .hot_plug(&call(Command::Add, "c9", "net5"), hot("net5"))
        .await
        .unwrap_err();
    assert_eq!(e.code, code::UNKNOWN_CONTAINER, "{e}");
    assert_eq!(left(&s, "c9", "hot-plug into nothing").await, None);

    with_hot_plugged(&s).await;
    let before = s.record("c1");
    for ifname in ["eth0", "net5"] {
        let e = s
            .engine
            .hot_plug(&call(Command::Add, "c1", ifname), hot(ifname))
            .await
            .unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT, "{e}");
        assert_eq!(left(&s, "c1", "hot-plug on a taken name").await, before);
    }
    for step in [
        Step::Prepare,
        Step::RecordSync,
        Step::AddChain,
        Step::RecordWrite,
    ] {
        s.engine.faults.arm(step);
        let plugged = s
            .engine
            .hot_plug(&call(Command::Add, "c1", "net6"), hot("net6"))
            .await;
        injected(plugged, step);
        let record = left(&s, "c1", &format!("hot-plug, {step:?}")).await;
        assert_eq!(record, before, "{step:?}");
    }
}

#[tokio::test]
async fn unplug_and_its_check_should_leave_no_lock_no_marker_and_the_record_as_it_was() {
    let s = scripted();
    with_hot_plugged(&s).await;
    let before = s.record("c1");
    let given = || Ok(hot("net7"));
    // A hot-plugged network, and an additional one of the runtime's.
    for ifname in ["net5", "net1"] {
        for step in [Step::DelNetwork, Step::RecordWrite] {
            s.engine.faults.arm(step);
            let out = s
                .engine
                .unplug(&call(Command::Del, "c1", ifname), given())
                .await;
            injected(out, step);
            let what = format!("unplug {ifname}, {step:?}");
            assert_eq!(left(&s, "c1", &what).await, before, "{what}");
        }
    }
    // The runtime's own interface; a network nothing recorded whose
    // configuration cannot be read.
    let e = s
        .engine
        .unplug(&call(Command::Del, "c1", "eth0"), given())
        .await
        .unwrap_err();
    assert_eq!(e.code, code::INVALID_ENVIRONMENT, "{e}");
    assert_eq!(left(&s, "c1", "unplug eth0").await, before);
    let unreadable = Err(Error::new(
        ErrorKind::Invalid,
        code::INVALID_NETWORK_CONFIG,
        "no such network",
    ));
    let e = s
        .engine
        .unplug(&call(Command::Del, "c1", "net7"), unreadable)
        .await
        .unwrap_err();
    assert!(e.msg.contains("no such network"), "{e}");
    assert_eq!(left(&s, "c1", "unplug of nothing").await, before);

    s.engine.faults.arm(Step::CheckNetwork);
    let checked = s
        .engine
        .check_one(&call(Command::Check, "c1", "net5"))
        .await;
    injected(checked, Step::CheckNetwork);
    assert_eq!(left(&s, "c1", "CHECK of one").await, before);
    let e = s
        .engine
        .check_one(&call(Command::Check, "c1", "net7"))
        .await
        .unwrap_err();
    assert_eq!(e.code, code::UNKNOWN_CONTAINER, "{e}");
    assert_eq!(left(&s, "c1", "CHECK of none").await, before);
}

#[tokio::test]
async fn a_retried_del_should_leave_no_lock_no_marker_and_its_failure_noted() {
    /// A container whose DEL failed once: its cleanup is pending.
    async fn pending() -> Scripted {
        let s = scripted();
        s.add("c1", "eth0").await.unwrap();
        s.engine.faults.arm(Step::DelNetwork);
        injected(s.del("c1", "eth0").await, Step::DelNetwork);
        s
    }
    let failures = |r: &Option<Record>| {
        let c = r.as_ref().unwrap().attachment("eth0").unwrap();
        let c = c.cleanup.as_ref().unwrap();
        (c.failures, c.retries)
    };

    // No DEL call can be made of the record: it stays as it was.
    let s = pending().await;
    let before = s.record("c1");
    s.engine.faults.arm(Step::RetryCall);
    s.engine.retry_cleanups(true).await;
    assert_eq!(left(&s, "c1", "retry, RetryCall").await, before);

    // The DEL fails again: noted.
    s.engine.faults.arm(Step::DelNetwork);
    s.engine.retry_cleanups(true).await;
    let record = left(&s, "c1", "retry, DelNetwork").await;
    assert_eq!(failures(&record), (2, 1));

    // It succeeds, but the record cannot be written: it stays.
    s.engine.faults.arm(Step::LastWrite);
    s.engine.retry_cleanups(true).await;
    assert_eq!(left(&s, "c1", "retry, LastWrite").await, record);

    // The record went meanwhile: nothing to retry.
    let s = pending().await;
    std::fs::remove_file(s.state_dir().join("attachments/c1.json")).unwrap();
    s.engine.retry_cleanups(true).await;
    assert_eq!(left(&s, "c1", "retry of nothing").await, None);
}
