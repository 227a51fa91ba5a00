//! The two timing rules every loop of the agent shares, as clock-explicit values (the caller
//! passes `now`, so tests need no sleeps):
//! - [`Backoff`]: exponential retry delays, doubling from a minimum to a maximum;
//! - [`Debounce`]: a burst of events becomes one, once quiet for a while or at the latest
//!   some time after its first event.

use std::ops::Add;
use std::time::Duration;

/// Exponential retry delays: `min`, `2 * min`, `4 * min` .. `max`, back to `min` after a
/// success ([`Backoff::reset`]).
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    /// Consecutive failures so far.
    failures: u32,
}

impl Backoff {
    pub const fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            failures: 0,
        }
    }

    /// The delay after `failures` consecutive failures (the first one waits `min`).
    pub fn delay_after(&self, failures: u32) -> Duration {
        self.min
            .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
            .min(self.max)
    }

    /// Counts one more failure and returns how long to wait before the retry.
    pub fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.delay_after(self.failures)
    }

    /// A success: the next failure waits `min` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Coalesces a burst of events: the burst ends once no event came for `quiet`, and at the
/// latest `max` after its first event, so that a source that never goes quiet is still
/// followed promptly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debounce {
    pub quiet: Duration,
    pub max: Duration,
}

impl Debounce {
    /// A burst whose first event came at `now`. Generic over the clock (`std` or tokio
    /// instants).
    pub fn start<I>(&self, now: I) -> Burst<I>
    where
        I: Copy + Ord + Add<Duration, Output = I>,
    {
        Burst {
            quiet: self.quiet,
            quiet_until: now + self.quiet,
            ends_by: now + self.max,
        }
    }
}

/// One burst in progress (see [`Debounce::start`]).
#[derive(Debug, Clone, Copy)]
pub struct Burst<I> {
    quiet: Duration,
    quiet_until: I,
    ends_by: I,
}

impl<I> Burst<I>
where
    I: Copy + Ord + Add<Duration, Output = I>,
{
    /// Another event of the burst came at `now`: it ends `quiet` later at the earliest.
    pub fn event(&mut self, now: I) {
        self.quiet_until = now + self.quiet;
    }

    /// An event that must not wait came at `now`: the burst ends at `now` (what is already
    /// queued is still taken in; nothing more is waited for).
    pub fn hurry(&mut self, now: I) {
        self.ends_by = self.ends_by.min(now);
    }

    /// When the burst ends unless another event comes first.
    pub fn deadline(&self) -> I {
        self.quiet_until.min(self.ends_by)
    }

    /// True once `now` is at or past the deadline.
    pub fn is_over(&self, now: I) -> bool {
        now >= self.deadline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn debounce(quiet_ms: u64, max_ms: u64) -> Debounce {
        Debounce {
            quiet: ms(quiet_ms),
            max: ms(max_ms),
        }
    }

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn backoff_doubles_from_min_to_max_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
        assert_eq!(b.delay_after(0), Duration::from_secs(1));
        assert_eq!(b.delay_after(1), Duration::from_secs(1));
        assert_eq!(b.delay_after(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn backoff_with_a_sub_second_minimum() {
        let mut b = Backoff::new(ms(250), Duration::from_secs(8));
        let delays: Vec<Duration> = (0..7).map(|_| b.next_delay()).collect();
        assert_eq!(
            delays,
            [
                ms(250),
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                ms(8000)
            ]
        );
    }

    #[test]
    fn backoff_never_overflows() {
        let mut b = Backoff::new(Duration::from_secs(u64::MAX / 2), Duration::MAX);
        for _ in 0..100 {
            b.next_delay();
        }
        assert_eq!(b.next_delay(), Duration::MAX);
    }

    #[test]
    fn a_burst_ends_when_quiet() {
        let t0 = Instant::now();
        let mut burst = debounce(100, 500).start(t0);
        assert_eq!(burst.deadline(), t0 + ms(100));
        assert!(!burst.is_over(t0 + ms(99)));
        burst.event(t0 + ms(60));
        assert_eq!(
            burst.deadline(),
            t0 + ms(160),
            "each event restarts the quiet time"
        );
        assert!(!burst.is_over(t0 + ms(159)));
        assert!(burst.is_over(t0 + ms(160)));
    }

    #[test]
    fn a_burst_that_never_goes_quiet_ends_at_max() {
        let t0 = Instant::now();
        let mut burst = debounce(200, 800).start(t0);
        for step in 1..=10 {
            burst.event(t0 + ms(100 * step));
        }
        assert_eq!(burst.deadline(), t0 + ms(800));
        assert!(burst.is_over(t0 + ms(800)));
    }

    #[test]
    fn an_urgent_event_ends_the_burst_at_once() {
        let d = debounce(100, 500);
        let t0 = Instant::now();
        let mut burst = d.start(t0);
        burst.event(t0 + ms(10));
        assert_eq!(burst.deadline(), t0 + ms(110));
        burst.hurry(t0 + ms(20));
        assert_eq!(burst.deadline(), t0 + ms(20));
        assert!(burst.is_over(t0 + ms(20)));
        // Later events of the same burst do not push it out again.
        burst.event(t0 + ms(21));
        assert!(burst.is_over(t0 + ms(21)));
        // Urgent as the first event: no wait at all.
        let mut burst = d.start(t0);
        burst.hurry(t0);
        assert!(burst.is_over(t0));
    }

    #[test]
    fn a_burst_works_on_tokio_instants() {
        let t0 = tokio::time::Instant::now();
        let mut burst = debounce(100, 500).start(t0);
        burst.event(t0 + ms(450));
        assert_eq!(burst.deadline(), t0 + ms(500));
    }
}
