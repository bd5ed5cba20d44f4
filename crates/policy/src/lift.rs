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

/// Applications whose lock waits a bucket refused to lift, oldest first, to be lifted once
/// it has refilled: the probe reports only an application's first waiter, so a refused wait
/// would otherwise silence every later one until the last ended. Used by the idle group's
/// lift and by the elevation policy's per-application lifts.
#[derive(Clone, Debug, Default)]
pub(crate) struct RefusedWaits(Vec<u32>);

impl RefusedWaits {
    /// Remembers a refused wait of `app` (once).
    pub(crate) fn remember(&mut self, app: u32) {
        if !self.0.contains(&app) {
            self.0.push(app);
        }
    }

    /// Forgets `app`'s wait: it ended, was lifted, or its application went.
    pub(crate) fn forget(&mut self, app: u32) {
        self.0.retain(|&a| a != app);
    }

    /// Keeps only the waits `keep` says still count.
    pub(crate) fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.0.retain(|&a| keep(a));
    }

    pub(crate) fn oldest(&self) -> Option<u32> {
        self.0.first().copied()
    }

    /// Every remembered wait, oldest first, forgotten here.
    pub(crate) fn take(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.0)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// The idle group's lift, for one application's lock waits at a time. A wait the bucket
/// cannot lift when it starts is remembered and lifted once the bucket can: the probe
/// reports only an application's first waiter, so a refused wait would otherwise silence
/// every later one until the last ended, and an idle-class holder may not run for seconds.
#[derive(Clone, Debug)]
pub struct GroupLift {
    budget: LiftBudget,
    lifted_for: Option<u32>,
    refused: RefusedWaits,
}

/// What a tick changed about a `GroupLift`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiftChange {
    /// A refused wait is lifted now.
    Started(u32),
    /// The lift for this application ran out: its waiters are to be forgotten (one may
    /// have died waiting).
    Spent(u32),
}

impl GroupLift {
    pub fn full(per_second_ns: u64, now: Nanos) -> Self {
        GroupLift {
            budget: LiftBudget::full(per_second_ns, now),
            lifted_for: None,
            refused: RefusedWaits::default(),
        }
    }

    /// The application the group is lifted for now.
    pub fn lifted_for(&self) -> Option<u32> {
        self.lifted_for
    }

    /// Lifted, or a refused wait waits for the bucket: ticks are to time either.
    pub fn needs_ticks(&self) -> bool {
        self.lifted_for.is_some() || !self.refused.is_empty()
    }

    /// A serving thread of `app` began to wait: true if the group is lifted for it now.
    pub fn on_wait(&mut self, now: Nanos, app: u32, per_second_ns: u64) -> bool {
        if self.budget.start(now, per_second_ns).is_none() {
            self.refused.remember(app);
            return false;
        }
        self.lifted_for = Some(app);
        self.refused.forget(app);
        true
    }

    /// The last wait of `app` ended: true if that ended a lift.
    pub fn on_wait_end(&mut self, now: Nanos, app: u32) -> bool {
        self.refused.forget(app);
        if self.lifted_for != Some(app) {
            return false;
        }
        self.lifted_for = None;
        self.budget.end(now)
    }

    /// Ends a lift whose time ran out, or lifts the oldest refused wait once the bucket
    /// allows; `still_waiting` says whether a refused wait's application still counts.
    pub fn on_tick(
        &mut self,
        now: Nanos,
        per_second_ns: u64,
        still_waiting: impl Fn(u32) -> bool,
    ) -> Option<LiftChange> {
        if let Some(app) = self.lifted_for {
            if self.budget.until().is_some_and(|until| now < until) {
                return None;
            }
            self.lifted_for = None;
            self.budget.end(now);
            return Some(LiftChange::Spent(app));
        }
        self.refused.retain(still_waiting);
        let app = self.refused.oldest()?;
        self.on_wait(now, app, per_second_ns)
            .then_some(LiftChange::Started(app))
    }

    /// Drops the lift and any refused wait (lifting was turned off); true if a lift ended.
    pub fn clear(&mut self, now: Nanos) -> bool {
        self.refused.clear();
        self.lifted_for.take().is_some() && self.budget.end(now)
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

    #[test]
    fn a_wait_the_bucket_refused_is_lifted_once_it_has_refilled() {
        let mut g = GroupLift::full(200 * MS, 0);
        assert!(g.on_wait(0, 7, 200 * MS));
        assert_eq!(g.lifted_for(), Some(7));
        // The holder never lets go: the lift runs out, its waiters are forgotten.
        assert_eq!(g.on_tick(100 * MS, 200 * MS, |_| true), None);
        assert_eq!(
            g.on_tick(200 * MS, 200 * MS, |_| true),
            Some(LiftChange::Spent(7))
        );
        // The next wait finds the bucket empty: refused, but remembered.
        assert!(!g.on_wait(201 * MS, 7, 200 * MS));
        assert!(g.needs_ticks(), "a refused wait is retried on ticks");
        assert_eq!(
            g.on_tick(202 * MS, 200 * MS, |_| true),
            None,
            "0.4 ms refilled"
        );
        assert_eq!(
            g.on_tick(206 * MS, 200 * MS, |_| true),
            Some(LiftChange::Started(7)),
            "a millisecond refilled: lifted"
        );
        assert!(g.on_wait_end(207 * MS, 7));
        assert!(!g.needs_ticks());
    }

    #[test]
    fn refused_waits_are_lifted_oldest_first_unless_they_ended_or_their_application_went() {
        let mut g = GroupLift::full(2 * MS, 0);
        assert!(g.on_wait(0, 1, 2 * MS));
        assert!(!g.on_wait(0, 2, 2 * MS), "one lift at a time");
        assert!(!g.on_wait(0, 3, 2 * MS));
        assert!(g.on_wait_end(MS, 1));
        // 2 ends its wait before the bucket allows: 3 is lifted next.
        assert!(!g.on_wait_end(MS, 2));
        assert_eq!(
            g.on_tick(10 * MS, 2 * MS, |_| true),
            Some(LiftChange::Started(3))
        );
        assert!(g.on_wait_end(11 * MS, 3));
        assert!(!g.needs_ticks());
        // 4 is refused, then its application has no demoted tree any more.
        let mut g = GroupLift::full(2 * MS, 0);
        assert!(g.on_wait(0, 5, 2 * MS));
        assert!(!g.on_wait(0, 4, 2 * MS));
        assert_eq!(
            g.on_tick(2 * MS, 2 * MS, |_| true),
            Some(LiftChange::Spent(5))
        );
        assert_eq!(g.on_tick(900 * MS, 2 * MS, |app| app != 4), None);
        assert!(!g.needs_ticks());
    }
}
