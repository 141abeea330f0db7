//! DEL without a record, CHECK, and GC's choice of what to delete.

use super::*;

#[tokio::test]
async fn gc_should_delete_only_attachments_missing_from_the_valid_list() {
    let r = rig();
    let n = net("n", &["a", "b"]);
    for (id, ifname) in [("c1", "eth0"), ("c2", "eth0"), ("c2", "net1")] {
        add(&r.engine, id, ifname, vec![plan(n.clone(), ifname, true)])
            .await
            .unwrap();
    }
    r.engine
        .gc(&valid(&[("c1", "eth0"), ("c2", "net1")]), &[n])
        .await
        .unwrap();
    // The stale attachment's plugins, in reverse; nothing else.
    assert_eq!(r.runner.runs("DEL"), ["b/c2/eth0", "a/c2/eth0"]);
    assert!(r.store.get("c1").unwrap().attachment("eth0").is_some());
    let c2 = r.store.get("c2").unwrap();
    assert!(c2.attachment("eth0").is_none() && c2.attachment("net1").is_some());
    // The plugins' GC is told about what is left, for each plugin.
    let gcs = r.runner.calls_of("GC");
    assert_eq!(gcs.len(), 2);
    for c in gcs {
        assert_eq!(
            c.stdin["cni.dev/valid-attachments"],
            json!([
                {"containerID": "c1", "ifname": "eth0"},
                {"containerID": "c2", "ifname": "net1"}
            ]),
            "{c:?}"
        );
    }
}

#[tokio::test]
async fn del_of_an_unknown_container_should_run_nothing_and_record_nothing() {
    let r = rig();
    // Asked for only when the record was lost; this DEL would fail then.
    let fallback = || async {
        Err::<Vec<Planned>, _>(Error::new(
            ErrorKind::Internal,
            code::INTERNAL,
            "a DEL of nothing asked for the configured networks",
        ))
    };
    r.engine
        .del(&call(Command::Del, "c9", "eth0"), Map::new(), fallback)
        .await
        .unwrap();
    assert!(r.runner.calls().is_empty(), "{:?}", r.runner.calls());
    assert!(r.store.list().unwrap().is_empty());
}

#[tokio::test]
async fn del_after_a_damaged_record_should_run_the_configured_networks() {
    let r = rig();
    r.store.damage("c1");
    let fallback = || async { Ok::<_, Error>(vec![plan(net("n", &["a", "b"]), "eth0", true)]) };
    r.engine
        .del(&call(Command::Del, "c1", "eth0"), Map::new(), fallback)
        .await
        .unwrap();
    assert_eq!(r.runner.runs("DEL"), ["b/c1/eth0", "a/c1/eth0"]);
    // No record to give a prevResult from.
    assert!(r.runner.calls().iter().all(|c| prev_of(c).is_none()));
    assert!(r.store.was_set_aside("c1"));
    assert!(r.store.get("c1").is_none());
}

#[tokio::test]
async fn check_should_report_the_first_plugin_that_disagrees() {
    let r = rig();
    let e = r
        .engine
        .check(&call(Command::Check, "c1", "eth0"))
        .await
        .unwrap_err();
    assert_eq!(e.code, code::UNKNOWN_CONTAINER, "{e}");
    assert!(r.runner.calls().is_empty());

    add(
        &r.engine,
        "c1",
        "eth0",
        vec![plan(net("n", &["a", "b", "c"]), "eth0", true)],
    )
    .await
    .unwrap();
    r.engine
        .check(&call(Command::Check, "c1", "eth0"))
        .await
        .unwrap();
    r.runner
        .script("b", "CHECK", Act::Fail(100, "address mismatch"));
    let e = r
        .engine
        .check(&call(Command::Check, "c1", "eth0"))
        .await
        .unwrap_err();
    assert_eq!(e.code, 100, "{e}");
    assert!(e.msg.contains("address mismatch"), "{e}");
    // In order, stopping at the failure, each with the recorded result.
    let checks = r.runner.calls_of("CHECK");
    let names: Vec<&str> = checks.iter().map(|c| c.plugin.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "a", "b"]);
    assert!(checks.iter().all(|c| prev_of(c).as_deref() == Some("c")));
}

/// The CNI spec's `cni.dev/valid-attachments` is a list: when nothing is
/// valid (here the one recorded attachment is stale and swept first),
/// the plugins get an empty one, not `null`.
#[tokio::test]
async fn gc_with_no_valid_attachment_should_send_the_plugins_an_empty_list() {
    let s = super::scripted::scripted();
    s.add("c1", "eth0").await.unwrap();
    let n = net("n", &super::scripted::PLUGINS);
    s.engine.gc(&valid(&[]), &[n]).await.unwrap();
    assert_eq!(s.record("c1"), None);
    for plugin in super::scripted::PLUGINS {
        let gcs = s.gcs_of(plugin);
        assert_eq!(gcs.len(), 1, "{plugin}: {gcs:?}");
        assert_eq!(gcs[0]["cni.dev/valid-attachments"], json!([]), "{plugin}");
        assert_eq!(gcs[0]["cni.dev/attachments"], json!([]), "{plugin}");
    }
}
