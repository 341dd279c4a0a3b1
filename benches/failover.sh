#!/usr/bin/env bash
# Issue 41's failover targets: three `bitfold master` processes (Raft) and
# slaves on loopback, a data set imported, then N times: find the leader
# (`bitfold status`), kill -9 it, and time from the kill to the first query
# answered through `--master a,b,c` (a tight loop of `bitfold query`); then
# restart the killed master and wait until it is a follower again. Writers
# import one bit at a time throughout (write k: bit k of vid 1000000 + k)
# and log which writes were acknowledged; at the end every acknowledged
# write is looked for, in one range query and by a `P:` query of each.
#
#   benches/failover.sh [--kills N] [--writers N] [--slaves N] [--replicas R] [--pairs N] [--give-up S] [--keep]
#   BITFOLD=/path/to/bitfold benches/failover.sh ...   (measure that binary; no build)
#
# Defaults: 10 kills, 2 writers, 3 slaves, 2 replicas, a 1,000,000-line
# pairs file, 60 s without an answer counted as a failed failover; --keep
# leaves the run's directory (every process's log, writes.log, kills.log).
# Prints one line per kill, then the median, p90 and max of the time with
# no answer, the same for writes, the acknowledged writes lost and the
# wrong answers.
set -euo pipefail
cd "$(dirname "$0")/.."

kills=10 writers=2 slaves=3 replicas=2 pairs=1000000 give_up=60 keep=0
while [ $# -gt 0 ]; do
    case $1 in
        --kills) kills=$2; shift 2 ;;
        --writers) writers=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --slaves) slaves=$2; shift 2 ;;
        --replicas) replicas=$2; shift 2 ;;
        --pairs) pairs=$2; shift 2 ;;
        --give-up) give_up=$2; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ -n "${BITFOLD:-}" ]; then
    bin=$BITFOLD
    [ -x "$bin" ] || { echo "error: BITFOLD=$bin is not an executable bitfold binary" >&2; exit 1; }
else
    cargo build --release -q -p bitfold
    bin=${CARGO_TARGET_DIR:-$PWD/target}/release/bitfold
fi

