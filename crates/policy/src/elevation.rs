//! Request-based priority elevation (the 2010 customer-appeasement paper's sections 5-6) with an elevation budget.
//!
//! A thread that receives a request is elevated by the ladder's step for the current
//! load; the elevation fades by one nice level per the step's delay; each new request
//! re-elevates. Elevation is paid for with CPU time: every tracked thread has a token
//! bucket that fills at `budget.cpu_share` of one CPU and drains by the CPU time the
//! thread uses. A thread whose bucket runs dry loses its elevation and gets none until
//! the bucket is full again, so over time elevation buys at most `cpu_share` of a CPU: a
//! thread that reads a byte now and then while spinning cannot stay elevated. The bucket
//! belongs to the thread's application (its process, or the server whose fork made the
//! process), which every thread of it fills while it is watched: a server that forks a
//! worker per connection does not hand each heavy request a fresh burst.
//!
//! A long request sinks: a thread that has used more than `sink.after_cpu` of CPU since
//! its last request read loses any elevation and is set `sink.levels` nice levels below
//! its own, in its own cgroup, so that the threads of its service serving fresh requests
//! go first (the feedback queue of the multi-level scheduling analysis: work that keeps
//! computing long after the request that started it sinks below fresh requests). Its
//! next request read brings it back.
//!
//! No priority inversion: a sunk thread may hold what a fresh request needs. While a
//! thread serving a request of the same application waits on a lock (the probe reports
//! the first such wait and the end of the last), the application's sunk threads are
//! lifted back to their own nice, within a `LiftBudget` of `sink.lift` a second.

use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::{Ladder, LiftBudget, Load, Nanos};

/// An elevated thread's CPU time is re-read when the last reading (from a request
/// event or an earlier read) is older than this.
pub const CPU_REFRESH_NS: u64 = 100_000_000;

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
    pub const ALL: [Reason; 11] = [
        Reason::UnixRequest,
        Reason::NetworkRequest,
        Reason::Decay,
        Reason::Faded,
        Reason::BudgetExhausted,
        Reason::Forgotten,
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
    /// Set the thread `levels` nice levels below its original nice, original slice.
    Sink {
        pid: u32,
        tid: u32,
        levels: u32,
        reason: Reason,
    },
}

#[derive(Clone, Debug)]
struct Thread {
    pid: u32,
    tid: u32,
    /// Its application (whose bucket pays for its elevation).
    app: u32,
    levels: u32,
    decay_ns: u64,
    next_decay_at: Nanos,
    last_request: Nanos,
    /// Its CPU time and the time when it was last charged to the bucket.
    budget_at: Nanos,
    cpu_ns: u64,
    /// Its CPU time at its last request read.
    cpu_at_request: u64,
    /// Set below its own nice: a long request.
    sunk: bool,
    /// Sunk, but back at its own nice for now: a waiter of its application may need it.
    lifted: bool,
}

/// An application's elevation bucket, and its sunk threads' lifting.
#[derive(Clone, Debug)]
struct App {
    id: u32,
    tokens_ns: f64,
    exhausted: bool,
    /// Its watched threads (the entry goes with the last).
    threads: u32,
    /// Of those, sunk.
    sunk: u32,
    /// Its sunk threads' lifting: how long it may last, and until when it does.
    lift: LiftBudget,
}

/// The applications of the watched threads, found as threads are: id → slot through an
/// index `I` (with the simulator's dense one, `cfs-rbpe` on the busy host runs 1,296
/// instructions per event; with a hash map 1,302, before applications 1,288:
/// `make sim-instructions`).
struct Apps<I> {
    list: Vec<App>,
    slots: I,
}

impl<I: SlotIndex> Apps<I> {
    fn get(&self, id: u32) -> Option<&App> {
        self.slots.get(id).map(|s| &self.list[s as usize])
    }

    fn get_mut(&mut self, id: u32) -> Option<&mut App> {
        self.slots.get(id).map(|s| &mut self.list[s as usize])
    }

    fn get_or_insert(&mut self, id: u32, make: impl FnOnce() -> App) -> &mut App {
        let slot = match self.slots.get(id) {
            Some(s) => s as usize,
            None => {
                self.list.push(make());
                self.slots.set(id, self.list.len() as u32 - 1);
                self.list.len() - 1
            }
        };
        &mut self.list[slot]
    }

