//! The discrete-event engine: CPUs, tasks, customers, requests and calls. Scheduling
//! decisions come from a [`Scheduler`]; this module only moves time forward.
//!
//! One timeline of events keyed by (time, sequence number), one seeded RNG: the same workload,
//! policy and seed give the same result on every machine.

use std::cmp::Reverse;
use std::collections::VecDeque;

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Exp1};

use crate::cpuset::CpuSet;
use crate::stops::Stops;
use crate::timeline::Timeline;
use crate::workload::{Arrivals, SchedClass, Serve, Socket, Times, Workload};

mod requests;

/// Simulated time in nanoseconds.
pub type Ns = u64;
pub type TaskId = usize;

pub const MS: f64 = 1e6;

pub fn ms(v: f64) -> Ns {
    (v * MS).round() as Ns
}

/// How a task comes onto a run queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Created (starts runnable).
    New,
    /// Woken from sleep or a blocking call.
    Wakeup,
    /// Taken off the CPU by a waking task.
    Preempted,
    /// Used up its slice.
    Expired,
    /// Moved from another CPU's queue by the balancer.
    Migrated,
}

/// What a policy may know about a task.
#[derive(Clone, Debug)]
pub struct TaskInfo {
    pub nice: i32,
    pub class: SchedClass,
    /// Index into the workload's groups + 1; 0 is the root.
    pub group: usize,
    /// eevdf custom slice.
    pub slice: Option<Ns>,
}

/// Asks the CPU to bring `x`'s first cache line in, without waiting for it.
#[inline(always)]
pub(crate) fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint. It reads nothing into the program, cannot fault,
    // and `x` is a valid reference anyway.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((x as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// The scheduling policy: run queues and the choice of what runs.
pub trait Scheduler {
    /// Puts a runnable task on `cpu`'s queue.
    fn enqueue(&mut self, cpu: usize, t: TaskId, now: Ns, how: How, view: &View);
    /// Takes the next task off `cpu`'s queue to run it, if any.
    fn pick(&mut self, cpu: usize, now: Ns, view: &View) -> Option<TaskId>;
    /// How long `t`, just picked, may run before the policy looks again.
    fn slice(&mut self, cpu: usize, t: TaskId, now: Ns, view: &View) -> Ns;
    /// `t` ran `ran` ns on `cpu` (it is still current).
    fn charge(&mut self, cpu: usize, t: TaskId, ran: Ns, now: Ns);
    /// `t` stops running; if `runnable` it goes back on the queue with `how`, else it sleeps.
    fn put_prev(&mut self, cpu: usize, t: TaskId, now: Ns, runnable: Option<How>, view: &View);
    /// Whether the waking `woken`, queued on `cpu`, should preempt `curr` at once.
    fn preempts(&self, cpu: usize, curr: TaskId, woken: TaskId, now: Ns, view: &View) -> bool;
    /// Tasks waiting on `cpu`'s queue (not counting the running one).
    fn nr_queued(&self, cpu: usize) -> usize;
    /// Starts loading what `cpu`'s next pick will likely read, and names the task it
    /// will likely pick, so that the engine loads that task's record too. A hint only:
    /// a wrong guess costs a wasted load, never a different run.
    fn prefetch_next(&self, _cpu: usize) -> Option<TaskId> {
        None
    }
    /// Removes a queued task from `cpu` for the balancer.
    fn steal(&mut self, cpu: usize, now: Ns) -> Option<TaskId>;
    /// A task received a request (from a customer or a call).
    fn on_request(&mut self, _t: TaskId, _now: Ns, _unix: bool, _view: &View) {}
    /// Periodic policy work every `tick()` ns: returns tasks whose priority changed.
    fn tick(&self) -> Option<Ns> {
        None
    }
    fn on_tick(&mut self, _now: Ns, _view: &View) {}
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Runnable,
    Running,
    Sleeping,
    /// Waiting for a callee's answer.
    Blocked,
}

/// What a task does. Boxed where large, so that a task fits a cache line: thousands
/// of CPU-bound tasks cycle through the CPUs and each switch touches one.
#[derive(Clone, Debug)]
enum Kind {
    CpuBound,
    /// Computes, sleeps, again (times from its process's `cycle`).
    Cycle,
    /// The request slots queued behind its head request (`Task::head`). Boxed: a
    /// VecDeque inline (32 bytes) would push a task past one cache line.
    #[allow(clippy::box_collection)]
    Server(Box<VecDeque<u32>>),
    Lock(Box<LockTask>),
}

