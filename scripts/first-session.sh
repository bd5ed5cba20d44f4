#!/usr/bin/env bash
# Runs a command (default: `make test`) from the first session, as a job runner started
# by PID 1 without setsid runs it (CI here does): in the root autogroup, where
# /proc/PID/autogroup is empty. A shell always has a session and an autogroup of its own,
# so this borrows the one path the kernel has that starts a process outside every
# session: a core-dump pipe helper, forked from kthreadd. kernel.core_pattern is set for
# the moment it takes to start the helper and put back at once (and on every exit).
#
#   scripts/first-session.sh                 # make test
#   scripts/first-session.sh cargo test --release -p appease-actuator --lib
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "$0: needs root (it sets kernel.core_pattern for a moment)" >&2; exit 1; }
repo=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- make test
dir=$(mktemp -d /tmp/appease-first-session.XXXXXX)
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

# The helper runs with the kernel's bare environment: give it ours and the command.
{
    echo '#!/bin/bash'
    echo 'cat > /dev/null'   # the core, unused
    # Another program that dumps core in the moment the pattern is ours starts this
    # helper too: only the first start runs the command.
    printf 'mkdir %q 2>/dev/null || exit 0\n' "$dir/started"
    echo 'set -m'            # the job gets a process group of its own (not a session) to end it by
    printf 'export PATH=%q HOME=%q\n' "$PATH" "$HOME"
    printf 'cd %q\n' "$repo"
    printf '( cat /proc/self/autogroup > %q; %s > %q 2>&1; echo $? > %q.tmp; mv %q.tmp %q ) </dev/null >/dev/null 2>&1 &\necho $! > %q\n' \
        "$dir/autogroup" "$(printf '%q ' "$@")" "$dir/log" "$dir/rc" "$dir/rc" "$dir/rc" "$dir/pgid"
} > "$dir/helper"
chmod 755 "$dir/helper"
: > "$dir/log"

printf '|%s\n' "$dir/helper" > "$knob"
{ ( ulimit -c unlimited; exec bash -c 'kill -SEGV $$' ); } 2>/dev/null || true
for _ in $(seq 50); do [ -e "$dir/autogroup" ] && [ -s "$dir/pgid" ] && break; sleep 0.1; done
printf '%s\n' "$saved" > "$knob"
[ -e "$dir/autogroup" ] || { echo "$0: the core-dump helper did not start" >&2; exit 1; }
if [ -s "$dir/autogroup" ]; then
    echo "$0: the helper is in an autogroup ($(cat "$dir/autogroup")); not the first session" >&2
    exit 1
fi
echo "running in the root autogroup (no session autogroup): $*" >&2

tail -n +1 -f "$dir/log" & tailer=$!
while [ ! -e "$dir/rc" ]; do sleep 1; done
sleep 0.5
exit "$(cat "$dir/rc")"