    /// Drops `id`; the last application moves into its slot.
    fn remove(&mut self, id: u32) {
        let Some(slot) = self.slots.get(id) else {
            return;
        };
        self.list.swap_remove(slot as usize);
        self.slots.unset(id);
        if let Some(moved) = self.list.get(slot as usize) {
            self.slots.set(moved.id, slot);
        }
    }
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

/// Where the policy finds a tracked thread's state: TID → slot in its table.
pub trait SlotIndex: Default {
    fn get(&self, tid: u32) -> Option<u32>;
    fn set(&mut self, tid: u32, slot: u32);
    fn unset(&mut self, tid: u32);
}

/// The daemon's index: real TIDs are sparse (up to pid_max, 2²² on large hosts).
impl SlotIndex for FxHashMap<u32, u32> {
    fn get(&self, tid: u32) -> Option<u32> {
        FxHashMap::get(self, &tid).copied()
    }
    fn set(&mut self, tid: u32, slot: u32) {
        self.insert(tid, slot);
    }
    fn unset(&mut self, tid: u32) {
        self.remove(&tid);
    }
}

/// An index for small, dense ids, such as the simulator's task numbers: a table with
/// one entry per id up to the largest seen. One read where the hash map reads its
/// control bytes and then its entry, both cold in a simulation of 10,000 tasks (busy
/// cfs-rbpe: 3 % of the simulator's time). Not for real TIDs: a TID of 4 million
/// would take 16 MB.
#[derive(Clone, Debug, Default)]
pub struct DenseIndex(Vec<u32>);

const NO_SLOT: u32 = u32::MAX;

impl SlotIndex for DenseIndex {
    #[inline]
    fn get(&self, tid: u32) -> Option<u32> {
        self.0.get(tid as usize).copied().filter(|&s| s != NO_SLOT)
    }
    fn set(&mut self, tid: u32, slot: u32) {
        let i = tid as usize;
        if i >= self.0.len() {
            self.0.resize(i + 1, NO_SLOT);
        }
        self.0[i] = slot;
    }
    fn unset(&mut self, tid: u32) {
        if let Some(s) = self.0.get_mut(tid as usize) {
            *s = NO_SLOT;
        }
    }
}

/// The elevation policy's state, its threads found through an index `I` (the daemon
/// hashes TIDs; the simulator, whose task ids are dense, uses a `DenseIndex`).
pub struct ElevationPolicy<I = FxHashMap<u32, u32>> {
    params: ElevationParams,
    /// The tracked threads, densely, in no particular order.
    threads: Vec<Thread>,
    /// Per slot of `threads`: the earliest time a tick has something to do for it.
    /// A tick reads only this array and visits the few threads that are due, where a
    /// walk over every thread's state cost the simulator 77 instructions per event.
    due: Vec<Nanos>,
    /// TID → slot in `threads`.
    slots: I,
    /// The applications of the watched threads.
    apps: Apps<I>,
    /// Applications lifted now.
    lifted: Vec<u32>,
    /// Changes for the probe, taken by `take_app_changes`.
    app_changes: Vec<AppChange>,
    /// `params`' bucket size, forget_after and sink threshold in ns, converted once,
    /// not per request.
    burst_ns: f64,
    forget_ns: u64,
    sink_ns: Option<u64>,
    /// `sink.lift` in ns (None: no lifting, and the probe is told of no application).
    lift_ns: Option<u64>,
}

impl ElevationPolicy {
    pub fn new(params: ElevationParams) -> Self {
        Self::with_index(params)
    }
}

impl<I: SlotIndex> ElevationPolicy<I> {
    pub fn with_index(params: ElevationParams) -> Self {
        ElevationPolicy {
            burst_ns: burst_ns(&params),
            forget_ns: forget_ns(&params),
            sink_ns: sink_ns(&params),
            lift_ns: lift_ns(&params),
            params,
            threads: Vec::new(),
            due: Vec::new(),
            slots: I::default(),
            apps: Apps {
                list: Vec::new(),
                slots: I::default(),
            },
            lifted: Vec::new(),
            app_changes: Vec::new(),
        }
    }

    pub fn params(&self) -> &ElevationParams {
        &self.params
    }

    /// New parameters (config reload); current elevations fade under the new ladder.
    pub fn set_params(&mut self, params: ElevationParams) {
        self.burst_ns = burst_ns(&params);
        self.forget_ns = forget_ns(&params);
        self.sink_ns = sink_ns(&params);
        let lifted_before = self.lift_ns.is_some();
        self.lift_ns = lift_ns(&params);
        let lifts = self.lift_ns.is_some();
        if lifts != lifted_before {
            // The probe is told of the applications with sunk threads only while lifting.
            for a in self.apps.list.iter().filter(|a| a.sunk > 0) {
                self.app_changes.push(AppChange::Sunk(a.id, lifts));
            }
        }
        self.params = params;
        let watch = self.sink_ns.is_some();
        for (due, t) in self.due.iter_mut().zip(&self.threads) {
            let exhausted = self.apps.get(t.app).is_some_and(|a| a.exhausted);
            *due = due_time(t, exhausted, self.forget_ns, watch);
        }
    }

    /// A thread received a request at `now`; `cpu_ns` is its total CPU time then. Its
    /// process is its application.
    pub fn on_request(
        &mut self,
        now: Nanos,
        pid: u32,
        tid: u32,
        source: Source,
        cpu_ns: u64,
        load: Load,
    ) -> Option<Decision> {
        self.on_app_request(now, pid, pid, tid, source, cpu_ns, load)
    }

    /// A thread of application `app` received a request at `now`; `cpu_ns` is its total
    /// CPU time then.
    #[allow(clippy::too_many_arguments)]
    pub fn on_app_request(
        &mut self,
        now: Nanos,
        app: u32,
        pid: u32,
        tid: u32,
        source: Source,
        cpu_ns: u64,
        load: Load,
    ) -> Option<Decision> {
        let slot = match self.slots.get(tid) {
            Some(slot) => slot as usize,
            None => self.track(tid, pid, app, now, cpu_ns),
        };
        let (burst, forget_ns) = (self.burst_ns, self.forget_ns);
        let watch = self.sink_ns.is_some();
        let share = self.params.budget.cpu_share;
        let at = self
            .params
            .ladder
            .step_index_for(load.ladder_index(self.params.min_psi_pct));
        let step = &self.params.ladder.steps()[at];
        let below_first_step = at == 0;
        let target = step.levels(source == Source::Unix);
        let t = &mut self.threads[slot];
        t.pid = pid;
        t.last_request = now;
        let a = self.apps.get_mut(t.app).expect("a watched thread's app");
        account(t, a, now, cpu_ns, share, burst);
        t.cpu_at_request = cpu_ns;
        // A lifted thread is at its own nice already.
        let surfaced = t.sunk && !t.lifted;
        if t.sunk {
            t.sunk = false;
            t.lifted = false;
            a.sunk -= 1;
            if a.sunk == 0 && self.lift_ns.is_some() {
                self.app_changes.push(AppChange::Sunk(t.app, false));
            }
        }
        let mut raised = false;
        let pace = step.decay.as_nanos() as u64;
        if !a.exhausted && target > 0 {
            // Re-elevation: the timer restarts; a stronger elevation from higher load
            // is kept.
            t.decay_ns = pace;
            t.next_decay_at = now + t.decay_ns;
            if target > t.levels {
                t.levels = target;
                raised = true;
            }
        } else if below_first_step && t.levels > 0 && pace < t.decay_ns {
            // The load fell below the ladder's first step since it was elevated (the
            // batch went idle): the fade goes at the pace of the load now, not of the
            // load then, so nothing is held up over a batch that no longer competes.
            t.decay_ns = pace;
            t.next_decay_at = t.next_decay_at.min(now + pace);
        }
        self.due[slot] = due_time(t, a.exhausted, forget_ns, watch);
        if raised {
            Some(Decision::Elevate {
                pid,
                tid,
                levels: target,
                slice: self.params.slice,
                reason: match source {
                    Source::Unix => Reason::UnixRequest,
                    Source::Network => Reason::NetworkRequest,
                },
            })
        } else {
            surfaced.then_some(Decision::Restore {
                pid,
                tid,
                reason: Reason::Surfaced,
            })
        }
    }

