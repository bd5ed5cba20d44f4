//! What the batch group should be right now.
//!
//! Idle (`cpu.idle = 1`) is what protects latency work from batch. But the kernel balances
//! an idle group's tasks between CPUs in herds: their hierarchical load rounds to about
//! zero, so one balancing pass moves nearly all of them at once (the CFS group-scheduling slides' herd
//! migration, measured here too), and batch jobs share the CPUs unfairly among
//! themselves. While no request has arrived for a while there is nothing to protect: the
//! group then runs as a normal weighted group, which the balancer treats fairly. The first
//! request makes it idle again. The starvation floor lifts the idle flag as well.

use std::time::Duration;

use crate::floor::{FloorDecision, FloorParams, StarvationFloor};
use crate::Nanos;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupMode {
    /// `cpu.idle = 1`: batch runs only on CPU time nothing else wants.
    Idle,
    /// No request for a while: a normal group with the quiet weight.
    Quiet,
    /// Starved while idle: a small weight until it has caught up.
    Floor,
}

pub struct GroupModeKeeper {
    /// None: always idle (besides the floor).
    quiet_after: Option<Nanos>,
    last_request: Nanos,
    pub floor: StarvationFloor,
}

impl GroupModeKeeper {
    /// `now` counts as the last request, so a fresh daemon starts idle (safe) and turns
    /// quiet only after a full quiet stretch.
    pub fn new(quiet_after: Option<Duration>, floor: FloorParams, now: Nanos) -> Self {
        GroupModeKeeper {
            quiet_after: quiet_after.map(|d| d.as_nanos() as Nanos),
            last_request: now,
            floor: StarvationFloor::new(floor),
        }
    }

    pub fn set_params(&mut self, quiet_after: Option<Duration>, floor: FloorParams) {
        self.quiet_after = quiet_after.map(|d| d.as_nanos() as Nanos);
        self.floor.set_params(floor);
    }

    pub fn on_request(&mut self, at: Nanos) {
        self.last_request = self.last_request.max(at);
    }

    fn quiet(&self, now: Nanos) -> bool {
        self.quiet_after
            .is_some_and(|after| now.saturating_sub(self.last_request) >= after)
    }

    /// One sample of the group's CPU share for the floor. A quiet group is not idle and
    /// cannot starve, so quiet stretches do not count towards the floor.
    pub fn on_floor_sample(
        &mut self,
        now: Nanos,
        share_pct: f64,
        waiting: bool,
    ) -> Option<FloorDecision> {
        let waiting = waiting && !self.quiet(now);
        self.floor.on_sample(now, share_pct, waiting)
    }

    pub fn mode(&self, now: Nanos) -> GroupMode {
        if self.quiet(now) {
            GroupMode::Quiet
        } else if self.floor.lifted() {
            GroupMode::Floor
        } else {
            GroupMode::Idle
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn keeper(quiet_after: Option<u64>) -> GroupModeKeeper {
        GroupModeKeeper::new(
            quiet_after.map(Duration::from_secs),
            FloorParams {
                floor_pct: 5.0,
                after: Duration::from_secs(2),
                hold: Duration::from_secs(3),
            },
            0,
        )
    }

    #[test]
    fn idle_while_requests_arrive_quiet_after_a_quiet_stretch_idle_again_at_once() {
        let mut k = keeper(Some(10));
        assert_eq!(k.mode(9 * S), GroupMode::Idle, "starts idle");
        assert_eq!(k.mode(10 * S), GroupMode::Quiet);
        k.on_request(11 * S);
        assert_eq!(k.mode(11 * S), GroupMode::Idle, "the first request");
        // An older event arriving late does not move the clock back.
        k.on_request(5 * S);
        assert_eq!(k.mode(20 * S), GroupMode::Idle);
        assert_eq!(k.mode(21 * S), GroupMode::Quiet);
    }

    #[test]
    fn without_quiet_after_the_group_stays_idle() {
        let k = keeper(None);
        assert_eq!(k.mode(1000 * S), GroupMode::Idle);
    }

    #[test]
    fn the_floor_lifts_an_idle_group_but_quiet_stretches_do_not_count_as_starved() {
        let mut k = keeper(Some(10));
        for t in 0..3 {
            k.on_request(t * S);
            k.on_floor_sample(t * S, 0.0, true);
        }
        assert_eq!(
            k.mode(2 * S),
            GroupMode::Floor,
            "starved for 2 s while serving"
        );
        // Quiet wins over the floor: nothing to protect, so the normal weight.
        assert_eq!(k.mode(13 * S), GroupMode::Quiet);

        let mut k = keeper(Some(10));
        for t in 10..20 {
            assert_eq!(k.on_floor_sample(t * S, 0.0, true), None, "quiet at {t}");
        }
    }
}
