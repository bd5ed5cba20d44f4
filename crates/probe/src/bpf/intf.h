/* Shared between the BPF program and Rust (types reach Rust through the skeleton's BTF). */
#ifndef APPEASE_INTF_H
#define APPEASE_INTF_H

enum appease_event_kind {
	APPEASE_EV_REQUEST = 1, /* a thread received bytes on a socket */
	APPEASE_EV_FORK = 2,    /* a new process (not a thread) was created */
	APPEASE_EV_EXEC = 3,    /* a process replaced its image */
	APPEASE_EV_EXIT = 4,    /* a watched thread, or any process leader, exited */
};

enum appease_counter {
	APPEASE_CNT_SOCKET_READS = 0, /* socket reads returning > 0 bytes */
	APPEASE_CNT_REQUESTS = 1,     /* of those, reported as a request event */
	APPEASE_CNT_LOST = 2,         /* events dropped because the ring buffer was full */
	APPEASE_NR_COUNTERS = 3,
};

struct appease_event {
	unsigned long long ts_ns;  /* CLOCK_MONOTONIC when the event happened */
	unsigned long long cpu_ns; /* the thread's total CPU time (se.sum_exec_runtime) */
	unsigned int kind;         /* enum appease_event_kind */
	unsigned int pid;          /* thread group id */
	unsigned int tid;          /* thread id */
	unsigned int ppid;         /* FORK: parent's thread group id */
	int bytes;                 /* REQUEST: bytes received */
	unsigned int family;       /* REQUEST: AF_UNIX, AF_INET, AF_INET6, ... */
	unsigned int woke;         /* REQUEST: 1 if it woke the reader (first after a quiet spell) */
	char comm[16];
};

#endif
