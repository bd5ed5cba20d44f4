//! appease's policy: pure functions and state machines. No I/O and no clock of its own
//! (time is an input), so the daemon, the tests and the simulator run the same code.

pub mod batch;
pub mod elevation;
pub mod floor;
pub mod group_mode;
pub mod ladder;
pub mod lift;
pub mod load;
pub mod roles;
pub mod spread;
pub mod tree;

pub use elevation::{
    AppChange, Budget, Decision, DenseIndex, ElevationParams, ElevationPolicy, Reason, Sink,
    SlotIndex, Source,
};
pub use ladder::{Ladder, LadderError, Step};
pub use lift::{GroupLift, LiftBudget, LiftChange};
pub use load::{Load, LoadTracker};

/// Nanoseconds on the monotonic clock (the BPF events' clock).
pub type Nanos = u64;

pub const NICE_MIN: i32 = -20;
pub const NICE_MAX: i32 = 19;

/// The kernel's nice → weight table (sched_prio_to_weight), nice -20 first.
pub const NICE_WEIGHT: [u64; 40] = [
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904,
    3906, 3121, 2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87,
    70, 56, 45, 36, 29, 23, 18, 15,
];

/// The weight the kernel gives a task (or an autogroup) at `nice` (1024 at nice 0).
pub fn nice_weight(nice: i32) -> u64 {
    NICE_WEIGHT[(nice.clamp(NICE_MIN, NICE_MAX) - NICE_MIN) as usize]
}

/// The nice value an elevation of `levels` gives a thread whose own nice is `original`.
pub fn elevated_nice(original: i32, levels: u32) -> i32 {
    (original - levels.min(40) as i32).clamp(NICE_MIN, NICE_MAX)
}

/// The nice value a long request sunk `levels` below its thread's own nice gets.
pub fn sunk_nice(original: i32, levels: u32) -> i32 {
    (original + levels.min(40) as i32).clamp(NICE_MIN, NICE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elevation_is_relative_and_clamped() {
        assert_eq!(elevated_nice(0, 5), -5);
        assert_eq!(elevated_nice(5, 3), 2);
        assert_eq!(elevated_nice(-18, 5), -20);
        assert_eq!(elevated_nice(0, 0), 0);
        assert_eq!(sunk_nice(0, 10), 10);
        assert_eq!(sunk_nice(15, 10), 19);
    }
}
