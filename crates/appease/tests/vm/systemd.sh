# cgroup v2 under systemd (Debian 13, systemd as PID 1): appease writes no cgroup of
# systemd's. A soaker that is all its unit holds makes the unit idle through systemd
# (CPUWeight=idle, a runtime property); one that shares its unit with other work is
# demoted per thread (SCHED_IDLE). Either way it stays in its unit, held to its limits.
. /opt/appease/lib.sh

unit_idle() { [ "$(cat "/sys/fs/cgroup$1/cpu.idle")" = 1 ]; }
# Without CPU settings left in its subtree, systemd takes the cpu controller off a unit
# (no cpu.idle file): not idle either.
unit_not_idle() { f="/sys/fs/cgroup$1/cpu.idle"; [ ! -e "$f" ] || [ "$(cat "$f")" = 0 ]; }
# stays_not_idle SECONDS UNIT: not idle at any poll over that time.
stays_not_idle() { ! wait_until "$1" unit_idle "$2"; }
SVC=/system.slice/soak-svc.service
USR=/user.slice/soak-user.scope
MIX=/system.slice/mixed.service
# Every unit here is transient (systemd-run): runtime drop-ins live under /run/systemd/transient.
dropin() { echo "/run/systemd/transient/$1.d/50-CPUWeight.conf"; }

systemd-run --quiet --scope --unit=soak-user --slice=user.slice sh -c "$SOAK" &
USER_SOAK=$!
systemd-run --quiet --unit=soak-svc -p CPUQuota=50% -p TasksMax=6 sh -c "$SOAK"
# A supervisor of a server (listening since before appease starts, never asked) and a
# soaker: only the soaker is batch. The server prints its port once it listens. (One that
# listens only after appease judged the unit has the tree judged again at its listen():
# crates/policy/src/batch/tests.rs.)
systemd-run --quiet --unit=mixed sh -c "$A bench-worker server --cpu-ms 1 > /run/mixed.port & sh -c '$SOAK' & wait"
wait_until 10 systemctl is-active --quiet soak-svc
wait_until 10 systemctl is-active --quiet mixed
wait_until 10 test -s /run/mixed.port
SVC_SOAK=$(systemctl show -P MainPID soak-svc)
MIX_MAIN=$(systemctl show -P MainPID mixed)
wait_until 5 pgrep -P "$MIX_MAIN" -x sh > /dev/null
MIX_SOAK=$(pgrep -P "$MIX_MAIN" -x sh)
echo "soakers: $USR $USER_SOAK, $SVC $SVC_SOAK, $MIX $MIX_SOAK (main $MIX_MAIN)"

start_daemon $CONFIG
check "status names the layout cgroup-v2-systemd" sh -c "$A status | grep -q '^host: cgroup-v2-systemd'"
check "the service holding only a soaker is made idle" wait_until 60 unit_idle $SVC
echo "systemctl show -P CPUWeight soak-svc: $(systemctl show -P CPUWeight soak-svc)"
check "through systemd: the unit's CPUWeight is idle" [ "$(systemctl show -P CPUWeight soak-svc)" = idle ]
check "the scope in user.slice holding only a soaker is made idle" wait_until 60 unit_idle $USR
check "systemd keeps the setting in a runtime drop-in" grep -q "CPUWeight=idle" "$(dropin soak-user.scope)"
check "the soaker beside other work in its unit is demoted per thread" wait_until 60 is_idle "$MIX_SOAK"
check "the unit with other work stays non-idle" unit_not_idle $MIX
check "and is not made idle in the next second either" stays_not_idle 1 $MIX
check "the other work in that unit is untouched" is_normal "$MIX_MAIN"
check "the service soaker is still in its unit" in_cgroup "$SVC_SOAK" $SVC
check "the user soaker is still in its scope" in_cgroup "$USER_SOAK" $USR
check "the mixed soaker is still in its unit" in_cgroup "$MIX_SOAK" $MIX
check "systemctl status still lists the service's soaker" sh -c "systemctl status soak-svc --no-pager | grep -q \"$SVC_SOAK\""
check "status says how: the unit idle" wait_until 5 sh -c "$A status --json | grep -q 'unit soak-svc.service idle'"
check "status says how: per thread" wait_until 5 sh -c "$A status --json | grep -q 'in place: systemd owns'"
# With the other soakers stopped, the idle service takes what it may: its quota.
kill -STOP "$USER_SOAK" "$MIX_SOAK"
used=$(cpus_used $SVC 3)
kill -CONT "$USER_SOAK" "$MIX_SOAK"
echo "soak-svc used $used CPUs after demotion, alone (CPUQuota=50%)"
check "CPUQuota=50% still binds the demoted service" at_most "$used" 0.6
check "the demoted service still runs" at_most 0.3 "$used"
fork_bomb $SVC
check "the service's fork attempts hit pids.max" wait_until 60 sh -c "! grep -q '^max 0' /sys/fs/cgroup$SVC/pids.events"
check "TasksMax=6 still binds the demoted service" at_most "$(cat /sys/fs/cgroup$SVC/pids.current)" 6
check "appease made no cgroup" sh -c "! ls /sys/fs/cgroup | grep -q appease"
check "appease made no unit" sh -c "! systemctl list-units --all --no-legend 'appease*' | grep -v appease-vm-run | grep -q ."
systemctl stop soak-svc
check "systemctl stop of the service stops its demoted soaker" wait_until 10 sh -c "! kill -0 $SVC_SOAK 2>/dev/null"

