//! Pacing of a failing `accept()`: an exponential backoff, so that running
//! out of descriptors neither spins the accept loop nor stalls it longer
//! than needed, and a warning at most every [`WARN_EVERY`], with a count
//! of the failures it did not report.

use std::time::{Duration, Instant};

/// Wait after the first failure in a row.
pub const FIRST: Duration = Duration::from_millis(10);
/// Longest wait between two attempts.
pub const MAX: Duration = Duration::from_secs(1);
/// Least time between two warnings.
pub const WARN_EVERY: Duration = Duration::from_secs(5);

/// State of one accept loop.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    /// Wait after the next failure; `None` after a success.
    next: Option<Duration>,
    last_warn: Option<Instant>,
    /// Failures since the last warning that were not reported.
    suppressed: u64,
}

/// What to do after a failed `accept()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    /// Wait this long before the next attempt.
    pub wait: Duration,
    /// Warn now, saying how many failures went unreported before this one.
    pub warn: Option<u64>,
}

impl AcceptBackoff {
    pub fn new() -> Self {
        Self::default()
    }

    /// A connection was accepted: the next failure starts from [`FIRST`]
    /// again. The warning's pace is kept, so failures mixed with successes
    /// still log at most every [`WARN_EVERY`].
    pub fn success(&mut self) {
        self.next = None;
    }

    /// An `accept()` failed at `now`.
    pub fn failure(&mut self, now: Instant) -> Failure {
        let wait = self.next.unwrap_or(FIRST);
        self.next = Some((wait * 2).min(MAX));
        let due = self
            .last_warn
            .is_none_or(|t| now.saturating_duration_since(t) >= WARN_EVERY);
        let warn = if due {
            self.last_warn = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        };
        Failure { wait, warn }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_should_double_the_wait_up_to_one_second() {
        let mut b = AcceptBackoff::new();
        let t = Instant::now();
        let waits: Vec<u64> = (0..9)
            .map(|_| b.failure(t).wait.as_millis() as u64)
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    }

    #[test]
    fn success_should_reset_the_wait() {
        let mut b = AcceptBackoff::new();
        let t = Instant::now();
        for _ in 0..5 {
            b.failure(t);
        }
        b.success();
        assert_eq!(b.failure(t).wait, FIRST);
        assert_eq!(b.failure(t).wait, FIRST * 2);
    }

    #[test]
    fn warnings_should_be_rate_limited_with_a_count_of_the_rest() {
        let mut b = AcceptBackoff::new();
        let t0 = Instant::now();
        assert_eq!(b.failure(t0).warn, Some(0), "the first failure warns");
        for i in 1..=7 {
            let at = t0 + Duration::from_millis(500 * i);
            assert_eq!(b.failure(at).warn, None, "failure {i} inside the window");
        }
        // A success in between neither warns nor forgets the count.
        b.success();
        let later = t0 + WARN_EVERY;
        assert_eq!(b.failure(later).warn, Some(7));
        assert_eq!(b.failure(later + Duration::from_secs(1)).warn, None);
        assert_eq!(b.failure(later + WARN_EVERY).warn, Some(1));
    }
}
