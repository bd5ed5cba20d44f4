// SPDX-License-Identifier: GPL-2.0
/*
 * appease probe. A request is a socket receive returning > 0 bytes (read, readv,
 * recv*, all of which end in sock_recvmsg and its sock_recv_length tracepoint), so
 * file reads never run this code, on any socket but the side of a stream connection
 * its process connected: what a client reads there is the response to its own request
 * (a dump reading a database, a download, a load generator). One event per thread per quiet period: the
 * per-thread timestamp of the last reported request lives in task storage and
 * filters the rest in the kernel. A task iterator gives the daemon's scan the process
 * table without reading /proc.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "intf.h"

char LICENSE[] SEC("license") = "GPL";

#define MSG_PEEK 2
#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10
#define PF_KTHREAD 0x00200000
#define SCHED_IDLE 5

/* Set by user space before load. */
const volatile u64 min_gap_ns = 20 * 1000 * 1000;
/* A request after this much quiet wakes the daemon at once; requests of a thread that
 * is already busy are read at the daemon's next tick (fewer wakeups under load). */
const volatile u64 wake_after_ns = 40 * 1000 * 1000;
const volatile u32 self_tgid = 0;
/* The inode of appease's PID namespace when it is not the initial one (a system container
 * whose PID 1 is its service manager): events and records then carry IDs as that
 * namespace numbers them, and tasks it cannot see are left out. 0: the initial namespace,
 * whose IDs are the task's own fields (and no other code runs). */
const volatile u32 pid_ns_inum = 0;
/* A thread whose last reported request is less than this old serves a customer now (a
 * busy thread's reads are reported min_gap_ns apart, so its last read is younger still):
 * its lock waits are reported when its application has sunk threads (0: none is). */
const volatile u64 serving_window_ns = 0;

/* A thread the daemon holds (elevated, or its budget spent) has its requests read at
 * the daemon's tick: the time and CPU time of its latest request stay in its state
 * (latest_request_ns, request_cpu_ns), which read_cpu hands to the tick, and an event
 * comes at most once per held_gap_ns (at 256 busy connections, events were most of the
 * daemon's work). Set by the daemon, at load and after (a kernel that cannot run
 * read_cpu wants the events more often). */
u64 held_gap_ns = 0;

/* Request events of unprivileged users (effective uid >= uid_min) are bounded, each
 * user's and all such users' together, so that a user's thousands of threads reading
 * socketpairs cannot flood the daemon; the servers of root and system accounts are never
 * held back. An event costs this much of a second's allowance (0: no bound). */
const volatile u32 uid_min = 1000;
const volatile u64 user_event_cost_ns = 0;
const volatile u64 users_event_cost_ns = 0;

/* Set by user space at run time: exec events are wanted only while one of them can
 * change a decision (another engine's parent made idle). */
u32 want_exec = 0;

/* Makes the event type visible in the skeleton's BTF. */
struct appease_event _event_type = {};
struct appease_task _task_type = {};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, APPEASE_NR_COUNTERS);
	__type(key, u32);
	__type(value, u64);
} counters SEC(".maps");

struct thread_state {
	u64 last_request_ns; /* the last reported request */
	/* The last socket found to be a connected side, and when: a client's further reads
	 * of it within the quiet period cost what a busy server's do. Within that period a
	 * freed socket's memory taken by an accepted one hides at most its first reads. */
	u64 response_sk;
	u64 last_response_ns;
	u32 waiting_app;     /* while in a reported lock wait: its application + 1 */
	/* Its latest request, reported or not (a held thread's are reported at most every
	 * held_gap_ns), and its CPU time then: a lock wait serves a customer from that
	 * request on, and the daemon's tick times a long request from it. */
	u64 latest_request_ns;
	u64 request_cpu_ns;
};

/* Freed by the kernel with the task: no stale entries, no recycled tids. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

/* TCP sockets on the side that connected, marked as they become established: the kernel
 * knows then that the socket completed a handshake it started (SYN_SENT), not one it was
 * asked for (SYN_RECV). Only that side is marked: an accepted socket reads requests as
 * an unmarked one does, and a busy server's accepts allocate nothing. The mark lives and
 * dies with the socket. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, u32);
} tcp_connected SEC(".maps");

/* Processes (their leaders) that listened on a TCP socket: a server's, even before its
 * first request (the scan tells a supervisor of servers from a script this way). */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, u32);
} listeners SEC(".maps");