systemctl daemon-reexec
check "after systemd re-executes itself the scope is still idle" wait_until 30 unit_idle $USR
stop_daemon
# systemd applies a changed property to the cgroup from its event loop, just after the call.
check "on exit (after the re-exec) the scope is no longer idle" wait_until 10 unit_not_idle $USR
check "on exit the scope's CPUWeight is unset again" [ "$(systemctl show -P CPUWeight soak-user.scope)" = "[not set]" ]
check "on exit appease's runtime drop-in is gone" [ ! -e "$(dropin soak-user.scope)" ]
check "on exit the mixed soaker is back in SCHED_OTHER" is_normal "$MIX_SOAK"
check "on exit no journal is left" [ ! -e $APPEASE_RUN_DIR/journal.jsonl ]

# An administrator's own runtime setting survives appease.
systemctl set-property --runtime soak-user.scope CPUWeight=50
ADMIN=$(cat "$(dropin soak-user.scope)")
start_daemon $CONFIG
check "made idle again by a new daemon" wait_until 60 unit_idle $USR
kill -KILL "$DAEMON"; wait "$DAEMON" 2>/dev/null
check "still idle after kill -9" unit_idle $USR
check "appease restore succeeds" $A restore
check "after restore the scope is no longer idle" wait_until 10 unit_not_idle $USR
check "after restore the administrator's CPUWeight is back" [ "$(systemctl show -P CPUWeight soak-user.scope)" = 50 ]
check "after restore the administrator's drop-in is as it was" [ "$(cat "$(dropin soak-user.scope)")" = "$ADMIN" ]
check "after restore the mixed soaker is back in SCHED_OTHER" is_normal "$MIX_SOAK"
check "after restore the soakers are still in their units" sh -c "[ \"\$(sed -n 's/^0:://p' /proc/$USER_SOAK/cgroup)\" = $USR ]"

cat > /tmp/svc.toml <<'TOML'
[[service]]
name = "web"
unit = "nginx.service"
TOML
$A daemon --config /tmp/svc.toml > /tmp/svc.log 2>&1
rc=$?
cat /tmp/svc.log
check "service groups are refused at start with one clear error" sh -c "[ $rc -ne 0 ] && grep -q 'not available on a cgroup v2 host under systemd' /tmp/svc.log"
kill "$USER_SOAK"
systemctl stop mixed

