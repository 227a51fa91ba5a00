//! The Lease election's timings (`--leader-elect-*`), read by `controller::lease`.

use std::time::Duration;

/// Timings of one election (client-go's `LeaseDuration`, `RenewDeadline`, `RetryPeriod`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long followers wait, from the last change of the record they saw, before taking
    /// over. Whole seconds (the Lease's `leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops leading. Less than `lease_duration`.
    pub renew_deadline: Duration,
    /// Between two attempts (renewals of the leader, reads of the followers).
    pub retry_period: Duration,
}

impl Timings {
    /// 4 s / 3 s / 1 s. A dead leader is replaced within `lease_duration + 2 * retry_period`
    /// (~6 s) of its last renewal, a released lease within one retry period; the leader writes
    /// one replace per second and each follower makes one cached read per second. client-go's
    /// usual 15 s / 10 s / 2 s would leave EgressIPs unassigned for up to ~19 s after the
    /// assigner's node dies. Going lower gains little: the assigner also waits for the Node
    /// to be seen as not ready, and a 1 s margin between the renew deadline and the lease
    /// duration is what keeps a slow API server from giving two leaders.
    pub const DEFAULT: Timings = Timings {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
    };

    /// The rules client-go enforces, plus whole seconds for the lease duration.
    pub fn validate(&self) -> Result<(), String> {
        let Timings {
            lease_duration,
            renew_deadline,
            retry_period,
        } = *self;
        if lease_duration < Duration::from_secs(1) || lease_duration.subsec_nanos() != 0 {
            return Err(format!(
                "lease duration {lease_duration:?} must be a whole number of seconds, at least 1"
            ));
        }
        if renew_deadline >= lease_duration {
            return Err(format!(
                "renew deadline {renew_deadline:?} must be less than the lease duration \
                 {lease_duration:?}"
            ));
        }
        if retry_period.is_zero() || retry_period.mul_f64(JITTER) >= renew_deadline {
            return Err(format!(
                "retry period {retry_period:?} must be positive and, with {}% jitter, less \
                 than the renew deadline {renew_deadline:?}",
                ((JITTER - 1.0) * 100.0).round()
            ));
        }
        Ok(())
    }
}

/// Followers wait up to this factor of the retry period between reads, so that thousands of
/// agents started together do not read in step (client-go's `JitterFactor`).
pub const JITTER: f64 = 1.2;
