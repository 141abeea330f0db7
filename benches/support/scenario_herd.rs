//! Scenario 11: a node's reboot herd. Every pod of the node arrives at
//! once at a plexusd that is not running yet: `systemd-socket-activate`
//! holds the socket (as `plexusd.socket` does at boot) and starts plexusd
//! on the herd's first connection. plexusd runs in Kubernetes mode against
//! the test API server; each pod gets the cluster network and the two
//! NetworkAttachmentDefinitions its annotation names: three `bridge` +
//! `host-local` attachments (`eth0`, `net1`, `net2`) in a network
//! namespace of its own. Beside it, in the same run, the same three plugin
//! executions per pod run directly, every pod at once as well. Each
//! setting (pod count, `connectionLimit`) gets a cold daemon of its own.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::net::UnixDatagram;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::daemon_metrics::{metric, metrics_text};
use crate::procs::{
    children_cpu, poll, proc_cpu, status_kib, unix_listening, Call, ChildGuard, Outcome,
};
use crate::report::{Section, Table, Target};
use crate::setup::{
    shim, shim_kind, write_network, Failures, Network, CNI_BIN, LOG_LEVEL, PLEXUSD,
};
use crate::stats::{fmt_kib, fmt_ms, fmt_ms_f, fmt_ratio, ms, Samples};
use crate::support::cni::{call_env, list_dir, Engine, PLUGIN_PATH};
use crate::support::kube::{FakeApi, Logged};
use crate::support::netns::{Link, Netns, Subnet};
use crate::Counts;

#[path = "scenario_herd_report.rs"]
mod report;

/// The herds, in the report's order: pods, and the `connectionLimit`
/// settings each is measured with (`None`: the key unset, the daemon's
/// default, always first; 1024, as many as `maxConnections`, is no limit
/// for these herds).
const HERDS: &[(usize, &[Option<usize>])] = &[
    (250, &[None, Some(2), Some(4), Some(8), Some(1024)]),
    (1000, &[None]),
];
/// The herds with `PLEXUS_BENCH_QUICK=1`.
const QUICK_HERDS: &[(usize, &[Option<usize>])] = &[(24, &[None, Some(4)]), (96, &[None])];
/// Seconds after the last DEL at which plexusd's VmRSS is read; the
/// target is about the last one.
const RSS_AFTER: [u64; 4] = [1, 2, 5, 10];
/// Rows of at most this many pods get a direct herd of their own (it runs
/// in the seconds plexusd idles anyway); larger rows share the one of the
/// first row of their pod count (1,000 pods' takes about two minutes).
const DIRECT_PER_ROW_MAX_PODS: usize = 250;
/// Namespaces checked per side and herd, evenly spread (every one in
/// herds up to this size).
const CHECKED_PODS: usize = 250;

/// The node the daemon serves; every pod is scheduled on it.
const NODE: &str = "herd-node";
/// The pods' namespace, and the NetworkAttachmentDefinitions'.
const POD_NS: &str = "herd";
/// The NetworkAttachmentDefinitions every pod's annotation names.
const NADS: [&str; 2] = ["herd-a", "herd-b"];
const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// A pod's interfaces: the cluster network's, then the annotation's
/// networks in its order.
const IFNAMES: [&str; 3] = ["eth0", "net1", "net2"];
/// Pods per /24 of a network's host-local ranges (253 addresses; the rest
/// is room for what a failed DEL may leave reserved).
const PODS_PER_SUBNET: usize = 200;
/// The unit's `LimitNOFILE=` (systemd/plexusd.service).
const UNIT_NOFILE: u64 = 16384;

/// Targets.
const ADD_RATIO_GOAL: f64 = 0.95;
const DEL_RATIO_GOAL: f64 = 0.95;
const PEAK_GOAL_MIB: u64 = 20;
const SETTLED_GOAL_MIB: u64 = 14;
const GROWTH_GOAL: f64 = 1.10;

/// One measured row: a pod count and a `connectionLimit`.
#[derive(Debug, Clone, Copy)]
struct Setting {
    pods: usize,
    limit: Option<usize>,
}

impl Setting {
    fn limit_label(&self) -> String {
        match self.limit {
            None => format!(
                "connectionLimit unset (default: {})",
                plexus::limit::default_connection_limit()
            ),
            Some(l) => format!("connectionLimit {l}"),
        }
    }

    fn label(&self) -> String {
        format!("{} pods, {}", count(self.pods), self.limit_label())
    }
}

