#!/usr/bin/env bash
# Issue 10's figures: a rebalance after adding a 5th slave to 4 (bytes
# moved, MB/s), and the query throughput of `bitfold bench` during the move
# against before it, on loopback, all in one script (ratios, same machine).
#
#   benches/membership.sh [VECTORS]     (default 4000 vectors of 2^20 bits, 50% dense: 512 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
vectors=${1:-4000}
cargo build --release -q -p bitfold
bin=$PWD/target/release/bitfold
dir=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
port=$((20000 + RANDOM % 20000))
for i in 0 1 2 3 4; do
    "$bin" slave --listen 127.0.0.1:$((port + 1 + i)) --data-dir "$dir/s$i" >"$dir/s$i.log" 2>&1 &
    pids+=($!)
done
cluster() { # cluster SLAVES
    { echo "replicas = 1"; for i in $(seq 0 $(($1 - 1))); do
        printf '[[slaves]]\nname = "s%d"\naddr = "127.0.0.1:%d"\n' "$i" $((port + 1 + i)); done; } >"$dir/cluster.toml"
}
cluster 4
"$bin" master --listen 127.0.0.1:$port --cluster "$dir/cluster.toml" --data-dir "$dir/master" >"$dir/master.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "master listening" "$dir/master.log" && break; sleep 0.1; done
master=127.0.0.1:$port
echo "loading $vectors vectors into 4 slaves, then queries for 5 s before the move:"
"$bin" bench --master $master --vectors "$vectors" --duration 5s --json | tee "$dir/before.json"
cluster 5
echo "adding s4 and rebalancing, with the same queries running during the move:"
"$bin" bench --master $master --skip-load --vectors "$vectors" --duration 5s --json >"$dir/during.json" &
bench=$!
sleep 0.5
/usr/bin/time -f "rebalance: %e s wall" "$bin" rebalance --master $master
wait $bench
cat "$dir/during.json"
"$bin" status --master $master | tail -7
python3 - "$dir/before.json" "$dir/during.json" <<'PY'
import json, sys
before, during = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:3])
key = next(k for k in ("queries_per_second", "qps") if k in before)
print(f"queries/s before {before[key]:.0f}, during the move {during[key]:.0f}: "
      f"{during[key] / before[key]:.2f} of before (the bench's 5 s window covers the whole move only if it lasts 5 s)")
PY
