//! The node of a chaos run: the test API server with the pods' namespace
//! and two NetworkAttachmentDefinitions, plexusd in Kubernetes mode under
//! socket activation (the test holds the listening socket, as systemd
//! does, and hands it to each plexusd it starts: a killed daemon's
//! successor serves the same socket), its `stateDir` a small tmpfs that
//! can be filled, Debian's containerd calling plexus-shim, and three
//! networks of Debian's plugins:
//!
//! * `cluster` (eth0): bridge + host-local + portmap (host ports);
//! * `net-a` (net1) and `net-b` (net2), the NADs `nad-a` and `nad-b`:
//!   bridge + host-local.
//!
//! The plugins plexusd runs are wrappers (in its first `binDir`) that run
//! Debian's plugin, unless the injector left an order for the next call
//! of that plugin: fail (a CNI error), hang (past `pluginTimeout`), or be
//! killed a few milliseconds in ([`PluginOrder`]).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, list_dir, Engine, SYSTEM_PLUGINS};
use crate::support::containerd::Containerd;
use crate::support::daemon::Daemon;
use crate::support::kube::FakeApi;
use crate::support::netns::{Link, Subnet};
use crate::support::tmpfs::Tmpfs;

/// The pods' namespace.
pub const NS: &str = "chaos";
/// The annotation every pod carries: both NADs.
pub const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
pub const SELECTION: &str = "nad-a,nad-b";
/// The networks by interface: (ifname, network name).
pub const NETS: [(&str, &str); 3] = [("eth0", "cluster"), ("net1", "net-a"), ("net2", "net-b")];
/// Plugins with a wrapper.
pub const WRAPPED: [&str; 3] = ["bridge", "host-local", "portmap"];
/// plexusd's `pluginTimeout`: a hung plugin is killed after it.
pub const PLUGIN_TIMEOUT: &str = "3s";

/// An order for the next call (ADD or DEL) of one plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginOrder {
    /// Answer a CNI error.
    Fail,
    /// Sleep past `pluginTimeout`.
    Hang,
    /// Run the real plugin and SIGKILL it (and the wrapper) after this
    /// many milliseconds.
    Kill(u64),
}

/// The wrapper of one plugin (POSIX sh). It takes the order by renaming
/// it (one caller gets it), reads it, and acts; VERSION and every call
/// without an order run the real plugin. `exec 3<&0` keeps the call's
/// stdin for the real plugin run in the background (an asynchronous
/// command's stdin is /dev/null otherwise).
fn wrapper(real: &Path, orders: &Path, name: &str) -> String {
    format!(
        r#"#!/bin/sh
real={real}
order={orders}/{name}
case "$CNI_COMMAND" in ADD|DEL) ;; *) exec "$real" ;; esac
taken="$order.$$"
mv "$order" "$taken" 2>/dev/null || exec "$real"
what=$(cat "$taken"); rm -f "$taken"
case "$what" in
fail) printf '{{"cniVersion":"1.0.0","code":999,"msg":"injected failure of {name} %s"}}\n' "$CNI_COMMAND"; exit 1 ;;
hang) exec sleep 60 ;;
kill*) exec 3<&0; "$real" <&3 3<&- & pid=$!; sleep "${{what#kill }}"; kill -9 "$pid"; kill -9 $$ ;;
esac
exec "$real"
"#,
        real = real.display(),
        orders = orders.display(),
    )
}

/// The node; see the module documentation. Fields drop in order:
/// containerd (its sandboxes removed through plexusd), plexusd, the
/// socket, the API server, the state tmpfs, the directories, the links.
pub struct Node {
    pub ctd: Containerd,
    daemon: Mutex<Option<Daemon>>,
    listener: UnixListener,
    pub sock: PathBuf,
    pub api: FakeApi,
    pub state: Tmpfs,
    pub engine: Engine,
    pub subnets: [Subnet; 3],
    pub bridges: [Link; 3],
    /// Where the injector leaves orders for the wrappers.
    pub orders: PathBuf,
    config: Value,
    /// plexusd starts so far (the first is 1).
    starts: AtomicUsize,
}

