//! `plexusd`: args -> config -> logging -> engine -> listener -> runtime -> daemon::run -> exit code.

use std::process::ExitCode;

use clap::Parser;
use plexus::cli::{Args, Sub};
use plexus::{activation, cni, config, daemon, logging, metrics, notify};
use tracing::{error, warn};

/// EX_CONFIG: the configuration is wrong; systemd does not restart on it.
const EXIT_CONFIG: u8 = 78;
/// EX_OSERR: the operating system refused something we need.
const EXIT_OS: u8 = 71;

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
    if let Some(Sub::Show { container_id }) = &args.command {
        return show(&config, container_id.as_deref());
    }
    if args.check_config {
        for key in &config.unknown_keys {
            eprintln!(
                "plexusd: warning: {}: unknown key {key:?} is ignored",
                config.path.display()
            );
        }
        println!("{}: configuration is valid", config.path.display());
        return ExitCode::SUCCESS;
    }
    if let Err(e) = logging::init(&config.logging) {
        eprintln!("plexusd: {:#}", anyhow::Error::from(e));
        return ExitCode::from(EXIT_CONFIG);
    }
    for key in &config.unknown_keys {
        warn!(file = %config.path.display(), key, "unknown configuration key is ignored");
    }
    let metrics = std::sync::Arc::new(metrics::Metrics::new());
    // Before the listener: in self-bind mode, taking the socket path over
    // makes a running predecessor drain, so a successor whose state
    // directory is unusable must fail first. Engine::new also kills what a
    // crashed predecessor's plugins left running before any call is served.
    let engine = match &config.selection {
        Some(_) => match cni::Engine::new(config.cni.clone(), Some(metrics.clone())) {
            Ok(e) => Some(std::sync::Arc::new(e)),
            Err(e) => {
                error!("{e}");
                return ExitCode::from(EXIT_OS);
            }
        },
        None => None,
    };
    // Before any thread exists: this clears LISTEN_* from the environment.
    let listeners = match activation::take(&config.activation) {
        Ok(l) => l,
        Err(e) => {
            error!("{:#}", anyhow::Error::from(e));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let notifier = notify::Notifier::from_env().unwrap_or_else(|e| {
        warn!(cause = %e, "NOTIFY_SOCKET is unusable; not notifying");
        notify::Notifier::disabled()
    });
    let watchdog = notify::watchdog_interval(
        std::env::var(notify::ENV_WATCHDOG_USEC).ok().as_deref(),
        std::env::var(notify::ENV_WATCHDOG_PID).ok().as_deref(),
        std::process::id(),
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("plexusd")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            error!(cause = %e, "cannot start the async runtime");
            return ExitCode::from(EXIT_OS);
        }
    };
    let env = daemon::Environment {
        notifier,
        watchdog,
        metrics: metrics.clone(),
    };
    let outcome = match (config.selection.clone(), engine) {
        (Some(selection), Some(engine)) => {
            let handler = daemon::Networks::new(engine, selection);
            // In the background: it runs each plugin's VERSION (warming the
            // cache) and must not delay readiness.
            let check = handler.clone();
            runtime.spawn(async move {
                for problem in check.preflight().await {
                    warn!(%problem, "network check at start-up failed; ADD will fail until this is fixed");
                }
            });
            runtime.block_on(daemon::run(config, listeners, env, handler))
        }
        _ => {
            warn!("clusterNetwork is not set: CNI calls will fail until it is");
            runtime.block_on(daemon::run(config, listeners, env, daemon::Unconfigured))
        }
    };
    match outcome {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `plexusd show`: prints the recorded attachments; exit 1 when there is
/// nothing readable recorded for the id asked about. Only reads: it creates,
/// moves and removes nothing, and takes no lock (records are replaced by
/// rename, so a read sees a whole old or a whole new record).
fn show(config: &config::Config, container_id: Option<&str>) -> ExitCode {
    let store = cni::record::Store::at(&config.cni.state_dir);
    let ids = match container_id {
        Some(id) if !cni::types::is_valid_name(id) => {
            eprintln!("plexusd: {id:?} is not a valid container id");
            return ExitCode::FAILURE;
        }
        Some(id) => vec![id.to_string()],
        None => match store.list() {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("plexusd: {e}");
                return ExitCode::from(EXIT_OS);
            }
        },
    };
    let mut out = Vec::new();
    let mut damaged = false;
    for id in &ids {
        match store.load(id) {
            Ok(Some(r)) => out.push(cni::record::summary(&r)),
            Ok(None) if container_id.is_some() => {
                eprintln!(
                    "plexusd: nothing is recorded for container {id:?} in {}",
                    store.dir().display()
                );
                return ExitCode::FAILURE;
            }
            Ok(None) => {}
            // Reported, not moved aside: the daemon does that under the
            // container's lock.
            Err(e) if e.is_damaged() => {
                eprintln!("plexusd: {e}");
                damaged = true;
                out.push(cni::record::damaged_summary(id, &e));
            }
            Err(e) => {
                eprintln!("plexusd: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if container_id.is_none() && out.is_empty() {
        eprintln!("plexusd: nothing is recorded in {}", store.dir().display());
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
