//! The Staircase-versus-O(1) study's scalability formula for closed-loop client sweeps:
//! a fixed amount of work is run with A clients and with B clients, and
//!
//! ```text
//! Scalability B-to-A = (runtime with B / runtime with A) / (B / A)
//! ```
//!
//! Lower is better: 1 means the runtime grew as fast as the number of clients, 1/(B/A)
//! that it did not grow at all. The study took as its base A the client count where the
//! completion time stops falling and turns upward (16 threads for both Apache and MySQL).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Scalability of every client count against one base.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scalability {
    /// The client count A every other count is compared with.
    pub base: u32,
    /// Per client count B, (T_B / T_A) / (B / A); the base's own value is 1.
    pub values: BTreeMap<u32, f64>,
}

/// Response times of a run as the study reports them beside its completion time: the
/// fastest, the 95th percentile and the slowest, and how far the last two lie above the
/// fastest (the spread a slow client hides).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub min_ms: f64,
    pub p95_ms: f64,
    pub max_ms: f64,
    pub max_minus_min_ms: f64,
    pub p95_minus_min_ms: f64,
}

impl Spread {
    /// The column names of `figures`, for CSV headers.
    pub const NAMES: [&'static str; 5] = [
        "min_ms",
        "p95_ms",
        "max_ms",
        "max_minus_min_ms",
        "p95_minus_min_ms",
    ];

    pub fn new(min_ms: f64, p95_ms: f64, max_ms: f64) -> Spread {
        Spread {
            min_ms,
            p95_ms,
            max_ms,
            max_minus_min_ms: max_ms - min_ms,
            p95_minus_min_ms: p95_ms - min_ms,
        }
    }

    /// Each figure's median over runs (a spread's median is the median of the runs'
    /// spreads, not the spread of the medians), with `median` of a list of values.
    pub fn median_of(runs: &[Spread], median: impl Fn(Vec<f64>) -> f64) -> Spread {
        let figures: Vec<[f64; 5]> = runs.iter().map(Spread::figures).collect();
        let [min_ms, p95_ms, max_ms, max_minus_min_ms, p95_minus_min_ms] =
            std::array::from_fn(|i| median(figures.iter().map(|f| f[i]).collect()));
        Spread {
            min_ms,
            p95_ms,
            max_ms,
            max_minus_min_ms,
            p95_minus_min_ms,
        }
    }

    /// Headings above `columns`.
    pub fn headings() -> String {
        ["min ms", "p95 ms", "max ms", "max−min", "p95−min"]
            .map(|h| format!(" {h:>9}"))
            .concat()
    }

    /// The figures as table columns, each a space and 9 wide.
    pub fn columns(&self) -> String {
        self.figures().map(|v| format!(" {v:>9.2}")).concat()
    }

