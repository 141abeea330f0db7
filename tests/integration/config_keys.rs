//! The keys of daemon-config.json as the docs give them: README.md's
//! tables and plexusd(8) as packaged list exactly the keys that
//! `plexus::config::KEYS` declares, each with its kind, default and help.
//!
//! README's tables are written from the keys by this test: run it with
//! `PLEXUS_WRITE_README=1` to rewrite them after changing a key.

use std::collections::BTreeMap;
use std::process::Command;

use plexus::config::{Key, Role, KEYS};

use crate::packaging::{repo, stdout, unpacked};

/// The lines around README's tables of keys.
const BEGIN: &str = "<!-- The keys below are written from src/config/keys.rs by \
                     tests/integration/config_keys.rs (PLEXUS_WRITE_README=1). -->";
const END: &str = "<!-- End of the keys. -->";

/// README's tables of keys, as [`KEYS`] has them.
fn readme_tables() -> String {
    let mut out = String::from("| key | type | default | meaning |\n|---|---|---|---|\n");
    for k in KEYS.iter().filter(|k| k.role == Role::Read) {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            k.name,
            k.kind.text(),
            k.default.text(),
            k.help
        ));
    }
    out.push_str(
        "\nThe keys of multus's schema that the daemon does not act on (any other key is \
         unknown):\n\n\
         | key | in Plexus | meaning |\n|---|---|---|\n",
    );
    for k in KEYS.iter().filter(|k| k.role != Role::Read) {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            k.name,
            k.role.text(),
            k.help
        ));
    }
    out
}

/// The first column of each row of the Markdown tables in `text`.
fn table_keys(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn readme_should_describe_each_key_as_declared() {
    let path = repo().join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme
        .find(BEGIN)
        .expect("README.md lacks the keys' start mark")
        + BEGIN.len();
    let end = start
        + readme[start..]
            .find(END)
            .expect("README.md lacks the end mark");
    let have = readme[start..end].trim_matches('\n');
    let want = readme_tables();
    if have == want.trim_end() {
        return;
    }
    if std::env::var_os("PLEXUS_WRITE_README").is_some() {
        let new = format!("{}\n\n{want}\n{}", &readme[..start], &readme[end..]);
        std::fs::write(&path, new).unwrap();
        return;
    }
    let have_keys = table_keys(have);
    let want_keys = table_keys(&want);
    let missing: Vec<&String> = want_keys
        .iter()
        .filter(|k| !have_keys.contains(k))
        .collect();
    let unknown: Vec<&String> = have_keys
        .iter()
        .filter(|k| !want_keys.contains(k))
        .collect();
    let differ: Vec<&str> = want
        .lines()
        .filter(|l| l.starts_with("| `") && !have.lines().any(|h| h == *l))
        .collect();
    panic!(
        "README.md's keys differ from src/config/keys.rs: missing {missing:?}, not keys \
         {unknown:?}; rows as they should be:\n{}\n(PLEXUS_WRITE_README=1 rewrites them)",
        differ.join("\n")
    );
}

/// roff text without its escapes for fonts, dashes and apostrophes.
fn plain_roff(text: &str) -> String {
    text.replace("\\fB", "")
        .replace("\\fI", "")
        .replace("\\fR", "")
        .replace("\\-", "-")
        .replace("\\*(Aq", "'")
}

/// Markdown as plexusd(8) shows it: no backticks, a link to one of the
/// docs as its installed path, one to a section of README.md as that.
fn plain_markdown(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find("](") {
        let label_start = rest[..open].rfind('[').unwrap();
        let close = open + rest[open..].find(')').unwrap();
        let target = &rest[open + 2..close];
        out.push_str(&rest[..label_start]);
        let label = &rest[label_start + 1..open];
        match target.split_once('#').unwrap_or((target, "")) {
            ("", _) => out.push_str(&format!(
                "/usr/share/doc/plexus/README.md, section \"{label}\""
            )),
            (file, _) if file.ends_with(".md") => {
                out.push_str(&format!("/usr/share/doc/plexus/{file}"))
            }
            _ => out.push_str(label),
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out.replace('`', "")
}

/// The text plexusd(8) should give `key`, and its tag.
fn man_entry(key: &Key) -> (String, String) {
    if key.role == Role::Read {
        (
            format!("{} ({})", key.name, plain_markdown(key.kind.text())),
            plain_markdown(&format!("{}. Default: {}.", key.help, key.default.text())),
        )
    } else {
        (
            key.name.to_string(),
            plain_markdown(&format!("{}: {}.", key.role.text(), key.help)),
        )
    }
}

#[test]
fn man_page_should_describe_each_key_as_declared() {
    let root = unpacked("cfgkeys-man");
    let page = stdout(Command::new("zcat").arg(root.path.join("usr/share/man/man8/plexusd.8.gz")));
    let files = &page[page.find(".SH FILES\n").expect("no FILES section")..];
    let files = &files[..files[1..].find("\n.SH ").unwrap_or(files.len())];
    // The keys are the tagged paragraphs in the indented block of the
    // configuration file's entry.
    let block = &files[files.find("\n.RS\n").expect("no keys") + 1..];
    let block = &block[..block.find("\n.RE\n").expect("no end of the keys")];
    let lines: Vec<String> = block.lines().map(plain_roff).collect();
    let entries: BTreeMap<&str, &str> = lines
        .windows(3)
        .filter(|w| w[0] == ".TP")
        .map(|w| (w[1].as_str(), w[2].as_str()))
        .collect();
    assert_eq!(entries.len(), KEYS.len(), "{:?}", entries.keys());
    for key in KEYS {
        let (tag, text) = man_entry(key);
        assert_eq!(
            entries.get(tag.as_str()).copied(),
            Some(text.as_str()),
            "{tag}"
        );
    }
}
