//! The plugins' GC never frees what a container the runtime still has
//! holds, even when its record cannot be read: the valid list names the
//! interfaces a DEL without a record would use.

use super::*;

/// The configured networks a DEL without a record runs for `ifname`:
/// "n" (plugin a) on it, "m" (plugin b) on net1.
async fn configured(ifname: String) -> Result<Vec<Planned>, Error> {
    Ok(vec![
        plan(net("n", &["a"]), &ifname, true),
        plan(net("m", &["b"]), "net1", false),
    ])
}

/// The valid list plugin `plugin`'s GC got; fails unless it got one.
fn listed(r: &Rig, plugin: &str) -> Value {
    let gcs: Vec<Call> = r
        .runner
        .calls_of("GC")
        .into_iter()
        .filter(|c| c.plugin == plugin)
        .collect();
    assert_eq!(gcs.len(), 1, "{plugin}: {gcs:?}");
    gcs[0].stdin["cni.dev/valid-attachments"].clone()
}

#[tokio::test]
async fn gc_should_list_a_live_container_with_a_damaged_record_by_its_fallback_ifnames() {
    let r = rig();
    let (n, m) = (net("n", &["a"]), net("m", &["b"]));
    add(&r.engine, "c2", "eth0", vec![plan(n.clone(), "eth0", true)])
        .await
        .unwrap();
    r.store.damage("c1");
    r.engine
        .gc_with(
            &valid(&[("c1", "eth0"), ("c2", "eth0")]),
            &[n, m],
            configured,
        )
        .await
        .unwrap();
    // Nothing was stale; the damaged record was moved aside.
    assert!(
        r.runner.runs("DEL").is_empty(),
        "{:?}",
        r.runner.runs("DEL")
    );
    assert!(r.store.was_set_aside("c1"));
    // Each network's plugins keep c1's interface of that network; c2's
    // recorded eth0 is listed once.
    assert_eq!(
        listed(&r, "a"),
        json!([
            {"containerID": "c2", "ifname": "eth0"},
            {"containerID": "c1", "ifname": "eth0"}
        ])
    );
    assert_eq!(
        listed(&r, "b"),
        json!([
            {"containerID": "c1", "ifname": "net1"},
            {"containerID": "c2", "ifname": "net1"}
        ])
    );
}

#[tokio::test]
async fn gc_should_not_list_a_stale_container_with_a_damaged_record() {
    let r = rig();
    let n = net("n", &["a"]);
    add(&r.engine, "c2", "eth0", vec![plan(n.clone(), "eth0", true)])
        .await
        .unwrap();
    // The runtime no longer has c1: what its plugins hold may go.
    r.store.damage("c1");
    r.engine
        .gc_with(&valid(&[("c2", "eth0")]), &[n], configured)
        .await
        .unwrap();
    assert!(
        r.runner.runs("DEL").is_empty(),
        "{:?}",
        r.runner.runs("DEL")
    );
    assert!(r.store.was_set_aside("c1"));
    assert_eq!(
        listed(&r, "a"),
        json!([{"containerID": "c2", "ifname": "eth0"}])
    );
}

#[tokio::test]
async fn gc_should_send_no_plugin_gc_when_the_fallback_cannot_be_planned() {
    let r = rig();
    let n = net("n", &["a"]);
    r.store.damage("c1");
    let unplannable = |_: String| async {
        Err::<Vec<Planned>, _>(Error::new(
            ErrorKind::Invalid,
            code::INVALID_NETWORK_CONFIG,
            "network \"n\" cannot be loaded",
        ))
    };
    let e = r
        .engine
        .gc_with(&valid(&[("c1", "eth0")]), &[n], unplannable)
        .await
        .unwrap_err();
    assert!(e.msg.contains("cannot be loaded"), "{e}");
    // Without c1's interfaces, its addresses would be freed: no GC at all.
    assert!(r.runner.calls_of("GC").is_empty());
}
