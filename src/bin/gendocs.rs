//! `plexus-gendocs <dir>`: writes the man pages `<dir>/man/plexusd.8` and
//! `<dir>/man/plexus-shim.8`, and `plexusd`'s shell completions
//! (`<dir>/completions/`), for the distribution packages.
//!
//! plexusd's synopsis, options and commands come from its command line
//! (`plexus::cli`); the other sections of both pages are written here,
//! with defaults (paths, timeouts, error codes) taken from the library's
//! constants, so the pages name what the code uses. One page per program:
//! the commands are described in plexusd(8) itself, and nothing refers to
//! pages that are not shipped.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap_complete::Shell;
use clap_mangen::roff::{bold, italic, roman, Inline, Roff};
use plexus::api::{self, code};
use plexus::config::{self, Role};
use plexus::{cni, device_info, duration, k8s, shim, spawner};

/// Where `section 8` pages are filed, in the title line.
const MANUAL: &str = "System Administration";
/// What `Roff::render` puts before every page it renders; kept once.
const APOSTROPHE_PREAMBLE: &str = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";
/// The exit status of a configuration error (EX_CONFIG), as plexusd
/// returns it.
const EXIT_CONFIG: u8 = plexus::daemon::EXIT_CONFIG;
/// The exit status when the system refuses something (EX_OSERR).
const EXIT_OS: u8 = plexus::daemon::EXIT_OS;
/// Where the packages install README.md and docs/.
const DOC_DIR: &str = "/usr/share/doc/plexus";

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: plexus-gendocs <output dir>");
        return ExitCode::from(2);
    };
    match generate(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plexus-gendocs: {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}

fn generate(out: &Path) -> std::io::Result<()> {
    let man_dir = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man_dir)?;
    std::fs::create_dir_all(&completions)?;
    let cmd = plexus::cli::command();
    std::fs::write(man_dir.join("plexusd.8"), plexusd_page(cmd.clone())?)?;
    std::fs::write(man_dir.join("plexus-shim.8"), shim_page())?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = cmd.clone();
        clap_complete::generate_to(shell, &mut cmd, "plexusd", &completions)?;
    }
    Ok(())
}

/// A man page being written: sections, paragraphs and tagged items whose
/// text marks `code` (bold) and *placeholders* (italic).
#[derive(Default)]
struct Page {
    roff: Roff,
}

impl Page {
    fn section(&mut self, name: &str) -> &mut Self {
        self.roff.control("SH", [name]);
        self
    }

    /// A new paragraph.
    fn para(&mut self, text: &str) -> &mut Self {
        self.roff.control("PP", []);
        self.roff.text(inline(text));
        self
    }

    /// A paragraph with a hanging tag (a file, a signal, an option).
    fn item(&mut self, tag: &str, text: &str) -> &mut Self {
        self.tagged(inline(tag), &[inline(text)])
    }

    /// [`Page::item`] with its text as inlines, one per paragraph.
    fn tagged(&mut self, tag: Vec<Inline>, paragraphs: &[Vec<Inline>]) -> &mut Self {
        self.roff.control("TP", []);
        self.roff.text(tag);
        for (i, text) in paragraphs.iter().enumerate() {
            if i > 0 {
                self.roff.control("IP", []);
            }
            self.roff.text(text.clone());
        }
        self
    }

    /// A block shown as typed (no filling), indented.
    fn example(&mut self, lines: &[&str]) -> &mut Self {
        self.roff.control("PP", []);
        self.roff.control("RS", ["4"]);
        self.roff.control("nf", []);
        for line in lines {
            self.roff.text([roman(*line)]);
        }
        self.roff.control("fi", []);
        self.roff.control("RE", []);
        self
    }

    fn render(&self) -> String {
        self.roff.render()
    }
}

/// `text` as roff inlines: spans in backticks bold, spans in asterisks
/// italic (not inside backticks), the rest roman.
fn inline(text: &str) -> Vec<Inline> {
    inline_with(text, true)
}