/// `Task::head` of a task with no request.
const NO_REQUEST: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct LockTask {
    lock: usize,
    compute: Ns,
    hold: Ns,
    exponential: bool,
    holding: bool,
}

/// A lock the `lock` processes contend for, and what it saw.
#[derive(Clone, Debug, Default)]
pub struct Lock {
    pub name: String,
    pub contenders: usize,
    holder: Option<TaskId>,
    /// Since when the holder holds it.
    since: Ns,
    /// Waiters in arrival order, with when they started waiting.
    waiters: VecDeque<(TaskId, Ns)>,
    pub acquisitions: u64,
    pub releases: u64,
    /// Completed waits and holds.
    pub wait_ns: u128,
    pub hold_ns: u128,
    /// The hold in progress when the run ended (for utilization).
    pub open_hold_ns: u128,
}

#[derive(Clone, Debug)]
pub struct Task {
    /// Index of its `[[process]]`.
    pub process: u32,
    pub state: State,
    pub cpu: u32,
    /// Servers: the slot of the request it works on (or is blocked in a call for), and
    /// how many of that request's calls it has made. Kept here, not with the queue
    /// behind it, so that charging a request's CPU and handing an idle server a request
    /// touch this line and the request's, nothing else.
    head: u32,
    stage: u16,
    /// CPU time left in the current segment (until a call, an answer or a sleep).
    remaining: Ns,
    pub cpu_total: Ns,
    kind: Kind,
}
const _: () = assert!(std::mem::size_of::<Task>() == 48);

/// One open customer request and the unhappiness of the processes serving it
/// (the 2010 customer-appeasement paper's §2). Its slot is reused once it is answered.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// Arrival order (the index of its record).
    pub id: u64,
    pub customer: usize,
    pub arrive: Ns,
    pub cpu: Ns,
    /// The call chain: (task, unhappiness). The last entry is the process working on
    /// it (or queued at); the others are blocked callers with their kept share.
    chain: Vec<(TaskId, f64)>,
    /// Since when the top's unhappiness grows, and the CPU it got for this since then.
    top_since: Ns,
    top_cpu: Ns,
}

/// An answered request, as the report needs it.
#[derive(Clone, Copy, Debug)]
pub struct Answered {
    pub id: u64,
    pub customer: usize,
    pub arrive: Ns,
    pub done: Ns,
    pub cpu: Ns,
    /// Elapsed beyond the CPU it needed, in ns, unweighted.
    pub unhappiness: f64,
}

impl Request {
    fn top_value(&self, now: Ns) -> f64 {
        let (_, u) = *self.chain.last().expect("chain is never empty while open");
        // Through i64 (times are far below 2⁶³ ns): one instruction each, not several.
        u + now.saturating_sub(self.top_since) as i64 as f64 - self.top_cpu as i64 as f64
    }

    fn settle_top(&mut self, now: Ns) {
        let v = self.top_value(now);
        self.chain.last_mut().expect("open").1 = v;
        self.top_since = now;
        self.top_cpu = 0;
    }
}

/// What the engine shows a policy.
pub struct View {
    pub tasks: Vec<Task>,
    /// Open requests by slot; `free` lists the slots of answered ones.
    requests: Vec<Request>,
    free: Vec<usize>,
    pub answered: Vec<Answered>,
    /// Requests so far (the next one's id).
    arrived: u64,
    pub cpus: usize,
    /// Tasks runnable but not running, now.
    pub waiting: usize,
    /// Tasks running, now.
    running: usize,
    /// Time during which some task waited for a CPU, so far (PSI "some").
    pub some_waiting_ns: Ns,
    last_psi: Ns,
}

impl View {
    /// The unhappiness `t` holds right now: the requests it works on or has queued.
    pub fn unhappiness(&self, t: TaskId, now: Ns) -> f64 {
        let task = &self.tasks[t];
        let Kind::Server(waiting) = &task.kind else {
            return 0.0;
        };
        (task.head != NO_REQUEST)
            .then_some(task.head)
            .into_iter()
            .chain(waiting.iter().copied())
            .map(|r| &self.requests[r as usize])
            .filter(|r| r.chain.last().map(|c| c.0) == Some(t))
            .map(|r| r.top_value(now))
            .sum()
    }

