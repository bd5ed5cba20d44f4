# cgroup v2 without a service manager (a minimal PID 1): a soaker at the root moves to
# appease's idle group; one alone in a group with cpu.max and pids.max makes that group
# idle where it is, held to both limits.
. /opt/appease/lib.sh

sh -c "$SOAK" &
FREE=$!
mkdir /sys/fs/cgroup/limited
echo "50000 100000" > /sys/fs/cgroup/limited/cpu.max
echo 6 > /sys/fs/cgroup/limited/pids.max
sh -c "echo \$\$ > /sys/fs/cgroup/limited/cgroup.procs; exec sh -c '$SOAK'" &
LIMITED=$!
wait_until 5 in_cgroup "$LIMITED" /limited

start_daemon $CONFIG
check "status names the layout cgroup-v2" sh -c "$A status | grep -q '^host: cgroup-v2 '"
check "the free soaker moves to its job's group in the idle group" wait_until 60 in_job_group "$FREE" /appease.batch
check "the idle group is idle" [ "$(cat /sys/fs/cgroup/appease.batch/cpu.idle)" = 1 ]
group_idle() { [ "$(cat /sys/fs/cgroup/limited/cpu.idle)" = "$1" ]; }
check "the limited group, holding only the soaker, is made idle in place" wait_until 60 group_idle 1
check "the class is the group's, not per thread" is_normal "$LIMITED"
check "the limited soaker stays in its cgroup" in_cgroup "$LIMITED" /limited
check "status says how" wait_until 5 sh -c "$A status --json | grep -q 'in place: the group is idle'"
used=$(cpus_used /limited 3)
echo "/limited used $used CPUs after demotion (cpu.max 50000 100000)"
check "cpu.max still binds" at_most "$used" 0.6
fork_bomb /limited
check "fork attempts hit pids.max" wait_until 60 sh -c "! grep -q '^max 0' /sys/fs/cgroup/limited/pids.events"
check "pids.max still binds" at_most "$(cat /sys/fs/cgroup/limited/pids.current)" 6
kill_all_but /limited "$LIMITED"

stop_daemon
check "on exit the free soaker is back at the root" in_cgroup "$FREE" /
check "on exit the idle group is removed" [ ! -d /sys/fs/cgroup/appease.batch ]
check "on exit the limited group is no longer idle" group_idle 0

start_daemon $CONFIG
check "demoted again by a new daemon" wait_until 60 in_job_group "$FREE" /appease.batch
wait_until 30 group_idle 1
kill -KILL "$DAEMON"; wait "$DAEMON" 2>/dev/null
check "appease restore succeeds" $A restore
check "after restore the free soaker is back at the root" in_cgroup "$FREE" /
check "after restore no cgroup of appease's is left" [ ! -d /sys/fs/cgroup/appease.batch ]
check "after restore the limited group is no longer idle" group_idle 0
check "after restore the limited soaker is still in its group" in_cgroup "$LIMITED" /limited
kill "$FREE" "$LIMITED"
finish
