//! One lane per container: a container's calls run one at a time, and a
//! call waits for its container's turn *before* it asks for a processing
//! slot. A container whose calls hang (a plugin stuck until
//! `pluginTimeout`, retried by the runtime every second) therefore holds
//! at most one slot, whatever the number of its calls; the other pods'
//! calls keep theirs.
//!
//! Calls without a container (GC, STATUS) share one lane per command: a GC
//! storm holds one slot as well. A lane admits a bounded number of waiters;
//! past it a call is refused at once with "try again later" rather than
//! holding a connection for its whole wait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

/// Calls that may wait for one lane at once; more are refused at once.
pub const MAX_WAITING: usize = 4;

/// What a call runs in: its container's lane, or one per command for the
/// calls without a container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LaneKey {
    Container(String),
    Command(String),
}

impl LaneKey {
    /// The lane of a request with `CNI_COMMAND` `command` and
    /// `CNI_CONTAINERID` `container_id`; `None` for the calls that run no
    /// plugin for a container (VERSION) and need no turn.
    pub fn of(command: Option<&str>, container_id: Option<&str>) -> Option<Self> {
        match (command, container_id) {
            (_, Some(id)) if !id.is_empty() => Some(Self::Container(id.to_string())),
            (Some("VERSION"), _) => None,
            (Some(c), _) => Some(Self::Command(c.to_string())),
            (None, _) => Some(Self::Command(String::new())),
        }
    }

    /// For messages: "container <id>" or "the <command> calls".
    pub fn describe(&self) -> String {
        match self {
            Self::Container(id) => format!("container {id:?}"),
            Self::Command(c) if c.is_empty() => "calls without a command".to_string(),
            Self::Command(c) => format!("the {c} calls"),
        }
    }
}

/// Why a call got no turn.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LaneError {
    #[error(
        "{} already has a call in progress and {waiting} waiting; try again later",
        .key.describe()
    )]
    Busy { key: LaneKey, waiting: usize },
    #[error(
        "{} has had a call in progress for the whole wait of {}; try again later",
        .key.describe(),
        crate::duration::format(*.waited)
    )]
    Timeout {
        key: LaneKey,
        waited: std::time::Duration,
    },
}

/// The lanes of one server.
#[derive(Debug)]
pub struct Lanes {
    map: Mutex<HashMap<LaneKey, Arc<Lane>>>,
    /// Calls waiting for a turn, in all lanes.
    waiting: Gauge,
}

#[derive(Debug, Default)]
struct Lane {
    turn: Arc<tokio::sync::Mutex<()>>,
    waiting: AtomicUsize,
}

/// A call's turn in its lane, held until its work is done (it moves into
/// the work's task with the slot).
#[derive(Debug)]
pub struct Turn {
    // Released first, then the lane is forgotten if nobody else uses it.
    _guard: OwnedMutexGuard<()>,
    _lane: LaneRef,
}

/// A use of a lane; the last one removes the lane from the map.
#[derive(Debug)]
struct LaneRef {
    lanes: Arc<Lanes>,
    key: LaneKey,
    lane: Arc<Lane>,
}

impl Drop for LaneRef {
    fn drop(&mut self) {
        let mut map = self.lanes.map.lock().unwrap_or_else(|e| e.into_inner());
        // Nobody can take the lane from the map while it is locked: the map
        // and this use are the only ones left when the count is 2.
        if map
            .get(&self.key)
            .is_some_and(|l| Arc::ptr_eq(l, &self.lane) && Arc::strong_count(l) == 2)
        {
            map.remove(&self.key);
        }
    }
}

/// Counts a waiter out however its wait ends.
struct Waiting(Arc<Lane>, Gauge);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
        self.1.dec();
    }
}

impl Lanes {
    /// Lanes whose waiting calls `waiting` counts.
    pub fn new(waiting: Gauge) -> Arc<Self> {
        Arc::new(Self {
            map: Mutex::default(),
            waiting,
        })
    }

