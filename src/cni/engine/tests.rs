//! The engine's logic with scripted plugins ([`FakeRunner`]) and an
//! in-memory record store ([`MemStore`]): rollback, per-container
//! serialization, GC against ADD, DEL and CHECK. Container locks are the
//! real ones, in a temporary directory (see [`super::parts`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::json;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::timeout;

use super::*;
use crate::cni::exec::{CallEnv, Plugin};
use crate::cni::state::{Durability, Record};
use crate::cni::{parts, state};
use crate::netconf::Invocation;

/// Long enough for anything that should happen to happen, under load.
const EVENTUALLY: Duration = Duration::from_secs(20);
/// How long a call that must stay blocked is given to show up anyway.
const NOT_WITHIN: Duration = Duration::from_millis(300);

/// What a scripted plugin does for one command.
#[derive(Debug, Clone)]
enum Act {
    /// Succeeds; an ADD prints a result naming the plugin.
    Succeed,
    /// Fails with this CNI error code and message.
    Fail(u32, &'static str),
    /// Waits for a permit of the gate (taken for good), then does the rest.
    Wait(Arc<Semaphore>, Box<Act>),
}

/// One plugin run, as the fake saw it start.
#[derive(Debug, Clone)]
struct Call {
    plugin: String,
    command: &'static str,
    container: String,
    ifname: String,
    stdin: Value,
}

/// Counts of runs in flight, per container id ("" for STATUS and GC).
#[derive(Debug, Default)]
struct Flight {
    now: HashMap<String, usize>,
    max: HashMap<String, usize>,
    total: usize,
    max_total: usize,
}

/// Plugins that do what the test scripted, noting every run.
#[derive(Debug)]
struct FakeRunner {
    /// (plugin, command) -> what it does; unscripted runs succeed.
    acts: Mutex<HashMap<(String, &'static str), Act>>,
    calls: Mutex<Vec<Call>>,
    flight: Mutex<Flight>,
    /// Every run, as it starts.
    started: mpsc::UnboundedSender<Call>,
}

impl FakeRunner {
    fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<Call>) {
        let (started, rx) = mpsc::unbounded_channel();
        let runner = Self {
            acts: Mutex::new(HashMap::new()),
            calls: Mutex::new(Vec::new()),
            flight: Mutex::new(Flight::default()),
            started,
        };
        (Arc::new(runner), rx)
    }

    fn script(&self, plugin: &str, command: &'static str, act: Act) {
        self.acts
            .lock()
            .unwrap()
            .insert((plugin.to_string(), command), act);
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The runs of `command`, in order.
    fn calls_of(&self, command: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.command == command)
            .collect()
    }

    /// The runs of `command`, as "plugin/container/ifname", in order.
    fn runs(&self, command: &str) -> Vec<String> {
        self.calls_of(command)
            .iter()
            .map(|c| format!("{}/{}/{}", c.plugin, c.container, c.ifname))
            .collect()
    }

    fn max_in_flight(&self, container: &str) -> usize {
        let f = self.flight.lock().unwrap();
        f.max.get(container).copied().unwrap_or(0)
    }

    fn max_total(&self) -> usize {
        self.flight.lock().unwrap().max_total
    }

    fn enter(&self, call: &Call) {
        self.calls.lock().unwrap().push(call.clone());
        let mut f = self.flight.lock().unwrap();
        let now = f.now.entry(call.container.clone()).or_default();
        *now += 1;
        let now = *now;
        let max = f.max.entry(call.container.clone()).or_default();
        *max = (*max).max(now);
        f.total += 1;
        f.max_total = f.max_total.max(f.total);
        drop(f);
        let _ = self.started.send(call.clone());
    }

    fn leave(&self, container: &str) {
        let mut f = self.flight.lock().unwrap();
        if let Some(n) = f.now.get_mut(container) {
            *n -= 1;
        }
        f.total -= 1;
    }
}

/// Leaves the flight count when a run ends, or is dropped half-way.
struct Leave<'a>(&'a FakeRunner, String);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.leave(&self.1);
    }
}

impl PluginRunner for FakeRunner {
    fn find(&self, name: &str) -> Result<Plugin, exec::Error> {
        Ok(Plugin::unlocated(name, PathBuf::from("/fake").join(name)))
    }

