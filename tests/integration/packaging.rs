//! The distribution packages (`bash packaging/build.sh`, which `.ci/run`
//! runs before the tests; this test builds them when they are missing):
//! file lists and control data, lintian, an unpack into a throw-away root
//! with dpkg, the installed service's security exposure, the packaged
//! configuration, documentation and man pages, the RPM's file list and
//! payload, what the Debian maintainer scripts do to the units under a
//! private systemd manager, and what the removal scripts of both packages
//! do to the shim's link in /opt/cni/bin and to the attachment records.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use crate::support::daemon::TestDir;
use crate::support::systemd::{analyze_offline, skip_reason, Manager};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// What reference/systemd.md found achievable for such a daemon with
/// setns working.
const MAX_EXPOSURE: f64 = 3.8;

fn repo() -> &'static Path {
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

fn stdout(cmd: &mut Command) -> String {
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
    ("/lib/systemd/system/plexusd.socket", 0o644),
    ("/lib/systemd/system/plexusd.service", 0o644),
    ("/lib/systemd/system/plexusd-multus.socket", 0o644),
    ("/lib/systemd/system/plexus-config.path", 0o644),
    ("/lib/systemd/system/plexus-config.service", 0o644),
    ("/lib/systemd/system/plexus-shim-link.service", 0o644),
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
fn repo_docs() -> Vec<String> {
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
fn installed(root: &Path, path: &str) -> PathBuf {
    let p = root.join(path.trim_start_matches('/'));
    if path.starts_with("/etc/") {
        let mut s = p.into_os_string();
        s.push(".dpkg-new");
        return PathBuf::from(s);
    }
    p
}

/// A scratch dpkg root with the package unpacked into it.
fn unpacked(tag: &str) -> TestDir {
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

/// Relative links to Markdown files in `doc` that do not resolve.
fn broken_md_links(doc: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
    let mut broken = Vec::new();
    for part in text.split("](").skip(1) {
        let Some(target) = part.split(')').next() else {
            continue;
        };
        let file = target.split('#').next().unwrap_or("");
        if file.is_empty() || file.contains("://") || !file.ends_with(".md") {
            continue;
        }
        if !doc.parent().unwrap().join(file).is_file() {
            broken.push(format!("{}: {target}", doc.display()));
        }
    }
    broken
}

/// README.md and docs/*.md as installed under `doc_dir`: all there, and
/// each one's links to the others resolve.
fn assert_docs_installed(doc_dir: &Path) {
    let mut docs = vec![doc_dir.join("README.md")];
    docs.extend(repo_docs().iter().map(|d| doc_dir.join("docs").join(d)));
    let mut broken = Vec::new();
    let mut links = 0;
    for doc in &docs {
        assert_eq!(
            std::fs::read(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display())),
            std::fs::read(repo().join(doc.strip_prefix(doc_dir).unwrap())).unwrap(),
            "{} differs from the repository's",
            doc.display()
        );
        links += std::fs::read_to_string(doc).unwrap().matches(".md").count();
        broken.extend(broken_md_links(doc));
    }
    assert!(links > 0, "no links to check in {docs:?}");
    assert!(broken.is_empty(), "links that do not resolve: {broken:#?}");
}

#[test]
fn deb_docs_should_let_readmes_links_resolve() {
    let root = unpacked("debdocs");
    assert_docs_installed(&root.path.join("usr/share/doc/plexus"));
}

/// The section names of a man page, in order.
fn man_sections(page: &str) -> Vec<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix(".SH "))
        .map(|s| s.trim_matches('"').to_string())
        .collect()
}

/// The roff text of section `name` of a man page.
fn man_section<'a>(page: &'a str, name: &str) -> &'a str {
    let start = page
        .find(&format!(".SH {name}\n"))
        .or_else(|| page.find(&format!(".SH \"{name}\"\n")))
        .unwrap_or_else(|| panic!("no section {name}:\n{page}"));
    let rest = &page[start + 4..];
    &rest[..rest.find("\n.SH ").unwrap_or(rest.len())]
}

/// The tags of the tagged paragraphs (`.TP`) of a piece of roff.
fn man_tags(roff: &str) -> Vec<String> {
    let lines: Vec<&str> = roff.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0] == ".TP")
        .map(|w| plain_roff(w[1]))
        .collect()
}

/// roff text without its escapes for fonts, dashes and apostrophes.
fn plain_roff(text: &str) -> String {
    text.replace("\\fB", "")
        .replace("\\fI", "")
        .replace("\\fR", "")
        .replace("\\-", "-")
        .replace("\\*(Aq", "'")
}

/// The manual pages a man page refers to, as `name(section)`.
fn man_references(page: &str) -> BTreeSet<String> {
    let text = plain_roff(page);
    let mut refs = BTreeSet::new();
    for (i, _) in text.match_indices('(') {
        let name: String = text[..i]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let section = &text[i + 1..];
        let digit = section.chars().next().filter(char::is_ascii_digit);
        if let (Some(d), false) = (digit, name.is_empty()) {
            if section[1..].starts_with(')') {
                refs.insert(format!("{name}({d})"));
            }
        }
    }
    refs
}

