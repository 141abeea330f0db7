//! Networks hot-plugged into a running container (`/delegate`, as
//! multus-dynamic-networks-controller calls it).
//!
//! A hot-plugged network is an attachment of its own in the container's
//! record (its interface name, its one network), marked with the interface
//! name of the runtime's attachment it joined. It is recorded and added
//! like any ADD (the record saved before its plugins run, rolled back on
//! failure, under the container's lock). Unlike multus, the runtime's DEL
//! of the pod's attachment removes it too (see `Engine::del`), and GC keeps
//! it as long as that attachment is valid.

use serde_json::{Map, Value};

use super::lock::Take;
use super::{AddedNetwork, Engine, Error, ErrorKind, Loaded, Planned, State};
use crate::api::{code, Command};
use crate::cni::state::{Attachment, Delegate, Durability, Record};
use crate::netconf::Invocation;

impl Engine {
    /// Adds network `planned` on interface `inv.ifname` of a container the
    /// runtime has attached; returns its result. Refused, with nothing
    /// run, when the container has no record of its own (code 3) or the
    /// interface name is taken in it (code 4).
    pub async fn hot_plug(&self, inv: &Invocation, planned: Planned) -> Result<Value, Error> {
        let take = Take::call(Command::Add, &inv.netns);
        self.locked(&inv.container_id, take, |loaded| {
            self.hot_plug_locked(inv, planned, loaded)
        })
        .await
    }

    async fn hot_plug_locked(
        &self,
        inv: &Invocation,
        mut planned: Planned,
        loaded: Loaded,
    ) -> Result<Value, Error> {
        let id = &inv.container_id;
        let into = {
            let runtime = loaded.record.as_ref().and_then(Record::runtime_attachment);
            let Some(runtime) = runtime else {
                return Err(Error::new(
                    ErrorKind::Failed,
                    code::UNKNOWN_CONTAINER,
                    format!(
                        "container {id:?} has no attachment recorded by plexusd; a network is hot-plugged only into a container whose runtime ADD went through plexusd, so that the runtime's DEL removes it too"
                    ),
                ));
            };
            if let Some(held) = loaded
                .record
                .as_ref()
                .and_then(|r| r.holder_of(&inv.ifname))
            {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    code::INVALID_ENVIRONMENT,
                    format!(
                        "container {id:?}: interface {:?} is already in use by {}; hot-plug it under another CNI_IFNAME",
                        inv.ifname,
                        describe(held)
                    ),
                ));
            }
            runtime.ifname.clone()
        };
        planned.ifname = inv.ifname.clone();
        planned.primary = false;
        let added = self
            .add_locked(inv, Map::new(), vec![planned], loaded, Some(into))
            .await?;
        Ok(AddedNetwork::primary(&added)?.result.clone())
    }

    /// DEL of the network on interface `inv.ifname`: a hot-plugged one
    /// (with its record entry), or an additional network of the runtime's
    /// attachment (taken out of that attachment). The runtime's own
    /// interface is refused: its DEL is the runtime's. When nothing is
    /// recorded on that interface, `given` (the call's network) is DELed
    /// as multus does, and nothing is recorded.
    pub async fn unplug(
        &self,
        inv: &Invocation,
        given: Result<Planned, Error>,
    ) -> Result<(), Error> {
        let take = Take::call(Command::Del, &inv.netns);
        self.locked(&inv.container_id, take, |loaded| {
            self.unplug_locked(inv, given, loaded)
        })
        .await
    }

    async fn unplug_locked(
        &self,
        inv: &Invocation,
        given: Result<Planned, Error>,
        loaded: Loaded,
    ) -> Result<(), Error> {
        let id = &inv.container_id;
        let Some(mut record) = loaded.record else {
            return self.del_given(inv, given?).await;
        };
        let Some((att, d)) = record.holder_of(&inv.ifname) else {
            return self.del_given(inv, given?).await;
        };
        if att.hot_plugged_into.is_some() {
            return self.del_attachment(inv, &inv.netns, &mut record).await;
        }
        let (att, d) = match d {
            Some(d) if !d.primary && att.ifname != inv.ifname => (att.clone(), d.clone()),
            _ => {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    code::INVALID_ENVIRONMENT,
                    format!(
                        "container {id:?}: interface {:?} is {}; /delegate removes only hot-plugged and additional networks, the runtime's DEL removes the rest",
                        inv.ifname,
                        describe((&att.clone(), d))
                    ),
                ))
            }
        };
        // An additional network of the runtime's attachment, with the
        // CNI_ARGS it was added with (this call's are the controller's).
        let recorded = Invocation {
            args: att.cni_args.clone(),
            ..inv.clone()
        };
        let errors = if d.state == State::Pending {
            Vec::new()
        } else {
            self.del_recorded(&recorded, &inv.netns, &att, &d, d.result.as_ref(), &[])
                .await
        };
        Error::dels_ok(inv, errors)?;
        if let Some(a) = record.attachment_mut(&att.ifname) {
            a.delegates.retain(|x| x.ifname != inv.ifname);
        }
        record.attachments.retain(|a| !a.delegates.is_empty());
        self.save_record(&record, Durability::Atomic).await
    }

    /// DEL of a network nothing recorded, with the call's config.
    async fn del_given(&self, inv: &Invocation, given: Planned) -> Result<(), Error> {
        let env = self.call_env(
            Command::Del,
            inv,
            &inv.ifname,
            &inv.netns,
            given.cni_args.as_deref(),
        );
        let cap_args = given.capability_args.clone().unwrap_or_default();
        let errors = self
            .del_chain(&given.list, &env, &cap_args, None, &[])
            .await;
        Error::dels_ok(inv, errors)
    }

    /// CHECK of the one recorded network on interface `inv.ifname`, with
    /// its recorded config and result.
    pub async fn check_one(&self, inv: &Invocation) -> Result<(), Error> {
        let take = Take::call(Command::Check, &inv.netns);
        self.locked(&inv.container_id, take, |loaded| {
            self.check_one_locked(inv, loaded)
        })
        .await
    }

    async fn check_one_locked(&self, inv: &Invocation, loaded: Loaded) -> Result<(), Error> {
        let found = loaded.record.as_ref().and_then(|r| {
            r.attachments.iter().find_map(|a| {
                a.delegates
                    .iter()
                    .find(|d| d.ifname == inv.ifname)
                    .map(|d| (a, d))
            })
        });
        let Some((att, d)) = found else {
            return Err(Error::new(
                ErrorKind::Failed,
                code::UNKNOWN_CONTAINER,
                format!(
                    "container {:?} has no network recorded on {:?}",
                    inv.container_id, inv.ifname
                ),
            ));
        };
        self.check_recorded(inv, att, d).await
    }
}

