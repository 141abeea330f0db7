//! `plexusd`: args -> config -> (`show`, `generate-config`, `--check-config`, or
//! `daemon::main`, which wires and runs everything) -> exit code.

use std::process::ExitCode;

use clap::Parser;
use plexus::cli::{Args, Sub};
use plexus::daemon::{self, Exit};
use plexus::{autoconf, cni, config, names};

/// EX_CONFIG: the configuration is wrong; systemd does not restart on it.
const EXIT_CONFIG: u8 = daemon::EXIT_CONFIG;
/// EX_OSERR: the operating system refused something we need.
const EXIT_OS: u8 = daemon::EXIT_OS;

fn main() -> ExitCode {
    let args = Args::parse();
    let missing_ok = args.config.as_os_str() == config::DEFAULT_CONFIG_PATH;
    let config = match config::Config::load(&args.config, missing_ok) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("plexusd: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match &args.command {
        Some(Sub::Show { container_id }) => return show(&config, container_id.as_deref()),
        Some(Sub::GenerateConfig) => {
            if config.selection.base().has_networks() {
                eprintln!(
                    "plexusd: warning: {}: clusterNetwork is set: plexusd attaches it, not the \
                     generated file's clusterNetwork (which it uses only when the daemon \
                     configuration names no cluster network)",
                    config.path.display()
                );
            }
            return generate_config(&args.config, missing_ok);
        }
        None => {}
    }
    if args.check_config {
        let code = daemon::check::run(
            &config,
            args.strict,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        );
        return ExitCode::from(code);
    }
    match daemon::main(config) {
        Exit::Stopped(_) => ExitCode::SUCCESS,
        Exit::Config => ExitCode::from(EXIT_CONFIG),
        Exit::Os => ExitCode::from(EXIT_OS),
        Exit::Failed => ExitCode::FAILURE,
    }
}

/// `plexusd show`: prints the recorded attachments, and those of the
/// containers multus attached that plexusd has no record of (from
/// multus's caches in `cniDir`, marked `"attachedBy": "multus"`); exit 1
/// when there is nothing readable for the id asked about. Only reads: it
/// creates, moves and removes nothing, follows no symbolic link, and
/// takes no lock (records are replaced by rename, so a read sees a whole
/// old or a whole new record).
fn show(config: &config::Config, container_id: Option<&str>) -> ExitCode {
    let store = cni::state::Store::at(&config.cni.state_dir);
    let caches = cni::multus_cache::Caches::new(&config.cni.cni_dir);
    let ids = match container_id {
        Some(id) if !names::is_valid_name(id) => {
            eprintln!("plexusd: {id:?} is not a valid container id");
            return ExitCode::FAILURE;
        }
        Some(id) => vec![id.to_string()],
        None => match cni::show::ids(&store, &caches) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("plexusd: {e}");
                return ExitCode::from(EXIT_OS);
            }
        },
    };
    // libcni's result cache, listed once for all the containers: it names
    // the interfaces of the primaries of those multus attached.
    let result_names = match container_id {
        None if !ids.is_empty() => caches.result_names().ok(),
        _ => None,
    };
    let mut out = Vec::new();
    let mut damaged = false;
    for id in &ids {
        match cni::show::lookup(&store, &caches, id, result_names.as_deref()) {
            Ok(Some(shown)) => {
                // Reported, not moved aside: the daemon does that under
                // the container's lock.
                if let Some(why) = &shown.damaged {
                    eprintln!("plexusd: {why}");
                    damaged = true;
                }
                for why in &shown.damaged_files {
                    eprintln!("plexusd: {why}");
                }
                out.push(shown.summary);
            }
            Ok(None) if container_id.is_some() => {
                eprintln!(
                    "plexusd: nothing is recorded for container {id:?} in {}, and multus \
                     cached nothing for it in {}",
                    store.dir().display(),
                    caches.dir().display()
                );
                return ExitCode::FAILURE;
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("plexusd: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if container_id.is_none() && out.is_empty() {
        eprintln!(
            "plexusd: nothing is recorded in {}, and multus cached nothing in {}",
            store.dir().display(),
            caches.dir().display()
        );
    }
    let value = match (container_id, out.len()) {
        (Some(_), 1) => out.remove(0),
        _ => serde_json::Value::Array(out),
    };
    match serde_json::to_string_pretty(&value) {
        Ok(text) => {
            println!("{text}");
            if damaged && container_id.is_some() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("plexusd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `plexusd generate-config`: one run of [`autoconf::generate`]; exit 78
/// when the configuration is wrong, 1 when nothing could be generated.
fn generate_config(path: &std::path::Path, missing_ok: bool) -> ExitCode {
    let settings = match autoconf::Settings::load(path, missing_ok) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("plexusd: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match autoconf::generate(&settings) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) if e.is_config() => {
            eprintln!("plexusd: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            eprintln!("plexusd: {e}");
            ExitCode::FAILURE
        }
    }
}
