#!/usr/bin/env bash
# What replicating the master's records costs (issue 41's targets): the
# build before Raft (BASE) and after (NEW) with one master, and NEW with
# three masters (`bitfold up --masters 3`), taken in turn in every round
# (this machine is shared and noisy: compare within a round).
#
#   benches/masters.sh [--rounds N] [--parts cluster,compare] [--seconds S] BASE_DIR NEW_DIR
#
# BASE_DIR and NEW_DIR hold release builds of `bitfold` and `compare`
# (a CARGO_TARGET_DIR's release/ folder). Each part, each round:
# - cluster: base with 1 master, new with 1, new with 3 (`bitfold up
#   --masters 3`), each a fresh 4-slave, replicas-2 `bitfold up` cluster:
#   the import of benches/imports.sh (a 10M-line pairs file, 1,000 vids,
#   bits below 2^20: about 1% density), timed; then `bitfold bench
#   --skip-load` over those vectors (3 terms x 64 vids, concurrency 2, S
#   seconds, default 15), with the cluster's CPU a query (the `up`
#   process's, from /proc). The bench's 2,000 vectors at 50% are not used:
#   three masters cannot load them (benches/runs/2026-12-06-masters.md);
# - compare: `compare --densities 0.5,0.01 --chart-vids --rounds 3`, base
#   then new (one master, in process): bitfold's queries/s.
# Prints every run, then per part the ratios of each round and their median.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3 parts=cluster,compare seconds=15
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --parts) parts=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
[ $# -eq 2 ] || { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
base=$1 new=$2
for d in "$base" "$new"; do
    [ -x "$d/bitfold" ] || { echo "error: no executable $d/bitfold" >&2; exit 1; }
done

dir=$(mktemp -d)
up=""
stop() { [ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null; up=""; }
trap 'stop; rm -rf "$dir"' EXIT
out=$dir/results.txt    # lines: PART CONFIG ROUND FIGURE...
: >"$out"

# Starts `bitfold up` of binary dir $1 with $2 masters and $3 replicas in a
# fresh directory; sets $up and $masters (the --master list) once one leads.
start_up() {
    local bin=$1/bitfold n=$2 replicas=$3 port=$((20000 + RANDOM % 20000))
    rm -rf "$dir/cluster"
    if [ "$n" = 1 ]; then
        "$bin" up --slaves 4 --replicas "$replicas" --dir "$dir/cluster" --port "$port" >"$dir/up.log" 2>&1 &
    else
        "$bin" up --slaves 4 --replicas "$replicas" --masters "$n" --dir "$dir/cluster" --port "$port" >"$dir/up.log" 2>&1 &
    fi
    up=$!
    masters=""
    for _ in $(seq 300); do
        if [ "$n" = 1 ]; then
            grep -q "master listening" "$dir/up.log" && masters=127.0.0.1:$port
        else
            masters=$(sed -n 's/.*clients pass --master \([^ ]*\).*/\1/p' "$dir/up.log")
        fi
        [ -n "$masters" ] && break
        sleep 0.1
    done
    [ -n "$masters" ] || { echo "error: the cluster did not start:" >&2; cat "$dir/up.log" >&2; exit 1; }
    for _ in $(seq 300); do
        [ "$n" = 1 ] && return 0
        "$bin" status --master "$masters" 2>/dev/null | grep -q '^master .* leader' && return 0
        sleep 0.1
    done
    echo "error: no master leads after 30 s" >&2
    exit 1
}

# Runs a load ($@); if it fails, says why, with the end of the cluster's
# log, and fails.
load() {
    "$@" >/dev/null 2>"$dir/load.err" && return 0
    {
        echo "load failed: $(head -c 600 "$dir/load.err")"
        echo "  the cluster's log ends:"
        tail -n 15 "$dir/up.log" | cut -c1-400 | sed 's/^/  /'
    } | tee -a "$dir/load-failures.txt" >&2
    return 1
}

# The up process's CPU seconds so far (user + system, all threads).
cpu_of_up() {
    awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$up/stat"
}

# The vectors of the pairs file as $dir/data/<vid>.roaring (for `bench
# --skip-load --data`), imported by NEW into a one-master cluster.
make_data() {
    local vid
    start_up "$new" 1 1
    load "$new/bitfold" import --master "$masters" "$dir/pairs.txt" || exit 1
    mkdir -p "$dir/data"
    for vid in $(seq 0 999); do
        "$new/bitfold" query --master "$masters" --output roaring --out "$dir/data/$vid.roaring" "P:$vid" >/dev/null
    done
    stop
}

# One import and bench on a fresh cluster; a failed import is tried again
# (at most twice) on another fresh cluster, and counted.
cluster_once() {    # BIN_DIR MASTERS ROUND CONFIG
    local start end cpu0 cpu1 try
    for try in 1 2 3; do
        start_up "$1" "$2" 2
        start=$(date +%s%N)
        load "$1/bitfold" import --master "$masters" "$dir/pairs.txt" && break
        stop
        [ "$try" = 3 ] && exit 1
    done
    end=$(date +%s%N)
    awk -v ns=$((end - start)) -v c="$4" -v r="$3" 'BEGIN { printf "import %s %s %.3f\n", c, r, ns / 1e9 }' | tee -a "$out"
    cpu0=$(cpu_of_up)
    "$1/bitfold" bench --master "$masters" --data "$dir/data" --skip-load --duration "${seconds}s" --json >"$dir/bench.json"
    cpu1=$(cpu_of_up)
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
cpu = (float(sys.argv[3]) - float(sys.argv[2])) / r["queries"] * 1e3
print("bench %s %s %.1f %.3f" % (sys.argv[4], sys.argv[5], r["queries_per_second"], cpu))' \
        "$dir/bench.json" "$cpu0" "$cpu1" "$4" "$3" | tee -a "$out"
    stop
}

compare_once() {    # BIN_DIR ROUND CONFIG
    "$1/compare" --densities 0.5,0.01 --chart-vids --rounds 3 --json "$dir/compare.json" >"$dir/compare.log" 2>&1 ||
        { cat "$dir/compare.log" >&2; exit 1; }
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
for o in r["table"]:
    f = dict(o["systems"])["bitfold"]
    print("compare-%s %s %s %.1f %.3f" % (o["density"], sys.argv[2], sys.argv[3], f["queries_per_second"], f["cpu_ms_per_query"]))' \
        "$dir/compare.json" "$3" "$2" | tee -a "$out"
}

case ",$parts," in *,cluster,*)
    awk 'BEGIN { srand(7); for (i = 0; i < 10000000; i++) printf "%d,%d\n", int(rand()*1000), int(rand()*1048576) }' >"$dir/pairs.txt"
    make_data ;;
esac
for round in $(seq "$rounds"); do
    case ",$parts," in *,cluster,*)
        cluster_once "$base" 1 "$round" base-1
        cluster_once "$new" 1 "$round" new-1
        cluster_once "$new" 3 "$round" new-3 ;;
    esac
    case ",$parts," in *,compare,*)
        compare_once "$base" "$round" base-1
        compare_once "$new" "$round" new-1 ;;
    esac
