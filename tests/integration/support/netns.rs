//! Network namespaces, host links and subnets for tests that run real CNI
//! plugins. Every namespace and link is removed on drop (also when the test
//! panics); names and subnets are unique per process and per call, so tests
//! in parallel and reruns after a crashed run never clash.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use serde_json::Value;

static NAMES: AtomicU32 = AtomicU32::new(0);
static SUBNETS: AtomicU32 = AtomicU32::new(0);
/// Bridges made by [`Link::bridge`], for their MACs.
static BRIDGES: AtomicU32 = AtomicU32::new(0);
/// `ip netns add` mounts `/run/netns` on first use; concurrent first uses
/// can race, so namespaces are created one at a time.
static NETNS_LOCK: Mutex<()> = Mutex::new(());

fn base36(mut n: u32, width: usize) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    while n > 0 {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
    }
    while out.len() < width {
        out.push(b'0');
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

/// A link or namespace name unique per process and call:
/// `plx<kind><pid, 5 base-36 digits><counter>`, at most 15 bytes.
pub fn unique_name(kind: &str) -> String {
    assert!(kind.len() <= 2, "kind {kind:?} too long");
    let n = NAMES.fetch_add(1, Ordering::Relaxed);
    let name = format!("plx{kind}{}{}", base36(std::process::id(), 5), base36(n, 1));
    assert!(name.len() <= 15, "{name} is longer than IFNAMSIZ-1");
    name
}

/// Runs `ip` with `args`.
pub fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip {args:?}: {e}"))
}

