//! When a watched thread is next due at a tick, and how its fade goes: restarted by a
//! request, stepped down by decay.

use super::{Decision, Reason, Thread, CPU_REFRESH_NS};
use crate::Nanos;

/// A request at `at` restarts an elevated thread's fade at the pace of the load's ladder
/// step (`target` levels, `pace` ns a level); a stronger elevation from a higher load is
/// kept. True when it raised the thread.
pub(super) fn restart_fade(
    t: &mut Thread,
    at: Nanos,
    target: u32,
    pace: u64,
    exhausted: bool,
    below_first_step: bool,
) -> bool {
    if !exhausted && target > 0 {
        t.decay_ns = pace;
        t.next_decay_at = at + pace;
        if target > t.levels {
            t.levels = target;
            return true;
        }
    } else if below_first_step && t.levels > 0 && pace < t.decay_ns {
        // The load fell below the ladder's first step since it was elevated (the batch
        // went idle): the fade goes at the pace of the load now, not of the load then,
        // so nothing is held up over a batch that no longer competes.
        t.decay_ns = pace;
        t.next_decay_at = t.next_decay_at.min(at + pace);
    }
    false
}

/// Whether a tick reads the thread's CPU time: an elevated or watched one's when the last
/// reading is older than CPU_REFRESH_NS, and an elevated one's when it is due to fade
/// (the reading says whether a request came since, unreported).
pub(super) fn wants_cpu(t: &Thread, now: Nanos, sinking: bool) -> bool {
    (t.levels > 0 || watched_for_sinking(t, sinking))
        && (now.saturating_sub(t.budget_at) >= CPU_REFRESH_NS
            || (t.levels > 0 && now >= t.next_decay_at))
}

/// Fades an elevated thread by the levels its decay steps since `next_decay_at` take.
pub(super) fn fade(t: &mut Thread, now: Nanos, slice: Option<std::time::Duration>) -> Decision {
    let (pid, tid) = (t.pid, t.tid);
    let steps = 1 + (now - t.next_decay_at) / t.decay_ns.max(1);
    t.levels = t.levels.saturating_sub(steps.min(u32::MAX as u64) as u32);
    t.next_decay_at += steps * t.decay_ns;
    if t.levels == 0 {
        Decision::Restore {
            pid,
            tid,
            reason: Reason::Faded,
        }
    } else {
        Decision::Elevate {
            pid,
            tid,
            levels: t.levels,
            slice,
            reason: Reason::Decay,
        }
    }
}

/// The earliest time a tick has something to do for `t`: decay, a CPU-time re-read (for
/// its budget, or, with `watch`, to see whether its request runs long), a restore for an
/// exhausted budget, or forgetting an idle thread. A sunk thread waits for its request.
/// Whether a thread that is not elevated is still read for a long request (to sink it).
/// An unprivileged user's is not: it runs at the user's own priority then, and sinking
/// it would spare the host nothing the idle class does not; reading the CPU of every
/// thread a user's flood of requests brings in took the real-time loop's time, in
/// bursts a server waited behind.
fn watched_for_sinking(t: &Thread, sinking: bool) -> bool {
    sinking && !t.sunk && t.user.is_none()
}

pub(super) fn due_time(t: &Thread, exhausted: bool, forget_ns: u64, watch: bool) -> Nanos {
    if t.sunk {
        Nanos::MAX
    } else if t.levels == 0
        && watched_for_sinking(t, watch)
        && t.last_request.saturating_add(forget_ns) > t.budget_at
    {
        t.budget_at.saturating_add(CPU_REFRESH_NS)
    } else if t.levels == 0 {
        t.last_request.saturating_add(forget_ns)
    } else if exhausted {
        0
    } else {
        t.next_decay_at
            .min(t.budget_at.saturating_add(CPU_REFRESH_NS))
    }
}