/* Threads the daemon holds elevated, or whose application's budget is spent, marked from
 * user space by a pidfd of the thread: a request of theirs after a quiet spell only keeps
 * an elevation already there, or raises nothing, so it waits for the daemon's next tick
 * rather than wake it (a database's hundreds of busy backends would wake it a thousand
 * times a second). */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, u32);
} held SEC(".maps");

/* A process's application: the server whose fork made it (a per-connection worker, a
 * CGI child), inherited down its tree; a process with no entry is its own application. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, u32);
} apps SEC(".maps");

/* Applications with sunk threads (set by the daemon), and how many of their serving
 * threads wait on a lock now (kept here). */
struct app_waits {
	u32 sunk;
	u32 waiting;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct app_waits);
} sunk_apps SEC(".maps");

/* A token bucket in time: what is left of a second's allowance, and when it was last
 * topped up. Two CPUs may update one at once: the bound is then a little loose, never
 * a reason to drop a server's request. */
struct allowance {
	u64 at_ns;
	u64 left_ns;
};

#define NS_PER_S 1000000000ULL

/* Each unprivileged user's allowance (the least recently used forgotten first). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct allowance);
} user_allowance SEC(".maps");

/* All unprivileged users' together. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct allowance);
} users_allowance SEC(".maps");

/* Spends `cost` of `a` at `now` if a second's allowance holds it. `now` may be older than
 * the last top-up (read on another CPU since): then nothing is added, and the top-up's
 * time is never moved back. */
static __always_inline bool spend(struct allowance *a, u64 now, u64 cost)
{
	u64 left = a->left_ns;
	if (now > a->at_ns) {
		u64 gap = now - a->at_ns;
		left = gap >= NS_PER_S ? NS_PER_S : left + gap;
		a->at_ns = now;
	}
	if (left > NS_PER_S)
		left = NS_PER_S;
	if (left < cost) {
		a->left_ns = left;
		return false;
	}
	a->left_ns = left - cost;
	return true;
}

/* Whether `uid` is an unprivileged user's: from uid_min on, but for nobody and systemd's
 * dynamic service users (as appease_config::unprivileged says). */
static __always_inline bool unprivileged(u32 uid)
{
	return uid >= uid_min && uid != 65534 && (uid < 61184 || uid > 65519);
}

/* Whether a request of `uid` may be reported now. */
static __always_inline bool within_bounds(u32 uid, u64 now)
{
	if ((!user_event_cost_ns && !users_event_cost_ns) || !unprivileged(uid))
		return true;
	if (user_event_cost_ns) {
		struct allowance *a = bpf_map_lookup_elem(&user_allowance, &uid);
		if (!a) {
			struct allowance fresh = { .at_ns = now, .left_ns = NS_PER_S };
			bpf_map_update_elem(&user_allowance, &uid, &fresh, BPF_NOEXIST);
			a = bpf_map_lookup_elem(&user_allowance, &uid);
			if (!a)
				return false;
		}
		if (!spend(a, now, user_event_cost_ns))
			return false;
	}
	if (users_event_cost_ns) {
		u32 zero = 0;
		struct allowance *all = bpf_map_lookup_elem(&users_allowance, &zero);
		if (!all || !spend(all, now, users_event_cost_ns))
			return false;
	}
	return true;
}

static __always_inline u32 euid_of(struct task_struct *t)
{
	return BPF_CORE_READ(t, cred, euid.val);
}

/* How many nesting levels of PID namespaces are searched for appease's. */
#define MAX_PID_LEVELS 8

/* Level + 1 of appease's PID namespace, learnt from the first task met in it (a namespace
 * has one level): later lookups read that level's number alone. */
u32 pid_ns_level1 = 0;

/* The number `p` has at `level` if that level is appease's namespace, else 0. */
static __always_inline u32 nr_at(struct pid *p, u32 level)
{
	struct upid up = {};
	u64 at = (u64)p + bpf_core_field_offset(struct pid, numbers) + level * sizeof(up);
	if (bpf_probe_read_kernel(&up, sizeof(up), (void *)at))
		return 0;
	return BPF_CORE_READ(up.ns, ns.inum) == pid_ns_inum ? up.nr : 0;
}

