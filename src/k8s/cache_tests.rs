use std::sync::Arc;

use kube::runtime::watcher::Event;

use super::{Cache, Feeder};
use crate::k8s::nad::{CachedNad, NetworkAttachmentDefinition};
use crate::selection::pod::Nad;

fn nad(namespace: &str, name: &str, config: &str) -> NetworkAttachmentDefinition {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": "1",
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"config": config},
    }))
    .unwrap()
}

fn feeder() -> (Arc<Cache<CachedNad>>, Feeder<NetworkAttachmentDefinition>) {
    let cache = Arc::new(Cache::default());
    (cache.clone(), Feeder::new(cache))
}

fn config(cache: &Cache<CachedNad>, namespace: &str, name: &str) -> Option<String> {
    cache
        .get(namespace, name, CachedNad::to_nad)
        .and_then(|n| n.config)
}

fn list(f: &mut Feeder<NetworkAttachmentDefinition>, nads: Vec<NetworkAttachmentDefinition>) {
    assert!(!f.apply(Event::Init));
    for n in nads {
        assert!(!f.apply(Event::InitApply(n)));
    }
    assert!(f.apply(Event::InitDone), "InitDone completes a list");
}

#[test]
fn a_list_should_be_seen_whole_once_done() {
    let (cache, mut f) = feeder();
    f.apply(Event::Init);
    f.apply(Event::InitApply(nad("ns1", "a", "A")));
    assert_eq!(cache.len(), 0, "half a list is not served");
    f.apply(Event::InitApply(nad("ns1", "b", "B")));
    assert!(f.apply(Event::InitDone));
    assert_eq!(cache.len(), 2);
    assert_eq!(config(&cache, "ns1", "a").as_deref(), Some("A"));
    assert_eq!(
        cache.get("ns1", "b", CachedNad::to_nad),
        Some(Nad {
            config: Some("B".into()),
            resource_name: None
        })
    );
    assert_eq!(config(&cache, "ns2", "a"), None);
}

#[test]
fn a_relist_should_replace_the_contents_when_done() {
    let (cache, mut f) = feeder();
    list(
        &mut f,
        vec![
            nad("ns1", "a", "A"),
            nad("ns1", "gone", "G"),
            nad("ns2", "c", "C"),
        ],
    );
    // The watch expired; meanwhile `gone` was deleted and `a` changed.
    f.apply(Event::Init);
    f.apply(Event::InitApply(nad("ns1", "a", "A2")));
    assert_eq!(
        config(&cache, "ns1", "gone").as_deref(),
        Some("G"),
        "the old contents serve until the list is done"
    );
    f.apply(Event::InitApply(nad("ns2", "c", "C")));
    f.apply(Event::InitDone);
    assert_eq!(config(&cache, "ns1", "a").as_deref(), Some("A2"));
    assert_eq!(
        config(&cache, "ns1", "gone"),
        None,
        "a deletion missed while away"
    );
    assert_eq!(cache.len(), 2);
    // An Init whose list fails (no InitDone) and a new Init: the second
    // list alone counts.
    f.apply(Event::Init);
    f.apply(Event::InitApply(nad("ns9", "half", "H")));
    list(&mut f, vec![nad("ns1", "a", "A3")]);
    assert_eq!(cache.len(), 1);
    assert_eq!(config(&cache, "ns9", "half"), None);
}

#[test]
fn watch_events_should_change_the_cache_in_place() {
    let (cache, mut f) = feeder();
    list(&mut f, vec![nad("ns1", "b", "B")]);
    assert!(!f.apply(Event::Apply(nad("ns1", "a", "A"))));
    assert!(!f.apply(Event::Apply(nad("ns0", "z", "Z"))));
    f.apply(Event::Apply(nad("ns1", "b", "B2")));
    assert_eq!(config(&cache, "ns1", "b").as_deref(), Some("B2"));
    assert_eq!(config(&cache, "ns0", "z").as_deref(), Some("Z"));
    f.apply(Event::Delete(nad("ns1", "a", "A")));
    assert_eq!(config(&cache, "ns1", "a"), None);
    f.apply(Event::Delete(nad("ns1", "never", "")));
    assert_eq!(cache.len(), 2);
}

/// Namespaces whose names sort differently with and without the `/`
/// that joins a key (`a-x` < `a` as keys, `a` < `a-x` as names).
#[test]
fn lookups_should_order_by_namespace_then_name() {
    let (cache, mut f) = feeder();
    list(
        &mut f,
        vec![
            nad("a-x", "n", "AX"),
            nad("a", "n", "A"),
            nad("a", "m", "AM"),
        ],
    );
    f.apply(Event::Apply(nad("a-", "n", "A-")));
    for (ns, name, want) in [
        ("a", "n", "A"),
        ("a", "m", "AM"),
        ("a-x", "n", "AX"),
        ("a-", "n", "A-"),
    ] {
        assert_eq!(
            config(&cache, ns, name).as_deref(),
            Some(want),
            "{ns}/{name}"
        );
    }
}

#[test]
fn an_object_listed_twice_should_keep_its_later_value() {
    let (cache, mut f) = feeder();
    list(
        &mut f,
        vec![
            nad("ns2", "a", "old"),
            nad("ns1", "a", "x"),
            nad("ns2", "a", "new"),
        ],
    );
    assert_eq!(cache.len(), 2);
    assert_eq!(config(&cache, "ns2", "a").as_deref(), Some("new"));
}

/// The same config copied into many namespaces is held once, and let go
/// when its last NAD goes.
#[test]
fn configs_should_be_shared_and_released() {
    let (cache, mut f) = feeder();
    let shared = r#"{"cniVersion":"0.3.1","type":"macvlan"}"#;
    list(
        &mut f,
        (0..50)
            .map(|i| nad(&format!("ns{i}"), "net", shared))
            .collect(),
    );
    let texts = |cache: &Cache<CachedNad>| cache.entries.read().unwrap().texts.len();
    assert_eq!(texts(&cache), 1);
    let first = cache.get("ns0", "net", |n| n.clone()).unwrap();
    let last = cache.get("ns49", "net", |n| n.clone()).unwrap();
    assert_eq!(first, last);
    drop((first, last));
    f.apply(Event::Apply(nad("ns0", "net", "other")));
    assert_eq!(texts(&cache), 2);
    for i in 1..50 {
        f.apply(Event::Delete(nad(&format!("ns{i}"), "net", shared)));
    }
    assert_eq!(
        texts(&cache),
        1,
        "the shared config is let go with its last NAD"
    );
    f.apply(Event::Delete(nad("ns0", "net", "other")));
    assert_eq!((cache.len(), texts(&cache)), (0, 0));
}