    /// Requests that arrived and were not answered by the end.
    pub fn unanswered(&self) -> usize {
        self.requests.len() - self.free.len()
    }

    /// Whether `t` holds a request (works on one, queued one, or waits for a callee).
    pub fn holds_request(&self, t: TaskId) -> bool {
        self.tasks[t].head != NO_REQUEST
    }

    /// Tasks runnable or running, from counts: a walk over every task at each of
    /// cfs-rbpe's load samples cost it 12 instructions per event (`make sim-instructions`).
    pub fn runnable(&self) -> usize {
        debug_assert_eq!(
            self.waiting + self.running,
            self.tasks
                .iter()
                .filter(|t| matches!(t.state, State::Runnable | State::Running))
                .count()
        );
        self.waiting + self.running
    }

    fn psi_update(&mut self, now: Ns) {
        if self.waiting > 0 {
            self.some_waiting_ns += now.saturating_sub(self.last_psi);
        }
        self.last_psi = now;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The running task's slice or segment ends (kept in `stops`, never in the heap).
    Stop {
        cpu: usize,
    },
    Arrive {
        customer: usize,
    },
    WakeSleeper {
        task: TaskId,
    },
    Balance,
    Tick,
}

struct Cpu {
    curr: Option<TaskId>,
    since: Ns,
    /// When the running task's slice ends.
    slice_end: Ns,
    busy: Ns,
}

struct CustomerState {
    target: Vec<TaskId>,
    next_target: usize,
    sent: u64,
    exp: Option<Exp<f64>>,
}

/// The outcome of a run, for the report.
pub struct Outcome {
    pub view: View,
    pub events: u64,
    pub duration: Ns,
    pub busy: Vec<Ns>,
    pub locks: Vec<Lock>,
}

/// Generic over the policy, so that each policy's engine is compiled with the policy's
/// methods inlined: a dynamic call per scheduler operation cost the fair class about a
/// tenth of its instructions (`make sim-instructions`).
pub struct Engine<'w, S> {
    w: &'w Workload,
    sched: S,
    view: View,
    cpus: Vec<Cpu>,
    heap: Timeline<Ev>,
    /// The running tasks' stops, ordered with the heap's events by (time, sequence).
    stops: Stops,
    /// CPUs with no running task: the only candidates for an idle CPU.
    vacant: CpuSet,
    /// The balancer's per-CPU task counts (kept to reuse the allocation).
    loads: Vec<usize>,
    seq: u64,
    now: Ns,
    end: Ns,
    events: u64,
    rng: ChaCha8Rng,
    customers: Vec<CustomerState>,
    /// Task indices of each [[process]]'s instances.
    instances: Vec<Vec<TaskId>>,
    next_instance: Vec<usize>,
    balance: Ns,
    locks: Vec<Lock>,
    /// Each process's times in ns, converted once: a server's CPU per segment (before its
    /// first call, between calls, after the last), or a cycler's compute and sleep.
    times: Vec<Vec<Ns>>,
}

/// The tasks of every process's instances, each process's task ids, and the locks they
/// contend for.
fn tasks_of(w: &Workload) -> (Vec<Task>, Vec<Vec<usize>>, Vec<Lock>) {
    let mut all = Vec::new();
    let mut instances = Vec::new();
    let mut locks: Vec<Lock> = Vec::new();
    for (pi, p) in w.process.iter().enumerate() {
        let mut ids = Vec::new();
        for _ in 0..p.count {
            let kind = if p.cycle.is_some() {
                Kind::Cycle
            } else if let Some(l) = &p.lock {
                let lock = locks
                    .iter()
                    .position(|k| k.name == l.name)
                    .unwrap_or_else(|| {
                        locks.push(Lock {
                            name: l.name.clone(),
                            ..Lock::default()
                        });
                        locks.len() - 1
                    });
                locks[lock].contenders += 1;
                Kind::Lock(Box::new(LockTask {
                    lock,
                    compute: ms(l.compute_ms),
                    hold: ms(l.hold_ms),
                    exponential: l.times == Times::Exponential,
                    holding: false,
                }))
            } else if p.serve.is_some() {
                Kind::Server(Box::default())
            } else {
                Kind::CpuBound
            };
            ids.push(all.len());
            all.push(Task {
                process: pi as u32,
                state: State::Sleeping,
                cpu: (all.len() % w.sim.cpus) as u32,
                head: NO_REQUEST,
                stage: 0,
                remaining: 0,
                cpu_total: 0,
                kind,
            });
        }
        instances.push(ids);
    }
    (all, instances, locks)
}

