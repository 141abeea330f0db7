//! systemd/plexusd-multus.socket: plexusd.service activated through
//! multus's socket path, answering multus-shim's captured requests
//! (tests/fixtures/multus-wire) byte for byte as multus-daemon did, with
//! one daemon process serving both sockets.
//!
//! Needs root; skips otherwise (or with PLEXUS_SYSTEMD_TESTS=0).

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::http::{self, Response};
use crate::support::netns::Netns;
use crate::support::systemd::{
    assert_verifies, plexus_units, skip_reason, Manager, ScratchDir, SERVICE_UNIT, SOCKET_UNIT,
};

const MULTUS_SOCKET: &str = "plexusd-multus.socket";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/multus-wire/");
const T: Duration = Duration::from_secs(10);

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The repository's plexusd-multus.socket listening on `sock` instead of
/// /run/multus/multus.sock.
fn multus_socket_unit(sock: &Path) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("systemd")
        .join(MULTUS_SOCKET);
    let text = std::fs::read_to_string(&path).unwrap();
    let from = "ListenStream=/run/multus/multus.sock";
    assert_eq!(text.matches(from).count(), 1, "{text}");
    text.replace(from, &format!("ListenStream={}", sock.display()))
}

/// A captured multus-shim request with the capture's netns and container
/// id replaced, and Content-Length set to match.
fn captured_request(name: &str, netns: &str, container_id: &str) -> Vec<u8> {
    let raw = fixture(name);
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let body: Value = serde_json::from_slice(&raw[end + 4..]).unwrap();
    let env: BTreeMap<String, String> = serde_json::from_value(body["env"].clone()).unwrap();
    // The config (base64) names neither.
    http::edit_body(&raw, |body| {
        body.replace(&env["CNI_NETNS"], netns)
            .replace(&env["CNI_CONTAINERID"], container_id)
    })
}

fn captured_netns(name: &str) -> String {
    let raw = fixture(name);
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let body: Value = serde_json::from_slice(&raw[end + 4..]).unwrap();
    body["env"]["CNI_NETNS"].as_str().unwrap().to_string()
}

fn captured_response(name: &str) -> Response {
    http::parse_response(&fixture(name)).unwrap()
}

/// The sockfs inode of the listening unix socket bound at `path`
/// (/proc/net/unix), which a process serving it holds as `socket:[inode]`.
fn listening_inode(path: &Path) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    table.lines().skip(1).find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        // Num RefCount Protocol Flags Type St Inode Path; St 01 = listening.
        (cols.len() == 8 && cols[7] == path.to_str()? && cols[5] == "01")
            .then(|| cols[6].parse().ok())
            .flatten()
    })
}

fn holds_socket(pid: u32, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|rd| {
            rd.flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
        })
        .unwrap_or(false)
}

#[test]
fn multus_socket_unit_should_pass_systemd_analyze_verify() {
    if let Some(why) = skip_reason() {
        println!("skipping: {why}");
        return;
    }
    let scratch = ScratchDir::new("analyze-multus");
    let dir = scratch.path();
    let (socket, service) = plexus_units(dir, false);
    let multus = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("systemd")
            .join(MULTUS_SOCKET),
    )
    .unwrap();
    let mut files = Vec::new();
    for (name, text) in [
        (SOCKET_UNIT, socket),
        (SERVICE_UNIT, service),
        (MULTUS_SOCKET, multus),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
        files.push(dir.join(name).display().to_string());
    }
    let files: Vec<&str> = files.iter().map(String::as_str).collect();
    assert_verifies(&files);
}

