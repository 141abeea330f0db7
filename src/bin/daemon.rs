//! `plexusd`: args -> config -> logging -> listener -> runtime -> daemon::run -> exit code.

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
    let metrics = std::sync::Arc::new(metrics::Metrics::new());
    let env = daemon::Environment {
        notifier,
        watchdog,
        metrics: metrics.clone(),
    };
    let outcome = match config.selection.clone() {
        Some(selection) => {
            let engine = match cni::Engine::new(config.cni.clone(), Some(metrics)) {
                Ok(e) => std::sync::Arc::new(e),
                Err(e) => {
                    error!("{e}");
                    return ExitCode::from(EXIT_OS);
                }
            };
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
        None => {
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
/// nothing recorded for the id asked about.
fn show(config: &config::Config, container_id: Option<&str>) -> ExitCode {
    let store = match cni::record::Store::open(&config.cni.state_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("plexusd: {e}");
            return ExitCode::from(EXIT_OS);
        }
    };
    let ids = match container_id {
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
    for id in &ids {
        if !cni::types::is_valid_name(id) {
            eprintln!("plexusd: {id:?} is not a valid container id");
            return ExitCode::FAILURE;
        }
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
            Err(e) => {
                eprintln!("plexusd: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let value = match (container_id, out.len()) {
        (Some(_), 1) => out.remove(0),
        _ => serde_json::Value::Array(out),
    };
    match serde_json::to_string_pretty(&value) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("plexusd: {e}");
            ExitCode::FAILURE
        }
    }
}
