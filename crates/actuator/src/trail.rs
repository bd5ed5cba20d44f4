//! The audit trail: one structured log line (target `appease::audit`, message `audit`)
//! for every change appease makes to another program's scheduling or undoes: which
//! change, to whom, from what to what, and why (the signal or the rule).
//!
//! A storm would flood the journal (a busy server's threads are elevated and faded
//! thousands of times a second; a build's hundreds of processes are demoted at once),
//! so each kind of change has a budget: a burst, then a steady rate. What is held back
//! is counted and said once a second by `report_held`. The lines go through the
//! process's log writer, which never blocks the caller (a lossy background writer, set
//! up by the binary): the read -> elevation path stays fast.

use std::time::Instant;

/// Lines of one kind written at once before the steady rate applies.
pub const BURST: f64 = 50.0;
/// Lines of one kind per second after the burst.
pub const PER_SECOND: f64 = 10.0;

/// A kind of change, each with its own budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A thread's nice raised for a request (or lowered as the elevation fades).
    Elevate,
    /// A thread given a role's fixed nice.
    Role,
    /// A thread set below its own nice: a long request.
    Sink,
    /// A thread's nice and slice put back.
    Restore,
    /// A process moved into the idle group.
    Demote,
    /// A process moved into its service's group.
    Place,
    /// A process moved back to the cgroup it came from.
    MoveBack,
    /// A thread put in SCHED_IDLE where it is (its cgroup must not be left).
    Idle,
    /// A thread taken out of SCHED_IDLE.
    Unidle,
    /// A systemd unit given CPUWeight=idle, or its weight back.
    Unit,
    /// Another program's cgroup made idle, or its flag and weight put back.
    Group,
    /// The idle group's mode (idle, quiet, starvation floor).
    BatchMode,
    /// A busy thread of the idle group kept on one CPU (`spread`).
    Pin,
    /// A pinned thread's CPUs put back.
    Unpin,
    /// A serving process's session autogroup given a nice, or its nice back.
    Autogroup,
}

impl Change {
    const ALL: [Change; 15] = [
        Change::Elevate,
        Change::Role,
        Change::Sink,
        Change::Restore,
        Change::Demote,
        Change::Place,
        Change::MoveBack,
        Change::Idle,
        Change::Unidle,
        Change::Unit,
        Change::Group,
        Change::BatchMode,
        Change::Pin,
        Change::Unpin,
        Change::Autogroup,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Change::Elevate => "elevate",
            Change::Role => "role",
            Change::Sink => "sink",
            Change::Restore => "restore",
            Change::Demote => "demote",
            Change::Place => "place",
            Change::MoveBack => "move-back",
            Change::Idle => "idle",
            Change::Unidle => "unidle",
            Change::Unit => "unit",
            Change::Group => "group",
            Change::BatchMode => "batch-mode",
            Change::Pin => "pin",
            Change::Unpin => "unpin",
            Change::Autogroup => "autogroup",
        }
    }

    fn index(self) -> usize {
        Change::ALL
            .iter()
            .position(|&c| c == self)
            .expect("every change is listed")
    }
}

#[derive(Clone, Copy, Debug)]
struct Budget {
    tokens: f64,
    refilled: Option<Instant>,
    held: u64,
}

/// The per-kind budgets (a token bucket each).
#[derive(Debug)]
pub struct Trail {
    budgets: [Budget; Change::ALL.len()],
    burst: f64,
    per_second: f64,
}

impl Default for Trail {
    fn default() -> Self {
        Trail::new(BURST, PER_SECOND)
    }
}

impl Trail {
    pub fn new(burst: f64, per_second: f64) -> Self {
        let full = Budget {
            tokens: burst,
            refilled: None,
            held: 0,
        };
        Trail {
            budgets: [full; Change::ALL.len()],
            burst,
            per_second,
        }
    }

    /// Whether a line for this change may be written now; if not, it is counted.
    pub fn admit(&mut self, change: Change) -> bool {
        self.admit_at(change, Instant::now())
    }

    fn admit_at(&mut self, change: Change, now: Instant) -> bool {
        let (burst, rate) = (self.burst, self.per_second);
        let b = &mut self.budgets[change.index()];
        if let Some(then) = b.refilled {
            let earned = now.saturating_duration_since(then).as_secs_f64() * rate;
            b.tokens = (b.tokens + earned).min(burst);
        }
        b.refilled = Some(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            b.held += 1;
            false
        }
    }

    /// The lines held back since the last call, by kind (and forgets them).
    pub fn take_held(&mut self) -> Vec<(Change, u64)> {
        Change::ALL
            .iter()
            .zip(self.budgets.iter_mut())
            .filter(|(_, b)| b.held > 0)
            .map(|(&c, b)| (c, std::mem::take(&mut b.held)))
            .collect()
    }

    /// Says how many lines of each kind were held back since the last call.
    pub fn report_held(&mut self) {
        for (change, held) in self.take_held() {
            tracing::info!(
                target: "appease::audit",
                change = change.as_str(),
                held,
                burst = self.burst,
                per_second = self.per_second,
                "audit lines held back: more changes of this kind than the trail writes"
            );
        }
    }
}

/// One audit line, if the change's budget allows; `$trail` is a `Trail`.
macro_rules! audit {
    ($trail:expr, $change:expr, $($fields:tt)*) => {
        if $trail.admit($change) {
            tracing::info!(target: "appease::audit", change = $change.as_str(), $($fields)*, "audit");
        }
    };
}
pub(crate) use audit;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_storm_is_cut_to_the_burst_then_the_rate_and_what_is_held_is_counted() {
        let mut t = Trail::new(5.0, 2.0);
        let t0 = Instant::now();
        let written = (0..100).filter(|_| t.admit_at(Change::Elevate, t0)).count();
        assert_eq!(written, 5, "the burst, all at once");
        // Another kind has its own budget.
        assert!(t.admit_at(Change::Demote, t0));
        // One second later: two more (the rate), not more.
        let t1 = t0 + Duration::from_secs(1);
        let later = (0..10).filter(|_| t.admit_at(Change::Elevate, t1)).count();
        assert_eq!(later, 2);
        assert_eq!(t.take_held(), vec![(Change::Elevate, 95 + 8)]);
        assert!(t.take_held().is_empty(), "counted once");
        // A long quiet spell refills the burst, not beyond.
        let t2 = t1 + Duration::from_secs(3600);
        let refilled = (0..100).filter(|_| t.admit_at(Change::Elevate, t2)).count();
        assert_eq!(refilled, 5);
    }

    #[test]
    fn every_change_has_its_own_name_and_budget() {
        let mut names: Vec<_> = Change::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Change::ALL.len());
        for (i, c) in Change::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }
}