/// Help text of the command line as roff paragraphs: spans in backticks
/// bold (as rustdoc writes them), asterisks as they are.
fn cli_text(text: &str) -> Vec<Vec<Inline>> {
    text.split("\n\n")
        .map(|p| inline_with(&p.replace('\n', " "), false))
        .collect()
}

fn inline_with(text: &str, italics: bool) -> Vec<Inline> {
    let mut out = Vec::new();
    let (mut cur, mut in_code, mut in_var) = (String::new(), false, false);
    let mut flush = |cur: &mut String, code: bool, var: bool| {
        if !cur.is_empty() {
            let s = std::mem::take(cur);
            out.push(if code {
                bold(s)
            } else if var {
                italic(s)
            } else {
                roman(s)
            });
        }
    };
    for c in text.chars() {
        match c {
            '`' => {
                flush(&mut cur, in_code, in_var);
                in_code = !in_code;
            }
            '*' if italics && !in_code => {
                flush(&mut cur, in_code, in_var);
                in_var = !in_var;
            }
            c => cur.push(c),
        }
    }
    flush(&mut cur, in_code, in_var);
    out
}

/// Joins sections rendered separately, keeping one preamble.
fn join(parts: &[String]) -> String {
    let mut page = String::new();
    for part in parts {
        if page.contains(APOSTROPHE_PREAMBLE) {
            page.push_str(&part.replacen(APOSTROPHE_PREAMBLE, "", 1));
        } else {
            page.push_str(part);
        }
    }
    page
}

fn rendered(f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> std::io::Result<String> {
    let mut buf = Vec::new();
    f(&mut buf)?;
    String::from_utf8(buf).map_err(std::io::Error::other)
}

fn socket_path() -> String {
    Path::new(api::DEFAULT_SOCKET_DIR)
        .join(api::SOCKET_NAME)
        .display()
        .to_string()
}

/// plexusd(8).
fn plexusd_page(mut cmd: clap::Command) -> std::io::Result<String> {
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual(MANUAL);
    let mut head = Page::default();
    head.section("NAME");
    head.roff
        .text([roman("plexusd - the Plexus thick CNI plugin daemon")]);
    synopsis(&mut head, &cmd);
    let mut parts = vec![rendered(|w| man.render_title(w))?, head.render()];
    parts.push(plexusd_description().render());
    parts.push(rendered(|w| man.render_options_section(w))?);
    parts.push(commands(&cmd).render());
    parts.push(plexusd_reference().render());
    Ok(join(&parts))
}

fn plexusd_description() -> Page {
    let sock = socket_path();
    let mut p = Page::default();
    p.section("DESCRIPTION")
        .para(
            "`plexusd` is a thick CNI plugin daemon. The container runtime runs \
             `plexus-shim`(8), a small CNI plugin, for every CNI call (ADD, DEL, CHECK, GC, \
             STATUS); the shim forwards the call over a unix socket to `plexusd`, which runs \
             the real CNI plugins of the container's networks, records what it attached, and \
             answers with the result. The networks are the cluster network (`clusterNetwork` \
             or `delegates`) and, on a Kubernetes node, those a pod names in its \
             `k8s.v1.cni.cncf.io/networks` annotation, found in the cluster's \
             NetworkAttachmentDefinitions. `plexusd` speaks the wire protocol of the multus \
             thick plugin and reads the keys of multus's `daemon-config.json`.",
        )
        .para(&format!(
            "systemd owns the socket: `plexusd.socket` listens on `{sock}` and starts \
             `plexusd.service` on the first connection. Calls made while `plexusd` starts, \
             restarts or stops wait in the socket's backlog, so `systemctl restart plexusd` \
             loses none. `plexusd` tells systemd when it is ready (`Type=notify`) and shows \
             what it is doing in `systemctl status plexusd`. `plexusd-multus.socket` \
             (disabled by default) listens at multus's socket path as well, for an unchanged \
             multus-shim. Started without a socket from systemd, `plexusd` binds \
             *socketDir*`/{}` itself.",
            api::SOCKET_NAME
        ))
        .para(&format!(
            "The plugins do not run under `plexusd.service`'s sandbox: with `pluginSpawner` \
             (`{}` as packaged) `plexusd` asks `plexus-spawner`, run by \
             `plexus-plugins.service` with `containerd.service`'s settings, to start each one, \
             so that a plugin sees the host as it would as the runtime's child. Each line a \
             plugin writes to stderr reaches the journal with the fields `F_PLUGIN`, \
             `F_NETWORK`, `F_COMMAND` and `F_CONTAINER_ID`. \
             `/usr/share/doc/plexus/docs/plugins.md` has the details.",
            spawner::DEFAULT_SOCKET
        ))
        .para(
            "With a `kubeconfig` in its configuration, or inside a pod with a service \
             account, `plexusd` watches this node's pods and the NetworkAttachmentDefinitions, \
             and writes each pod's network-status annotation. Its log goes to the journal: \
             `journalctl -u plexusd`.",
        );
    p
}

/// Is `a` one of the arguments every command has (help, version)?
fn is_builtin(a: &clap::Arg) -> bool {
    matches!(a.get_id().as_str(), "help" | "version")
}

/// The arguments of `cmd` to show in usage lines.
fn shown_args(cmd: &clap::Command) -> Vec<&clap::Arg> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set() && !is_builtin(a))
        .collect()
}

