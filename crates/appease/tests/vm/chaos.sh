# The chaos harness's unit rounds (cgroup v2 under systemd): the daemon killed while it
# sets units through systemd, then everything put back, by `appease restore` or by the
# next daemon's start. Each round kills it one way: at a random moment; right after the
# journal record of a unit's CPUWeight, before the call (`written-unit-idle`); right after
# the call (`unit-set`); or, after a kill, in the middle of the restore itself, between
# systemd's call and the drop-in (`unit-put-back`), and then restored again. Some rounds an
# administrator sets the batch's scope's CPUWeight between the crash and the restore: theirs
# is kept. After each round every unit has its CPUWeight, runtime drop-in and cpu.idle as
# before, and no journal is left.
#
# The units: a server in serve.slice answering a client, a soaker alone in a scope of
# user.slice. The scope is made idle for its tree (in_place), user.slice for the branch
# where the batch meets the server (unit_weight): both paths that set a unit.
. /opt/appease/lib.sh

# `make chaos` sets CHAOS_UNIT_ROUNDS; `make test` runs one round, the seventh's kind: killed
# once both units are set, then inside the restore, an administrator's change, `appease
# restore` (each round costs about 20 s on the emulated CPUs).
if [ -n "${CHAOS_UNIT_ROUNDS:-}" ]; then ROUNDS=$CHAOS_UNIT_ROUNDS; FIRST=0; else ROUNDS=1; FIRST=6; fi
BATCH=chaos-batch.scope
UNITS="user.slice $BATCH serve.slice"
# What a unit has: its CPUWeight, its runtime drop-ins' text, whether it is idle. (With no
# CPU setting left in the subtree, systemd may take the cpu controller off a group, or not
# yet: cpu.idle 0 and no cpu.idle at all are the same here.)
dropin_sum() {
  cat /run/systemd/transient/$1.d/50-CPUWeight.conf /run/systemd/system.control/$1.d/50-CPUWeight.conf 2>/dev/null | md5sum | cut -c1-8
}
unit_state() {
  g=$(systemctl show -P ControlGroup "$1")
  echo "$1 weight=$(systemctl show -P CPUWeight "$1") dropin=$(dropin_sum "$1") idle=$(unit_idle "$g" && echo yes || echo no)"
}
state() { for u in $UNITS; do unit_state $u; done; }
state_is() { [ "$(state)" = "$1" ]; }
rand() { od -An -N2 -tu2 /dev/urandom | tr -d ' '; }
# ended PID: the child has exited (a zombie until waited for).
ended() { [ ! -e /proc/$1 ] || [ "$(cut -d' ' -f3 /proc/$1/stat)" = Z ]; }
both_set() { unit_idle /user.slice && unit_idle /user.slice/$BATCH; }
units_set() { echo $(( $(unit_idle /user.slice && echo 1 || echo 0) + $(unit_idle /user.slice/$BATCH && echo 1 || echo 0) )); }
unit_idle() { [ "$(cat "/sys/fs/cgroup$1/cpu.idle" 2>/dev/null)" = 1 ]; }

systemd-run --quiet --unit=chaos-web --slice=serve.slice $A bench-worker server --cpu-ms 1 --port 7003
wait_until 10 sh -c "bash -c ': < /dev/tcp/127.0.0.1/7003' 2>/dev/null"
bash -c "exec 3<>/dev/tcp/127.0.0.1/7003; while :; do printf x >&3; dd bs=16 count=1 <&3 status=none > /dev/null; sleep 0.2; done" &
CLIENT=$!
systemd-run --quiet --scope --unit=${BATCH%.scope} --slice=user.slice sh -c "$SOAK" &
SOAKER=$!
wait_until 10 systemctl is-active --quiet $BATCH
BEFORE=$(state)
echo "before appease:"; echo "$BEFORE"

