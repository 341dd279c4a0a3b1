#!/usr/bin/env bash
# What mutual TLS costs a query: `bitfold bench` on a local cluster, plain
# and with `--tls` (every link mutual TLS), alternated plain TLS plain TLS
# ... (this machine is shared and noisy: compare within a pair). Each run
# starts its own cluster and loads the same data set.
#
#   benches/tls.sh [--rounds N] [bench flags...]    (default: 5 pairs of --vectors 512 --duration 20s)
#   BITFOLD=/path/to/bitfold benches/tls.sh ...      (measure that binary; no build)
#
# Prints each run's queries/s and CPU ms a query, then what TLS adds in each
# pair (time and CPU a query, TLS over plain) and the medians of those ratios.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5
if [ "${1:-}" = "--rounds" ]; then
    rounds=$2
    shift 2
fi
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
flags=("$@")
[ $# -gt 0 ] || flags=(--vectors 512 --duration 20s)
if [ -n "${BITFOLD:-}" ]; then
    bin=$BITFOLD
    [ -x "$bin" ] || { echo "error: BITFOLD=$bin is not an executable bitfold binary" >&2; exit 1; }
else
    cargo build --release -q -p bitfold
    bin=$PWD/target/release/bitfold
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# One run of `bitfold bench` (plain or tls, with the flags after it) into $dir/MODE-ROUND.json.
bench_once() {
    local mode=$1 round=$2 out
    shift 2
    out="$dir/$mode-$round.json"
    "$bin" bench "${flags[@]}" "$@" --json >"$out"
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print("round %s, %s: %.1f queries/s, %.3f ms CPU a query"
      % (sys.argv[2], sys.argv[3], r["queries_per_second"], r["cpu_ms_per_query"]))' "$out" "$round" "$mode"
}

for round in $(seq "$rounds"); do
    bench_once plain "$round"
    bench_once tls "$round" --tls
done
python3 - "$dir" "$rounds" <<'PY'
import json, statistics, sys
dir, rounds = sys.argv[1], int(sys.argv[2])
def run(mode, i):
    with open(f"{dir}/{mode}-{i}.json") as f:
        return json.load(f)
def percent(ratio):
    return f"{(ratio - 1) * 100:+.1f}%"
times, cpus = [], []
for i in range(1, rounds + 1):
    plain, tls = run("plain", i), run("tls", i)
    time = plain["queries_per_second"] / tls["queries_per_second"]
    cpu = tls["cpu_ms_per_query"] / plain["cpu_ms_per_query"]
    times.append(time)
    cpus.append(cpu)
    print(f"pair {i}: TLS adds {percent(time)} time, {percent(cpu)} CPU a query")
print(f"median of {rounds} pairs: TLS adds {percent(statistics.median(times))} time, "
      f"{percent(statistics.median(cpus))} CPU a query")
PY