/// What holds an interface, for messages.
fn describe((att, d): (&Attachment, Option<&Delegate>)) -> String {
    match (&att.hot_plugged_into, d) {
        (Some(into), Some(d)) => format!(
            "network {:?}, hot-plugged into {into:?}{}",
            d.name,
            if d.state == State::Added {
                ""
            } else {
                " (its ADD did not complete; DEL it first)"
            }
        ),
        (Some(into), None) => format!("a network hot-plugged into {into:?}"),
        (None, Some(d)) if d.primary => format!(
            "the runtime's attachment {:?} (its primary network {:?})",
            att.ifname, d.name
        ),
        (None, Some(d)) => format!(
            "network {:?} of the runtime's attachment {:?}",
            d.name, att.ifname
        ),
        (None, None) => format!("the runtime's attachment {:?}", att.ifname),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record() -> Record {
        // As an earlier version wrote it: no hotPluggedInto anywhere.
        serde_json::from_value(json!({
            "kind": crate::cni::state::KIND,
            "containerId": "c1",
            "attachments": [{
                "ifname": "eth0", "netns": "/run/netns/x", "cniArgs": "",
                "delegates": [
                    {"name": "pod", "ifname": "eth0", "primary": true, "state": "added", "config": {}},
                    {"name": "extra", "ifname": "net1", "state": "added", "config": {}}
                ]
            }]
        }))
        .unwrap()
    }

    #[test]
    fn an_earlier_record_should_read_as_having_nothing_hot_plugged() {
        let mut r = record();
        assert_eq!(r.attachments[0].hot_plugged_into, None);
        assert_eq!(r.runtime_attachment().unwrap().ifname, "eth0");
        assert!(r.hot_plugged("eth0").is_empty());
        // Written back unchanged: nothing new appears for older readers.
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["attachments"][0].get("hotPluggedInto").is_none(), "{v}");

        let mut hp = r.attachments[0].clone();
        hp.ifname = "net5".into();
        hp.delegates.truncate(1);
        hp.delegates[0].ifname = "net5".into();
        hp.delegates[0].primary = false;
        hp.delegates[0].name = "hp".into();
        hp.hot_plugged_into = Some("eth0".into());
        r.attachments.insert(0, hp);
        let back: Record = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        // The runtime's attachment is never a hot-plugged one.
        assert_eq!(r.runtime_attachment().unwrap().ifname, "eth0");
        assert_eq!(r.hot_plugged("eth0"), ["net5"]);
        for (ifname, holder) in [
            (
                "eth0",
                "the runtime's attachment \"eth0\" (its primary network \"pod\")",
            ),
            (
                "net1",
                "network \"extra\" of the runtime's attachment \"eth0\"",
            ),
            ("net5", "network \"hp\", hot-plugged into \"eth0\""),
        ] {
            assert_eq!(describe(r.holder_of(ifname).unwrap()), holder);
        }
        assert!(r.holder_of("net2").is_none());
    }
}