    fn versions<'a>(
        &'a self,
        _plugin: &'a Plugin,
    ) -> parts::BoxFuture<'a, Option<Arc<Vec<String>>>> {
        Box::pin(async { Some(Arc::new(vec!["1.0.0".into(), "1.1.0".into()])) })
    }

    fn run<'a>(
        &'a self,
        plugin: &'a Plugin,
        env: &'a CallEnv,
        stdin: Vec<u8>,
    ) -> parts::BoxFuture<'a, Result<Vec<u8>, exec::Error>> {
        Box::pin(async move {
            let call = Call {
                plugin: plugin.name.clone(),
                command: env.command,
                container: env.container_id.clone(),
                ifname: env.ifname.clone(),
                stdin: serde_json::from_slice(&stdin).unwrap(),
            };
            let act = self
                .acts
                .lock()
                .unwrap()
                .get(&(call.plugin.clone(), call.command))
                .cloned()
                .unwrap_or(Act::Succeed);
            self.enter(&call);
            let _leave = Leave(self, call.container.clone());
            let mut act = act;
            loop {
                match act {
                    Act::Wait(gate, then) => {
                        gate.acquire().await.unwrap().forget();
                        act = *then;
                    }
                    Act::Succeed if call.command == "ADD" => {
                        let result = json!({
                            "cniVersion": "1.1.0",
                            "interfaces": [{"name": call.plugin}],
                        });
                        return Ok(serde_json::to_vec(&result).unwrap());
                    }
                    Act::Succeed => return Ok(Vec::new()),
                    Act::Fail(code, msg) => {
                        return Err(exec::Error::Failed {
                            plugin: call.plugin.clone(),
                            error: exec::PluginError {
                                code,
                                msg: msg.to_string(),
                                details: String::new(),
                            },
                        })
                    }
                }
            }
        })
    }
}

/// Records in memory; ids marked damaged load as damaged records.
#[derive(Debug, Default)]
struct MemStore {
    records: Mutex<BTreeMap<String, Record>>,
    damaged: Mutex<BTreeSet<String>>,
    set_aside: Mutex<BTreeSet<String>>,
    /// While set, a synced save waits for a message (or fails when the
    /// sender is gone) before it stores anything: a slow disk.
    slow_sync: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// Synced saves that completed.
    synced: Mutex<usize>,
    /// The next atomic (not synced) save fails: an operation's last write.
    fail_atomic: Mutex<bool>,
}

impl MemStore {
    fn damage(&self, id: &str) {
        self.damaged.lock().unwrap().insert(id.to_string());
    }

    fn get(&self, id: &str) -> Option<Record> {
        self.records.lock().unwrap().get(id).cloned()
    }
}

impl Records for MemStore {
    fn load(&self, container_id: &str) -> Result<Option<Record>, state::Error> {
        if self.damaged.lock().unwrap().contains(container_id) {
            return Err(state::Error::Damaged {
                what: state::RECORD,
                path: PathBuf::from(format!("mem/{container_id}.json")),
                why: "scripted damage".into(),
            });
        }
        Ok(self.get(container_id))
    }

    fn save(&self, record: &Record, durability: Durability) -> Result<(), state::Error> {
        if durability == Durability::Atomic
            && std::mem::take(&mut *self.fail_atomic.lock().unwrap())
        {
            return Err(state::Error::Io {
                path: PathBuf::from("mem"),
                what: "cannot write the record",
                source: std::io::Error::other("the disk is full"),
            });
        }
        if record.attachments.is_empty() {
            return self.remove(&record.container_id, durability);
        }
        if durability == Durability::Synced {
            let slow = self.slow_sync.lock().unwrap().take();
            if let Some(rx) = slow {
                if rx.recv().is_err() {
                    return Err(state::Error::Io {
                        path: PathBuf::from("mem"),
                        what: "cannot sync the record",
                        source: std::io::Error::other("the disk went away"),
                    });
                }
            }
            *self.synced.lock().unwrap() += 1;
        }
        let mut records = self.records.lock().unwrap();
        records.insert(record.container_id.clone(), record.clone());
        Ok(())
    }

    fn remove(&self, container_id: &str, _: Durability) -> Result<(), state::Error> {
        self.records.lock().unwrap().remove(container_id);
        Ok(())
    }

    fn exists(&self, container_id: &str) -> bool {
        self.records.lock().unwrap().contains_key(container_id)
            || self.damaged.lock().unwrap().contains(container_id)
    }

    fn list(&self) -> Result<Vec<String>, state::Error> {
        let mut ids: BTreeSet<String> = self.records.lock().unwrap().keys().cloned().collect();
        ids.extend(self.damaged.lock().unwrap().iter().cloned());
        Ok(ids.into_iter().collect())
    }