fired_written=0; fired_set=0; fired_put_back=0; timed=0; admin_rounds=0; clean=0; not_reached=0
i=0
while [ $i -lt "$ROUNDS" ]; do
  i=$((i + 1))
  round=$((FIRST + i))
  kind=$((round % 4))
  n=$(( $(rand) % 2 + 1 ))
  case $kind in
    1) point=written-unit-idle ;;
    2) point=unit-set ;;
    *) point= ;;
  esac
  if [ -n "$point" ]; then
    FAILPOINTS="$point=$((n - 1))*off->return" $A daemon --config $CONFIG > /tmp/crashed.log 2>&1 &
  else
    $A daemon --config $CONFIG > /tmp/crashed.log 2>&1 &
  fi
  DAEMON=$!
  how=""
  case $kind in
    1|2)
      wait_until 60 ended $DAEMON && crashed=yes || crashed=no ;;
    3)
      if wait_until 60 both_set; then how="after both were set"; else
        how="with $(units_set) of 2 units set after 60 s"
        fail "round $i: both units set before the kill" "$(tail -20 /tmp/crashed.log)"
      fi
      how="$how, then in the restore at unit-put-back" ;;
    0)
      ms=$(( $(rand) % 6000 + 500 ))
      sleep "$(echo $ms | awk '{ printf "%.3f", $1 / 1000 }')"
      how="after $ms ms, $(units_set) of 2 units set"
      timed=$((timed + 1)) ;;
  esac
  kill -KILL $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null
  rc=$?
  case $kind in
    1|2)
      # Ended by itself with SIGKILL: the crash point (an error at start would exit 1).
      if [ $crashed = yes ] && [ $rc = 137 ]; then
        how="at $point #$n"
        if [ $kind = 1 ]; then fired_written=$((fired_written + 1)); else fired_set=$((fired_set + 1)); fi
      else
        how="$point #$n not reached (exit $rc)"
        not_reached=$((not_reached + 1))
      fi ;;
  esac
  if [ $kind = 3 ]; then
    FAILPOINTS="unit-put-back=return" $A restore > /tmp/restore1.log 2>&1
    rc=$?
    if [ $rc = 137 ]; then fired_put_back=$((fired_put_back + 1)); else
      how="$how (not reached: rc $rc)"
      not_reached=$((not_reached + 1))
    fi
  fi
  EXPECTED=$BEFORE
  admin=""
  # Every fifth round from the second: through each kind in turn (make test's one round
  # is the seventh's kind: inside a restore).
  if [ $((round % 5)) = 2 ]; then
    systemctl set-property --runtime $BATCH CPUWeight=77
    # The administrator's drop-in is written before the call returns; the cgroup's idle
    # flag follows from systemd's event loop, so it is not read here but expected off.
    admin_line="$BATCH weight=77 dropin=$(dropin_sum $BATCH) idle=no"
    EXPECTED=$(for u in $UNITS; do if [ $u = $BATCH ]; then echo "$admin_line"; else echo "$BEFORE" | grep "^$u "; fi; done)
    admin=", an administrator's CPUWeight=77 on the scope"
    admin_rounds=$((admin_rounds + 1))
  fi
  # Each kind of kill with each way of putting back, over eight rounds.
  if [ $(((round + round / 4) % 2)) = 0 ]; then
    way="appease restore"
    $A restore > /tmp/restore.log 2>&1 || echo "restore failed: $(cat /tmp/restore.log)"
  else
    way="the next daemon's start"
    start_daemon $CONFIG
    cp /tmp/daemon.log /tmp/restore.log
    stop_daemon
  fi
  # systemd applies a property to the cgroup from its event loop, just after the call.
  wait_until 5 state_is "$EXPECTED"
  AFTER=$(state)
  if [ "$AFTER" = "$EXPECTED" ] && [ ! -e $APPEASE_RUN_DIR/journal.jsonl ]; then
    clean=$((clean + 1))
    ok "round $i/$ROUNDS: killed $how$admin, put back by $way: every unit as it was"
  else
    fail "round $i/$ROUNDS: killed $how$admin, put back by $way" "expected:
$EXPECTED
found:
$AFTER
journal: $(cat $APPEASE_RUN_DIR/journal.jsonl 2>/dev/null)
the killed daemon's log: $(grep -v libbpf /tmp/crashed.log | tail -15)
the restore's log: $(tail -15 /tmp/restore.log)"
  fi
  if [ -n "$admin" ]; then
    systemctl set-property --runtime $BATCH CPUWeight=
    rm -f /run/systemd/transient/$BATCH.d/50-CPUWeight.conf
    wait_until 5 state_is "$BEFORE" || fail "round $i: the administrator's setting taken back" "$(state)"
  fi
done
echo "chaos units: $clean of $ROUNDS rounds clean; killed at written-unit-idle $fired_written," \
  "at unit-set $fired_set, in the restore at unit-put-back $fired_put_back, at a random moment $timed;" \
  "$admin_rounds with an administrator's change"
check "every crash point a round aimed at fired" [ $not_reached = 0 ]
kill $CLIENT $SOAKER 2>/dev/null
systemctl stop chaos-web $BATCH 2>/dev/null
finish
