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
//! Users are bounded as a whole: every thread of an unprivileged user (the caller says
//! which threads are) also pays into its user's bucket, which fills at `user_budget` of
//! one CPU however many threads, processes and applications the user runs, and drains
//! by the CPU they use while elevated. Without it a user who forks gets a fresh bucket
//! per process, and sixteen processes that each read a byte and spin ran the whole
//! machine at a priority the kernel refuses that user.
//!
//! No priority inversion: a sunk thread may hold what a fresh request needs. While a
//! thread serving a request of the same application waits on a lock (the probe reports
//! the first such wait and the end of the last), the application's sunk threads are
//! lifted back to their own nice, within a `LiftBudget` of `sink.lift` a second.

use rustc_hash::FxHashMap;

use crate::lift::RefusedWaits;
use crate::{LiftBudget, Load, Nanos};

mod params;
mod slots;
#[cfg(test)]
mod tests;
mod timing;

pub use params::{AppChange, Budget, Decision, ElevationParams, Reason, Sink, Source, ThreadView};
pub use slots::{DenseIndex, SlotIndex};
use timing::{due_time, fade, restart_fade, wants_cpu};

/// An elevated thread's CPU time is re-read when the last reading (from a request
/// event or an earlier read) is older than this.
pub const CPU_REFRESH_NS: u64 = 100_000_000;

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
    /// Its unprivileged user (whose bucket it also pays into), if it has one.
    user: Option<u32>,
    /// Its latest reported request came on a UNIX socket.
    unix: bool,
}

