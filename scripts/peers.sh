#!/usr/bin/env bash
# Builds the peer daemons the bench compares appease with, as docs/RESULTS.md ("Compared with
# other daemons") gives them, outside the repository, and prints the PEER_BIN value that
# scripts/results.sh and `appease bench --peer-bin` take. Root.
#
#   make peers                  # what the builds need (the Makefile's PEER_PACKAGES), then this
#   scripts/peers.sh remove     # remove what this script installed
#
# Where it writes: /opt/appease-peers (both daemons; Ananicy's rules under its prefix) and
# /etc/system76-scheduler (system76-scheduler reads its configuration only there or under
# /usr/share). Sources are cloned from GitHub unless ANANICY_SRC / SYSTEM76_SRC name another
# git repository (a local mirror, say).
set -euo pipefail
dest=/opt/appease-peers
s76_conf=/etc/system76-scheduler
ananicy_src=${ANANICY_SRC:-https://github.com/Nefelim4ag/Ananicy}
ananicy_rev=2.2.1
s76_src=${SYSTEM76_SRC:-https://github.com/pop-os/system76-scheduler}
# main as of 2026-01-15 (after 2.0.2): "fix: add missing loop in process scheduler refresh task"
s76_rev=b0b7e98

[ "$(id -u)" = 0 ] || { echo "$0: needs root (installs under /opt and /etc)" >&2; exit 1; }

if [ "${1:-}" = remove ]; then
    rm -rf "$dest" "$s76_conf"
    echo "removed $dest and $s76_conf" >&2
    exit 0
fi
[ $# = 0 ] || { echo "usage: $0 [remove]" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== Ananicy $ananicy_rev" >&2
git clone -q "$ananicy_src" "$work/ananicy"
git -C "$work/ananicy" checkout -q "$ananicy_rev"
make -s -C "$work/ananicy" install PREFIX="$dest/ananicy-$ananicy_rev"

echo "== system76-scheduler $s76_rev (cargo build --release --locked)" >&2
git clone -q "$s76_src" "$work/system76-scheduler"
git -C "$work/system76-scheduler" checkout -q "$s76_rev"
# Its execsnoop needs kprobes; the path is fixed at build time as its Debian package fixes it.
(cd "$work/system76-scheduler" &&
    EXECSNOOP_PATH=/usr/sbin/execsnoop-bpfcc cargo build --release --locked --quiet)
install -Dm0755 "$work/system76-scheduler/target/release/system76-scheduler" \
    "$dest/system76-scheduler/bin/system76-scheduler"
install -Dm0644 "$work/system76-scheduler/data/config.kdl" "$s76_conf/config.kdl"
install -Dm0644 "$work/system76-scheduler/data/pop_os.kdl" "$s76_conf/process-scheduler/pop_os.kdl"

echo "PEER_BIN=ananicy=$dest/ananicy-$ananicy_rev/usr/bin/ananicy,system76-scheduler=$dest/system76-scheduler/bin/system76-scheduler"
