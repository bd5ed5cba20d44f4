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
prints each kind of wait's p50 and p99 and who was running when the wait began. The figures are per
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

    running = {}  # cpu -> pid running there (0: the CPU is idle)
    running_comm = {}  # cpu -> its name
    since = {}  # job pid -> when it last went on a CPU
    waiting = {}  # job pid -> (since, kind, another CPU idle, who took its CPU)
    on_cpu = 0.0
    total = collections.Counter()
    count = collections.Counter()
    taken_by = collections.Counter()
    taken_by_s = collections.Counter()
    held_by = collections.Counter()  # who held the CPU the job's task waited for, s
    longest = collections.defaultdict(list)  # kind -> every wait, s

    def another_idle(cpu):
        return any(pid == 0 for c, pid in running.items() if c != cpu)

    for line in sys.stdin:
        m = SWITCH.search(line)
        if m:
            cpu, t = int(m[1]), float(m[2])
            prev, prev_pid, state, nxt, next_pid = m[3], int(m[4]), m[5], m[6], int(m[7])
            if job(prev, prev_pid) and prev_pid in since:
                on_cpu += t - since.pop(prev_pid)
            if job(prev, prev_pid) and state.startswith("R"):
                waiting[prev_pid] = (t, "preempted", another_idle(cpu), name(nxt))
            running[cpu] = next_pid
            running_comm[cpu] = name(nxt)
            if job(nxt, next_pid):
                since[next_pid] = t
                if next_pid in waiting:
                    began, kind, idle, by = waiting.pop(next_pid)
                    key = (kind, idle)
                    total[key] += t - began
                    count[key] += 1
                    longest[kind].append(t - began)
                    if kind == "preempted" and idle:
                        taken_by[by] += 1
                        taken_by_s[by] += t - began
                    held_by[by] += t - began
            continue
        m = WAKEUP.search(line)
        if m and job(m[3], int(m[4])) and int(m[4]) not in waiting:
            t, pid, target = float(m[2]), int(m[4]), int(m[5])
            if running.get(target, 0) != 0:
                waiting[pid] = (t, "woken onto a busy CPU", another_idle(target), running_comm[target])

    if on_cpu == 0:
        sys.exit(f"no task of {label} ran in this trace")
    print(f"the job's tasks ({label}) on a CPU: {on_cpu:.3f} s; waits per second of that:")
    print(f"{'wait':<24} {'another CPU idle':>17} {'waits/s':>9} {'ms/s':>8} {'mean us':>8}")
    for key in sorted(total):
        kind, idle = key
        print(
            f"{kind:<24} {'yes' if idle else 'no':>17} {count[key] / on_cpu:>9.0f} "
            f"{total[key] * 1000 / on_cpu:>8.1f} {total[key] / count[key] * 1e6:>8.1f}"
        )
    for kind, waits in sorted(longest.items()):
        waits.sort()
        q = lambda f: waits[min(len(waits) - 1, int(f * len(waits)))] * 1e6
        print(f"{kind}: wait p50 {q(0.5):.0f} us, p99 {q(0.99):.0f} us, longest {waits[-1] * 1e6:.0f} us")
    print("every wait, by the task running when it began (ms/s):")
    for by, secs in held_by.most_common(6):
        print(f"  {by:<20} {secs * 1000 / on_cpu:>7.1f}")
    print("preempted while another CPU was idle, by (waits/s, ms/s):")
    for by, n in taken_by.most_common(6):
        print(f"  {by:<20} {n / on_cpu:>7.0f} {taken_by_s[by] * 1000 / on_cpu:>7.1f}")


if __name__ == "__main__":
    main()