/// `1000` as `1,000`.
fn count(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A network's addresses: host-local ranges of several /24s in one range
/// set, enough for the largest herd.
struct Pool(Vec<Subnet>);

impl Pool {
    fn new(pods: usize) -> Self {
        Self(
            (0..pods.div_ceil(PODS_PER_SUBNET).max(1))
                .map(|_| Subnet::new())
                .collect(),
        )
    }

    fn ipam(&self, engine: &Engine) -> Value {
        let ranges: Vec<Value> = self
            .0
            .iter()
            .map(|s| json!({ "subnet": s.cidr() }))
            .collect();
        json!({
            "type": "host-local",
            "dataDir": engine.ipam_dir,
            "ranges": [ranges],
        })
    }

    /// Whether `address` (`a.b.c.d/24`) is a host address of the pool.
    fn holds(&self, address: &str) -> bool {
        self.0.iter().any(|s| s.holds(address))
    }

    /// [`Pool::holds`] for an address without its prefix length.
    fn holds_ip(&self, ip: &str) -> bool {
        self.holds(&format!("{ip}/24"))
    }

    fn cidrs(&self) -> String {
        self.0
            .iter()
            .map(Subnet::cidr)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What the herd's settings share.
struct Ctx<'a> {
    engine: &'a Engine,
    api: &'a FakeApi,
    /// The cluster network, then the NADs' networks (as the direct side
    /// executes them).
    nets: &'a [Network; 3],
    pools: &'a [Pool; 3],
    kubeconfig: PathBuf,
}

// ---------------------------------------------------------------------------
// Running a herd.

/// When a herd ran: from the release of every pod to the last one's end.
#[derive(Debug, Clone, Copy)]
struct Span {
    wall: Duration,
    end: Instant,
}

impl Span {
    fn start(&self) -> Instant {
        self.end - self.wall
    }
}

/// Runs `f(i)` for every pod `i` in `0..n` at once: a thread per pod, all
/// released together once every one has started. Each pod's time and
/// value, in pod order.
fn herd<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> (Span, Vec<(Duration, T)>) {
    let gate = RwLock::new(());
    let arrived = AtomicUsize::new(0);
    thread::scope(|s| {
        // Held until every thread waits on it. A failed spawn unwinds
        // through it, which releases the pods already started: the scope
        // then waits for them instead of for a release that never comes.
        let closed = gate.write().unwrap_or_else(|e| e.into_inner());
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (gate, arrived, f) = (&gate, &arrived, &f);
                thread::Builder::new()
                    .name("herd".into())
                    .stack_size(256 << 10)
                    .spawn_scoped(s, move || {
                        arrived.fetch_add(1, Ordering::SeqCst);
                        drop(gate.read().unwrap_or_else(|e| e.into_inner()));
                        let t0 = Instant::now();
                        let v = f(i);
                        let t1 = Instant::now();
                        (t1, t1 - t0, v)
                    })
                    .expect("spawn a herd thread")
            })
            .collect();
        while arrived.load(Ordering::SeqCst) < n {
            thread::sleep(Duration::from_micros(200));
        }
        // Taken before the release, as in procs::burst: the main thread
        // may get the CPU back only after many pods are done.
        let start = Instant::now();
        drop(closed);
        let mut end = start;
        let out = handles
            .into_iter()
            .map(|h| {
                let (e, d, v) = h.join().expect("herd thread panicked");
                end = end.max(e);
                (d, v)
            })
            .collect();
        (
            Span {
                wall: end - start,
                end,
            },
            out,
        )
    })
}

/// How one pod's call went.
struct PodResult {
    /// Why it failed, if it did.
    failure: Option<String>,
    /// The failure was CNI error code 11 (try again later).
    code11: bool,
}

impl PodResult {
    fn of(o: &Outcome) -> Self {
        let code11 = !o.ok() && o.json().and_then(|v| v["code"].as_u64()) == Some(11);
        Self {
            failure: (!o.ok()).then(|| o.describe()),
            code11,
        }
    }
}

/// A pod's CNI_ARGS as a runtime gives them.
fn pod_args(name: &str, uid: &str, cid: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={POD_NS};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid}"
    )
}

/// `call` with `CNI_ARGS` replaced by `args`.
fn with_args(mut call: Call, args: &str) -> Call {
    for (k, v) in &mut call.env {
        if k == "CNI_ARGS" {
            *v = args.to_string();
        }
    }
    call
}

/// The ADD results of a pod's three networks, in the pod's order.
type AddResults = [Option<Value>; 3];

/// One pod's plugin executions run directly, as plexusd runs them: ADD
/// network by network in the pod's order, up to the first failure; DEL in
/// reverse order with each ADD's result as `prevResult`, every one of them
/// even past a failure (as plexusd's DEL). The ADD results.
fn direct_pod(
    nets: &[Network; 3],
    command: &str,
    cid: &str,
    netns: &str,
    args: &str,
    prev: &AddResults,
) -> (PodResult, AddResults) {
    let mut results = [None, None, None];
    let mut failures = Vec::new();
    let order: [usize; 3] = if command == "DEL" {
        [2, 1, 0]
    } else {
        [0, 1, 2]
    };
    for k in order {
        let call = with_args(nets[k].direct(command, cid, netns, prev[k].as_ref()), args);
        let o = call.run();
        if command == "ADD" {
            results[k] = o.json();
        }
        if !o.ok() {
            failures.push(format!(
                "{} ({}): {}",
                nets[k].name,
                IFNAMES[k],
                o.describe()
            ));
            if command == "ADD" {
                break;
            }
        }
    }
    let r = PodResult {
        failure: (!failures.is_empty()).then(|| failures.join(" / ")),
        code11: false,
    };
    (r, results)
}

