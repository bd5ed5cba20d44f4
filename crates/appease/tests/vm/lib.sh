# Helpers for the scripts that run inside the test VM (scripts/vm/run.sh): each check
# prints "ok - NAME" or "not ok - NAME: DETAIL"; `finish` prints "N passed, N failed"
# and exits non-zero if any failed.
PASSED=0
FAILED=0
A=/opt/appease/appease
export APPEASE_RUN_DIR=/run/appease-test

ok() { PASSED=$((PASSED + 1)); echo "ok - $1"; }
fail() { FAILED=$((FAILED + 1)); echo "not ok - $1: $2"; }
# check NAME COMMAND…: passes when COMMAND succeeds.
check() { name=$1; shift; if "$@"; then ok "$name"; else fail "$name" "'$*' failed"; return 1; fi; }
finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
}

# wait_until SECONDS COMMAND…: polls every 0.2 s.
wait_until() {
  t=$(($1 * 5)); shift
  while [ "$t" -gt 0 ]; do "$@" && return 0; sleep 0.2; t=$((t - 1)); done
  return 1
}

policy() { chrt -p "$1" 2>/dev/null | sed -n 's/.*scheduling policy: //p' | head -1; }
is_idle() { [ "$(policy "$1")" = "SCHED_IDLE" ]; }
is_normal() { [ "$(policy "$1")" = "SCHED_OTHER" ]; }
cgroup_of() { sed -n 's/^0:://p' "/proc/$1/cgroup"; }
in_cgroup() { [ "$(cgroup_of "$1")" = "$2" ]; }
# in_job_group PID TOP: PID is in the group of its job inside the idle group TOP.
in_job_group() { case "$(cgroup_of "$1")" in "$2"/job-*) true ;; *) false ;; esac; }
# fork_bomb CGROUP: a shell in CGROUP that forks ten sleeps (as many as pids.max lets it);
# in an idle group beside soakers it runs slowly: wait for pids.events, not for time.
fork_bomb() {
  sh -c "echo \$\$ > /sys/fs/cgroup$1/cgroup.procs; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 300 & done; wait" 2>/dev/null &
}
# kill_all_but CGROUP PID: ends every process of CGROUP but PID.
kill_all_but() {
  for p in $(cat "/sys/fs/cgroup$1/cgroup.procs"); do [ "$p" = "$2" ] || kill -KILL "$p"; done
}
usage_us() { sed -n 's/^usage_usec //p' "/sys/fs/cgroup$1/cpu.stat"; }
# CPUs a cgroup used over SECONDS, as a decimal. The VM's CPUs are emulated, and its
# clock and CPU accounting drift by several percent: a half-CPU limit reads up to 0.55.
cpus_used() {
  a=$(usage_us "$1"); sleep "$2"; b=$(usage_us "$1")
  echo "$a $b $2" | awk '{ printf "%.3f", ($2 - $1) / ($3 * 1e6) }'
}
at_most() { echo "$1 $2" | awk '{ exit !($1 <= $2) }'; }
alive() { kill -0 "$1" 2>/dev/null; }

start_daemon() {
  $A daemon --config "$1" > /tmp/daemon.log 2>&1 &
  DAEMON=$!
  wait_until 30 $A status > /dev/null 2>&1 || { echo "daemon did not start:"; cat /tmp/daemon.log; }
}
stop_daemon() { kill -TERM "$DAEMON"; wait "$DAEMON"; }

# A shell that spins.
SOAK='while :; do :; done'

CONFIG=/tmp/batch.toml
cat > $CONFIG <<'TOML'
[batch]
after_ms = 2000
scan_ms = 300
# Emulated CPUs: a soaker under half a CPU shared with other work wants little.
min_cpus = 0.2
# Nothing here receives requests: keep the idle group idle anyway.
quiet_after_ms = 0
TOML
