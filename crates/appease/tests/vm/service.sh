# appease as a systemd service (deploy/appease.service, as `make install` fills it in),
# under Debian's systemd: started with Type=notify (start returns once it said READY),
# kept alive by its watchdog pings, reloaded, restarted after kill -9 with
# ExecStopPost=appease restore in between, stopped with nothing left.
. /opt/appease/lib.sh

mkdir -p /etc/appease
cp /tmp/batch.toml /etc/appease/appease.toml
sed -e 's|@BINDIR@|/opt/appease|g' -e 's|@SYSCONFDIR@|/etc|g' /opt/appease/appease.service \
  > /etc/systemd/system/appease.service
systemctl daemon-reload
unset APPEASE_RUN_DIR  # the unit's daemon uses /run/appease
systemd-run --quiet --unit=soak-svc sh -c "$SOAK"

check "systemd accepts the unit" systemd-analyze verify /etc/systemd/system/appease.service
check "start returns once the daemon says it is ready" timeout 120 systemctl start appease
STARTED=$(date +%s)
check "the service is active" systemctl is-active --quiet appease
MAIN=$(systemctl show -P MainPID appease)
echo "main pid $MAIN"
check "it answers on its control socket" wait_until 30 /opt/appease/appease status
check "the soaker's unit is made idle" wait_until 60 sh -c '[ "$(systemctl show -P CPUWeight soak-svc)" = idle ]'
# CAP_BPF 39, CAP_PERFMON 38, CAP_SYS_NICE 23, CAP_DAC_OVERRIDE 1, CAP_CHOWN 0; after
# start the daemon keeps SYS_NICE and DAC_OVERRIDE.
bounded=$(printf '%016x' $(( (1 << 39) | (1 << 38) | (1 << 23) | (1 << 1) | 1 )))
kept=$(printf '%016x' $(( (1 << 23) | (1 << 1) )))
check "capabilities are bounded by the unit" [ "$(awk '/^CapBnd/ {print $2}' /proc/$MAIN/status)" = "$bounded" ]
check "the daemon keeps only SYS_NICE and DAC_OVERRIDE" [ "$(awk '/^CapEff/ {print $2}' /proc/$MAIN/status)" = "$kept" ]
# WatchdogSec=10s: without a ping every 10 s systemd would kill and restart it; 15 s
# after the start, it would have.
left=$((STARTED + 15 - $(date +%s)))
[ "$left" -le 0 ] || sleep "$left"
check "watchdog pings keep it running" [ "$(systemctl show -P NRestarts appease)" = 0 ]
check "same main pid after the watchdog period" [ "$(systemctl show -P MainPID appease)" = "$MAIN" ]
check "reload returns and the service stays active" sh -c 'timeout 60 systemctl reload appease && systemctl is-active --quiet appease'
# journald takes a service's lines asynchronously: a log check waits for its line.
in_log() { journalctl -u appease --no-pager | grep -q "$@"; }
check "the reload's report is in the service's log" wait_until 10 in_log 'reloaded /etc/appease/appease.toml'
# A crash: ExecStopPost puts back what the journal holds, then systemd starts it again.
kill -KILL "$MAIN"
check "after kill -9 systemd restarts it" wait_until 60 sh -c "[ \"\$(systemctl show -P NRestarts appease)\" = 1 ] && systemctl is-active --quiet appease"
check "ExecStopPost ran appease restore" wait_until 10 in_log 'restored [0-9]* thread(s);'
# The restarted daemon looks for leftovers before it logs that it dropped capabilities.
check "the restarted daemon's start is in the log" wait_until 30 sh -c '[ "$(journalctl -u appease --no-pager | grep -c "dropped every other capability")" -ge 2 ]'
check "so the restarted daemon found nothing left behind" sh -c "! journalctl -u appease --no-pager | grep -q 'left behind'"
# A hang: stopped, the daemon pings no more; the watchdog (10 s) ends it (SIGABRT, then
# SIGKILL after TimeoutAbortSec) and systemd starts it again.
check "the restarted daemon is ready" wait_until 30 /opt/appease/appease status
HUNG=$(systemctl show -P MainPID appease)
kill -STOP "$HUNG"
check "status says the stopped daemon does not answer" sh -c "/opt/appease/appease status 2>&1 | grep -q 'did not answer'"
check "the watchdog restarts a hung daemon" wait_until 60 sh -c "[ \"\$(systemctl show -P NRestarts appease)\" = 2 ] && systemctl is-active --quiet appease"
check "with a new main pid" [ "$(systemctl show -P MainPID appease)" != "$HUNG" ]
check "the watchdog's timeout is in the log" wait_until 10 in_log -i 'watchdog timeout'
check "stop" timeout 60 systemctl stop appease
check "the soaker's unit is given back" wait_until 10 sh -c '[ "$(systemctl show -P CPUWeight soak-svc)" != idle ]'
check "no journal left" [ ! -e /run/appease/journal.jsonl ]
journalctl -u appease --no-pager | tail -5
systemctl stop soak-svc
finish