/// `check(i)` for every pod in `pods`, on two threads; the problems found.
fn check_all(pods: &[usize], check: impl Fn(usize) -> Option<String> + Sync) -> Vec<String> {
    let check = &check;
    thread::scope(|s| {
        let halves: Vec<_> = (0..2)
            .map(|t| {
                s.spawn(move || {
                    pods.iter()
                        .skip(t)
                        .step_by(2)
                        .filter_map(|&i| check(i))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        halves
            .into_iter()
            .flat_map(|h| h.join().expect("check thread panicked"))
            .collect()
    })
}

/// What pod `name`'s namespace lacks of eth0, net1 and net2 with an
/// address in their networks' ranges, as a sentence.
fn lacks(netns: &Netns, pools: &[Pool; 3]) -> Option<String> {
    let ifaces = netns.ifaces();
    let missing: Vec<String> = IFNAMES
        .iter()
        .zip(pools)
        .filter(|(ifname, pool)| {
            !ifaces
                .iter()
                .any(|i| i.name == **ifname && i.addrs.iter().any(|a| pool.holds(a)))
        })
        .map(|(ifname, pool)| format!("{ifname} in {}", pool.cidrs()))
        .collect();
    (!missing.is_empty()).then(|| format!("{} lacks {}", netns.name, missing.join(", ")))
}

/// Which of eth0, net1 and net2 are still in the namespace after DEL.
fn left_over(netns: &Netns) -> Option<String> {
    let ifaces = netns.ifaces();
    let left: Vec<&str> = IFNAMES
        .iter()
        .copied()
        .filter(|n| ifaces.iter().any(|i| i.name == *n))
        .collect();
    (!left.is_empty()).then(|| format!("{} still has {}", netns.name, left.join(", ")))
}

/// What is wrong with pod `name`'s `network-status` annotation: it must
/// list eth0, net1 and net2 in that order, each with an address of its
/// network.
fn status_wrong(api: &FakeApi, name: &str, pools: &[Pool; 3]) -> Option<String> {
    let Some(text) = api.network_status(POD_NS, name) else {
        return Some(format!("{name}: no network-status annotation"));
    };
    let Ok(Value::Array(entries)) = serde_json::from_str::<Value>(&text) else {
        return Some(format!("{name}: network-status is not a JSON list: {text}"));
    };
    let ok = entries.len() == 3
        && entries
            .iter()
            .zip(IFNAMES)
            .zip(pools)
            .all(|((e, ifname), pool)| {
                e["interface"] == ifname
                    && e["ips"].as_array().is_some_and(|ips| {
                        ips.iter()
                            .any(|ip| ip.as_str().is_some_and(|ip| pool.holds_ip(ip)))
                    })
            });
    (!ok).then(|| {
        format!(
            "{name}: network-status {}",
            text.split_whitespace().collect::<String>()
        )
    })
}

/// Kubernetes API requests of one herd, watches left out.
#[derive(Debug, Clone, Default)]
struct ApiCount {
    /// GETs of a collection (the caches' lists).
    lists: usize,
    /// GETs of one object.
    gets: usize,
    /// Every other method: PATCH, PUT, POST, DELETE.
    writes: usize,
    patches: usize,
    /// Pods whose status was patched exactly once.
    pods_one_patch: usize,
    /// Most PATCHes of one pod.
    most_patches: usize,
    /// Pod events posted (in the background, not counted as writes).
    events: usize,
}

fn count_api(calls: &[Logged], pods: &[(String, String)]) -> ApiCount {
    let mut c = ApiCount::default();
    let mut per_pod: HashMap<&str, usize> = HashMap::new();
    let prefix = format!("/api/v1/namespaces/{POD_NS}/pods/");
    for call in calls.iter().filter(|c| !c.is_watch()) {
        if call.is_event_post() {
            c.events += 1;
            continue;
        }
        if call.method == "GET" {
            if call.path.ends_with("/pods")
                || call.path.ends_with("/network-attachment-definitions")
            {
                c.lists += 1;
            } else {
                c.gets += 1;
            }
            continue;
        }
        c.writes += 1;
        if call.method == "PATCH" {
            c.patches += 1;
            if let Some(name) = call
                .path
                .strip_prefix(&prefix)
                .and_then(|p| p.strip_suffix("/status"))
            {
                *per_pod.entry(name).or_default() += 1;
            }
        }
    }
    c.pods_one_patch = pods
        .iter()
        .filter(|(name, _)| per_pod.get(name.as_str()) == Some(&1))
        .count();
    c.most_patches = per_pod.values().copied().max().unwrap_or(0);
    c
}

// ---------------------------------------------------------------------------
// One setting.

/// One side of one setting: its ADD and DEL herds.
#[derive(Default)]
struct SideRun {
    /// ADD, DEL.
    spans: [Option<Span>; 2],
    per_pod: [Samples; 2],
    fails: [Failures; 2],
    /// Failures that were CNI error code 11.
    code11: usize,
    /// CPU of the processes the bench ran (shims, or plugins), ADD and DEL.
    cpu_callers: [Duration; 2],
    /// Namespaces checked after the ADDs, and those that lacked an
    /// interface.
    checked: usize,
    attach: Failures,
    /// Namespaces still holding an interface after the DELs.
    leftover: Failures,
}

impl SideRun {
    fn note(&mut self, k: usize, span: Span, pods: &[(Duration, PodResult)]) {
        let what = ["ADD", "DEL"][k];
        self.spans[k] = Some(span);
        for (d, r) in pods {
            self.per_pod[k].push(*d);
            if let Some(f) = &r.failure {
                self.fails[k].note_msg(format!("{what}: {f}"));
                if r.code11 {
                    self.code11 += 1;
                }
            }
        }
    }

    /// Pods per second of the ADD (0) or DEL (1) herd: those whose call
    /// succeeded, over the herd's time.
    fn rate(&self, k: usize, pods: usize) -> Option<f64> {
        let done = pods.saturating_sub(self.fails[k].count);
        self.spans[k]
            .filter(|s| !s.wall.is_zero())
            .map(|s| done as f64 / s.wall.as_secs_f64())
    }
}

/// What the plexus side measured of plexusd itself.
#[derive(Default)]
struct DaemonRun {
    /// Why the figures of plexusd itself are missing, if they are.
    not_plexusd: Option<String>,
    /// From the herd's release to READY=1.
    ready: Option<Duration>,
    /// sd_notify datagrams plexusd sent (READY=1, STATUS=, STOPPING=1).
    notifications: usize,
    /// VmHWM after the herd.
    peak: Option<u64>,
    /// VmRSS [`RSS_AFTER`] seconds after the last DEL.
    rss_after: [Option<u64>; 4],
    /// plexusd's own CPU, and that of the plugins it ran, ADD and DEL.
    cpu_own: [Option<Duration>; 2],
    cpu_plugins: [Option<Duration>; 2],
    api: [ApiCount; 2],
    statuses: Failures,
    records_left: usize,
    /// How plexusd ended: SIGTERM after the herd, or before.
    end: String,
    /// Warnings and errors in its log (the first few).
    log_problems: Vec<String>,
    /// Plugin executions plexusd counted (`plexus_plugin_duration_seconds`):
    /// ADD, DEL, any other command.
    plugin_runs: Option<[usize; 3]>,
}

struct Measured {
    setting: Setting,
    /// `None`: the row shares the direct herd of the first row of its pod
    /// count ([`direct_of`]).
    direct: Option<SideRun>,
    plexus: SideRun,
    daemon: DaemonRun,
}

/// The direct herd row `m` is compared with: its own, or that of the
/// first row of its pod count.
fn direct_of<'a>(all: &'a [Measured], m: &'a Measured) -> Option<&'a SideRun> {
    m.direct.as_ref().or_else(|| {
        all.iter()
            .find(|x| x.setting.pods == m.setting.pods && x.direct.is_some())
            .and_then(|x| x.direct.as_ref())
    })
}

/// The pods whose namespaces are checked: every one, or [`CHECKED_PODS`]
/// evenly spread.
fn sample(n: usize) -> Vec<usize> {
    if n <= CHECKED_PODS {
        return (0..n).collect();
    }
    (0..CHECKED_PODS).map(|j| j * n / CHECKED_PODS).collect()
}

/// The herd's pods in the test API server, deleted on drop: the next cold
/// daemon lists only its own herd.
struct PodsInApi<'a> {
    api: &'a FakeApi,
    pods: Vec<(String, String)>,
}

impl Drop for PodsInApi<'_> {
    fn drop(&mut self) {
        for (name, _) in &self.pods {
            self.api.delete_pod(POD_NS, name);
        }
    }
}

fn run_setting(ctx: &Ctx<'_>, k: usize, s: Setting, with_direct: bool) -> Measured {
    let n = s.pods;
    let pods = PodsInApi {
        api: ctx.api,
        pods: (0..n)
            .map(|i| (format!("h{k}-{i}"), format!("uid-h{k}-{i}")))
            .collect(),
    };
    let annotations = json!({ NETWORKS_ANNOTATION: NADS.join(",") });
    for (name, uid) in &pods.pods {
        ctx.api
            .put_pod(POD_NS, name, uid, NODE, annotations.clone());
    }
    let direct_ns: Vec<Netns> = (0..if with_direct { n } else { 0 })
        .map(|_| Netns::new())
        .collect();
    let plexus_ns: Vec<Netns> = (0..n).map(|_| Netns::new()).collect();
    eprintln!("   {}", s.label());
    // The direct herd runs while plexusd, its herd done, sits idle
    // through the seconds its memory is watched.
    let (plexus, daemon, direct) = plexus_side(ctx, k, s, &pods.pods, &plexus_ns, || {
        with_direct.then(|| direct_side(ctx, k, &pods.pods, &direct_ns))
    });
    Measured {
        setting: s,
        direct,
        plexus,
        daemon,
    }
}

fn direct_side(ctx: &Ctx<'_>, k: usize, pods: &[(String, String)], netns: &[Netns]) -> SideRun {
    let n = pods.len();
    let mut r = SideRun::default();
    let cids: Vec<String> = (0..n).map(|i| format!("h{k}-direct-{i}")).collect();
    let args: Vec<String> = pods
        .iter()
        .zip(&cids)
        .map(|((name, uid), cid)| pod_args(name, uid, cid))
        .collect();
    let none = [None, None, None];
    let c0 = children_cpu();
    let (span, adds) = herd(n, |i| {
        direct_pod(ctx.nets, "ADD", &cids[i], &netns[i].path, &args[i], &none)
    });
    r.cpu_callers[0] = children_cpu().saturating_sub(c0);
    let mut prevs: Vec<AddResults> = Vec::with_capacity(n);
    let adds: Vec<(Duration, PodResult)> = adds
        .into_iter()
        .map(|(d, (r, p))| {
            prevs.push(p);
            (d, r)
        })
        .collect();
    r.note(0, span, &adds);
    let checked = sample(n);
    r.checked = checked.len();
    for why in check_all(&checked, |i| lacks(&netns[i], ctx.pools)) {
        r.attach.note_msg(why);
    }
    let c1 = children_cpu();
    let (span, dels) = herd(n, |i| {
        direct_pod(
            ctx.nets,
            "DEL",
            &cids[i],
            &netns[i].path,
            &args[i],
            &prevs[i],
        )
        .0
    });
    r.cpu_callers[1] = children_cpu().saturating_sub(c1);
    r.note(1, span, &dels);
    for why in check_all(&checked, |i| left_over(&netns[i])) {
        r.leftover.note_msg(why);
    }
    r
}

/// The shim's stdin as a runtime builds it from the packaged
/// `examples/cni/00-plexus.conflist` (its deadlines: `connectTimeout` 30s,
/// `timeout` 2m, under the kubelet's 2m runtime request timeout), with
/// `daemonSocketDir` pointed at `sock_dir`.
fn packaged_shim_stdin(sock_dir: &Path) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cni/00-plexus.conflist");
    let list: Value = serde_json::from_slice(&fs::read(&path).expect("read the packaged conflist"))
        .expect("the packaged conflist is JSON");
    let mut entry = list["plugins"][0].clone();
    entry["name"] = list["name"].clone();
    entry["cniVersion"] = list["cniVersion"].clone();
    entry["daemonSocketDir"] = json!(sock_dir);
    serde_json::to_vec(&entry).unwrap()
}

/// Whether process `pid` runs the plexusd under test.
fn is_plexusd(pid: i32) -> Result<(), String> {
    let exe = fs::read_link(format!("/proc/{pid}/exe"))
        .map_err(|e| format!("cannot read /proc/{pid}/exe: {e}"))?;
    let want = fs::canonicalize(PLEXUSD).unwrap_or_else(|_| PathBuf::from(PLEXUSD));
    if exe == want {
        Ok(())
    } else {
        Err(format!(
            "pid {pid} runs {}, not {}",
            exe.display(),
            want.display()
        ))
    }
}

/// A flag set when this is dropped (also when a scenario panics).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Reads `notify` as a service manager does, until `stop` is set: when
/// READY=1 arrived, and how many datagrams came.
fn read_notify(notify: UnixDatagram, stop: Arc<AtomicBool>) -> (Option<Instant>, usize) {
    let (mut ready, mut count) = (None, 0);
    if notify
        .set_read_timeout(Some(Duration::from_millis(20)))
        .is_err()
    {
        return (ready, count);
    }
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::SeqCst) {
        match notify.recv(&mut buf) {
            Ok(n) => {
                count += 1;
                if ready.is_none() && String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
                    ready = Some(Instant::now());
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
    }
    (ready, count)
}

/// The distinct WARN and ERROR lines of a plexusd log, without their
/// timestamps (the first few).
fn log_problems(path: &Path) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for l in fs::read_to_string(path).unwrap_or_default().lines() {
        let Some(at) = l.find(" WARN ").or_else(|| l.find(" ERROR ")) else {
            continue;
        };
        // Span fields (container ids, namespaces) cut, so that one cause
        // is one line.
        let mut line = String::new();
        let mut depth = 0;
        for ch in l[at..].trim().chars() {
            match ch {
                '{' => {
                    if depth == 0 {
                        line.push_str("{…}");
                    }
                    depth += 1;
                }
                '}' => depth = (depth - 1).max(0),
                c if depth == 0 => line.push(c),
                _ => {}
            }
        }
        let line: String = line.chars().take(300).collect();
        if !out.contains(&line) && out.len() < 5 {
            out.push(line);
        }
    }
    out
}

/// The API requests between two marks of the log.
fn api_between(api: &FakeApi, from: usize, to: usize) -> Vec<Logged> {
    let log = api.log();
    log[from.min(log.len())..to.min(log.len())].to_vec()
}

/// The plexus side of setting `s`; `meanwhile` runs once the DELs are
/// done, while plexusd sits idle and its memory is watched.
fn plexus_side<T>(
    ctx: &Ctx<'_>,
    k: usize,
    s: Setting,
    pods: &[(String, String)],
    netns: &[Netns],
    meanwhile: impl FnOnce() -> T,
) -> (SideRun, DaemonRun, T) {
    let n = pods.len();
    let (mut r, mut d) = (SideRun::default(), DaemonRun::default());
    let dir = ctx.engine.dir.join(&format!("herd-{k}"));
    let sock_dir = dir.join("sock");
    fs::create_dir_all(&sock_dir).expect("create the socket directory");
    let state = dir.join("state");
    let mut cfg = json!({
        "confDir": ctx.engine.conf_dir,
        "binDir": CNI_BIN,
        "stateDir": state,
        "clusterNetwork": ctx.nets[0].name,
        "logLevel": LOG_LEVEL,
        "socketDir": sock_dir,
        "kubeconfig": ctx.kubeconfig,
        "nodeName": NODE,
    });
    if let Some(l) = s.limit {
        cfg["connectionLimit"] = json!(l);
    }
    let cfg_path = dir.join("daemon-config.json");
    fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    let log_path = dir.join("plexusd.log");
    let log = File::create(&log_path).unwrap();
    let notify_path = dir.join("notify");
    let notify = UnixDatagram::bind(&notify_path).expect("bind the notify socket");
    let sock = sock_dir.join("plexus.sock");

    // systemd-socket-activate binds and listens, then waits for the first
    // connection and execs plexusd in its own place: the pid stays.
    let mut launcher = ChildGuard::new(
        Command::new("systemd-socket-activate")
            .arg("-l")
            .arg(&sock)
            .arg("--fdname=plexus")
            .arg(format!("--setenv=NOTIFY_SOCKET={}", notify_path.display()))
            .arg("--")
            .arg(PLEXUSD)
            .arg("--config")
            .arg(&cfg_path)
            .env_clear()
            .env("PATH", PLUGIN_PATH)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn systemd-socket-activate"),
    );
    let pid = launcher.pid();
    assert!(
        poll(Duration::from_secs(10), Duration::from_millis(1), || {
            unix_listening(&sock)
        }),
        "systemd-socket-activate never listened on {}",
        sock.display()
    );
    // Read until plexusd has stopped (it tells STOPPING=1 there): a
    // queue nobody reads fills up and loses datagrams.
    let stop_reading = SetOnDrop(Arc::new(AtomicBool::new(false)));
    let reader = {
        let stop = stop_reading.0.clone();
        thread::spawn(move || read_notify(notify, stop))
    };

    let cids: Vec<String> = (0..n).map(|i| format!("h{k}-plexus-{i}")).collect();
    let args: Vec<String> = pods
        .iter()
        .zip(&cids)
        .map(|((name, uid), cid)| pod_args(name, uid, cid))
        .collect();
    let stdin = packaged_shim_stdin(&sock_dir);
    let call = |command: &str, i: usize| {
        let env = call_env(command, &cids[i], &netns[i].path, IFNAMES[0], &args[i]);
        PodResult::of(&Call::new(shim(), env, stdin.clone()).run())
    };
    // The launcher's own CPU (a few ms before the exec) stays out.
    let cpu = || proc_cpu(pid);
    let mark0 = ctx.api.mark();
    let (cpu0, c0) = (cpu(), children_cpu());
    let (add_span, adds) = herd(n, |i| call("ADD", i));
    let (cpu1, c1) = (cpu(), children_cpu());
    r.cpu_callers[0] = c1.saturating_sub(c0);
    r.note(0, add_span, &adds);
    d.not_plexusd = is_plexusd(pid).err();

    let checked = sample(n);
    r.checked = checked.len();
    for why in check_all(&checked, |i| lacks(&netns[i], ctx.pools)) {
        r.attach.note_msg(why);
    }
    let every: Vec<usize> = (0..n).collect();
    for why in check_all(&every, |i| status_wrong(ctx.api, &pods[i].0, ctx.pools)) {
        d.statuses.note_msg(why);
    }

    let (cpu2, c2, mark2) = (cpu(), children_cpu(), ctx.api.mark());
    let (del_span, dels) = herd(n, |i| call("DEL", i));
    let (cpu3, c3, mark3) = (cpu(), children_cpu(), ctx.api.mark());
    r.cpu_callers[1] = c3.saturating_sub(c2);
    r.note(1, del_span, &dels);
    let sampler = thread::spawn(move || {
        RSS_AFTER.map(|s| {
            let at = del_span.end + Duration::from_secs(s);
            thread::sleep(at.saturating_duration_since(Instant::now()));
            status_kib(pid, "VmRSS")
        })
    });
    // Meanwhile (plexusd is idle): what the DELs left, and `meanwhile`.
    for why in check_all(&checked, |i| left_over(&netns[i])) {
        r.leftover.note_msg(why);
    }
    let other = meanwhile();
    d.rss_after = sampler.join().expect("RSS sampler panicked");
    d.peak = status_kib(pid, "VmHWM");
    let metrics = metrics_text(&sock);
    let runs = |cmd: &str| {
        metric(
            &metrics,
            "plexus_plugin_duration_seconds_count",
            &[&format!("command=\"{cmd}\"")],
        )
        .unwrap_or(0.0) as usize
    };
    let all_runs =
        metric(&metrics, "plexus_plugin_duration_seconds_count", &[]).unwrap_or(0.0) as usize;
    d.plugin_runs = (!metrics.is_empty()).then(|| {
        let (add, del) = (runs("ADD"), runs("DEL"));
        [add, del, all_runs.saturating_sub(add + del)]
    });
    if d.not_plexusd.is_some() {
        d.peak = None;
        d.rss_after = [None; 4];
    }
    let diff = |a: Option<(Duration, Duration)>, b: Option<(Duration, Duration)>| match (a, b) {
        (Some(a), Some(b)) if d.not_plexusd.is_none() => {
            (Some(b.0.saturating_sub(a.0)), Some(b.1.saturating_sub(a.1)))
        }
        _ => (None, None),
    };
    (d.cpu_own[0], d.cpu_plugins[0]) = diff(cpu0, cpu1);
    (d.cpu_own[1], d.cpu_plugins[1]) = diff(cpu2, cpu3);
    d.api = [
        // Through the checks: an ADD whose client gave up may still write.
        count_api(&api_between(ctx.api, mark0, mark2), pods),
        count_api(&api_between(ctx.api, mark2, mark3), pods),
    ];

    let exited = launcher.child().try_wait().ok().flatten();
    d.end = match exited {
        Some(st) => format!("**exited during the herd** ({st})"),
        None => {
            let (t, code) = launcher.stop_timed(libc::SIGTERM, Duration::from_secs(15));
            match code {
                Some(0) => format!("exit 0, {} after SIGTERM", fmt_ms(Some(t))),
                c => format!("**exit {c:?}**, {} after SIGTERM", fmt_ms(Some(t))),
            }
        }
    };
    drop(stop_reading);
    let (ready, notifications) = reader.join().expect("notify reader panicked");
    d.ready = ready.map(|t| t.saturating_duration_since(add_span.start()));
    d.notifications = notifications;
    d.records_left = list_dir(&state.join("attachments")).len();
    d.log_problems = log_problems(&log_path);
    (r, d, other)
}

// ---------------------------------------------------------------------------
// The scenario and its report.

/// Raises the soft RLIMIT_NOFILE towards `want` within the hard limit: a
/// herd holds pipes of every pod's process in the bench, and plexusd
/// inherits the limit (through systemd-socket-activate) as it inherits the
/// unit's `LimitNOFILE=`. The limit before and after.
fn raise_nofile(want: u64) -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return (0, 0);
    }
    let before = lim.rlim_cur;
    let wanted = want.min(lim.rlim_max);
    if wanted > before {
        let new = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own; a soft limit within
        // the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            return (before, wanted);
        }
    }
    (before, before)
}

