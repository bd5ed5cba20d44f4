#!/usr/bin/env bash
# A real systemd, as PID 1 of a container made by hand, that manages this machine's v1 `cpu`
# hierarchy with real CPUs: each v1 hierarchy gets a group of the container's own, which a
# cgroup namespace mounts read-write as the container's root (systemd-nspawn mounts the
# controllers read-only in legacy mode). The root file system comes from debootstrap
# (Debian 12, systemd 252).
#
#   scripts/systemd-container.sh start     # prints the container's PID 1 (host PID)
#   scripts/systemd-container.sh exec CMD… # runs CMD inside (systemctl, systemd-run, …)
#   scripts/systemd-container.sh stop      # ends it and removes its groups
#
# Root only. Its groups are /sys/fs/cgroup/HIERARCHY/$NAME and its log /run/$NAME.log; `stop`
# removes them. The root file system stays in $ROOT for the next start.
set -euo pipefail

NAME=${SYSTEMD_CONTAINER_NAME:-appease-sd}
ROOT=${SYSTEMD_CONTAINER_ROOT:-/var/tmp/appease-sd-root}
HIERARCHIES="cpu cpuacct cpuset memory devices freezer blkio pids systemd unified"
PIDFILE=/run/$NAME.pid

die() { echo "systemd-container: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root"

make_root() {
  [ -x "$ROOT/lib/systemd/systemd" ] && return
  command -v debootstrap > /dev/null || die "debootstrap is missing: apt-get install debootstrap"
  debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus bookworm "$ROOT" \
    http://deb.debian.org/debian > /dev/null
}

# Inside the new namespaces (PID 1 there): the API file systems, then systemd.
inside() {
  mount --make-rprivate /
  mount --bind "$ROOT" "$ROOT"
  mount -t proc proc "$ROOT/proc"
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
  hostname "$NAME"
  exec chroot "$ROOT" /usr/bin/env -i container=appease-test /lib/systemd/systemd
}

start() {
  [ -e "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && die "running already (PID $(cat "$PIDFILE"))"
  make_root
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
  echo "$pid"
}

run() { nsenter -t "$(cat "$PIDFILE")" -m -u -i -p -C -r -w "$@"; }

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
  return 0
}

case ${1:-} in
  start) start ;;
  exec) shift; run "$@" ;;
  stop) stop ;;
  inside) inside ;;
  *) die "usage: $0 start | exec CMD… | stop" ;;
esac
