//! GC never gives a live pod's address away: an IPAM plugin that
//! implements GC releases every reservation its valid list does not name,
//! so the list plexusd sends must name every attachment of a container the
//! runtime still has, even one whose record a crash or a disk fault has
//! damaged. Debian's bridge in real namespaces, with a double of host-local
//! with GC as its IPAM, through plexusd and plexus-shim. Needs root.

use std::fs;

use serde_json::{json, Value};

use crate::support::cni::{address, bare, cni, conflist, gc_call, ok, Engine};
use crate::support::netns::{bridge_ports, Link, Netns, Subnet};
use crate::support::shim;

/// What the doubles answer to VERSION: 1.1.0, the first with GC.
const VERSION_1_1: &str = r#"if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}'
  exit 0
fi"#;

/// host-local with GC, as a fake: containernetworking/plugins
/// plugins/ipam/host-local/backend/disk (backend.go: one directory per
/// network under `dataDir`, one file per reserved address named by the
/// address and holding `<container id>\r\n<ifname>`, next to `lock` and
/// `last_reserved_ip.<range>`; key.go's legacy files hold the id alone)
/// and the GC that store gains (backend/disk/gc_test.go: every
/// reservation whose (containerID, ifname) is not in
/// `cni.dev/valid-attachments` is released; a legacy one is kept while
/// its container is listed; `lock` and `last_reserved_ip.*` stay).
///
/// One difference, on purpose: ADD takes the lowest free address of the
/// range (only `ranges[0][0]`, a /24), where host-local starts after the
/// last one it reserved. Once host-local's range wraps around it hands
/// out freed addresses the same way; here it happens at once, so a freed
/// address shows on the next ADD.
const HOST_LOCAL_GC: &str = r#"net=$(printf '%s' "$STDIN" | jq -r .name)
ver=$(printf '%s' "$STDIN" | jq -r .cniVersion)
data=$(printf '%s' "$STDIN" | jq -r .ipam.dataDir)
range=$(printf '%s' "$STDIN" | jq -c '.ipam.ranges[0][0]')
subnet=$(printf '%s' "$range" | jq -r .subnet)
prefix=${subnet%.0/24}
lo=$(printf '%s' "$range" | jq -r .rangeStart); lo=${lo##*.}
hi=$(printf '%s' "$range" | jq -r .rangeEnd); hi=${hi##*.}
dir="$data/$net"
mkdir -p "$dir"
exec 9>>"$dir/lock"
flock 9
key=$(printf '%s\r\n%s' "$CNI_CONTAINERID" "$CNI_IFNAME")
fail() {
  jq -nc --arg v "$ver" --arg m "$1" '{cniVersion: $v, code: 999, msg: $m}'
  exit 1
}
reservations() {
  for f in "$dir"/*; do
    case "${f##*/}" in lock|last_reserved_ip.*) continue ;; esac
    [ -f "$f" ] && printf '%s\n' "$f"
  done
}
case "$CNI_COMMAND" in
ADD)
  for f in $(reservations); do
    [ "$(cat "$f")" = "$key" ] && fail "$CNI_CONTAINERID has been allocated to ${f##*/}, duplicate allocation is not allowed"
  done
  for h in $(seq "$lo" "$hi"); do
    ip="$prefix.$h"
    if (set -C; printf '%s' "$key" > "$dir/$ip") 2>/dev/null; then
      printf '%s' "$ip" > "$dir/last_reserved_ip.0"
      jq -nc --arg v "$ver" --arg a "$ip/24" '{cniVersion: $v, ips: [{address: $a}]}'
      exit 0
    fi
  done
  fail "no IP addresses available in range set: $prefix.$lo-$prefix.$hi" ;;
DEL)
  for f in $(reservations); do
    c=$(cat "$f")
    if [ "$c" = "$key" ] || [ "$c" = "$CNI_CONTAINERID" ]; then rm -f "$f"; fi
  done ;;
GC)
  valid=$(printf '%s' "$STDIN" | jq -r '.["cni.dev/valid-attachments"][]? | "\(.containerID) \(.ifname)"')
  for f in $(reservations); do
    id=$(sed -n 1p "$f" | tr -d '\r')
    ifname=$(sed -n 2p "$f")
    if [ -z "$ifname" ]; then
      printf '%s\n' "$valid" | grep -q "^$id " && continue
    else
      printf '%s\n' "$valid" | grep -qxF "$id $ifname" && continue
    fi
    rm -f "$f"
  done ;;
esac
exit 0"#;

