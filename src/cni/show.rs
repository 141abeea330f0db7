//! What `plexusd show` and `GET /attachments/<id>` report about a
//! container: its networks, interfaces and addresses, taken from its
//! record, or, for a container multus attached and plexusd has no record
//! of, from multus's caches ([`super::multus_cache`]). Reads only: nothing
//! is created, moved, removed or followed, and no lock is taken.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::backends::Records;
use super::multus_cache::{Caches, SeenNetwork};
use super::state::{Delegate, Error, Record, State};

/// The `attachedBy` of a container known only from multus's caches.
pub const ATTACHED_BY_MULTUS: &str = "multus";

/// What is shown of one container.
#[derive(Debug)]
pub struct Shown {
    /// Its summary ([`summary`], [`multus_summary`] or a damaged one).
    pub summary: Value,
    /// Why nothing else can be shown of it: its record, or multus's
    /// delegate cache for it, is damaged.
    pub damaged: Option<String>,
    /// Damaged files of it shown as such in `summary` (multus's result
    /// caches), one message each.
    pub damaged_files: Vec<String>,
}

/// The ids of the containers there is something to show of: those with
/// a record, and those multus cached (readable or not), sorted.
pub fn ids(records: &dyn Records, caches: &Caches) -> Result<Vec<String>, Error> {
    let mut ids: BTreeSet<String> = records.list()?.into_iter().collect();
    ids.extend(caches.containers()?);
    Ok(ids.into_iter().collect())
}

/// What there is to show of `container_id`: its record (plexusd's own
/// always wins), else what multus left in its caches; `None` when
/// neither knows it. A damaged record or delegate cache is shown as
/// damaged, naming the file. `result_names`: libcni's result cache
/// listing ([`Caches::result_names`]) when already made. Blocking.
pub fn lookup(
    records: &dyn Records,
    caches: &Caches,
    container_id: &str,
    result_names: Option<&[String]>,
) -> Result<Option<Shown>, Error> {
    let whole = |summary: Value, damaged: Option<String>| Shown {
        summary,
        damaged,
        damaged_files: Vec::new(),
    };
    match records.load(container_id) {
        Ok(Some(r)) => return Ok(Some(whole(summary(&r), None))),
        Ok(None) => {}
        Err(e) if e.is_damaged() => {
            return Ok(Some(whole(
                damaged_summary(container_id, &e),
                Some(e.to_string()),
            )))
        }
        Err(e) => return Err(e),
    }
    match caches.seen(container_id, result_names) {
        Ok(Some(networks)) => Ok(Some(Shown {
            summary: multus_summary(container_id, &networks),
            damaged: None,
            damaged_files: networks
                .iter()
                .filter_map(|n| n.result.as_ref().err())
                .map(ToString::to_string)
                .collect(),
        })),
        Ok(None) => Ok(None),
        Err(e) if e.is_damaged() => {
            let mut summary = damaged_summary(container_id, &e);
            summary["attachedBy"] = Value::String(ATTACHED_BY_MULTUS.into());
            Ok(Some(whole(summary, Some(e.to_string()))))
        }
        Err(e) => Err(e),
    }
}

/// What a user wants to know about a container: its networks, interfaces
/// and addresses, from the recorded results.
pub fn summary(record: &Record) -> Value {
    let attachments: Vec<Value> = record
        .attachments
        .iter()
        .map(|a| {
            let networks: Vec<Value> = a.delegates.iter().map(delegate_summary).collect();
            let mut out = serde_json::json!({
                "ifname": a.ifname,
                "netns": a.netns,
                "networks": networks,
            });
            if let Some(into) = &a.hot_plugged_into {
                out["hotPluggedInto"] = Value::String(into.clone());
            }
            if let Some(c) = &a.cleanup {
                out["cleanup"] = serde_json::to_value(c).unwrap_or(Value::Null);
            }
            out
        })
        .collect();
    serde_json::json!({
        "containerId": record.container_id,
        "attachments": attachments,
    })
}