/* The number `p` has in appease's PID namespace, 0 if it has none there (a task outside
 * it). A pid holds one number per level from the initial namespace down to its own. */
static __always_inline u32 nr_in_ns(struct pid *p)
{
	if (!p)
		return 0;
	unsigned int level = BPF_CORE_READ(p, level);
	u32 known = pid_ns_level1;
	if (known)
		return known - 1 <= level ? nr_at(p, known - 1) : 0;
	for (u32 i = 0; i < MAX_PID_LEVELS && i <= level; i++) {
		u32 nr = nr_at(p, i);
		if (nr) {
			pid_ns_level1 = i + 1;
			return nr;
		}
	}
	return 0;
}

/* A thread's and its process's IDs as appease names them (0: not in its namespace). */
static __always_inline u32 tid_of(struct task_struct *t)
{
	return pid_ns_inum ? nr_in_ns(t->thread_pid) : t->pid;
}

static __always_inline u32 tgid_of(struct task_struct *t)
{
	return pid_ns_inum ? nr_in_ns(t->group_leader->thread_pid) : t->tgid;
}

static __always_inline u32 app_of(struct task_struct *t)
{
	/* Read first: a select between two pointers and one load is refused by the verifier. */
	u32 own = tgid_of(t);
	barrier_var(own);
	u32 *app = bpf_task_storage_get(&apps, t->group_leader, 0, 0);
	return app ? *app : own;
}

static __always_inline void count(u32 idx)
{
	u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		(*v)++;
}

/* Whether the task's process leads its session (setsid) and is scheduled in an autogroup
 * (it is in the root CPU cgroup, autogroups on): a top-level scheduling entity of its
 * own, as a connection's worker that made a session for it is (PostgreSQL's backends).
 * Read here, the daemon reads neither /proc's stat nor cgroup file per new process. */
static __always_inline u32 leads_own_autogroup(struct task_struct *t)
{
	struct signal_struct *sig = t->signal;
	if (!sig || !sig->leader)
		return 0;
	struct task_group *tg = t->sched_task_group;
	if (!tg || !bpf_core_field_exists(tg->autogroup))
		return 0;
	return BPF_CORE_READ(tg, autogroup) != NULL;
}

static __always_inline struct appease_event *reserve(struct task_struct *t, u32 kind)
{
	struct appease_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(APPEASE_CNT_LOST);
		return NULL;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->cpu_ns = t->se.sum_exec_runtime;
	e->kind = kind;
	e->pid = tgid_of(t);
	e->tid = tid_of(t);
	e->ppid = 0;
	e->bytes = 0;
	e->family = 0;
	e->woke = 0;
	e->app = app_of(t);
	e->start_ns = t->start_boottime;
	e->proc_start_ns = t->group_leader->start_boottime;
	e->uid = euid_of(t);
	e->own_autogroup = 0;
	bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), t->comm);
	bpf_probe_read_kernel_str(e->proc_comm, sizeof(e->proc_comm), t->group_leader->comm);
	return e;
}

/* Whether a read on `sk` is a client's: the side of a stream connection that connected.
 * TCP: the mark made when the connection was established (none for connections older
 * than the probe: those count as requests, as before). UNIX: the side a server accepted
 * carries the listening socket's address and its peer none; the side that connected has
 * none and its peer one. A socketpair (neither has one), a client that bound an address
 * of its own (both have one) and every datagram socket count as requests: a datagram
 * server (DNS, QUIC) is seen by what it receives on its bound socket. */
