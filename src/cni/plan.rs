//! A container's ADD as a plan: everything the engine carries out for it.
//!
//! A [`Plan`] is data, made before anything runs: the networks in order,
//! each as the engine runs it ([`Planned`]) with the name network-status
//! and the call's log line show, the default route its selection element
//! asks for and the device plugin's device-info file to copy to it; and
//! the default-route marks worked out from those requests, so that an ECMP
//! request is refused when the plan is made. A pod's plan comes from pod
//! planning, a plain container's from the configured networks; the engine
//! carries out both the same way ([`Engine::carry_out`]).
//!
//! [`Engine::carry_out`]: crate::cni::Engine::carry_out

use std::net::IpAddr;
use std::path::PathBuf;

use crate::api::code;
use crate::cni::default_route::{self, Ecmp, Marks};
use crate::cni::{AddedNetwork, Error, ErrorKind, Planned};
use crate::device_info::DeviceInfo;

/// One network of a plan.
#[derive(Debug, Clone)]
pub struct Network {
    pub planned: Planned,
    /// What network-status and the call's log line show: `<namespace>/<nad>`,
    /// or the network's own name.
    pub shown_as: String,
    /// The selection element's `default-route`; `None`: no such key.
    pub default_route: Option<Vec<IpAddr>>,
    /// The device plugin's device-info file and the network's, copied
    /// from the first to the second before any plugin runs.
    pub copy_device_info: Option<(PathBuf, PathBuf)>,
}

impl Network {
    /// A network shown by its own name, with no default route asked and no
    /// file to copy.
    pub fn new(planned: Planned) -> Self {
        Self {
            shown_as: planned.list.name.clone(),
            planned,
            default_route: None,
            copy_device_info: None,
        }
    }
}

/// Everything one ADD carries out, in order.
#[derive(Debug, Clone)]
pub struct Plan {
    pub(in crate::cni) networks: Vec<Network>,
    /// Each network's part in the default-route changes; `None`: no
    /// network asked, so no route is touched.
    pub(in crate::cni) marks: Option<Vec<Marks>>,
}

impl Plan {
    /// The plan of `networks`, in order; more than one gateway of a family
    /// asked in total is refused ([`default_route::plan`]).
    pub fn new(networks: Vec<Network>) -> Result<Self, Ecmp> {
        let requests: Vec<Option<&[IpAddr]>> = networks
            .iter()
            .map(|n| n.default_route.as_deref())
            .collect();
        let marks = default_route::plan(&requests)?;
        Ok(Self { networks, marks })
    }

    pub fn networks(&self) -> &[Network] {
        &self.networks
    }
}

/// One network a plan attached, in the order they ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Attached {
    pub network: AddedNetwork,
    /// As [`Network::shown_as`].
    pub shown_as: String,
    /// The network's device-info file as it reads after its plugins ran.
    pub device_info: Option<DeviceInfo>,
}

impl Attached {
    /// The network whose result the runtime receives: the primary one,
    /// else the first that ran. None at all is the engine's own fault.
    pub fn primary(attached: &[Attached]) -> Result<&Attached, Error> {
        attached
            .iter()
            .find(|a| a.network.primary)
            .or_else(|| attached.first())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Internal,
                    code::INTERNAL,
                    "ADD produced no result",
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netconf::NetworkList;
    use serde_json::json;

    fn network(name: &str, default_route: Option<Vec<IpAddr>>) -> Network {
        let doc = json!({"cniVersion": "1.0.0", "name": name, "type": "bridge"});
        let list = NetworkList::from_value(std::path::Path::new(name), doc, true).unwrap();
        Network {
            default_route,
            ..Network::new(Planned::new(list, "eth0", false))
        }
    }

    #[test]
    fn a_plan_should_mark_default_routes_only_when_asked() {
        let plain = Plan::new(vec![network("a", None), network("b", None)]).unwrap();
        assert!(plain.marks.is_none());
        assert_eq!(plain.networks()[1].shown_as, "b");
        let gw: IpAddr = "10.1.0.1".parse().unwrap();
        let owned = Plan::new(vec![network("a", None), network("b", Some(vec![gw]))]).unwrap();
        let marks = owned.marks.unwrap();
        assert!(marks[0].filter_v4 && marks[0].gateways.is_empty());
        assert_eq!(marks[1].gateways, [gw]);
        let other: IpAddr = "10.2.0.1".parse().unwrap();
        let ecmp = Plan::new(vec![
            network("a", Some(vec![gw])),
            network("b", Some(vec![other])),
        ])
        .unwrap_err();
        assert_eq!(ecmp, Ecmp { v4: 2, v6: 0 });
    }
}