    /// Starts watching a thread, not elevated; a new application's bucket is full.
    /// Returns its slot.
    fn track(&mut self, tid: u32, pid: u32, app: u32, now: Nanos, cpu_ns: u64) -> usize {
        let lift = LiftBudget::full(self.lift_ns.unwrap_or(0), now);
        let burst_ns = self.burst_ns;
        let a = self.apps.get_or_insert(app, || App {
            id: app,
            tokens_ns: burst_ns,
            exhausted: false,
            threads: 0,
            sunk: 0,
            lift,
        });
        a.threads += 1;
        self.threads.push(Thread {
            pid,
            tid,
            app,
            levels: 0,
            decay_ns: 0,
            next_decay_at: now,
            last_request: now,
            budget_at: now,
            cpu_ns,
            cpu_at_request: cpu_ns,
            sunk: false,
            lifted: false,
        });
        self.due.push(0);
        let slot = self.threads.len() - 1;
        self.slots.set(tid, slot as u32);
        slot
    }

    /// Periodic step: decay, budget, forgetting. `cpu_of(pid, tid)` gives a thread's
    /// total CPU time, or None when the thread is gone; it is asked only for elevated
    /// threads whose CPU time is not known from the last CPU_REFRESH_NS (request events
    /// carry it), so the caller's reads stay few.
    pub fn on_tick(
        &mut self,
        now: Nanos,
        mut cpu_of: impl FnMut(u32, u32) -> Option<u64>,
    ) -> Vec<Decision> {
        let (burst, forget_ns, sink_ns) = (self.burst_ns, self.forget_ns, self.sink_ns);
        let sink_levels = self.params.sink.map_or(0, |s| s.levels);
        let share = self.params.budget.cpu_share;
        let slice = self.params.slice;
        let mut out = Vec::new();
        self.end_spent_lifts(now, &mut out);
        let mut i = 0;
        // Below this, the slots of a block that holds a due thread: looked at one by one,
        // without reading the block's minimum again at each.
        let mut one_by_one = 0;
        while i < self.threads.len() {
            // Most threads are not due: skip them eight at a time, by their minimum.
            if i >= one_by_one {
                match self.due.get(i..i + 8) {
                    Some(block) if block.iter().fold(Nanos::MAX, |m, &d| m.min(d)) > now => {
                        i += 8;
                        continue;
                    }
                    _ => one_by_one = i + 8,
                }
            }
            if self.due[i] > now {
                i += 1;
                continue;
            }
            let t = &self.threads[i];
            let (tid, pid) = (t.tid, t.pid);
            let watched = t.levels > 0 || (sink_ns.is_some() && !t.sunk);
            let cpu = if watched && now.saturating_sub(t.budget_at) >= CPU_REFRESH_NS {
                let Some(cpu) = cpu_of(pid, tid) else {
                    self.remove_slot(i); // gone: nothing to restore
                    continue;
                };
                Some(cpu)
            } else {
                None
            };
            let t = &mut self.threads[i];
            let a = self.apps.get_mut(t.app).expect("a watched thread's app");
            if let Some(cpu) = cpu {
                account(t, a, now, cpu, share, burst);
            }
            let long = sink_ns.is_some_and(|n| t.cpu_ns.saturating_sub(t.cpu_at_request) >= n);
            if long && !t.sunk {
                t.levels = 0;
                t.sunk = true;
                a.sunk += 1;
                if a.sunk == 1 && self.lift_ns.is_some() {
                    self.app_changes.push(AppChange::Sunk(t.app, true));
                }
                out.push(Decision::Sink {
                    pid,
                    tid,
                    levels: sink_levels,
                    reason: Reason::LongRequest,
                });
            } else if t.levels > 0 && a.exhausted {
                t.levels = 0;
                out.push(Decision::Restore {
                    pid,
                    tid,
                    reason: Reason::BudgetExhausted,
                });
            } else if t.levels > 0 && now >= t.next_decay_at {
                let steps = 1 + (now - t.next_decay_at) / t.decay_ns.max(1);
                t.levels = t.levels.saturating_sub(steps.min(u32::MAX as u64) as u32);
                t.next_decay_at += steps * t.decay_ns;
                out.push(if t.levels == 0 {
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
                });
            }
            // Keep idle threads for a while so the budget remembers a cheater; a sunk
            // one until its next request or its end (it is still changed).
            if t.levels > 0 || t.sunk || now.saturating_sub(t.last_request) < forget_ns {
                self.due[i] = due_time(t, a.exhausted, forget_ns, sink_ns.is_some());
                i += 1;
            } else {
                self.remove_slot(i);
            }
        }
        out
    }

    /// The thread exited or someone else took over its priority: forget it.
    pub fn forget(&mut self, tid: u32) {
        if let Some(slot) = self.slots.get(tid) {
            self.remove_slot(slot as usize);
        }
    }

    /// Drops the thread in `slot`; the last thread moves into the slot.
    fn remove_slot(&mut self, slot: usize) {
        let gone = self.threads.swap_remove(slot);
        self.due.swap_remove(slot);
        self.slots.unset(gone.tid);
        if let Some(a) = self.apps.get_mut(gone.app) {
            a.threads -= 1;
            if gone.sunk {
                a.sunk -= 1;
                if a.sunk == 0 && self.lift_ns.is_some() {
                    self.app_changes.push(AppChange::Sunk(gone.app, false));
                }
            }
            if a.threads == 0 {
                self.apps.remove(gone.app);
                self.lifted.retain(|&l| l != gone.app);
            }
        }
        if let Some(moved) = self.threads.get(slot) {
            self.slots.set(moved.tid, slot as u32);
        }
    }

    fn thread(&self, tid: u32) -> Option<&Thread> {
        self.slots.get(tid).map(|slot| &self.threads[slot as usize])
    }

    /// Threads currently elevated, plus those being watched for their budget.
    pub fn view(&self) -> Vec<ThreadView> {
        let mut v: Vec<_> = self
            .threads
            .iter()
            .map(|t| {
                let a = self.apps.get(t.app);
                ThreadView {
                    pid: t.pid,
                    tid: t.tid,
                    levels: t.levels,
                    budget_ms: a.map_or(0.0, |a| a.tokens_ns / 1e6),
                    exhausted: a.is_some_and(|a| a.exhausted),
                    sunk: t.sunk,
                    lifted: t.lifted,
                }
            })
            .collect();
        v.sort_by_key(|t| (t.pid, t.tid));
        v
    }

