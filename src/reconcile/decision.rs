//! The decision of one reconcile round, pure: given what the runtime
//! answered, what is remembered of earlier rounds, and what is known of
//! each recorded container, which containers' networks plexusd deletes
//! itself. Everything it needs comes in as values (times included), so
//! every rule is unit-tested.
//!
//! The rules, each a refusal to act on doubt:
//! - nothing is done when the runtime did not answer, answered with an
//!   error, started (or restarted) less than the grace period ago, cannot
//!   tell when it started, or answers an empty list while it listed
//!   sandboxes before (until the list has been empty for the grace period);
//! - a container is reclaimed only when its record names a Kubernetes pod
//!   (`K8S_POD_NAMESPACE` and `K8S_POD_NAME` in its `CNI_ARGS`: podman's
//!   and other callers' containers are never touched), the runtime does
//!   not list its sandbox, its network namespace is gone, and its record
//!   was last written longer than the grace period ago.

use std::collections::HashSet;
use std::time::{Duration, Instant};

/// A pod, as a container's `CNI_ARGS` name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
}

/// What is known of one recorded container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    /// The pod its `CNI_ARGS` name; `None`: not a Kubernetes pod's.
    pub pod: Option<Pod>,
    /// Every network namespace its record names is gone (no file, or a
    /// file that is not a namespace any more).
    pub netns_gone: bool,
    /// How long ago its record was last written.
    pub age: Duration,
}

/// What the runtime answered this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Its sandboxes' ids, and how long ago it started (`None`: unknown).
    Listed {
        ids: HashSet<String>,
        runtime_age: Option<Duration>,
    },
    /// No answer within the timeout.
    Unanswered(String),
    /// An error (or no connection).
    Failed(String),
}

/// What a round remembers of the earlier ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    /// How many sandboxes the last answer listed.
    pub last_listed: Option<usize>,
    /// Since when the runtime answers an empty list after a non-empty one.
    pub empty_since: Option<Instant>,
}

/// Why a round does nothing at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    Unanswered(String),
    Failed(String),
    /// The runtime started this long ago, within the grace period.
    RuntimeYoung(Duration),
    /// When the runtime started cannot be told.
    RuntimeAgeUnknown,
    /// An empty list after a non-empty one, for this long so far.
    SuddenlyEmpty(Duration),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = |d: &Duration| crate::duration::format(*d);
        match self {
            Skip::Unanswered(why) => write!(f, "the runtime did not answer: {why}"),
            Skip::Failed(why) => write!(f, "the runtime answered with an error: {why}"),
            Skip::RuntimeYoung(age) => write!(
                f,
                "the runtime started {} ago, within the grace period",
                d(age)
            ),
            Skip::RuntimeAgeUnknown => write!(f, "when the runtime started cannot be told"),
            Skip::SuddenlyEmpty(for_) => write!(
                f,
                "the runtime lists no sandbox after listing some, for {} so far",
                d(for_)
            ),
        }
    }
}

/// Why a container is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Keep {
    /// Its record names no Kubernetes pod.
    NotKubernetes,
    /// The runtime lists its sandbox.
    Listed,
    /// Its network namespace is still there.
    NetnsPresent,
    /// Its record was written within the grace period.
    Young,
}

impl Keep {
    pub fn as_str(self) -> &'static str {
        match self {
            Keep::NotKubernetes => "not_kubernetes",
            Keep::Listed => "listed",
            Keep::NetnsPresent => "netns_present",
            Keep::Young => "young",
        }
    }
}

/// A round's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// Nothing is done, for this reason.
    Skip(Skip),
    /// These containers' networks are deleted; the others kept, each with
    /// its reason.
    Act {
        reclaim: Vec<String>,
        kept: Vec<(String, Keep)>,
    },
}