# The branch rules through the bus, beside a server answering requests. It runs in a slice of
# its own: system.slice also holds this script and its clients, busy enough on emulated CPUs to
# be demoted as batch, and a side that holds batch is not weighted up.
# client PORT: one request to the bench's server (1 byte, 16 back) every 200 ms; no more
# often, or its forks on the VM's emulated CPUs make it a CPU soaker of its own.
client() {
  bash -c "exec 3<>/dev/tcp/127.0.0.1/$1; while :; do printf x >&3; dd bs=16 count=1 <&3 status=none > /dev/null; sleep 0.2; done" &
}
systemd-run --quiet --unit=web --slice=serve.slice $A bench-worker server --cpu-ms 1 --port 7001
wait_until 10 sh -c "bash -c ': < /dev/tcp/127.0.0.1/7001' 2>/dev/null"
client 7001
WEB_CLIENT=$!
# A soaker alone in a scope: the scope idle for it, and user.slice, where its branch meets
# the server's, idle too.
systemd-run --quiet --scope --unit=batch --slice=user.slice sh -c "$SOAK" &
BATCH=$!
weighted() { [ "$(systemctl show -P CPUWeight serve.slice)" = "$1" ]; }
start_daemon $CONFIG
check "user.slice, where the batch's branch meets the server's, is made idle" wait_until 60 unit_idle /user.slice
check "the batch's scope is idle for its tree" unit_idle /user.slice/batch.scope
check "the server's side is not weighted up while the batch's is idle" weighted "[not set]"
check "through systemd: user.slice's CPUWeight is idle" [ "$(systemctl show -P CPUWeight user.slice)" = idle ]
check "status lists the slice made idle through systemd" wait_until 5 sh -c "$A status --json | grep -q 'unit user.slice CPUWeight=idle through systemd'"
kill "$BATCH"
check "with the batch gone, user.slice is given back" wait_until 30 unit_not_idle /user.slice
check "and its CPUWeight is unset again" [ "$(systemctl show -P CPUWeight user.slice)" = "[not set]" ]
# A soaker sharing its scope with a serving server: user.slice cannot be idle, so
# serve.slice, the server's side, is weighted up.
systemd-run --quiet --scope --unit=dev --slice=user.slice sh -c "$A bench-worker server --cpu-ms 1 --port 7002 & sh -c '$SOAK' & wait" &
DEV=$!
wait_until 10 sh -c "bash -c ': < /dev/tcp/127.0.0.1/7002' 2>/dev/null"
client 7002
DEV_CLIENT=$!
check "serve.slice, the server's side, is weighted up through systemd" wait_until 60 weighted 10000 ||
  { $A status; tail -40 /tmp/daemon.log; }
check "user.slice stays non-idle: a server serves in it" unit_not_idle /user.slice
check "init.scope is not weighted up (PID 1 answering systemctl is no server)" [ "$(systemctl show -P CPUWeight init.scope)" = "[not set]" ]
check "status lists serve.slice weighted" wait_until 5 sh -c "$A status --json | grep -q 'unit serve.slice CPUWeight=10000 through systemd'"
stop_daemon
check "on exit serve.slice's CPUWeight is unset again" wait_until 10 weighted "[not set]"
check "on exit appease's drop-in for serve.slice is gone" sh -c "! ls /run/systemd/*/serve.slice.d/50-CPUWeight.conf 2>/dev/null"
check "on exit no journal is left" [ ! -e $APPEASE_RUN_DIR/journal.jsonl ]
start_daemon $CONFIG
check "weighted up again by a new daemon" wait_until 60 weighted 10000
kill -KILL "$DAEMON"; wait "$DAEMON" 2>/dev/null
check "still weighted up after kill -9" weighted 10000
check "appease restore succeeds" $A restore
check "after restore serve.slice's CPUWeight is unset" wait_until 10 weighted "[not set]"
check "after restore no journal is left" [ ! -e $APPEASE_RUN_DIR/journal.jsonl ]
kill "$WEB_CLIENT" "$DEV_CLIENT" "$DEV"
systemctl stop web dev.scope 2>/dev/null

