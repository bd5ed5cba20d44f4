//! What the elevation policy is given (its parameters) and what it answers (decisions,
//! reasons, the state it shows).

use std::time::Duration;

use crate::Ladder;

/// Where a request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A UNIX socket: a local customer.
    Unix,
    /// An INET/INET6 socket: a network customer.
    Network,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Share of one CPU that elevation can buy over time.
    pub cpu_share: f64,
    /// Size of the bucket: CPU time a thread may burn in one burst while elevated.
    pub burst: Duration,
}

/// When a thread that keeps computing after its request sinks, and how far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sink {
    /// CPU time used since the last request read beyond which the thread sinks.
    pub after_cpu: Duration,
    /// Nice levels below its own nice.
    pub levels: u32,
    /// Lifting while the application's serving threads wait on a lock: at most this long
    /// at a stretch and, over time, this long a second (None: never lifted).
    pub lift: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ElevationParams {
    pub ladder: Ladder,
    /// Below this PSI `some` percentage the machine counts as uncontended.
    pub min_psi_pct: f64,
    pub budget: Budget,
    /// EEVDF slice for elevated threads (earlier virtual deadline, so earlier wakeup
    /// preemption); None leaves the slice alone.
    pub slice: Option<Duration>,
    /// State of a thread with no request for this long is dropped.
    pub forget_after: Duration,
    /// Long requests sink (None: they keep their priority).
    pub sink: Option<Sink>,
    /// What all the threads of one unprivileged user may use elevated, together, however
    /// many processes they make (None: no bound beyond each application's).
    pub user_budget: Option<Budget>,
    /// How many threads of one unprivileged user, and of all of them, are watched at once
    /// (each costs the daemon a CPU reading every 100 ms while watched); the others' requests
    /// are not acted on until some are forgotten. 0: no bound.
    pub user_threads_max: u32,
    pub users_threads_max: u32,
}

/// Why a decision was made (shown in logs and `appease status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    UnixRequest,
    NetworkRequest,
    Decay,
    Faded,
    BudgetExhausted,
    Forgotten,
    /// Its user's threads used all the elevated CPU their user may have.
    UserBudgetExhausted,
    /// Computed longer than `sink.after_cpu` since its last request.
    LongRequest,
    /// A sunk thread received a request.
    Surfaced,
    /// A thread of its application that serves a request waits on a lock.
    Lifted,
    /// The waits on a lock that lifted it ended.
    WaitOver,
    /// Its application's lifting time for this second is spent.
    LiftSpent,
}

impl Reason {
    /// Every reason, in declaration order (`reason as usize` indexes it).
    pub const ALL: [Reason; 12] = [
        Reason::UnixRequest,
        Reason::NetworkRequest,
        Reason::Decay,
        Reason::Faded,
        Reason::BudgetExhausted,
        Reason::Forgotten,
        Reason::UserBudgetExhausted,
        Reason::LongRequest,
        Reason::Surfaced,
        Reason::Lifted,
        Reason::WaitOver,
        Reason::LiftSpent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::UnixRequest => "unix-request",
            Reason::NetworkRequest => "network-request",
            Reason::Decay => "decay",
            Reason::Faded => "faded",
            Reason::BudgetExhausted => "budget-exhausted",
            Reason::Forgotten => "forgotten",
            Reason::UserBudgetExhausted => "user-budget-exhausted",
            Reason::LongRequest => "long-request",
            Reason::Surfaced => "surfaced",
            Reason::Lifted => "lifted",
            Reason::WaitOver => "wait-over",
            Reason::LiftSpent => "lift-spent",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Set the thread `levels` nice levels above its original nice.
    Elevate {
        pid: u32,
        tid: u32,
        levels: u32,
        slice: Option<Duration>,
        reason: Reason,
    },
    /// Put the thread back to its original nice and slice.
    Restore { pid: u32, tid: u32, reason: Reason },
    /// Set the thread `levels` nice levels below its original nice (the daemon chooses
    /// its slice: its original one, or a long one where nice acts on nothing).
    Sink {
        pid: u32,
        tid: u32,
        levels: u32,
        reason: Reason,
    },
}

/// What the probe must be told about an application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppChange {
    /// It has sunk threads now (true), or none any more: its serving threads' lock waits
    /// matter, or no longer.
    Sunk(u32, bool),
    /// Its lift ended without the end of the waits being seen: the waiters counted so far
    /// are to be forgotten (one may have died waiting).
    ResetWaits(u32),
}

/// What the policy knows about one thread, for status output.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ThreadView {
    pub pid: u32,
    pub tid: u32,
    pub levels: u32,
    pub budget_ms: f64,
    pub exhausted: bool,
    pub sunk: bool,
    /// Sunk, and lifted back to its own nice while a waiter of its application waits.
    pub lifted: bool,
}