/// [`summary`] of a container multus attached, from its caches, marked
/// `"attachedBy": "multus"`: one attachment (multus hangs every network
/// on the runtime's one), its networks in multus's order with the
/// interface names multus gave them (`null` when no cache tells), each
/// `added` with the MAC and addresses of libcni's cached result, or
/// `unknown` without one; a result cache that cannot be used is the
/// network's `damaged` (or `error`), naming the file.
pub fn multus_summary(container_id: &str, networks: &[SeenNetwork]) -> Value {
    let cached = || {
        networks
            .iter()
            .filter_map(|n| n.result.as_ref().ok()?.as_ref())
    };
    let netns = cached()
        .map(|r| r.netns.as_str())
        .find(|n| !n.is_empty())
        .unwrap_or_default();
    // The runtime's CNI_IFNAME, unless the primary asked for its own.
    let ifname = networks
        .first()
        .filter(|n| n.delegate.takes_call_ifname(0))
        .and_then(|n| n.ifname.clone());
    let shown: Vec<Value> = networks
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let result = n.result.as_ref().ok().and_then(Option::as_ref);
            let state = if result.is_some() { "added" } else { "unknown" };
            let mut out = network_summary(
                &n.delegate.network,
                n.ifname.as_deref(),
                i == 0,
                state,
                result.and_then(|r| r.result.as_ref()),
            );
            out.insert("multusName".into(), Value::String(n.delegate.name.clone()));
            if let Err(e) = &n.result {
                let key = if e.is_damaged() { "damaged" } else { "error" };
                out.insert(key.into(), Value::String(e.to_string()));
            }
            Value::Object(out)
        })
        .collect();
    serde_json::json!({
        "containerId": container_id,
        "attachedBy": ATTACHED_BY_MULTUS,
        "attachments": [{
            "ifname": ifname,
            "netns": netns,
            "networks": shown,
        }],
    })
}

fn delegate_summary(d: &Delegate) -> Value {
    let state = match d.state {
        State::Pending => "pending",
        State::Adding => "adding",
        State::Added => "added",
    };
    Value::Object(network_summary(
        &d.name,
        Some(&d.ifname),
        d.primary,
        state,
        d.result.as_ref(),
    ))
}

/// One network: its name, interface, whether it is the primary, its
/// state, and from its result the container-side MAC, addresses and
/// gateways.
fn network_summary(
    network: &str,
    ifname: Option<&str>,
    primary: bool,
    state: &str,
    result: Option<&Value>,
) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("network".into(), Value::String(network.into()));
    out.insert(
        "interface".into(),
        ifname.map_or(Value::Null, |i| Value::String(i.into())),
    );
    out.insert("primary".into(), Value::Bool(primary));
    out.insert("state".into(), Value::String(state.into()));
    let Some(result) = result else {
        return out;
    };
    let empty = Vec::new();
    let interfaces = result
        .get("interfaces")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    // The container-side interface: the one in a sandbox with our name.
    let index = ifname.and_then(|ifname| {
        interfaces.iter().position(|i| {
            i.get("name").and_then(Value::as_str) == Some(ifname) && i.get("sandbox").is_some()
        })
    });
    if let Some(mac) = index
        .and_then(|i| interfaces[i].get("mac"))
        .and_then(Value::as_str)
    {
        out.insert("mac".into(), Value::String(mac.into()));
    }
    let ips: Vec<Value> = result
        .get("ips")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
        .iter()
        .filter(
            |ip| match (ip.get("interface").and_then(Value::as_u64), index) {
                (Some(n), Some(i)) => n as usize == i,
                _ => true,
            },
        )
        .filter_map(|ip| ip.get("address").cloned())
        .collect();
    out.insert("ips".into(), Value::Array(ips));
    let gateways: Vec<Value> = result
        .get("ips")
        .and_then(Value::as_array)
        .unwrap_or(&empty)
        .iter()
        .filter_map(|ip| ip.get("gateway").cloned())
        .collect();
    if !gateways.is_empty() {
        out.insert("gateways".into(), Value::Array(gateways));
    }
    out
}

/// What `show` and `/attachments` report for a record that cannot be read.
pub fn damaged_summary(container_id: &str, e: &Error) -> Value {
    serde_json::json!({
        "containerId": container_id,
        "damaged": e.to_string(),
    })
}

#[cfg(test)]
#[path = "show_tests.rs"]
mod tests;