static __always_inline int connected_side(struct sock *sk, u16 family)
{
	u16 type = sk->sk_type;
	if (type != SOCK_STREAM && type != SOCK_SEQPACKET)
		return 0;
	if (family == AF_UNIX) {
		struct unix_sock *u = bpf_skc_to_unix_sock(sk);
		if (!u || u->addr)
			return 0;
		/* The peer is read, not converted: a pointer walked from u is untrusted
		 * to the verifier of newer kernels, which refuse it to bpf_skc_to_unix_sock. */
		struct unix_sock *peer = (struct unix_sock *)BPF_CORE_READ(u, peer);
		return peer && BPF_CORE_READ(peer, addr);
	}
	if (sk->sk_protocol != IPPROTO_TCP)
		return 0;
	return bpf_sk_storage_get(&tcp_connected, sk, 0, 0) != NULL;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(on_sock_recv, struct sock *sk, int ret, int flags)
{
	if (ret <= 0 || (flags & MSG_PEEK))
		return 0;
	struct task_struct *t = bpf_get_current_task_btf();
	if (t->flags & PF_KTHREAD)
		return 0;
	if (pid_ns_inum) {
		/* Outside appease's namespace: another container's, or the host's. */
		u32 tgid = tgid_of(t);
		if (!tgid || tgid == self_tgid)
			return 0;
	} else if (self_tgid && t->tgid == self_tgid) {
		return 0;
	}
	/* Customers arrive on UNIX and IP sockets; netlink and the like are not requests. */
	u16 family = sk ? sk->__sk_common.skc_family : 0;
	if (family != AF_UNIX && family != AF_INET && family != AF_INET6)
		return 0;
	count(APPEASE_CNT_SOCKET_READS);

	u64 now = bpf_ktime_get_ns();
	struct thread_state *st = bpf_task_storage_get(&threads, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!st)
		return 0;
	u64 quiet = st->last_request_ns ? now - st->last_request_ns : ~0ULL;
	if (quiet < min_gap_ns)
		return 0;
	/* After the per-thread filter: a busy server's reads never pay for this; a client's
	 * pay it once per socket per quiet period. */
	if (st->response_sk == (u64)sk && now - st->last_response_ns < min_gap_ns)
		return 0;
	if (connected_side(sk, family)) {
		st->response_sk = (u64)sk;
		st->last_response_ns = now;
		count(APPEASE_CNT_RESPONSES);
		return 0;
	}
	st->latest_request_ns = now;
	st->request_cpu_ns = t->se.sum_exec_runtime;
	if (quiet < held_gap_ns && bpf_task_storage_get(&held, t, 0, 0))
		return 0;
	/* Not muted by a refusal: the thread's next read is weighed again. */
	u32 uid = euid_of(t);
	if (!within_bounds(uid, now)) {
		count(APPEASE_CNT_THROTTLED);
		return 0;
	}

	struct appease_event *e = reserve(t, APPEASE_EV_REQUEST);
	/* A lost event mutes nobody: the thread's next request is reported. */
	if (!e)
		return 0;
	st->last_request_ns = now;
	e->bytes = ret;
	e->family = family;
	e->own_autogroup = leads_own_autogroup(t);
	/* A user's request is read at the daemon's next tick, as a busy thread's is: a user's
	 * threads cannot wake the real-time daemon (ahead of every server) at will. */
	e->woke = quiet >= wake_after_ns && !(user_event_cost_ns && unprivileged(uid));
	if (e->woke && bpf_task_storage_get(&held, t, 0, 0)) {
		e->woke = 0;
		count(APPEASE_CNT_HELD);
	}
	if (e->woke)
		count(APPEASE_CNT_WOKE);
	bpf_ringbuf_submit(e, e->woke ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
	count(APPEASE_CNT_REQUESTS);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	if (!want_exec || (pid_ns_inum && !tgid_of(p)))
		return 0;
	struct appease_event *e = reserve(p, APPEASE_EV_EXEC);
	/* Not urgent: read at the daemon's next wakeup, so a build's execs wake nobody. */
	if (e)
		bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	/* Only threads that ever received a request: the daemon knows no other (the rest
	 * of a host's exits, a build's thousands a second, would fill the ring). A client's
	 * threads have state too, with no request in it. */
	struct thread_state *st = bpf_task_storage_get(&threads, p, 0, 0);
	if (!st || !st->last_request_ns)
		return 0;
	struct appease_event *e = reserve(p, APPEASE_EV_EXIT);
	if (e)
		bpf_ringbuf_submit(e, 0);
	return 0;
}

/* A new process of a server (one that listened, or one of its own) belongs to the
 * server's application: a per-connection worker is not an application of its own. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	if (child->tgid == parent->tgid)
		return 0; /* a thread */
	struct task_struct *leader = parent->group_leader;
	u32 app = tgid_of(parent);
	barrier_var(app);
	if (!app)
		return 0; /* outside appease's PID namespace */
	if (app == 1)
		return 0; /* the service manager (it listens for socket activation): each
			   * service it starts is an application of its own */
	u32 *inherited = bpf_task_storage_get(&apps, leader, 0, 0);
	if (inherited)
		app = *inherited;
	else if (!bpf_task_storage_get(&listeners, leader, 0, 0))
		return 0;
	u32 *mine = bpf_task_storage_get(&apps, child, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (mine)
		*mine = app;
	return 0;
}

/* System calls that wait on a lock or semaphore (x86-64 numbers). */
#define NR_SEMOP 65
#define NR_FUTEX 202
#define NR_SEMTIMEDOP 220
#define NR_FUTEX_WAITV 449

static __always_inline void wait_event(u32 app, u32 kind)
{
	struct appease_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(APPEASE_CNT_LOST);
		return;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->app = app;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

/* Priority inversion: a thread serving a request blocks on a lock (futex, semaphore) of
 * an application that has sunk threads, one of which may hold it. The first such wait
 * of an application wakes the daemon (which lifts its sunk threads); the end of the
 * last one (its waiter runs again) tells it to sink them again. */
SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	if (!serving_window_ns)
		return 0;
	struct thread_state *st = bpf_task_storage_get(&threads, next, 0, 0);
	if (st && st->waiting_app) {
		u32 app = st->waiting_app - 1;
		st->waiting_app = 0;
		struct app_waits *w = bpf_map_lookup_elem(&sunk_apps, &app);
		/* A count the daemon reset meanwhile is not taken below zero. */
		if (w && w->waiting > 0 && __sync_fetch_and_add(&w->waiting, -1) == 1)
			wait_event(app, APPEASE_EV_WAIT_END);
	}
	if (preempt || prev_state == 0)
		return 0;
	st = bpf_task_storage_get(&threads, prev, 0, 0);
	if (!st || st->waiting_app || bpf_ktime_get_ns() - st->latest_request_ns >= serving_window_ns)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(prev);
	long nr = regs ? (long)BPF_CORE_READ(regs, orig_ax) : -1;
	if (nr != NR_FUTEX && nr != NR_FUTEX_WAITV && nr != NR_SEMOP && nr != NR_SEMTIMEDOP)
		return 0;
	u32 app = app_of(prev);
	struct app_waits *w = bpf_map_lookup_elem(&sunk_apps, &app);
	if (!w || !w->sunk)
		return 0;
	st->waiting_app = app + 1;
	if (__sync_fetch_and_add(&w->waiting, 1) == 0)
		wait_event(app, APPEASE_EV_WAIT);
	return 0;
}

#define TCP_LISTEN 10

/* A TCP connection this side started, established (often in softirq, on no task's
 * behalf): marked in tcp_connected. listen() on a TCP socket, in the caller's context
 * (inet_csk_listen_start): a mark the task iterator reads, no event. UNIX sockets have no
 * such tracepoint: a UNIX server is known by its requests, or by the daemon's look at
 * open sockets when it starts. */
SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(on_sock_state, const struct sock *sk, int oldstate, int newstate)
{
	if (newstate == TCP_ESTABLISHED && oldstate == TCP_SYN_SENT) {
		if (sk->sk_protocol == IPPROTO_TCP)
			bpf_sk_storage_get(&tcp_connected, (struct sock *)sk, 0,
					   BPF_SK_STORAGE_GET_F_CREATE);
		return 0;
	}
	if (newstate != TCP_LISTEN)
		return 0;
	struct task_struct *t = bpf_get_current_task_btf();
	if (t->flags & PF_KTHREAD)
		return 0;
	/* On the process (its leader): the thread that listened may end before the rest. */
	u32 *seen = bpf_task_storage_get(&listeners, t->group_leader, 0,
					 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (seen)
		*seen = 1;
	return 0;
}

/* The load as a server meets it: runnable tasks on every CPU, and how many of them are
 * of the idle class (in an idle group or SCHED_IDLE), read from the run queues
 * themselves when the daemon runs count_runnable (BPF_PROG_RUN), as often as it samples
 * the load. A scan's count of the idle group is a second old; a build's compilers come
 * and go within that second, and the difference, read as load, elevated servers for
 * nothing.
 *
 * The run queues are per-CPU data, which BPF reaches by symbol only on kernels built
 * with CONFIG_KALLSYMS_ALL. Every task knows its CPU's run queue, though: the task
 * iterator notes each CPU's as it meets a task there (each CPU has kernel threads of
 * its own), and count_runnable reads those addresses. */
#define MAX_CPUS 1024
u64 rq_of_cpu[MAX_CPUS] = {};
u32 runnable_all = 0;
u32 runnable_idle = 0;
u32 runnable_cpus = 0;
/* One past the highest CPU whose run queue is known: count_runnable looks no further. */
u32 cpus_known = 0;

static __always_inline void note_rq(struct task_struct *t)
{
	struct cfs_rq *cfs_rq = t->se.cfs_rq;
	if (!cfs_rq)
		return;
	struct rq *rq = cfs_rq->rq;
	if (!rq)
		return;
	u32 cpu = rq->cpu;
	if (cpu < MAX_CPUS && !rq_of_cpu[cpu]) {
		rq_of_cpu[cpu] = (u64)rq;
		if (cpu >= cpus_known)
			cpus_known = cpu + 1;
	}
}

/* Kernels before 6.14 name the idle count so. */
struct cfs_rq___before_6_14 {
	unsigned int idle_h_nr_running;
} __attribute__((preserve_access_index));

struct runnable_sum {
	u64 nr_running_off, h_nr_idle_off;
	u32 all, idle, cpus, failed;
};

/* One CPU's run queue, if known (bpf_loop: the verifier checks the body once). */
static long add_cpu(u32 cpu, struct runnable_sum *sum)
{
	if (cpu >= MAX_CPUS)
		return 1;
	u64 rq = rq_of_cpu[cpu];
	if (!rq)
		return 0;
	unsigned int n = 0, i = 0;
	if (bpf_probe_read_kernel(&n, sizeof(n), (void *)(rq + sum->nr_running_off)) ||
	    bpf_probe_read_kernel(&i, sizeof(i), (void *)(rq + sum->h_nr_idle_off))) {
		sum->failed = 1;
		return 1;
	}
	sum->all += n;
	sum->idle += i;
	sum->cpus++;
	return 0;
}

SEC("raw_tp")
int count_runnable(void *ctx)
{
	struct runnable_sum sum = {};
	sum.nr_running_off = bpf_core_field_offset(struct rq, nr_running);
	sum.h_nr_idle_off = bpf_core_field_offset(struct rq, cfs);
	if (bpf_core_field_exists(struct cfs_rq, h_nr_idle))
		sum.h_nr_idle_off += bpf_core_field_offset(struct cfs_rq, h_nr_idle);
	else
		sum.h_nr_idle_off +=
			bpf_core_field_offset(struct cfs_rq___before_6_14, idle_h_nr_running);
	bpf_loop(cpus_known, add_cpu, &sum, 0);
	if (sum.failed)
		return 1;
	runnable_all = sum.all;
	runnable_idle = sum.idle;
	runnable_cpus = sum.cpus;
	return 0;
}

/* Threads' CPU times, for the daemon's tick: it writes up to CPU_READ_MAX thread IDs (as
 * its own PID namespace numbers them) in cpu_tids and their count in cpu_n, then runs
 * read_cpu once. One system call answers for every watched thread, where reading each
 * one's schedstat file costs a call and the file's formatting each (issue of the daemon's
 * cost at hundreds of busy connections). A tid no task has answers tgid 0. */
#define CPU_READ_MAX 1024

/* Weak: a kernel without them (before 6.11) loads the rest, and read_cpu answers 1. */
extern struct task_struct *bpf_task_from_vpid(s32 vpid) __ksym __weak;
extern void bpf_task_release(struct task_struct *p) __ksym __weak;

u32 cpu_n = 0;
u32 cpu_tids[CPU_READ_MAX] = {};
struct appease_cpu cpu_answers[CPU_READ_MAX] = {};

static long read_one_cpu(u64 i, void *ctx)
{
	if (i >= CPU_READ_MAX)
		return 1;
	struct appease_cpu *a = &cpu_answers[i];
	struct task_struct *t = bpf_task_from_vpid(cpu_tids[i]);
	if (!t) {
		a->tgid = 0;
		a->cpu_ns = 0;
		a->start_boot_ns = 0;
		return 0;
	}
	a->tgid = tgid_of(t);
	a->kernel_thread = !!(t->flags & PF_KTHREAD);
	a->cpu_ns = t->se.sum_exec_runtime;
	struct thread_state *st = bpf_task_storage_get(&threads, t, 0, 0);
	a->request_cpu_ns = st ? st->request_cpu_ns : 0;
	a->request_ns = st ? st->latest_request_ns : 0;
	a->start_boot_ns = t->start_boottime;
	bpf_task_release(t);
	return 0;
}

SEC("syscall")
int read_cpu(void *ctx)
{
	if (!bpf_ksym_exists(bpf_task_from_vpid))
		return 1;
	u32 n = cpu_n;
	bpf_loop(n < CPU_READ_MAX ? n : CPU_READ_MAX, read_one_cpu, NULL, 0);
	return 0;
}

/* Whether the task's group or one above it is idle (cpu.idle = 1): such a task gets a
 * CPU only when nothing of the normal class at that level wants it, so it is no
 * competition for a server there. A few levels cover every layout appease makes. */
static __always_inline unsigned char in_idle_group(struct task_struct *t)
{
	struct task_group *tg = t->sched_task_group;
	for (int i = 0; i < 8 && tg; i++) {
		if (tg->idle)
			return 1;
		tg = tg->parent;
	}
	return 0;
}

/* The kernfs id of a cgroup: what names its directory for as long as it lives (ids are
 * not given again), so the daemon reads a group's path once, not per process and scan. */
static __always_inline u64 cgroup_kn_id(struct cgroup *cg)
{
	return cg ? BPF_CORE_READ(cg, kn, id) : 0;
}

/* One record per thread for the daemon's scan; the process's own fields (name, parent,
 * start, terminal, reaped children) come from its leader. */
SEC("iter/task")
int dump_task(struct bpf_iter__task *ctx)
{
	struct task_struct *t = ctx->task;
	if (!t)
		return 0;
	struct task_struct *leader = t->group_leader;
	struct signal_struct *sig = t->signal;
	struct appease_task r = {};
	r.pid = tgid_of(t);
	r.tid = tid_of(t);
	r.cpu_ns = t->se.sum_exec_runtime;
	r.wait_ns = t->sched_info.run_delay;
	r.kernel_thread = (t->flags & PF_KTHREAD) != 0;
	r.running = t->__state == 0 && t->exit_state == 0;
	note_rq(t);
	if (r.running)
		r.idle_group = in_idle_group(t);
	r.sched_idle = t->policy == SCHED_IDLE;
	/* A client's reads, kept by the read path at no cost of their own: the scan tells a
	 * batch job that feeds on a server's responses from one that only computes. */
	struct thread_state *st = bpf_task_storage_get(&threads, t, 0, 0);
	if (st)
		r.response_ns = st->last_response_ns;
	if (t == leader) {
		struct task_struct *parent = t->real_parent;
		/* 0 for a namespace's first process, whose parent is outside it. */
		r.ppid = parent ? tgid_of(parent) : 0;
		r.start_boot_ns = t->start_boottime;
		r.listens = bpf_task_storage_get(&listeners, t, 0, 0) != 0;
		r.app = app_of(t);
		r.age_ns = bpf_ktime_get_boot_ns() - t->start_boottime;
		if (sig) {
			r.has_tty = sig->tty != 0;
			/* Exited threads, and reaped children (as /proc's cutime and cstime). */
			r.gone_cpu_ns = sig->sum_sched_runtime + sig->cutime + sig->cstime;
		}
		bpf_probe_read_kernel_str(r.comm, sizeof(r.comm), t->comm);
		struct css_set *cs = t->cgroups;
		if (cs) {
			int cpu = bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id);
			struct cgroup_subsys_state *css = NULL;
			if (cpu >= 0 && cpu < CGROUP_SUBSYS_COUNT)
				css = BPF_CORE_READ(cs, subsys[cpu]);
			r.cpu_cgroup_id = css ? cgroup_kn_id(BPF_CORE_READ(css, cgroup)) : 0;
			r.dfl_cgroup_id = cgroup_kn_id(BPF_CORE_READ(cs, dfl_cgrp));
		}
	}
	bpf_seq_write(ctx->meta->seq, &r, sizeof(r));
	return 0;
}
