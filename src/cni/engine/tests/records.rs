//! When the record reaches the disk, and a failed last write.

use super::*;

#[tokio::test]
async fn no_plugin_should_read_its_config_before_the_record_is_synced() {
    let mut r = rig();
    let (release, rx) = std::sync::mpsc::channel::<()>();
    *r.store.slow_sync.lock().unwrap() = Some(rx);
    let adding = {
        let engine = r.engine.clone();
        tokio::spawn(async move {
            add(
                &engine,
                "c1",
                "eth0",
                vec![plan(net("n", &["a", "b"]), "eth0", true)],
            )
            .await
        })
    };
    r.no_start("a plugin ran before the record was synced")
        .await;
    assert!(!adding.is_finished());
    release.send(()).unwrap();
    assert_eq!(r.next_start().await.plugin, "a");
    assert_eq!(r.next_start().await.plugin, "b");
    adding.await.unwrap().unwrap();
    assert_eq!(*r.store.synced.lock().unwrap(), 1);
    assert_eq!(
        r.store.get("c1").unwrap().attachments[0].delegates[0].state,
        State::Added
    );

    // A sync that fails stops the ADD before any plugin ran, and leaves
    // no record.
    let (release, rx) = std::sync::mpsc::channel::<()>();
    *r.store.slow_sync.lock().unwrap() = Some(rx);
    drop(release);
    let before = r.runner.calls().len();
    let e = add(
        &r.engine,
        "c2",
        "eth0",
        vec![plan(net("n", &["a"]), "eth0", true)],
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("the disk went away"), "{e}");
    let ran: Vec<_> = r.runner.calls()[before..]
        .iter()
        .map(|c| (c.plugin.clone(), c.command))
        .collect();
    // Nothing: the network's first plugin was held before it read its
    // configuration, so the rollback has nothing of it to undo.
    assert!(ran.is_empty(), "{ran:?}");
    assert!(r.store.get("c2").is_none());
}

/// An operation's last record write and the release of its locks share
/// one trip to the blocking pool. When that write fails, an ADD still
/// rolls back under the container's lock (nothing of it may run while
/// another call holds the container) and a DEL reports it; either way the
/// lock is released afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_last_write_should_be_handled_before_the_lock_is_released() {
    let mut r = rig();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    // The rollback's DEL waits: meanwhile, another call for the container
    // must not start.
    r.runner
        .script("a", "DEL", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    *r.store.fail_atomic.lock().unwrap() = true;
    let adding = spawn_add(&r.engine, "c1", "eth0", net("n", &["a"]));
    assert_eq!(r.next_start().await.command, "ADD");
    let rollback = r.next_start().await;
    assert_eq!((rollback.plugin.as_str(), rollback.command), ("a", "DEL"));
    let other = spawn_add(&r.engine, "c1", "eth1", net("m", &["b"]));
    r.no_start("a call ran while the rollback held the container")
        .await;
    gate.add_permits(1);
    let e = adding.await.unwrap().unwrap_err();
    assert!(e.to_string().contains("the disk is full"), "{e}");
    // Nothing of eth0 is recorded; the waiting ADD (eth1) may have
    // recorded its own attachment already, once the lock was released.
    assert!(
        r.store
            .get("c1")
            .is_none_or(|rec| rec.attachment("eth0").is_none()),
        "rolled back: nothing recorded"
    );
    // The lock was released: the waiting ADD runs.
    assert_eq!(r.next_start().await.plugin, "b");
    timeout(EVENTUALLY, other)
        .await
        .expect("the lock was released")
        .unwrap()
        .unwrap();

    // A DEL whose last write fails says so, and lets the lock go.
    r.runner.script("a", "DEL", Act::Succeed);
    add(
        &r.engine,
        "c2",
        "eth0",
        vec![plan(net("n", &["a"]), "eth0", true)],
    )
    .await
    .unwrap();
    *r.store.fail_atomic.lock().unwrap() = true;
    let e = del(&r.engine, "c2", "eth0").await.unwrap_err();
    assert!(e.to_string().contains("the disk is full"), "{e}");
    assert!(r.store.get("c2").is_some(), "the record was not removed");
    timeout(EVENTUALLY, del(&r.engine, "c2", "eth0"))
        .await
        .expect("the lock was released")
        .unwrap();
    assert!(r.store.get("c2").is_none());
}