# Kubernetes pods under the kubelet's systemd driver: slices of systemd's (a dash nests a
# slice). A BestEffort pod's slice is made idle through the bus, a Burstable one's is not.
# appease runs in a cgroup namespace of its own, as containerd starts a pod on a cgroup v2
# node (`unshare --cgroup`: rooted at this script's cgroup); it joins the host's first.
BE_UNIT=kubepods-besteffort-pod12_34.slice
POD=/kubepods.slice/kubepods-besteffort.slice/$BE_UNIT
BURST=/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod56_78.slice
systemd-run --quiet --scope --slice=$BE_UNIT --unit=cri-containerd-ab sleep 600 &
systemd-run --quiet --scope --slice=kubepods-burstable-pod56_78.slice --unit=cri-containerd-cd sleep 600 &
GUAR_UNIT=kubepods-pod9a_bc.slice
GUAR=/kubepods.slice/$GUAR_UNIT
systemd-run --quiet --scope --slice=$GUAR_UNIT --unit=cri-containerd-ef sleep 600 &
wait_until 10 [ -d /sys/fs/cgroup$BURST/cri-containerd-cd.scope ]
wait_until 10 [ -d /sys/fs/cgroup$GUAR/cri-containerd-ef.scope ]
# As the kubelet sets them: a BestEffort pod's weight and pids limit, the BestEffort tier's
# weight, a Burstable pod's weight and limits, a Guaranteed pod's weight and limits.
systemctl set-property --runtime $BE_UNIT CPUWeight=1 TasksMax=1024
systemctl set-property --runtime kubepods-besteffort.slice CPUWeight=1
systemctl set-property --runtime kubepods-burstable-pod56_78.slice CPUWeight=30 CPUQuota=150% MemoryMax=512M
systemctl set-property --runtime $GUAR_UNIT CPUWeight=20 CPUQuota=50% MemoryMax=256M
# Every limit of the three pods and the weights appease must not touch, one line each.
limits() {
  for g in $POD $BURST $GUAR; do
    for f in cpu.max memory.max pids.max; do echo "$g/$f=$(cat /sys/fs/cgroup$g/$f 2>&1)"; done
  done
  for g in $BURST $GUAR /kubepods.slice/kubepods-besteffort.slice; do
    echo "$g/cpu.weight=$(cat /sys/fs/cgroup$g/cpu.weight 2>&1)"
  done
}
LIMITS=$(limits)
echo "$LIMITS"
check "the pods' limits are set" [ "$(cat /sys/fs/cgroup$GUAR/cpu.max)" = "50000 100000" ]
unshare --cgroup $A daemon --config $CONFIG > /tmp/daemon.log 2>&1 &
DAEMON=$!
wait_until 30 $A status > /dev/null 2>&1 || { echo "daemon did not start:"; cat /tmp/daemon.log; }
check "started in a cgroup namespace of its own, it joined the host's" grep -q "joined the host's cgroup namespace" /tmp/daemon.log
check "and is in it now" [ "$(readlink /proc/$DAEMON/ns/cgroup)" = "$(readlink /proc/2/ns/cgroup)" ]
check "the BestEffort pod's slice is made idle through systemd" wait_until 30 unit_idle $POD
check "its CPUWeight is idle" [ "$(systemctl show -P CPUWeight $BE_UNIT)" = idle ]
check "the Burstable pod's slice is not" unit_not_idle $BURST
check "nor the Guaranteed pod's" unit_not_idle $GUAR
check "the pods' limits and the tiers' weights are kept" [ "$(limits)" = "$LIMITS" ]
systemctl set-property --runtime $BE_UNIT CPUWeight=1   # the kubelet setting it again
check "the kubelet's rewrite is seen and the pod made idle afresh" wait_until 30 grep -q "made idle afresh" /tmp/daemon.log
check "idle again" wait_until 30 unit_idle $POD
stop_daemon
check "on exit the pod's CPUWeight is the kubelet's again" wait_until 10 sh -c "[ \"\$(systemctl show -P CPUWeight $BE_UNIT)\" = 1 ]"
check "on exit no journal is left" [ ! -e $APPEASE_RUN_DIR/journal.jsonl ]
check "and the pods' limits and the tiers' weights are as they were" [ "$(limits)" = "$LIMITS" ]
systemctl stop cri-containerd-ab.scope cri-containerd-cd.scope cri-containerd-ef.scope 2>/dev/null
finish
