#!/usr/bin/env bash
# Runs a command (default: `make test`) in the root autogroup, where /proc/PID/autogroup is
# empty, as the project's CI runs its jobs (from PID 1's side, with no session autogroup).
# A shell always has a session and an autogroup of its own, so this borrows the one path
# the kernel has that starts a process outside every session: a core-dump pipe helper,
# forked from kthreadd. kernel.core_pattern is set for the moment it takes to start the
# helper and put back as soon as it has started (and on every exit of this script). Only
# the autogroup matches CI's: the job runs in the root cgroup with this shell's exported
# environment, the kernel's default limits and no terminal.
#
#   scripts/first-session.sh                 # make test
#   scripts/first-session.sh cargo test --release -p appease-actuator --lib
#
# Interrupted, it ends the job's process group; what the job started in sessions of its
# own (servers started with setsid) is the job's to end, as under any runner.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "$0: needs root (it sets kernel.core_pattern for a moment)" >&2; exit 1; }
repo=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- make test
dir=$(mktemp -d)
knob=/proc/sys/kernel/core_pattern
saved=$(cat "$knob")
tailer=
cleanup() {
    [ "$(cat "$knob")" = "$saved" ] || printf '%s\n' "$saved" > "$knob"
    [ -z "$tailer" ] || kill "$tailer" 2>/dev/null || true
    # Interrupted: end the job (its process group), not just this script.
    if [ ! -e "$dir/rc" ] && [ -s "$dir/pgid" ]; then
        kill -TERM -- "-$(cat "$dir/pgid")" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The helper starts with the kernel's bare environment: it takes ours from a file. The
# job waits for `go`, written once its autogroup is checked, and never starts the command
# if this script has given up (the directory is gone).
export -p > "$dir/env"
{
    echo '#!/bin/bash'
    echo 'cat > /dev/null'   # the core, unused
    # Another program that dumps core while the pattern is ours starts this helper too:
    # only the first start runs anything (and none once the directory is gone).
    printf 'mkdir %q 2>/dev/null || exit 0\n' "$dir/started"
    printf '. %q 2>/dev/null\n' "$dir/env"
    echo 'set -m'            # the job gets a process group of its own (not a session) to end it by
    printf 'cd %q || exit 1\n' "$repo"
    printf '( cat /proc/self/autogroup > %q || exit 1\n' "$dir/autogroup"
    printf '  for _ in $(seq 100); do [ -e %q ] && break; [ -d %q ] || exit 1; sleep 0.1; done\n' "$dir/go" "$dir"
    printf '  [ -e %q ] || exit 1\n' "$dir/go"
    printf '  %s > %q 2>&1; echo $? > %q.tmp; mv %q.tmp %q ) </dev/null >/dev/null 2>&1 &\n' \
        "$(printf '%q ' "$@")" "$dir/log" "$dir/rc" "$dir/rc" "$dir/rc"
    printf 'echo $! > %q.tmp; mv %q.tmp %q\n' "$dir/pgid" "$dir/pgid" "$dir/pgid"
} > "$dir/helper"
chmod 755 "$dir/helper"
: > "$dir/log"

printf '|%s\n' "$dir/helper" > "$knob"
# The kernel has started the helper by the time the crashing process is gone.
{ ( ulimit -c unlimited; exec bash -c 'kill -SEGV $$' ); } 2>/dev/null || true
printf '%s\n' "$saved" > "$knob"
for _ in $(seq 100); do [ -e "$dir/autogroup" ] && [ -s "$dir/pgid" ] && break; sleep 0.1; done
[ -e "$dir/autogroup" ] && [ -s "$dir/pgid" ] || { echo "$0: the core-dump helper did not start" >&2; exit 1; }
if [ -s "$dir/autogroup" ]; then
    echo "$0: the job is in an autogroup ($(cat "$dir/autogroup")), not the root one" >&2
    exit 1
fi
pgid=$(cat "$dir/pgid")
echo "running in the root autogroup (no session autogroup): $*" >&2
tail -n +1 -f "$dir/log" & tailer=$!
: > "$dir/go"

while [ ! -e "$dir/rc" ] && kill -0 -- "-$pgid" 2>/dev/null; do sleep 1; done
sleep 0.5
[ -e "$dir/rc" ] || { echo "$0: the job ended without an exit status (killed?)" >&2; exit 1; }
exit "$(cat "$dir/rc")"