/// One usage line per way to run plexusd: the daemon with every option,
/// then each command.
fn synopsis(p: &mut Page, cmd: &clap::Command) {
    p.section("SYNOPSIS");
    let name = cmd.get_name();
    let mut line = format!("`{name}`");
    for a in shown_args(cmd) {
        line.push(' ');
        line.push_str(&arg_usage(a));
    }
    p.roff.text(inline(&line));
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let mut line = format!("`{name}` [*OPTIONS*] `{}`", sub.get_name());
        for a in shown_args(sub).into_iter().filter(|a| !a.is_global_set()) {
            line.push(' ');
            line.push_str(&arg_usage(a));
        }
        p.roff.control("br", []);
        p.roff.text(inline(&line));
    }
    p.roff.control("br", []);
    p.roff
        .text(inline(&format!("`{name}` `--help` | `--version`")));
}

/// The subcommands, described here rather than on pages of their own.
fn commands(cmd: &clap::Command) -> Page {
    let mut p = Page::default();
    p.section("COMMANDS").para(&format!(
        "Without a command, `{}` runs the daemon. A command runs once and exits; it \
         reads the configuration `--config` names.",
        cmd.get_name()
    ));
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let mut usage = format!("`{} {}`", cmd.get_name(), sub.get_name());
        let args: Vec<&clap::Arg> = shown_args(sub)
            .into_iter()
            .filter(|a| !a.is_global_set())
            .collect();
        for a in &args {
            usage.push(' ');
            usage.push_str(&arg_usage(a));
        }
        let about = sub
            .get_long_about()
            .or_else(|| sub.get_about())
            .map(|s| s.to_string())
            .unwrap_or_default();
        p.tagged(inline(&usage), &cli_text(&about));
        if !args.is_empty() {
            p.roff.control("RS", []);
            for a in &args {
                let help = a
                    .get_long_help()
                    .or_else(|| a.get_help())
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                p.tagged(inline(&arg_usage(a)), &cli_text(&help));
            }
            p.roff.control("RE", []);
        }
    }
    p.para(&format!(
        "`{0} help` [*COMMAND*] prints the help of `{0}` or of one command.",
        cmd.get_name()
    ));
    p
}

/// How one argument of a command is written in its usage line.
fn arg_usage(a: &clap::Arg) -> String {
    let value = a
        .get_value_names()
        .and_then(|v| v.first())
        .map(|v| v.to_string())
        .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
    let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
    let mut s = match (a.get_long(), a.get_short()) {
        (Some(long), _) => format!("`--{long}`"),
        (None, Some(short)) => format!("`-{short}`"),
        (None, None) => String::new(),
    };
    if takes_value {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(&format!("*{value}*"));
    }
    if a.is_required_set() {
        s
    } else {
        format!("[{s}]")
    }
}