/// Each process's CPU segments, ns: a cycle's run and sleep; a server's CPU between
/// its calls.
fn segment_times(w: &Workload) -> Vec<Vec<Ns>> {
    w.process
        .iter()
        // In the order the task kinds are told apart above (a workload gives each
        // process exactly one behaviour).
        .map(|p| match (&p.cycle, &p.serve) {
            (Some(c), _) => vec![ms(c.cpu_ms), ms(c.sleep_ms)],
            (None, Some(serve)) => {
                let ends: Vec<f64> = serve
                    .calls
                    .iter()
                    .map(|c| c.after_cpu_ms)
                    .chain([serve.cpu_ms])
                    .collect();
                // Converted as differences in ms, as the segments always were.
                std::iter::once(ms(ends[0]))
                    .chain(ends.windows(2).map(|e| ms(e[1] - e[0])))
                    .collect()
            }
            (None, None) => Vec::new(),
        })
        .collect()
}

/// About how many requests the customers send in the simulated time (those with
/// arrival rates; closed-loop ones are not counted), so that the record of answers is
/// allocated once: grown by doubling, it was copied and faulted in again at every step,
/// a few per cent of a 10 s run of 200,000 requests. Capped at 2²⁴ records (768 MiB of
/// address space, taken from the system only as the records are written).
fn expected_requests(w: &Workload) -> usize {
    let seconds = w.sim.duration_ms / 1e3;
    let sent: f64 = w
        .customer
        .iter()
        .map(|c| {
            let n = match c.arrivals {
                Arrivals::Poisson { rate_per_s } => rate_per_s * seconds * 1.05,
                Arrivals::Periodic { period_ms } => w.sim.duration_ms / period_ms + 1.0,
                Arrivals::Closed { .. } => 0.0,
            };
            c.max_requests.map_or(n, |m| n.min(m as f64))
        })
        .sum();
    sent.min((1 << 24) as f64) as usize
}

impl<'w, S: Scheduler> Engine<'w, S> {
    pub fn new(w: &'w Workload, sched: S) -> Self {
        let (all, instances, locks) = tasks_of(w);
        let customers = w
            .customer
            .iter()
            .map(|c| CustomerState {
                target: instances[w.index_of(c.to.get_ref()).expect("checked")].clone(),
                next_target: 0,
                sent: 0,
                exp: match c.arrivals {
                    Arrivals::Poisson { rate_per_s } => Exp::new(rate_per_s / 1e9).ok(),
                    _ => None,
                },
            })
            .collect();
        let times = segment_times(w);
        let cpus = (0..w.sim.cpus)
            .map(|_| Cpu {
                curr: None,
                since: 0,
                slice_end: 0,
                busy: 0,
            })
            .collect();
        Engine {
            w,
            sched,
            view: View {
                tasks: all,
                requests: Vec::new(),
                free: Vec::new(),
                answered: Vec::with_capacity(expected_requests(w)),
                arrived: 0,
                cpus: w.sim.cpus,
                waiting: 0,
                running: 0,
                some_waiting_ns: 0,
                last_psi: 0,
            },
            cpus,
            heap: Timeline::new(),
            stops: Stops::new(w.sim.cpus),
            vacant: CpuSet::full(w.sim.cpus),
            loads: Vec::new(),
            seq: 0,
            now: 0,
            end: ms(w.sim.duration_ms),
            events: 0,
            rng: ChaCha8Rng::seed_from_u64(w.sim.seed),
            customers,
            next_instance: vec![0; instances.len()],
            instances,
            balance: ms(w.tunables.balance_ms),
            locks,
            times,
        }
    }

    fn push(&mut self, at: Ns, ev: Ev) {
        self.seq += 1;
        self.heap.push(at, self.seq, ev);
    }

