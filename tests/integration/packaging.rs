//! The distribution packages (`bash packaging/build.sh`, which `.ci/run`
//! runs before the tests; this test builds them when they are missing):
//! file lists and control data, lintian, an unpack into a throw-away root
//! with dpkg, the installed service's security exposure, the packaged
//! configuration, and the RPM's file list and payload. Their documentation
//! and man pages are `packaging_docs`'s; what their maintainer and removal
//! scripts do, `packaging_scripts`'s.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::packaging_docs::assert_docs_installed;
use crate::support::daemon::TestDir;
use crate::support::systemd::analyze_offline;

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// plexusd.service's exposure with the plugins started outside it
/// (plexus-plugins.service): 2.6 (3.7 while the plugins ran under it).
const MAX_EXPOSURE: f64 = 2.6;

pub(super) fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub(super) fn stdout(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&run(cmd).stdout).into_owned()
}

/// Asserts that `plexusd --check-config` accepts `config`; returns it.
fn valid_config(plexusd: &Path, config: &Path) -> serde_json::Value {
    let check = stdout(
        Command::new(plexusd)
            .arg("--config")
            .arg(config)
            .arg("--check-config"),
    );
    assert!(check.contains("configuration is valid"), "{check}");
    serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap()
}

/// The built packages, building them first when they are missing.
pub(super) fn packages() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = repo().join("target/packages");
        let deb = dir.join(format!("plexus_{VERSION}-1_amd64.deb"));
        let rpm = dir.join(format!("plexus-{VERSION}-1.x86_64.rpm"));
        if !deb.exists() || !rpm.exists() {
            run(Command::new("bash")
                .arg(repo().join("packaging/build.sh"))
                .current_dir(repo()));
        }
        (deb, rpm)
    })
}

/// The .deb's regular files and their modes, besides the documentation
/// in docs/ ([`deb_files`]).
const DEB_FILES: &[(&str, u32)] = &[
    ("/usr/bin/plexusd", 0o755),
    ("/usr/lib/cni/plexus-shim", 0o755),
    ("/usr/libexec/plexus/plexus-spawner", 0o755),
    ("/lib/systemd/system/plexusd.socket", 0o644),
    ("/lib/systemd/system/plexusd.service", 0o644),
    ("/lib/systemd/system/plexusd-multus.socket", 0o644),
    ("/lib/systemd/system/plexus-config.path", 0o644),
    ("/lib/systemd/system/plexus-config.service", 0o644),
    ("/lib/systemd/system/plexus-shim-link.service", 0o644),
    ("/lib/systemd/system/plexus-plugins.socket", 0o644),
    ("/lib/systemd/system/plexus-plugins.service", 0o644),
    ("/etc/plexus/daemon-config.json", 0o644),
    ("/usr/lib/tmpfiles.d/plexus.conf", 0o644),
    ("/usr/share/man/man8/plexusd.8.gz", 0o644),
    ("/usr/share/man/man8/plexus-shim.8.gz", 0o644),
    ("/usr/share/bash-completion/completions/plexusd", 0o644),
    ("/usr/share/zsh/vendor-completions/_plexusd", 0o644),
    ("/usr/share/fish/vendor_completions.d/plexusd.fish", 0o644),
    ("/usr/share/doc/plexus/copyright", 0o644),
    ("/usr/share/doc/plexus/changelog.Debian.gz", 0o644),
    ("/usr/share/doc/plexus/README.md", 0o644),
    ("/usr/share/doc/plexus/examples/00-plexus.conflist", 0o644),
    ("/usr/share/lintian/overrides/plexus", 0o644),
];

/// The documents in the repository's docs/ (file names).
pub(super) fn repo_docs() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    docs.sort();
    assert!(docs.contains(&"shim.md".to_string()), "{docs:?}");
    docs
}