/// Whether the runtime's answer may be acted on at all; updates `memory`
/// with a listing.
pub fn trust(memory: &mut Memory, now: Instant, answer: &Answer, grace: Duration) -> Option<Skip> {
    let (ids, runtime_age) = match answer {
        Answer::Unanswered(why) => return Some(Skip::Unanswered(why.clone())),
        Answer::Failed(why) => return Some(Skip::Failed(why.clone())),
        Answer::Listed { ids, runtime_age } => (ids, runtime_age),
    };
    let listed_before = memory.last_listed.is_some_and(|n| n > 0);
    memory.last_listed = Some(ids.len());
    if !ids.is_empty() {
        memory.empty_since = None;
    } else if listed_before || memory.empty_since.is_some() {
        let since = *memory.empty_since.get_or_insert(now);
        let for_ = now.saturating_duration_since(since);
        if for_ < grace {
            return Some(Skip::SuddenlyEmpty(for_));
        }
    }
    match runtime_age {
        None => Some(Skip::RuntimeAgeUnknown),
        Some(age) if *age < grace => Some(Skip::RuntimeYoung(*age)),
        Some(_) => None,
    }
}

/// The verdict on one container, the runtime listing `listed`.
pub fn verdict(c: &Candidate, listed: &HashSet<String>, grace: Duration) -> Option<Keep> {
    if c.pod.is_none() {
        Some(Keep::NotKubernetes)
    } else if listed.contains(&c.id) {
        Some(Keep::Listed)
    } else if !c.netns_gone {
        Some(Keep::NetnsPresent)
    } else if c.age < grace {
        Some(Keep::Young)
    } else {
        None
    }
}

