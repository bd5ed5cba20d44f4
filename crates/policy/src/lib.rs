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
pub use lift::LiftBudget;
pub use load::{Load, LoadTracker};

/// Nanoseconds on the monotonic clock (the BPF events' clock).
pub type Nanos = u64;

pub const NICE_MIN: i32 = -20;
pub const NICE_MAX: i32 = 19;

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
