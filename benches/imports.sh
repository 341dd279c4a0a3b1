#!/usr/bin/env bash
# Import throughput through a 4-slave, replicas-2 cluster (`bitfold up`):
# the same 10M-line pairs file (1,000 vids, bits below 2^20, a fixed seed)
# imported into a fresh cluster by each `bitfold` binary given, alternated
# A B A B ... (this machine is shared and noisy: compare within one run).
#
#   benches/imports.sh [--rounds N] BITFOLD_A [BITFOLD_B]
#
# Prints each import's seconds, then per binary the median and M pairs/s,
# and with two binaries the ratio of the medians (B / A).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3
if [ "${1:-}" = "--rounds" ]; then
    rounds=$2
    shift 2
fi
if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    exit $(($# < 1))
fi
bins=("$@")
for bin in "${bins[@]}"; do
    [ -x "$bin" ] || { echo "error: $bin is not an executable bitfold binary" >&2; exit 1; }
done

dir=$(mktemp -d)
up=""
stop() { [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null; up=""; }
trap 'stop; rm -rf "$dir"' EXIT
awk 'BEGIN { srand(7); for (i = 0; i < 10000000; i++) printf "%d,%d\n", int(rand()*1000), int(rand()*1048576) }' >"$dir/pairs.txt"

# One import by binary $1 into a fresh cluster; prints its seconds.
import_once() {
    local bin=$1 port=$((20000 + RANDOM % 20000)) start end
    rm -rf "$dir/cluster"
    "$bin" up --slaves 4 --replicas 2 --dir "$dir/cluster" --port "$port" >"$dir/up.log" 2>&1 &
    up=$!
    for _ in $(seq 300); do grep -q "master listening" "$dir/up.log" && break; sleep 0.1; done
    start=$(date +%s%N)
    "$bin" import --master "127.0.0.1:$port" "$dir/pairs.txt" >/dev/null
    end=$(date +%s%N)
    stop
    awk -v ns=$((end - start)) 'BEGIN { printf "%.3f\n", ns / 1e9 }'
}

results=()
for round in $(seq "$rounds"); do
    for i in "${!bins[@]}"; do
        s=$(import_once "${bins[$i]}")
        echo "round $round, ${bins[$i]}: $s s"
        results+=("$i $s")
    done
done
printf '%s\n' "${results[@]}" | python3 -c '
import statistics, sys
bins = sys.argv[1:]
times = {}
for line in sys.stdin:
    i, s = line.split()
    times.setdefault(int(i), []).append(float(s))
medians = []
for i, bin in enumerate(bins):
    m = statistics.median(times[i])
    medians.append(m)
    print(f"{bin}: median {m:.2f} s, {10 / m:.2f} M pairs/s")
if len(bins) == 2:
    print(f"ratio of medians (second / first): {medians[1] / medians[0]:.3f}")
' "${bins[@]}"
