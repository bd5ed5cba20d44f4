//! Load as the ladder sees it, from raw kernel readings fed in by the caller:
//! runnable tasks per CPU (smoothed over about a second) and the share of the
//! last second during which some task waited for a CPU (PSI `some`, from the
//! cumulative `total=` counter, so it reacts faster than PSI's own avg10).

use crate::Nanos;

/// Smoothing time constant of the runnable count.
const RUNNABLE_TAU_NS: f64 = 1e9;
/// Window over which the PSI share is computed.
const PSI_WINDOW_NS: u64 = 1_000_000_000;

#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Load {
    /// Runnable tasks per CPU, smoothed.
    pub runnable_per_cpu: f64,
    /// Percent of wall time some task was waiting for a CPU, over about the last second.
    pub psi_some_pct: f64,
}

impl Load {
    /// The load the ladder is indexed by: runnable tasks per CPU, but zero when almost
    /// no task waits for a CPU (many runnable tasks on many CPUs is not contention).
    pub fn ladder_index(&self, min_psi_pct: f64) -> f64 {
        if self.psi_some_pct < min_psi_pct {
            0.0
        } else {
            self.runnable_per_cpu
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadTracker {
    cpus: f64,
    runnable_ema: Option<f64>,
    /// The next sample replaces the smoothed count if it is lower (`rebase_down`).
    rebase_down: bool,
    last_sample: Nanos,
    /// (time, cumulative PSI some µs), oldest first, spanning about PSI_WINDOW_NS.
    psi_history: std::collections::VecDeque<(Nanos, u64)>,
    current: Load,
}

impl LoadTracker {
    pub fn new(cpus: usize) -> Self {
        LoadTracker {
            cpus: cpus.max(1) as f64,
            runnable_ema: None,
            rebase_down: false,
            last_sample: 0,
            psi_history: Default::default(),
            current: Load::default(),
        }
    }

    /// Feeds one reading: `runnable` tasks (not counting the reader), the PSI
    /// `some total=` counter in µs if the kernel has PSI.
    pub fn sample(&mut self, now: Nanos, runnable: u32, psi_some_total_us: Option<u64>) -> Load {
        let per_cpu = runnable as f64 / self.cpus;
        let rebase_down = std::mem::take(&mut self.rebase_down);
        let ema = match self.runnable_ema {
            None => per_cpu,
            Some(prev) if rebase_down && per_cpu < prev => per_cpu,
            Some(prev) => {
                let dt = now.saturating_sub(self.last_sample) as f64;
                let a = 1.0 - (-dt / RUNNABLE_TAU_NS).exp();
                prev + a * (per_cpu - prev)
            }
        };
        self.runnable_ema = Some(ema);
        self.last_sample = now;
        self.current.runnable_per_cpu = ema;

        match psi_some_total_us {
            Some(total) => {
                self.psi_history.push_back((now, total));
                while self.psi_history.len() > 2
                    && now.saturating_sub(self.psi_history[1].0) >= PSI_WINDOW_NS
                {
                    self.psi_history.pop_front();
                }
                let (t0, v0) = self.psi_history[0];
                let dt = now.saturating_sub(t0);
                if dt > 0 {
                    let waited_ns = total.saturating_sub(v0) as f64 * 1e3;
                    self.current.psi_some_pct = (100.0 * waited_ns / dt as f64).min(100.0);
                }
            }
            // Without PSI, contention is assumed whenever tasks outnumber CPUs.
            None => self.current.psi_some_pct = if per_cpu > 1.0 { 100.0 } else { 0.0 },
        }
        self.current
    }

    pub fn current(&self) -> Load {
        self.current
    }

    /// The next sample is taken as it is, unsmoothed, if it is lower: the runnable count
    /// fell by something the caller did (a demotion moved the batch out of it), not by
    /// the noise the smoothing is for. A higher reading (a demotion that moved nothing,
    /// or into a group that is not idle) is smoothed as always.
    pub fn rebase_down(&mut self) {
        self.rebase_down = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn runnable_is_smoothed_over_about_a_second() {
        let mut t = LoadTracker::new(2);
        assert_eq!(t.sample(0, 0, None).runnable_per_cpu, 0.0);
        // A step from 0 to 8 runnable (4 per CPU): after one time constant ~63 %.
        let mut l = Load::default();
        for i in 1..=50 {
            l = t.sample(i * 20 * MS, 8, None);
        }
        assert!(
            (l.runnable_per_cpu - 4.0 * (1.0 - (-1.0f64).exp())).abs() < 0.05,
            "{l:?}"
        );
        for i in 51..=250 {
            l = t.sample(i * 20 * MS, 8, None);
        }
        assert!((l.runnable_per_cpu - 4.0).abs() < 0.05);
    }

    #[test]
    fn a_rebase_takes_the_next_sample_as_it_is_only_if_lower() {
        let mut t = LoadTracker::new(2);
        for i in 0..=200 {
            t.sample(i * 20 * MS, 8, None);
        }
        t.rebase_down();
        assert_eq!(t.sample(201 * 20 * MS, 1, None).runnable_per_cpu, 0.5);
        // Smoothed again from there.
        let l = t.sample(202 * 20 * MS, 8, None).runnable_per_cpu;
        assert!(l > 0.5 && l < 1.0, "{l}");
        // A rebase with a higher reading (nothing moved to the idle class): smoothed.
        t.rebase_down();
        let m = t.sample(203 * 20 * MS, 8, None).runnable_per_cpu;
        assert!(m > l && m < 1.5, "{m}");
    }

    #[test]
    fn psi_share_over_the_last_second() {
        let mut t = LoadTracker::new(2);
        let mut total = 1_000_000u64;
        let mut l = t.sample(0, 0, Some(total));
        assert_eq!(l.psi_some_pct, 0.0);
        // Someone waits half of every 20 ms tick.
        for i in 1..=100 {
            total += 10_000;
            l = t.sample(i * 20 * MS, 3, Some(total));
        }
        assert!((l.psi_some_pct - 50.0).abs() < 1.0, "{l:?}");
        // Then nobody waits: within about a second the share is back near zero.
        for i in 101..=160 {
            l = t.sample(i * 20 * MS, 3, Some(total));
        }
        assert!(l.psi_some_pct < 2.0, "{l:?}");
    }

    #[test]
    fn no_contention_means_no_ladder_load() {
        let l = Load {
            runnable_per_cpu: 3.0,
            psi_some_pct: 0.2,
        };
        assert_eq!(l.ladder_index(1.0), 0.0);
        assert_eq!(l.ladder_index(0.1), 3.0);
    }
}
