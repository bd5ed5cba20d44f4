#!/usr/bin/env bash
# Builds (once) the Debian root that appease's host-layout tests boot under QEMU: Debian 13
# with its own kernel (6.12, BTF), systemd as PID 1 and the unified cgroup v2 hierarchy
# with every controller, the layout most hosts run today. Everything comes from Debian's
# packages. The result is cached outside the repository (APPEASE_VM_DIR, default
# /var/cache/appease-vm); a change of this script's VERSION rebuilds it.
#
#   scripts/vm/image.sh        prints the base image's path, building it if needed
set -euo pipefail

VERSION=2
DIR=${APPEASE_VM_DIR:-/var/cache/appease-vm}
SUITE=trixie
MIRROR=${APPEASE_VM_MIRROR:-http://deb.debian.org/debian}
PACKAGES=systemd,systemd-sysv,dbus,linux-image-amd64,procps,iproute2,util-linux,kmod,udev,libelf1t64,zlib1g

die() { echo "vm-image: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap (make test installs it)"
command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 is missing: apt-get install e2fsprogs"

mkdir -p "$DIR"
# One builder at a time: `make test` starts one beside the compile, and the VM test's own
# call waits here for it, then finds the image built.
exec 9> "$DIR/lock"
flock 9

if [ -f "$DIR/base.img" ] && [ "$(cat "$DIR/version" 2>/dev/null)" = "$VERSION" ]; then
  echo "$DIR/base.img"
  exit 0
fi

root="$DIR/root"
# A killed debootstrap may have left /proc or /sys mounted inside: never follow them.
umount -R "$root/proc" "$root/sys" "$root/dev" 2>/dev/null || true
rm -rf --one-file-system "$root" "$DIR/base.img" "$DIR/version"
echo "vm-image: debootstrap $SUITE into $root (about a minute)" >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" > "$DIR/debootstrap.log" 2>&1 \
  || die "debootstrap failed; see $DIR/debootstrap.log"

echo appease-vm > "$root/etc/hostname"
cat > "$root/etc/fstab" <<'FSTAB'
/dev/vda / ext4 rw,errors=remount-ro 0 1
/dev/vdb /opt/appease ext4 rw 0 2
FSTAB
mkdir -p "$root/opt/appease"

# Under systemd: run the test script once the system is up, then power off.
cat > "$root/etc/systemd/system/appease-vm-run.service" <<'UNIT'
[Unit]
Description=Runs /opt/appease/run.sh, then powers off
After=multi-user.target
# The script's disk may appear after multi-user.target is reached: wait for its mount.
RequiresMountsFor=/opt/appease
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "=== VM RUN START" > /dev/ttyS0; sh /opt/appease/run.sh > /dev/ttyS0 2>&1; echo "=== VM RUN END rc=$$?" > /dev/ttyS0'
ExecStopPost=/bin/systemctl poweroff --no-block
[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/appease-vm-run.service \
  "$root/etc/systemd/system/multi-user.target.wants/appease-vm-run.service"
# No getty on the console: the serial line carries the test's output only.
ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"

# Without systemd (init=): a minimal PID 1 that mounts what a host has, the unified
# hierarchy with cpu, pids and memory enabled, runs the test script, then powers off.
cat > "$root/usr/local/sbin/appease-vm-init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -o remount,rw /
mount /dev/vdb /opt/appease
echo "+cpu +pids +memory" > /sys/fs/cgroup/cgroup.subtree_control
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo "=== VM RUN START" > /dev/ttyS0
sh /opt/appease/run.sh > /dev/ttyS0 2>&1
echo "=== VM RUN END rc=$?" > /dev/ttyS0
sync
echo o > /proc/sysrq-trigger
sleep 10
INIT
chmod +x "$root/usr/local/sbin/appease-vm-init"

truncate -s 3G "$DIR/base.img.tmp"
mkfs.ext4 -q -F -d "$root" "$DIR/base.img.tmp"
mv "$DIR/base.img.tmp" "$DIR/base.img"
echo "$VERSION" > "$DIR/version"
echo "$DIR/base.img"