/// FILES (with the configuration's keys), EXIT STATUS, SIGNALS,
/// ENVIRONMENT and SEE ALSO of plexusd(8).
fn plexusd_reference() -> Page {
    let mut p = Page::default();
    files(&mut p);
    exit_status(&mut p);
    signals(&mut p);
    environment(&mut p);
    p.section("SEE ALSO")
        .para(
            "`plexus-shim`(8), `systemd.socket`(5), `systemd.service`(5), `systemctl`(1), \
             `journalctl`(1)",
        )
        .para("`/usr/share/doc/plexus/README.md`, `/usr/share/doc/plexus/docs/`");
    p
}

/// FILES of plexusd(8).
fn files(p: &mut Page) {
    let bin_dirs = cni::DEFAULT_BIN_DIRS.join(":");
    p.section("FILES").item(
        &format!("`{}`", config::DEFAULT_CONFIG_PATH),
        &format!(
            "The configuration (`--config`), a JSON object: multus's `daemon-config.json` keys \
             and Plexus's own, below (`{DOC_DIR}/README.md` has more). Read at start; a change \
             takes effect with `systemctl restart plexusd`. Without the file, the built-in \
             defaults apply. Durations are strings such as `\"500ms\"`, `\"10s\"`, \
             `\"1h30m\"`; relative paths are taken from the file's directory; a key set to \
             `null` counts as unset. A key that is none of these is logged as a warning, with \
             the known key nearest to it."
        ),
    );
    config_keys(p);
    p.item(
        &format!("`{}`", socket_path()),
        "The socket `plexus-shim` connects to (`socketDir`), created by `plexusd.socket`.",
    )
    .item(
        &format!("`{}`", spawner::DEFAULT_SOCKET),
        "The plugin spawner's socket (`pluginSpawner`), created by \
         `plexus-plugins.socket`; `/usr/libexec/plexus/plexus-spawner`, run by \
         `plexus-plugins.service`, starts the plugins there.",
    )
    .item(
        "`/run/multus/multus.sock`",
        "multus's socket path, served by `plexusd` when `plexusd-multus.socket` is enabled.",
    )
    .item(
        &format!("`{}`", cni::DEFAULT_STATE_DIR),
        "The state directory (`stateDir`): one record per container in `attachments/`, \
         with what its ADD attached, so that DEL, CHECK and GC can undo and check it \
         after a restart or a crash. `plexusd show` reads them. Deleting them leaves \
         those containers' networks to be removed by hand.",
    )
    .item(
        "`/etc/cni/net.d`",
        &format!(
            "The network configurations named by `clusterNetwork` and `defaultNetworks` \
             (`confDir`, as packaged; built in: `{}`). Changes are seen on the next call, \
             without a restart. The runtime's own configuration for `plexus-shim` is here \
             too (`generate-config` writes `00-plexus.conf`).",
            cni::DEFAULT_CONF_DIR
        ),
    )
    .item(
        &format!("`{bin_dirs}`"),
        "Where the plugins are found (`binDir`, a colon-separated list searched in order; \
         a missing directory is skipped). The packages search `/opt/cni/bin` and the \
         distribution's CNI directory (`/usr/lib/cni` on Debian, `/usr/libexec/cni` on \
         Fedora).",
    )
    .item(
        &format!("`{}`", cni::multus_cache::DEFAULT_CNI_DIR),
        "multus's caches (`cniDir`), read and cleaned by DEL for containers multus attached.",
    )
    .item(
        &format!("`{}`", device_info::DEFAULT_DIR),
        "Device-info files (`deviceInfoDir`): device plugins write `dp/`; for a network \
         with a `resourceName`, `plexusd` copies the device's file to `cni/` before the \
         plugin runs, and removes it with the network's DEL.",
    )
    .item(
        &format!("`{}`", k8s::devices::DEFAULT_POD_RESOURCES_SOCKET),
        &format!(
            "The kubelet's pod-resources socket (`podResourcesSocket`), asked for the \
             devices of a pod whose networks name a `resourceName`; when it is absent, the \
             kubelet's checkpoint `{}` (`deviceCheckpointFile`).",
            k8s::devices::DEFAULT_CHECKPOINT_FILE
        ),
    )
    .item(
        "`/var/log/plexus`",
        "The unit's log directory, for a `logFile`. Without one, the log goes to stderr, \
         which systemd passes to the journal.",
    )
    .item(
        "`/usr/lib/tmpfiles.d/plexus.conf`",
        "Creates the directories `plexusd.service` may write (its sandbox makes the rest \
         of the file system read-only): `/var/lib/cni`, `/run/cni` and \
         `/run/k8s.cni.cncf.io`.",
    );
}

