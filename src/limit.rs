//! Admission control: the cap on open connections and the limit on CNI
//! requests processed at once, with a bounded FIFO wait for a slot.
//!
//! Slots are taken only once a request has fully arrived, so an idle or
//! slow client never holds one. A slot is then held by the work, not the
//! connection: the [`Permit`] moves into the task that runs the plugins and
//! is freed when they are done, even if the client hung up long before.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::{Metrics, RejectLabels};

/// Settings of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// CNI requests processed at once; `None` means no limit.
    pub connection_limit: Option<NonZeroUsize>,
    /// How long a request may wait for a processing slot.
    pub queue_timeout: Duration,
    /// Open client connections; past it the daemon stops accepting.
    pub max_connections: NonZeroUsize,
}

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "too many CNI requests: no processing slot became free within {}; try again later",
        crate::duration::format(*.waited)
    )]
    QueueTimeout { waited: Duration },
    #[error("the daemon is shutting down; try again later")]
    Closed,
}

/// Gate in front of CNI work.
#[derive(Debug, Clone)]
pub struct Admission {
    slots: Option<Arc<Semaphore>>,
    queue_timeout: Duration,
    metrics: Arc<Metrics>,
}

/// Owned by the task doing a request's CNI work; frees its slot (and
/// counts the work out of the in-flight gauge) when dropped.
#[derive(Debug)]
pub struct Permit {
    _slot: Option<OwnedSemaphorePermit>,
    metrics: Arc<Metrics>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// Decrements the queued gauge however the wait ends.
struct Queued<'a>(&'a Metrics);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.dec();
    }
}

impl Admission {
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Self {
        Self {
            slots: config
                .connection_limit
                .map(|n| Arc::new(Semaphore::new(n.get()))),
            queue_timeout: config.queue_timeout,
            metrics,
        }
    }

    /// Waits (first come, first served) for a processing slot.
    pub async fn admit(&self) -> Result<Permit, Error> {
        let slot = match &self.slots {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(tokio::sync::TryAcquireError::Closed) => return Err(Error::Closed),
                Err(tokio::sync::TryAcquireError::NoPermits) => {
                    self.metrics.queued.inc();
                    let _queued = Queued(&self.metrics);
                    match tokio::time::timeout(self.queue_timeout, slots.clone().acquire_owned())
                        .await
                    {
                        Ok(Ok(p)) => Some(p),
                        Ok(Err(_)) => return Err(Error::Closed),
                        Err(_) => {
                            self.metrics
                                .rejected
                                .get_or_create(&RejectLabels {
                                    reason: "queue_timeout",
                                })
                                .inc();
                            return Err(Error::QueueTimeout {
                                waited: self.queue_timeout,
                            });
                        }
                    }
                }
            },
        };
        self.metrics.in_flight.inc();
        Ok(Permit {
            _slot: slot,
            metrics: self.metrics.clone(),
        })
    }
}

/// The cap on open connections: a permit is taken before `accept()`, so
/// past the cap clients wait in the kernel's listen backlog.
#[derive(Debug, Clone)]
pub struct ConnectionLimit {
    slots: Arc<Semaphore>,
}

impl ConnectionLimit {
    pub fn new(config: &Config) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(config.max_connections.get())),
        }
    }

    /// A connection slot; `None` only if the limit was closed.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(limit: usize, wait_ms: u64) -> Config {
        Config {
            connection_limit: NonZeroUsize::new(limit),
            queue_timeout: Duration::from_millis(wait_ms),
            max_connections: NonZeroUsize::new(8).unwrap(),
        }
    }

    #[tokio::test]
    async fn admit_over_limit_should_time_out_with_try_again() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&config(1, 20), m.clone());
        let held = a.admit().await.unwrap();
        assert_eq!(m.in_flight.get(), 1);
        let err = a.admit().await.unwrap_err();
        assert!(matches!(err, Error::QueueTimeout { .. }));
        assert!(err.to_string().contains("try again later"));
        assert_eq!(m.queued.get(), 0);
        drop(held);
        assert_eq!(m.in_flight.get(), 0);
        a.admit().await.unwrap();
    }

    #[tokio::test]
    async fn admit_should_serve_waiters_when_a_slot_frees() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&config(1, 5_000), m.clone());
        let held = a.admit().await.unwrap();
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.admit().await.map(|_| ()) });
        while m.queued.get() == 0 {
            tokio::task::yield_now().await;
        }
        drop(held);
        waiter.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn unlimited_should_never_wait() {
        let m = Arc::new(Metrics::new());
        let a = Admission::new(&config(0, 0), m);
        let _p: Vec<_> = futures_lite(&a, 100).await;
    }

    async fn futures_lite(a: &Admission, n: usize) -> Vec<Permit> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(a.admit().await.unwrap());
        }
        v
    }
}
