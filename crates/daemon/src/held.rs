//! Threads the probe knows as held: elevated for a request, their further requests need
//! not wake the daemon.

use std::collections::HashMap;

use appease_policy::{Decision, Reason};

/// Whether a thread is held elevated once `d` is applied, and at what levels: elevated for
/// a request (reported, or read at a tick), its further requests need not wake the daemon
/// until it has faded below half of that; restored, sunk, or faded further, they must.
pub(crate) fn held_after(d: &Decision, held: &HashMap<u32, u32>) -> Option<u32> {
    match d {
        Decision::Elevate {
            levels,
            reason: Reason::UnixRequest | Reason::NetworkRequest,
            ..
        } => Some(*levels),
        Decision::Elevate { tid, levels, .. } => {
            held.get(tid).copied().filter(|full| levels * 2 >= *full)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elevate(levels: u32, reason: Reason) -> Decision {
        Decision::Elevate {
            pid: 7,
            tid: 7,
            levels,
            slice: None,
            reason,
        }
    }

    #[test]
    fn a_thread_is_held_from_its_requests_elevation_until_it_fades_below_half_of_it() {
        let mut held = HashMap::new();
        assert_eq!(held_after(&elevate(8, Reason::UnixRequest), &held), Some(8));
        held.insert(7, 8);
        assert_eq!(held_after(&elevate(4, Reason::Decay), &held), Some(8));
        assert_eq!(held_after(&elevate(3, Reason::Decay), &held), None);
        let restore = Decision::Restore {
            pid: 7,
            tid: 7,
            reason: Reason::Faded,
        };
        assert_eq!(held_after(&restore, &held), None);
        // A lift or decay of a thread no request elevated holds nothing.
        assert_eq!(
            held_after(&elevate(8, Reason::Decay), &HashMap::new()),
            None
        );
    }
}
