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

/// A result cache entry as libcni writes it, for `network` of `cid` on
/// `ifname`.
fn result_entry(cid: &str, network: &str, ifname: &str) -> Value {
    json!({"kind":RESULT_KIND,"containerId":cid,"ifName":ifname,"networkName":network,
           "netns":"/run/netns/x","result":{"cniVersion":"1.0.0","interfaces":[{"name":ifname,"sandbox":"/run/netns/x"}]}})
}

fn write_result(dir: &Path, file: &str, v: &Value) {
    fs::create_dir_all(dir.join("results")).unwrap();
    fs::write(
        dir.join("results").join(file),
        serde_json::to_vec(v).unwrap(),
    )
    .unwrap();
}

#[test]
fn a_file_name_should_be_a_containers_only_when_no_other_id_reads_in_it() {
    assert!(only_reading_is("n-c1-eth0", "c1", None));
    assert!(!only_reading_is("n-c1-eth0", "c2", None));
    // The id, a prefix or suffix of another's, or a network with '-'.
    assert!(!only_reading_is("n-c1-x-eth0", "c1", None));
    assert!(!only_reading_is("n-c1-x-eth0", "c1-x", None));
    assert!(!only_reading_is("my-net-c1-eth0", "c1", None));
    assert!(only_reading_is("my-net-c1-eth0", "c1", Some("my-net")));
    assert!(!only_reading_is("my-net-c1-eth0", "c1", Some("net")));
    // Not a name libcni writes at all.
    assert!(!only_reading_is("c1-eth0", "c1", None));
    assert!(!only_reading_is("n-c1-", "c1", None));
}

#[test]
fn the_result_caches_of_a_container_should_be_its_own_and_no_one_elses() {
    let dir = tempfile::tempdir().unwrap();
    let caches = Caches::new(dir.path());
    let d = dir.path();
    // c1's, with a network name holding '-' and an interface of its own.
    write_result(d, "my-net-c1-eth0", &result_entry("c1", "my-net", "eth0"));
    write_result(d, "n-c1-net-1", &result_entry("c1", "n", "net-1"));
    // Containers whose ids start or end like c1's, or contain it.
    write_result(
        d,
        "my-net-c1-x-eth0",
        &result_entry("c1-x", "my-net", "eth0"),
    );
    write_result(d, "n-x-c1-eth0", &result_entry("x-c1", "n", "eth0"));
    write_result(d, "n-c10-eth0", &result_entry("c10", "n", "eth0"));
    // A copy of c1's under another's name is that one's (damaged) file.
    write_result(d, "n-c2-eth0", &result_entry("c1", "n", "eth0"));
    write_result(d, "my-net-c1-x-net9", &result_entry("c1", "my-net", "eth0"));
    // Damaged: one only c1 can have written; one known by its network;
    // one another id could have written too.
    fs::write(d.join("results/n-c1-net2"), b"{").unwrap();
    symlink(d.join("elsewhere"), d.join("results/lan-c1-net3")).unwrap();
    fs::write(d.join("results/n-q-c1-net4"), b"{").unwrap();
    let known = [("lan".to_string(), "net3".to_string())];
    let mut found: Vec<(String, bool)> = caches
        .results_of("c1", &known)
        .unwrap()
        .into_iter()
        .map(|r| match r {
            Ok(r) => (r.path.file_name().unwrap().to_string_lossy().into(), true),
            Err(e) => {
                assert!(e.is_damaged(), "{e}");
                (
                    e.path().file_name().unwrap().to_string_lossy().into(),
                    false,
                )
            }
        })
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            ("lan-c1-net3".to_string(), false),
            ("my-net-c1-eth0".to_string(), true),
            ("n-c1-net-1".to_string(), true),
            ("n-c1-net2".to_string(), false),
        ]
    );
    // Only read.
    assert_eq!(caches.result_names().unwrap().len(), 10);
    assert!(caches.results_of("none", &[]).unwrap().is_empty());
}

#[test]
fn seen_should_name_the_primarys_interface_from_its_own_result_and_move_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let caches = Caches::new(dir.path());
    let d = dir.path();
    let main = json!({"cniVersion":"1.0.0","name":"my-net","plugins":[{"type":"bridge"}]});
    let nad = json!({"cniVersion":"1.0.0","name":"lan","type":"macvlan"});
    delegates(
        d,
        "c1",
        &json!([
            {"ConfList":{"plugins":[{"type":"bridge"}]},"Name":"my-net","Bytes":b64(&main)},
            {"ConfList":{},"Name":"default/lan","Bytes":b64(&nad)},
            {"ConfList":{},"Name":"default/lan","ifnameRequest":"fast0","Bytes":b64(&nad)}
        ]),
    );
    // The primary on the runtime's "pod0"; a container whose id starts
    // with c1's has its own on eth0, which is not c1's.
    write_result(d, "my-net-c1-pod0", &result_entry("c1", "my-net", "pod0"));
    write_result(
        d,
        "my-net-c1-x-eth0",
        &result_entry("c1-x", "my-net", "eth0"),
    );
    fs::write(d.join("results/lan-c1-net1"), b"{").unwrap();
    let before = caches.result_names().unwrap();
    let seen = caches.seen("c1", None).unwrap().unwrap();
    let ifnames: Vec<Option<&str>> = seen.iter().map(|n| n.ifname.as_deref()).collect();
    assert_eq!(ifnames, [Some("pod0"), Some("net1"), Some("fast0")]);
    assert_eq!(
        seen[0].result.as_ref().unwrap().as_ref().unwrap().ifname,
        "pod0"
    );
    // net1's is damaged, and named; fast0 has none.
    let e = seen[1].result.as_ref().unwrap_err();
    assert!(
        e.is_damaged() && e.path().ends_with("results/lan-c1-net1"),
        "{e}"
    );
    assert!(seen[2].result.as_ref().unwrap().is_none());
    assert_eq!(caches.result_names().unwrap(), before);
    assert!(d.join("c1").is_file());

    // Without its own result, the primary's interface is unknown: c1-x's
    // is not taken for it.
    fs::remove_file(d.join("results/my-net-c1-pod0")).unwrap();
    let seen = caches
        .seen("c1", Some(&caches.result_names().unwrap()))
        .unwrap()
        .unwrap();
    assert_eq!(seen[0].ifname, None);
    assert!(seen[0].result.as_ref().unwrap().is_none());

    // A damaged delegate cache is the error; a link is not followed.
    symlink(d.join("c1"), d.join("c2")).unwrap();
    let e = caches.seen("c2", None).unwrap_err();
    assert!(e.is_damaged() && e.path() == d.join("c2"), "{e}");
    assert!(fs::symlink_metadata(d.join("c2")).unwrap().is_symlink());
    assert!(caches.seen("c3", None).unwrap().is_none());
}