    /// Waits (first come, first served) until `deadline` for the turn of
    /// `key`; refuses at once when [`MAX_WAITING`] calls already wait.
    pub async fn turn(
        self: &Arc<Self>,
        key: LaneKey,
        deadline: Instant,
    ) -> Result<Turn, LaneError> {
        let lane = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            let lane = map.entry(key.clone()).or_default().clone();
            LaneRef {
                lanes: self.clone(),
                key,
                lane,
            }
        };
        let mutex = lane.lane.turn.clone();
        if let Ok(guard) = mutex.clone().try_lock_owned() {
            return Ok(Turn {
                _guard: guard,
                _lane: lane,
            });
        }
        let waiting = lane.lane.waiting.fetch_add(1, Ordering::AcqRel);
        self.waiting.inc();
        let counted = Waiting(lane.lane.clone(), self.waiting.clone());
        if waiting >= MAX_WAITING {
            drop(counted);
            return Err(LaneError::Busy {
                key: lane.key.clone(),
                waiting,
            });
        }
        let started = Instant::now();
        let got = tokio::time::timeout_at(deadline, mutex.lock_owned()).await;
        drop(counted);
        match got {
            Ok(guard) => Ok(Turn {
                _guard: guard,
                _lane: lane,
            }),
            Err(_) => Err(LaneError::Timeout {
                key: lane.key.clone(),
                waited: started.elapsed(),
            }),
        }
    }

    /// Lanes in use (held or waited for).
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no lane is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn c(id: &str) -> LaneKey {
        LaneKey::Container(id.into())
    }

    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[test]
    fn keys_should_follow_the_container_or_the_command() {
        assert_eq!(LaneKey::of(Some("ADD"), Some("a")), Some(c("a")));
        assert_eq!(LaneKey::of(Some("DEL"), Some("a")), Some(c("a")));
        assert_eq!(
            LaneKey::of(Some("GC"), None),
            Some(LaneKey::Command("GC".into()))
        );
        assert_eq!(
            LaneKey::of(Some("GC"), Some("")),
            Some(LaneKey::Command("GC".into()))
        );
        assert_eq!(LaneKey::of(Some("VERSION"), None), None);
    }

    #[tokio::test]
    async fn one_container_should_run_one_call_at_a_time() {
        let lanes = Lanes::new(Gauge::default());
        let first = lanes.turn(c("a"), soon(5_000)).await.unwrap();
        // Another container is not held up.
        let other = lanes.turn(c("b"), soon(5_000)).await.unwrap();
        let err = lanes.turn(c("a"), soon(20)).await.unwrap_err();
        assert!(matches!(err, LaneError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("try again later"));
        drop(first);
        let again = lanes.turn(c("a"), soon(20)).await.unwrap();
        drop((again, other));
        assert!(lanes.is_empty(), "lanes left behind: {}", lanes.len());
    }

    #[tokio::test]
    async fn waiters_should_get_the_turn_in_order() {
        let lanes = Lanes::new(Gauge::default());
        let first = lanes.turn(c("a"), soon(5_000)).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (l, order) = (lanes.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _t = l.turn(c("a"), soon(5_000)).await.unwrap();
                order.lock().unwrap().push(i);
            }));
            // Each waiter queues before the next one starts.
            while lanes.map.lock().unwrap()[&c("a")]
                .waiting
                .load(Ordering::Acquire)
                < i + 1
            {
                tokio::task::yield_now().await;
            }
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert!(lanes.is_empty());
    }

    #[tokio::test]
    async fn a_full_lane_should_refuse_at_once() {
        let lanes = Lanes::new(Gauge::default());
        let _first = lanes.turn(c("a"), soon(60_000)).await.unwrap();
        let mut waiters = Vec::new();
        for _ in 0..MAX_WAITING {
            let l = lanes.clone();
            waiters.push(tokio::spawn(async move {
                l.turn(c("a"), soon(60_000)).await.map(|_| ())
            }));
        }
        while lanes.map.lock().unwrap()[&c("a")]
            .waiting
            .load(Ordering::Acquire)
            < MAX_WAITING
        {
            tokio::task::yield_now().await;
        }
        let refused =
            tokio::time::timeout(Duration::from_secs(5), lanes.turn(c("a"), soon(60_000)))
                .await
                .expect("a full lane made the call wait");
        assert!(matches!(refused, Err(LaneError::Busy { .. })));
        assert_eq!(lanes.waiting.get(), MAX_WAITING as i64);
        // A waiter that gives up (its client hung up) frees its place.
        for w in &waiters {
            w.abort();
        }
        for w in waiters {
            let _ = w.await;
        }
        assert_eq!(
            lanes.map.lock().unwrap()[&c("a")]
                .waiting
                .load(Ordering::Acquire),
            0
        );
        assert_eq!(lanes.waiting.get(), 0);
    }
}
