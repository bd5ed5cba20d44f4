//! Requests through the engine: customers' arrivals, delivery to a server's instance,
//! servers working through their requests and calls, and the locks they take.

use super::*;

impl<'w, S: Scheduler> Engine<'w, S> {
    /// `t` takes `lock`, having waited since `since`, and starts its hold.
    pub(super) fn grant(&mut self, t: TaskId, lock: usize, since: Ns) {
        let Kind::Lock(ref l) = self.view.tasks[t].kind else {
            unreachable!("only lock tasks take locks")
        };
        let hold = self.draw(l.hold, l.exponential);
        let k = &mut self.locks[lock];
        k.holder = Some(t);
        k.since = self.now;
        k.acquisitions += 1;
        k.wait_ns += (self.now - since) as u128;
        let task = &mut self.view.tasks[t];
        task.remaining = hold;
        if let Kind::Lock(l) = &mut task.kind {
            l.holding = true;
        }
    }

    /// `t` (running on `cpu`) ends its hold: the next waiter takes the lock and `t`
    /// computes on.
    pub(super) fn release(&mut self, cpu: usize, t: TaskId, l: LockTask) {
        let k = &mut self.locks[l.lock];
        k.holder = None;
        k.releases += 1;
        k.hold_ns += (self.now - k.since) as u128;
        let next = k.waiters.pop_front();
        let compute = self.draw(l.compute, l.exponential);
        let task = &mut self.view.tasks[t];
        task.remaining = compute;
        if let Kind::Lock(me) = &mut task.kind {
            me.holding = false;
        }
        // Re-arm `t` first: the waiter's wake-up may preempt it.
        self.keep_running(cpu, t);
        if let Some((w, since)) = next {
            self.grant(w, l.lock, since);
            self.view.tasks[w].state = State::Sleeping;
            let to = self.select_cpu(w);
            self.wake(w, to);
        }
    }