#[test]
fn man_pages_should_have_real_sections_and_name_only_pages_that_exist() {
    let root = unpacked("debman");
    let page = |name: &str| {
        stdout(Command::new("zcat").arg(root.path.join(format!("usr/share/man/man8/{name}.8.gz"))))
    };
    let plexusd = page("plexusd");
    let shim = page("plexus-shim");
    assert_eq!(
        man_sections(&plexusd),
        [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "OPTIONS",
            "COMMANDS",
            "FILES",
            "EXIT STATUS",
            "SIGNALS",
            "ENVIRONMENT",
            "SEE ALSO"
        ]
    );
    assert_eq!(
        man_sections(&shim),
        [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "INSTALLATION",
            "CONFIGURATION",
            "ENVIRONMENT",
            "EXIT STATUS",
            "CNI ERROR CODES",
            "FILES",
            "SEE ALSO"
        ]
    );
    // groff has nothing to say about either (lintian runs the same check).
    for name in ["plexusd", "plexus-shim"] {
        let out = Command::new("man")
            .args(["--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z"])
            .arg(root.path.join(format!("usr/share/man/man8/{name}.8.gz")))
            .env("MANWIDTH", "80")
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{name}(8): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Every page named exists: ours in the package, the others on this
    // Debian system (systemd's). No plexusd-show(8) and the like.
    let refs: BTreeSet<String> = man_references(&plexusd)
        .union(&man_references(&shim))
        .cloned()
        .collect();
    assert!(
        refs.contains("plexus-shim(8)") && refs.contains("plexusd(8)"),
        "{refs:?}"
    );
    for r in &refs {
        let (name, section) = r.trim_end_matches(')').split_once('(').unwrap();
        let file = format!("usr/share/man/man{section}/{name}.{section}.gz");
        let ours = root.path.join(&file);
        assert!(
            ours.exists() || Path::new("/").join(&file).exists(),
            "{r} is named but exists neither in the package nor on the system"
        );
    }

    // plexusd(8): the default paths, as the code has them.
    let files = plain_roff(man_section(&plexusd, "FILES"));
    for path in [
        plexus::config::DEFAULT_CONFIG_PATH,
        "/run/plexus/plexus.sock",
        plexus::cni::DEFAULT_STATE_DIR,
        "/etc/cni/net.d",
        plexus::device_info::DEFAULT_DIR,
        plexus::cni::multus_cache::DEFAULT_CNI_DIR,
        "/var/log/plexus",
    ] {
        assert!(files.contains(path), "FILES lacks {path}:\n{files}");
    }
    // The exit status of a bad configuration and of a bad command line, as
    // the packaged plexusd returns them.
    let codes = man_tags(man_section(&plexusd, "EXIT STATUS"));
    let bad = TestDir::new("debman-cfg");
    std::fs::write(bad.join("bad.json"), r#"{"connectionLimit": 0}"#).unwrap();
    let plexusd_bin = root.path.join("usr/bin/plexusd");
    for args in [
        vec![
            "--config".to_string(),
            bad.join("bad.json").display().to_string(),
        ],
        vec!["--no-such-option".to_string()],
    ] {
        let status = Command::new(&plexusd_bin)
            .args(&args)
            .output()
            .unwrap()
            .status;
        let code = status.code().unwrap().to_string();
        assert!(
            codes.contains(&code),
            "plexusd {args:?} exits {code}, not in {codes:?}"
        );
    }
    for section in ["SIGNALS", "ENVIRONMENT"] {
        let tags = man_tags(man_section(&plexusd, section));
        let want = if section == "SIGNALS" {
            "SIGHUP"
        } else {
            "NOTIFY_SOCKET"
        };
        assert!(tags.iter().any(|t| t.contains(want)), "{section}: {tags:?}");
    }

    // plexus-shim(8): the error codes of docs/shim.md's table, its config
    // keys and the CNI variables it forwards.
    let table = std::fs::read_to_string(repo().join("docs/shim.md")).unwrap();
    let documented: BTreeSet<String> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(' ').next())
        .filter(|c| !c.is_empty() && c.chars().all(|ch| ch.is_ascii_digit()))
        .map(str::to_string)
        .collect();
    let listed: BTreeSet<String> = man_tags(man_section(&shim, "CNI ERROR CODES"))
        .into_iter()
        .collect();
    assert!(documented.len() >= 9, "{documented:?}");
    assert_eq!(listed, documented, "plexus-shim(8) and docs/shim.md differ");
    let keys = man_tags(man_section(&shim, "CONFIGURATION"));
    for key in [
        plexus::shim::KEY_SOCKET_DIR,
        plexus::shim::KEY_SOCKET_PATH,
        plexus::shim::KEY_CONNECT_TIMEOUT,
        plexus::shim::KEY_TIMEOUT,
    ] {
        assert!(keys.iter().any(|k| k == key), "{key} not in {keys:?}");
    }
    let env = plain_roff(man_section(&shim, "ENVIRONMENT"));
    for var in plexus::shim::ENV_VARS {
        assert!(env.contains(var), "{var} not in:\n{env}");
    }
    let install = plain_roff(man_section(&shim, "INSTALLATION"));
    assert!(
        install.contains("/opt/cni/bin/plexus-shim")
            && install.contains("plexus-shim-link.service"),
        "{install}"
    );
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
        "/usr/lib/systemd/system/plexusd.service",
        "/usr/lib/systemd/system/plexusd.socket",
        "/usr/lib/systemd/system/plexusd-multus.socket",
        "/usr/lib/systemd/system/plexus-config.path",
        "/usr/lib/systemd/system/plexus-config.service",
        "/usr/lib/systemd/system/plexus-shim-link.service",
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
        "try-restart plexusd.service",
        "disable --now plexusd.socket plexusd.service",
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
    for unit in ["plexusd.service", "plexusd.socket"] {
        assert_eq!(
            std::fs::read(p(&format!("/usr/lib/systemd/system/{unit}"))).unwrap(),
            std::fs::read(repo().join("systemd").join(unit)).unwrap(),
            "{unit}"
        );
    }
}

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
