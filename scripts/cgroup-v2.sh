#!/usr/bin/env bash
# Moves the `cpu` and `pids` controllers of this host from their cgroup v1 hierarchies
# to the unified (v2) hierarchy and back, so that appease can be tested on cgroup v2
# on a host that boots with v1 (the other controllers stay where they are).
#
#   scripts/cgroup-v2.sh status         where cpu and pids are now
#   scripts/cgroup-v2.sh to-v2          move them to the unified hierarchy
#   scripts/cgroup-v2.sh to-v1          move them back
#   scripts/cgroup-v2.sh run CMD ARG…   to-v2, run CMD, to-v1 whatever CMD did; CMD's exit code
#
# The kernel lets a controller change hierarchies only while the one it leaves holds no
# child cgroup for it: the script refuses, and names them, while any exists (even an
# empty one), and never removes another program's cgroups. Root only.
set -euo pipefail

CG=/sys/fs/cgroup
UNIFIED=${APPEASE_UNIFIED:-}
CONTROLLERS=(cpu pids)

die() { echo "cgroup-v2: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (it mounts and unmounts cgroup hierarchies)"

# The unified hierarchy: /sys/fs/cgroup/unified on a hybrid host, /sys/fs/cgroup on a pure v2 one.
unified() {
  if [ -n "$UNIFIED" ]; then echo "$UNIFIED"; return; fi
  awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts
}

# The v1 mount point of controller $1, if it is mounted on v1.
v1_mount() {
  awk -v c="$1" '$3 == "cgroup" { n = split($4, o, ","); for (i = 1; i <= n; i++) if (o[i] == c) { print $2; exit } }' /proc/self/mounts
}

on_v2() {
  local u; u=$(unified)
  [ -n "$u" ] && grep -qw "$1" "$u/cgroup.subtree_control"
}

status() {
  local u; u=$(unified)
  [ -n "$u" ] || die "no cgroup2 mount in /proc/self/mounts"
  for c in "${CONTROLLERS[@]}"; do
    if m=$(v1_mount "$c") && [ -n "$m" ]; then echo "$c: cgroup v1 at $m"
    elif on_v2 "$c"; then echo "$c: cgroup v2 at $u"
    else echo "$c: available on cgroup v2 at $u, not enabled"
    fi
  done
}

to_v2() {
  local u; u=$(unified)
  [ -n "$u" ] || die "no cgroup2 mount in /proc/self/mounts"
  local busy=()
  for c in "${CONTROLLERS[@]}"; do
    m=$(v1_mount "$c")
    [ -n "$m" ] || continue
    while IFS= read -r d; do busy+=("$d"); done < <(find "$m" -mindepth 1 -type d)
  done
  if [ ${#busy[@]} -gt 0 ]; then
    die "refusing: these cgroup v1 groups hold the controllers to move; remove them first (appease restore removes appease's): ${busy[*]}"
  fi
  # Each controller must be mounted alone: unmounting a co-mounted hierarchy (cpu,cpuacct)
  # would take its companions along, and they would come back mounted differently.
  for c in "${CONTROLLERS[@]}"; do
    opts=$(awk -v c="$c" '$3 == "cgroup" { n = split($4, o, ","); for (i = 1; i <= n; i++) if (o[i] == c) { print $4; exit } }' /proc/self/mounts)
    others=$(echo "$opts" | tr ',' '\n' | grep -vxE "rw|ro|relatime|noatime|nosuid|nodev|noexec|$c" || true)
    [ -z "$others" ] || die "refusing: $c is mounted together with $(echo $others) ($opts); this script moves only a controller mounted alone"
  done
  local done_=()
  for c in "${CONTROLLERS[@]}"; do
    m=$(v1_mount "$c")
    [ -n "$m" ] || continue
    if ! err=$(umount "$m" 2>&1); then
      for d in "${done_[@]}"; do mount -t cgroup -o "$d" cgroup "$CG/$d"; done
      die "could not unmount $m ($err): a process holds the v1 hierarchy open (a file, a directory or a working directory in it); nothing was changed"
    fi
    done_+=("$c")
  done
  # A released controller becomes available on v2 a moment later; one still held
  # (an open file in the old hierarchy) stays bound to v1.
  for c in "${CONTROLLERS[@]}"; do
    for _ in $(seq 50); do grep -qw "$c" "$u/cgroup.controllers" && break; sleep 0.1; done
    if ! grep -qw "$c" "$u/cgroup.controllers"; then
      to_v1 >/dev/null || true
      die "$c did not become available on $u: its v1 hierarchy is still referenced (an open file in it); put back on v1"
    fi
    echo "+$c" > "$u/cgroup.subtree_control"
  done
  echo "cpu and pids are on cgroup v2 at $u"
}

to_v1() {
  local u; u=$(unified)
  local busy=()
  while IFS= read -r d; do
    for c in "${CONTROLLERS[@]}"; do
      grep -qw "$c" "$d/cgroup.subtree_control" 2>/dev/null && busy+=("$d")
    done
  done < <(find "$u" -mindepth 1 -type d)
  if [ ${#busy[@]} -gt 0 ]; then
    die "refusing: these cgroup v2 groups delegate cpu or pids to their children: ${busy[*]}"
  fi
  for c in "${CONTROLLERS[@]}"; do
    if on_v2 "$c"; then
      echo "-$c" > "$u/cgroup.subtree_control" || die "could not disable $c on $u (a child group still uses it?)"
    fi
  done
  for c in "${CONTROLLERS[@]}"; do
    [ -n "$(v1_mount "$c")" ] && continue
    mkdir -p "$CG/$c"
    # Removed v2 groups free the controller a moment after they are gone.
    for i in $(seq 50); do
      mount -t cgroup -o "$c" cgroup "$CG/$c" 2>/dev/null && break
      [ "$i" -eq 50 ] && die "could not mount $c on $CG/$c again"
      sleep 0.1
    done
  done
  echo "cpu and pids are on cgroup v1 again"
}

case "${1:-}" in
  status) status ;;
  to-v2) to_v2 ;;
  to-v1) to_v1 ;;
  run)
    shift
    [ $# -gt 0 ] || die "run needs a command"
    # The trap first: a to-v2 that fails halfway is put back too.
    trap 'to_v1' EXIT
    trap 'exit 130' INT TERM
    to_v2
    set +e
    "$@"
    rc=$?
    set -e
    exit $rc
    ;;
  *) die "usage: $0 status | to-v2 | to-v1 | run CMD [ARG…]" ;;
esac
