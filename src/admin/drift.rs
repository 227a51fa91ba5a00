//! Drift of the kernel's table as `/readyz` and the metrics see it: detected by the nftables
//! monitor (someone else changed `table inet nodeplane`), repaired by the next successful sync
//! of the run loop that started after the loop took the detection in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::nft::monitor::Drift;

/// How many unrepaired detections are kept apart; later ones join the last.
const KEPT: usize = 64;

#[derive(Debug, Default)]
pub(super) struct DriftStatus {
    /// Sequence number of the last detection (1, 2, ...).
    detected: u64,
    /// Detections not yet repaired: (sequence number, when seen, what changed).
    unrepaired: VecDeque<(u64, Instant, String)>,
    repairs: u64,
}

impl DriftStatus {
    /// Records a detection; returns its sequence number.
    pub(super) fn detected(&mut self, drift: &Drift) -> u64 {
        self.detected += 1;
        let seq = self.detected;
        let full = self.unrepaired.len() >= KEPT;
        match self.unrepaired.back_mut() {
            Some(last) if full => last.0 = seq,
            _ => self
                .unrepaired
                .push_back((seq, drift.at, drift.to_string())),
        }
        seq
    }

    /// A sync that started after the run loop took in detections up to `upto` succeeded:
    /// those are repaired. Returns the time since the earliest of them was seen, or None if
    /// none was pending.
    pub(super) fn repaired(&mut self, upto: u64, now: Instant) -> Option<Duration> {
        let mut earliest: Option<Instant> = None;
        while let Some((seq, at, _)) = self.unrepaired.front() {
            if *seq > upto {
                break;
            }
            earliest = Some(earliest.map_or(*at, |e| e.min(*at)));
            self.unrepaired.pop_front();
        }
        let took = now.saturating_duration_since(earliest?);
        self.repairs += 1;
        Some(took)
    }

    /// Err while a detected drift is not repaired.
    pub(super) fn check(&self, now: Instant) -> Result<(), String> {
        let Some((_, at, what)) = self.unrepaired.front() else {
            return Ok(());
        };
        let more = self.unrepaired.len() - 1;
        let more = if more > 0 {
            format!(" (and {more} later changes)")
        } else {
            String::new()
        };
        Err(format!(
            "table nodeplane changed by someone else {} ms ago, not yet repaired: {what}{more}",
            now.saturating_duration_since(*at).as_millis()
        ))
    }

    pub(super) fn repairs(&self) -> u64 {
        self.repairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::monitor::Changes;

    fn deleted_table(at: Instant) -> Drift {
        Drift {
            at,
            changes: Changes {
                table_deleted: true,
                ..Changes::default()
            },
            by: ["nft (pid 7)".to_string()].into(),
            events_lost: false,
            unseen: false,
        }
    }

    #[test]
    fn a_repair_clears_only_what_the_loop_had_taken_in() {
        let t0 = Instant::now();
        let mut s = DriftStatus::default();
        assert_eq!(s.check(t0), Ok(()));
        assert_eq!(s.detected(&deleted_table(t0)), 1);
        assert_eq!(s.detected(&deleted_table(t0 + Duration::from_millis(3))), 2);
        assert_eq!(
            s.check(t0 + Duration::from_millis(10)),
            Err(
                "table nodeplane changed by someone else 10 ms ago, not yet repaired: \
                 table deleted (by nft (pid 7)) (and 1 later changes)"
                    .into()
            )
        );
        // The loop had taken in only the first when its sync started.
        let took = s.repaired(1, t0 + Duration::from_millis(12));
        assert_eq!(took, Some(Duration::from_millis(12)));
        assert!(s.check(t0 + Duration::from_millis(12)).is_err());
        assert_eq!(
            s.repaired(2, t0 + Duration::from_millis(20)),
            Some(Duration::from_millis(17))
        );
        assert_eq!(s.check(t0 + Duration::from_millis(20)), Ok(()));
        assert_eq!(s.repairs(), 2);
        // A later successful sync with nothing pending is no repair.
        assert_eq!(s.repaired(2, t0 + Duration::from_millis(30)), None);
        assert_eq!(s.repairs(), 2);
    }

    #[test]
    fn a_flood_of_detections_is_bounded() {
        let t0 = Instant::now();
        let mut s = DriftStatus::default();
        for _ in 0..1000 {
            s.detected(&deleted_table(t0));
        }
        assert_eq!(s.unrepaired.len(), KEPT);
        assert_eq!(s.unrepaired.back().map(|u| u.0), Some(1000));
        assert_eq!(s.repaired(1000, t0), Some(Duration::ZERO));
        assert!(s.check(t0).is_ok());
    }
}
