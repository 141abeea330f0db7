//! The engine's logic with scripted plugins ([`FakeRunner`]) and an
//! in-memory record store ([`MemStore`]): rollback, per-container
//! serialization, GC against ADD, DEL and CHECK. Container locks are the
//! real ones, in a temporary directory (see [`super::backends`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::json;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::timeout;

use super::*;
use crate::cni::exec::{CallEnv, Plugin};
use crate::cni::state::{Durability, Record};
use crate::cni::{backends, state};
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
    ) -> backends::BoxFuture<'a, Option<Arc<Vec<String>>>> {
        Box::pin(async { Some(Arc::new(vec!["1.0.0".into(), "1.1.0".into()])) })
    }

    fn run<'a>(
        &'a self,
        plugin: &'a Plugin,
        env: &'a CallEnv,
        stdin: Vec<u8>,
    ) -> backends::BoxFuture<'a, Result<Vec<u8>, exec::Error>> {
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
    rig_with_plugin_timeout(Duration::from_secs(5))
}

fn rig_with_plugin_timeout(plugin_timeout: Duration) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        bin_dirs: Vec::new(),
        conf_dir: dir.path().join("conf"),
        state_dir: dir.path().to_path_buf(),
        plugin_timeout,
        device_info_dir: dir.path().join("devinfo"),
        cni_dir: dir.path().join("multus"),
        cleanup: Default::default(),
        plugin_spawner: None,
    };
    let (runner, started) = FakeRunner::new();
    let store = Arc::new(MemStore::default());
    let engine = Engine::with_backends(config, runner.clone(), store.clone()).unwrap();
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
    let added = engine
        .add_networks(&call(Command::Add, id, ifname), Map::new(), planned)
        .await?;
    Ok(AddedNetwork::primary(&added)?.result.clone())
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

fn list_dir_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

mod concurrency;
mod del_check_gc;
mod faults;
mod gc_live;
mod multus;
mod reclaim;
mod records;
mod rollback;
mod scripted;