dir=$(mktemp -d)
declare -A pid=()     # process name (m0, s1, writer) -> pid
stop_all() {
    touch "$dir/stop-writer"
    for name in "${!pid[@]}"; do
        kill "${pid[$name]}" 2>/dev/null || true
    done
    for name in "${!pid[@]}"; do
        wait "${pid[$name]}" 2>/dev/null || true
    done
    pid=()
}
finish() {
    stop_all
    if [ "$keep" = 1 ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap finish EXIT

now_us() { echo "${EPOCHREALTIME/./}"; }

# Waits (at most 30 s) until log $1 has a line matching $2.
wait_for_line() {
    for _ in $(seq 300); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "error: no \"$2\" in $1 after 30 s:" >&2
    tail -5 "$1" >&2
    exit 1
}

port=$((20000 + RANDOM % 20000))
masters=(m0 m1 m2)
all=""
{
    echo "replicas = $replicas"
    for i in "${!masters[@]}"; do
        printf '[[masters]]\nname = "%s"\naddr = "127.0.0.1:%d"\n' "${masters[$i]}" $((port + i))
        all+="${all:+,}127.0.0.1:$((port + i))"
    done
    for i in $(seq 0 $((slaves - 1))); do
        printf '[[slaves]]\nname = "s%d"\naddr = "127.0.0.1:%d"\n' "$i" $((port + 3 + i))
    done
} >"$dir/cluster.toml"

for i in $(seq 0 $((slaves - 1))); do
    "$bin" slave --listen "127.0.0.1:$((port + 3 + i))" --data-dir "$dir/s$i" >"$dir/s$i.log" 2>&1 &
    pid[s$i]=$!
done
start_master() {
    "$bin" master --cluster "$dir/cluster.toml" --name "$1" --data-dir "$dir/$1" >>"$dir/$1.log" 2>&1 &
    pid[$1]=$!
}
for m in "${masters[@]}"; do start_master "$m"; done
for i in $(seq 0 $((slaves - 1))); do wait_for_line "$dir/s$i.log" "slave listening"; done
for m in "${masters[@]}"; do wait_for_line "$dir/$m.log" "master listening"; done

# The master `bitfold status` calls the leader, or nothing.
leader() {
    "$bin" status --master "$all" 2>/dev/null | awk '$1 == "master" && $4 == "leader" { print $2 }' || true
}
# Waits (at most 60 s) until `bitfold status` says master $1 is $2.
wait_state() {
    for _ in $(seq 600); do
        "$bin" status --master "$all" 2>/dev/null |
            awk -v m="$1" -v s="$2" '$1 == "master" && $2 == m && $4 == s { found = 1 } END { exit !found }' &&
            return 0
        sleep 0.1
    done
    echo "error: master $1 is not $2 after 60 s" >&2
    exit 1
}
for _ in $(seq 300); do [ -n "$(leader)" ] && break; sleep 0.1; done
[ -n "$(leader)" ] || { echo "error: no master leads after 30 s" >&2; exit 1; }

awk -v n="$pairs" 'BEGIN { srand(7); for (i = 0; i < n; i++) printf "%d,%d\n", int(rand()*1000), int(rand()*1048576) }' >"$dir/pairs.txt"
start=$(now_us)
"$bin" import --master "$all" "$dir/pairs.txt" >/dev/null
echo "imported $pairs pairs in $(( ($(now_us) - start) / 1000 )) ms; $slaves slaves, $replicas replicas, masters $all"
query='R:0-299&300-599'
expect=$("$bin" query --master "$all" --output count "$query")
echo "$query counts $expect"

# Writer $1 of $writers: its writes are k = $1, $1 + writers, ...; write k
# sets bit k of vid 1000000 + k. Logs `k start_us end_us exit` a write.
wbase=1000000
writer() {
    local k=$1 start rc
    while [ ! -e "$dir/stop-writer" ]; do
        echo "$((wbase + k)),$k" >"$dir/write-$1.txt"
        start=$(now_us)
        rc=0
        "$bin" import --master "$all" --format pairs "$dir/write-$1.txt" >/dev/null 2>>"$dir/writer.err" || rc=$?
        echo "$k $start $(now_us) $rc" >>"$dir/writes-$1.log"
        k=$((k + writers))
    done
}
for w in $(seq 0 $((writers - 1))); do
    writer "$w" &
    pid[writer$w]=$!
done

: >"$dir/kills.log"
for round in $(seq "$kills"); do
    sleep "0.$((RANDOM % 10))"    # kill at a random point of the writes
    victim=$(leader)
    [ -n "$victim" ] || { echo "error: no leader before kill $round" >&2; exit 1; }
    t0=$(now_us)
    kill -9 "${pid[$victim]}"
    wait "${pid[$victim]}" 2>/dev/null || true    # reaped here, so bash does not announce it
    tries=0 answered=0 got=""
    while [ $(( $(now_us) - t0 )) -lt $((give_up * 1000000)) ]; do
        tries=$((tries + 1))
        if got=$("$bin" query --master "$all" --output count "$query" 2>>"$dir/poll.err"); then
            answered=1
            break
        fi
    done
    t1=$(now_us)
    wrong=0
    [ "$answered" = 1 ] && [ "$got" != "$expect" ] && wrong=1
    new=$(leader)
    start_master "$victim"
    wait_state "$victim" follower
    t2=$(now_us)
    echo "$round $victim ${new:-none} $t0 $t1 $answered $tries $wrong $((t2 - t1))" >>"$dir/kills.log"
    if [ "$answered" = 1 ]; then
        echo "kill $round: $victim killed, ${new:-no one} leads; first answer after $(( (t1 - t0) / 1000 )) ms ($tries queries$([ "$wrong" = 1 ] && echo ", WRONG: $got")); $victim a follower again after $(( (t2 - t1) / 1000 )) ms"
    else
        echo "kill $round: $victim killed, no answer within $give_up s"
    fi
done
touch "$dir/stop-writer"
for w in $(seq 0 $((writers - 1))); do
    wait "${pid[writer$w]}" || true
    unset "pid[writer$w]"
done
sort -n "$dir"/writes-*.log >"$dir/writes.log"

# Every acknowledged write: one range query over all of them, then `P:` each.
last=$(awk 'END { print $1 }' "$dir/writes.log")    # the highest k (sorted)
"$bin" query --master "$all" --output bits "R:$wbase-$((wbase + last))" >"$dir/present.txt"
: >"$dir/each.txt"
while read -r k _ _ rc; do
    [ "$rc" = 0 ] || continue
    if bits=$("$bin" query --master "$all" --output bits "P:$((wbase + k))" 2>/dev/null) && [ "$bits" = "$k" ]; then
        echo "$k present" >>"$dir/each.txt"
    else
        echo "$k missing ${bits//$'\n'/ }" >>"$dir/each.txt"
    fi
done <"$dir/writes.log"
panics=$(cat "$dir"/m*.log "$dir"/s*.log | grep -c panicked || true)

python3 - "$dir" "$give_up" "$panics" <<'PY'
import math, statistics, sys
dir, give_up, panics = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
def pct(xs, p):
    return sorted(xs)[max(0, math.ceil(p * len(xs)) - 1)]
def line(name, xs):
    if not xs:
        return f"{name}: none"
    return (f"{name} (s, {len(xs)} kills): median {statistics.median(xs):.2f}, "
            f"p90 {pct(xs, 0.9):.2f}, max {max(xs):.2f}, min {min(xs):.2f}")
kills = [l.split() for l in open(f"{dir}/kills.log")]
writes = [tuple(map(int, l.split())) for l in open(f"{dir}/writes.log")]
acked = [w for w in writes if w[3] == 0]
no_answer = [(int(k[4]) - int(k[3])) / 1e6 for k in kills if k[5] == "1"]
failed = sum(1 for k in kills if k[5] != "1")
wrong = sum(int(k[7]) for k in kills)
rejoin = [int(k[8]) / 1e6 for k in kills]
# Per kill: from the kill to the acknowledgement of the first write begun
# after it (one writer: a write in flight at the kill delays the next).
no_write = []
for k in kills:
    t0 = int(k[3])
    after = [w[2] for w in acked if w[1] > t0]
    if after:
        no_write.append((min(after) - t0) / 1e6)
present = {int(b) for b in open(f"{dir}/present.txt").read().split()}
lost_range = [w[0] for w in acked if w[0] not in present]
each = [l.split() for l in open(f"{dir}/each.txt")]
lost_each = [int(e[0]) for e in each if e[1] != "present"]
unacked = [w for w in writes if w[3] != 0]
print()
print(line("no answered query, kill -9 to first answer", no_answer))
print(line("no acknowledged write, kill -9 to the ack of the first write begun after it", no_write))
print(line("killed master a follower again, from the first answer", rejoin))
print(f"kills with no answer within {give_up:.0f} s: {failed}; wrong answers: {wrong}")
print(f"writes: {len(writes)}, acknowledged {len(acked)}, failed {len(unacked)} "
      f"(of which present anyway: {sum(1 for w in unacked if w[0] in present)})")
print(f"acknowledged writes lost: {len(lost_each)} by P: of each, {len(lost_range)} by the range query"
      + (f" (first: {sorted(set(lost_each) | set(lost_range))[:10]})" if lost_each or lost_range else ""))
print(f"'panicked' lines in the servers' logs: {panics}")
PY
