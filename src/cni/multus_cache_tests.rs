//! [`super`]'s file handling against caches written as multus and libcni
//! write them, and every kind of damage.

use std::os::unix::fs::symlink;

use serde_json::json;

use super::*;

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(v).unwrap())
}

fn delegates(dir: &Path, id: &str, body: &Value) {
    fs::write(dir.join(id), serde_json::to_vec(body).unwrap()).unwrap();
}

#[test]
fn delegates_should_be_read_in_multus_order_with_multus_ifnames() {
    let dir = tempfile::tempdir().unwrap();
    let caches = Caches::new(dir.path());
    let list = json!({"cniVersion":"0.3.1","name":"cbr0","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]});
    let single = json!({"cniVersion":"1.0.0","name":"macv","type":"macvlan"});
    delegates(
        dir.path(),
        "c1",
        &json!([
            {"Conf":{"ipam":{}},"ConfList":{"cniVersion":"0.3.1","name":"cbr0","plugins":[{"ipam":{},"type":"bridge"}]},
             "Name":"cbr0","IsFilterV4Gateway":false,"IsFilterV6Gateway":false,"Bytes":b64(&list)},
            {"Conf":{"cniVersion":"1.0.0","name":"macv","type":"macvlan"},"ConfList":{},
             "Name":"default/macv","ifnameRequest":"","macRequest":"02:00:00:00:00:01","ipRequest":["10.1.1.5/24"],
             "IsFilterV4Gateway":false,"IsFilterV6Gateway":false,"Bytes":b64(&single)},
            {"Conf":{"cniVersion":"1.0.0","name":"macv","type":"macvlan"},"ConfList":{},
             "Name":"default/macv","ifnameRequest":"fast0",
             "IsFilterV4Gateway":false,"IsFilterV6Gateway":false,"Bytes":b64(&single)}
        ]),
    );
    let d = caches.load("c1").unwrap().unwrap();
    assert_eq!(d.len(), 3);
    assert_eq!(d[0].network, "cbr0");
    assert_eq!(d[0].list(None).unwrap().plugins.len(), 2);
    assert_eq!(d[1].name, "default/macv");
    assert_eq!(d[1].list(None).unwrap().plugin_type(0), "macvlan");
    let names: Vec<String> = d
        .iter()
        .enumerate()
        .map(|(i, x)| x.ifname(i, "eth0"))
        .collect();
    assert_eq!(names, ["eth0", "net1", "fast0"]);
    let caps = d[1].capability_args(json!({"mac":"x","bandwidth":{}}).as_object().unwrap());
    assert_eq!(
        Value::Object(caps),
        json!({"mac":"02:00:00:00:00:01","ips":["10.1.1.5/24"],"bandwidth":{}})
    );
    assert!(caches.load("none").unwrap().is_none());
    assert_eq!(caches.containers().unwrap(), ["c1"]);
}

/// The reference's example, as multus writes it: a conflist primary
/// and a NAD with an interface, MAC, IP and default-route request.
#[test]
fn the_reference_delegate_cache_should_be_read_as_multus_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("c1"),
        include_str!("../../tests/fixtures/multus-cache/delegates.json"),
    )
    .unwrap();
    let d = Caches::new(dir.path()).load("c1").unwrap().unwrap();
    assert_eq!(d.len(), 2);
    let primary = d[0].list(None).unwrap();
    assert_eq!((primary.name.as_str(), primary.plugins.len()), ("cbr0", 2));
    assert_eq!(primary.plugin_type(1), "portmap");
    // Plugin-specific keys that Conf/ConfList drop are in Bytes.
    assert_eq!(primary.plugins[1]["snat"], true);
    let nad = d[1].list(None).unwrap();
    assert_eq!((nad.name.as_str(), nad.plugins.len()), ("sriov-net", 1));
    assert_eq!(nad.plugins[0]["deviceID"], "0000:18:02.5");
    assert_eq!(d[1].name, "default/sriov-net");
    assert_eq!(
        (d[0].ifname(0, "eth0"), d[1].ifname(1, "eth0")),
        ("eth0".to_string(), "fast0".to_string())
    );
    assert_eq!(
        Value::Object(d[1].capability_args(&Map::new())),
        json!({"mac":"02:00:00:00:00:01","ips":["192.168.1.50/24"],"deviceID":"0000:18:02.5"})
    );
}