    /// True while some thread is elevated (decay needs ticks) or lifted (its lift ends
    /// on time).
    pub fn any_elevated(&self) -> bool {
        !self.lifted.is_empty() || self.threads.iter().any(|t| t.levels > 0)
    }

    /// A thread serving a request of `app` waits on a lock: its sunk threads are lifted
    /// back to their own nice, while its lifting time lasts.
    pub fn on_wait(&mut self, now: Nanos, app: u32) -> Vec<Decision> {
        let Some(per_second) = self.lift_ns else {
            return Vec::new();
        };
        let Some(a) = self.apps.get_mut(app) else {
            return Vec::new();
        };
        if a.sunk == 0 || a.lift.start(now, per_second).is_none() {
            return Vec::new();
        }
        self.lifted.push(app);
        let mut out = Vec::new();
        for t in self.threads.iter_mut().filter(|t| t.app == app && t.sunk) {
            t.lifted = true;
            out.push(Decision::Restore {
                pid: t.pid,
                tid: t.tid,
                reason: Reason::Lifted,
            });
        }
        out
    }

    /// The last wait of `app` on a lock ended: its lifted threads sink again.
    pub fn on_wait_end(&mut self, now: Nanos, app: u32) -> Vec<Decision> {
        let mut out = Vec::new();
        self.end_lift(now, app, Reason::WaitOver, &mut out);
        out
    }

    /// Ends the lifts whose time ran out.
    fn end_spent_lifts(&mut self, now: Nanos, out: &mut Vec<Decision>) {
        let mut i = 0;
        while i < self.lifted.len() {
            let app = self.lifted[i];
            let spent = self
                .apps
                .get(app)
                .and_then(|a| a.lift.until())
                .is_none_or(|until| now >= until);
            if spent {
                self.end_lift(now, app, Reason::LiftSpent, out);
                self.app_changes.push(AppChange::ResetWaits(app));
            } else {
                i += 1;
            }
        }
    }

    fn end_lift(&mut self, now: Nanos, app: u32, reason: Reason, out: &mut Vec<Decision>) {
        self.lifted.retain(|&l| l != app);
        if !self.apps.get_mut(app).is_some_and(|a| a.lift.end(now)) {
            return;
        }
        let levels = self.params.sink.map_or(0, |s| s.levels);
        for t in self.threads.iter_mut().filter(|t| t.app == app && t.lifted) {
            t.lifted = false;
            out.push(Decision::Sink {
                pid: t.pid,
                tid: t.tid,
                levels,
                reason,
            });
        }
    }

    /// What the probe must be told since the last call.
    pub fn take_app_changes(&mut self) -> Vec<AppChange> {
        std::mem::take(&mut self.app_changes)
    }

    /// While lifting: whether `app` has sunk threads (its serving threads' lock waits
    /// matter).
    pub fn has_sunk(&self, app: u32) -> bool {
        self.lift_ns.is_some() && self.apps.get(app).is_some_and(|a| a.sunk > 0)
    }

    /// While lifting: the applications with sunk threads.
    pub fn sunk_apps(&self) -> impl Iterator<Item = u32> + '_ {
        let lifting = self.lift_ns.is_some();
        self.apps
            .list
            .iter()
            .filter(move |a| lifting && a.sunk > 0)
            .map(|a| a.id)
    }

    pub fn levels(&self, tid: u32) -> u32 {
        self.thread(tid).map_or(0, |t| t.levels)
    }

    pub fn tracked(&self) -> usize {
        self.threads.len()
    }
}

fn burst_ns(params: &ElevationParams) -> f64 {
    // Through u64: a u128 → f64 conversion is a library call, and a burst is far below
    // 2⁶⁴ ns, where both give the same value.
    params.budget.burst.as_nanos() as u64 as f64
}

fn forget_ns(params: &ElevationParams) -> u64 {
    params.forget_after.as_nanos() as u64
}

fn sink_ns(params: &ElevationParams) -> Option<u64> {
    params.sink.map(|s| s.after_cpu.as_nanos() as u64)
}

fn lift_ns(params: &ElevationParams) -> Option<u64> {
    params
        .sink
        .and_then(|s| s.lift)
        .map(|l| l.as_nanos() as u64)
}