/// Every regular file of the .deb with its mode: [`DEB_FILES`] and each
/// of docs/*.md in /usr/share/doc/plexus/docs/, where README's links
/// (`docs/x.md`) find them.
fn deb_files() -> BTreeSet<(String, u32)> {
    let mut files: BTreeSet<(String, u32)> =
        DEB_FILES.iter().map(|(p, m)| (p.to_string(), *m)).collect();
    for doc in repo_docs() {
        files.insert((format!("/usr/share/doc/plexus/docs/{doc}"), 0o644));
    }
    files
}

#[test]
fn deb_should_carry_the_expected_files_and_control_data() {
    let (deb, _) = packages();
    let listing = stdout(Command::new("dpkg-deb").arg("-c").arg(deb));
    let files: BTreeSet<(String, u32)> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let mode = l.split_whitespace().next().unwrap();
            let bits = mode[1..]
                .chars()
                .fold(0u32, |acc, c| (acc << 1) | u32::from(c != '-'));
            let path = l.split_whitespace().last().unwrap().trim_start_matches('.');
            (path.to_string(), bits)
        })
        .collect();
    assert_eq!(files, deb_files(), "dpkg-deb -c:\n{listing}");
    // Debian policy: nothing under /opt (plexus-shim-link.service links
    // the shim there at run time).
    assert!(!listing.lines().any(|l| l.contains(" ./opt/")), "{listing}");

    let field = |name: &str| {
        stdout(Command::new("dpkg-deb").arg("-f").arg(deb).arg(name))
            .trim()
            .to_string()
    };
    assert_eq!(field("Package"), "plexus");
    assert_eq!(field("Version"), format!("{VERSION}-1"));
    assert_eq!(field("Architecture"), "amd64");
    assert_eq!(field("Section"), "net");
    assert!(field("Depends").contains("libc6"), "{}", field("Depends"));
    for tool in ["iproute2", "util-linux"] {
        assert!(field("Depends").contains(tool), "{}", field("Depends"));
    }
    assert_eq!(field("Recommends"), "containernetworking-plugins");

    let control = TestDir::new("debctl");
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(deb)
        .arg(&control.path));
    let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/plexus/daemon-config.json");
    for script in ["postinst", "prerm", "postrm"] {
        let md = std::fs::metadata(control.join(script)).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o755, "{script}");
        let text = std::fs::read_to_string(control.join(script)).unwrap();
        assert!(!text.contains("#DEBHELPER#"), "{script}");
        // Upgrades restart the service only, never the socket.
        assert!(!text.contains("restart plexusd.socket"), "{script}");
    }
}

