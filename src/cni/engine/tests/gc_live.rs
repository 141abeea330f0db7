//! The plugins' GC never frees what a container the runtime still has
//! holds, even when its record cannot be read: the valid list names the
//! interfaces a DEL without a record would use. And GC never sweeps a
//! container the runtime lists, or one whose record is younger than the
//! grace ([`Live`]), whatever the valid list says.

use std::time::SystemTime;

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
fn listed(runner: &FakeRunner, plugin: &str) -> Value {
    let gcs: Vec<Call> = runner
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
        listed(&r.runner, "a"),
        json!([
            {"containerID": "c2", "ifname": "eth0"},
            {"containerID": "c1", "ifname": "eth0"}
        ])
    );
    assert_eq!(
        listed(&r.runner, "b"),
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
        listed(&r.runner, "a"),
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

/// An engine on scripted plugins whose records are real files (a
/// [`state::Store`]): a record's age is its file's mtime, which a test can
/// set back.
struct OnDisk {
    engine: Engine,
    runner: Arc<FakeRunner>,
    store: Arc<state::Store>,
    _dir: tempfile::TempDir,
}

fn on_disk() -> OnDisk {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        bin_dirs: Vec::new(),
        conf_dir: dir.path().join("conf"),
        state_dir: dir.path().to_path_buf(),
        plugin_timeout: Duration::from_secs(5),
        device_info_dir: dir.path().join("devinfo"),
        cni_dir: dir.path().join("multus"),
        cleanup: Default::default(),
        plugin_spawner: None,
    };
    let (runner, _) = FakeRunner::new();
    let store = Arc::new(state::Store::open(dir.path()).unwrap());
    let engine = Engine::with_backends(config, runner.clone(), store.clone()).unwrap();
    OnDisk {
        engine,
        runner,
        store,
        _dir: dir,
    }
}

impl OnDisk {
    /// Containers `ids`, each ADDed with network `n` on eth0.
    async fn add_all(&self, n: &NetworkList, ids: &[&str]) {
        for id in ids {
            add(
                &self.engine,
                id,
                "eth0",
                vec![plan(n.clone(), "eth0", true)],
            )
            .await
            .unwrap();
        }
    }

    /// Makes `id`'s record look written `ago`.
    fn written_ago(&self, id: &str, ago: Duration) {
        let path = self.store.dir().join(format!("{id}.json"));
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(SystemTime::now() - ago)
            .unwrap();
        let age = self.store.age(id).unwrap();
        assert!(age >= ago, "{id}: {age:?}");
    }

    /// GC with nothing valid, keeping what `ids` and `grace` keep.
    async fn gc(&self, n: &NetworkList, ids: &[&str], grace: Option<Duration>) {
        let live = Live {
            ids: ids.iter().map(|id| id.to_string()).collect(),
            grace,
        };
        self.engine
            .gc_keeping(&valid(&[]), &live, std::slice::from_ref(n), configured)
            .await
            .unwrap();
    }

    /// Which of `ids` still have a record.
    fn recorded(&self, ids: &[&str]) -> Vec<String> {
        ids.iter()
            .filter(|id| self.store.exists(id))
            .map(|id| id.to_string())
            .collect()
    }
}

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn gc_keeping_should_never_sweep_a_container_the_runtime_lists_however_old() {
    let r = on_disk();
    let n = net("n", &["a"]);
    r.add_all(&n, &["listed", "gone"]).await;
    r.written_ago("listed", 2 * HOUR);
    r.written_ago("gone", 2 * HOUR);
    r.gc(&n, &["listed"], Some(Duration::from_secs(1))).await;
    // Neither is in the valid list; only the one the runtime does not
    // list is swept.
    assert_eq!(r.runner.runs("DEL"), ["a/gone/eth0"]);
    assert_eq!(r.recorded(&["listed", "gone"]), ["listed"]);
    // Its interface stays recorded, so valid to the plugins' GC: its
    // address is not freed there either.
    assert_eq!(
        listed(&r.runner, "a"),
        json!([{"containerID": "listed", "ifname": "eth0"}])
    );
}

#[tokio::test]
async fn gc_keeping_should_keep_a_record_younger_than_the_grace_and_sweep_an_older_one() {
    let r = on_disk();
    let n = net("n", &["a"]);
    r.add_all(&n, &["young", "old"]).await;
    r.written_ago("old", 2 * HOUR);
    // The runtime was asked and lists neither: its list may have been
    // computed before the young one's ADD ended.
    r.gc(&n, &[], Some(HOUR)).await;
    assert_eq!(r.runner.runs("DEL"), ["a/old/eth0"]);
    assert_eq!(r.recorded(&["young", "old"]), ["young"]);
    assert_eq!(
        listed(&r.runner, "a"),
        json!([{"containerID": "young", "ifname": "eth0"}])
    );
}

#[tokio::test]
async fn gc_keeping_without_a_grace_should_sweep_a_young_record_at_once() {
    let r = on_disk();
    let n = net("n", &["a"]);
    r.add_all(&n, &["young", "listed"]).await;
    // No runtime asked: the valid list alone decides, as gc_with does.
    r.gc(&n, &["listed"], None).await;
    assert_eq!(r.runner.runs("DEL"), ["a/young/eth0"]);
    assert_eq!(r.recorded(&["young", "listed"]), ["listed"]);
    assert_eq!(
        listed(&r.runner, "a"),
        json!([{"containerID": "listed", "ifname": "eth0"}])
    );
}
