//! multus's `default-route` for a pod's ADD: which network owns the pod's
//! default route(s), and the route changes inside the pod's network
//! namespace that follow from it.
//!
//! The rules follow multus's (`CheckGatewayConfig` and `CmdAdd`), per
//! address family:
//!
//! - Without a `default-route` key on any selection element, nothing here
//!   happens: whatever the plugins installed stays.
//! - More than one IPv4 or more than one IPv6 gateway in total fails the
//!   ADD before any plugin runs ([`plan`]).
//! - A family some element asks a gateway of belongs to that element's
//!   network: every other network whose result shows interfaces or IPs
//!   loses its default routes of that family on its interface in the pod,
//!   and the owner's default routes of that family are replaced by one via
//!   the requested gateway (one that already exists is fine).
//! - `[]` on an element removes that network's own default routes (both
//!   families).
//!
//! The elements are those of the networks annotation and of the
//! default-network annotation (its element carries the key to the network
//! that replaces the cluster network, as multus's delegate loading does);
//! clusterNetwork and defaultNetworks have no element, so no key.
//!
//! Where Plexus differs from multus, deliberately:
//!
//! - multus marks every network for both families as soon as any element
//!   has the key, so a request for an IPv6 gateway also strips every IPv4
//!   default route, and `[]` on one network strips the default routes of
//!   all of them. Plexus touches a family only where an element asked for
//!   a gateway of it, and `[]` only the network it is on.
//!
//! - multus edits routes after each network's ADD, before the next one
//!   runs; Plexus runs all networks first, then removes the default routes
//!   of every affected interface, then adds the requested ones. The final
//!   routes are the same, and a default route a later network's plugin
//!   installed can never make the requested one fail with "exists".
//! - multus also edits its libcni cache copy of each result; Plexus keeps
//!   no such cache (its records hold what DEL needs, and DEL does not look
//!   at routes), so there is nothing to edit. As in multus, the result
//!   returned to the runtime is not modified.
//!
//! The changes are made with `nsenter --net=<CNI_NETNS> ip route ...`
//! (util-linux and iproute2, on every node), each run as a plugin is run
//! (a process group of its own, killed with it at a deadline, killed before
//! it is reaped): no shell, a clean environment, the interface name
//! checked by the interface-name rules and each gateway passed as a parsed
//! address. A separate process keeps the daemon's own threads out of the
//! pod's namespace: a thread that entered it and failed to come back would
//! run later work in the wrong namespace.

use std::fmt;
use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::cni::exec;
use crate::names;

/// How long one `ip` command may take before it is killed.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Where `nsenter` and `ip` are looked for.
const SEARCH_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// At most this much of a command's stderr goes into an error.
const MAX_STDERR: usize = 400;

/// multus's meaning when more than one gateway of a family is requested.
pub const ECMP_MESSAGE: &str = "multus does not support ECMP for default-route";

/// One network's part in the default-route handling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marks {
    /// Its default IPv4 routes are removed (another network owns IPv4's,
    /// its own element says `[]`, or it owns IPv4's and they are replaced).
    pub filter_v4: bool,
    /// The same for IPv6.
    pub filter_v6: bool,
    /// The gateways asked of it, in the element's order.
    pub gateways: Vec<IpAddr>,
}

/// More than one gateway of a family was requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ecmp {
    pub v4: usize,
    pub v6: usize,
}

impl fmt::Display for Ecmp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{ECMP_MESSAGE}: the selection elements ask for {} IPv4 and {} IPv6 default-route \
             gateways in total, at most one of each is allowed",
            self.v4, self.v6
        )
    }
}

impl std::error::Error for Ecmp {}

/// The marks of each network, in order, from each one's `default-route`
/// (`None`: the element has no such key, or the network has no element).
/// `Ok(None)`: no key anywhere, so no routes are touched.
pub fn plan(requests: &[Option<&[IpAddr]>]) -> Result<Option<Vec<Marks>>, Ecmp> {
    if requests.iter().all(Option::is_none) {
        return Ok(None);
    }
    let all = requests.iter().flatten().flat_map(|l| l.iter());
    let v4 = all.clone().filter(|ip| ip.is_ipv4()).count();
    let v6 = all.filter(|ip| ip.is_ipv6()).count();
    if v4 > 1 || v6 > 1 {
        return Err(Ecmp { v4, v6 });
    }
    Ok(Some(
        requests
            .iter()
            .map(|r| {
                let gateways = r.map(<[IpAddr]>::to_vec).unwrap_or_default();
                let none = r.is_some_and(<[IpAddr]>::is_empty);
                Marks {
                    filter_v4: none || v4 > 0,
                    filter_v6: none || v6 > 0,
                    gateways,
                }
            })
            .collect(),
    ))
}

/// One route change in the pod's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Remove the default routes of the marked families via the interface.
    Clear { ifname: String, v4: bool, v6: bool },
    /// Add a default route via `gateway` on the interface.
    Add { ifname: String, gateway: IpAddr },
}

/// Whether a network's result shows interfaces or IPs (any result
/// version): only such networks have their routes changed, as in multus.
pub fn shows_attachment(result: &Value) -> bool {
    let non_empty = |k: &str| result[k].as_array().is_some_and(|a| !a.is_empty());
    non_empty("interfaces")
        || non_empty("ips")
        || result.get("ip4").is_some_and(|v| !v.is_null())
        || result.get("ip6").is_some_and(|v| !v.is_null())
}

