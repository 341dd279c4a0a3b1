#!/usr/bin/env bash
# Issue 10's figures: a rebalance after adding a 5th slave to 4, on
# loopback, twice on a freshly loaded cluster each time:
#   1. the move alone (no queries): bytes moved, MB/s;
#   2. the move with `bitfold bench`'s queries running throughout: MB/s, and
#      the master's count of answered queries (its /metrics) read at the
#      move's start and end, so queries/s during the move is measured over
#      exactly the move, against queries/s over the same length just before.
#
#   benches/membership.sh [VECTORS]     (default 4000 vectors of 2^20 bits, 50% dense: 512 MB)
#   BITFOLD=/path/to/bitfold benches/membership.sh    (measure that binary; no build)
set -euo pipefail
cd "$(dirname "$0")/.."
vectors=${1:-4000}
if [ -n "${BITFOLD:-}" ]; then
    bin=$BITFOLD
else
    cargo build --release -q -p bitfold
    bin=$PWD/target/release/bitfold
fi
dir=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

now() { date +%s.%N; }
# Queries the master has answered (every kind, outcome ok).
answered() {
    curl -sf "http://$metrics/metrics" |
        awk '/^bitfold_master_queries_total\{.*outcome="ok"/ { n += $NF } END { printf "%d\n", n }'
}
cluster() { # cluster DIR SLAVES
    { echo "replicas = 1"; for i in $(seq 0 $(($2 - 1))); do
        printf '[[slaves]]\nname = "s%d"\naddr = "127.0.0.1:%d"\n' "$i" $((port + 1 + i)); done; } >"$1/cluster.toml"
}
# Starts 5 slaves and a master over the first 4, loads the vectors.
start() { # start NAME
    run=$dir/$1
    mkdir -p "$run"
    port=$((20000 + RANDOM % 20000))
    metrics=127.0.0.1:$((port + 9))
    for i in 0 1 2 3 4; do
        "$bin" slave --listen 127.0.0.1:$((port + 1 + i)) --data-dir "$run/s$i" >"$run/s$i.log" 2>&1 &
        pids+=($!)
    done
    cluster "$run" 4
    "$bin" master --listen 127.0.0.1:$port --cluster "$run/cluster.toml" --data-dir "$run/master" \
        --metrics "$metrics" >"$run/master.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q "master listening" "$run/master.log" && break; sleep 0.1; done
    master=127.0.0.1:$port
    "$bin" bench --master $master --vectors "$vectors" --queries 10 --json >"$run/load.json"
}
stop() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; pids=(); }
# Adds s4 and rebalances; prints rebalance's summary line.
move() {
    cluster "$run" 5
    "$bin" rebalance --master $master | tee "$run/rebalance.txt"
}
mbs() { sed -n 's/.*(\([0-9.]*\) MB, \([0-9]*\) MB\/s).*/\2/p' "$1"; }

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "1. $vectors vectors on 4 slaves, add s4, rebalance with no queries running:"
start alone
move
alone=$(mbs "$run/rebalance.txt")
"$bin" status --master $master | tail -1
stop

echo "2. the same with bench's queries running throughout:"
start loaded
"$bin" bench --master $master --skip-load --vectors "$vectors" --duration 600s --json >"$run/bench.json" &
bench=$!
pids+=($bench)
sleep 2 # warm-up
t0=$(now) q0=$(answered)
sleep 3
t1=$(now) q1=$(answered)
move
t2=$(now) q2=$(answered)
loaded=$(mbs "$run/rebalance.txt")
"$bin" status --master $master | tail -1
# As long again after the move, for comparison.
sleep "$(python3 -c "print(max(1.0, $t2 - $t1))")"
t3=$(now) q3=$(answered)
stop
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$t0" "$q0" "$t1" "$q1" "$t2" "$q2" "$t3" "$q3" "$alone" "$loaded" <<'PY'
import sys
t0, q0, t1, q1, t2, q2, t3, q3, alone, loaded = map(float, sys.argv[1:])
before, during, after = (q1 - q0) / (t1 - t0), (q2 - q1) / (t2 - t1), (q3 - q2) / (t3 - t2)
print(f"rebalance: {alone:.0f} MB/s alone, {loaded:.0f} MB/s with queries running")
print(f"queries/s before the move {before:.0f} (over {t1 - t0:.1f} s), during it {during:.0f} "
      f"(over exactly the move, {t2 - t1:.2f} s), after it {after:.0f}: "
      f"during/before = {during / before:.2f}")
PY
