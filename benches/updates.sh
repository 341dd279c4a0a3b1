#!/usr/bin/env bash
# Issue 9's figure: clearing 1M bits over 1,000 vectors through a 4-slave,
# replicas-2 cluster (`bitfold up`), against importing the same bits, in one
# script on one machine (a ratio).
#
#   benches/updates.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p bitfold
bin=$PWD/target/release/bitfold
dir=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
"$bin" up --slaves 4 --replicas 2 --dir "$dir/cluster" --port $port >"$dir/up.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 200); do grep -q "master listening" "$dir/up.log" && break; sleep 0.1; done
# 1,000 vectors x 1,000 bits, spread over 2^20 positions (a fixed seed).
awk 'BEGIN { srand(9); for (v = 0; v < 1000; v++) for (b = 0; b < 1000; b++) printf "%d,%d\n", v, int(rand() * 1048576) }' >"$dir/bits.pairs"
time_of() { local start end; start=$(date +%s%N); "$@" >/dev/null; end=$(date +%s%N); echo $(((end - start) / 1000000)); }
set_s=$(time_of "$bin" import --master 127.0.0.1:$port "$dir/bits.pairs")
clear_s=$(time_of "$bin" import --clear --master 127.0.0.1:$port "$dir/bits.pairs")
left=$("$bin" query --master 127.0.0.1:$port --output count 'R:0-999')
python3 - "$set_s" "$clear_s" "$left" <<'PY'
import sys
set_s, clear_s, left = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3, int(sys.argv[3])
bits = 1_000_000
print(f"set:   {bits / set_s / 1e6:.2f} M bits/s ({set_s:.2f} s)")
print(f"clear: {bits / clear_s / 1e6:.2f} M bits/s ({clear_s:.2f} s)")
print(f"clear takes {clear_s / set_s:.2f}x the time of the set import; bits left afterwards: {left}")
PY