    /// The task running on `cpu` stops at `at` (replacing any earlier stop).
    fn set_stop(&mut self, cpu: usize, at: Ns) {
        self.seq += 1;
        self.stops.set(cpu, (at, self.seq));
    }

    /// The next event: a CPU's stop or the heap's first, whichever is earlier.
    fn next_event(&mut self) -> Option<(Ns, Ev)> {
        let heap = self.heap.peek();
        match self.stops.first() {
            // Left in place: handling it replaces or clears it.
            Some((stop, cpu)) if heap.is_none_or(|h| stop < h) => Some((stop.0, Ev::Stop { cpu })),
            _ => self.heap.pop(),
        }
    }

    /// Kept out of line: `make sim-instructions` counts the instructions spent in it.
    #[inline(never)]
    pub fn run(mut self) -> Outcome {
        // Start: CPU-bound and cycling tasks are runnable; servers wait for requests.
        for t in 0..self.view.tasks.len() {
            let task = &mut self.view.tasks[t];
            match &task.kind {
                Kind::CpuBound => task.remaining = Ns::MAX,
                Kind::Cycle => {
                    let c = self.cycle(t).0;
                    self.view.tasks[t].remaining = c;
                }
                Kind::Lock(l) => {
                    let (compute, exponential) = (l.compute, l.exponential);
                    let d = self.draw(compute, exponential);
                    self.view.tasks[t].remaining = d;
                }
                Kind::Server { .. } => continue,
            }
            let cpu = self.view.tasks[t].cpu as usize;
            self.make_runnable(t, cpu, How::New);
        }
        for c in 0..self.customers.len() {
            let at = ms(self.w.customer[c].start_ms);
            self.push(at, Ev::Arrive { customer: c });
        }
        if self.w.sim.cpus > 1 {
            self.push(self.balance, Ev::Balance);
        }
        if let Some(t) = self.sched.tick() {
            self.push(t, Ev::Tick);
        }
        for cpu in 0..self.cpus.len() {
            self.schedule(cpu);
        }
        while let Some((at, ev)) = self.next_event() {
            if at > self.end {
                break;
            }
            self.now = at;
            self.events += 1;
            match ev {
                Ev::Stop { cpu } => {
                    let fired = self.stops.get(cpu);
                    self.stop(cpu);
                    // Every path re-arms or clears the stop; else it would fire forever.
                    debug_assert_ne!(self.stops.get(cpu), fired, "stop of cpu {cpu} not handled");
                }
                Ev::Arrive { customer } => self.arrive(customer),
                Ev::WakeSleeper { task } => {
                    let cpu = self.select_cpu(task);
                    self.wake(task, cpu);
                }
                Ev::Balance => {
                    self.balance_all();
                    self.push(self.now + self.balance, Ev::Balance);
                }
                Ev::Tick => {
                    self.sched.on_tick(self.now, &self.view);
                    if let Some(t) = self.sched.tick() {
                        self.push(self.now + t, Ev::Tick);
                    }
                }
            }
        }
        // Account what ran up to the end.
        self.now = self.end;
        for cpu in 0..self.cpus.len() {
            if let Some(t) = self.cpus[cpu].curr {
                let ran = self.end.saturating_sub(self.cpus[cpu].since);
                self.account(cpu, t, ran);
            }
        }
        self.view.psi_update(self.end);
        for l in &mut self.locks {
            if l.holder.is_some() {
                l.open_hold_ns = (self.end - l.since) as u128;
            }
        }
        Outcome {
            events: self.events,
            duration: self.end,
            busy: self.cpus.iter().map(|c| c.busy).collect(),
            view: self.view,
            locks: self.locks,
        }
    }

    /// CPU time `ran` for the task running on `cpu`: the task, its request, the policy.
    /// (This and the other steps of a switch are inlined: as calls they cost 3 % of busy
    /// cfs's instructions per event, docs/RESULTS.md.)
    #[inline(always)]
    fn account(&mut self, cpu: usize, t: TaskId, ran: Ns) {
        self.cpus[cpu].busy += ran;
        self.cpus[cpu].since = self.now;
        let task = &mut self.view.tasks[t];
        task.cpu_total += ran;
        task.remaining = task.remaining.saturating_sub(ran);
        if task.head != NO_REQUEST {
            let r = &mut self.view.requests[task.head as usize];
            r.cpu += ran;
            r.top_cpu += ran;
        }
        self.sched.charge(cpu, t, ran, self.now);
    }

