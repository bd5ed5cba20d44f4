#!/usr/bin/env bash
# What watching costs a loopback client and its server, with no batch beside them: `ab`
# against a private nginx, alone and beside `appease daemon --dry-run` (the probe loaded,
# nothing changed), the two interleaved round by round. Prints each round and the medians
# of wall time and ab's CPU, and the second's over the first's. Root.
#
#   scripts/probe-overhead.sh                    # 12 rounds, 30,000 requests, 256 clients
#   ROUNDS=8 REQUESTS=50000 CLIENTS=64 KEEPALIVE=1 scripts/probe-overhead.sh
#
# ab runs at nice -10, as in `appease bench web`. nginx listens on 127.0.0.1:${PORT:-18080}
# from a directory of its own, and is stopped (by its PID) on every exit.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
appease=${APPEASE:-$repo/target/release/appease}
rounds=${ROUNDS:-12}
requests=${REQUESTS:-30000}
clients=${CLIENTS:-256}
port=${PORT:-18080}
keepalive=${KEEPALIVE:+-k}

[ "$(id -u)" = 0 ] || { echo "probe-overhead.sh: needs root (the daemon loads BPF programs)" >&2; exit 2; }
for tool in nginx ab "$appease"; do
    command -v "$tool" > /dev/null || { echo "probe-overhead.sh: $tool not found (make bench-deps build)" >&2; exit 2; }
done

dir=$(mktemp -d) # a fresh directory only root can write
daemon=""
cleanup() {
    [ -n "$daemon" ] && kill "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null || true
    if [ -s "$dir/nginx.pid" ]; then
        nginx=$(cat "$dir/nginx.pid")
        kill "$nginx" 2> /dev/null || true
        for _ in $(seq 50); do kill -0 "$nginx" 2> /dev/null || break; sleep 0.1; done
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

mkdir -p "$dir/html" "$dir/logs"
head -c 8192 /dev/zero | tr '\0' x > "$dir/html/page.html"
cat > "$dir/nginx.conf" <<EOF
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/logs/error.log;
events { worker_connections 4096; }
http {
    access_log off;
    server { listen 127.0.0.1:$port; root $dir/html; }
}
EOF
nginx -p "$dir" -c "$dir/nginx.conf"
sleep 0.5
url=http://127.0.0.1:$port/page.html

# "WALL CPU" of one ab run (CPU: user + system, s).
run_ab() {
    /usr/bin/time -f "%e %U %S" nice -n -10 ab -q $keepalive -n "$requests" -c "$clients" "$url" 2>&1 > /dev/null |
        tail -1 | awk '{ printf "%s %.2f\n", $1, $2 + $3 }'
}

results=$dir/rounds.txt
echo "ab ${keepalive:+-k }-n $requests -c $clients, $rounds rounds: alone, then beside appease daemon --dry-run"
for i in $(seq 1 "$rounds"); do
    alone=$(run_ab)
    "$appease" daemon --dry-run --log warn > "$dir/daemon.log" 2>&1 &
    daemon=$!
    sleep 3 # the probe loaded and the first scan done
    kill -0 "$daemon" || { echo "probe-overhead.sh: the daemon stopped:" >&2; cat "$dir/daemon.log" >&2; exit 1; }
    watched=$(run_ab)
    kill "$daemon"
    wait "$daemon" || true
    daemon=""
    echo "round $i: alone $alone, watched $watched (wall s, ab CPU s)"
    echo "alone $alone" >> "$results"
    echo "watched $watched" >> "$results"
    sleep 3 # as long as the watched run waited: neither run follows the other's exit at once
done
python3 - "$results" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    kind, wall, cpu = line.split()
    runs.setdefault(kind, []).append((float(wall), float(cpu)))
alone = [statistics.median(x[i] for x in runs["alone"]) for i in (0, 1)]
watched = [statistics.median(x[i] for x in runs["watched"]) for i in (0, 1)]
print(f"median wall {alone[0]:.3f} s alone, {watched[0]:.3f} watched ({watched[0] / alone[0]:.3f}); "
      f"ab CPU {alone[1]:.3f} s, {watched[1]:.3f} ({watched[1] / alone[1]:.3f})")
EOF
