//! The starvation floor (the CFS group-scheduling slides' pain point: batch must not starve forever). When the
//! idle group had runnable work but got less than a floor share of the CPUs for a
//! stretch, its idle flag is lifted and it runs with a small weight for a while, so it
//! catches up; then it is idle again.

use std::time::Duration;

use crate::Nanos;

#[derive(Clone, Debug, PartialEq)]
pub struct FloorParams {
    /// Share of all CPUs, in percent, below which runnable batch work counts as starved.
    pub floor_pct: f64,
    /// How long it must be starved before the floor engages.
    pub after: Duration,
    /// How long the floor holds once engaged.
    pub hold: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorDecision {
    /// Lift cpu.idle and give the group its floor weight.
    Lift,
    /// Back to cpu.idle = 1.
    Lower,
}

pub struct StarvationFloor {
    params: FloorParams,
    starved_since: Option<Nanos>,
    lifted_until: Option<Nanos>,
    pub lifts: u64,
}

impl StarvationFloor {
    pub fn new(params: FloorParams) -> Self {
        StarvationFloor {
            params,
            starved_since: None,
            lifted_until: None,
            lifts: 0,
        }
    }

    pub fn set_params(&mut self, params: FloorParams) {
        self.params = params;
    }

    pub fn lifted(&self) -> bool {
        self.lifted_until.is_some()
    }

    /// One observation: the group's share of all CPUs (percent) since the last one, and
    /// whether its tasks waited for a CPU in that time.
    pub fn on_sample(
        &mut self,
        now: Nanos,
        share_pct: f64,
        waiting: bool,
    ) -> Option<FloorDecision> {
        if let Some(until) = self.lifted_until {
            if now >= until {
                self.lifted_until = None;
                return Some(FloorDecision::Lower);
            }
            return None;
        }
        if !(waiting && share_pct < self.params.floor_pct) {
            self.starved_since = None;
            return None;
        }
        let since = *self.starved_since.get_or_insert(now);
        if now.saturating_sub(since) >= self.params.after.as_nanos() as u64 {
            self.starved_since = None;
            self.lifted_until = Some(now + self.params.hold.as_nanos() as u64);
            self.lifts += 1;
            return Some(FloorDecision::Lift);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn floor() -> StarvationFloor {
        StarvationFloor::new(FloorParams {
            floor_pct: 5.0,
            after: Duration::from_secs(10),
            hold: Duration::from_secs(3),
        })
    }

    #[test]
    fn engages_after_a_starved_stretch_holds_then_lowers() {
        let mut f = floor();
        for t in 0..10 {
            assert_eq!(f.on_sample(t * S, 0.5, true), None, "at {t}");
        }
        assert_eq!(f.on_sample(10 * S, 0.5, true), Some(FloorDecision::Lift));
        assert!(f.lifted());
        assert_eq!(f.on_sample(12 * S, 40.0, true), None);
        assert_eq!(f.on_sample(13 * S, 40.0, true), Some(FloorDecision::Lower));
        assert_eq!(f.lifts, 1);
        // Starved again: a full stretch before the next lift.
        assert_eq!(f.on_sample(14 * S, 0.0, true), None);
        assert_eq!(f.on_sample(23 * S, 0.0, true), None);
        assert_eq!(f.on_sample(24 * S, 0.0, true), Some(FloorDecision::Lift));
    }

    #[test]
    fn not_starved_when_it_gets_its_share_or_has_nothing_to_run() {
        let mut f = floor();
        for t in 0..30 {
            // Alternately: enough CPU, or nothing waiting.
            let d = if t % 2 == 0 {
                f.on_sample(t * S, 20.0, true)
            } else {
                f.on_sample(t * S, 0.0, false)
            };
            assert_eq!(d, None);
        }
        // A stretch interrupted by one good sample starts over.
        let mut f = floor();
        for t in 0..9 {
            f.on_sample(t * S, 0.0, true);
        }
        f.on_sample(9 * S, 10.0, true);
        assert_eq!(f.on_sample(10 * S, 0.0, true), None);
        assert_eq!(f.on_sample(19 * S, 0.0, true), None);
        assert_eq!(f.on_sample(20 * S, 0.0, true), Some(FloorDecision::Lift));
    }
}
