//! Containers multus attached: DEL, CHECK and GC from its caches.

use super::*;

/// Writes multus's caches for container `id` attached to `list` (one
/// delegate, on eth0, in `netns`) as multus and libcni do, into the rig's
/// cniDir.
fn multus_attached(r: &Rig, id: &str, list: &NetworkList, netns: &str) {
    use base64::Engine as _;
    let dir = r._dir.path().join("multus");
    std::fs::create_dir_all(dir.join("results")).unwrap();
    let bytes = serde_json::to_vec(&list.to_value()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let delegates = json!([{"Conf": {"ipam": {}}, "ConfList": {"plugins": [{"type": "a"}]},
                            "Name": list.name, "IsFilterV4Gateway": false,
                            "IsFilterV6Gateway": false, "Bytes": b64}]);
    std::fs::write(dir.join(id), serde_json::to_vec(&delegates).unwrap()).unwrap();
    let cached = json!({"kind": "cniCacheV1", "containerId": id, "config": b64, "ifName": "eth0",
                        "networkName": list.name, "netns": netns,
                        "cniArgs": [["IgnoreUnknown", "true"]],
                        "result": {"cniVersion": "1.1.0", "interfaces": [{"name": format!("{id}-if")}]}});
    std::fs::write(
        dir.join("results").join(format!("{}-{id}-eth0", list.name)),
        serde_json::to_vec(&cached).unwrap(),
    )
    .unwrap();
}

#[tokio::test]
async fn gc_should_keep_what_multus_attached_for_valid_containers_and_del_the_rest() {
    let r = rig();
    let n = net("n", &["a"]);
    multus_attached(&r, "m1", &n, "");
    multus_attached(&r, "m2", &n, "");
    add(&r.engine, "c1", "eth0", vec![plan(n.clone(), "eth0", true)])
        .await
        .unwrap();
    r.engine
        .gc(&valid(&[("c1", "eth0"), ("m1", "eth0")]), &[n])
        .await
        .unwrap();
    // m2's network, with its cached result as prevResult; nothing else.
    let dels = r.runner.calls_of("DEL");
    assert_eq!(r.runner.runs("DEL"), ["a/m2/eth0"]);
    assert_eq!(prev_of(&dels[0]).as_deref(), Some("m2-if"));
    let dir = r._dir.path().join("multus");
    assert!(dir.join("m1").is_file() && dir.join("results/n-m1-eth0").is_file());
    assert!(!dir.join("m2").exists() && !dir.join("results/n-m2-eth0").exists());
    // The plugins' GC keeps what multus attached for m1.
    let gcs = r.runner.calls_of("GC");
    assert_eq!(gcs.len(), 1);
    assert_eq!(
        gcs[0].stdin["cni.dev/valid-attachments"],
        json!([
            {"containerID": "c1", "ifname": "eth0"},
            {"containerID": "m1", "ifname": "eth0"}
        ])
    );
}

#[tokio::test]
async fn gc_should_not_run_a_stale_multus_container_in_the_hosts_namespace() {
    let r = rig();
    let n = net("n", &["a"]);
    // The namespace libcni cached is the daemon's own.
    multus_attached(&r, "m1", &n, "/proc/self/ns/net");
    let e = r.engine.gc(&valid(&[]), &[n]).await.unwrap_err();
    assert!(e.msg.contains("/proc/self/ns/net"), "{e}");
    assert!(r.runner.runs("DEL").is_empty());
    let dir = r._dir.path().join("multus");
    assert!(dir.join("m1").is_file() && dir.join("results/n-m1-eth0").is_file());
}

#[tokio::test]
async fn del_and_check_of_a_multus_container_should_wait_for_its_lock() {
    let mut r = rig();
    let n = net("n", &["a"]);
    multus_attached(&r, "m1", &n, "");
    // Another plexusd on the same stateDir works on m1.
    let locks = Locks::open(r._dir.path()).unwrap();
    let held = locks.lock("m1").unwrap();
    let del = {
        let e = r.engine.clone();
        tokio::spawn(async move { del(&e, "m1", "eth0").await })
    };
    let check = {
        let e = r.engine.clone();
        tokio::spawn(async move { e.check(&call(Command::Check, "m1", "eth0")).await })
    };
    r.no_start("a plugin of a multus container ran while another daemon held its lock")
        .await;
    drop(held);
    r.next_start().await;
    del.await.unwrap().unwrap();
    // CHECK ran before or after the DEL: it passed, or found nothing left.
    let _ = check.await.unwrap();
    assert_eq!(r.runner.max_in_flight("m1"), 1);
    assert!(!r._dir.path().join("multus/m1").exists());
}

#[tokio::test]
async fn a_multus_container_should_be_deled_in_reverse_and_checked_in_order() {
    use base64::Engine as _;
    let r = rig();
    let dir = r._dir.path().join("multus");
    std::fs::create_dir_all(dir.join("results")).unwrap();
    let b64 = |v: Value| base64::engine::general_purpose::STANDARD.encode(v.to_string());
    let first =
        json!({"cniVersion": "1.1.0", "name": "n0", "plugins": [{"type": "a"}, {"type": "b"}]});
    let second = json!({"cniVersion": "1.1.0", "name": "n1", "type": "c"});
    let third = json!({"cniVersion": "1.1.0", "name": "n2", "type": "d"});
    let delegates = json!([
        {"ConfList": {"plugins": [{"type": "a"}, {"type": "b"}]}, "Name": "n0", "Bytes": b64(first)},
        {"ConfList": {}, "Name": "default/n1", "Bytes": b64(second)},
        {"ConfList": {}, "Name": "default/n2", "ifnameRequest": "fast0", "Bytes": b64(third)}
    ]);
    std::fs::write(dir.join("m1"), delegates.to_string()).unwrap();
    for (net, ifname) in [("n0", "eth0"), ("n1", "net1"), ("n2", "fast0")] {
        let cached = json!({"kind": "cniCacheV1", "containerId": "m1", "ifName": ifname,
                            "networkName": net,
                            "result": {"cniVersion": "1.1.0", "interfaces": [{"name": net}]}});
        std::fs::write(
            dir.join("results").join(format!("{net}-m1-{ifname}")),
            cached.to_string(),
        )
        .unwrap();
    }
    r.engine
        .check(&call(Command::Check, "m1", "eth0"))
        .await
        .unwrap();
    assert_eq!(
        r.runner.runs("CHECK"),
        ["a/m1/eth0", "b/m1/eth0", "c/m1/net1", "d/m1/fast0"]
    );
    del(&r.engine, "m1", "eth0").await.unwrap();
    let dels = r.runner.calls_of("DEL");
    let seen: Vec<(String, Option<String>)> = dels
        .iter()
        .map(|c| (format!("{}/{}", c.plugin, c.ifname), prev_of(c)))
        .collect();
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        seen,
        [
            ("d/fast0".to_string(), some("n2")),
            ("c/net1".to_string(), some("n1")),
            ("b/eth0".to_string(), some("n0")),
            ("a/eth0".to_string(), some("n0")),
        ]
    );
    assert!(list_dir_names(&dir.join("results")).is_empty());
    assert!(!dir.join("m1").exists());
}