/// What one unprivileged user's threads may still use elevated.
#[derive(Clone, Debug)]
struct UserBucket {
    tokens_ns: f64,
    /// When it was last filled.
    at: Nanos,
    exhausted: bool,
    /// Its watched threads (the entry goes with the last).
    threads: u32,
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
    /// The unprivileged users of the watched threads.
    users: FxHashMap<u32, UserBucket>,
    /// Applications lifted now.
    lifted: Vec<u32>,
    /// Applications whose serving threads wait but whose lift their bucket refused: lifted
    /// at a tick once it has refilled.
    refused: RefusedWaits,
    /// Changes for the probe, taken by `take_app_changes`.
    app_changes: Vec<AppChange>,
    /// `params`' bucket size, forget_after and sink threshold in ns, converted once,
    /// not per request.
    burst_ns: f64,
    forget_ns: u64,
    sink_ns: Option<u64>,
    /// `sink.lift` in ns (None: no lifting, and the probe is told of no application).
    lift_ns: Option<u64>,
    /// The ladder's step at the last tick, and whether it rose then (`on_load`).
    step_seen: usize,
    step_rose: bool,
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
            users: FxHashMap::default(),
            lifted: Vec::new(),
            refused: RefusedWaits::default(),
            app_changes: Vec::new(),
            step_seen: 0,
            step_rose: false,
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
        if !lifts {
            self.refused.clear();
        }
        if lifts != lifted_before {
            // The probe is told of the applications with sunk threads only while lifting.
            for a in self.apps.list.iter().filter(|a| a.sunk > 0) {
                self.app_changes.push(AppChange::Sunk(a.id, lifts));
            }
        }
        self.params = params;
        // A new ladder may ask more of the held threads: all read at the next tick.
        self.step_seen = 0;
        let watch = self.sink_ns.is_some();
        for (due, t) in self.due.iter_mut().zip(&self.threads) {
            let exhausted = budget_spent(&self.apps, &self.users, t);
            *due = due_time(t, exhausted, self.forget_ns, watch);
        }
    }

    /// A thread of application `app` received a request at `now`; `cpu_ns` is its total
    /// CPU time then.
    #[allow(clippy::too_many_arguments)]
    pub fn on_request(
        &mut self,
        now: Nanos,
        app: u32,
        pid: u32,
        tid: u32,
        source: Source,
        cpu_ns: u64,
        load: Load,
    ) -> Option<Decision> {
        self.on_user_request(now, app, None, pid, tid, source, cpu_ns, load)
    }

    /// The same, for a thread of unprivileged user `user` (None: root or a system
    /// account), whose elevation that user's bucket bounds too.
    #[allow(clippy::too_many_arguments)]
    pub fn on_user_request(
        &mut self,
        now: Nanos,
        app: u32,
        user: Option<u32>,
        pid: u32,
        tid: u32,
        source: Source,
        cpu_ns: u64,
        load: Load,
    ) -> Option<Decision> {
        let slot = match self.slots.get(tid) {
            Some(slot) => slot as usize,
            None if self.over_users_threads(user) => return None,
            None => self.track(tid, pid, app, user, now, cpu_ns),
        };
        let (burst, forget_ns) = (self.burst_ns, self.forget_ns);
        let watch = self.sink_ns.is_some();
        let share = self.params.budget.cpu_share;
        let (at, step) = self.step_for(load);
        let below_first_step = at == 0;
        let target = step.levels(source == Source::Unix);
        let t = &mut self.threads[slot];
        t.pid = pid;
        t.last_request = now;
        t.unix = source == Source::Unix;
        let a = self.apps.get_mut(t.app).expect("a watched thread's app");
        let used = account(t, a, now, cpu_ns, share, burst);
        if charge_user(&mut self.users, t, now, used, self.params.user_budget) {
            let user = t.user;
            due_now(&self.threads, &mut self.due, user);
        }
        let t = &mut self.threads[slot];
        let a = self.apps.get_mut(t.app).expect("a watched thread's app");
        let exhausted = a.exhausted || user_exhausted(&self.users, t.user);
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
        let pace = step.decay.as_nanos() as u64;
        let raised = restart_fade(t, now, target, pace, exhausted, below_first_step);
        self.due[slot] = due_time(t, exhausted, forget_ns, watch);
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
    fn track(
        &mut self,
        tid: u32,
        pid: u32,
        app: u32,
        user: Option<u32>,
        now: Nanos,
        cpu_ns: u64,
    ) -> usize {
        if let Some(uid) = user.filter(|_| self.params.user_budget.is_some()) {
            let burst_ns = self
                .params
                .user_budget
                .map_or(0.0, |b| b.burst.as_nanos() as f64);
            self.users
                .entry(uid)
                .or_insert(UserBucket {
                    tokens_ns: burst_ns,
                    at: now,
                    exhausted: false,
                    threads: 0,
                })
                .threads += 1;
        }
        let user = user.filter(|_| self.params.user_budget.is_some());
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
            user,
            unix: false,
        });
        self.due.push(0);
        let slot = self.threads.len() - 1;
        self.slots.set(tid, slot as u32);
        slot
    }

    /// The threads whose CPU time `on_tick(now, …)` will ask for: due, watched, not read
    /// within CPU_REFRESH_NS, and every elevated one when the load rose a step (`on_load`).
    /// A caller reads them all in one call before the tick; the tick may ask for a few more
    /// (those its own work makes due).
    pub fn cpu_wanted(&self, now: Nanos) -> impl Iterator<Item = (u32, u32)> + '_ {
        let (sinking, rose) = (self.sink_ns.is_some(), self.step_rose);
        self.threads
            .iter()
            .zip(&self.due)
            .filter(move |&(t, &due)| {
                (rose && t.levels > 0 && !t.sunk) || (due <= now && wants_cpu(t, now, sinking))
            })
            .map(|(t, _)| (t.pid, t.tid))
    }

    /// The load at a tick, before `cpu_wanted`: when it moved the ladder up a step, every
    /// elevated thread is read at this tick, so that a held one (whose requests are
    /// reported only every held gap) is raised now by its latest request (`note_request`),
    /// as a reported request would raise it, not at its next reading.
    pub fn on_load(&mut self, load: Load) {
        let (at, _) = self.step_for(load);
        self.step_rose = at > self.step_seen;
        self.step_seen = at;
    }

    /// The ladder's step for `load` (its index, 0 below the first) and the step.
    fn step_for(&self, load: Load) -> (usize, crate::Step) {
        let at = (self.params.ladder).step_index_for(load.ladder_index(self.params.min_psi_pct));
        (at, self.params.ladder.steps()[at])
    }

    /// Thread `tid`'s latest request as the tick read it from the probe: at `at`, its
    /// CPU time then `cpu_at_request` (a held thread's requests are reported at most every
    /// held gap). A long request is timed from there, and an elevated thread's fade
    /// restarts from it as from a reported request: raised when the load now asks for
    /// more.
    pub fn note_request(
        &mut self,
        tid: u32,
        at: Nanos,
        cpu_at_request: u64,
        load: Load,
    ) -> Option<Decision> {
        let slot = self.slots.get(tid)? as usize;
        let (at_step, step) = self.step_for(load);
        let (forget_ns, watch) = (self.forget_ns, self.sink_ns.is_some());
        let t = &mut self.threads[slot];
        t.cpu_at_request = t.cpu_at_request.max(cpu_at_request);
        // Not elevated: its requests are reported (a sunk one's surface it).
        if at <= t.last_request || t.levels == 0 || t.sunk {
            return None;
        }
        t.last_request = at;
        let a = self.apps.get(t.app).expect("a watched thread's app");
        let exhausted = a.exhausted || user_exhausted(&self.users, t.user);
        let target = step.levels(t.unix);
        let pace = step.decay.as_nanos() as u64;
        let raised = restart_fade(t, at, target, pace, exhausted, at_step == 0);
        self.due[slot] = due_time(t, exhausted, forget_ns, watch);
        raised.then_some(Decision::Elevate {
            pid: t.pid,
            tid,
            levels: target,
            slice: self.params.slice,
            reason: match t.unix {
                true => Reason::UnixRequest,
                false => Reason::NetworkRequest,
            },
        })
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
        self.forget_full_users(now);
        self.lift_refused(now, &mut out);
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
            let cpu = if wants_cpu(t, now, sink_ns.is_some()) {
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
                let used = account(t, a, now, cpu, share, burst);
                if charge_user(&mut self.users, t, now, used, self.params.user_budget) {
                    let user = t.user;
                    due_now(&self.threads, &mut self.due, user);
                }
            }
            let t = &mut self.threads[i];
            let a = self.apps.get_mut(t.app).expect("a watched thread's app");
            let user_exhausted = user_exhausted(&self.users, t.user);
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
            } else if t.levels > 0 && (a.exhausted || user_exhausted) {
                t.levels = 0;
                out.push(Decision::Restore {
                    pid,
                    tid,
                    reason: match a.exhausted {
                        true => Reason::BudgetExhausted,
                        false => Reason::UserBudgetExhausted,
                    },
                });
            } else if t.levels > 0 && now >= t.next_decay_at {
                out.push(fade(t, now, slice));
            }
            // Keep idle threads for a while so the budget remembers a cheater; a sunk
            // one until its next request or its end (it is still changed).
            if t.levels > 0 || t.sunk || now.saturating_sub(t.last_request) < forget_ns {
                let exhausted = a.exhausted || user_exhausted;
                self.due[i] = due_time(t, exhausted, forget_ns, sink_ns.is_some());
                i += 1;
            } else {
                self.remove_slot(i);
            }
        }
        out
    }

    /// Whether a new thread of `user` would pass the bound on watched threads of one user,
    /// or of all users.
    fn over_users_threads(&self, user: Option<u32>) -> bool {
        let (Some(uid), Some(_)) = (user, self.params.user_budget) else {
            return false;
        };
        let (each, all) = (self.params.user_threads_max, self.params.users_threads_max);
        let mine = self.users.get(&uid).map_or(0, |u| u.threads);
        let everyone: u32 = self.users.values().map(|u| u.threads).sum();
        (each > 0 && mine >= each) || (all > 0 && everyone >= all)
    }

    /// Drops the buckets of users with no watched thread once they have refilled.
    fn forget_full_users(&mut self, now: Nanos) {
        let Some(b) = self.params.user_budget.filter(|_| !self.users.is_empty()) else {
            return;
        };
        let burst = b.burst.as_nanos() as u64 as f64;
        self.users.retain(|_, u| {
            let refilled = u.tokens_ns + now.saturating_sub(u.at) as f64 * b.cpu_share;
            u.threads > 0 || refilled < burst
        });
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
        // A user's bucket outlives its threads until it has refilled (`forget_full_users`):
        // a user who ends each thread and starts another gets no fresh bucket.
        if let Some(u) = gone.user.and_then(|uid| self.users.get_mut(&uid)) {
            u.threads -= 1;
        }
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
                self.refused.forget(gone.app);
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

    /// True while some thread is elevated (decay needs ticks), lifted (its lift ends
    /// on time) or waiting to be (its bucket refills).
    pub fn any_elevated(&self) -> bool {
        !self.lifted.is_empty()
            || !self.refused.is_empty()
            || self.threads.iter().any(|t| t.levels > 0)
    }

    /// A thread serving a request of `app` waits on a lock: its sunk threads are lifted
    /// back to their own nice, while its lifting time lasts. A wait the bucket cannot lift
    /// now is lifted at a tick once it can, unless it ended first.
    pub fn on_wait(&mut self, now: Nanos, app: u32) -> Vec<Decision> {
        let mut out = Vec::new();
        if !self.lift(now, app, &mut out) {
            self.refuse(app);
        }
        out
    }

    /// Remembers a wait of `app` its bucket could not lift, if there is something to lift
    /// and it is not lifted already.
    fn refuse(&mut self, app: u32) {
        if self.has_sunk(app) && !self.lifted.contains(&app) {
            self.refused.remember(app);
        }
    }

    /// Lifts `app`'s sunk threads if its bucket allows; false if it does not (or nothing
    /// is sunk, or it is lifted already).
    fn lift(&mut self, now: Nanos, app: u32, out: &mut Vec<Decision>) -> bool {
        let Some(per_second) = self.lift_ns else {
            return false;
        };
        let Some(a) = self.apps.get_mut(app) else {
            return false;
        };
        if a.sunk == 0 || a.lift.start(now, per_second).is_none() {
            return false;
        }
        self.refused.forget(app);
        self.lifted.push(app);
        for t in self.threads.iter_mut().filter(|t| t.app == app && t.sunk) {
            t.lifted = true;
            out.push(Decision::Restore {
                pid: t.pid,
                tid: t.tid,
                reason: Reason::Lifted,
            });
        }
        true
    }

    /// Lifts the refused waits whose buckets have refilled; forgets those of applications
    /// with nothing sunk any more.
    fn lift_refused(&mut self, now: Nanos, out: &mut Vec<Decision>) {
        if self.refused.is_empty() {
            return;
        }
        for app in self.refused.take() {
            if !self.lift(now, app, out) {
                self.refuse(app);
            }
        }
    }

    /// The last wait of `app` on a lock ended: its lifted threads sink again.
    pub fn on_wait_end(&mut self, now: Nanos, app: u32) -> Vec<Decision> {
        self.refused.forget(app);
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

    /// Whether a request of `tid` now would raise nothing because its application's or
    /// its user's budget is spent (until refilled, when its requests count again).
    pub fn spent(&self, tid: u32) -> bool {
        self.thread(tid)
            .is_some_and(|t| budget_spent(&self.apps, &self.users, t))
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

/// Refills the application's bucket for the time the thread was watched since its last
/// charge, drains it by the CPU the thread used, updates the exhausted flag (set when
/// empty, cleared only when full again). Returns the CPU the thread used since, ns.
fn account(t: &mut Thread, a: &mut App, now: Nanos, cpu_ns: u64, share: f64, burst: f64) -> f64 {
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
    used
}

/// Refills the thread's user's bucket for the time since it was last filled (once per
/// user, however many threads), drains it by `used` if the thread ran elevated, and says
/// whether this spent the user's elevation (cleared only when full again).
fn charge_user(
    users: &mut FxHashMap<u32, UserBucket>,
    t: &Thread,
    now: Nanos,
    used: f64,
    budget: Option<crate::Budget>,
) -> bool {
    let (Some(uid), Some(budget)) = (t.user, budget) else {
        return false;
    };
    let Some(u) = users.get_mut(&uid) else {
        return false;
    };
    let burst = budget.burst.as_nanos() as u64 as f64;
    let wall = now.saturating_sub(u.at) as f64;
    let spent = if t.levels > 0 { used } else { 0.0 };
    // Debt is kept (down to a few bursts): what the user's other threads ran elevated
    // before they were put back is paid for, not forgiven.
    u.tokens_ns = (u.tokens_ns + wall * budget.cpu_share - spent).clamp(-4.0 * burst, burst);
    u.at = now.max(u.at);
    let was = u.exhausted;
    if u.tokens_ns <= 0.0 {
        u.exhausted = true;
    } else if u.exhausted && u.tokens_ns >= burst {
        u.exhausted = false;
    }
    u.exhausted && !was
}

/// Marks every elevated thread of `user` due now (its user's elevation is spent: each is
/// put back at this tick or the next, not at its own next CPU reading).
fn due_now(threads: &[Thread], due: &mut [Nanos], user: Option<u32>) {
    for (t, d) in threads.iter().zip(due.iter_mut()) {
        if t.user == user && t.levels > 0 {
            *d = 0;
        }
    }
}

/// Whether `t`'s application's or user's budget is spent.
fn budget_spent<I: SlotIndex>(
    apps: &Apps<I>,
    users: &FxHashMap<u32, UserBucket>,
    t: &Thread,
) -> bool {
    apps.get(t.app).is_some_and(|a| a.exhausted) || user_exhausted(users, t.user)
}

/// Whether the user of a thread has spent its elevation.
fn user_exhausted(users: &FxHashMap<u32, UserBucket>, user: Option<u32>) -> bool {
    user.and_then(|uid| users.get(&uid))
        .is_some_and(|u| u.exhausted)
}
