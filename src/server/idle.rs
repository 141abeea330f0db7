//! Connections that have not delivered a request head yet, oldest first,
//! so that at the connection cap the accept loop can close the one idle
//! longest and serve a waiting client in its place. Idle connections would
//! otherwise hold their slots for the whole read timeout while a real call
//! waits in the listen backlog behind them.
//!
//! A connection becomes a candidate only once its task has been polled:
//! by then whatever head the client had sent has been read and handed to
//! the service, so a client that wrote its request at once is never taken
//! for an idle one. A connection whose request head has arrived leaves
//! the set for good: a request in progress is never evicted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The set, shared by the accept loops and the connection tasks.
#[derive(Debug, Default)]
pub struct IdleConnections {
    inner: Mutex<Inner>,
    /// Signalled when a connection becomes a candidate.
    candidate: Notify,
    /// Signalled when an evicted connection turned out to have received
    /// its request head at the same moment, and stays.
    declined: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    /// By order of accept.
    entries: BTreeMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    polled: bool,
    evict: CancellationToken,
}

/// A connection's place in the set; leaves it when dropped.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    set: Arc<IdleConnections>,
    busy: AtomicBool,
}

impl IdleConnections {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Plain data, updated in single statements: still good after a
        // panic elsewhere.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a just accepted connection; the token is cancelled if it is
    /// chosen for eviction.
    pub fn register(self: &Arc<Self>) -> (Ticket, CancellationToken) {
        let evict = CancellationToken::new();
        let mut inner = self.lock();
        let id = inner.next;
        inner.next += 1;
        inner.entries.insert(
            id,
            Entry {
                polled: false,
                evict: evict.clone(),
            },
        );
        drop(inner);
        (
            Ticket {
                id,
                set: self.clone(),
                busy: AtomicBool::new(false),
            },
            evict,
        )
    }

    /// Closes the candidate idle longest; false when there is none.
    pub fn evict_oldest(&self) -> bool {
        let mut inner = self.lock();
        let Some(id) = inner
            .entries
            .iter()
            .find(|(_, e)| e.polled)
            .map(|(id, _)| *id)
        else {
            return false;
        };
        if let Some(e) = inner.entries.remove(&id) {
            e.evict.cancel();
        }
        true
    }

    /// Resolves after the next time an eviction was declined (see
    /// [`Ticket::decline`]); `enable` it before evicting.
    pub fn declined(&self) -> Notified<'_> {
        self.declined.notified()
    }

    /// Whether a connection could be evicted now.
    pub fn has_candidate(&self) -> bool {
        self.lock().entries.values().any(|e| e.polled)
    }

    /// Resolves after the next time a connection becomes a candidate
    /// (call `enable` on it before checking, so none is missed).
    pub fn candidate(&self) -> Notified<'_> {
        self.candidate.notified()
    }

    /// Connections in the set.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }

    fn remove(&self, id: u64) {
        self.lock().entries.remove(&id);
    }
}

impl Ticket {
    /// The connection's task has been polled without a complete request
    /// head: from now on it may be evicted.
    pub fn polled(&self) {
        let mut inner = self.set.lock();
        let Some(e) = inner.entries.get_mut(&self.id) else {
            return;
        };
        e.polled = true;
        drop(inner);
        self.set.candidate.notify_waiters();
    }

    /// A request head has arrived: never evict this connection.
    pub fn busy(&self) {
        self.busy.store(true, Ordering::Release);
        self.set.remove(self.id);
    }

    /// The connection was chosen for eviction just as its request head
    /// arrived: it stays, and whoever evicted it has to look again.
    pub fn decline(&self) {
        self.set.declined.notify_waiters();
    }

    /// Whether a request head has arrived.
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.set.remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evict_should_take_the_oldest_polled_connection() {
        let set = Arc::new(IdleConnections::new());
        let (a, ea) = set.register();
        let (b, eb) = set.register();
        let (c, ec) = set.register();
        assert!(!set.evict_oldest(), "nothing polled yet");
        c.polled();
        b.polled();
        assert!(set.evict_oldest());
        assert!(eb.is_cancelled() && !ea.is_cancelled() && !ec.is_cancelled());
        assert!(set.evict_oldest());
        assert!(ec.is_cancelled());
        assert!(!set.evict_oldest(), "a is not polled");
        drop((a, b, c));
        assert_eq!(set.len(), 0);
    }

    #[test]
    fn busy_connection_should_never_be_evicted() {
        let set = Arc::new(IdleConnections::new());
        let (a, ea) = set.register();
        a.busy();
        a.polled();
        assert!(!set.evict_oldest());
        assert!(!ea.is_cancelled());
        assert_eq!(set.len(), 0);
    }

    #[tokio::test]
    async fn decline_should_wake_the_evictor() {
        let set = Arc::new(IdleConnections::new());
        let (a, ea) = set.register();
        a.polled();
        let declined = set.declined();
        tokio::pin!(declined);
        declined.as_mut().enable();
        assert!(set.evict_oldest());
        // The head arrived at the same moment.
        a.busy();
        assert!(ea.is_cancelled() && a.is_busy());
        a.decline();
        tokio::time::timeout(std::time::Duration::from_secs(5), declined)
            .await
            .expect("woken");
    }

    #[tokio::test]
    async fn polled_should_wake_a_waiter() {
        let set = Arc::new(IdleConnections::new());
        let (a, _ea) = set.register();
        let waiter = set.candidate();
        tokio::pin!(waiter);
        waiter.as_mut().enable();
        a.polled();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken");
    }
}
