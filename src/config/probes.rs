//! The EgressIP node probes' settings (`--egress-ip-probe-*`), read by
//! `controller::egress_ip::probe` and the fence.

use std::time::Duration;

/// Default time between two rounds.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);
/// Default consecutive missed rounds before a node is dead.
pub const DEFAULT_MISSES: u32 = 3;
/// Consecutive answered rounds before a dead node is alive again.
pub const RISES: u32 = 3;

/// How the probes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub interval: Duration,
    /// Consecutive missed rounds before a node is dead; 0 turns the probes off.
    pub misses: u32,
    /// Consecutive answered rounds before a dead node is alive again.
    pub rises: u32,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            interval: DEFAULT_INTERVAL,
            misses: DEFAULT_MISSES,
            rises: RISES,
        }
    }
}

impl Settings {
    pub fn enabled(&self) -> bool {
        self.misses > 0 && !self.interval.is_zero()
    }
}
