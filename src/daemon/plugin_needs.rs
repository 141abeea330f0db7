//! What the CNI plugins in use need from the host beyond plexusd.service's
//! own sandbox, for `--check-config` when plexusd runs plugins itself (no
//! `pluginSpawner`). Read from each plugin's sources: docs/plugins.md,
//! "What each plugin needs", names the files.

/// One plugin (or family of plugins sharing a binary's habits).
#[derive(Debug)]
pub struct Need {
    /// The `type`s it is configured by.
    pub types: &'static [&'static str],
    /// Host paths it writes (or locks) outside plexusd's ReadWritePaths.
    pub writes: &'static [&'static str],
    /// Whether it writes sysctls under /proc/sys (ProtectKernelTunables).
    pub sysctls: bool,
    /// Capabilities it needs beyond plexusd's bounding set.
    pub caps: &'static [&'static str],
    /// Whether it uses the host's /tmp (PrivateTmp).
    pub host_tmp: bool,
    /// What happens under plexusd's sandbox.
    pub effect: &'static str,
}

/// The plugins `--check-config` recognises by `type`. Plugins that use
/// netlink only (loopback, host-local, static, macvlan, ipvlan, vlan,
/// host-device, sbr, vrf, bandwidth) or an agent's socket only (antrea,
/// the dhcp client) work under plexusd's sandbox and are not listed;
/// nor are bridge, ptp and flannel, which work but for `ipMasq` with
/// iptables-legacy while `/run/xtables.lock` does not exist yet.
pub const NEEDS: &[Need] = &[
    Need {
        types: &["calico", "calico-ipam"],
        writes: &["/var/log/calico", "/run/calico"],
        sysctls: true,
        caps: &[],
        host_tmp: false,
        effect: "its ADD fails on its sysctls; its log and its host-wide IPAM lock are lost",
    },
    Need {
        types: &["cilium-cni"],
        writes: &["/run/cilium"],
        sysctls: true,
        caps: &[],
        host_tmp: false,
        effect:
            "its ADD fails on rp_filter; its log is lost and a DEL while the agent is down fails",
    },
    Need {
        types: &["aws-cni", "egress-cni", "egress-v4-cni"],
        writes: &["/var/log/aws-routed-eni", "/run/cni", "/run/xtables.lock"],
        sysctls: true,
        caps: &[],
        host_tmp: false,
        effect: "its ADD fails on its sysctls; its logs are lost",
    },
    Need {
        types: &["ovn-k8s-cni-overlay"],
        writes: &["/var/log/ovn-kubernetes"],
        sysctls: true,
        caps: &[],
        host_tmp: false,
        effect: "its log is lost; in unprivileged mode its sysctls fail",
    },
    Need {
        types: &["whereabouts"],
        writes: &[],
        sysctls: false,
        caps: &[],
        host_tmp: true,
        effect: "a log_file in /tmp lands in plexusd's private /tmp",
    },
    Need {
        types: &["sriov"],
        writes: &[],
        sysctls: true,
        caps: &["CAP_DAC_OVERRIDE", "CAP_NET_RAW"],
        host_tmp: false,
        effect: "its ADD and DEL fail (its vf_lock directory is 0600)",
    },
    Need {
        types: &["ovs"],
        writes: &[],
        sysctls: false,
        caps: &["CAP_NET_RAW"],
        host_tmp: true,
        effect: "DELs of attachments cached in /tmp/ovscache leave their port",
    },
    Need {
        types: &["tuning"],
        writes: &["/run/cni"],
        sysctls: true,
        caps: &["CAP_DAC_OVERRIDE"],
        host_tmp: false,
        effect: "its ADD fails (sysctls, and its backup in /run/cni/tuning)",
    },
    Need {
        types: &["portmap", "firewall"],
        writes: &["/run/xtables.lock"],
        sysctls: false,
        caps: &[],
        host_tmp: false,
        effect: "with iptables-legacy its ADD fails while /run/xtables.lock does not exist",
    },
];

/// The entry for plugin `type`, if it is one that needs more.
pub fn lookup(plugin_type: &str) -> Option<&'static Need> {
    NEEDS.iter().find(|n| n.types.contains(&plugin_type))
}

/// The drop-in for plexusd.service that gives `needs` what they need.
pub fn drop_in(needs: &[&Need]) -> String {
    let mut writes: Vec<&str> = needs
        .iter()
        .flat_map(|n| n.writes.iter().copied())
        .collect();
    writes.sort_unstable();
    writes.dedup();
    let mut caps: Vec<&str> = needs.iter().flat_map(|n| n.caps.iter().copied()).collect();
    caps.sort_unstable();
    caps.dedup();
    let mut lines = vec!["[Service]".to_string()];
    if !writes.is_empty() {
        let list: Vec<String> = writes.iter().map(|w| format!("-{w}")).collect();
        lines.push(format!("ReadWritePaths={}", list.join(" ")));
    }
    if needs.iter().any(|n| n.sysctls) {
        lines.push("ProtectKernelTunables=no".into());
    }
    if !caps.is_empty() {
        lines.push(format!(
            "CapabilityBoundingSet=CAP_NET_ADMIN CAP_SYS_ADMIN CAP_SYS_PTRACE {}",
            caps.join(" ")
        ));
    }
    if needs.iter().any(|n| n.host_tmp) {
        lines.push("PrivateTmp=no".into());
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_in_should_gather_what_every_plugin_needs_once() {
        let needs = [
            lookup("calico").unwrap(),
            lookup("tuning").unwrap(),
            lookup("sriov").unwrap(),
        ];
        assert_eq!(
            drop_in(&needs),
            "[Service]\n\
             ReadWritePaths=-/run/calico -/run/cni -/var/log/calico\n\
             ProtectKernelTunables=no\n\
             CapabilityBoundingSet=CAP_NET_ADMIN CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_DAC_OVERRIDE CAP_NET_RAW"
        );
        assert!(lookup("loopback").is_none());
        assert!(lookup("calico-ipam").is_some());
    }
}