    /// The running task's slice or segment ended.
    fn stop(&mut self, cpu: usize) {
        let t = self.cpus[cpu]
            .curr
            .expect("a stop event has a running task");
        let ran = self.now - self.cpus[cpu].since;
        self.account(cpu, t, ran);
        if self.view.tasks[t].remaining > 0 {
            self.off_cpu(cpu, t, Some(How::Expired));
        } else {
            self.segment_done(cpu, t);
        }
        self.schedule(cpu);
    }

    #[inline(always)]
    fn off_cpu(&mut self, cpu: usize, t: TaskId, runnable: Option<How>) {
        debug_assert!(self.cpus[cpu].curr.is_some());
        self.cpus[cpu].curr = None;
        self.view.running -= 1;
        // Its stop stays until `schedule`, which always follows, replaces or clears it.
        self.vacant.insert(cpu);
        let task = &mut self.view.tasks[t];
        task.state = if runnable.is_some() {
            State::Runnable
        } else {
            task.state
        };
        if runnable.is_some() {
            self.view.psi_update(self.now);
            self.view.waiting += 1;
        }
        self.sched.put_prev(cpu, t, self.now, runnable, &self.view);
    }

    /// `t` (running on `cpu`) reached the end of a segment.
    fn segment_done(&mut self, cpu: usize, t: TaskId) {
        let task = &mut self.view.tasks[t];
        match &mut task.kind {
            Kind::CpuBound => {
                task.remaining = Ns::MAX;
                self.keep_running(cpu, t);
            }
            Kind::Cycle => {
                let (c, sleep) = self.cycle(t);
                let task = &mut self.view.tasks[t];
                task.remaining = c;
                task.state = State::Sleeping;
                self.off_cpu(cpu, t, None);
                self.push(self.now + sleep, Ev::WakeSleeper { task: t });
            }
            Kind::Server { .. } => {
                self.view.tasks[t].state = State::Sleeping;
                self.off_cpu(cpu, t, None);
                self.server_progress(t);
            }
            Kind::Lock(l) => {
                let l = **l;
                if l.holding {
                    self.release(cpu, t, l);
                } else if self.locks[l.lock].holder.is_none() {
                    self.grant(t, l.lock, self.now);
                    self.keep_running(cpu, t);
                } else {
                    self.locks[l.lock].waiters.push_back((t, self.now));
                    self.view.tasks[t].state = State::Blocked;
                    self.off_cpu(cpu, t, None);
                }
            }
        }
    }

    /// A cycling task's compute and sleep times.
    fn cycle(&self, t: TaskId) -> (Ns, Ns) {
        let times = &self.times[self.view.tasks[t].process as usize];
        (times[0], times[1])
    }

    /// A time with mean `mean`: itself, or drawn from the exponential distribution.
    fn draw(&mut self, mean: Ns, exponential: bool) -> Ns {
        if !exponential {
            return mean;
        }
        let x: f64 = self.rng.sample(Exp1);
        ((x * mean as f64) as Ns).max(1)
    }

    /// `t` goes on running on `cpu` with new work, to the end of its slice.
    fn keep_running(&mut self, cpu: usize, t: TaskId) {
        let end = self.cpus[cpu].slice_end;
        if end <= self.now {
            self.off_cpu(cpu, t, Some(How::Expired));
            return;
        }
        let remaining = self.view.tasks[t].remaining;
        self.set_stop(cpu, end.min(self.now.saturating_add(remaining)));
    }

    /// Where a waking task goes: its last CPU if idle, else any idle CPU, else its last.
    #[inline(always)]
    fn select_cpu(&self, t: TaskId) -> usize {
        let prev = self.view.tasks[t].cpu as usize;
        if self.cpus[prev].curr.is_none() && self.sched.nr_queued(prev) == 0 {
            return prev;
        }
        if self.vacant.is_empty() {
            return prev; // every CPU runs something: a busy host's usual case
        }
        self.vacant
            .after(prev)
            .find(|&c| self.sched.nr_queued(c) == 0)
            .unwrap_or(prev)
    }

