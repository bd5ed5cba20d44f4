#!/usr/bin/env bash
# Instructions per simulated event, every policy, on the simulator's two speed workloads.
# Wall-clock speed on a shared host moves by ±20 % from run to run; an instruction count
# (callgrind, counting only the event loop) is the same on every run and every host, so a
# change to the simulator can be judged by it in one run. `make sim-instructions` runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./target/release/appease
policies=${POLICIES:-"rr mlfq o1 staircase cfs eevdf cfs-rbpe unhappiness"}
printf "%-8s %-12s %10s %14s %12s\n" host policy events instructions "instr/event"
for host in busy typical; do
  for p in $policies; do
    out=$(mktemp)
    events=$(valgrind --tool=callgrind --toggle-collect='appease_sim::engine::Engine*::run' \
      --callgrind-out-file=/dev/null "$bin" sim run "examples/sim/speed-$host.toml" \
      --policy "$p" --json 2>"$out" | sed -n 's/.*"events": *\([0-9]*\).*/\1/p')
    instr=$(sed -n 's/.*Collected : *\([0-9]*\).*/\1/p' "$out")
    rm -f "$out"
    if [ -z "$events" ] || [ -z "$instr" ]; then
      echo "error: no figures for $host/$p (is valgrind installed?)" >&2
      exit 1
    fi
    awk -v h="$host" -v p="$p" -v e="$events" -v i="$instr" \
      'BEGIN { printf "%-8s %-12s %10d %14d %12.0f\n", h, p, e, i, i / e }'
  done
done