/// multus's DEL removes the device-info file it names for a delegate with
/// a device ID; the primary never gets the element's device ID.
#[tokio::test]
async fn del_of_a_multus_container_should_remove_its_device_info_files_only() {
    use base64::Engine as _;
    let r = rig();
    let dir = r._dir.path().join("multus");
    let info = r._dir.path().join("devinfo/cni");
    std::fs::create_dir_all(dir.join("results")).unwrap();
    std::fs::create_dir_all(&info).unwrap();
    let b64 = |v: Value| base64::engine::general_purpose::STANDARD.encode(v.to_string());
    let n0 = json!({"cniVersion": "1.1.0", "name": "n0", "plugins": [{"type": "a"}]});
    let sriov = json!({"cniVersion": "1.1.0", "name": "sriov", "type": "c"});
    let delegates = json!([
        {"ConfList": {"plugins": [{"type": "a"}]}, "Name": "n0", "deviceID": "0000:01:00.0", "Bytes": b64(n0)},
        {"ConfList": {}, "Name": "default/sriov", "deviceID": "0000:18:02.5", "Bytes": b64(sriov.clone())},
        {"ConfList": {}, "Name": "default/sriov", "ifnameRequest": "fast0", "Bytes": b64(sriov)}
    ]);
    std::fs::write(dir.join("m1"), delegates.to_string()).unwrap();
    // fast0's file is the one libcni cached with its ADD's arguments.
    let cached = json!({"kind": "cniCacheV1", "containerId": "m1", "ifName": "fast0",
                        "networkName": "sriov",
                        "capabilityArgs": {"CNIDeviceInfoFile": info.join("given-m1_fast0")},
                        "result": {"cniVersion": "1.1.0"}});
    std::fs::write(dir.join("results/sriov-m1-fast0"), cached.to_string()).unwrap();
    let files = [
        "default-sriov-m1_net1",
        "given-m1_fast0",
        "n0-m1_eth0",
        "default-sriov-m2_net1",
        "default-sriov-m1-x_net1",
    ];
    for f in files {
        std::fs::write(info.join(f), b"{}").unwrap();
    }
    del(&r.engine, "m1", "eth0").await.unwrap();
    assert_eq!(
        r.runner.runs("DEL"),
        ["c/m1/fast0", "c/m1/net1", "a/m1/eth0"]
    );
    let mut left = list_dir_names(&info);
    left.sort();
    assert_eq!(
        left,
        [
            "default-sriov-m1-x_net1",
            "default-sriov-m2_net1",
            "n0-m1_eth0"
        ]
    );
}