    #[inline(always)]
    fn make_runnable(&mut self, t: TaskId, cpu: usize, how: How) {
        let task = &mut self.view.tasks[t];
        task.state = State::Runnable;
        task.cpu = cpu as u32;
        self.view.psi_update(self.now);
        self.view.waiting += 1;
        self.sched.enqueue(cpu, t, self.now, how, &self.view);
    }

    fn wake(&mut self, t: TaskId, cpu: usize) {
        self.make_runnable(t, cpu, How::Wakeup);
        match self.cpus[cpu].curr {
            None => self.schedule(cpu),
            Some(curr) => {
                if self.sched.preempts(cpu, curr, t, self.now, &self.view) {
                    let ran = self.now - self.cpus[cpu].since;
                    self.account(cpu, curr, ran);
                    if self.view.tasks[curr].remaining == 0 {
                        self.segment_done(cpu, curr);
                    } else {
                        self.off_cpu(cpu, curr, Some(How::Preempted));
                    }
                    self.schedule(cpu);
                }
            }
        }
    }

    /// Puts the policy's next task on an idle `cpu`, pulling one from the busiest CPU
    /// if its own queue is empty.
    #[inline(always)]
    fn schedule(&mut self, cpu: usize) {
        if self.cpus[cpu].curr.is_some() {
            return;
        }
        if self.sched.nr_queued(cpu) == 0 {
            self.idle_pull(cpu);
        }
        let Some(t) = self.sched.pick(cpu, self.now, &self.view) else {
            self.stops.clear(cpu);
            return;
        };
        self.view.psi_update(self.now);
        self.view.waiting -= 1;
        let task = &mut self.view.tasks[t];
        task.state = State::Running;
        task.cpu = cpu as u32;
        let remaining = task.remaining;
        let slice = self.sched.slice(cpu, t, self.now, &self.view).max(1);
        self.view.running += 1;
        let c = &mut self.cpus[cpu];
        c.curr = Some(t);
        c.since = self.now;
        c.slice_end = self.now.saturating_add(slice);
        self.vacant.remove(cpu);
        self.set_stop(cpu, self.now.saturating_add(slice.min(remaining)));
        // The next pick here is a slice away; its first reads of a task that has
        // waited behind a hundred others missed the cache (busy host: cfs-rbpe +4 %).
        if let Some(next) = self.sched.prefetch_next(cpu) {
            prefetch(&self.view.tasks[next]);
        }
    }

    fn idle_pull(&mut self, cpu: usize) {
        let busiest = (0..self.cpus.len())
            .filter(|&c| c != cpu)
            .max_by_key(|&c| (self.sched.nr_queued(c), Reverse(c)));
        if let Some(from) = busiest {
            if self.sched.nr_queued(from) > 0 {
                if let Some(t) = self.sched.steal(from, self.now) {
                    self.view.tasks[t].cpu = cpu as u32;
                    self.sched
                        .enqueue(cpu, t, self.now, How::Migrated, &self.view);
                }
            }
        }
    }

    /// Periodic balancing by task count: from the busiest CPU to the idlest until they
    /// differ by at most one.
    fn balance_all(&mut self) {
        let load_of = |e: &Self, c: usize| e.sched.nr_queued(c) + e.cpus[c].curr.is_some() as usize;
        let n = self.cpus.len();
        // Read once; a move changes only the two CPUs involved.
        let mut load = std::mem::take(&mut self.loads);
        load.clear();
        load.extend((0..n).map(|c| load_of(self, c)));
        for _ in 0..n {
            // The most loaded CPU and the least, the lowest-numbered of equals: one pass.
            let (mut max, mut min) = (0, 0);
            for (c, &l) in load.iter().enumerate() {
                if l > load[max] {
                    max = c;
                }
                if l < load[min] {
                    min = c;
                }
            }
            if load[max] < load[min] + 2 || self.sched.nr_queued(max) == 0 {
                break;
            }
            let Some(t) = self.sched.steal(max, self.now) else {
                break;
            };
            self.view.tasks[t].cpu = min as u32;
            self.sched
                .enqueue(min, t, self.now, How::Migrated, &self.view);
            self.schedule(min);
            load[max] = load_of(self, max);
            load[min] = load_of(self, min);
        }
        self.loads = load;
    }
}