#[test]
fn deb_should_pass_lintian() {
    let (deb, _) = packages();
    // Warnings that remain are overridden, with reasons, in
    // packaging/debian/lintian-overrides.
    let out = Command::new("lintian")
        .args(["--fail-on", "error,warning"])
        .arg(deb)
        .output()
        .expect("run lintian (apt-get install lintian)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && !text
                .lines()
                .any(|l| l.starts_with("E:") || l.starts_with("W:")),
        "lintian: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where `path` of the package is in an unpacked root: conffiles wait as
/// `<path>.dpkg-new` until dpkg configures the package.
pub(super) fn installed(root: &Path, path: &str) -> PathBuf {
    let p = root.join(path.trim_start_matches('/'));
    if path.starts_with("/etc/") {
        let mut s = p.into_os_string();
        s.push(".dpkg-new");
        return PathBuf::from(s);
    }
    p
}

/// A scratch dpkg root with the package unpacked into it.
pub(super) fn unpacked(tag: &str) -> TestDir {
    let (deb, _) = packages();
    let root = TestDir::new(tag);
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(root.path.join(d)).unwrap();
    }
    std::fs::write(root.path.join("var/lib/dpkg/status"), "").unwrap();
    run(Command::new("dpkg")
        .arg(format!("--root={}", root.path.display()))
        .args(["--log=/dev/null", "--force-depends", "--unpack"])
        .arg(deb));
    root
}

#[test]
fn deb_should_unpack_into_a_root_with_everything_in_place() {
    let root = unpacked("debroot");
    let r = |p: &str| installed(&root.path, p);
    for (path, mode) in deb_files() {
        let md = std::fs::metadata(r(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(md.permissions().mode() & 0o777, mode, "{path}");
        assert_eq!((md.uid(), md.gid()), (0, 0), "{path}");
    }
    let status = stdout(
        Command::new("dpkg")
            .arg(format!("--root={}", root.path.display()))
            .args(["-s", "plexus"]),
    );
    assert!(status.contains("Status: install ok unpacked"), "{status}");
    assert!(
        status.contains("/etc/plexus/daemon-config.json"),
        "{status}"
    );

    // The default configuration is valid and names the plugin directory
    // of kubeadm-style nodes and containerd, then Debian's.
    let cfg = valid_config(&r("/usr/bin/plexusd"), &r("/etc/plexus/daemon-config.json"));
    assert_eq!(cfg["binDir"], "/opt/cni/bin:/usr/lib/cni");
    assert_eq!(
        search_path(&r("/etc/plexus/daemon-config.json")),
        ["/opt/cni/bin", "/usr/lib/cni"]
    );
    assert_eq!(cfg["confDir"], "/etc/cni/net.d");
    // Plugins are started by plexus-plugins.service, whose socket this is,
    // with the spawner this package installs.
    assert_eq!(cfg["pluginSpawner"], "/run/plexus/plugins.sock");
    let plugins_socket =
        std::fs::read_to_string(r("/lib/systemd/system/plexus-plugins.socket")).unwrap();
    assert!(
        plugins_socket.contains("\nListenSequentialPacket=/run/plexus/plugins.sock\n"),
        "{plugins_socket}"
    );
    let plugins_service =
        std::fs::read_to_string(r("/lib/systemd/system/plexus-plugins.service")).unwrap();
    assert!(
        plugins_service.contains("\nExecStart=/usr/libexec/plexus/plexus-spawner "),
        "{plugins_service}"
    );
    // The link unit links the shim this package installs.
    let link = std::fs::read_to_string(r("/lib/systemd/system/plexus-shim-link.service")).unwrap();
    assert!(
        link.contains("\nExecStart=/bin/ln -s /usr/lib/cni/plexus-shim /opt/cni/bin/plexus-shim\n"),
        "{link}"
    );
    // The installed shim is a working CNI plugin.
    let version = run(Command::new(r("/usr/lib/cni/plexus-shim"))
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::null()));
    let v: serde_json::Value = serde_json::from_slice(&version.stdout).unwrap();
    assert!(v["supportedVersions"].as_array().unwrap().len() >= 4, "{v}");
    let man = stdout(Command::new("zcat").arg(r("/usr/share/man/man8/plexusd.8.gz")));
    assert!(
        man.contains(".TH plexusd 8") && man.contains("check\\-config"),
        "{man}"
    );

    // The installed units: clean, and no more exposed than the reference.
    let service = r("/lib/systemd/system/plexusd.service");
    let Some(out) = analyze_offline(&["security", "--offline=yes", service.to_str().unwrap()])
    else {
        println!("skipping the security score: systemd-analyze cannot run here");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let score: f64 = text
        .lines()
        .find_map(|l| l.split("plexusd.service: ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    println!("installed plexusd.service exposure: {score}");
    assert!(
        score <= MAX_EXPOSURE,
        "exposure {score} > {MAX_EXPOSURE}:\n{text}"
    );
}

/// The plugin search path `config` gives plexusd, as plexusd reads it.
fn search_path(config: &Path) -> Vec<String> {
    let cfg = plexus::config::Config::load(config, false).unwrap_or_else(|e| panic!("{e}"));
    cfg.cni
        .bin_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect()
}

/// The RPM's payload, unpacked into a scratch directory.
fn rpm_payload(tag: &str) -> TestDir {
    let (_, rpm) = packages();
    let dir = TestDir::new(tag);
    let script = format!(
        "rpm2archive - < '{}' | tar -xzf - -C '{}'",
        rpm.display(),
        dir.path.display()
    );
    run(Command::new("sh").args(["-c", &script]));
    dir
}

#[test]
fn rpm_should_list_the_fedora_layout() {
    let (_, rpm) = packages();
    let files: BTreeSet<String> = stdout(Command::new("rpm").arg("-qlp").arg(rpm))
        .lines()
        .map(str::to_string)
        .collect();
    let want: BTreeSet<String> = [
        "/etc/plexus/daemon-config.json",
        "/usr/bin/plexusd",
        "/usr/libexec/cni/plexus-shim",
        "/usr/libexec/plexus/plexus-spawner",
        "/usr/lib/systemd/system/plexusd.service",
        "/usr/lib/systemd/system/plexusd.socket",
        "/usr/lib/systemd/system/plexusd-multus.socket",
        "/usr/lib/systemd/system/plexus-config.path",
        "/usr/lib/systemd/system/plexus-config.service",
        "/usr/lib/systemd/system/plexus-shim-link.service",
        "/usr/lib/systemd/system/plexus-plugins.socket",
        "/usr/lib/systemd/system/plexus-plugins.service",
        "/usr/lib/tmpfiles.d/plexus.conf",
        "/usr/share/bash-completion/completions/plexusd",
        "/usr/share/doc/plexus/README.md",
        "/usr/share/fish/vendor_completions.d/plexusd.fish",
        "/usr/share/man/man8/plexusd.8.gz",
        "/usr/share/man/man8/plexus-shim.8.gz",
        "/usr/share/zsh/site-functions/_plexusd",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(
        repo_docs()
            .iter()
            .map(|d| format!("/usr/share/doc/plexus/docs/{d}")),
    )
    .collect();
    assert_eq!(files, want);
    let config = stdout(Command::new("rpm").arg("-qp").arg("--configfiles").arg(rpm));
    assert_eq!(config.trim(), "/etc/plexus/daemon-config.json");
    let scripts = stdout(Command::new("rpm").arg("-qp").arg("--scripts").arg(rpm));
    for needle in [
        "enable --now plexusd.socket",
        "enable --now plexus-plugins.socket",
        "try-restart plexus-plugins.service plexusd.service",
        "disable --now plexusd.socket plexusd.service",
        "disable --now plexus-plugins.socket plexus-plugins.service",
        "enable --now plexus-shim-link.service",
        "start plexus-shim-link.service",
    ] {
        assert!(scripts.contains(needle), "{needle:?} not in:\n{scripts}");
    }
    assert!(!scripts.contains("restart plexusd.socket"), "{scripts}");

    let payload = rpm_payload("rpmpayload");
    let p = |path: &str| payload.path.join(path.trim_start_matches('/'));
    // The RPM's default configuration is valid and names the plugin
    // directory of kubeadm-style nodes and containerd, then Fedora's
    // (containernetworking-plugins installs into /usr/libexec/cni).
    let cfg = valid_config(
        Path::new(env!("CARGO_BIN_EXE_plexusd")),
        &p("/etc/plexus/daemon-config.json"),
    );
    assert_eq!(cfg["binDir"], "/opt/cni/bin:/usr/libexec/cni");
    assert_eq!(
        search_path(&p("/etc/plexus/daemon-config.json")),
        ["/opt/cni/bin", "/usr/libexec/cni"]
    );
    // The link unit links the shim at Fedora's path, which this package
    // installs.
    let link =
        std::fs::read_to_string(p("/usr/lib/systemd/system/plexus-shim-link.service")).unwrap();
    assert!(
        link.contains(
            "\nExecStart=/bin/ln -s /usr/libexec/cni/plexus-shim /opt/cni/bin/plexus-shim\n"
        ),
        "{link}"
    );
    assert!(!link.contains("/usr/lib/cni"), "{link}");
    assert!(p("/usr/libexec/cni/plexus-shim").is_file());
    assert_docs_installed(&p("/usr/share/doc/plexus"));
    // The units themselves are the repository's.
    for unit in [
        "plexusd.service",
        "plexusd.socket",
        "plexus-plugins.service",
        "plexus-plugins.socket",
    ] {
        assert_eq!(
            std::fs::read(p(&format!("/usr/lib/systemd/system/{unit}"))).unwrap(),
            std::fs::read(repo().join("systemd").join(unit)).unwrap(),
            "{unit}"
        );
    }
}