    fn set_aside(&self, container_id: &str) -> Result<PathBuf, state::Error> {
        self.damaged.lock().unwrap().remove(container_id);
        self.set_aside
            .lock()
            .unwrap()
            .insert(container_id.to_string());
        Ok(PathBuf::from(format!("mem/damaged/{container_id}")))
    }

    fn was_set_aside(&self, container_id: &str) -> bool {
        self.set_aside.lock().unwrap().contains(container_id)
    }

    fn temp_files(&self) -> Vec<(String, PathBuf)> {
        Vec::new()
    }
}

/// An engine on a fake runner and an in-memory store; the locks live in
/// `dir`.
struct Rig {
    engine: Arc<Engine>,
    runner: Arc<FakeRunner>,
    store: Arc<MemStore>,
    started: mpsc::UnboundedReceiver<Call>,
    _dir: tempfile::TempDir,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        bin_dirs: Vec::new(),
        conf_dir: dir.path().join("conf"),
        state_dir: dir.path().to_path_buf(),
        plugin_timeout: Duration::from_secs(5),
        device_info_dir: dir.path().join("devinfo"),
        cni_dir: dir.path().join("multus"),
    };
    let (runner, started) = FakeRunner::new();
    let store = Arc::new(MemStore::default());
    let engine = Engine::with_parts(config, runner.clone(), store.clone()).unwrap();
    Rig {
        engine: Arc::new(engine),
        runner,
        store,
        started,
        _dir: dir,
    }
}

impl Rig {
    /// The next plugin run to start; fails the test if none does.
    async fn next_start(&mut self) -> Call {
        timeout(EVENTUALLY, self.started.recv())
            .await
            .expect("no plugin run started")
            .unwrap()
    }

    /// Fails the test if a plugin run starts within [`NOT_WITHIN`].
    async fn no_start(&mut self, why: &str) {
        if let Ok(Some(call)) = timeout(NOT_WITHIN, self.started.recv()).await {
            panic!("{why}: {call:?} started");
        }
    }
}

/// A 1.1.0 network running plugins `types` in order.
fn net(name: &str, types: &[&str]) -> NetworkList {
    let plugins: Vec<Value> = types.iter().map(|t| json!({"type": t})).collect();
    NetworkList::from_value(
        Path::new("test"),
        json!({"cniVersion": "1.1.0", "name": name, "plugins": plugins}),
        false,
    )
    .unwrap()
}

fn plan(list: NetworkList, ifname: &str, primary: bool) -> Planned {
    Planned::new(list, ifname, primary)
}

/// A call as the runtime makes it; no netns, so no namespace is checked.
fn call(command: Command, id: &str, ifname: &str) -> Invocation {
    Invocation {
        command,
        container_id: id.into(),
        netns: String::new(),
        ifname: ifname.into(),
        args: String::new(),
        arg_pairs: Vec::new(),
    }
}

async fn add(
    engine: &Engine,
    id: &str,
    ifname: &str,
    planned: Vec<Planned>,
) -> Result<Value, Error> {
    engine
        .add(&call(Command::Add, id, ifname), Map::new(), planned)
        .await
}

/// [`add`] of one primary network in a task of its own.
fn spawn_add(
    engine: &Arc<Engine>,
    id: &str,
    ifname: &str,
    list: NetworkList,
) -> tokio::task::JoinHandle<Result<Value, Error>> {
    let engine = engine.clone();
    let (id, ifname) = (id.to_string(), ifname.to_string());
    tokio::spawn(async move {
        let planned = vec![plan(list, &ifname, true)];
        add(&engine, &id, &ifname, planned).await
    })
}

async fn del(engine: &Engine, id: &str, ifname: &str) -> Result<(), Error> {
    let no_fallback = || async { Ok::<_, Error>(Vec::new()) };
    engine
        .del(&call(Command::Del, id, ifname), Map::new(), no_fallback)
        .await
}

fn valid(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    pairs
        .iter()
        .map(|(c, i)| (c.to_string(), i.to_string()))
        .collect()
}