impl Node {
    /// A node whose containerd already calls plexus-shim and whose first
    /// plexusd is ready.
    pub fn new(tag: &str) -> Node {
        let api = FakeApi::start();
        let engine = Engine::new(tag);
        let state = Tmpfs::mount(&engine.state_dir, Some("4m"));
        let subnets = [Subnet::new(), Subnet::new(), Subnet::new()];
        let bridges = [Link::bridge(), Link::bridge(), Link::bridge()];
        let orders = engine.dir.join("orders");
        fs::create_dir_all(&orders).unwrap();
        for name in WRAPPED {
            let path = engine.bin_dir.join(name);
            fs::write(
                &path,
                wrapper(&Path::new(SYSTEM_PLUGINS).join(name), &orders, name),
            )
            .unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        write_networks(&engine, &api, &subnets, &bridges);
        let ctd = Containerd::start(&engine.dir, "ctd");
        let sock_dir = engine.dir.join("sock");
        fs::create_dir_all(&sock_dir).unwrap();
        let sock = sock_dir.join("plexus.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let mut config = engine.config("cluster", PLUGIN_TIMEOUT);
        api.configure(&engine.dir, &mut config, "5s");
        config["cleanupRetryInterval"] = json!("500ms");
        config["criSocket"] = json!(ctd.sock);
        config["reconcileInterval"] = json!("2s");
        config["reconcileGrace"] = json!("10s");
        let node = Node {
            ctd,
            daemon: Mutex::new(None),
            listener,
            sock,
            api,
            state,
            engine,
            subnets,
            bridges,
            orders,
            config,
            starts: AtomicUsize::new(0),
        };
        node.start_daemon();
        node.wait_ready(Duration::from_secs(30));
        node.ctd
            .use_plexus_with(&sock_dir, json!({"capabilities": {"portMappings": true}}));
        node
    }

    /// The running plexusd (None between a kill and the next start).
    pub fn daemon(&self) -> MutexGuard<'_, Option<Daemon>> {
        self.daemon.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// plexusd's pid, if one runs.
    pub fn pid(&self) -> Option<i32> {
        self.daemon().as_ref().map(Daemon::pid)
    }

    pub fn starts(&self) -> usize {
        self.starts.load(Ordering::SeqCst)
    }

    /// Starts a plexusd on the held socket (not waiting for READY=1: a
    /// service manager does not either), replacing the one there was
    /// (which must have exited).
    pub fn start_daemon(&self) {
        let n = self.starts.fetch_add(1, Ordering::SeqCst);
        let d = Daemon::start_activated(
            &self.engine.dir,
            &format!("d{n}"),
            self.config.clone(),
            &self.listener,
            &self.sock,
        );
        *self.daemon() = Some(d);
    }

    /// Waits until the running plexusd has said READY=1.
    pub fn wait_ready(&self, timeout: Duration) {
        if let Some(d) = self.daemon().as_mut() {
            d.wait_notify("READY=1", timeout);
        }
    }

    /// Starts plexusd again if it exited by itself (as `Restart=` would);
    /// whether it had.
    pub fn revive(&self) -> bool {
        let mut slot = self.daemon();
        let exited = slot.as_mut().is_some_and(|d| !d.running());
        if exited {
            slot.take();
            drop(slot);
            self.start_daemon();
        }
        exited
    }

    /// SIGKILLs plexusd and starts the next one at once (as
    /// `Restart=always` would).
    pub fn kill_daemon(&self) {
        let mut slot = self.daemon();
        if let Some(mut d) = slot.take() {
            d.signal(libc::SIGKILL);
            d.wait_exit(Duration::from_secs(10));
        }
        drop(slot);
        self.start_daemon();
    }

    /// SIGTERMs plexusd, waits for its exit (its drain), starts the next.
    /// How it exited, when not cleanly (with the end of its log). A
    /// plexusd that had not said READY=1 yet may die of the signal: it had
    /// taken no call, and systemd counts a SIGTERM death as a clean stop.
    pub fn restart_daemon(&self) -> Result<(), String> {
        let mut slot = self.daemon();
        let unclean = slot.take().and_then(|mut d| {
            let was_ready = d.notifications().iter().any(|n| n.contains("READY=1"));
            d.terminate();
            let st = d.wait_exit(Duration::from_secs(60));
            if !was_ready && st.signal() == Some(libc::SIGTERM) {
                return None;
            }
            let log = d.log_text();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            (!st.success()).then(|| format!("{st}; its log ends:\n{}", tail.join("\n")))
        });
        drop(slot);
        self.start_daemon();
        unclean.map_or(Ok(()), Err)
    }

    /// Every plexusd's log so far, in start order.
    pub fn daemon_logs(&self) -> String {
        (0..self.starts())
            .map(|n| {
                fs::read_to_string(self.engine.dir.join(&format!("d{n}.log"))).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Leaves `order` for the next ADD or DEL of `plugin`.
    pub fn order(&self, plugin: &str, order: PluginOrder) {
        let text = match order {
            PluginOrder::Fail => "fail".to_string(),
            PluginOrder::Hang => "hang".to_string(),
            PluginOrder::Kill(ms) => format!("kill {}.{:03}", ms / 1000, ms % 1000),
        };
        let tmp = self.orders.join(format!(".{plugin}.tmp"));
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, self.orders.join(plugin)).unwrap();
    }

    /// Takes back the orders no call took.
    pub fn clear_orders(&self) {
        for f in list_dir(&self.orders) {
            let _ = fs::remove_file(self.orders.join(f));
        }
    }

    /// The addresses host-local has reserved for network `net`, with the
    /// container holding each: (address, container id).
    pub fn reservations(&self, net: &str) -> Vec<(String, String)> {
        let dir = self.engine.ipam_dir.join(net);
        list_dir(&dir)
            .into_iter()
            .filter(|f| f.parse::<std::net::IpAddr>().is_ok())
            .filter_map(|f| {
                let text = fs::read_to_string(dir.join(&f)).ok()?;
                let id = text.lines().next().unwrap_or("").trim().to_string();
                Some((f, id))
            })
            .collect()
    }

    /// plexusd's per-container lock files (not the GC lock).
    pub fn lock_files(&self) -> Vec<String> {
        list_dir(&self.engine.state_dir.join("locks"))
            .into_iter()
            .filter(|f| f != ".gc.lock")
            .collect()
    }
}

/// The cluster network in plexusd's confDir; the NADs' networks in the
/// API server, with the pods' namespace.
fn write_networks(engine: &Engine, api: &FakeApi, subnets: &[Subnet; 3], bridges: &[Link; 3]) {
    let cluster = conflist(
        "cluster",
        "1.0.0",
        vec![
            bridge(&bridges[0].name, engine.host_local(&subnets[0])),
            json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
        ],
    );
    engine.write_network("10-cluster.conflist", &cluster);
    for (i, (nad, net)) in [("nad-a", "net-a"), ("nad-b", "net-b")]
        .into_iter()
        .enumerate()
    {
        let b = bridge(&bridges[i + 1].name, engine.host_local(&subnets[i + 1]));
        let config = conflist(net, "1.0.0", vec![b]).to_string();
        api.put_nad(NS, nad, Some(&config), json!({}));
    }
}