/// The changes for networks `(marks, ifname, shows_attachment)` in order:
/// first every affected interface's default routes are removed, then the
/// requested ones are added.
pub fn actions<'a>(networks: impl IntoIterator<Item = (&'a Marks, &'a str, bool)>) -> Vec<Action> {
    let mut clear = Vec::new();
    let mut add = Vec::new();
    for (marks, ifname, attached) in networks {
        if !attached {
            continue;
        }
        if marks.filter_v4 || marks.filter_v6 {
            clear.push(Action::Clear {
                ifname: ifname.to_string(),
                v4: marks.filter_v4,
                v6: marks.filter_v6,
            });
        }
        add.extend(marks.gateways.iter().map(|&gateway| Action::Add {
            ifname: ifname.to_string(),
            gateway,
        }));
    }
    clear.extend(add);
    clear
}

/// A route change that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("interface {ifname:?}: {why}")]
    BadIfname { ifname: String, why: String },
    #[error("removing the default routes of interface {ifname} in {netns}: {why}")]
    Clear {
        ifname: String,
        netns: String,
        why: String,
    },
    #[error("adding the default route via {gateway} on interface {ifname} in {netns}: {why}")]
    Add {
        ifname: String,
        gateway: IpAddr,
        netns: String,
        why: String,
    },
}

/// Makes `actions` in the namespace at `netns`, in order, stopping at the
/// first failure. Each command runs as a plugin does (see
/// [`exec::run_command`]) and is killed with its group after `timeout`.
pub async fn apply(netns: &str, actions: Vec<Action>, timeout: Duration) -> Result<(), Error> {
    for action in &actions {
        let ifname = match action {
            Action::Clear { ifname, .. } | Action::Add { ifname, .. } => ifname,
        };
        names::check_ifname(ifname).map_err(|e| Error::BadIfname {
            ifname: ifname.clone(),
            why: e.to_string(),
        })?;
    }
    for action in &actions {
        match action {
            Action::Clear { ifname, v4, v6 } => {
                let families = [("-4", "0.0.0.0/0", *v4), ("-6", "::/0", *v6)];
                for (family, all, _) in families.into_iter().filter(|f| f.2) {
                    let args = [family, "route", "flush", "dev", ifname, "exact", all];
                    match ip(netns, &args, timeout).await {
                        Ok(()) => {}
                        // A kernel without IPv6 has no IPv6 routes.
                        Err(why) if family == "-6" && why.contains("family not supported") => {}
                        Err(why) => {
                            return Err(Error::Clear {
                                ifname: ifname.clone(),
                                netns: netns.to_string(),
                                why,
                            })
                        }
                    }
                }
            }
            Action::Add { ifname, gateway } => {
                let family = if gateway.is_ipv4() { "-4" } else { "-6" };
                let gw = gateway.to_string();
                let args = [family, "route", "add", "default", "via", &gw, "dev", ifname];
                match ip(netns, &args, timeout).await {
                    Ok(()) => {}
                    // As multus: a route that is already there is fine.
                    Err(why) if why.contains("File exists") => {}
                    Err(why) => {
                        return Err(Error::Add {
                            ifname: ifname.clone(),
                            gateway: *gateway,
                            netns: netns.to_string(),
                            why,
                        })
                    }
                }
            }
        }
    }
    Ok(())
}

/// Runs `ip ARGS` inside the network namespace at `netns` through
/// `nsenter`; kills it after `timeout`. Err: what went wrong, with its
/// stderr.
async fn ip(netns: &str, args: &[&str], timeout: Duration) -> Result<(), String> {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={netns}"))
        .arg("--")
        .arg("ip")
        .args(args);
    let shown = format!("nsenter --net={netns} -- ip {}", args.join(" "));
    run_bounded(cmd, &shown, timeout).await
}

/// Runs `cmd` (shown as `shown` in errors) with a clean environment and
/// `/` as its directory, in a process group of its own that is killed
/// after `timeout`. Err: what went wrong, with its stderr.
async fn run_bounded(mut cmd: Command, shown: &str, timeout: Duration) -> Result<(), String> {
    cmd.env_clear().env("PATH", SEARCH_PATH).current_dir("/");
    let program = cmd.get_program().to_string_lossy().into_owned();
    let finished = exec::run_command(cmd, &program, timeout)
        .await
        .map_err(|e| match e {
            exec::Error::Spawn { source, .. } => format!("cannot run `{shown}`: {source}"),
            e => format!("cannot run `{shown}`: {e}"),
        })?;
    if finished.timed_out {
        return Err(format!(
            "`{shown}` did not finish within {} s and was killed",
            timeout.as_secs_f64()
        ));
    }
    let status = match finished.status {
        Some(s) if s.success() => return Ok(()),
        Some(s) => s.to_string(),
        None => "its exit status is unknown".to_string(),
    };
    let text = String::from_utf8_lossy(&finished.stderr);
    let mut text = text.trim().replace('\n', "; ");
    if text.len() > MAX_STDERR {
        let mut end = MAX_STDERR;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    Err(format!("`{shown}` failed ({status}): {text}"))
}

#[cfg(test)]
#[path = "default_route_tests.rs"]
mod tests;
