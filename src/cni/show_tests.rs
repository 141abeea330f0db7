//! [`super`]'s summaries of a record and of what multus cached, and what
//! `show` finds for a container: plexusd's record first, else multus's
//! caches, damaged ones reported as such and left where they are.

use std::fs;
use std::os::unix::fs::symlink;

use base64::Engine as _;
use serde_json::json;

use super::*;
use crate::cni::state::Store;

/// A record of `id`: network `n` added on eth0 in `/run/netns/x`.
fn record(id: &str) -> Record {
    let mut record = Record::new(id);
    record.attachments.push(super::super::state::Attachment {
        fell_back: false,
        hot_plugged_into: None,
        cleanup: None,
        ifname: "eth0".into(),
        netns: "/run/netns/x".into(),
        cni_args: String::new(),
        capability_args: Map::new(),
        delegates: vec![Delegate {
            name: "n".into(),
            ifname: "eth0".into(),
            primary: true,
            state: State::Added,
            config: json!({}),
            capability_args: None,
            cni_args: None,
            result: Some(json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"},
                    {"name": "eth0", "mac": "0a:58:0a:00:00:02", "sandbox": "/run/netns/x"}
                ],
                "ips": [
                    {"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 1},
                    {"address": "10.9.0.1/24", "interface": 0}
                ]
            })),
        }],
    });
    record
}

#[test]
fn a_summary_should_show_the_container_side_interface_and_its_addresses() {
    let mut record = record("c1");
    let s = summary(&record);
    assert_eq!(s["containerId"], "c1");
    assert!(s.get("attachedBy").is_none());
    let network = &s["attachments"][0]["networks"][0];
    assert_eq!(network["network"], "n");
    assert_eq!(network["state"], "added");
    assert_eq!(network["mac"], "0a:58:0a:00:00:02");
    assert_eq!(network["ips"], json!(["10.0.0.2/24"]));
    assert_eq!(network["gateways"], json!(["10.0.0.1"]));

    record.attachments[0].delegates[0].state = State::Adding;
    record.attachments[0].delegates[0].result = None;
    let network = summary(&record)["attachments"][0]["networks"][0].clone();
    assert_eq!(network["state"], "adding");
    assert!(network.get("ips").is_none() && network.get("mac").is_none());
}

/// multus's caches for `id` in `dir`: network `n` (a list) as primary, on
/// eth0 with a result, and NAD `default/lan` on net1 without one.
fn multus_attached(dir: &std::path::Path, id: &str) {
    let b64 = |v: Value| base64::engine::general_purpose::STANDARD.encode(v.to_string());
    let n = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge"}]});
    let lan = json!({"cniVersion": "1.0.0", "name": "lan", "type": "macvlan"});
    let delegates = json!([
        {"ConfList": {"plugins": [{"type": "bridge"}]}, "Name": "n", "Bytes": b64(n)},
        {"ConfList": {}, "Name": "default/lan", "Bytes": b64(lan)}
    ]);
    fs::create_dir_all(dir.join("results")).unwrap();
    fs::write(dir.join(id), delegates.to_string()).unwrap();
    let cached = json!({"kind": "cniCacheV1", "containerId": id, "ifName": "eth0",
        "networkName": "n", "netns": "/run/netns/m",
        "result": {"cniVersion": "1.0.0",
            "interfaces": [{"name": "br0"}, {"name": "eth0", "mac": "0a:00:00:00:00:01", "sandbox": "/run/netns/m"}],
            "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 1}]}});
    fs::write(
        dir.join("results").join(format!("n-{id}-eth0")),
        cached.to_string(),
    )
    .unwrap();
}

#[test]
fn show_should_take_the_record_first_then_multus_caches_marked_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::at(&tmp.path().join("state"));
    let cni_dir = tmp.path().join("multus");
    let caches = Caches::new(&cni_dir);
    fs::create_dir_all(&cni_dir).unwrap();
    multus_attached(&cni_dir, "m1");
    multus_attached(&cni_dir, "both");
    let store_rw = Store::open(&tmp.path().join("state")).unwrap();
    store_rw
        .save(&record("both"), crate::cni::state::Durability::Atomic)
        .unwrap();
    store_rw
        .save(&record("c1"), crate::cni::state::Durability::Atomic)
        .unwrap();
    assert_eq!(ids(&store, &caches).unwrap(), ["both", "c1", "m1"]);

    // plexusd's own record wins.
    let shown = lookup(&store, &caches, "both", None).unwrap().unwrap();
    assert_eq!(shown.summary, summary(&record("both")));

    let shown = lookup(&store, &caches, "m1", None).unwrap().unwrap();
    assert!(shown.damaged.is_none() && shown.damaged_files.is_empty());
    let s = shown.summary;
    assert_eq!(s["containerId"], "m1");
    assert_eq!(s["attachedBy"], "multus");
    let att = &s["attachments"][0];
    assert_eq!(
        (&att["ifname"], &att["netns"]),
        (&json!("eth0"), &json!("/run/netns/m"))
    );
    assert_eq!(
        att["networks"],
        json!([
            {"network": "n", "multusName": "n", "interface": "eth0", "primary": true,
             "state": "added", "mac": "0a:00:00:00:00:01", "ips": ["10.1.0.5/24"],
             "gateways": ["10.1.0.1"]},
            {"network": "lan", "multusName": "default/lan", "interface": "net1",
             "primary": false, "state": "unknown"}
        ])
    );
    assert!(lookup(&store, &caches, "none", None).unwrap().is_none());
}

#[test]
fn show_should_report_damaged_multus_caches_and_leave_them_where_they_are() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::at(&tmp.path().join("state"));
    let cni_dir = tmp.path().join("multus");
    let caches = Caches::new(&cni_dir);
    multus_attached(&cni_dir, "m1");
    // m2's delegate cache cut short; m1's net1 result a link to m1's eth0.
    fs::write(cni_dir.join("m2"), b"[{\"Name\":").unwrap();
    let link = cni_dir.join("results/lan-m1-net1");
    symlink(cni_dir.join("results/n-m1-eth0"), &link).unwrap();

    let shown = lookup(&store, &caches, "m2", None).unwrap().unwrap();
    let why = shown.damaged.unwrap();
    assert!(
        why.contains(&cni_dir.join("m2").display().to_string()),
        "{why}"
    );
    assert_eq!(shown.summary["attachedBy"], "multus");
    assert_eq!(shown.summary["damaged"], json!(why));

    let shown = lookup(&store, &caches, "m1", None).unwrap().unwrap();
    assert!(shown.damaged.is_none());
    assert_eq!(shown.damaged_files.len(), 1);
    assert!(shown.damaged_files[0].contains(&link.display().to_string()));
    let net1 = &shown.summary["attachments"][0]["networks"][1];
    assert_eq!(net1["state"], "unknown");
    assert_eq!(net1["damaged"], json!(shown.damaged_files[0]));
    assert!(net1.get("ips").is_none());

    // Nothing moved, removed or created.
    assert_eq!(fs::read(cni_dir.join("m2")).unwrap(), b"[{\"Name\":");
    assert!(fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(!tmp.path().join("state").exists());
}