/// A network whose DEL failed keeps its device-info file for the next
/// DEL, with the caches.
#[tokio::test]
async fn a_failed_del_of_a_multus_network_should_keep_its_device_info_file() {
    use base64::Engine as _;
    let r = rig();
    let dir = r._dir.path().join("multus");
    let info = r._dir.path().join("devinfo/cni");
    std::fs::create_dir_all(&info).unwrap();
    let b64 = |v: Value| base64::engine::general_purpose::STANDARD.encode(v.to_string());
    let n0 = json!({"cniVersion": "1.1.0", "name": "n0", "plugins": [{"type": "a"}]});
    let sriov = json!({"cniVersion": "1.1.0", "name": "sriov", "type": "c"});
    let delegates = json!([
        {"ConfList": {"plugins": [{"type": "a"}]}, "Name": "n0", "Bytes": b64(n0)},
        {"ConfList": {}, "Name": "default/sriov", "deviceID": "0000:18:02.5", "Bytes": b64(sriov)}
    ]);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("m1"), delegates.to_string()).unwrap();
    std::fs::write(info.join("default-sriov-m1_net1"), b"{}").unwrap();
    r.runner.script("c", "DEL", Act::Fail(11, "busy"));
    del(&r.engine, "m1", "eth0").await.unwrap_err();
    assert!(info.join("default-sriov-m1_net1").is_file());
    r.runner.script("c", "DEL", Act::Succeed);
    del(&r.engine, "m1", "eth0").await.unwrap();
    assert!(list_dir_names(&info).is_empty());
}

/// A DEL that falls back (its delegate cache was damaged) removes, once
/// it succeeded, libcni's result caches of that container only, and moves
/// a damaged one aside.
#[tokio::test]
async fn a_fallback_del_should_remove_the_containers_result_caches_once_it_succeeded() {
    let r = rig();
    let dir = r._dir.path().join("multus");
    let results = dir.join("results");
    std::fs::create_dir_all(&results).unwrap();
    std::fs::write(dir.join("m1"), b"[{\"Name\":").unwrap();
    let entry = |cid: &str, net: &str, ifname: &str| {
        json!({"kind": "cniCacheV1", "containerId": cid, "ifName": ifname,
               "networkName": net, "result": {"cniVersion": "1.1.0"}})
        .to_string()
    };
    std::fs::write(results.join("n-m1-eth0"), entry("m1", "n", "eth0")).unwrap();
    std::fs::write(
        results.join("my-lan-m1-net1"),
        entry("m1", "my-lan", "net1"),
    )
    .unwrap();
    std::fs::write(results.join("n-m1-x-eth0"), entry("m1-x", "n", "eth0")).unwrap();
    std::fs::write(results.join("n-m10-eth0"), entry("m10", "n", "eth0")).unwrap();
    std::fs::write(results.join("n-m1-net2"), b"{").unwrap();
    let n = net("n", &["a"]);
    // The configured network's DEL fails first: everything stays.
    r.runner.script("a", "DEL", Act::Fail(11, "busy"));
    let fallback = || async { Ok::<_, Error>(vec![plan(net("n", &["a"]), "eth0", true)]) };
    r.engine
        .del(&call(Command::Del, "m1", "eth0"), Map::new(), fallback)
        .await
        .unwrap_err();
    let all = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(list_dir_names(&results).len(), 5);
    r.runner.script("a", "DEL", Act::Succeed);
    let fallback = || async { Ok::<_, Error>(vec![plan(n, "eth0", true)]) };
    r.engine
        .del(&call(Command::Del, "m1", "eth0"), Map::new(), fallback)
        .await
        .unwrap();
    assert_eq!(r.runner.runs("DEL"), ["a/m1/eth0", "a/m1/eth0"]);
    assert_eq!(all(list_dir_names(&results)), ["n-m1-x-eth0", "n-m10-eth0"]);
    let aside = all(list_dir_names(
        &r._dir.path().join("attachments/damaged/m1"),
    ));
    assert_eq!(aside.len(), 2, "{aside:?}");
    assert!(aside[0].ends_with(".multus-m1"), "{aside:?}");
    assert!(aside[1].ends_with(".multus-results-n-m1-net2"), "{aside:?}");
}
