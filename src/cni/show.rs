//! What `plexusd show` and `GET /attachments/<id>` report about a
//! container: its networks, interfaces and addresses, taken from its
//! record. Formatting only; [`super::record`] stores and loads.

use serde_json::{Map, Value};

use super::record::{Delegate, Error, Record, State};

/// What a user wants to know about a container: its networks, interfaces
/// and addresses, from the recorded results.
pub fn summary(record: &Record) -> Value {
    let attachments: Vec<Value> = record
        .attachments
        .iter()
        .map(|a| {
            let networks: Vec<Value> = a.delegates.iter().map(delegate_summary).collect();
            serde_json::json!({
                "ifname": a.ifname,
                "netns": a.netns,
                "networks": networks,
            })
        })
        .collect();
    serde_json::json!({
        "containerId": record.container_id,
        "attachments": attachments,
    })
}

fn delegate_summary(d: &Delegate) -> Value {
    let mut out = Map::new();
    out.insert("network".into(), Value::String(d.name.clone()));
    out.insert("interface".into(), Value::String(d.ifname.clone()));
    out.insert("primary".into(), Value::Bool(d.primary));
    let state = match d.state {
        State::Pending => "pending",
        State::Adding => "adding",
        State::Added => "added",
    };
    out.insert("state".into(), Value::String(state.into()));
    let Some(result) = &d.result else {
        return Value::Object(out);
    };
    let empty = Vec::new();
    let interfaces = result
        .get("interfaces")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    // The container-side interface: the one in a sandbox with our name.
    let index = interfaces.iter().position(|i| {
        i.get("name").and_then(Value::as_str) == Some(d.ifname.as_str())
            && i.get("sandbox").is_some()
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
    Value::Object(out)
}

/// What `show` and `/attachments` report for a record that cannot be read.
pub fn damaged_summary(container_id: &str, e: &Error) -> Value {
    serde_json::json!({
        "containerId": container_id,
        "damaged": e.to_string(),
    })
}
