#!/usr/bin/env bash
# A real systemd, as PID 1 of a container made by hand, that manages this machine's v1 `cpu`
# hierarchy with real CPUs: each v1 hierarchy gets a group of the container's own, which a
# cgroup namespace mounts read-write as the container's root (systemd-nspawn mounts the
# controllers read-only in legacy mode). The root file system is this machine's own, under
# an overlay whose writes land in $STATE and go with `stop`: its systemd (252 on Debian 12)
# and whatever the bench runs (gcc, redis) need no download. This checkout is bound at its
# own path inside, so its binary runs there.
#
#   scripts/systemd-container.sh start     # prints the container's PID 1 (host PID)
#   scripts/systemd-container.sh exec CMD… # runs CMD inside, in a scope of its own in
#                                          # system.slice, as a service would
#   scripts/systemd-container.sh stop      # ends it and removes its groups and overlay
#
# Root only. systemd boots to basic.target (no service of this machine's is started), with
# /proc/sys read-only as systemd-nspawn has it, so the container changes no kernel setting
# of the machine (systemd-sysctl is skipped).
set -euo pipefail

NAME=${SYSTEMD_CONTAINER_NAME:-appease-sd}
STATE=${SYSTEMD_CONTAINER_STATE:-/var/tmp/$NAME}
ROOT=$STATE/root
HIERARCHIES="cpu cpuacct cpuset memory devices freezer blkio pids systemd unified"
REPO=$(cd "$(dirname "$0")/.." && pwd)
PIDFILE=/run/$NAME.pid

die() { echo "systemd-container: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root"

# Inside the new namespaces (PID 1 there): the root, the API file systems, then systemd.
inside() {
  mount --make-rprivate /
  mkdir -p "$STATE/upper" "$STATE/work" "$ROOT"
  mount -t overlay overlay -o "lowerdir=/,upperdir=$STATE/upper,workdir=$STATE/work" "$ROOT"
  # Boots to basic.target: this machine's enabled services stay off.
  ln -sfn /lib/systemd/system/basic.target "$ROOT/etc/systemd/system/default.target"
  mount -t proc proc "$ROOT/proc"
  mount --bind "$ROOT/proc/sys" "$ROOT/proc/sys"
  mount -o remount,bind,ro "$ROOT/proc/sys"
  mount -t sysfs -o ro sysfs "$ROOT/sys"
  mount -t tmpfs -o mode=755 tmpfs "$ROOT/sys/fs/cgroup"
  for h in cpu cpuacct cpuset memory devices freezer blkio pids; do
    mkdir -p "$ROOT/sys/fs/cgroup/$h"
    mount -t cgroup -o "$h" cgroup "$ROOT/sys/fs/cgroup/$h"
  done
  mkdir -p "$ROOT/sys/fs/cgroup/systemd" "$ROOT/sys/fs/cgroup/unified"
  mount -t cgroup -o none,name=systemd cgroup "$ROOT/sys/fs/cgroup/systemd"
  mount -t cgroup2 cgroup2 "$ROOT/sys/fs/cgroup/unified"
  mount --rbind /dev "$ROOT/dev"
  mount -t tmpfs -o mode=1777 tmpfs "$ROOT/tmp"
  # A checkout under /tmp has its mount point on that tmpfs (elsewhere, in the overlay).
  mkdir -p "$ROOT$REPO"
  mount --bind "$REPO" "$ROOT$REPO"
  hostname "$NAME"
  exec chroot "$ROOT" /usr/bin/env -i container=appease-test /lib/systemd/systemd
}

start() {
  [ -e "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && die "running already (PID $(cat "$PIDFILE"))"
  [ -x /lib/systemd/systemd ] || die "systemd is not installed: apt-get install systemd dbus"
  rm -rf "$STATE"
  for h in $HIERARCHIES; do mkdir -p "/sys/fs/cgroup/$h/$NAME"; done
  cat /sys/fs/cgroup/cpuset/cpuset.cpus > "/sys/fs/cgroup/cpuset/$NAME/cpuset.cpus"
  cat /sys/fs/cgroup/cpuset/cpuset.mems > "/sys/fs/cgroup/cpuset/$NAME/cpuset.mems"
  # Into the container's groups first: the cgroup namespace takes its root from them.
  ( for h in $HIERARCHIES; do echo "$BASHPID" > "/sys/fs/cgroup/$h/$NAME/cgroup.procs"; done
    exec unshare --mount --pid --cgroup --uts --ipc --fork "$0" inside ) > "/run/$NAME.log" 2>&1 &
  for _ in $(seq 50); do
    pid=$(pgrep -P $! -x systemd || true)
    [ -n "$pid" ] && break
    sleep 0.2
  done
  [ -n "${pid:-}" ] || die "systemd did not start; see /run/$NAME.log"
  echo "$pid" > "$PIDFILE"
  for _ in $(seq 100); do
    state=$(run systemctl is-system-running 2>/dev/null || true)
    case $state in running|degraded) break ;; esac
    sleep 0.2
  done
  case $state in running|degraded) ;; *) die "systemd is $state after 20 s; see /run/$NAME.log" ;; esac
  echo "$pid"
}

