#!/usr/bin/env python3
"""Each request's path through the scheduler, from a perf trace of a bench run: when the
server woke for it, how long the server's run took in wall time and how much of it the
server spent waiting on its run queue (and behind whom), and when the client's reader
woke for the answer.

    perf record -a -e sched:sched_switch -e sched:sched_wakeup -e sched:sched_wakeup_new \
        -e sched:sched_migrate_task -o sched.data -- appease bench synthetic ...
    perf script -i sched.data | scripts/request-paths.py --cpu-ms 5

For every server thread (`--comm`, one per mode and round) it takes the last LAST
requests and counts those where the server waited MIN_MS or more on its run queue (by
the task that took its CPU, longest in all), those whose run took MIN_MS or more of
wall time beyond CPU_MS while the scheduler saw it running (time lost on CPU: interrupts
or the hypervisor), and those whose answer the reader picked up MIN_MS or more late.
"""
import argparse
import bisect
import collections
import re
import sys

EVENT = re.compile(r"^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)$")


def fields(text):
    return dict(re.findall(r"(\w+)=(\S+)", text))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comm", default="bench-server", help="the server threads' name")
    ap.add_argument("--cpu-ms", type=float, default=5.0, help="CPU each request needs")
    ap.add_argument("--last", type=int, default=1200, help="requests at the end of each server's life")
    ap.add_argument("--min-ms", type=float, default=0.95, help="shortest delay to count")
    args = ap.parse_args()
    min_s = args.min_ms / 1e3

    events = []
    for line in sys.stdin:
        m = EVENT.match(line)
        if m:
            _, tid, _, t, ev, rest = m.groups()
            events.append((float(t), tid, ev, rest))

    servers = []
    for _, _, ev, rest in events:
        if ev == "sched_switch":
            n = fields(rest.split("==>")[1])
            if n.get("next_comm") == args.comm and n["next_pid"] not in servers:
                servers.append(n["next_pid"])

    for srv in servers:
        requests, current, since = [], None, None
        woken = collections.Counter()  # whom the server wakes: its reader, mostly
        runs_of = collections.defaultdict(list)
        for t, tid, ev, rest in events:
            if ev == "sched_wakeup":
                d = fields(rest)
                if d.get("pid") == srv:
                    current = {"wake": t, "cpu": 0.0, "held": collections.Counter(), "off": None}
                elif tid == srv:
                    woken[d.get("pid")] += 1
            elif ev == "sched_switch":
                p, n = (fields(x) for x in rest.split("==>"))
                runs_of[n.get("next_pid")].append(t)
                if n.get("next_pid") == srv and current is not None:
                    # The task that took the server's CPU holds it until the server is
                    # back (a trace can miss a switch in between; this cannot).
                    if current["off"] is not None:
                        current["held"][current["by"]] += t - current["off"]
                        current["off"] = None
                    since = t
                elif p.get("prev_pid") == srv and since is not None and current is not None:
                    current["cpu"] += t - since
                    since = None
                    if p.get("prev_state", "R").startswith("R"):
                        current["off"], current["by"] = t, n.get("next_comm")
                    else:
                        current["end"] = t
                        requests.append(current)
                        current = None
        requests = requests[-args.last:]
        if not requests:
            continue
        reader = woken.most_common(1)[0][0] if woken else None
        reads = runs_of.get(reader, [])
        waits, lost, slow_reads = collections.Counter(), 0, 0
        for r in requests:
            wall = r["end"] - r["wake"]
            waited = wall - r["cpu"]
            if waited >= min_s:
                who = r["held"].most_common(1)
                waits[who[0][0] if who else "?"] += 1
            if r["cpu"] - args.cpu_ms / 1e3 >= min_s:
                lost += 1
            i = bisect.bisect_left(reads, r["wake"] + r["cpu"] / 2)
            if i < len(reads) and reads[i] - r["end"] >= min_s:
                slow_reads += 1
        print(f"{args.comm} {srv}: {len(requests)} requests; waited >= {args.min_ms} ms on the run queue: "
              f"{sum(waits.values())} ({', '.join(f'{k} {v}' for k, v in waits.most_common()) or 'none'}); "
              f"lost >= {args.min_ms} ms on CPU: {lost}; answer read >= {args.min_ms} ms late: {slow_reads}")


if __name__ == "__main__":
    main()