/// The keys of daemon-config.json, under its entry in FILES.
fn config_keys(p: &mut Page) {
    p.roff.control("RS", []);
    for key in config::KEYS {
        let (tag, text) = match key.role {
            Role::Read => (
                format!("`{}` ({})", key.name, key.kind.text()),
                format!("{}. Default: {}.", key.help, key.default.text()),
            ),
            role => (
                format!("`{}`", key.name),
                format!("{}: {}.", role.text(), key.help),
            ),
        };
        p.tagged(inline(&tag), &[inline(&unlink(&text))]);
    }
    p.roff.control("RE", []);
}

/// Markdown links as a man page shows them: one to a Markdown file as
/// the installed file's path, one to a section of README.md as that.
fn unlink(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some((before, label, target, after)) = markdown_link(rest) {
        out.push_str(before);
        let (file, section) = target.split_once('#').unwrap_or((target, ""));
        if file.is_empty() && !section.is_empty() {
            out.push_str(&format!("`{DOC_DIR}/README.md`, section \"{label}\""));
        } else if file.ends_with(".md") && !file.contains("://") {
            out.push_str(&format!("`{DOC_DIR}/{file}`"));
        } else {
            out.push_str(label);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The first `[label](target)` of `text`: what is before it, its label
/// and target, and what is after it.
fn markdown_link(text: &str) -> Option<(&str, &str, &str, &str)> {
    let open = text.find('[')?;
    let middle = open + text[open..].find("](")?;
    let close = middle + text[middle..].find(')')?;
    let label = &text[open + 1..middle];
    if label.contains('[') {
        return None;
    }
    Some((
        &text[..open],
        label,
        &text[middle + 2..close],
        &text[close + 1..],
    ))
}

/// EXIT STATUS of plexusd(8).
fn exit_status(p: &mut Page) {
    p.section("EXIT STATUS")
        .item(
            "0",
            "The daemon stopped on request (SIGTERM, SIGINT, `idleTimeout`), or a command or \
             `--check-config` succeeded.",
        )
        .item(
            "1",
            "The daemon failed while serving; `show`: nothing is recorded for the container \
             asked about, or its record is damaged; `generate-config`: nothing could be \
             generated.",
        )
        .item("2", "The command line is wrong.")
        .item(
            &EXIT_OS.to_string(),
            "The system refused something `plexusd` needs: the async runtime, the metrics \
             port, signal handlers, the state directory (EX_OSERR).",
        )
        .item(
            &EXIT_CONFIG.to_string(),
            &format!(
                "The configuration is wrong (every problem is printed), a directory `plexusd` \
                 writes is not safe, the log file cannot be opened, the Kubernetes credentials \
                 cannot be used, or the sockets systemd passed are not usable (EX_CONFIG). \
                 `plexusd.service` is not restarted after it \
                 (`RestartPreventExitStatus={EXIT_CONFIG}`): fix the cause, check it with \
                 `plexusd --check-config`, then `systemctl restart plexusd`."
            ),
        );
}

/// SIGNALS of plexusd(8).
fn signals(p: &mut Page) {
    p.section("SIGNALS")
        .item(
            "SIGTERM, SIGINT, SIGQUIT",
            &format!(
                "Stop: `plexusd` tells systemd it is stopping, stops accepting connections, \
                 lets the calls in flight finish within `shutdownTimeout` (default {}), and \
                 exits 0. The socket stays with systemd: calls made meanwhile wait for the \
                 next `plexusd`. A socket `plexusd` bound itself (without systemd) is removed, \
                 unless a successor has taken its path over.",
                duration::format(config::DEFAULT_SHUTDOWN_TIMEOUT)
            ),
        )
        .item(
            "SIGHUP, SIGUSR1, SIGUSR2",
            "Logged and ignored: the configuration is not reloaded. A change of \
             `daemon-config.json` takes effect with `systemctl restart plexusd`, which loses no \
             call since systemd holds the socket. Network configurations in `confDir` and \
             NetworkAttachmentDefinitions are picked up without a signal.",
        );
}

/// ENVIRONMENT of plexusd(8).
fn environment(p: &mut Page) {
    p.section("ENVIRONMENT")
        .item(
            "`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`",
            "The sockets systemd passes (socket activation). Removed from the environment at \
             start, so no plugin inherits them.",
        )
        .item(
            "`NOTIFY_SOCKET`",
            "Where `plexusd` reports to systemd that it is ready, its status line, and that it \
             is stopping.",
        )
        .item(
            "`WATCHDOG_USEC`, `WATCHDOG_PID`",
            "The watchdog interval of the unit (`WatchdogSec=`), if one is set.",
        )
        .item(
            "`JOURNAL_STREAM`",
            "When stderr is the journal, log records are sent to the journal with their \
             fields.",
        )
        .item(
            "`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`",
            "Without a `kubeconfig`, the API server of the cluster `plexusd` runs in (with the \
             pod's service account). On a node, set `kubeconfig` instead.",
        )
        .item(
            "`PATH`",
            "Given to the plugins `plexusd` runs, which otherwise get only the `CNI_*` \
             variables of their call.",
        )
        .para(
            "The log level is the configuration's `logLevel`; `plexusd` reads no other \
             variables.",
        );
}

/// plexus-shim(8).
fn shim_page() -> String {
    let mut p = Page::default();
    shim_synopsis(&mut p);
    shim_description(&mut p);
    shim_configuration(&mut p);
    shim_environment(&mut p);
    shim_error_codes(&mut p);
    shim_files(&mut p);
    p.render()
}

/// The title, NAME and SYNOPSIS of plexus-shim(8).
fn shim_synopsis(p: &mut Page) {
    let version = env!("CARGO_PKG_VERSION");
    p.roff.control(
        "TH",
        [
            "plexus-shim",
            "8",
            "",
            &format!("plexus-shim {version}"),
            MANUAL,
        ],
    );
    p.section("NAME");
    p.roff.text([roman(
        "plexus-shim - CNI plugin that forwards CNI calls to the plexusd daemon",
    )]);
    p.section("SYNOPSIS");
    p.roff.text(inline(
        "`CNI_COMMAND`=*command* [`CNI_CONTAINERID`=*id*] [`CNI_NETNS`=*path*] \
         [`CNI_IFNAME`=*name*] [`CNI_ARGS`=*args*] [`CNI_PATH`=*dirs*] `plexus-shim` \
         < *network-config*",
    ));
    p.roff.control("br", []);
    p.roff.text(inline(
        "`plexus-shim` `--version` | `--help` (without `CNI_COMMAND`: for a person at a shell)",
    ));
}

/// DESCRIPTION and INSTALLATION of plexus-shim(8).
fn shim_description(p: &mut Page) {
    let sock = socket_path();
    p.section("DESCRIPTION")
        .para(&format!(
            "`plexus-shim` is the CNI plugin the container runtime executes. It does no \
             networking itself: it checks the call as CNI's skel library does, forwards it to \
             `plexusd`(8) over the daemon's unix socket (`{sock}` by default; `POST /cni`, \
             the multus thick-plugin protocol), and prints the daemon's answer as the runtime \
             expects it: an ADD's result converted to the network configuration's \
             `cniVersion`, nothing for DEL, CHECK, GC and STATUS. VERSION is answered without \
             the daemon. The configuration is forwarded to the daemon byte for byte."
        ))
        .para(
            "While the socket is missing or refuses connections (the daemon starting or \
             restarting without socket activation) the shim retries until `connectTimeout`, \
             writing one line to stderr. Under socket activation the connection simply \
             waits in the socket's backlog.",
        );

    p.section("INSTALLATION")
        .para(
            "The package installs the shim in the distribution's CNI plugin directory: \
             `/usr/lib/cni/plexus-shim` on Debian, `/usr/libexec/cni/plexus-shim` on \
             Fedora. Runtimes whose CNI `bin_dir` is `/opt/cni/bin` (the default of \
             containerd and CRI-O) find it there through a symbolic link, \
             `/opt/cni/bin/plexus-shim`, that `plexus-shim-link.service` makes at boot, \
             before the runtime starts, and when the package is installed. It makes the link \
             only when `/opt/cni/bin` exists (it never creates the directory), and never \
             replaces a file or link of that name that is there already; removing the \
             package deletes the link while it still points to the packaged shim. If \
             `/opt/cni/bin` appears later, `systemctl start plexus-shim-link` makes the link \
             at once.",
        )
        .para(
            "The runtime also needs a network configuration of type `plexus-shim` in its \
             configuration directory (`/etc/cni/net.d`), first by name, such as \
             `/usr/share/doc/plexus/examples/00-plexus.conflist`. `plexus-config.path` \
             (disabled by default) writes one from the primary network's configuration, as \
             multus's auto configuration does.",
        );
}

/// CONFIGURATION of plexus-shim(8): the keys it reads.
fn shim_configuration(p: &mut Page) {
    p.section("CONFIGURATION").para(&format!(
        "The shim reads these keys of the network configuration on stdin; all are \
         optional. Durations are strings such as `\"500ms\"`, `\"10s\"`, `\"2m\"`. Every bad \
         key is reported in one error (code {}).",
        code::INVALID_NETWORK_CONFIG
    ));
    p.item(
        &format!("`{}`", shim::KEY_SOCKET_DIR),
        &format!(
            "The directory of the daemon's socket, `<dir>/{}` (default `{}`): multus-shim's \
             key, with Plexus's socket name.",
            api::SOCKET_NAME,
            api::DEFAULT_SOCKET_DIR
        ),
    )
    .item(
        &format!("`{}`", shim::KEY_SOCKET_PATH),
        &format!(
            "The daemon's socket as a full path; wins over `{}`. `/run/multus/multus.sock` \
             makes the shim talk to a multus daemon.",
            shim::KEY_SOCKET_DIR
        ),
    )
    .item(
        &format!("`{}`", shim::KEY_CONNECT_TIMEOUT),
        &format!(
            "How long to keep retrying while the socket is missing, refuses connections or \
             has a full backlog (default `{}`; `\"0\"`: one attempt). A STATUS waits only \
             for a full backlog.",
            duration::format(shim::DEFAULT_CONNECT_TIMEOUT)
        ),
    )
    .item(
        &format!("`{}`", shim::KEY_TIMEOUT),
        &format!(
            "The deadline of the whole call: connecting, sending, and waiting for the answer \
             (default `{}`).",
            duration::format(shim::DEFAULT_TIMEOUT)
        ),
    )
    .para(
        "Every other key (`name`, `cniVersion`, `runtimeConfig`, `capabilities`, and \
         `plexusd`'s network keys such as `clusterNetwork`) is the daemon's business.",
    )
    .example(&[
        "{\"cniVersion\": \"1.0.0\", \"name\": \"plexus\",",
        " \"plugins\": [{\"type\": \"plexus-shim\", \"daemonSocketDir\": \"/run/plexus\"}]}",
    ]);
}

/// ENVIRONMENT and EXIT STATUS of plexus-shim(8).
fn shim_environment(p: &mut Page) {
    p.section("ENVIRONMENT").para(&format!(
        "The CNI variables: {}. `CNI_COMMAND` is one of ADD, DEL, CHECK, GC, STATUS, \
         VERSION; ADD, DEL and CHECK need `CNI_CONTAINERID` and `CNI_IFNAME`, ADD and CHECK \
         `CNI_NETNS`. Only these are sent to the daemon, none of the rest of the \
         environment.",
        shim::ENV_VARS
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ));

    p.section("EXIT STATUS")
        .item(
            "0",
            "Success: the ADD result, the VERSION answer, or nothing, on stdout.",
        )
        .item(
            "1",
            "Failure, DEL included: a CNI error (`code`, `msg`, `details`) on stdout. A DEL \
             that did not reach the daemon is never reported as a success: the runtime must \
             retry it.",
        );
}

/// CNI ERROR CODES of plexus-shim(8).
fn shim_error_codes(p: &mut Page) {
    p.section("CNI ERROR CODES")
        .para(&format!(
            "An error the daemon answered with is passed through with its own code \
             (`plexusd` answers {} when it is overloaded or stopping). The shim's own:",
            code::TRY_AGAIN_LATER
        ))
        .item(
            &code::INCOMPATIBLE_VERSION.to_string(),
            "Unsupported `cniVersion`; CHECK, GC or STATUS with too old a configuration; a \
             result that cannot be converted to the configuration's version.",
        )
        .item(
            &code::INVALID_ENVIRONMENT.to_string(),
            "`CNI_COMMAND` missing or unknown; `CNI_CONTAINERID`, `CNI_IFNAME` or \
             `CNI_NETNS` missing.",
        )
        .item(
            &code::IO_FAILURE.to_string(),
            "stdin cannot be read; the socket cannot be connected to for a reason retrying \
             will not fix; the socket, a directory on its path or the process listening on \
             it is not root's (nothing is sent).",
        )
        .item(
            &code::DECODING_FAILURE.to_string(),
            "stdin is empty, not JSON, or not a JSON object.",
        )
        .item(
            &code::INVALID_NETWORK_CONFIG.to_string(),
            &format!(
                "No `cniVersion`; stdin larger than {} MiB; a bad shim key.",
                api::MAX_BODY_BYTES >> 20
            ),
        )
        .item(
            &code::TRY_AGAIN_LATER.to_string(),
            "Try again later: the daemon was not reachable within `connectTimeout` (a STATUS \
             waits only for a full backlog), or the connection broke before the whole \
             request was sent, so the daemon cannot have acted on it; also an HTTP 503 \
             without a CNI error.",
        )
        .item(
            &code::PLUGIN_NOT_AVAILABLE.to_string(),
            "STATUS only: no daemon listens at the socket (it is missing or refuses the \
             connection). Answered at once, without waiting for `connectTimeout`, so a \
             runtime that asks STATUS while holding its network lock is not held up.",
        )
        .item(
            &code::NO_ANSWER.to_string(),
            "The request was sent but no complete answer came back (connection closed or \
             reset, or no answer within `timeout`): whether the operation took effect is \
             unknown.",
        )
        .item(
            &code::BAD_ANSWER.to_string(),
            "The answer is not usable: not HTTP, or an ADD answer without a valid result.",
        )
        .item(
            &code::INTERNAL.to_string(),
            "The daemon answered with an error that is not CNI error JSON (as a multus daemon \
             does), or with a CNI error without a code.",
        );
}

/// FILES and SEE ALSO of plexus-shim(8).
fn shim_files(p: &mut Page) {
    let sock = socket_path();
    p.section("FILES")
        .item(
            &format!("`{sock}`"),
            "`plexusd`'s socket, created by `plexusd.socket`.",
        )
        .item(
            "`/usr/lib/cni/plexus-shim`, `/usr/libexec/cni/plexus-shim`",
            "The shim as packaged (Debian, Fedora).",
        )
        .item(
            "`/opt/cni/bin/plexus-shim`",
            "The link made by `plexus-shim-link.service` when `/opt/cni/bin` exists.",
        )
        .item(
            "`/etc/cni/net.d`",
            "The runtime's network configurations, one of which names `plexus-shim`.",
        );

    p.section("SEE ALSO").para(
        "`plexusd`(8), `systemctl`(1), `/usr/share/doc/plexus/docs/shim.md`, and the CNI \
         specification, https://www.cni.dev/docs/spec/.",
    );
}