/// `PLEXUS_BENCH_HERDS`, e.g. `250:unset,4,16 1000:4`: herds of pods,
/// each with its `connectionLimit` settings (`unset`: the key left out).
fn parse_herds(spec: &str) -> Vec<Setting> {
    let mut out = Vec::new();
    for herd in spec.split_whitespace() {
        let (pods, limits) = herd
            .split_once(':')
            .unwrap_or_else(|| panic!("PLEXUS_BENCH_HERDS: {herd:?} is not pods:limit,..."));
        let pods: usize = pods
            .parse()
            .unwrap_or_else(|_| panic!("PLEXUS_BENCH_HERDS: {pods:?} is no pod count"));
        for limit in limits.split(',') {
            let limit = match limit {
                "unset" => None,
                n => Some(
                    n.parse()
                        .unwrap_or_else(|_| panic!("PLEXUS_BENCH_HERDS: {n:?} is no limit")),
                ),
            };
            out.push(Setting { pods, limit });
        }
    }
    out
}

fn have_socket_activate() -> bool {
    Command::new("systemd-socket-activate")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn herd_after_reboot(sec: &mut Section, c: &Counts) {
    let started = Instant::now();
    let herds = if c.quick { QUICK_HERDS } else { HERDS };
    let settings: Vec<Setting> = match std::env::var("PLEXUS_BENCH_HERDS") {
        Ok(spec) => parse_herds(&spec),
        Err(_) => herds
            .iter()
            .flat_map(|&(pods, limits)| limits.iter().map(move |&limit| Setting { pods, limit }))
            .collect(),
    };
    if !have_socket_activate() {
        sec.para("Skipped: `systemd-socket-activate` (Debian package systemd) is not installed.");
        return;
    }
    let most = settings.iter().map(|s| s.pods).max().unwrap_or(1);
    let (nofile_before, nofile) = raise_nofile(UNIT_NOFILE);
    // Built (if need be) before anything is timed.
    let _ = shim();

    let engine = Engine::new("bench-herd");
    let bridges = [Link::bridge(), Link::bridge(), Link::bridge()];
    let pools: [Pool; 3] = std::array::from_fn(|_| Pool::new(most));
    let nets = [
        Network::bridge(&bridges[0].name, pools[0].ipam(&engine)),
        Network::bridge(&bridges[1].name, pools[1].ipam(&engine)).renamed(
            "herd-net-a",
            "herd-a.conflist",
            IFNAMES[1],
        ),
        Network::bridge(&bridges[2].name, pools[2].ipam(&engine)).renamed(
            "herd-net-b",
            "herd-b.conflist",
            IFNAMES[2],
        ),
    ];
    // confDir holds the cluster network only; the others are NADs.
    write_network(&engine, &nets[0]);
    let api = FakeApi::start();
    for (nad, net) in NADS.iter().zip(&nets[1..]) {
        api.put_nad(POD_NS, nad, Some(&net.config.to_string()), json!({}));
    }
    let kubeconfig = engine.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let ctx = Ctx {
        engine: &engine,
        api: &api,
        nets: &nets,
        pools: &pools,
        kubeconfig,
    };

    sec.para(&format!(
        "What a node's reboot does to the CNI plugin: the runtime brings every pod's sandbox \
         back at once, and plexusd is not running yet. `systemd-socket-activate -l <sock> \
         --fdname=plexus -- plexusd --config <cfg>` holds the listening socket as \
         `plexusd.socket` does at boot and execs plexusd in its own place (same pid, checked \
         through /proc/<pid>/exe) on the herd's first connection; the rest of the herd waits in \
         the listen backlog. plexusd runs in Kubernetes mode (`kubeconfig`, `nodeName`) against \
         the test API server in the bench process (plain HTTP on 127.0.0.1), which holds the \
         herd's pods, all on this node and stored before the daemon starts, and the \
         NetworkAttachmentDefinitions `{POD_NS}/{}` and `{POD_NS}/{}`; every other key is left \
         at its default, as the packaged daemon-config.json leaves it, but `connectionLimit` \
         per row. Each pod has the annotation `{NETWORKS_ANNOTATION}: {}`, a network namespace \
         of its own and CNI_ARGS of its own pod: three attachments, each `bridge` (a bridge of \
         its own made beforehand, no isGateway/ipMasq) + `host-local` (one range set of /24s, \
         dataDir in a temp dir): the cluster network `{}` from confDir as `eth0` on {}, `{}` \
         as `net1` on {}, `{}` as `net2` on {}.",
        NADS[0],
        NADS[1],
        NADS.join(","),
        nets[0].name,
        pools[0].cidrs(),
        NADS[0],
        pools[1].cidrs(),
        NADS[1],
        pools[2].cidrs(),
    ));
    sec.para(&format!(
        "`plexus`: one plexus-shim ({}) per pod with the packaged \
         `examples/cni/00-plexus.conflist` as its configuration (`connectTimeout` 30s, \
         `timeout` 2m), every pod at once (a thread per pod, all released together once all \
         are started); the herd's time runs from the release to the \
         last exit, so the ADD's includes plexusd's start and its caches' first lists. Once \
         every ADD has returned, every DEL at once. `direct`: per pod, the three plugin \
         executions plexusd makes (ADD `eth0`, `net1`, `net2`; DEL in reverse order with each \
         ADD's result as `prevResult`) with the environment and stdin plexusd gives them and \
         the pod's CNI_ARGS, every pod at once on a thread of its own: the same plugin work \
         with the same concurrency, no daemon. A cold plexusd with a fresh stateDir for each \
         row, and fresh namespaces for each side. The direct herd of a row runs right after \
         its plexus herd, while plexusd sits idle through the seconds its memory is watched \
         (no request reaches it then). After the ADDs the bench checks every pod's namespace (eth0, net1 and net2 \
         with addresses in their ranges) and every pod's network-status annotation, after the \
         DELs that the namespaces hold none of the three. Soft RLIMIT_NOFILE of the bench, \
         which plexusd inherits: {nofile} (was {nofile_before}; the unit sets \
         `LimitNOFILE={UNIT_NOFILE}`).",
        shim_kind()
    ));

    let mut measured = Vec::new();
    let mut incomplete = Vec::new();
    for (k, s) in settings.iter().enumerate() {
        let first_of_count = !settings[..k].iter().any(|x| x.pods == s.pods);
        let with_direct = first_of_count || s.pods <= DIRECT_PER_ROW_MAX_PODS;
        match panic::catch_unwind(AssertUnwindSafe(|| run_setting(&ctx, k, *s, with_direct))) {
            Ok(m) => measured.push(m),
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "(no message)".into());
                incomplete.push(format!(
                    "**{} did not complete:** {}",
                    s.label(),
                    msg.lines().take(6).collect::<Vec<_>>().join(" ")
                ));
            }
        }
    }
    report::report(sec, &measured);
    for p in incomplete {
        sec.para(&p);
    }
    sec.para(&format!(
        "The test API server answers from memory over loopback, without TLS, authentication, \
         admission or an etcd write, and its lists hold only this node's herd: against a real \
         API server the daemon's start (its caches' first lists) and every ADD's PATCH take \
         longer. This scenario took {:.0} s; the plugins' own work bounds it (the herds and \
         pod counts are the constants `HERDS` and `QUICK_HERDS` of \
         benches/support/scenario_herd.rs).",
        started.elapsed().as_secs_f64()
    ));
    drop(ctx);
    drop(api);
}