run() { nsenter -t "$(cat "$PIDFILE")" -m -u -i -p -C -r -w "$@"; }

# Where the kernel gives real-time tasks CPU time by group (v1 with RT group scheduling, as
# here), a new group has none, and appease's daemon, refused the real-time class it takes on
# most hosts (cgroup v2, kernels without RT group scheduling), ran at nice -20 in the fair
# class, where its wake-ups lengthen a server's tail (docs/findings.md, "The synthetic tail").
# The container's group and its system.slice get a share of the root's real-time time, and
# each command's scope a share of that (below); they go with the container.
rt_budget() {
  local g=/sys/fs/cgroup/cpu/$NAME
  [ -e "$g/cpu.rt_runtime_us" ] && [ -d "$g/system.slice" ] || return 0
  [ "$(cat "$g/cpu.rt_runtime_us")" -gt 0 ] || echo 500000 > "$g/cpu.rt_runtime_us"
  [ "$(cat "$g/system.slice/cpu.rt_runtime_us")" -gt 0 ] || echo 400000 > "$g/system.slice/cpu.rt_runtime_us"
}

# A command in a scope of its own in system.slice: inside the container's cgroup root, as
# systemd tracks it, and gone with it. Inside, the scope first takes its real-time share, 50
# ms a second (eight commands at once fit; a ninth runs without, and appease there says in its
# log that it runs at nice -20).
run_scoped() {
  [ -e "$PIDFILE" ] || die "not running: scripts/systemd-container.sh start"
  for h in $HIERARCHIES; do echo $$ > "/sys/fs/cgroup/$h/$NAME/cgroup.procs"; done
  rt_budget
  local unit=exec-$$.scope
  run systemd-run --scope --quiet --collect --slice=system.slice --unit="$unit" /bin/sh -c \
    "echo 50000 2>/dev/null > /sys/fs/cgroup/cpu/system.slice/$unit/cpu.rt_runtime_us; exec \"\$@\"" \
    systemd-container-exec "$@"
}

stop() {
  if [ -e "$PIDFILE" ]; then
    kill -KILL "$(cat "$PIDFILE")" 2>/dev/null || true  # PID 1 of its namespace: all go with it
    rm -f "$PIDFILE"
    sleep 1
  fi
  rm -f "/run/$NAME.log"
  for h in $HIERARCHIES; do
    [ -d "/sys/fs/cgroup/$h/$NAME" ] && find "/sys/fs/cgroup/$h/$NAME" -depth -type d -exec rmdir {} \;
  done
  # The overlay went with the mount namespace: only its writes are left.
  rm -rf "$STATE"
  return 0
}

case ${1:-} in
  start) start ;;
  exec) shift; run_scoped "$@" ;;
  stop) stop ;;
  inside) inside ;;
  *) die "usage: $0 start | exec CMD… | stop" ;;
esac