/// The interface name in a DEL's prevResult: which plugin's result it is.
fn prev_of(call: &Call) -> Option<String> {
    call.stdin["prevResult"]["interfaces"][0]["name"]
        .as_str()
        .map(String::from)
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_should_wait_for_an_add_in_flight_and_keep_it() {
    let mut r = rig();
    let gate = Arc::new(Semaphore::new(0));
    r.runner
        .script("a", "ADD", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    let n = net("n", &["a"]);
    let adding = {
        let e = r.engine.clone();
        let n = n.clone();
        tokio::spawn(async move { add(&e, "c1", "eth0", vec![plan(n, "eth0", true)]).await })
    };
    assert_eq!(r.next_start().await.command, "ADD");
    // The runtime already counts the attachment being added as valid.
    let gc = {
        let e = r.engine.clone();
        let lists = vec![n.clone()];
        tokio::spawn(async move { e.gc(&valid(&[("c1", "eth0")]), &lists).await })
    };
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

fn list_dir_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn no_plugin_should_read_its_config_before_the_record_is_synced() {
    let mut r = rig();
    let (release, rx) = std::sync::mpsc::channel::<()>();
    *r.store.slow_sync.lock().unwrap() = Some(rx);
    let adding = {
        let engine = r.engine.clone();
        tokio::spawn(async move {
            add(
                &engine,
                "c1",
                "eth0",
                vec![plan(net("n", &["a", "b"]), "eth0", true)],
            )
            .await
        })
    };
    r.no_start("a plugin ran before the record was synced")
        .await;
    assert!(!adding.is_finished());
    release.send(()).unwrap();
    assert_eq!(r.next_start().await.plugin, "a");
    assert_eq!(r.next_start().await.plugin, "b");
    adding.await.unwrap().unwrap();
    assert_eq!(*r.store.synced.lock().unwrap(), 1);
    assert_eq!(
        r.store.get("c1").unwrap().attachments[0].delegates[0].state,
        State::Added
    );

    // A sync that fails stops the ADD before any plugin ran, and leaves
    // no record.
    let (release, rx) = std::sync::mpsc::channel::<()>();
    *r.store.slow_sync.lock().unwrap() = Some(rx);
    drop(release);
    let before = r.runner.calls().len();
    let e = add(
        &r.engine,
        "c2",
        "eth0",
        vec![plan(net("n", &["a"]), "eth0", true)],
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("the disk went away"), "{e}");
    let ran: Vec<_> = r.runner.calls()[before..]
        .iter()
        .map(|c| (c.plugin.clone(), c.command))
        .collect();
    // Only the rollback's DEL of the network that never started.
    assert_eq!(ran, [("a".to_string(), "DEL")]);
    assert!(r.store.get("c2").is_none());
}

/// An operation's last record write and the release of its locks share
/// one trip to the blocking pool. When that write fails, an ADD still
/// rolls back under the container's lock (nothing of it may run while
/// another call holds the container) and a DEL reports it; either way the
/// lock is released afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_last_write_should_be_handled_before_the_lock_is_released() {
    let mut r = rig();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    // The rollback's DEL waits: meanwhile, another call for the container
    // must not start.
    r.runner
        .script("a", "DEL", Act::Wait(gate.clone(), Box::new(Act::Succeed)));
    *r.store.fail_atomic.lock().unwrap() = true;
    let adding = spawn_add(&r.engine, "c1", "eth0", net("n", &["a"]));
    assert_eq!(r.next_start().await.command, "ADD");
    let rollback = r.next_start().await;
    assert_eq!((rollback.plugin.as_str(), rollback.command), ("a", "DEL"));
    let other = spawn_add(&r.engine, "c1", "eth1", net("m", &["b"]));
    r.no_start("a call ran while the rollback held the container")
        .await;
    gate.add_permits(1);
    let e = adding.await.unwrap().unwrap_err();
    assert!(e.to_string().contains("the disk is full"), "{e}");
    // Nothing of eth0 is recorded; the waiting ADD (eth1) may have
    // recorded its own attachment already, once the lock was released.
    assert!(
        r.store
            .get("c1")
            .is_none_or(|rec| rec.attachment("eth0").is_none()),
        "rolled back: nothing recorded"
    );
    // The lock was released: the waiting ADD runs.
    assert_eq!(r.next_start().await.plugin, "b");
    timeout(EVENTUALLY, other)
        .await
        .expect("the lock was released")
        .unwrap()
        .unwrap();

    // A DEL whose last write fails says so, and lets the lock go.
    r.runner.script("a", "DEL", Act::Succeed);
    add(
        &r.engine,
        "c2",
        "eth0",
        vec![plan(net("n", &["a"]), "eth0", true)],
    )
    .await
    .unwrap();
    *r.store.fail_atomic.lock().unwrap() = true;
    let e = del(&r.engine, "c2", "eth0").await.unwrap_err();
    assert!(e.to_string().contains("the disk is full"), "{e}");
    assert!(r.store.get("c2").is_some(), "the record was not removed");
    timeout(EVENTUALLY, del(&r.engine, "c2", "eth0"))
        .await
        .expect("the lock was released")
        .unwrap();
    assert!(r.store.get("c2").is_none());
}