    /// The figures in the order of `NAMES`.
    pub fn figures(&self) -> [f64; 5] {
        [
            self.min_ms,
            self.p95_ms,
            self.max_ms,
            self.max_minus_min_ms,
            self.p95_minus_min_ms,
        ]
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ScalabilityError {
    #[error("no completion times to compare")]
    Empty,
    #[error("the scale base {0} is not among the client counts measured ({1})")]
    UnknownBase(u32, String),
    #[error("client count {0} has a completion time of {1} s, which cannot be compared")]
    BadTime(u32, f64),
    #[error("a client count of 0 cannot be compared")]
    ZeroClients,
}

/// B-to-A for one pair: `(runtime_b / runtime_a) / (b / a)`.
pub fn ratio(a: u32, runtime_a: f64, b: u32, runtime_b: f64) -> f64 {
    (runtime_b / runtime_a) / (b as f64 / a as f64)
}

/// The client count with the lowest completion time (the first of equals): the
/// default base, where the curve has stopped falling.
pub fn lowest(times: &[(u32, f64)]) -> Option<u32> {
    times
        .iter()
        .filter(|(_, t)| t.is_finite() && *t > 0.0)
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map(|&(c, _)| c)
}

/// Every measured client count's scalability against `base` (None: the count with the
/// lowest completion time). `times` holds (clients, completion time in seconds).
pub fn scalability(
    times: &[(u32, f64)],
    base: Option<u32>,
) -> Result<Scalability, ScalabilityError> {
    if times.is_empty() {
        return Err(ScalabilityError::Empty);
    }
    for &(c, t) in times {
        if c == 0 {
            return Err(ScalabilityError::ZeroClients);
        }
        if !(t.is_finite() && t > 0.0) {
            return Err(ScalabilityError::BadTime(c, t));
        }
    }
    let base = match base {
        Some(b) => b,
        None => lowest(times).ok_or(ScalabilityError::Empty)?,
    };
    let Some(&(_, t_base)) = times.iter().find(|(c, _)| *c == base) else {
        let counts: Vec<String> = times.iter().map(|(c, _)| c.to_string()).collect();
        return Err(ScalabilityError::UnknownBase(base, counts.join(", ")));
    };
    let values = times
        .iter()
        .map(|&(c, t)| (c, ratio(base, t_base, c, t)))
        .collect();
    Ok(Scalability { base, values })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spreads_median_is_the_median_of_the_runs_spreads() {
        let runs = [
            Spread::new(1.0, 2.0, 10.0),
            Spread::new(2.0, 3.0, 4.0),
            Spread::new(3.0, 4.0, 30.0),
        ];
        let middle = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let m = Spread::median_of(&runs, middle);
        assert_eq!((m.min_ms, m.p95_ms, m.max_ms), (2.0, 3.0, 10.0));
        // Spreads per run 9, 2, 27: their median, not max − min of the medians (8).
        assert_eq!(m.max_minus_min_ms, 9.0);
        assert_eq!(m.p95_minus_min_ms, 1.0);
        assert_eq!(Spread::NAMES.len(), m.figures().len());
        let width = |s: String| s.chars().count();
        assert_eq!(width(Spread::headings()), width(m.columns()));
    }

    #[test]
    fn a_hand_computed_case() {
        // 16 clients take 10 s, 128 take 40 s: (40 / 10) / (128 / 16) = 4 / 8 = 0.5.
        assert!((ratio(16, 10.0, 128, 40.0) - 0.5).abs() < 1e-12);
        // The study's shape: falling to 16, rising after; the base defaults to 16.
        let times = [(4, 12.0), (16, 10.0), (64, 20.0), (256, 60.0)];
        let s = scalability(&times, None).unwrap();
        assert_eq!(s.base, 16);
        assert!((s.values[&16] - 1.0).abs() < 1e-12);
        // (12 / 10) / (4 / 16) = 1.2 × 4 = 4.8
        assert!((s.values[&4] - 4.8).abs() < 1e-12);
        // (20 / 10) / (64 / 16) = 2 / 4 = 0.5
        assert!((s.values[&64] - 0.5).abs() < 1e-12);
        // (60 / 10) / (256 / 16) = 6 / 16 = 0.375
        assert!((s.values[&256] - 0.375).abs() < 1e-12);
    }

    #[test]
    fn a_base_the_user_picks_and_its_errors() {
        let times = [(2, 8.0), (4, 4.0), (8, 4.0)];
        let s = scalability(&times, Some(2)).unwrap();
        assert_eq!(s.base, 2);
        assert!((s.values[&8] - 0.125).abs() < 1e-12);
        // Equal lowest times: the first (fewest clients) is the base.
        assert_eq!(lowest(&times), Some(4));
        assert_eq!(
            scalability(&times, Some(16)),
            Err(ScalabilityError::UnknownBase(16, "2, 4, 8".into()))
        );
        assert_eq!(scalability(&[], None), Err(ScalabilityError::Empty));
        assert_eq!(
            scalability(&[(2, 0.0)], None),
            Err(ScalabilityError::BadTime(2, 0.0))
        );
        assert_eq!(
            scalability(&[(0, 1.0)], None),
            Err(ScalabilityError::ZeroClients)
        );
    }
}
