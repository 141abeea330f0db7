//! plexusd's own DEL of a container the runtime forgot ([`Engine::reclaim`]):
//! it waits for an operation in progress on the container, and the check
//! made again under the locks keeps a container that changed meanwhile.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_should_wait_for_an_add_in_progress_and_keep_what_it_made() {
    let mut r = rig();
    let gate = Arc::new(Semaphore::new(0));
    r.runner
        .script("a", "ADD", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    let adding = spawn_add(&r.engine, "c1", "eth0", net("n", &["a"]));
    r.next_start().await;
    // The record as a round saw it: the ADD under way.
    let seen = r.store.get("c1").unwrap();
    let reclaim = {
        let e = r.engine.clone();
        tokio::spawn(async move {
            e.reclaim("c1", "forgotten", |now| async move { now == seen })
                .await
        })
    };
    r.no_start("a DEL ran while the container's ADD did").await;
    gate.add_permits(1);
    adding.await.unwrap().unwrap();
    let reclaimed = timeout(EVENTUALLY, reclaim)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reclaimed, Reclaimed::Kept);
    assert!(r.runner.calls_of("DEL").is_empty());
    let record = r.store.get("c1").unwrap();
    assert!(record.attachments[0].cleanup.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_should_delete_every_network_and_leave_what_fails_pending() {
    let r = rig();
    for id in ["ok", "bad"] {
        add(
            &r.engine,
            id,
            "eth0",
            vec![plan(net("n", &["a", "b"]), "eth0", true)],
        )
        .await
        .unwrap();
    }
    let yes = |_| async { true };
    assert_eq!(
        r.engine.reclaim("ok", "forgotten", yes).await.unwrap(),
        Reclaimed::Done
    );
    assert!(r.store.get("ok").is_none());
    assert_eq!(r.runner.runs("DEL"), ["b/ok/eth0", "a/ok/eth0"]);

    r.runner.script("a", "DEL", Act::Fail(7, "cannot"));
    let out = r.engine.reclaim("bad", "forgotten", yes).await.unwrap();
    assert!(
        matches!(&out, Reclaimed::Pending(e) if e.contains("cannot")),
        "{out:?}"
    );
    let left = r.store.get("bad").unwrap();
    let c = left.attachments[0].cleanup.as_ref().unwrap();
    assert!(c.handed_over && c.failures == 1, "{c:?}");
    assert_eq!(left.attachments[0].delegates.len(), 1);
    // Nothing recorded: nothing to do.
    assert_eq!(
        r.engine.reclaim("none", "forgotten", yes).await.unwrap(),
        Reclaimed::Gone
    );
}
