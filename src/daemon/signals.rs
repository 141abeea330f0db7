//! The signals plexusd handles: the ones that stop it (SIGTERM, SIGINT,
//! SIGQUIT: a drain, then exit, the socket path released when it bound
//! it), and the ones whose default action would kill it without a word
//! (SIGHUP, SIGUSR1, SIGUSR2: logged and ignored).

use std::sync::Arc;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing::info;

use super::{Stop, StopReason};

/// The handlers, installed; each with its signal's name for the log.
#[derive(Debug)]
pub(super) struct Signals {
    stop: Vec<(&'static str, Signal)>,
    ignored: Vec<(&'static str, Signal)>,
}

impl Signals {
    /// Installs the handlers; from then on none of these signals has its
    /// default action. Must run within the runtime's context.
    pub(super) fn install() -> std::io::Result<Self> {
        Ok(Self {
            stop: vec![
                ("SIGTERM", signal(SignalKind::terminate())?),
                ("SIGINT", signal(SignalKind::interrupt())?),
                ("SIGQUIT", signal(SignalKind::quit())?),
            ],
            ignored: vec![
                ("SIGHUP", signal(SignalKind::hangup())?),
                ("SIGUSR1", signal(SignalKind::user_defined1())?),
                ("SIGUSR2", signal(SignalKind::user_defined2())?),
            ],
        })
    }

    /// Requests `stop` on each stopping signal, and logs the ignored
    /// ones, for as long as the process runs.
    pub(super) fn spawn_watch(self, stop: Arc<Stop>) {
        let Self {
            stop: mut stopping,
            mut ignored,
        } = self;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    name = next_signal(&mut stopping) => {
                        if stop.is_requested() {
                            info!(signal = name, "already stopping");
                        } else {
                            info!(signal = name, "stop requested");
                            stop.request(StopReason::Signal);
                        }
                    }
                    name = next_signal(&mut ignored) => {
                        info!(
                            signal = name,
                            "ignored: nothing is reloaded on a signal. Networks in confDir and \
                             NetworkAttachmentDefinitions are read as they change; a change of \
                             daemon-config.json takes a restart (systemctl restart plexusd: systemd \
                             keeps the socket, so calls wait rather than fail)"
                        );
                    }
                }
            }
        });
    }
}

/// The first of `signals` to arrive (never, if there are none).
async fn next_signal(signals: &mut [(&'static str, Signal)]) -> &'static str {
    let waits = signals.iter_mut().map(|(name, s)| {
        Box::pin(async move {
            s.recv().await;
            *name
        })
    });
    futures_util::future::select_all(waits).await.0
}
