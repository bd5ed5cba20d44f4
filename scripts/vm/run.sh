#!/usr/bin/env bash
# Boots the test VM (scripts/vm/image.sh) once, runs a script in it, powers it off and
# prints what the script printed; exits with the script's exit code.
#
#   scripts/vm/run.sh systemd|init SCRIPT [FILE…]
#
# systemd: Debian's systemd is PID 1 (cgroup v2 under systemd); init: a minimal shell is
# PID 1 (cgroup v2 without a service manager). SCRIPT runs as root once the system is up,
# with FILEs (and the appease binary, as /opt/appease/appease) beside it in /opt/appease.
# The base image is never written (QEMU's -snapshot); the VM has no network. QEMU
# emulates the CPU (TCG): this machine offers /dev/kvm, but its nested KVM fails on the
# guest kernel's first instructions, so figures taken in the VM are not timing figures.
# The two emulated CPUs share one host thread (thread=single) and the guest loads no KVM
# module: with a host thread per CPU, the guest kernel crashed in the scheduler now and
# then while kernel text was patched at boot (oopses in dequeue_entity).
set -euo pipefail

die() { echo "vm-run: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: $0 systemd|init SCRIPT [FILE…]"
mode=$1; script=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${APPEASE_BIN:-$repo/target/release/appease}
[ -x "$bin" ] || die "no appease binary at $bin: build it first (cargo build --release -p appease)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing: apt-get install qemu-system-x86 (make test installs it)"
base=$("$here/image.sh")
dir=${APPEASE_VM_DIR:-/var/cache/appease-vm}
kernel=$(ls "$dir"/root/boot/vmlinuz-* | sort -V | tail -1)
initrd=$(ls "$dir"/root/boot/initrd.img-* | sort -V | tail -1)

work=$(mktemp -d /tmp/appease-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/opt"
cp "$bin" "$work/opt/appease"
cp "$script" "$work/opt/run.sh"
for f in "$@"; do cp "$f" "$work/opt/"; done
truncate -s 512M "$work/opt.img"
mkfs.ext4 -q -F -d "$work/opt" "$work/opt.img"

case "$mode" in
  systemd) init="" ;;
  init) init="init=/usr/local/sbin/appease-vm-init" ;;
  *) die "mode must be systemd or init, not $mode" ;;
esac
log="$work/console.log"
timeout "${APPEASE_VM_TIMEOUT:-900}" qemu-system-x86_64 -accel tcg,thread=${APPEASE_VM_TCG_THREAD:-single} -cpu max -smp 2 -m 2048 -vga none \
  -nographic -no-reboot -nic none -snapshot \
  -kernel "$kernel" -initrd "$initrd" \
  -append "root=/dev/vda rw console=ttyS0 loglevel=${APPEASE_VM_LOGLEVEL:-3} systemd.show_status=false systemd.firstboot=off random.trust_cpu=on modprobe.blacklist=kvm,kvm_amd,kvm_intel panic=-1 $init" \
  -drive "file=$base,format=raw,if=virtio" \
  -drive "file=$work/opt.img,format=raw,if=virtio" > "$log" 2>&1 || true
# What the script printed: everything from its first line to the end marker, without
# the terminal's control sequences.
sed -e 's/\x1b\[[0-9;?!]*[a-zA-Z]//g' -e 's/\x1b[c=>]//g' -e 's/^.*=== VM RUN START/=== VM RUN START/' "$log" | tr -d '\r' > "$work/clean.log"
if ! grep -q "^=== VM RUN END rc=" "$work/clean.log"; then
  echo "vm-run: the script did not finish; the console said:" >&2
  tail -40 "$work/clean.log" >&2
  exit 3
fi
sed -n '/^=== VM RUN START/,/^=== VM RUN END/p' "$work/clean.log"
rc=$(sed -n 's/^=== VM RUN END rc=\([0-9]*\).*/\1/p' "$work/clean.log" | tail -1)
exit "$rc"
