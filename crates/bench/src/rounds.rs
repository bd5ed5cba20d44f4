//! Rounds that interleave the modes: slow drifts of a shared machine hit every mode alike,
//! and each round starts one mode later, so no mode always runs in the same place (a
//! compile's late requests were about 10 % more frequent in the second of two places
//! whichever mode ran there, over ten alternated invocations).

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::Mode;

/// What a server-beside-batch scenario measures of every mode in a round, and the medians
/// of it over the rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub p99_ms: f64,
    /// The median response time, ms.
    pub p50_ms: f64,
    /// CPUs the batch's processes and their reaped children used over the measurement (the
    /// server's side of what the batch reads is not in it).
    pub batch_cpus: f64,
}

/// A scenario's cases, each measured over interleaved rounds of its modes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cases<C> {
    pub scenario: String,
    pub cases: Vec<C>,
}

/// A case's table: what was measured, then a line a mode.
pub trait CaseTable {
    fn table(&self) -> String;
}

impl<C: CaseTable> Cases<C> {
    pub fn table(&self) -> String {
        self.cases.iter().map(C::table).collect()
    }
}

impl Measured {
    /// Headings above `latency_columns`.
    pub const LATENCY_HEADINGS: &'static str = "    p99 ms    p50 ms";

    /// The server's p99 and p50 as table columns.
    pub fn latency_columns(&self) -> String {
        format!(" {:>9.3} {:>9.3}", self.p99_ms, self.p50_ms)
    }

    /// Each figure's median over `rounds`.
    pub fn median<'a>(rounds: impl Iterator<Item = &'a Measured> + Clone) -> Measured {
        let pick =
            |f: fn(&Measured) -> f64| crate::report::median_of(rounds.clone().map(f).collect());
        Measured {
            p99_ms: pick(|m| m.p99_ms),
            p50_ms: pick(|m| m.p50_ms),
            batch_cpus: pick(|m| m.batch_cpus),
        }
    }
}

/// Where one run of a mode falls among the rounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub mode: Mode,
    /// 0-based.
    pub round: usize,
    pub rounds: usize,
    /// 0-based place within the round.
    pub place: usize,
    pub modes: usize,
}

impl Slot {
    /// "round 2/5, 1/4", for progress lines.
    pub fn progress(&self) -> String {
        format!(
            "round {}/{}, {}/{}",
            self.round + 1,
            self.rounds,
            self.place + 1,
            self.modes
        )
    }
}

/// Runs every mode once a round for `rounds` rounds, each round's order turned by one
/// place; stops early once `stop` is set (Ctrl-C). Returns each mode's results in the
/// order of `modes` (shorter lists when the rounds were cut short).
pub(crate) fn interleaved<R>(
    modes: &[Mode],
    rounds: usize,
    stop: &AtomicBool,
    mut run: impl FnMut(Slot) -> Result<R>,
) -> Result<Vec<Vec<R>>> {
    let mut runs: Vec<Vec<R>> = modes.iter().map(|_| Vec::new()).collect();
    let mut steal = Steal::default();
    for round in 0..rounds {
        for (place, i) in rotated(modes.len(), round).enumerate() {
            if stop.load(Ordering::Relaxed) {
                steal.report();
                return Ok(runs);
            }
            let slot = Slot {
                mode: modes[i],
                round,
                rounds,
                place,
                modes: modes.len(),
            };
            let before = crate::procfs::steal_jiffies();
            runs[i].push(run(slot)?);
            steal.add(before, crate::procfs::steal_jiffies());
        }
    }
    steal.report();
    Ok(runs)
}

/// A share of the CPUs taken by the hypervisor (steal) above which a run is said to be
/// disturbed: a 4 ms wait of the server is then as likely the hypervisor's as the kernel's.
const DISTURBED_STEAL: f64 = 0.02;

/// The CPU time a virtual machine's hypervisor gave to others during the runs: the
/// bench cannot tell those waits from the scheduler's, so it says when they were there.
#[derive(Default)]
struct Steal {
    runs: usize,
    disturbed: usize,
    stolen: u64,
    total: u64,
}

impl Steal {
    fn add(&mut self, (stolen0, total0): (u64, u64), (stolen1, total1): (u64, u64)) {
        let (stolen, total) = (
            stolen1.saturating_sub(stolen0),
            total1.saturating_sub(total0),
        );
        self.runs += 1;
        self.stolen += stolen;
        self.total += total;
        let share = stolen as f64 / total.max(1) as f64;
        if share > DISTURBED_STEAL {
            self.disturbed += 1;
            eprintln!(
                "    the hypervisor took {:.0} % of the CPUs during this run (steal)",
                share * 100.0
            );
        }
    }

    /// One line when any run was disturbed: such rounds are not a quiet machine's.
    fn report(&self) {
        if let Some(line) = self.summary() {
            eprintln!("{line}");
        }
    }

    fn summary(&self) -> Option<String> {
        (self.disturbed > 0).then(|| {
            format!(
                "note: the hypervisor took over {:.0} % of the CPUs (steal in /proc/stat) in {} of \
                 {} runs, {:.1} % over all: these figures hold the waits of a shared host; \
                 compare them with each other, and rerun on a quiet host before quoting them",
                DISTURBED_STEAL * 100.0,
                self.disturbed,
                self.runs,
                self.stolen as f64 / self.total.max(1) as f64 * 100.0
            )
        })
    }
}

/// The order of `n` modes in round `round` (0-based): the list turned by one place
/// per round.
fn rotated(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + round) % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_runs_every_mode_once_and_each_mode_takes_every_place() {
        let rounds: Vec<Vec<usize>> = (0..4).map(|r| rotated(4, r).collect()).collect();
        assert_eq!(rounds[0], [0, 1, 2, 3]);
        assert_eq!(rounds[1], [1, 2, 3, 0]);
        for round in &rounds {
            let mut sorted = round.clone();
            sorted.sort();
            assert_eq!(sorted, [0, 1, 2, 3]);
        }
        for place in 0..4 {
            let mut at: Vec<usize> = rounds.iter().map(|r| r[place]).collect();
            at.sort();
            assert_eq!(at, [0, 1, 2, 3], "place {place}");
        }
    }

    #[test]
    fn a_run_is_disturbed_when_the_hypervisor_took_over_a_fiftieth_of_the_cpus() {
        let mut steal = Steal::default();
        steal.add((0, 0), (10, 1000)); // 1 %: quiet
        assert_eq!(steal.summary(), None);
        steal.add((10, 1000), (60, 2000)); // 5 %
        steal.add((60, 2000), (60, 2000)); // no jiffies at all: quiet, no division by zero
        let line = steal.summary().expect("a disturbed run is reported");
        assert!(line.contains("in 1 of 3 runs, 3.0 % over all"), "{line}");
    }

    #[test]
    fn results_come_back_by_mode_and_a_stop_cuts_the_rounds_short() {
        let modes = [Mode::Unloaded, Mode::Unmanaged, Mode::Appease];
        let stop = AtomicBool::new(false);
        let mut order = Vec::new();
        let runs = interleaved(&modes, 2, &stop, |slot| {
            order.push(slot.mode);
            if order.len() == 4 {
                stop.store(true, Ordering::Relaxed);
            }
            Ok(slot.round)
        })
        .unwrap();
        assert_eq!(
            order,
            [
                Mode::Unloaded,
                Mode::Unmanaged,
                Mode::Appease,
                Mode::Unmanaged
            ]
        );
        assert_eq!(runs, [vec![0], vec![0, 1], vec![0]]);
    }
}
