//! The packages' maintainer scripts, run for real: in a private mount
//! namespace with scratch `/var/lib` and `/opt`, against stubs or the
//! private systemd manager. Installation enables the socket and the shim
//! link and leaves the service to activation; removal deletes only its own
//! link and warns before purging containers' records.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::packaging::{installed, packages, stdout, unpacked};
use crate::support::daemon::TestDir;
use crate::support::systemd::{skip_reason, Manager};

/// Runs a maintainer script of the unpacked package with [`host_script`].
fn maintainer_script(
    root: &Path,
    tools: &Path,
    script: &str,
    args: &[&str],
    prepare: &str,
    after: &str,
) -> Output {
    let path = root.join(format!("var/lib/dpkg/info/plexus.{script}"));
    host_script(tools, &path, args, prepare, after)
}

/// Runs `script` with `sh` in a private mount namespace that looks like a
/// systemd host (`/run/systemd/system`), with `systemctl`,
/// `deb-systemd-helper`, `deb-systemd-invoke` and `systemd-tmpfiles` taken
/// from `tools` (the private manager's, or stubs), and `/var/lib` and
/// `/opt` scratch tmpfs mounts (so a script cannot touch the host's).
/// `prepare` and `after` are shell run before and after it.
fn host_script(tools: &Path, script: &Path, args: &[&str], prepare: &str, after: &str) -> Output {
    assert!(
        Path::new("/opt").is_dir(),
        "/opt is missing: nothing to mount over"
    );
    let inner = format!(
        "set -e; mount -t tmpfs plexus-test /run/systemd; mkdir /run/systemd/system; \
         mount -t tmpfs plexus-test /var/lib; mount -t tmpfs plexus-test /opt; \
         {prepare}; sh {} {}; {after}",
        script.display(),
        args.join(" ")
    );
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &inner])
        .env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", tools.display()),
        )
        .output()
        .unwrap()
}