/// One round's decision (see the module's rules).
pub fn decide(
    memory: &mut Memory,
    now: Instant,
    answer: &Answer,
    candidates: &[Candidate],
    grace: Duration,
) -> Round {
    if let Some(skip) = trust(memory, now, answer, grace) {
        return Round::Skip(skip);
    }
    let Answer::Listed { ids, .. } = answer else {
        return Round::Skip(Skip::Failed("no listing".into()));
    };
    let mut reclaim = Vec::new();
    let mut kept = Vec::new();
    for c in candidates {
        match verdict(c, ids, grace) {
            None => reclaim.push(c.id.clone()),
            Some(why) => kept.push((c.id.clone(), why)),
        }
    }
    Round::Act { reclaim, kept }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(600);
    const OLD: Duration = Duration::from_secs(3600);

    fn pod() -> Option<Pod> {
        Some(Pod {
            namespace: "ns".into(),
            name: "web".into(),
        })
    }

    /// A container every rule lets go.
    fn gone(id: &str) -> Candidate {
        Candidate {
            id: id.into(),
            pod: pod(),
            netns_gone: true,
            age: OLD,
        }
    }

    fn listed(ids: &[&str], runtime_age: Duration) -> Answer {
        Answer::Listed {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            runtime_age: Some(runtime_age),
        }
    }

    fn reclaimed(round: &Round) -> Vec<String> {
        match round {
            Round::Act { reclaim, .. } => reclaim.clone(),
            Round::Skip(_) => Vec::new(),
        }
    }

    #[test]
    fn a_forgotten_pod_should_be_reclaimed_and_every_other_kept_with_its_reason() {
        let mut m = Memory::default();
        let candidates = [
            gone("forgotten"),
            Candidate {
                pod: None,
                ..gone("podman")
            },
            gone("live"),
            Candidate {
                netns_gone: false,
                ..gone("netns")
            },
            Candidate {
                age: Duration::from_secs(5),
                ..gone("young")
            },
        ];
        let round = decide(
            &mut m,
            Instant::now(),
            &listed(&["live", "other"], OLD),
            &candidates,
            GRACE,
        );
        assert_eq!(
            round,
            Round::Act {
                reclaim: vec!["forgotten".into()],
                kept: vec![
                    ("podman".into(), Keep::NotKubernetes),
                    ("live".into(), Keep::Listed),
                    ("netns".into(), Keep::NetnsPresent),
                    ("young".into(), Keep::Young),
                ],
            }
        );
    }

    #[test]
    fn nothing_should_be_done_when_the_runtime_does_not_answer_or_fails() {
        let mut m = Memory::default();
        let now = Instant::now();
        for answer in [
            Answer::Unanswered("timeout".into()),
            Answer::Failed("gRPC status 14".into()),
        ] {
            let round = decide(&mut m, now, &answer, &[gone("a")], GRACE);
            assert!(matches!(round, Round::Skip(_)), "{round:?}");
        }
        // And they leave the memory of the last listing as it was.
        assert_eq!(m, Memory::default());
    }

    #[test]
    fn nothing_should_be_done_while_the_runtime_is_younger_than_the_grace_period() {
        let mut m = Memory::default();
        let now = Instant::now();
        let round = decide(
            &mut m,
            now,
            &listed(&["x"], Duration::from_secs(30)),
            &[gone("a")],
            GRACE,
        );
        assert_eq!(
            round,
            Round::Skip(Skip::RuntimeYoung(Duration::from_secs(30)))
        );
        let unknown = Answer::Listed {
            ids: HashSet::new(),
            runtime_age: None,
        };
        let round = decide(&mut Memory::default(), now, &unknown, &[gone("a")], GRACE);
        assert_eq!(round, Round::Skip(Skip::RuntimeAgeUnknown));
        let round = decide(&mut m, now, &listed(&["x"], GRACE), &[gone("a")], GRACE);
        assert_eq!(reclaimed(&round), ["a"]);
    }

    #[test]
    fn an_empty_list_after_a_full_one_should_be_trusted_only_after_the_grace_period() {
        let mut m = Memory::default();
        let t0 = Instant::now();
        let full = decide(&mut m, t0, &listed(&["x"], OLD), &[gone("a")], GRACE);
        assert_eq!(reclaimed(&full), ["a"]);
        let t1 = t0 + Duration::from_secs(1);
        let empty = decide(&mut m, t1, &listed(&[], OLD), &[gone("b")], GRACE);
        assert_eq!(empty, Round::Skip(Skip::SuddenlyEmpty(Duration::ZERO)));
        // Still empty, but not for long enough.
        let t2 = t1 + GRACE - Duration::from_secs(1);
        let still = decide(&mut m, t2, &listed(&[], OLD), &[gone("b")], GRACE);
        assert!(matches!(still, Round::Skip(Skip::SuddenlyEmpty(_))));
        // A failed round in between changes nothing.
        let failed = Answer::Failed("x".into());
        decide(&mut m, t2, &failed, &[gone("b")], GRACE);
        let later = decide(&mut m, t1 + GRACE, &listed(&[], OLD), &[gone("b")], GRACE);
        assert_eq!(reclaimed(&later), ["b"]);
        // A list with sandboxes again ends the doubt; the next empty one
        // starts it over.
        decide(&mut m, t1 + GRACE, &listed(&["y"], OLD), &[], GRACE);
        assert_eq!(m.empty_since, None);
        let again = decide(&mut m, t1 + OLD, &listed(&[], OLD), &[gone("b")], GRACE);
        assert!(matches!(again, Round::Skip(Skip::SuddenlyEmpty(_))));
    }

    #[test]
    fn an_empty_list_from_the_first_round_should_be_trusted() {
        let mut m = Memory::default();
        let round = decide(
            &mut m,
            Instant::now(),
            &listed(&[], OLD),
            &[gone("a")],
            GRACE,
        );
        assert_eq!(reclaimed(&round), ["a"]);
    }

    #[test]
    fn each_container_rule_should_keep_alone() {
        let ids: HashSet<String> = ["live".to_string()].into();
        assert_eq!(verdict(&gone("a"), &ids, GRACE), None);
        let podman = Candidate {
            pod: None,
            ..gone("a")
        };
        assert_eq!(verdict(&podman, &ids, GRACE), Some(Keep::NotKubernetes));
        assert_eq!(verdict(&gone("live"), &ids, GRACE), Some(Keep::Listed));
        let netns = Candidate {
            netns_gone: false,
            ..gone("a")
        };
        assert_eq!(verdict(&netns, &ids, GRACE), Some(Keep::NetnsPresent));
        let young = Candidate {
            age: GRACE - Duration::from_millis(1),
            ..gone("a")
        };
        assert_eq!(verdict(&young, &ids, GRACE), Some(Keep::Young));
    }
}