/// Runs `ip` with `args` and returns stdout; panics on failure.
pub fn ip_ok(args: &[&str]) -> String {
    let out = ip(args);
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A /24 of 10.0.0.0/8 unique per process and call:
/// `10.(100 + pid % 100).(counter).0/24`, skipping prefixes that already
/// have host routes or addresses (leftovers of a crashed run).
#[derive(Debug, Clone)]
pub struct Subnet {
    /// The first three octets, e.g. `10.142.7`.
    pub prefix: String,
}

impl Subnet {
    pub fn new() -> Self {
        let second = 100 + std::process::id() % 100;
        for _ in 0..256 {
            let third = SUBNETS.fetch_add(1, Ordering::Relaxed) % 256;
            let s = Subnet {
                prefix: format!("10.{second}.{third}"),
            };
            let cidr = s.cidr();
            let routes = ip(&["-4", "route", "show", "root", &cidr]);
            let addrs = ip(&["-4", "-o", "addr", "show", "to", &cidr]);
            if routes.stdout.is_empty() && addrs.stdout.is_empty() {
                return s;
            }
        }
        panic!("no free 10.{second}.x.0/24 left on this host");
    }

    /// e.g. `10.142.7.0/24`.
    pub fn cidr(&self) -> String {
        format!("{}.0/24", self.prefix)
    }

    /// Whether `address` (e.g. `10.142.7.2/24`) is a host address of this
    /// subnet with a /24 prefix.
    pub fn holds(&self, address: &str) -> bool {
        address
            .strip_prefix(&format!("{}.", self.prefix))
            .and_then(|rest| rest.strip_suffix("/24"))
            .and_then(|host| host.parse::<u8>().ok())
            .is_some_and(|h| (2..255).contains(&h))
    }
}

impl Default for Subnet {
    fn default() -> Self {
        Self::new()
    }
}

/// One interface as `ip -j addr show` reports it.
#[derive(Debug, Clone)]
pub struct Iface {
    pub name: String,
    /// Administratively up (`UP` in flags).
    pub up: bool,
    /// Every address as `address/prefixlen`.
    pub addrs: Vec<String>,
}

impl Iface {
    pub fn has_addr(&self, addr: &str) -> bool {
        self.addrs.iter().any(|a| a == addr)
    }
}

/// Parses the JSON `ip -j addr show` prints.
pub fn parse_addr_json(text: &str) -> Vec<Iface> {
    let v: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("ip -j addr output is not JSON ({e}): {text}"));
    v.as_array()
        .unwrap_or_else(|| panic!("ip -j addr output is not an array: {text}"))
        .iter()
        .filter(|i| i.get("ifname").is_some())
        .map(|i| Iface {
            name: i["ifname"].as_str().unwrap_or_default().to_string(),
            up: i["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "UP")),
            addrs: i["addr_info"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| {
                            Some(format!("{}/{}", x["local"].as_str()?, x["prefixlen"]))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// A network namespace under `/run/netns`, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
    /// `/run/netns/<name>`, the value for `CNI_NETNS`.
    pub path: String,
}

impl Netns {
    pub fn new() -> Self {
        let name = unique_name("n");
        let _guard = NETNS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // A crashed earlier run with the same pid may have left it.
        let _ = ip(&["netns", "del", &name]);
        ip_ok(&["netns", "add", &name]);
        Netns {
            path: format!("/run/netns/{name}"),
            name,
        }
    }

    /// Every interface in the namespace with its addresses.
    pub fn ifaces(&self) -> Vec<Iface> {
        parse_addr_json(&ip_ok(&["-n", &self.name, "-j", "addr", "show"]))
    }

    /// The interface `name`, if the namespace has it.
    pub fn iface(&self, name: &str) -> Option<Iface> {
        self.ifaces().into_iter().find(|i| i.name == name)
    }

    pub fn has_link(&self, name: &str) -> bool {
        self.iface(name).is_some()
    }

    /// Deletes link `name` inside the namespace; panics if that fails.
    pub fn del_link(&self, name: &str) {
        ip_ok(&["-n", &self.name, "link", "del", name]);
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _guard = NETNS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A host link deleted on drop (with a veth, its peer goes too).
#[derive(Debug)]
pub struct Link {
    pub name: String,
    /// The other end, for a veth pair.
    pub peer: Option<String>,
}

impl Link {
    /// Guards a link someone else creates later under `name` (e.g. the
    /// bridge the bridge plugin makes and never deletes).
    pub fn adopt(name: String) -> Self {
        let _ = ip(&["link", "del", &name]);
        Link { name, peer: None }
    }

    /// A fresh name for a link a plugin will create, guarded.
    pub fn planned(kind: &str) -> Self {
        Self::adopt(unique_name(kind))
    }

    /// A new bridge, up, without addresses, with a MAC set explicitly: a
    /// bridge whose MAC the kernel assigned takes the lowest MAC among its
    /// ports, so it changes as veths come and go, and the bridge plugin's
    /// CHECK then fails for every other container ("Bridge interface ...
    /// Mac doesn't match"). The MAC is unique per process and bridge (for
    /// the first 256 bridges of a process: every test of the binary shares
    /// the count, so it counts bridges only, not every name).
    pub fn bridge() -> Self {
        let l = Self::planned("b");
        let n = BRIDGES.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let mac = format!(
            "02:70:{:02x}:{:02x}:{:02x}:{:02x}",
            (pid >> 16) & 0xff,
            (pid >> 8) & 0xff,
            pid & 0xff,
            n & 0xff
        );
        ip_ok(&["link", "add", &l.name, "type", "bridge"]);
        ip_ok(&["link", "set", &l.name, "address", &mac]);
        ip_ok(&["link", "set", &l.name, "up"]);
        l
    }

    /// A new veth pair, both ends up; `name` is one end, `peer` the other.
    pub fn veth() -> Self {
        let mut l = Self::planned("v");
        let peer = unique_name("p");
        let _ = ip(&["link", "del", &peer]);
        ip_ok(&[
            "link", "add", &l.name, "type", "veth", "peer", "name", &peer,
        ]);
        l.peer = Some(peer.clone());
        ip_ok(&["link", "set", &l.name, "up"]);
        ip_ok(&["link", "set", &peer, "up"]);
        l
    }

    /// A dummy link, up; a veth pair where the kernel has no `dummy`.
    pub fn dummy_or_veth() -> Self {
        let l = Self::planned("d");
        if ip(&["link", "add", &l.name, "type", "dummy"])
            .status
            .success()
        {
            ip_ok(&["link", "set", &l.name, "up"]);
            return l;
        }
        drop(l);
        Self::veth()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.name]);
        if let Some(p) = &self.peer {
            let _ = ip(&["link", "del", p]);
        }
    }
}

/// Whether the host (the test's namespace) has a link `name`.
pub fn host_link_exists(name: &str) -> bool {
    ip(&["link", "show", "dev", name]).status.success()
}

/// The links enslaved to bridge `bridge` on the host; panics if the bridge
/// does not exist.
pub fn bridge_ports(bridge: &str) -> Vec<String> {
    assert!(host_link_exists(bridge), "bridge {bridge} does not exist");
    let text = ip_ok(&["-j", "link", "show", "master", bridge]);
    if text.trim().is_empty() {
        return Vec::new();
    }
    let v: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("ip -j link output is not JSON ({e}): {text}"));
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l["ifname"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Every interface of `ns` but lo, each with its addresses, sorted by name.
pub fn interfaces(ns: &Netns) -> Vec<(String, Vec<String>)> {
    let mut v: Vec<(String, Vec<String>)> = ns
        .ifaces()
        .into_iter()
        .filter(|i| i.name != "lo")
        .map(|i| (i.name, i.addrs))
        .collect();
    v.sort();
    v
}
