#!/usr/bin/env python3
"""What a server waited behind: from a perf trace of scheduler events, each time a
server thread was runnable but not running, and which tasks held its CPU meanwhile.

    perf record -a -e sched:sched_switch -e sched:sched_wakeup -e sched:sched_wakeup_new \
        -e sched:sched_migrate_task -o sched.data -- appease bench synthetic ...
    perf script -i sched.data | scripts/server-waits.py --comm bench-server --last 30

For every thread named COMM (one per bench mode and round) it looks at the last LAST
seconds of its life (the measurement, after the warm-up) and prints the waits of at
least MIN_MS, the tasks that ran on its CPU during them (total per task name), and the
run lengths of every other task in that window but the soakers (who runs how long).
"""
import argparse
import collections
import re
import sys

EVENT = re.compile(r"^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)$")


def fields(text):
    return dict(re.findall(r"(\w+)=(\S+)", text))


def parse(lines):
    for line in lines:
        m = EVENT.match(line)
        if m:
            _, _, cpu, t, ev, rest = m.groups()
            yield int(cpu), float(t), ev, rest


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comm", default="bench-server", help="the server threads' name")
    ap.add_argument("--last", type=float, default=30.0, help="seconds at the end of each server's life")
    ap.add_argument("--min-ms", type=float, default=0.5, help="shortest wait to count")
    ap.add_argument("--each", action="store_true", help="print every wait")
    args = ap.parse_args()
    events = list(parse(sys.stdin))

    # Each server's life: first and last event naming it.
    life = {}
    for _, t, ev, rest in events:
        for pid in re.findall(r"(?:next_comm|prev_comm|comm)=" + re.escape(args.comm) + r" (?:next_pid|prev_pid|pid)=(\d+)", rest):
            first, _ = life.get(pid, (t, t))
            life[pid] = (first, t)

    for srv, (born, died) in sorted(life.items(), key=lambda kv: kv[1][0]):
        t0 = max(born, died - args.last)
        running = {}  # cpu -> (comm, pid, since)
        since, on, held = None, None, None
        waits = []
        runs = collections.defaultdict(list)
        started = {}
        for cpu, t, ev, rest in events:
            if ev == "sched_switch":
                a, b = rest.split("==>")
                p, n = fields(a), fields(b)
                prev = running.get(cpu)
                if since is not None and on == cpu and prev is not None:
                    held[prev[0]] += t - max(prev[2], since)
                running[cpu] = (n["next_comm"], n["next_pid"], t)
                key = (p["prev_comm"], p["prev_pid"])
                began = started.pop(key, None)
                if began is not None and t0 <= began and t <= died:
                    runs[key].append((t - began) * 1e3)
                started[(n["next_comm"], n["next_pid"])] = t
                if p["prev_pid"] == srv and p["prev_state"].startswith("R"):
                    since, on, held = t, cpu, collections.Counter()
                if n["next_pid"] == srv and since is not None:
                    w = (t - since) * 1e3
                    if w >= args.min_ms and t >= t0:
                        waits.append((w, t, cpu, held))
                    since = None
            elif ev in ("sched_wakeup", "sched_wakeup_new"):
                p = fields(rest)
                if p.get("pid") == srv:
                    since, on, held = t, int(p.get("target_cpu", cpu)), collections.Counter()
            elif ev == "sched_migrate_task":
                p = fields(rest)
                if p.get("pid") == srv and since is not None:
                    prev = running.get(on)
                    if prev:
                        held[prev[0] + " (before a migration)"] += t - max(prev[2], since)
                    on = int(p["dest_cpu"])
        total = collections.Counter()
        for _, _, _, h in waits:
            for k, v in h.items():
                total[k] += v * 1e3
        print(f"{args.comm} {srv}, {died - t0:.1f} s: {len(waits)} waits of {args.min_ms} ms or more, "
              f"{sum(w for w, *_ in waits):.1f} ms in all")
        for k, v in total.most_common(10):
            print(f"  behind {k:34s} {v:8.1f} ms")
        by_ms = collections.Counter(round(w) for w, *_ in waits)
        print("  waits by length, ms (rounded): " + ", ".join(f"{k}: {v}" for k, v in sorted(by_ms.items())))
        if args.each:
            for w, t, c, h in waits:
                print(f"   {t:.3f} cpu{c} {w:.2f} ms " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in h.items()))
        rows = []
        for (comm, pid), v in runs.items():
            if comm in ("bench-soaker", args.comm) or comm.startswith("swapper"):
                continue
            v.sort()
            rows.append((sum(v), comm, pid, len(v), v[len(v) // 2], v[int(len(v) * 0.99)], v[-1]))
        rows.sort(reverse=True)
        print(f"  {'other tasks':28s} {'runs':>6s} {'ms':>8s} {'p50 us':>8s} {'p99 us':>8s} {'max us':>8s}")
        for tot, comm, pid, n, p50, p99, mx in rows[:8]:
            print(f"  {comm + '/' + pid:28s} {n:6d} {tot:8.1f} {p50 * 1e3:8.0f} {p99 * 1e3:8.0f} {mx * 1e3:8.0f}")


if __name__ == "__main__":
    main()