done
[ -s "$dir/load-failures.txt" ] && echo "imports that failed (each run again on a fresh cluster): $(grep -c '^load failed' "$dir/load-failures.txt")"

python3 - "$out" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    part, config, rnd, *figures = line.split()
    runs.setdefault(part, {}).setdefault(config, {})[int(rnd)] = [float(f) for f in figures]
def ratios(part, a, b, higher_is_better, what):
    got = runs.get(part, {})
    if a not in got or b not in got:
        return
    each = []
    for r in sorted(got[a]):
        if r in got[b]:
            x, y = got[a][r][0], got[b][r][0]
            each.append(x / y if higher_is_better else y / x)
    print(f"{part}: {what} {a} / {b}, each round: "
          + " ".join(f"{x:.3f}" for x in each)
          + f"; median {statistics.median(each):.3f}, min {min(each):.3f}, max {max(each):.3f}")
    if len(next(iter(got[a].values()))) > 1:
        cpu = [got[a][r][1] / got[b][r][1] for r in sorted(got[a]) if r in got[b]]
        print(f"{part}: CPU a query {a} / {b}, each round: "
              + " ".join(f"{x:.3f}" for x in cpu) + f"; median {statistics.median(cpu):.3f}")
print()
for part in sorted(runs):
    for config in sorted(runs[part]):
        xs = [v[0] for v in runs[part][config].values()]
        unit = "s" if part == "import" else "queries/s"
        print(f"{part} {config}: median {statistics.median(xs):.2f} {unit} over {len(xs)} rounds")
for part in sorted(runs):
    higher = part != "import"
    what = "throughput" if part == "import" else "queries/s"
    ratios(part, "new-1", "base-1", higher, what)
    ratios(part, "new-3", "new-1", higher, what)
PY
