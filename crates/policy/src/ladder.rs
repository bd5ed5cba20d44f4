//! The load ladder: how far a thread that receives a request is elevated, and how fast
//! the elevation fades, as a function of load (the 2010 customer-appeasement paper's Table 1, re-expressed in
//! runnable tasks per CPU instead of a one-CPU minute load average).

use std::time::Duration;

use crate::{NICE_MAX, NICE_MIN};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// This step applies when the load is at least this many runnable tasks per CPU.
    pub from_runnable_per_cpu: f64,
    /// Nice given to a thread with nice 0 that receives a request on a UNIX socket.
    pub unix_nice: i32,
    /// Same for network (INET/INET6) sockets.
    pub inet_nice: i32,
    /// The elevation fades by one nice level per this delay.
    pub decay: Duration,
}

impl Step {
    /// Elevation in nice levels for a request from this kind of socket.
    pub fn levels(&self, local: bool) -> u32 {
        let nice = if local {
            self.unix_nice
        } else {
            self.inet_nice
        };
        nice.unsigned_abs()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ladder {
    steps: Vec<Step>,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LadderError {
    #[error("the ladder has no steps")]
    Empty,
    #[error("step {index}: the first step must start at from_runnable_per_cpu = 0 (got {from})")]
    FirstNotZero { index: usize, from: f64 },
    #[error("step {index}: from_runnable_per_cpu = {from} must be greater than the previous step's {prev} (thresholds must increase)")]
    NotIncreasing { index: usize, from: f64, prev: f64 },
    #[error("step {index}: {field} = {value} is outside {NICE_MIN}..={NICE_MAX}")]
    NiceOutOfRange {
        index: usize,
        field: &'static str,
        value: i32,
    },
    #[error(
        "step {index}: {field} = {value} would lower the priority; an elevation is a nice <= 0"
    )]
    NotAnElevation {
        index: usize,
        field: &'static str,
        value: i32,
    },
    #[error("step {index}: {field} = {value} elevates less than the previous step's {prev}; higher load must not weaken elevation")]
    Weakening {
        index: usize,
        field: &'static str,
        value: i32,
        prev: i32,
    },
    #[error("step {index}: decay_ms must be > 0 when the step elevates")]
    ZeroDecay { index: usize },
}

impl Ladder {
    pub fn new(steps: Vec<Step>) -> Result<Self, LadderError> {
        let first = steps.first().ok_or(LadderError::Empty)?;
        if first.from_runnable_per_cpu != 0.0 {
            return Err(LadderError::FirstNotZero {
                index: 0,
                from: first.from_runnable_per_cpu,
            });
        }
        for (index, s) in steps.iter().enumerate() {
            for (field, value) in [("unix_nice", s.unix_nice), ("inet_nice", s.inet_nice)] {
                if !(NICE_MIN..=NICE_MAX).contains(&value) {
                    return Err(LadderError::NiceOutOfRange {
                        index,
                        field,
                        value,
                    });
                }
                if value > 0 {
                    return Err(LadderError::NotAnElevation {
                        index,
                        field,
                        value,
                    });
                }
            }
            if (s.unix_nice < 0 || s.inet_nice < 0) && s.decay.is_zero() {
                return Err(LadderError::ZeroDecay { index });
            }
            if index > 0 {
                let p = &steps[index - 1];
                // NaN is not greater either.
                if s.from_runnable_per_cpu
                    .partial_cmp(&p.from_runnable_per_cpu)
                    != Some(std::cmp::Ordering::Greater)
                {
                    return Err(LadderError::NotIncreasing {
                        index,
                        from: s.from_runnable_per_cpu,
                        prev: p.from_runnable_per_cpu,
                    });
                }
                for (field, value, prev) in [
                    ("unix_nice", s.unix_nice, p.unix_nice),
                    ("inet_nice", s.inet_nice, p.inet_nice),
                ] {
                    if value > prev {
                        return Err(LadderError::Weakening {
                            index,
                            field,
                            value,
                            prev,
                        });
                    }
                }
            }
        }
        Ok(Ladder { steps })
    }

    /// The step for a load in runnable tasks per CPU.
    pub fn step_for(&self, runnable_per_cpu: f64) -> &Step {
        &self.steps[self.step_index_for(runnable_per_cpu)]
    }

