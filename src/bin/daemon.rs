//! `plexusd`: args -> config -> path checks -> logging -> inherited sockets -> runtime ->
//! prepared (metrics port, signals, engine) -> socket path -> daemon::run -> exit code.

use std::process::ExitCode;

use clap::Parser;
use plexus::cli::{Args, Sub};
use plexus::server::Handler;
use plexus::{activation, cni, config, daemon, logging, metrics, notify};
use tracing::{error, warn};

/// EX_CONFIG: the configuration is wrong; systemd does not restart on it.
const EXIT_CONFIG: u8 = 78;
/// EX_OSERR: the operating system refused something we need.
const EXIT_OS: u8 = 71;

/// Takes the listeners over (the last fallible start-up step), then runs
/// `after_listen` and the daemon.
fn serve<H: Handler>(
    runtime: &tokio::runtime::Runtime,
    config: config::Config,
    inherited: Option<Vec<std::os::unix::net::UnixListener>>,
    prepared: daemon::Prepared,
    env: daemon::Environment,
    handler: H,
    after_listen: impl FnOnce(),
) -> ExitCode {
    let listening = match daemon::listen(&config.activation, inherited) {
        Ok(l) => l,
        Err(e) => {
            let code = match e {
                daemon::StartError::Listen(_) => EXIT_CONFIG,
                _ => EXIT_OS,
            };
            error!("{:#}", anyhow::Error::from(e));
            return ExitCode::from(code);
        }
    };
    after_listen();
    match runtime.block_on(daemon::run(config, listening, prepared, env, handler)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Start-up, in this order: config, path checks, logging, inherited
/// sockets (before any thread exists), runtime, then everything else that
/// can fail (metrics port, signal handlers, engine and state directory),
/// and only then, last, the socket path is taken over in self-bind mode:
/// a new daemon that fails leaves the one it would replace serving.
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
        if let Err(e) = config.check_paths(config::PathScope { socket_dir: true }) {
            eprintln!("plexusd: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
        println!("{}: configuration is valid", config.path.display());
        return ExitCode::SUCCESS;
    }
    // Before any thread exists: this clears LISTEN_* from the environment.
    // A refused activation is reported once logging is up.
    let inherited = activation::inherited();
    // socketDir is written only when binding the socket ourselves.
    let activated = !matches!(inherited, Ok(None));
    // Before anything is opened or created in them (the log file next).
    if let Err(e) = config.check_paths(config::PathScope {
        socket_dir: !activated,
    }) {
        eprintln!("plexusd: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    if let Err(e) = logging::init(&config.logging) {
        eprintln!("plexusd: {:#}", anyhow::Error::from(e));
        return ExitCode::from(EXIT_CONFIG);
    }
    for key in &config.unknown_keys {
        warn!(file = %config.path.display(), key, "unknown configuration key is ignored");
    }
    let inherited = match inherited {
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
    let _context = runtime.enter();
    let prepared = match daemon::Prepared::new(&config.daemon) {
        Ok(p) => p,
        Err(e) => {
            error!("{:#}", anyhow::Error::from(e));
            return ExitCode::from(EXIT_OS);
        }
    };
    let metrics = std::sync::Arc::new(metrics::Metrics::new());
    let env = daemon::Environment {
        notifier,
        watchdog,
        metrics: metrics.clone(),
    };
    match config.selection.clone() {
        Some(selection) => {
            // Blocking, on the main thread: creates the state directory.
            let engine = match cni::Engine::new(config.cni.clone(), Some(metrics)) {
                Ok(e) => std::sync::Arc::new(e),
                Err(e) => {
                    error!("{e}");
                    return ExitCode::from(EXIT_OS);
                }
            };
            // Again now that the state directory exists: one planted
            // between the first check and its creation is caught.
            if let Err(e) = config.check_paths(config::PathScope { socket_dir: false }) {
                error!("{e}");
                return ExitCode::from(EXIT_CONFIG);
            }
            let handler = daemon::Networks::new(engine, selection);
            let check = handler.clone();
            let rt = runtime.handle().clone();
            serve(
                &runtime,
                config,
                inherited,
                prepared,
                env,
                handler,
                move || {
                    // In the background: it runs each plugin's VERSION (warming
                    // the cache) and must not delay readiness.
                    rt.spawn(async move {
                    for problem in check.preflight().await {
                        warn!(%problem, "network check at start-up failed; ADD will fail until this is fixed");
                    }
                });
                },
            )
        }
        _ => {
            warn!("clusterNetwork is not set: CNI calls will fail until it is");
            serve(
                &runtime,
                config,
                inherited,
                prepared,
                env,
                daemon::Unconfigured,
                || {},
            )
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
            Ok(Some(r)) => out.push(cni::show::summary(&r)),
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
                out.push(cni::show::damaged_summary(id, &e));
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
