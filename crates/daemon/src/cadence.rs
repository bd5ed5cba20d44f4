//! Periods of the daemon's own periodic work, spread so that they never keep step
//! with the load.
//!
//! A scan and the status upkeep cost the event loop and the scanner about a
//! millisecond each second. At a fixed 1 s period that millisecond lands at the same
//! phase of any load whose period divides a second (40 requests a second, 25 or 50
//! frames a second, a 1 Hz health check): the same request of every second waits
//! behind it, and over a run those waits are 2.5 % of the requests, enough to move the
//! 99th percentile. Drawing each period from 0.8–1.2 times the nominal one, along a
//! low-discrepancy (golden-ratio) sequence, moves the phase evenly over every
//! such grid while keeping the mean period, deterministically.

/// 2^64 / φ, rounded to odd: each step moves the phase by the golden ratio's fraction.
const GOLDEN_STEP: u64 = 0x9E37_79B9_7F4A_7C15;

/// Draws successive periods around a nominal one.
#[derive(Debug, Default)]
pub struct Cadence {
    phase: u64,
}

impl Cadence {
    /// The next period: `nominal_ns` times a factor in [0.8, 1.2), 1 on average.
    pub fn next(&mut self, nominal_ns: u64) -> u64 {
        self.phase = self.phase.wrapping_add(GOLDEN_STEP);
        // The phase's top 16 bits as a fraction of one.
        let frac = (self.phase >> 48) as u128;
        let low = nominal_ns as u128 * 4 / 5;
        let span = nominal_ns as u128 * 2 / 5;
        (low + span * frac / (1 << 16)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn every_period_lies_within_a_fifth_of_the_nominal_one_and_the_mean_keeps_it() {
        let mut c = Cadence::default();
        let periods: Vec<u64> = (0..1000).map(|_| c.next(SECOND)).collect();
        assert!(periods
            .iter()
            .all(|&p| (800_000_000..1_200_000_000).contains(&p)));
        let mean = periods.iter().sum::<u64>() as f64 / periods.len() as f64;
        assert!((mean / SECOND as f64 - 1.0).abs() < 0.005, "mean {mean}");
    }

    #[test]
    fn the_work_lands_on_every_phase_of_a_25_ms_load_not_on_one() {
        // 40 requests a second: with a fixed 1 s period every scan would fall in the
        // same millisecond of the 25 ms cycle.
        let mut c = Cadence::default();
        let mut at = 0u64;
        let mut bins = [0u32; 25];
        for _ in 0..250 {
            at += c.next(SECOND);
            bins[((at % 25_000_000) / 1_000_000) as usize] += 1;
        }
        // 10 a bin if even; none empty, none holding more than twice its share.
        assert!(bins.iter().all(|&n| (1..=20).contains(&n)), "{bins:?}");
    }

    #[test]
    fn two_cadences_draw_the_same_periods() {
        let (mut a, mut b) = (Cadence::default(), Cadence::default());
        for _ in 0..10 {
            assert_eq!(a.next(SECOND), b.next(SECOND));
        }
    }
}