/// Debian's bridge (which stops at 1.0.0 and has no GC) as a bridge that
/// has it: ADD, DEL and CHECK run /usr/lib/cni/bridge at 1.0.0 (a 1.1.0
/// result is a 1.0.0 one with another version), and GC is handed to the
/// IPAM plugin with the same stdin, found in CNI_PATH, as a plugin that
/// delegates IPAM does it (containernetworking/cni: pkg/invoke/delegate.go,
/// `DelegateGC`).
const BRIDGE_WITH_GC: &str = r#"ver=$(printf '%s' "$STDIN" | jq -r .cniVersion)
case "$CNI_COMMAND" in
GC)
  ipam=$(printf '%s' "$STDIN" | jq -r .ipam.type)
  for d in ${CNI_PATH//:/ }; do
    if [ -x "$d/$ipam" ]; then printf '%s' "$STDIN" | "$d/$ipam"; exit $?; fi
  done
  echo "{\"cniVersion\":\"$ver\",\"code\":8,\"msg\":\"failed to find plugin $ipam\"}"
  exit 1 ;;
STATUS) exit 0 ;;
esac
out=$(printf '%s' "$STDIN" \
  | jq -c '.cniVersion = "1.0.0" | if .prevResult then .prevResult.cniVersion = "1.0.0" else . end' \
  | /usr/lib/cni/bridge)
rc=$?
if [ -n "$out" ]; then printf '%s' "$out" | jq -c --arg v "$ver" '.cniVersion = $v'; fi
exit $rc"#;

/// What a record damaged mid-write looks like: truncated JSON.
const TRUNCATED: &[u8] = b"{\"kind\": \"plexusAttachmentsV1\", \"contai";

/// The damaged record of pod A used to be skipped when plexusd listed the
/// valid attachments for the plugins' GC: host-local released A's address
/// while A was running, and B, the next pod, was given it too.
#[test]
fn gc_should_keep_the_address_of_a_live_pod_whose_record_is_damaged() {
    let e = Engine::new("gc-safety");
    let br = Link::bridge();
    let subnet = Subnet::new();
    let net = "gcnet";
    e.fake_with("hl-gc", VERSION_1_1, HOST_LOCAL_GC);
    e.fake_with("bridge-gc", VERSION_1_1, BRIDGE_WITH_GC);
    let ipam = json!({
        "type": "hl-gc",
        "dataDir": e.ipam_dir,
        "ranges": [[{
            "subnet": subnet.cidr(),
            "rangeStart": format!("{}.2", subnet.prefix),
            "rangeEnd": format!("{}.5", subnet.prefix),
        }]],
    });
    e.write_network(
        "10-gcnet.conflist",
        &conflist(
            net,
            "1.1.0",
            vec![json!({"type": "bridge-gc", "bridge": br.name, "ipam": ipam})],
        ),
    );
    let d = e.start("d", net, "10s");

    let (ns_a, ns_b, ns_c) = (Netns::new(), Netns::new(), Netns::new());
    let addr_a = address(&ok(&d, &cni(&d, "ADD", "pod-a", &ns_a, "eth0")));
    let addr_c = address(&ok(&d, &cni(&d, "ADD", "pod-c", &ns_c, "eth0")));
    let held_by_a = e.ipam_dir.join(net).join(bare(&addr_a));
    let held_by_c = e.ipam_dir.join(net).join(bare(&addr_c));
    assert_eq!(fs::read(&held_by_a).unwrap(), b"pod-a\r\neth0");
    assert_eq!(fs::read(&held_by_c).unwrap(), b"pod-c\r\neth0");
    // A crash or a disk fault damages A's record and C's; A runs on, the
    // runtime has forgotten C.
    fs::write(e.record("pod-a"), TRUNCATED).unwrap();
    fs::write(e.record("pod-c"), TRUNCATED).unwrap();

    let gc = shim::finish(gc_call(
        &d,
        json!([{"containerID": "pod-a", "ifname": "eth0"}]),
    ));
    assert_eq!(gc.code, Some(0), "{gc:?}\n{}", d.log_text());
    // What a container the runtime no longer has holds is a leak: freed.
    assert!(
        !held_by_c.exists(),
        "C's reservation was kept: {:?}",
        e.reservations(net)
    );

    let addr_b = address(&ok(&d, &cni(&d, "ADD", "pod-b", &ns_b, "eth0")));
    assert_ne!(
        bare(&addr_b),
        bare(&addr_a),
        "B was given A's address: GC released it while A runs\n{}",
        d.log_text()
    );
    assert_eq!(
        fs::read(&held_by_a).ok().as_deref(),
        Some(&b"pod-a\r\neth0"[..]),
        "A's reservation is gone: {:?}",
        e.reservations(net)
    );
    assert!(ns_a.iface("eth0").unwrap().has_addr(&addr_a));
    assert!(ns_b.iface("eth0").unwrap().has_addr(&addr_b));

    // A's DEL, without its record, runs the configured network: the
    // address goes back then, and only then.
    ok(&d, &cni(&d, "DEL", "pod-b", &ns_b, "eth0"));
    ok(&d, &cni(&d, "DEL", "pod-a", &ns_a, "eth0"));
    ok(&d, &cni(&d, "DEL", "pod-c", &ns_c, "eth0"));
    for ns in [&ns_a, &ns_b, &ns_c] {
        assert!(!ns.has_link("eth0"), "{:?}", ns.ifaces());
    }
    assert_eq!(e.reservations(net), Vec::<String>::new());
    assert_eq!(bridge_ports(&br.name), Vec::<String>::new());
    let listed: Value = json!(e.records());
    assert_eq!(listed, json!(["damaged"]), "records left: {listed}");
}