#[test]
fn unusable_delegate_caches_should_be_damaged_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let caches = Caches::new(dir.path());
    let entry = |config: &Value| json!([{"Name":"n","ConfList":{},"Bytes":b64(config)}]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("garbage", b"[{\"Bytes\":".to_vec()),
        ("nobytes", br#"[{"Name":"n"}]"#.to_vec()),
        ("notb64", br#"[{"Name":"n","Bytes":"%%%"}]"#.to_vec()),
        (
            "pathtype",
            serde_json::to_vec(&entry(
                &json!({"cniVersion":"1.0.0","name":"n","type":"../../bin/sh"}),
            ))
            .unwrap(),
        ),
        (
            "badname",
            serde_json::to_vec(&entry(
                &json!({"cniVersion":"1.0.0","name":"../x","type":"bridge"}),
            ))
            .unwrap(),
        ),
        (
            "badif",
            serde_json::to_vec(&json!([{"Name":"n","ifnameRequest":"../e","Bytes":b64(
                &json!({"cniVersion":"1.0.0","name":"n","type":"bridge"})
            )}]))
            .unwrap(),
        ),
    ];
    for (id, bytes) in &cases {
        fs::write(dir.path().join(id), bytes).unwrap();
    }
    fs::create_dir(dir.path().join("adir")).unwrap();
    symlink(dir.path().join("garbage"), dir.path().join("alink")).unwrap();
    let big = fs::File::create(dir.path().join("huge")).unwrap();
    big.set_len(MAX_CACHE_BYTES + 1).unwrap();
    for id in cases
        .iter()
        .map(|(id, _)| *id)
        .chain(["adir", "alink", "huge"])
    {
        let e = caches.load(id).unwrap_err();
        assert!(e.is_damaged(), "{id}: {e}");
        assert_eq!(e.path(), dir.path().join(id), "{id}");
        assert!(
            fs::symlink_metadata(dir.path().join(id)).is_ok(),
            "{id} was removed"
        );
    }
}

#[test]
fn result_caches_should_match_their_name_and_kind() {
    let dir = tempfile::tempdir().unwrap();
    let caches = Caches::new(dir.path());
    fs::create_dir(dir.path().join("results")).unwrap();
    let entry = |cid: &str, kind: &str| {
        json!({"kind":kind,"containerId":cid,"config":b64(&json!({"cniVersion":"0.4.0","name":"n","plugins":[]})),
               "ifName":"eth0","networkName":"n","netns":"/run/netns/x",
               "cniArgs":[["IgnoreUnknown","1"],["K8S_POD_NAME","p"]],
               "capabilityArgs":{"mac":"m"},"result":{"cniVersion":"0.4.0"}})
    };
    let write = |file: &str, v: &Value| {
        fs::write(
            dir.path().join("results").join(file),
            serde_json::to_vec(v).unwrap(),
        )
        .unwrap()
    };
    write("n-c1-eth0", &entry("c1", RESULT_KIND));
    let r = caches.load_result("n", "c1", "eth0").unwrap().unwrap();
    assert_eq!(
        r.cni_args.as_deref(),
        Some("IgnoreUnknown=1;K8S_POD_NAME=p")
    );
    assert_eq!(r.netns, "/run/netns/x");
    assert_eq!(r.config_version.as_deref(), Some("0.4.0"));
    assert!(caches.load_result("n", "c1", "net1").unwrap().is_none());
    // Another container's cache under this one's name.
    write("n-c2-eth0", &entry("c1", RESULT_KIND));
    assert!(caches
        .load_result("n", "c2", "eth0")
        .unwrap_err()
        .is_damaged());
    write("n-c3-eth0", &entry("c3", "other"));
    assert!(caches
        .load_result("n", "c3", "eth0")
        .unwrap_err()
        .is_damaged());
    // GC's view: every readable one, damaged ones skipped.
    let all: Vec<String> = caches
        .results()
        .unwrap()
        .into_iter()
        .map(|r| r.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(all, ["n-c1-eth0", "n-c2-eth0"]);
}
