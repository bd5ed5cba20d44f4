#!/usr/bin/env python3
"""Where a batch job's tasks waited for a CPU while another CPU sat idle: from a perf
trace of scheduler events, each time a task named COMM was preempted, or woken onto a
CPU that was running something, until it ran again; split by whether some other CPU was
idle when the wait began, and by which task took its CPU.

    perf record -a -e sched:sched_switch -e sched:sched_wakeup -o sched.data -- \
        appease bench fetch --server db --job etl --modes batch-cgroup-idle --repeat 1 --seconds 10
    perf script -i sched.data -F cpu,time,event,trace | scripts/batch-waits.py --comm psql,awk

Run it once per mode (unmanaged, then batch-cgroup-idle) and compare. Where tasks share a
name (the nested bench's two `bench-server`s), name the thread instead: `--pid TID`. It also
prints each kind of wait's p99 and, for every wait, who was running when it began. The figures are per
second of the job's own CPU time, so runs of different lengths compare. A CPU running only
idle-class work counts as idle when the kernel places a waking task (sched_idle_cpu() in
select_idle_sibling()), so under the idle class a pipeline's members and the server side
that feeds it stack on one CPU while the other idles; these waits are that cost.
"""
import argparse
import collections
import re
import sys

SWITCH = re.compile(
    r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch: prev_comm=(.*?) prev_pid=(\d+) "
    r"prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)"
)
WAKEUP = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_wakeup: comm=(.*?) pid=(\d+) .*target_cpu=(\d+)")


def name(comm):
    """A task's name without its per-CPU suffix (kworker/0:1 -> kworker)."""
    return comm.split("/")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comm", default="psql,awk", help="the job's task names, comma-separated")
    ap.add_argument("--pid", default="", help="or the job's thread ids, comma-separated (where names are shared)")
    args = ap.parse_args()
    pids = {int(p) for p in args.pid.split(",") if p}
    names = set() if pids else set(args.comm.split(","))

    def job(comm, pid):
        return comm in names or pid in pids

    label = f"threads {args.pid}" if pids else args.comm

    running = {}  # cpu -> (pid, name) running there (pid 0: the CPU is idle)
    since = {}  # job pid -> when it last went on a CPU
    waiting = {}  # job pid -> (since, kind, another CPU idle, who ran when the wait began)
    on_cpu = 0.0
    waits = collections.defaultdict(list)  # (kind, another CPU idle) -> every wait, s
    by = collections.defaultdict(list)  # (who ran when a wait began, kind, another CPU idle) -> waits, s

    def another_idle(cpu):
        return any(pid == 0 for c, (pid, _) in running.items() if c != cpu)

    for line in sys.stdin:
        m = SWITCH.search(line)
        if m:
            cpu, t = int(m[1]), float(m[2])
            prev, prev_pid, state, nxt, next_pid = m[3], int(m[4]), m[5], m[6], int(m[7])
            if job(prev, prev_pid) and prev_pid in since:
                on_cpu += t - since.pop(prev_pid)
            if job(prev, prev_pid) and state.startswith("R"):
                waiting[prev_pid] = (t, "preempted", another_idle(cpu), name(nxt))
            running[cpu] = (next_pid, name(nxt))
            if job(nxt, next_pid):
                since[next_pid] = t
                if next_pid in waiting:
                    began, kind, idle, who = waiting.pop(next_pid)
                    waits[kind, idle].append(t - began)
                    by[who, kind, idle].append(t - began)
            continue
        m = WAKEUP.search(line)
        if m and job(m[3], int(m[4])) and int(m[4]) not in waiting:
            t, pid, target = float(m[2]), int(m[4]), int(m[5])
            busy, who = running.get(target, (0, ""))
            if busy != 0:
                waiting[pid] = (t, "woken onto a busy CPU", another_idle(target), who)

    if on_cpu == 0:
        sys.exit(f"no task of {label} ran in this trace")
    per_s = lambda n: n / on_cpu
    print(f"the job's tasks ({label}) on a CPU: {on_cpu:.3f} s; waits per second of that:")
    print(f"{'wait':<24} {'another CPU idle':>17} {'waits/s':>9} {'ms/s':>8} {'mean us':>8} {'p99 us':>8}")
    for (kind, idle), w in sorted(waits.items()):
        w.sort()
        p99 = w[min(len(w) - 1, int(0.99 * len(w)))]
        print(
            f"{kind:<24} {'yes' if idle else 'no':>17} {per_s(len(w)):>9.0f} "
            f"{per_s(sum(w)) * 1000:>8.1f} {sum(w) / len(w) * 1e6:>8.1f} {p99 * 1e6:>8.0f}"
        )
    everyone = [x for w in waits.values() for x in w]
    tables = (
        ("every wait", lambda kind, idle: True),
        ("preempted while another CPU was idle", lambda kind, idle: kind == "preempted" and idle),
    )
    for title, keep in tables:
        rows = collections.defaultdict(list)
        for (who, kind, idle), w in by.items():
            if keep(kind, idle):
                rows[who] += w
        print(f"{title}, by the task running when it began (waits/s, ms/s, over 1 ms /s):")
        top = sorted(rows.items(), key=lambda r: -sum(r[1]))[:6]
        if title == "every wait":
            top.append(("(all)", everyone))
        for who, w in top:
            long = sum(1 for x in w if x > 0.001)
            print(f"  {who or '?':<20} {per_s(len(w)):>7.0f} {per_s(sum(w)) * 1000:>7.1f} {per_s(long):>7.1f}")


if __name__ == "__main__":
    main()
