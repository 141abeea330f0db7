//! Per-container serialization, and GC against calls in flight.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_for_one_container_should_never_overlap() {
    let mut r = rig();
    let gate = Arc::new(Semaphore::new(0));
    r.runner
        .script("a", "ADD", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    r.runner
        .script("a", "DEL", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    let first = {
        let e = r.engine.clone();
        tokio::spawn(async move {
            add(&e, "c1", "eth0", vec![plan(net("n", &["a"]), "eth0", true)]).await
        })
    };
    let started = r.next_start().await;
    assert_eq!((started.command, started.ifname.as_str()), ("ADD", "eth0"));
    let second = {
        let e = r.engine.clone();
        tokio::spawn(async move {
            add(&e, "c1", "net1", vec![plan(net("n", &["a"]), "net1", true)]).await
        })
    };
    let third = {
        let e = r.engine.clone();
        tokio::spawn(async move { del(&e, "c1", "eth0").await })
    };
    r.no_start("a second call on the container ran while the first one's plugin did")
        .await;
    gate.add_permits(1);
    first.await.unwrap().unwrap();
    // The other two, one after the other, in whichever order they got the
    // lock.
    r.next_start().await;
    r.no_start("a call on the container ran while another one's plugin did")
        .await;
    gate.add_permits(1);
    r.next_start().await;
    gate.add_permits(1);
    second.await.unwrap().unwrap();
    third.await.unwrap().unwrap();
    assert_eq!(r.runner.max_in_flight("c1"), 1);
    assert_eq!(r.runner.calls().len(), 3);
    let record = r.store.get("c1").unwrap();
    let ifnames: Vec<&str> = record
        .attachments
        .iter()
        .map(|a| a.ifname.as_str())
        .collect();
    assert_eq!(ifnames, ["net1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_for_different_containers_should_run_at_once() {
    let mut r = rig();
    let gate = Arc::new(Semaphore::new(0));
    r.runner
        .script("a", "ADD", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    let tasks: Vec<_> = ["c1", "c2"]
        .into_iter()
        .map(|id| {
            let e = r.engine.clone();
            tokio::spawn(async move {
                add(&e, id, "eth0", vec![plan(net("n", &["a"]), "eth0", true)]).await
            })
        })
        .collect();
    let mut ids = vec![
        r.next_start().await.container,
        r.next_start().await.container,
    ];
    ids.sort();
    assert_eq!(ids, ["c1", "c2"]);
    // Both plugins are blocked on the gate, so both are in flight now.
    assert_eq!(r.runner.max_total(), 2);
    gate.add_permits(2);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert!(r.store.get("c1").is_some() && r.store.get("c2").is_some());
}

/// An ADD of container `c1` on network `n` (plugin `a`) whose plugin
/// waits for the returned gate, started and running.
async fn add_in_flight(
    r: &mut Rig,
) -> (
    Arc<Semaphore>,
    NetworkList,
    tokio::task::JoinHandle<Result<Value, Error>>,
) {
    let gate = Arc::new(Semaphore::new(0));
    r.runner
        .script("a", "ADD", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    let n = net("n", &["a"]);
    let adding = spawn_add(&r.engine, "c1", "eth0", n.clone());
    assert_eq!(r.next_start().await.command, "ADD");
    (gate, n, adding)
}

/// GC of network `n` with `c1`'s eth0 valid, in a task of its own.
fn spawn_gc(r: &Rig, n: &NetworkList) -> tokio::task::JoinHandle<Result<(), Error>> {
    let e = r.engine.clone();
    let lists = vec![n.clone()];
    tokio::spawn(async move { e.gc(&valid(&[("c1", "eth0")]), &lists).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_should_wait_for_an_add_in_flight_and_keep_it() {
    let mut r = rig();
    let (gate, n, adding) = add_in_flight(&mut r).await;
    // The runtime already counts the attachment being added as valid.
    let gc = spawn_gc(&r, &n);
    r.no_start("GC ran a plugin while an ADD was in flight")
        .await;
    assert!(
        r.store.get("c1").is_some(),
        "GC removed the record of an ADD in flight"
    );
    gate.add_permits(1);
    adding.await.unwrap().unwrap();
    let gc_call = r.next_start().await;
    gc.await.unwrap().unwrap();
    assert_eq!(gc_call.command, "GC");
    assert_eq!(
        gc_call.stdin["cni.dev/valid-attachments"],
        json!([{"containerID": "c1", "ifname": "eth0"}])
    );
    assert!(r.runner.runs("DEL").is_empty(), "{:?}", r.runner.calls());
    let record = r.store.get("c1").unwrap();
    assert_eq!(record.attachments[0].delegates[0].state, State::Added);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_should_delete_a_stale_attachment_only_after_its_add_finished() {
    let mut r = rig();
    let gate = Arc::new(Semaphore::new(0));
    r.runner
        .script("a", "ADD", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    let adding = {
        let e = r.engine.clone();
        tokio::spawn(async move {
            add(&e, "c1", "eth0", vec![plan(net("n", &["a"]), "eth0", true)]).await
        })
    };
    r.next_start().await;
    // A runtime that does not (yet) know the container: its attachment is
    // stale, but not while its ADD runs.
    let gc = {
        let e = r.engine.clone();
        tokio::spawn(async move { e.gc(&BTreeSet::new(), &[]).await })
    };
    r.no_start("GC deleted an attachment whose ADD was in flight")
        .await;
    gate.add_permits(1);
    adding.await.unwrap().unwrap();
    gc.await.unwrap().unwrap();
    assert_eq!(r.runner.runs("ADD"), ["a/c1/eth0"]);
    assert_eq!(r.runner.runs("DEL"), ["a/c1/eth0"]);
    assert_eq!(r.runner.max_in_flight("c1"), 1);
    assert!(r.store.get("c1").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_should_wait_while_gc_holds_its_container() {
    let mut r = rig();
    let n = net("n", &["a"]);
    add(&r.engine, "c1", "eth0", vec![plan(n.clone(), "eth0", true)])
        .await
        .unwrap();
    assert_eq!(r.next_start().await.command, "ADD");
    let gate = Arc::new(Semaphore::new(0));
    r.runner
        .script("a", "DEL", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    let gc = {
        let e = r.engine.clone();
        tokio::spawn(async move { e.gc(&BTreeSet::new(), &[]).await })
    };
    let swept = r.next_start().await;
    assert_eq!((swept.command, swept.container.as_str()), ("DEL", "c1"));
    let adding = {
        let e = r.engine.clone();
        tokio::spawn(async move { add(&e, "c1", "net1", vec![plan(n, "net1", true)]).await })
    };
    r.no_start("an ADD ran while GC's sweep held the container")
        .await;
    gate.add_permits(1);
    gc.await.unwrap().unwrap();
    adding.await.unwrap().unwrap();
    let order: Vec<String> = r
        .runner
        .calls()
        .iter()
        .map(|c| format!("{} {}", c.command, c.ifname))
        .collect();
    assert_eq!(order, ["ADD eth0", "DEL eth0", "ADD net1"]);
    assert_eq!(r.runner.max_in_flight("c1"), 1);
    let record = r.store.get("c1").unwrap();
    assert_eq!(record.attachments.len(), 1);
    assert_eq!(record.attachments[0].ifname, "net1");
}

/// GC's plugin phase never queues for the lock, so new operations run
/// while it waits; when no moment without operations comes within
/// `pluginTimeout`, it gives up with code 11 and runs no plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_should_give_way_to_operations_and_give_up_after_the_plugin_timeout() {
    let mut r = rig_with_plugin_timeout(Duration::from_millis(300));
    let (gate, n, adding) = add_in_flight(&mut r).await;
    let gc = spawn_gc(&r, &n);
    // Another container's DEL (nothing recorded: it runs no plugin) is
    // not held up by the waiting GC.
    timeout(EVENTUALLY, del(&r.engine, "c2", "eth0"))
        .await
        .expect("a DEL waited behind GC")
        .unwrap();
    let e = timeout(EVENTUALLY, gc)
        .await
        .expect("GC never gave up")
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, crate::api::code::TRY_AGAIN_LATER, "{e:?}");
    assert!(e.msg.contains("the plugins' GC did not run"), "{e:?}");
    assert!(r.runner.runs("GC").is_empty(), "{:?}", r.runner.calls());
    gate.add_permits(1);
    adding.await.unwrap().unwrap();
}