    /// Which step (0-based) applies at this load: the last one it has reached.
    pub fn step_index_for(&self, runnable_per_cpu: f64) -> usize {
        self.steps
            .iter()
            .rposition(|s| runnable_per_cpu >= s.from_runnable_per_cpu)
            .unwrap_or(0)
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The paper's Table 1 (RBPE script 0.5), its avenrun thresholds (fixed point, 2048 =
    /// 1.0 on the paper's single CPU) turned into runnable tasks per CPU.
    pub fn rbpe_table1() -> Self {
        let row = |avenrun: f64, unix, inet, ms| Step {
            from_runnable_per_cpu: avenrun / 2048.0,
            unix_nice: unix,
            inet_nice: inet,
            decay: Duration::from_millis(ms),
        };
        Ladder::new(vec![
            row(0.0, 0, 0, 0),
            row(1600.0, -1, 0, 200),
            row(3000.0, -2, -1, 300),
            row(5000.0, -4, -2, 400),
            row(8000.0, -6, -3, 500),
            row(12000.0, -7, -4, 600),
            row(16000.0, -15, -5, 600),
        ])
        .expect("Table 1 is a valid ladder")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(from: f64, unix: i32, inet: i32, ms: u64) -> Step {
        Step {
            from_runnable_per_cpu: from,
            unix_nice: unix,
            inet_nice: inet,
            decay: Duration::from_millis(ms),
        }
    }

    #[test]
    fn picks_highest_step_reached() {
        let l = Ladder::new(vec![
            step(0.0, 0, 0, 0),
            step(1.0, -2, -1, 100),
            step(2.0, -6, -3, 200),
        ])
        .unwrap();
        assert_eq!(l.step_for(0.5).unix_nice, 0);
        assert_eq!(l.step_for(1.0).unix_nice, -2);
        assert_eq!(l.step_for(1.9).inet_nice, -1);
        assert_eq!(l.step_for(50.0).unix_nice, -6);
        assert_eq!(l.step_for(f64::NAN).unix_nice, 0);
        assert_eq!(l.step_for(2.0).levels(true), 6);
        assert_eq!(l.step_for(2.0).levels(false), 3);
    }

    #[test]
    fn rejects_impossible_ladders() {
        assert_eq!(Ladder::new(vec![]), Err(LadderError::Empty));
        assert!(matches!(
            Ladder::new(vec![step(0.5, 0, 0, 0)]),
            Err(LadderError::FirstNotZero { .. })
        ));
        assert!(matches!(
            Ladder::new(vec![
                step(0.0, 0, 0, 0),
                step(2.0, -2, -1, 100),
                step(1.0, -4, -2, 100)
            ]),
            Err(LadderError::NotIncreasing { index: 2, .. })
        ));
        assert!(matches!(
            Ladder::new(vec![step(0.0, 0, 0, 0), step(1.0, -25, -1, 100)]),
            Err(LadderError::NiceOutOfRange {
                field: "unix_nice",
                value: -25,
                ..
            })
        ));
        assert!(matches!(
            Ladder::new(vec![step(0.0, 3, 0, 100)]),
            Err(LadderError::NotAnElevation { .. })
        ));
        assert!(matches!(
            Ladder::new(vec![
                step(0.0, 0, 0, 0),
                step(1.0, -4, -2, 100),
                step(2.0, -2, -2, 100)
            ]),
            Err(LadderError::Weakening { index: 2, .. })
        ));
        assert!(matches!(
            Ladder::new(vec![step(0.0, -1, 0, 0)]),
            Err(LadderError::ZeroDecay { index: 0 })
        ));
    }

    #[test]
    fn table1_matches_the_paper() {
        let l = Ladder::rbpe_table1();
        // avenrun 4000 (1.95 on one CPU) is in the "<= 5000" row: -2 / -1 / 300 ms.
        let s = l.step_for(4000.0 / 2048.0);
        assert_eq!(
            (s.unix_nice, s.inet_nice, s.decay),
            (-2, -1, Duration::from_millis(300))
        );
        // Above 16000: -15 / -5.
        assert_eq!(l.step_for(9.0).unix_nice, -15);
        assert_eq!(l.step_for(0.5).unix_nice, 0);
    }
}