    /// What server task `t` does per request (from the workload, not from `self`).
    fn serve_of(&self, t: TaskId) -> &'w Serve {
        self.w.process[self.view.tasks[t].process as usize]
            .serve
            .as_ref()
            .expect("a server task's process serves")
    }

    /// Server task `t`'s requests queued behind its head.
    fn waiting(&mut self, t: TaskId) -> &mut VecDeque<u32> {
        let Kind::Server(waiting) = &mut self.view.tasks[t].kind else {
            unreachable!("checked: requests go to servers")
        };
        waiting
    }

    /// A server's current request reached a call or its end: issue the call, or answer
    /// and start on the next; makes `t` runnable if it has work, else leaves it asleep.
    pub(super) fn server_progress(&mut self, t: TaskId) {
        loop {
            let serve = self.serve_of(t);
            let task = &self.view.tasks[t];
            if task.head == NO_REQUEST {
                return;
            }
            let (req, stage_now) = (task.head as usize, task.stage as usize);
            // Boundaries: after each call's after_cpu_ms, then the end.
            if stage_now < serve.calls.len() {
                // Done with the part before call `stage_now`: call.
                let call = &serve.calls[stage_now];
                let callee_proc = self.w.index_of(call.to.get_ref()).expect("checked");
                let callee = self.pick_instance(callee_proc);
                self.view.tasks[t].state = State::Blocked;
                let alpha = self.w.sim.alpha;
                let r = &mut self.view.requests[req];
                r.settle_top(self.now);
                let u = r.chain.last().expect("open").1;
                r.chain.last_mut().expect("open").1 = alpha * u;
                r.chain.push((callee, (1.0 - alpha) * u));
                self.deliver(callee, req, Some(t), false);
                return;
            }
            // The request is done here: the next waiting one becomes the head.
            let next = self.waiting(t).pop_front().unwrap_or(NO_REQUEST);
            let task = &mut self.view.tasks[t];
            (task.head, task.stage) = (next, 0);
            let r = &mut self.view.requests[req];
            r.settle_top(self.now);
            // The chain's entry below this server's is the caller's, if it was called.
            let caller = r.chain.len().checked_sub(2).map(|i| r.chain[i].0);
            match caller {
                Some(caller) => {
                    let (_, u) = r.chain.pop().expect("callee on the chain");
                    r.chain.last_mut().expect("caller on the chain").1 += u;
                    r.top_since = self.now;
                    r.top_cpu = 0;
                    self.resume_caller(caller);
                }
                None => {
                    let (_, unhappiness) = r.chain.pop().expect("open");
                    let c = r.customer;
                    self.view.answered.push(Answered {
                        id: r.id,
                        customer: c,
                        arrive: r.arrive,
                        done: self.now,
                        cpu: r.cpu,
                        unhappiness,
                    });
                    self.view.free.push(req);
                    if let Arrivals::Closed { think_ms } = self.w.customer[c].arrivals {
                        self.push(self.now + ms(think_ms), Ev::Arrive { customer: c });
                    }
                }
            }
            if self.start_head(t) {
                return;
            }
        }
    }

    /// Sets up the head request's first segment; true if `t` now has CPU work.
    fn start_head(&mut self, t: TaskId) -> bool {
        let task = &mut self.view.tasks[t];
        if task.head == NO_REQUEST {
            return false;
        }
        task.stage = 0;
        task.remaining = self.times[task.process as usize][0];
        if task.remaining == 0 {
            return false; // a call or answer right away: the caller loops
        }
        let cpu = self.select_cpu(t);
        self.wake(t, cpu);
        true
    }

    /// The callee answered: the caller goes on with its next segment.
    fn resume_caller(&mut self, caller: TaskId) {
        let task = &mut self.view.tasks[caller];
        task.stage += 1;
        task.remaining = self.times[task.process as usize][task.stage as usize];
        task.state = State::Sleeping;
        if self.view.tasks[caller].remaining == 0 {
            self.server_progress(caller);
        } else {
            let cpu = self.select_cpu(caller);
            self.wake(caller, cpu);
        }
    }

    fn pick_instance(&mut self, process: usize) -> TaskId {
        let ids = &self.instances[process];
        let i = self.next_instance[process] % ids.len();
        self.next_instance[process] += 1;
        ids[i]
    }

    /// A request (from a customer, or a call) reaches server task `t`.
    fn deliver(&mut self, t: TaskId, req: usize, caller: Option<TaskId>, unix: bool) {
        self.sched
            .on_request(t, self.now, unix || caller.is_some(), &self.view);
        let task = &mut self.view.tasks[t];
        if task.head != NO_REQUEST {
            self.waiting(t).push_back(req as u32);
            return;
        }
        task.head = req as u32;
        if task.state == State::Sleeping && !self.start_head(t) {
            self.server_progress(t);
        }
    }

    pub(super) fn arrive(&mut self, c: usize) {
        let def = &self.w.customer[c];
        let st = &mut self.customers[c];
        if def.max_requests.is_some_and(|m| st.sent >= m) {
            return;
        }
        st.sent += 1;
        let n = st.target.len();
        let target = st.target[st.next_target];
        st.next_target = if st.next_target + 1 == n {
            0
        } else {
            st.next_target + 1
        };
        let next = match def.arrivals {
            Arrivals::Poisson { .. } => {
                let gap = st.exp.as_ref().expect("poisson").sample(&mut self.rng);
                Some(self.now + gap.max(1.0) as Ns)
            }
            Arrivals::Periodic { period_ms } => Some(self.now + ms(period_ms)),
            Arrivals::Closed { .. } => None, // after the answer
        };
        if let Some(at) = next {
            self.push(at, Ev::Arrive { customer: c });
        }
        let req = self.view.free.pop().unwrap_or_else(|| {
            self.view.requests.push(Request::default());
            self.view.requests.len() - 1
        });
        let r = &mut self.view.requests[req];
        // The slot's chain keeps its capacity: no allocation per request.
        r.chain.clear();
        r.chain.push((target, 0.0));
        r.id = self.view.arrived;
        self.view.arrived += 1;
        r.customer = c;
        r.arrive = self.now;
        r.cpu = 0;
        r.top_since = self.now;
        r.top_cpu = 0;
        self.deliver(target, req, None, def.socket == Socket::Unix);
    }
}
