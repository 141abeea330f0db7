//! What `plexusd show` and `GET /attachments/<id>` report about a
//! container: its networks, interfaces and addresses, taken from its
//! record. Formatting only; [`super::state`] stores and loads.

use serde_json::{Map, Value};

use super::state::{Delegate, Error, Record, State};

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_summary_should_show_the_container_side_interface_and_its_addresses() {
        let mut record = Record::new("c1");
        record.attachments.push(super::super::state::Attachment {
            fell_back: false,
            hot_plugged_into: None,
            cleanup: None,
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
            cni_args: String::new(),
            capability_args: Map::new(),
            delegates: vec![Delegate {
                name: "n".into(),
                ifname: "eth0".into(),
                primary: true,
                state: State::Added,
                config: json!({}),
                capability_args: None,
                cni_args: None,
                result: Some(json!({
                    "cniVersion": "1.1.0",
                    "interfaces": [
                        {"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"},
                        {"name": "eth0", "mac": "0a:58:0a:00:00:02", "sandbox": "/run/netns/x"}
                    ],
                    "ips": [
                        {"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 1},
                        {"address": "10.9.0.1/24", "interface": 0}
                    ]
                })),
            }],
        });
        let s = summary(&record);
        assert_eq!(s["containerId"], "c1");
        let network = &s["attachments"][0]["networks"][0];
        assert_eq!(network["network"], "n");
        assert_eq!(network["state"], "added");
        assert_eq!(network["mac"], "0a:58:0a:00:00:02");
        assert_eq!(network["ips"], json!(["10.0.0.2/24"]));
        assert_eq!(network["gateways"], json!(["10.0.0.1"]));

        record.attachments[0].delegates[0].state = State::Adding;
        record.attachments[0].delegates[0].result = None;
        let network = summary(&record)["attachments"][0]["networks"][0].clone();
        assert_eq!(network["state"], "adding");
        assert!(network.get("ips").is_none() && network.get("mac").is_none());
    }
}