/// Stand-ins for `systemctl`, `deb-systemd-helper`, `deb-systemd-invoke`
/// and `systemd-tmpfiles` that only log their calls to `<tools>/calls`,
/// for scripts whose work on the units is not under test.
fn stub_tools(tools: &Path) {
    std::fs::create_dir_all(tools).unwrap();
    for name in [
        "systemctl",
        "deb-systemd-helper",
        "deb-systemd-invoke",
        "systemd-tmpfiles",
    ] {
        let p = tools.join(name);
        let body = format!(
            "#!/bin/sh\necho \"{name} $*\" >> '{}'\nexit 0\n",
            tools.join("calls").display()
        );
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Shell that puts `n` attachment records into /var/lib/plexus (inside
/// [`host_script`]'s namespace), and a temporary file that is not one.
fn records(n: usize) -> String {
    let mut sh = String::from("mkdir -p /var/lib/plexus/attachments; ");
    for i in 0..n {
        sh.push_str(&format!(
            "echo '{{}}' > /var/lib/plexus/attachments/c{i}.json; "
        ));
    }
    sh + "touch /var/lib/plexus/attachments/.c0.1.2.tmp"
}

/// Shell that makes /opt/cni/bin/plexus-shim (inside [`host_script`]'s
/// namespace): a link to `target`, or a regular file when `target` is
/// empty.
fn opt_shim(target: &str) -> String {
    if target.is_empty() {
        "mkdir -p /opt/cni/bin; echo other > /opt/cni/bin/plexus-shim".into()
    } else {
        format!("mkdir -p /opt/cni/bin; ln -s {target} /opt/cni/bin/plexus-shim")
    }
}

/// Checks a removal script of either package: removal deletes the link
/// in /opt/cni/bin only while it points to `shim`; deleting the records
/// warns on stderr with their number and container ids, and stays quiet
/// without records. `run(args, prepare, after)` runs the script in
/// [`host_script`]'s namespace; `remove` and `delete` are the arguments
/// of the removal and of the run that deletes the records, `keep` those
/// of a run that must leave both alone (an upgrade), if any.
fn check_removal_script(
    run: &dyn Fn(&[&str], &str, &str) -> Output,
    shim: &str,
    remove: &[&str],
    delete: &[&str],
    keep: Option<&[&str]>,
) {
    let ok = |args: &[&str], prepare: &str, after: &str| {
        let out = run(args, prepare, after);
        assert!(
            out.status.success(),
            "{args:?} with `{prepare}`, then `{after}`: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Its own link goes; another link or a file stays.
    ok(
        remove,
        &opt_shim(shim),
        "test ! -e /opt/cni/bin/plexus-shim && test ! -L /opt/cni/bin/plexus-shim",
    );
    ok(
        remove,
        &opt_shim("/usr/local/bin/plexus-shim"),
        "test \"$(readlink /opt/cni/bin/plexus-shim)\" = /usr/local/bin/plexus-shim",
    );
    ok(
        remove,
        &opt_shim(""),
        "grep -qx other /opt/cni/bin/plexus-shim",
    );
    // Nothing under /opt: nothing made there.
    ok(remove, "true", "test -z \"$(ls -A /opt)\"");

    // Records: a warning with their number and ids, on stderr, then gone.
    let warning = ok(delete, &records(12), "test ! -e /var/lib/plexus");
    println!("{delete:?} with 12 records said:\n{warning}");
    assert!(
        warning.contains("12 container(s)") && warning.contains("/var/lib/plexus/attachments"),
        "{warning}"
    );
    for id in ["c0", "c1", "c10"] {
        assert!(
            warning
                .lines()
                .any(|l| l.trim_end().ends_with(&format!(" {id}"))),
            "{id} not listed:\n{warning}"
        );
    }
    assert!(!warning.contains(".c0.1.2"), "{warning}");
    assert!(warning.contains("kubectl drain"), "{warning}");
    let warning = ok(delete, &records(1), "test ! -e /var/lib/plexus");
    assert!(warning.contains("1 container(s)"), "{warning}");
    // No records, no warning.
    let quiet = ok(
        delete,
        "mkdir -p /var/lib/plexus/attachments",
        "test ! -e /var/lib/plexus",
    );
    assert!(!quiet.contains("plexus:"), "{quiet}");
    let quiet = ok(delete, "true", "true");
    assert!(!quiet.contains("plexus:"), "{quiet}");
    if let Some(keep) = keep {
        let both = format!("{}; {}", records(3), opt_shim(shim));
        let said = ok(
            keep,
            &both,
            "test -f /var/lib/plexus/attachments/c2.json && test -L /opt/cni/bin/plexus-shim",
        );
        assert!(!said.contains("plexus:"), "{said}");
    }
}

#[test]
fn deb_removal_should_remove_only_its_own_link_and_warn_before_purging_records() {
    let root = unpacked("debremoval");
    let tools = TestDir::new("debremoval-tools");
    stub_tools(&tools.path);
    let postrm = |args: &[&str], prepare: &str, after: &str| {
        maintainer_script(&root.path, &tools.path, "postrm", args, prepare, after)
    };
    check_removal_script(
        &postrm,
        "/usr/lib/cni/plexus-shim",
        &["remove"],
        &["purge"],
        Some(&["upgrade", "0.2.0-1"]),
    );
}

#[test]
fn rpm_removal_should_remove_only_its_own_link_and_warn_before_deleting_records() {
    let (_, rpm) = packages();
    let dir = TestDir::new("rpmremoval");
    let tools = dir.join("tools");
    stub_tools(&tools);
    let postun = dir.join("postun.sh");
    std::fs::write(
        &postun,
        stdout(
            Command::new("rpm")
                .args(["-qp", "--qf", "%{POSTUN}"])
                .arg(rpm),
        ),
    )
    .unwrap();
    let run = |args: &[&str], prepare: &str, after: &str| {
        host_script(&tools, &postun, args, prepare, after)
    };
    // %postun: 0 after the last version is erased, 1 after an upgrade.
    check_removal_script(
        &run,
        "/usr/libexec/cni/plexus-shim",
        &["0"],
        &["0"],
        Some(&["1"]),
    );
}

/// Wrapper commands that turn the system-scope calls of the maintainer
/// scripts into `systemctl --user` calls on the private manager, and log
/// every call to `<tools>/calls`.
pub(super) fn write_tools(m: &Manager, tools: &Path) {
    std::fs::create_dir_all(tools).unwrap();
    let env: String = m
        .client_env()
        .iter()
        .map(|(k, v)| format!("{k}='{v}' "))
        .collect();
    let log = tools.join("calls");
    let systemctl = format!(
        "#!/bin/bash\necho \"systemctl $*\" >> '{log}'\na=()\nfor x in \"$@\"; do [ \"$x\" = --system ] || a+=(\"$x\"); done\n\
         exec env -i {env} nsenter --mount --target={pid} -- systemctl --user --no-pager \"${{a[@]}}\"\n",
        log = log.display(),
        pid = m.pid(),
    );
    let helper = format!(
        "#!/bin/bash\necho \"deb-systemd-helper $*\" >> '{log}'\n[ \"$1\" = --quiet ] && shift\ncmd=$1; shift\n\
         case $cmd in\n  unmask|enable|disable) exec '{tools}/systemctl' \"$cmd\" \"$@\" ;;\n  *) exit 0 ;;\nesac\n",
        log = log.display(),
        tools = tools.display(),
    );
    let invoke = format!(
        "#!/bin/bash\necho \"deb-systemd-invoke $*\" >> '{log}'\nexec '{tools}/systemctl' \"$@\"\n",
        log = log.display(),
        tools = tools.display(),
    );
    let tmpfiles = format!(
        "#!/bin/bash\necho \"systemd-tmpfiles $*\" >> '{log}'\n",
        log = log.display()
    );
    for (name, body) in [
        ("systemctl", systemctl),
        ("deb-systemd-helper", helper),
        ("deb-systemd-invoke", invoke),
        ("systemd-tmpfiles", tmpfiles),
    ] {
        let p = tools.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn deb_maintainer_scripts_should_enable_the_socket_and_leave_the_service_to_activation() {
    if let Some(why) = skip_reason() {
        println!("skipping: {why}");
        return;
    }
    let root = unpacked("debscripts");
    let Some(m) = Manager::start() else {
        return;
    };
    let work = m.work_dir().to_path_buf();
    let sock = work.join("sock/plexus.sock");
    // The package's units, pointed at the work dir: the socket node, and a
    // copy of the packaged plexusd with a config naming that socket.
    let unit = |name: &str| {
        std::fs::read_to_string(root.path.join("lib/systemd/system").join(name)).unwrap()
    };
    let bin = work.join("plexusd");
    std::fs::copy(root.path.join("usr/bin/plexusd"), &bin).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_slice(
        &std::fs::read(installed(&root.path, "/etc/plexus/daemon-config.json")).unwrap(),
    )
    .unwrap();
    cfg["socketDir"] = serde_json::json!(work.join("sock"));
    cfg["stateDir"] = serde_json::json!(work.join("state/plexus"));
    std::fs::write(work.join("daemon-config.json"), cfg.to_string()).unwrap();
    let socket = unit("plexusd.socket").replace("/run/plexus/plexus.sock", sock.to_str().unwrap());
    let log = work.join("plexusd.log");
    let exec = format!(
        "ExecStart={} --config {}\nStandardOutput=append:{}\nStandardError=append:{}",
        bin.display(),
        work.join("daemon-config.json").display(),
        log.display(),
        log.display()
    );
    let service = unit("plexusd.service")
        .replace(
            "ExecStart=/usr/bin/plexusd --config /etc/plexus/daemon-config.json",
            &exec,
        )
        .replace("[Unit]\n", "[Unit]\nStartLimitIntervalSec=0\n");
    assert!(
        service.contains(bin.to_str().unwrap()),
        "ExecStart not substituted"
    );
    // The shim link unit, linking into <work>/opt/cni/bin.
    let link_dir = work.join("opt/cni/bin");
    std::fs::create_dir_all(&link_dir).unwrap();
    let shim = root.path.join("usr/lib/cni/plexus-shim");
    let link_unit = crate::support::systemd::shim_link_unit(
        &unit("plexus-shim-link.service"),
        &link_dir,
        &shim,
        &work.join("shim-link.log"),
    );
    m.install_units(&[
        ("plexusd.socket", &socket),
        ("plexusd.service", &service),
        ("plexus-shim-link.service", &link_unit),
    ]);
    let tools = work.join("tools");
    write_tools(&m, &tools);
    let script = |name: &str, args: &[&str], prepare: &str, after: &str| {
        let out = maintainer_script(&root.path, &tools, name, args, prepare, after);
        assert!(
            out.status.success(),
            "{name} {args:?}: {}\n{}\ncalls:\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(tools.join("calls")).unwrap_or_default(),
            m.describe_failure()
        );
    };

    // Fresh install: the socket is enabled and listening; the service is not
    // running until the first call.
    script("postinst", &["configure"], "true", "true");
    // Enabled: `systemctl enable` linked it into sockets.target (the
    // harness's manager reads units from one directory only, so
    // `is-enabled` cannot see the link; the link itself is the evidence).
    let wants = work.join("config/systemd/user/sockets.target.wants/plexusd.socket");
    assert!(
        wants.symlink_metadata().is_ok(),
        "plexusd.socket was not enabled"
    );
    assert_eq!(m.show("plexusd.socket", "SubState"), "listening");
    assert_eq!(m.show("plexusd.service", "ActiveState"), "inactive");
    // The shim link unit is enabled (it runs at every boot) and ran: the
    // runtime finds the shim in its plugin directory.
    assert!(
        work.join("config/systemd/user/multi-user.target.wants/plexus-shim-link.service")
            .symlink_metadata()
            .is_ok(),
        "plexus-shim-link.service was not enabled"
    );
    assert_eq!(
        std::fs::read_link(link_dir.join("plexus-shim")).ok(),
        Some(shim.clone()),
        "{}",
        m.describe_failure()
    );
    // The optional units are shipped disabled: never named on install.
    let calls = std::fs::read_to_string(tools.join("calls")).unwrap_or_default();
    for unit in [
        "plexusd-multus.socket",
        "plexus-config.path",
        "plexus-config.service",
    ] {
        assert!(!calls.contains(unit), "postinst touched {unit}:\n{calls}");
    }
    let inode = std::fs::metadata(&sock).unwrap().ino();
    let r = crate::support::http::request(&sock, "GET", "/healthz", b"").unwrap();
    assert_eq!(r.status, 200);
    m.wait_property(
        "plexusd.service",
        "ActiveState",
        "active",
        Duration::from_secs(10),
    );
    let first_pid = m.show("plexusd.service", "MainPID");

    // Upgrade: the running service is restarted, the socket is not.
    script("postinst", &["configure", "0.0.9-1"], "true", "true");
    m.wait_property(
        "plexusd.service",
        "ActiveState",
        "active",
        Duration::from_secs(10),
    );
    let second_pid = m.show("plexusd.service", "MainPID");
    assert_ne!(first_pid, second_pid, "upgrade did not restart the service");
    assert_eq!(
        std::fs::metadata(&sock).unwrap().ino(),
        inode,
        "the socket was recreated"
    );
    // "running" while the service holds it.
    assert_eq!(m.show("plexusd.socket", "ActiveState"), "active");
    let calls = std::fs::read_to_string(tools.join("calls")).unwrap();
    assert!(!calls.contains("restart plexusd.socket"), "{calls}");

    // Removal stops both and disables the socket.
    script("prerm", &["remove"], "true", "true");
    assert_eq!(m.show("plexusd.socket", "ActiveState"), "inactive");
    assert_eq!(m.show("plexusd.service", "ActiveState"), "inactive");
    script("postrm", &["remove"], "true", "true");
    assert!(
        wants.symlink_metadata().is_err(),
        "plexusd.socket is still enabled"
    );
    assert!(
        work.join("config/systemd/user/multi-user.target.wants/plexus-shim-link.service")
            .symlink_metadata()
            .is_err(),
        "plexus-shim-link.service is still enabled"
    );

    // Purge removes the state directory (a scratch /var/lib here).
    script(
        "postrm",
        &["purge"],
        "mkdir -p /var/lib/plexus/attachments && touch /var/lib/plexus/attachments/c.json",
        "test ! -e /var/lib/plexus",
    );
}
