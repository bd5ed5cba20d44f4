#!/usr/bin/env bash
# Reruns the rows of docs/RESULTS.md's summary table, each with the command its row gives,
# one after the other, and says how long each took. Root; the whole set takes hours.
#
#   scripts/results.sh                 # every row
#   scripts/results.sh db frames       # only these rows
#   scripts/results.sh --list          # the rows and their commands
#   scripts/results.sh --tables        # rewrite the docs' generated tables from docs/results/
#
# PEER_BIN=ananicy=PATH,system76-scheduler=PATH adds the peer daemons to the rows that
# compare them (built as docs/RESULTS.md, "Compared with other daemons", says); without it
# those rows run without the peers, whose columns then keep their dates.
# Each row's text output, JSON, CSV and plots land in ${OUT:-bench-out}/ROW/; a line per row
# with its time goes to ${OUT:-bench-out}/times.txt. Each row's result.json is kept as
# docs/results/ROW.json and the docs' tables are written again from the kept files: review
# with `git diff docs/`. A summary row that still lists typed `cells` in
# docs/results/summary.toml takes its kept file once given `file = "ROW.json"` instead.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
appease=${APPEASE:-$repo/target/release/appease}
out=${OUT:-$repo/bench-out}
peers=${PEER_BIN:+ananicy,system76-scheduler,}
peer_bin=${PEER_BIN:+ --peer-bin $PEER_BIN}
vs="unloaded,unmanaged,batch-cgroup-idle,${peers}appease"

# name | arguments of `appease bench`, as the summary's rows give them (a test in
# crates/appease/tests/docs holds the two lists to one another)
rows() {
    cat <<EOF
synthetic|synthetic --modes $vs --repeat 5$peer_bin
sweep|synthetic --load 1,2,4,8 --modes unloaded,unmanaged,batch-cgroup-idle,appease --repeat 5
script|synthetic --batch script --repeat 3
compile|synthetic --batch compile --modes $vs --repeat 5$peer_bin
containers|synthetic --batch docker --repeat 3 --modes unloaded,unmanaged,batch-cgroup-idle,appease
web|web --modes $vs --repeat 5$peer_bin
db|db --modes $vs --repeat 3$peer_bin
db-analytic|db-analytic --modes $vs --repeat 3$peer_bin
db-analytic-fresh|db-analytic-fresh --modes unloaded,unmanaged,batch-cgroup-idle,appease --repeat 3
frames|frames --modes $vs --repeat 3$peer_bin
pipeline|pipeline --modes $vs --repeat 3$peer_bin
utilization|utilization --repeat 3${PEER_BIN:+ --modes ananicy,system76-scheduler}$peer_bin
web-clients|web --clients 2,4,8,16,32,64,128,256
db-clients|db --clients 2,4,8,16,32,64,128,256
nested-redis|nested --server redis --repeat 8 --seconds 10
nested-limited|nested --server synthetic --shape systemd-limited,session-limited,cron-limited --modes unloaded,unmanaged,batch-group-idle,batch-branch-idle,batch-cgroup-idle,appease --repeat 8 --seconds 10
nested-container|nested --server synthetic --shape container,container-limited --modes unmanaged,batch-group-idle,batch-branch-idle,batch-cgroup-idle,appease --repeat 8 --seconds 10
nested-container-redis|nested --server redis --shape container --modes unmanaged,batch-branch-idle,batch-cgroup-idle,appease --repeat 8 --seconds 10
nested-container-postgresql|nested --server postgresql --shape container --modes unmanaged,batch-branch-idle,batch-cgroup-idle,appease --repeat 8 --seconds 10
nested-postgresql|nested --server postgresql --shape systemd-limited --modes unloaded,unmanaged,batch-branch-idle,batch-cgroup-idle,appease --repeat 8 --seconds 10
fetch|fetch --repeat 5 --seconds 10
EOF
}

if [ "${1:-}" = --list ]; then
    rows | sed 's/|/: appease bench /'
    exit 0
fi

# Each block between `<!-- generated: appease ARGS -->` and `<!-- end generated -->` in
# README.md and docs/*.md becomes the output of `appease ARGS` run at the repository's root.
# A page is replaced only once all its blocks were written (a command that fails, or a
# block without its end marker, leaves it as it was).
tables() (
    [ -x "$appease" ] || { echo "$0: no $appease: run \`make build\` first" >&2; exit 1; }
    cd "$repo"
    for page in README.md docs/*.md; do
        grep -q '^<!-- generated: appease ' "$page" || continue
        BIN=$appease awk '
            /^<!-- generated: appease .* -->$/ {
                print; cmd = $0; sub(/^<!-- generated: appease /, "", cmd); sub(/ -->$/, "", cmd)
                run = "\"" ENVIRON["BIN"] "\" " cmd
                while ((run | getline line) > 0) print line
                if (close(run) != 0) { print "failed: appease " cmd > "/dev/stderr"; exit 1 }
                skipping = 1; next
            }
            /^<!-- end generated -->$/ { skipping = 0 }
            !skipping { print }
            END { if (skipping) { print FILENAME ": a generated block without its end" > "/dev/stderr"; exit 1 } }
        ' "$page" >"$page.new" && mv "$page.new" "$page" || { rm -f "$page.new"; exit 1; }
        echo "$page: tables written" >&2
    done
)
if [ "${1:-}" = --tables ]; then
    tables
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "$0: needs root (the bench changes priorities and cgroups)" >&2; exit 1; }
[ -x "$appease" ] || { echo "$0: no $appease: run \`make build\` first" >&2; exit 1; }
known=$(rows | cut -d'|' -f1)
for want in "$@"; do
    grep -qx -- "$want" <<<"$known" || { echo "$0: no row named '$want'; rows: $(echo $known)" >&2; exit 2; }
done

# An interrupted bench prints what it measured and exits 0, as `ping` does; the rows after
# it are not started.
trap 'echo "$0: interrupted; the row that ran last is incomplete" >&2; exit 130' INT TERM
mkdir -p "$out"
start=$SECONDS
while IFS='|' read -r name args; do
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx -- "$name"; then continue; fi
    echo "== $name: appease bench $args" >&2
    t0=$SECONDS
    mkdir -p "$out/$name"
    # shellcheck disable=SC2086 # the arguments are words
    "$appease" bench $args --out "$out/$name" >"$out/$name/table.txt" ||
        { echo "$0: row $name failed" >&2; exit 1; }
    echo "$(date -u +%F) $name $((SECONDS - t0)) s: appease bench $args" | tee -a "$out/times.txt" >&2
    cp "$out/$name/result.json" "$repo/docs/results/$name.json"
    tables
done < <(rows)
echo "all asked rows: $(((SECONDS - start) / 60)) min" >&2
