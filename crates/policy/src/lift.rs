//! How long lifting may last: a token bucket of time, refilled at `per_second` a second
//! up to `per_second`, charged for the time each lift lasts. A lift runs out when the
//! bucket does, so a program that waits on purpose cannot keep itself lifted: at most
//! `per_second` at a stretch and, over time, `per_second` a second. Used for an
//! application's sunk threads (the elevation policy) and for the idle group (the daemon).

use crate::Nanos;

/// A lift shorter than this is not worth the two changes it takes.
const MIN_LIFT_NS: f64 = 1e6;

#[derive(Clone, Debug)]
pub struct LiftBudget {
    left_ns: f64,
    /// When `left_ns` was last brought up to date.
    at: Nanos,
    /// While lifted: when the time left runs out.
    until: Option<Nanos>,
}

impl LiftBudget {
    /// A full bucket at `now`.
    pub fn full(per_second_ns: u64, now: Nanos) -> Self {
        LiftBudget {
            left_ns: per_second_ns as f64,
            at: now,
            until: None,
        }
    }

    /// Starts a lift at `now` if none is under way and a millisecond or more is left;
    /// returns when it runs out.
    pub fn start(&mut self, now: Nanos, per_second_ns: u64) -> Option<Nanos> {
        if self.until.is_some() {
            return None;
        }
        let refill = now.saturating_sub(self.at) as f64 * per_second_ns as f64 / 1e9;
        self.left_ns = (self.left_ns + refill).min(per_second_ns as f64);
        self.at = now;
        if self.left_ns < MIN_LIFT_NS {
            return None;
        }
        let until = now + self.left_ns as u64;
        self.until = Some(until);
        Some(until)
    }

    /// When the lift under way runs out (None: not lifted).
    pub fn until(&self) -> Option<Nanos> {
        self.until
    }

    /// Ends the lift under way at `now`, charged for the time it lasted; false if none was.
    pub fn end(&mut self, now: Nanos) -> bool {
        let Some(until) = self.until.take() else {
            return false;
        };
        self.left_ns = self.left_ns.min(until.saturating_sub(now) as f64);
        self.at = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_lift_is_charged_for_its_time_and_the_bucket_refills_at_its_rate() {
        let mut b = LiftBudget::full(200 * MS, 0);
        assert_eq!(
            b.start(0, 200 * MS),
            Some(200 * MS),
            "a full bucket: 200 ms"
        );
        assert_eq!(b.start(10 * MS, 200 * MS), None, "one lift at a time");
        assert!(b.end(50 * MS));
        assert!(!b.end(60 * MS), "once");
        // 150 ms left, plus 0.2 ms a millisecond since.
        assert_eq!(b.start(100 * MS, 200 * MS), Some(100 * MS + 160 * MS));
        // Ran out: nothing left, and under a millisecond is not worth a lift.
        b.end(260 * MS);
        assert_eq!(b.start(262 * MS, 200 * MS), None);
        assert_eq!(b.start(270 * MS, 200 * MS), Some(270 * MS + 2 * MS));
        assert_eq!(b.until(), Some(272 * MS));
    }
}