/// The earliest time a tick has something to do for `t`: decay, a CPU-time re-read (for
/// its budget, or, with `watch`, to see whether its request runs long), a restore for an
/// exhausted budget, or forgetting an idle thread. A sunk thread waits for its request.
fn due_time(t: &Thread, exhausted: bool, forget_ns: u64, watch: bool) -> Nanos {
    if t.sunk {
        Nanos::MAX
    } else if t.levels == 0 && watch && t.last_request.saturating_add(forget_ns) > t.budget_at {
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

/// Refills the application's bucket for the time the thread was watched since its last
/// charge, drains it by the CPU the thread used, updates the exhausted flag (set when
/// empty, cleared only when full again).
fn account(t: &mut Thread, a: &mut App, now: Nanos, cpu_ns: u64, share: f64, burst: f64) {
    let wall = now.saturating_sub(t.budget_at) as f64;
    let used = cpu_ns.saturating_sub(t.cpu_ns) as f64;
    a.tokens_ns = (a.tokens_ns + wall * share - used).clamp(-burst, burst);
    t.budget_at = now.max(t.budget_at);
    t.cpu_ns = cpu_ns.max(t.cpu_ns);
    if a.tokens_ns <= 0.0 {
        a.exhausted = true;
    } else if a.exhausted && a.tokens_ns >= burst {
        a.exhausted = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Step;

    const MS: u64 = 1_000_000;

    fn params() -> ElevationParams {
        let step = |from, unix, inet, ms| Step {
            from_runnable_per_cpu: from,
            unix_nice: unix,
            inet_nice: inet,
            decay: Duration::from_millis(ms),
        };
        ElevationParams {
            ladder: Ladder::new(vec![
                step(0.0, 0, 0, 0),
                step(1.0, -4, -2, 100),
                step(3.0, -10, -6, 100),
            ])
            .unwrap(),
            min_psi_pct: 1.0,
            budget: Budget {
                cpu_share: 0.5,
                burst: Duration::from_millis(200),
            },
            slice: Some(Duration::from_micros(500)),
            forget_after: Duration::from_secs(10),
            sink: None,
        }
    }

    fn sinking() -> ElevationParams {
        ElevationParams {
            sink: Some(Sink {
                after_cpu: Duration::from_millis(50),
                levels: 10,
                lift: Some(Duration::from_millis(200)),
            }),
            ..params()
        }
    }

    /// Sinks thread 7 of process 1 (app 1) at 200 ms; returns the policy.
    fn one_sunk() -> ElevationPolicy {
        let mut p = ElevationPolicy::new(sinking());
        p.on_request(0, 1, 7, Source::Unix, 0, load(2.0));
        p.on_request(0, 1, 8, Source::Unix, 0, load(2.0));
        let cpu = |_: u32, tid: u32| Some(if tid == 7 { 60 * MS } else { MS });
        let d = p.on_tick(200 * MS, cpu);
        assert!(d.iter().any(|d| matches!(d, Decision::Sink { tid: 7, .. })));
        p
    }

    fn tids(d: &[Decision]) -> Vec<(u32, Reason)> {
        d.iter()
            .map(|d| match d {
                Decision::Elevate { tid, reason, .. }
                | Decision::Restore { tid, reason, .. }
                | Decision::Sink { tid, reason, .. } => (*tid, *reason),
            })
            .collect()
    }

    #[test]
    fn a_wait_of_its_application_lifts_a_sunk_thread_until_the_wait_ends() {
        let mut p = one_sunk();
        assert_eq!(p.take_app_changes(), vec![AppChange::Sunk(1, true)]);
        assert!(p.has_sunk(1) && !p.has_sunk(2));
        assert_eq!(p.sunk_apps().collect::<Vec<_>>(), [1]);
        // Another application's wait lifts nothing.
        assert!(p.on_wait(300 * MS, 2).is_empty());
        assert_eq!(
            tids(&p.on_wait(300 * MS, 1)),
            vec![(7, Reason::Lifted)],
            "back to its own nice"
        );
        assert!(p.view().iter().any(|t| t.tid == 7 && t.sunk && t.lifted));
        assert!(p.any_elevated(), "ticks run while lifted");
        // A second wait while lifted changes nothing.
        assert!(p.on_wait(301 * MS, 1).is_empty());
        assert_eq!(
            tids(&p.on_wait_end(310 * MS, 1)),
            vec![(7, Reason::WaitOver)]
        );
        assert!(p.on_wait_end(311 * MS, 1).is_empty(), "once");
        // Its next request brings it back for good; the probe hears it has none sunk.
        assert_eq!(
            tids(&[p
                .on_request(400 * MS, 1, 7, Source::Unix, 60 * MS, load(2.0))
                .unwrap()]),
            vec![(7, Reason::UnixRequest)]
        );
        assert_eq!(p.take_app_changes(), vec![AppChange::Sunk(1, false)]);
        assert!(!p.has_sunk(1) && p.sunk_apps().next().is_none());
        assert!(p.on_wait(500 * MS, 1).is_empty(), "nothing sunk to lift");
    }

    #[test]
    fn a_lift_lasts_at_most_its_time_per_second_so_a_cheater_cannot_stay_lifted() {
        let mut p = one_sunk();
        p.take_app_changes();
        // Waits that never end: lifted for 200 ms, then sunk again.
        assert_eq!(tids(&p.on_wait(1000 * MS, 1)), vec![(7, Reason::Lifted)]);
        let cpu = |_: u32, tid: u32| Some(if tid == 7 { 60 * MS } else { MS });
        assert!(tids(&p.on_tick(1150 * MS, cpu)).iter().all(|d| d.0 != 7));
        assert_eq!(
            tids(&p.on_tick(1201 * MS, cpu))
                .into_iter()
                .filter(|d| d.0 == 7)
                .collect::<Vec<_>>(),
            vec![(7, Reason::LiftSpent)]
        );
        assert_eq!(p.take_app_changes(), vec![AppChange::ResetWaits(1)]);
        // Spent: it refills at 200 ms a second; 100 ms later a lift lasts 20 ms.
        assert_eq!(tids(&p.on_wait(1300 * MS, 1)), vec![(7, Reason::Lifted)]);
        assert!(tids(&p.on_tick(1315 * MS, cpu)).iter().all(|d| d.0 != 7));
        assert!(tids(&p.on_tick(1321 * MS, cpu)).contains(&(7, Reason::LiftSpent)));
        assert!(p.on_wait(1321 * MS, 1).is_empty(), "nothing left");
        // Waits of 9 ms every 10 ms for 5 s, ticks every millisecond: lifted for the
        // full bucket (200 ms) and then 200 ms a second.
        let mut p = one_sunk();
        let (mut lifted_ms, mut since) = (0, None);
        for ms in 10_000..15_000 {
            let now = ms * MS;
            let mut d = p.on_tick(now, cpu);
            if ms % 10 == 0 {
                d.extend(p.on_wait(now, 1));
            } else if ms % 10 == 9 {
                d.extend(p.on_wait_end(now, 1));
            }
            for (_, reason) in tids(&d).into_iter().filter(|d| d.0 == 7) {
                if reason == Reason::Lifted {
                    since = Some(ms);
                } else {
                    lifted_ms += ms - since.take().expect("lifted before");
                }
            }
        }
        assert!(
            (1150..=1210).contains(&lifted_ms),
            "lifted {lifted_ms} ms in 5 s"
        );
    }

    #[test]
    fn without_lifting_a_wait_changes_nothing_and_the_probe_is_told_nothing() {
        let mut params = sinking();
        params.sink.as_mut().unwrap().lift = None;
        let mut p = ElevationPolicy::new(params);
        p.on_request(0, 1, 7, Source::Unix, 0, load(2.0));
        p.on_tick(200 * MS, |_, _| Some(60 * MS));
        assert!(p.take_app_changes().is_empty());
        assert!(p.on_wait(300 * MS, 1).is_empty());
        // Turned on by a reload: the probe hears of the sunk application.
        p.set_params(sinking());
        assert_eq!(p.take_app_changes(), vec![AppChange::Sunk(1, true)]);
    }

    #[test]
    fn an_applications_bucket_stays_its_own_when_another_application_goes() {
        fn check<I: SlotIndex>(mut p: ElevationPolicy<I>) {
            for (app, tid) in [(1, 10), (2, 20), (3, 30)] {
                p.on_app_request(0, app, tid, tid, Source::Network, 0, load(2.0));
            }
            // Application 1 goes (application 3 takes its place in the table).
            p.forget(10);
            // Application 3's thread burns 300 ms: its bucket, not application 2's, is spent.
            let d = p.on_tick(110 * MS, |_, tid| {
                Some(if tid == 30 { 300 * MS } else { 0 })
            });
            assert!(d.contains(&Decision::Restore {
                pid: 30,
                tid: 30,
                reason: Reason::BudgetExhausted
            }));
            let now = 110 * MS;
            assert_eq!(
                p.on_app_request(now, 3, 31, 31, Source::Network, 0, load(2.0)),
                None
            );
            assert_eq!(
                levels(&p.on_app_request(now, 2, 21, 21, Source::Network, 0, load(2.0))),
                2
            );
            // A new application 1 starts with a full bucket.
            assert_eq!(
                levels(&p.on_app_request(now, 1, 11, 11, Source::Network, 0, load(2.0))),
                2
            );
        }
        check(ElevationPolicy::new(params()));
        check(ElevationPolicy::<DenseIndex>::with_index(params()));
    }

    #[test]
    fn workers_forked_per_connection_share_their_servers_budget() {
        let mut p = ElevationPolicy::new(params());
        // Application 100 (a forking server): its worker for one connection burns 300 ms.
        p.on_app_request(0, 100, 200, 200, Source::Network, 0, load(2.0));
        let now = 110 * MS;
        p.on_tick(now, |_, _| Some(300 * MS));
        // The bucket (200 ms) is spent: a fresh worker of it is not elevated...
        assert_eq!(
            p.on_app_request(now, 100, 300, 300, Source::Network, 0, load(2.0)),
            None
        );
        // ...while another application's first request is.
        assert_eq!(
            levels(&p.on_app_request(now, 400, 400, 400, Source::Network, 0, load(2.0))),
            2
        );
        // Per thread, each worker would have started with a full bucket.
        let mut q = ElevationPolicy::new(params());
        assert_eq!(
            levels(&q.on_app_request(now, 300, 300, 300, Source::Network, 0, load(2.0))),
            2
        );
    }

    #[test]
    fn a_long_request_sinks_past_its_cpu_and_its_next_request_brings_it_back() {
        let mut p = ElevationPolicy::new(sinking());
        assert_eq!(
            levels(&p.on_request(0, 1, 7, Source::Unix, 0, load(2.0))),
            4
        );
        // 40 ms of CPU after the read: still the request's work.
        assert!(p
            .on_tick(100 * MS, |_, _| Some(40 * MS))
            .iter()
            .all(|d| !matches!(d, Decision::Sink { .. })));
        // 60 ms: a long request. It loses its elevation and sinks, once.
        let d = p.on_tick(200 * MS, |_, _| Some(60 * MS));
        assert_eq!(
            d,
            vec![Decision::Sink {
                pid: 1,
                tid: 7,
                levels: 10,
                reason: Reason::LongRequest
            }]
        );
        assert_eq!(p.levels(7), 0);
        assert!(p.view()[0].sunk);
        assert!(p.on_tick(900 * MS, |_, _| Some(500 * MS)).is_empty());
        // Its next request: elevated again (which replaces the sinking).
        assert_eq!(
            levels(&p.on_request(1000 * MS, 1, 7, Source::Unix, 600 * MS, load(2.0))),
            4
        );
        assert!(!p.view()[0].sunk);
        // Not elevated on an idle machine, still sunk by a long request, and put back
        // by the next request.
        p.on_request(2000 * MS, 1, 8, Source::Unix, 0, load(0.5));
        let d = p.on_tick(2200 * MS, |_, tid| {
            Some(if tid == 8 { 80 * MS } else { 600 * MS })
        });
        assert!(d.contains(&Decision::Sink {
            pid: 1,
            tid: 8,
            levels: 10,
            reason: Reason::LongRequest
        }));
        assert_eq!(
            p.on_request(2300 * MS, 1, 8, Source::Unix, 80 * MS, load(0.5)),
            Some(Decision::Restore {
                pid: 1,
                tid: 8,
                reason: Reason::Surfaced
            })
        );
    }

    #[test]
    fn short_requests_never_sink_however_many() {
        let mut p = ElevationPolicy::new(sinking());
        let mut cpu = 0;
        for i in 0..200u64 {
            let now = i * 20 * MS;
            p.on_request(now, 1, 7, Source::Network, cpu, load(2.0));
            cpu += 5 * MS; // 5 ms per request, a request every 20 ms: 10 s in all
            let d = p.on_tick(now + 10 * MS, |_, _| Some(cpu));
            assert!(
                d.iter().all(|d| !matches!(d, Decision::Sink { .. })),
                "{d:?}"
            );
        }
    }

    #[test]
    fn without_sinking_no_idle_thread_is_read() {
        let mut p = ElevationPolicy::new(params());
        p.on_request(0, 1, 7, Source::Unix, 0, load(0.5));
        let mut reads = 0;
        p.on_tick(5000 * MS, |_, _| {
            reads += 1;
            Some(0)
        });
        assert_eq!(reads, 0, "not elevated, not watched: no CPU read");
    }

    fn load(r: f64) -> Load {
        Load {
            runnable_per_cpu: r,
            psi_some_pct: 50.0,
        }
    }

    fn levels(d: &Option<Decision>) -> u32 {
        match d {
            Some(Decision::Elevate { levels, .. }) => *levels,
            _ => 0,
        }
    }

    #[test]
    fn no_elevation_on_an_idle_machine() {
        let mut p = ElevationPolicy::new(params());
        assert_eq!(p.on_request(0, 1, 1, Source::Unix, 0, load(0.5)), None);
        let calm = Load {
            runnable_per_cpu: 4.0,
            psi_some_pct: 0.1,
        };
        assert_eq!(
            p.on_request(0, 1, 2, Source::Unix, 0, calm),
            None,
            "no one waits: no elevation"
        );
    }

    #[test]
    fn unix_elevates_more_than_network_and_more_under_load() {
        let mut p = ElevationPolicy::new(params());
        let u = p.on_request(0, 1, 1, Source::Unix, 0, load(1.5));
        let n = p.on_request(0, 2, 2, Source::Network, 0, load(1.5));
        let heavy = p.on_request(0, 3, 3, Source::Network, 0, load(4.0));
        assert_eq!((levels(&u), levels(&n), levels(&heavy)), (4, 2, 6));
        assert!(matches!(
            u,
            Some(Decision::Elevate {
                reason: Reason::UnixRequest,
                slice: Some(_),
                ..
            })
        ));
    }

    #[test]
    fn fades_one_level_per_delay_and_re_elevates() {
        let mut p = ElevationPolicy::new(params());
        let cpu = |_, _| Some(0);
        p.on_request(0, 1, 1, Source::Unix, 0, load(2.0));
        assert!(p.on_tick(99 * MS, cpu).is_empty());
        assert_eq!(
            p.on_tick(100 * MS, cpu),
            vec![Decision::Elevate {
                pid: 1,
                tid: 1,
                levels: 3,
                slice: Some(Duration::from_micros(500)),
                reason: Reason::Decay
            }]
        );
        // A new request restores the full elevation and restarts the timer.
        assert_eq!(
            levels(&p.on_request(150 * MS, 1, 1, Source::Unix, 0, load(2.0))),
            4
        );
        assert!(p.on_tick(249 * MS, cpu).is_empty());
        // Ticks that come late apply every missed step at once.
        let d = p.on_tick(450 * MS, cpu);
        assert!(
            matches!(d[..], [Decision::Elevate { levels: 1, .. }]),
            "{d:?}"
        );
        let d = p.on_tick(550 * MS, cpu);
        assert_eq!(
            d,
            vec![Decision::Restore {
                pid: 1,
                tid: 1,
                reason: Reason::Faded
            }]
        );
        assert!(p.on_tick(900 * MS, cpu).is_empty());
    }

    #[test]
    fn a_request_once_the_load_has_fallen_fades_at_the_pace_of_the_load_now() {
        let mut p = ElevationPolicy::new(params());
        let cpu = |_, _| Some(0);
        assert_eq!(
            levels(&p.on_request(0, 1, 1, Source::Unix, 0, load(2.0))),
            4
        );
        // Below the first step (the batch went idle): no elevation at this load, so
        // the next tick restores the thread instead of fading it a level per 100 ms.
        assert_eq!(
            p.on_request(30 * MS, 1, 1, Source::Unix, 0, load(0.2)),
            None
        );
        assert_eq!(
            p.on_tick(50 * MS, cpu),
            vec![Decision::Restore {
                pid: 1,
                tid: 1,
                reason: Reason::Faded
            }]
        );
        // A load still on the ladder keeps the slower fade of its own step.
        assert_eq!(
            levels(&p.on_request(60 * MS, 2, 2, Source::Unix, 0, load(2.0))),
            4
        );
        assert_eq!(
            p.on_request(90 * MS, 2, 2, Source::Unix, 0, load(1.2)),
            None
        );
        assert!(p.on_tick(120 * MS, cpu).is_empty());
        assert_eq!(p.levels(2), 4);
    }

    #[test]
    fn repeated_requests_at_same_level_need_no_syscall() {
        let mut p = ElevationPolicy::new(params());
        assert!(p.on_request(0, 1, 1, Source::Unix, 0, load(2.0)).is_some());
        assert_eq!(
            p.on_request(10 * MS, 1, 1, Source::Unix, 0, load(2.0)),
            None
        );
        // A weaker step does not lower a stronger elevation.
        assert_eq!(
            p.on_request(20 * MS, 1, 1, Source::Network, 0, load(2.0)),
            None
        );
        assert_eq!(p.levels(1), 4);
    }

    #[test]
    fn a_spinning_cheater_loses_its_elevation_and_stays_down() {
        let mut p = ElevationPolicy::new(params());
        // Reads a byte every 5 ms while using the whole CPU.
        let mut elevated_ticks = 0;
        for i in 0..400u64 {
            let now = i * 5 * MS;
            p.on_request(now, 1, 1, Source::Network, now, load(2.0));
            p.on_tick(now, |_, _| Some(now));
            if i >= 100 && p.levels(1) > 0 {
                elevated_ticks += 1;
            }
        }
        assert_eq!(
            elevated_ticks, 0,
            "after its first burst the cheater is never elevated again"
        );
        assert!(p.view()[0].exhausted);
    }

    #[test]
    fn a_server_using_a_fifth_of_a_cpu_keeps_its_elevation() {
        let mut p = ElevationPolicy::new(params());
        // 5 ms of CPU per request, 40 requests/s.
        let mut cpu = 0;
        for i in 0..400u64 {
            let now = i * 25 * MS;
            p.on_request(now, 1, 1, Source::Network, cpu, load(2.0));
            cpu += 5 * MS;
            p.on_tick(now + 5 * MS, |_, _| Some(cpu));
            assert_eq!(p.levels(1), 2, "at {i}");
        }
    }

    #[test]
    fn exhausted_thread_recovers_once_it_stops_burning() {
        let mut p = ElevationPolicy::new(params());
        p.on_request(0, 1, 1, Source::Unix, 0, load(2.0));
        // 600 ms of CPU within the first 100 ms (several threads' worth: a clear overrun).
        let d = p.on_tick(100 * MS, |_, _| Some(600 * MS));
        assert_eq!(
            d,
            vec![Decision::Restore {
                pid: 1,
                tid: 1,
                reason: Reason::BudgetExhausted
            }]
        );
        assert_eq!(
            p.on_request(110 * MS, 1, 1, Source::Unix, 600 * MS, load(2.0)),
            None
        );
        // Idle from then on: the bucket (clamped at -200 ms) refills at 0.5/s to full in 0.8 s, at 900 ms.
        assert_eq!(
            p.on_request(700 * MS, 1, 1, Source::Unix, 600 * MS, load(2.0)),
            None
        );
        assert!(p
            .on_request(1000 * MS, 1, 1, Source::Unix, 600 * MS, load(2.0))
            .is_some());
    }

    #[test]
    fn a_budget_emptied_by_a_request_ends_the_elevation_on_the_next_tick() {
        let mut p = ElevationPolicy::new(params());
        p.on_request(0, 1, 1, Source::Unix, 0, load(2.0));
        // The next request shows 600 ms of CPU used in 10 ms.
        assert_eq!(
            p.on_request(10 * MS, 1, 1, Source::Unix, 600 * MS, load(2.0)),
            None
        );
        assert_eq!(
            p.on_tick(20 * MS, |_, _| Some(600 * MS)),
            vec![Decision::Restore {
                pid: 1,
                tid: 1,
                reason: Reason::BudgetExhausted
            }]
        );
    }

    #[test]
    fn every_thread_fades_on_time_while_others_come_and_go() {
        fades_on_time(ElevationPolicy::new(params()));
        fades_on_time(ElevationPolicy::<DenseIndex>::with_index(params()));
    }

    fn fades_on_time<I: SlotIndex>(mut p: ElevationPolicy<I>) {
        // Thread i gets its request at i·10 ms; 1, 4 and 7 are forgotten (each removal
        // moves another thread's state), 9 has exited by its first CPU-time read.
        for tid in 1..=10u32 {
            p.on_request(tid as u64 * 10 * MS, tid, tid, Source::Unix, 0, load(2.0));
        }
        for tid in [1, 4, 7] {
            p.forget(tid);
        }
        let mut seen: Vec<(u64, u32, u32)> = Vec::new();
        for tick in 0..=100u64 {
            let now = tick * 10 * MS;
            for d in p.on_tick(now, |_, tid| (tid != 9).then_some(0)) {
                match d {
                    Decision::Elevate { tid, levels, .. } => seen.push((now, tid, levels)),
                    Decision::Restore { tid, .. } => seen.push((now, tid, 0)),
                    Decision::Sink { .. } => panic!("sinking is off here: {d:?}"),
                }
            }
        }
        seen.sort();
        let mut expected = Vec::new();
        for tid in [2u32, 3, 5, 6, 8, 10] {
            // Elevated 4 levels, one level less every 100 ms.
            for (k, levels) in [3, 2, 1, 0].into_iter().enumerate() {
                expected.push(((tid as u64 * 10 + 100 * (k as u64 + 1)) * MS, tid, levels));
            }
        }
        expected.sort();
        assert_eq!(seen, expected);
        assert_eq!(p.tracked(), 6, "idle threads are kept for forget_after");
        p.on_request(2_000 * MS, 10, 10, Source::Unix, 0, load(2.0));
        assert_eq!(p.levels(10), 4);
        assert_eq!(p.levels(2), 0);
    }

    #[test]
    fn a_dense_index_finds_what_was_set_and_nothing_else() {
        let mut d = DenseIndex::default();
        assert_eq!(d.get(0), None);
        d.set(7, 3);
        d.set(2, 0);
        assert_eq!(
            (d.get(7), d.get(2), d.get(5), d.get(100)),
            (Some(3), Some(0), None, None)
        );
        d.unset(7);
        d.unset(100); // never set: nothing to do
        assert_eq!((d.get(7), d.get(2)), (None, Some(0)));
    }

    #[test]
    fn both_indexes_give_the_same_decisions() {
        // Requests, ticks, exits and forgetting in a pseudo-random order, so that slots
        // are reused and moved many times.
        let mut hashed = ElevationPolicy::new(params());
        let mut dense = ElevationPolicy::<DenseIndex>::with_index(params());
        let mut x: u64 = 99;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        let mut decisions = 0;
        for step in 0..20_000u64 {
            let now = step * MS;
            let tid = (next() % 50) as u32;
            match next() % 10 {
                0 => {
                    hashed.forget(tid);
                    dense.forget(tid);
                }
                1 => {
                    // Threads whose id ends in 7 have exited.
                    let cpu = |_, tid: u32| (tid % 10 != 7).then_some(now / 3);
                    let (a, b) = (hashed.on_tick(now, cpu), dense.on_tick(now, cpu));
                    decisions += a.len();
                    assert_eq!(a, b, "tick at {now}");
                }
                k => {
                    let source = if k % 2 == 0 {
                        Source::Unix
                    } else {
                        Source::Network
                    };
                    let l = load((next() % 5) as f64);
                    let a = hashed.on_request(now, tid, tid, source, now / 2, l);
                    let b = dense.on_request(now, tid, tid, source, now / 2, l);
                    decisions += a.is_some() as usize;
                    assert_eq!(a, b, "request at {now}");
                }
            }
            assert_eq!(hashed.view(), dense.view(), "step {step}");
        }
        assert!(decisions > 1_000, "{decisions} decisions");
    }

    #[test]
    fn a_reload_applies_the_new_forget_after_to_threads_already_watched() {
        let mut p = ElevationPolicy::new(params());
        // Watched (for its budget) but not elevated: an idle machine.
        p.on_request(0, 1, 1, Source::Unix, 0, load(0.5));
        assert_eq!(p.tracked(), 1);
        p.set_params(ElevationParams {
            forget_after: Duration::from_secs(1),
            ..params()
        });
        p.on_tick(999 * MS, |_, _| Some(0));
        assert_eq!(p.tracked(), 1);
        p.on_tick(1_000 * MS, |_, _| Some(0));
        assert_eq!(
            p.tracked(),
            0,
            "forgotten after the new 1 s, not the old 10 s"
        );
    }

    #[test]
    fn gone_threads_and_idle_threads_are_forgotten() {
        let mut p = ElevationPolicy::new(params());
        p.on_request(0, 1, 1, Source::Unix, 0, load(2.0));
        p.on_request(0, 2, 2, Source::Unix, 0, load(2.0));
        let d = p.on_tick(10 * MS, |_, _| {
            panic!("CPU time known from the request events")
        });
        assert!(d.is_empty());
        let d = p.on_tick(100 * MS, |_, tid| (tid == 1).then_some(0));
        assert!(
            d.iter().all(|d| !matches!(
                d,
                Decision::Restore { tid: 2, .. } | Decision::Elevate { tid: 2, .. }
            )),
            "a vanished thread needs no restore: {d:?}"
        );
        assert_eq!(p.tracked(), 1);
        p.on_tick(20 * MS * 1000, |_, _| Some(0));
        assert_eq!(p.tracked(), 0, "faded and idle for forget_after");
    }
}
