/* Shared between the BPF program and Rust (types reach Rust through the skeleton's BTF). */
#ifndef APPEASE_INTF_H
#define APPEASE_INTF_H

enum appease_event_kind {
	APPEASE_EV_REQUEST = 1, /* a thread received bytes on a socket */
	APPEASE_EV_EXEC = 3,    /* a process replaced its image (only while wanted) */
	APPEASE_EV_EXIT = 4,    /* a thread that ever received a request exited */
	APPEASE_EV_WAIT = 5,    /* a serving thread of an application with sunk threads waits on a lock */
	APPEASE_EV_WAIT_END = 6, /* the last such wait of that application ended */
};

enum appease_counter {
	APPEASE_CNT_SOCKET_READS = 0, /* socket reads returning > 0 bytes */
	APPEASE_CNT_REQUESTS = 1,     /* of those, reported as a request event */
	APPEASE_CNT_LOST = 2,         /* events dropped because the ring buffer was full */
	APPEASE_CNT_RESPONSES = 3,    /* reads on a side that connected, one per thread and socket per quiet period */
	APPEASE_CNT_THROTTLED = 4,    /* requests of unprivileged users beyond their events' bound, not reported */
	APPEASE_CNT_HELD = 5,         /* requests reported without a wakeup: their thread is held (elevated, or its budget spent) */
	APPEASE_CNT_WOKE = 6,         /* requests that woke the daemon */
	APPEASE_NR_COUNTERS = 7,
};

struct appease_event {
	unsigned long long ts_ns;  /* CLOCK_MONOTONIC when the event happened */
	unsigned long long cpu_ns; /* the thread's total CPU time (se.sum_exec_runtime) */
	unsigned int kind;         /* enum appease_event_kind */
	unsigned int pid;          /* thread group id */
	unsigned int tid;          /* thread id */
	unsigned int ppid;         /* unused */
	int bytes;                 /* REQUEST: bytes received */
	unsigned int family;       /* REQUEST: AF_UNIX, AF_INET, AF_INET6, ... */
	unsigned int woke;         /* REQUEST: 1 if it woke the reader (first after a quiet spell) */
	unsigned int app;          /* the process's application (see probe.bpf.c's apps) */
	unsigned long long start_ns; /* the thread's start, ns after boot (as /proc's starttime) */
	unsigned long long proc_start_ns; /* its process's (the leader's) start */
	char comm[16];             /* the thread's name */
	char proc_comm[16];        /* its process's name (the leader's) */
	unsigned int uid;          /* the thread's effective uid */
	unsigned int own_autogroup; /* its process leads its session and runs in its autogroup */
};

/* The task iterator's record: one per thread. */
struct appease_task {
	unsigned long long cpu_ns;        /* the thread's CPU time (se.sum_exec_runtime) */
	unsigned long long wait_ns;       /* its time runnable but waiting (run_delay) */
	unsigned long long start_boot_ns; /* leader: start, ns after boot (as /proc's starttime) */
	unsigned long long age_ns;        /* leader: time since then */
	unsigned long long gone_cpu_ns;   /* leader: exited threads' and reaped children's CPU */
	unsigned long long response_ns;   /* its last read of a response (CLOCK_MONOTONIC; 0: none) */
	unsigned long long cpu_cgroup_id; /* leader: its cgroup in the v1 cpu hierarchy (kernfs id; 0: none) */
	unsigned long long dfl_cgroup_id; /* leader: its cgroup in the v2 hierarchy (kernfs id) */
	unsigned int pid;                 /* thread group id */
	unsigned int tid;
	unsigned int ppid;                /* leader: the parent's thread group id */
	unsigned int app;                 /* leader: its application */
	unsigned char kernel_thread;
	unsigned char running;            /* running or waiting for a CPU now */
	unsigned char has_tty;            /* leader: has a controlling terminal */
	unsigned char listens;            /* leader: listened on a TCP socket */
	unsigned char idle_group;         /* in a cgroup with cpu.idle set, or below one */
	unsigned char sched_idle;         /* of the SCHED_IDLE policy */
	char comm[16];                    /* leader: the process's name */
};

/* A thread's CPU time as read_cpu answers it. */
struct appease_cpu {
	unsigned long long cpu_ns;        /* se.sum_exec_runtime */
	unsigned long long start_boot_ns; /* the thread's start, ns after boot */
	unsigned long long request_cpu_ns; /* its CPU time at its latest request (0: none seen) */
	unsigned long long request_ns;    /* its latest request, ns of CLOCK_MONOTONIC (0: none) */
	unsigned int tgid;                /* its thread group; 0: no such thread */
	unsigned int kernel_thread;       /* 1: a kernel thread (PF_KTHREAD) */
};

#endif
