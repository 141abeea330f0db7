//! The packages' documentation as installed: README.md and docs/*.md
//! with links that resolve, and man pages with real sections that name
//! only pages that exist, checked against the packaged binaries and
//! docs/shim.md.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::packaging::{repo, repo_docs, stdout, unpacked};
use crate::support::daemon::TestDir;

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
pub(super) fn assert_docs_installed(doc_dir: &Path) {
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
