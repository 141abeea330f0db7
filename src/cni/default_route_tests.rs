//! Unit tests of [`super`].

use super::*;
use std::time::Instant;

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn no_key_anywhere_should_plan_nothing() {
    assert_eq!(plan(&[None, None]), Ok(None));
    assert_eq!(plan(&[]), Ok(None));
}

#[test]
fn an_empty_list_should_mark_its_own_network_only() {
    let empty: Vec<IpAddr> = vec![];
    let marks = plan(&[None, Some(&empty)]).unwrap().unwrap();
    assert!(!marks[0].filter_v4 && !marks[0].filter_v6);
    assert!(marks[1].filter_v4 && marks[1].filter_v6 && marks[1].gateways.is_empty());
}

#[test]
fn a_gateway_should_take_its_family_only() {
    let gw = ips(&["10.1.1.1"]);
    let marks = plan(&[None, Some(&gw)]).unwrap().unwrap();
    // IPv4 is net1's now; IPv6 is left as the plugins made it.
    assert!(marks[0].filter_v4 && !marks[0].filter_v6);
    assert!(marks[1].filter_v4 && !marks[1].filter_v6);
    let six = ips(&["fd00::1"]);
    let marks = plan(&[None, Some(&six)]).unwrap().unwrap();
    assert!(!marks[0].filter_v4 && marks[0].filter_v6);
    let dual = ips(&["10.1.1.1", "fd00::1"]);
    let marks = plan(&[None, Some(&dual)]).unwrap().unwrap();
    assert!(marks[0].filter_v4 && marks[0].filter_v6);
}

#[test]
fn two_gateways_of_a_family_should_be_refused() {
    let a = ips(&["10.1.1.1"]);
    let b = ips(&["10.2.2.1"]);
    let e = plan(&[None, Some(&a), Some(&b)]).unwrap_err();
    assert_eq!(e, Ecmp { v4: 2, v6: 0 });
    assert!(e.to_string().starts_with(ECMP_MESSAGE), "{e}");
    let six = ips(&["fd00::1", "fd00::2", "10.0.0.1"]);
    assert_eq!(plan(&[Some(&six)]), Err(Ecmp { v4: 1, v6: 2 }));
}

#[test]
fn actions_should_clear_first_then_add_and_skip_networks_without_attachment() {
    let gw = ips(&["10.1.1.1"]);
    let marks = plan(&[None, Some(&gw), None]).unwrap().unwrap();
    let got = actions([
        (&marks[0], "eth0", true),
        (&marks[1], "net1", true),
        (&marks[2], "net2", false),
    ]);
    assert_eq!(
        got,
        [
            Action::Clear {
                ifname: "eth0".into(),
                v4: true,
                v6: false
            },
            Action::Clear {
                ifname: "net1".into(),
                v4: true,
                v6: false
            },
            Action::Add {
                ifname: "net1".into(),
                gateway: gw[0]
            },
        ]
    );
}

#[test]
fn attachment_should_be_seen_in_every_result_version() {
    assert!(shows_attachment(
        &serde_json::json!({"interfaces": [{"name": "eth0"}]})
    ));
    assert!(shows_attachment(
        &serde_json::json!({"ips": [{"address": "10.0.0.2/24"}]})
    ));
    assert!(shows_attachment(
        &serde_json::json!({"ip4": {"ip": "10.0.0.2/24"}})
    ));
    assert!(!shows_attachment(
        &serde_json::json!({"cniVersion": "1.0.0", "ips": []})
    ));
    assert!(!shows_attachment(&serde_json::json!({"dns": {}})));
}

#[tokio::test]
async fn a_command_past_its_deadline_should_be_killed_with_its_group() {
    // A shell and its background child: both are in the killed group.
    let marker = format!("60.{}", std::process::id());
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &format!("sleep {marker} & sleep {marker}; true")]);
    let started = Instant::now();
    let e = run_bounded(cmd, "sh", Duration::from_millis(300))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(e.contains("did not finish within 0.3 s"), "{e}");
    let wanted = format!("sleep\0{marker}\0");
    let running = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|d| std::fs::read(d.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).into_owned())
            .filter(|c| *c == wanted)
            .collect()
    };
    // SIGKILL is queued: the group's other members die when next
    // scheduled, which a loaded machine may delay a little.
    let gone_by = Instant::now() + Duration::from_secs(5);
    let mut left = running();
    while !left.is_empty() && Instant::now() < gone_by {
        std::thread::yield_now();
        left = running();
    }
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[tokio::test]
async fn a_failing_command_should_report_its_stderr() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo first >&2; echo second >&2; exit 3"]);
    let e = run_bounded(cmd, "sh", COMMAND_TIMEOUT).await.unwrap_err();
    assert!(
        e.contains("exit status: 3") && e.contains("first; second"),
        "{e}"
    );
}

#[tokio::test]
async fn a_bad_ifname_should_be_refused_before_anything_runs() {
    let e = apply(
        "/nonexistent",
        vec![Action::Clear {
            ifname: "a b".into(),
            v4: true,
            v6: true,
        }],
        COMMAND_TIMEOUT,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::BadIfname { .. }), "{e}");
}

#[tokio::test]
async fn a_failed_command_should_name_the_interface_and_the_gateway() {
    let e = apply(
        "/nonexistent/netns",
        vec![Action::Add {
            ifname: "net1".into(),
            gateway: "10.1.1.1".parse().unwrap(),
        }],
        COMMAND_TIMEOUT,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("net1") && e.contains("10.1.1.1") && e.contains("/nonexistent/netns"),
        "{e}"
    );
}
