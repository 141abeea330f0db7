//! ADD's rollback, and what each network's own capability arguments and
//! device-info file do at ADD and DEL.

use super::*;

#[tokio::test]
async fn a_failed_add_should_be_rolled_back_in_reverse_and_leave_no_record() {
    let r = rig();
    r.runner
        .script("d", "ADD", Act::Fail(7, "no addresses left"));
    let planned = vec![
        plan(net("n1", &["a", "b"]), "eth0", true),
        plan(net("n2", &["c", "d"]), "net1", false),
    ];
    let e = add(&r.engine, "c1", "eth0", planned).await.unwrap_err();
    assert_eq!(e.code, 7, "{e}");
    assert!(
        e.msg.contains("no addresses left") && e.msg.contains("n2"),
        "{e}"
    );
    assert_eq!(
        r.runner.runs("ADD"),
        ["a/c1/eth0", "b/c1/eth0", "c/c1/net1", "d/c1/net1"]
    );
    // Every plugin of what was started, last network first, each chain in
    // reverse; each with the result its chain had reached.
    assert_eq!(
        r.runner.runs("DEL"),
        ["d/c1/net1", "c/c1/net1", "b/c1/eth0", "a/c1/eth0"]
    );
    let dels = r.runner.calls_of("DEL");
    let prevs: Vec<Option<String>> = dels.iter().map(prev_of).collect();
    assert_eq!(
        prevs,
        [
            Some("c".into()),
            Some("c".into()),
            Some("b".into()),
            Some("b".into())
        ]
    );
    assert!(r.store.get("c1").is_none(), "{:?}", r.store.get("c1"));
    assert!(r.store.list().unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_rollback_should_be_reported_and_leave_the_rest_for_del() {
    let r = rig();
    r.runner
        .script("b", "ADD", Act::Fail(7, "no addresses left"));
    r.runner.script("a", "DEL", Act::Fail(11, "a is stuck"));
    let planned = vec![
        plan(net("n1", &["a"]), "eth0", true),
        plan(net("n2", &["b"]), "net1", false),
    ];
    let e = add(&r.engine, "c1", "eth0", planned).await.unwrap_err();
    // The ADD's own failure is what is reported; the rollback's is added.
    assert_eq!(e.code, 7, "{e}");
    assert!(e.msg.contains("no addresses left"), "{e}");
    assert!(e.details.contains("a is stuck"), "{e}");
    assert_eq!(r.runner.runs("DEL"), ["b/c1/net1", "a/c1/eth0"]);
    // What the rollback could not undo stays recorded for the runtime's
    // DEL; what it undid does not.
    let record = r
        .store
        .get("c1")
        .expect("the record of a failed rollback went");
    let att = record.attachment("eth0").unwrap();
    let states: Vec<(&str, State)> = att
        .delegates
        .iter()
        .map(|d| (d.name.as_str(), d.state))
        .collect();
    assert_eq!(states, [("n1", State::Added), ("n2", State::Pending)]);

    // The runtime's DEL then undoes only what is left, and the record goes.
    r.runner.script("a", "DEL", Act::Succeed);
    del(&r.engine, "c1", "eth0").await.unwrap();
    assert_eq!(
        r.runner.runs("DEL"),
        ["b/c1/net1", "a/c1/eth0", "a/c1/eth0"]
    );
    assert!(r.store.get("c1").is_none());
}

/// A 1.1.0 network of one plugin declaring `capabilities`.
fn net_with_caps(name: &str, plugin: &str, capabilities: &[&str]) -> NetworkList {
    let caps: Map<String, Value> = capabilities
        .iter()
        .map(|c| (c.to_string(), json!(true)))
        .collect();
    NetworkList::from_value(
        Path::new("test"),
        json!({"cniVersion": "1.1.0", "name": name,
               "plugins": [{"type": plugin, "capabilities": caps}]}),
        false,
    )
    .unwrap()
}

#[tokio::test]
async fn a_networks_own_capability_arguments_should_reach_its_plugins_at_add_and_del() {
    let r = rig();
    let mut extra = plan(net_with_caps("n2", "b", &["ips"]), "net1", false);
    extra.capability_args = Some(
        json!({"ips": ["10.9.9.9/24"], "mac": "02:00:00:00:00:01"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let planned = vec![
        plan(
            net_with_caps("n1", "a", &["ips", "portMappings"]),
            "eth0",
            true,
        ),
        extra,
    ];
    let call_args = json!({"ips": ["10.1.1.1/24"], "portMappings": [{"hostPort": 80}]});
    let added = r
        .engine
        .add_networks(
            &call(Command::Add, "c1", "eth0"),
            call_args.as_object().unwrap().clone(),
            planned,
        )
        .await
        .unwrap();
    let names: Vec<(&str, &str, bool)> = added
        .iter()
        .map(|a| (a.name.as_str(), a.ifname.as_str(), a.primary))
        .collect();
    assert_eq!(names, [("n1", "eth0", true), ("n2", "net1", false)]);
    assert_eq!(added[1].result["interfaces"][0]["name"], "b");

    del(&r.engine, "c1", "eth0").await.unwrap();
    let runtime_config = |plugin: &str, command: &str| {
        r.runner
            .calls()
            .into_iter()
            .find(|c| c.plugin == plugin && c.command == command)
            .map(|c| c.stdin["runtimeConfig"].clone())
            .unwrap()
    };
    for command in ["ADD", "DEL"] {
        // The call's arguments, as the network declared them.
        assert_eq!(
            runtime_config("a", command),
            json!({"ips": ["10.1.1.1/24"], "portMappings": [{"hostPort": 80}]}),
            "{command}"
        );
        // Its own, in place of the call's; `mac` was not declared.
        assert_eq!(
            runtime_config("b", command),
            json!({"ips": ["10.9.9.9/24"]}),
            "{command}"
        );
    }
}

#[tokio::test]
async fn a_networks_device_info_file_should_go_after_its_del_and_nothing_outside_the_directory() {
    let r = rig();
    let info_dir = r._dir.path().join("devinfo").join("cni");
    std::fs::create_dir_all(&info_dir).unwrap();
    let ours = info_dir.join("ns-red-c1_net1");
    let failing = info_dir.join("ns-blue-c1_net2");
    let outside = r._dir.path().join("runtime-device-info");
    for f in [&ours, &failing, &outside] {
        std::fs::write(f, "{}").unwrap();
    }
    let with_file = |list: NetworkList, ifname: &str, file: &Path| {
        let mut p = plan(list, ifname, false);
        p.capability_args = Some(
            json!({"deviceID": "0000:03:00.1", "CNIDeviceInfoFile": file})
                .as_object()
                .unwrap()
                .clone(),
        );
        p
    };
    let planned = vec![
        with_file(net("primary", &["a"]), "eth0", &outside),
        with_file(net("red", &["b"]), "net1", &ours),
        with_file(net("blue", &["c"]), "net2", &failing),
    ];
    r.engine
        .add_networks(&call(Command::Add, "c1", "eth0"), Map::new(), planned)
        .await
        .unwrap();
    r.runner
        .script("c", "DEL", Act::Fail(11, "the device is busy"));
    assert!(del(&r.engine, "c1", "eth0").await.is_err());
    // The file of the network whose DEL succeeded is gone; the failed
    // one's stays for the retry; a path outside the directory (here the
    // runtime's own) is never touched.
    assert!(!ours.exists());
    assert!(failing.exists());
    assert!(outside.exists());
    r.runner.script("c", "DEL", Act::Succeed);
    del(&r.engine, "c1", "eth0").await.unwrap();
    assert!(!failing.exists());
    assert!(outside.exists());
}