#[test]
fn multus_shim_requests_on_the_multus_socket_should_get_multus_answers_from_one_plexusd() {
    if skip_reason().is_some() {
        println!("skipping: no private systemd manager here");
        return;
    }
    // Before the manager, whose mount namespace only sees mounts made
    // before it started.
    let ns = Netns::new();
    let Some(m) = Manager::start() else {
        return;
    };
    let work = m.work_dir().to_path_buf();
    let conf = work.join("net.d");
    std::fs::create_dir(&conf).unwrap();
    std::fs::write(
        conf.join("10-lo.conflist"),
        json!({"cniVersion": "1.0.0", "name": "lo-net", "plugins": [{"type": "loopback"}]})
            .to_string(),
    )
    .unwrap();
    std::fs::write(
        work.join("daemon-config.json"),
        json!({
            "socketDir": work.join("sock"), "logLevel": "debug",
            "confDir": conf, "binDir": "/usr/lib/cni",
            "stateDir": work.join("state/plexus"), "clusterNetwork": "lo-net",
        })
        .to_string(),
    )
    .unwrap();
    let (socket, service) = plexus_units(&work, true);
    let plexus_sock = work.join("sock/plexus.sock");
    let multus_sock: PathBuf = work.join("multus/multus.sock");
    m.install_units(&[
        (SOCKET_UNIT, &socket),
        (SERVICE_UNIT, &service),
        (MULTUS_SOCKET, &multus_socket_unit(&multus_sock)),
    ]);
    m.systemctl_ok(&["start", SOCKET_UNIT, MULTUS_SOCKET]);
    assert_eq!(m.show(MULTUS_SOCKET, "SubState"), "listening");
    assert_eq!(m.show(SERVICE_UNIT, "ActiveState"), "inactive");
    let meta = std::fs::metadata(&multus_sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600, "SocketMode=0600");
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    let dir_mode = std::fs::metadata(multus_sock.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o7777, 0o700, "DirectoryMode=0700");
    let node_inode = meta.ino();

    // multus-shim's ADD: /readyz (this connection starts the daemon), /cni.
    let send = |raw: &[u8]| {
        http::send_raw(&multus_sock, raw)
            .unwrap_or_else(|e| panic!("multus socket: {e}\n{}", m.describe_failure()))
    };
    let probe = |req: &str, resp: &str| {
        let got = send(&fixture(req));
        let want = captured_response(resp);
        assert_eq!((got.status, &got.body), (want.status, &want.body), "{req}");
    };
    probe("01-ADD-readyz-request.txt", "01-ADD-readyz-response.txt");
    m.wait_property(SERVICE_UNIT, "ActiveState", "active", T);
    let pid: u32 = m.show(SERVICE_UNIT, "MainPID").parse().unwrap();
    assert_ne!(pid, 0);

    let netns = captured_netns("02-ADD-cni-request.txt");
    let add = send(&captured_request(
        "02-ADD-cni-request.txt",
        &ns.path,
        "multus-sock-1",
    ));
    let want = String::from_utf8(captured_response("02-ADD-cni-response.txt").body)
        .unwrap()
        .replace(&netns, &ns.path);
    assert_eq!(
        (add.status, add.body_str()),
        (200, want.as_str()),
        "{}",
        m.describe_failure()
    );
    let lo = ns.iface("lo").expect("no lo in the namespace");
    assert!(lo.up && lo.has_addr("127.0.0.1/8"), "{lo:?}");
    let records = work.join("state/plexus/attachments");
    assert!(records.join("multus-sock-1.json").exists());

    // multus-shim's DEL: /healthz, /cni.
    probe("03-DEL-healthz-request.txt", "03-DEL-healthz-response.txt");
    let del = send(&captured_request(
        "04-DEL-cni-request.txt",
        &ns.path,
        "multus-sock-1",
    ));
    let want = captured_response("04-DEL-cni-response.txt");
    assert_eq!((del.status, &del.body), (want.status, &want.body));
    assert!(!records.join("multus-sock-1.json").exists());
    // The error capture's readiness probe (its /cni needs a pod lookup).
    probe(
        "05-ADD-error-no-podname-readyz-request.txt",
        "05-ADD-error-no-podname-readyz-response.txt",
    );

    // The other socket reaches the same process, which holds both.
    let r = http::request(&plexus_sock, "GET", "/healthz", b"")
        .unwrap_or_else(|e| panic!("plexus.sock of the same service: {e}"));
    assert_eq!(r.status, 200);
    assert_eq!(
        m.show(SERVICE_UNIT, "MainPID"),
        pid.to_string(),
        "another process"
    );
    for sock in [&multus_sock, &plexus_sock] {
        let inode =
            listening_inode(sock).unwrap_or_else(|| panic!("{} is not listening", sock.display()));
        assert!(
            holds_socket(pid, inode),
            "plexusd ({pid}) does not hold {} (socket:[{inode}])",
            sock.display()
        );
    }

    // A service restart keeps the node (RemoveOnStop=no, nobody unlinks it).
    m.systemctl_ok(&["stop", SERVICE_UNIT]);
    assert_eq!(std::fs::metadata(&multus_sock).unwrap().ino(), node_inode);
    probe("01-ADD-readyz-request.txt", "01-ADD-readyz-response.txt");
    m.wait_property(SERVICE_UNIT, "ActiveState", "active", T);
    assert_ne!(m.show(SERVICE_UNIT, "MainPID"), pid.to_string());
}
