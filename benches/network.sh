#!/usr/bin/env bash
# The network study of issue 44: a bitfold cluster on a shaped network.
# Every process (the master, each slave, the `bitfold bench` client) runs in
# its own Linux network namespace with one veth link to a bridge (in a
# namespace of its own, so nothing is added to the machine's own network).
# The same workload runs unshaped and with every link shaped by `tc tbf` at
# RATE in both directions, taking turns (round 1 unshaped then shaped, round
# 2 shaped then unshaped, ...) on the same cluster, so that the ratio
# shaped / unshaped is measured within one run.
#
#   benches/network.sh [options] [BITS:DENSITY ...]
#
# Each BITS:DENSITY is one configuration (vectors of BITS bits, each bit set
# with probability DENSITY, as `bitfold bench` takes them: `2^24:1%`,
# `1048576:0.5`), loaded into a fresh cluster. The default is issue 44's
# table: 2^20:1% 2^24:1% 2^26:1% 2^24:50%.
#
# Options (the defaults are issue 44's workload):
#   --rate RATE         every link's rate, each direction: NUMBER followed by
#                       bit, kbit, mbit or gbit (1gbit)
#   --burst KIB         tbf burst in KiB, at least 80: a smaller one makes
#                       tbf split every GSO packet and triples the CPU a
#                       query takes (256)
#   --latency MS        tbf queue: at most MS ms of traffic at RATE waits (20)
#   --bits BITS         one configuration's bits (with --density), instead of
#   --density P         the list (2^24 and 1% when only one is given)
#   --vectors N         vectors of each configuration (256)
#   --slaves N          slaves (4)
#   --replicas R        copies of every vector (1)
#   --group N           the cluster file's group: a power of two or all (all)
#   --piece BITS        the cluster file's piece (its default, 2^20)
#   --terms N           terms ANDed by each query (3)
#   --vids-per-term N   vids ORed by each term (64)
#   --form FORM         count, words or roaring (count)
#   --concurrency N     queries in flight (2)
#   --seconds S         measured seconds of each run, after 20 warm-up
#                       queries (20)
#   --rounds N          rounds, each an unshaped and a shaped run (3)
#   --policy POLICY     the master's --policy (its default)
#   --plan PLAN         the master's --plan (its default)
#   --bitfold PATH      the bitfold binary (default: `cargo build --release`
#                       and target/release/bitfold)
#   -h, --help          this text
#
# Prints each run as it ends, then a markdown table, one row a configuration:
# the medians of queries/s unshaped and shaped, the median of the rounds'
# ratios shaped / unshaped, the bytes on the links per query (every byte a
# machine sent into the bridge, counted once, from the bridge ports' veth
# counters, warm-up queries included, divided by the queries asked), and the
# busiest link's load: the most bytes one link carried in one direction per
# query, times queries/s, over RATE (median of the shaped runs, their range in
# brackets; and what the unshaped runs' busiest link asked of RATE). Each
# run's lines also give every link's bytes out and in per query, the packets
# tbf dropped, bitfold's own count of what the slaves sent, and the master's
# and slaves' CPU per query (from /proc).
#
# Needs root, `ip` and `tc` (iproute2), the tbf qdisc and python3. The
# addresses (master 10.77.0.1, client 10.77.0.2, slave i 10.77.0.(10 + i))
# exist only inside the run's namespaces; no traffic leaves the machine.
# Everything the run creates (namespaces, bridge, processes, its temporary
# directory) is removed when it ends, fails or is interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail() { echo "error: $*" >&2; exit 1; }

rate=1gbit burst=256 latency=20 vectors=256 slaves=4 replicas=1 group=all
terms=3 vids=64 form=count concurrency=2 seconds=20 rounds=3 warmup=20
policy="" plan="" bin="" one_bits="" one_density="" piece=""
configs=()
command_line="benches/network.sh${*:+ $(printf '%q ' "$@")}"
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) usage; exit 0 ;;
    -*)
        [ $# -ge 2 ] || fail "$1 is unknown or needs a value (see --help)"
        case $1 in
        --rate) rate=$2 ;;
        --burst) burst=$2 ;;
        --latency) latency=$2 ;;
        --bits) one_bits=$2 ;;
        --density) one_density=$2 ;;
        --vectors) vectors=$2 ;;
        --slaves) slaves=$2 ;;
        --replicas) replicas=$2 ;;
        --group) group=$2 ;;
        --piece) piece=$2 ;;
        --terms) terms=$2 ;;
        --vids-per-term) vids=$2 ;;
        --form) form=$2 ;;
        --concurrency) concurrency=$2 ;;
        --seconds) seconds=$2 ;;
        --rounds) rounds=$2 ;;
        --policy) policy=$2 ;;
        --plan) plan=$2 ;;
        --bitfold) bin=$2 ;;
        *) fail "unknown option $1 (see --help)" ;;
        esac
        shift 2 ;;
    *:*) configs+=("$1"); shift ;;
    *) fail "a configuration is BITS:DENSITY, like 2^24:1%, not $1" ;;
    esac
done
if [ -n "$one_bits$one_density" ]; then
    [ ${#configs[@]} -eq 0 ] || fail "give --bits/--density or a list of BITS:DENSITY, not both"
    configs=("${one_bits:-2^24}:${one_density:-1%}")
fi
[ ${#configs[@]} -gt 0 ] || configs=("2^20:1%" "2^24:1%" "2^26:1%" "2^24:50%")

[ "$(id -u)" -eq 0 ] || fail "network namespaces, veth links and tc need root: run as root"
for tool in ip tc python3; do
    command -v "$tool" >/dev/null || fail "$tool is missing (ip and tc: apt-get install iproute2)"
done
rate_bits=$(python3 -c '
import re, sys
m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(bit|kbit|mbit|gbit)", sys.argv[1].lower())
print(round(float(m[1]) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m[2]]) if m else "")
' "$rate")
[ -n "$rate_bits" ] || fail "--rate is a number followed by bit, kbit, mbit or gbit, not $rate"
[ "$group" = all ] || [[ $group =~ ^[1-9][0-9]*$ ]] || fail "--group is a power of two or all, not $group"
[ -z "$piece" ] || [[ $piece =~ ^[1-9][0-9]*$ ]] || fail "--piece is a number of bits, not $piece"
for n in burst latency vectors slaves replicas terms vids concurrency seconds rounds; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || fail "--${n/vids/vids-per-term} must be a positive whole number, not ${!n}"
done
[ "$burst" -ge 80 ] || fail "--burst $burst KiB: below 80 KiB tbf splits every GSO packet (issue 44)"
[ "$slaves" -le 200 ] || fail "at most 200 slaves (one /24 of addresses)"
[ "$replicas" -le "$slaves" ] || fail "--replicas $replicas is more than the $slaves slaves"

if [ -z "$bin" ]; then
    cargo build --release --quiet -p bitfold --bin bitfold
    bin=${CARGO_TARGET_DIR:-$PWD/target}/release/bitfold
fi
[ -x "$bin" ] || fail "$bin is not an executable bitfold binary"
bin=$(realpath "$bin")

# What was created, for cleanup: namespaces, and processes still running.
prefix=bitfold-net-$$
bridge_ns=$prefix-bridge
namespaces=()
pids=()
dir=$(mktemp -d "${TMPDIR:-/tmp}/bitfold-network.XXXXXX")
stop_pids() {
    [ ${#pids[@]} -gt 0 ] || return 0
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 100); do
        local alive=0 pid
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ $alive -eq 1 ] || break
        sleep 0.1
    done
    kill -9 "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    pids=()
}
cleanup() {
    stop_pids
    local ns
    for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

# The machines: name (also its bridge port's name), namespace, address.
machines=(master client)
declare -A addr=([master]=10.77.0.1 [client]=10.77.0.2)
for i in $(seq 0 $((slaves - 1))); do
    machines+=("s$i")
    addr[s$i]=10.77.0.$((10 + i))
done
ns_of() { echo "$prefix-$1"; }

# Without IPv6 the links carry no neighbour discovery or router solicitations.
quiet_ns() { ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1; }
ip netns add "$bridge_ns"
namespaces+=("$bridge_ns")
quiet_ns "$bridge_ns"
ip -n "$bridge_ns" link add br0 type bridge
ip -n "$bridge_ns" link set br0 up
for m in "${machines[@]}"; do
    ns=$(ns_of "$m")
    ip netns add "$ns"
    namespaces+=("$ns")
    quiet_ns "$ns"
    ip -n "$bridge_ns" link add name "$m" type veth peer name eth0 netns "$ns"
    ip -n "$bridge_ns" link set dev "$m" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "${addr[$m]}/24" dev eth0
    ip -n "$ns" link set eth0 up
done

# Every link shaped at $rate both ways: the machine's end shapes what it
# sends, the bridge's end what it receives.
tbf=(tbf rate "$rate" burst "${burst}kb" latency "${latency}ms")
shape() {
    local m
    for m in "${machines[@]}"; do
        tc -n "$(ns_of "$m")" qdisc replace dev eth0 root "${tbf[@]}"
        tc -n "$bridge_ns" qdisc replace dev "$m" root "${tbf[@]}"
    done
}
unshape() {
    local m
    for m in "${machines[@]}"; do
        tc -n "$(ns_of "$m")" qdisc del dev eth0 root 2>/dev/null || true
        tc -n "$bridge_ns" qdisc del dev "$m" root 2>/dev/null || true
    done
}
# Packets the tbf qdiscs dropped (queue full) since they were set.
tbf_drops() {
    local m
    {
        tc -n "$bridge_ns" -s -j qdisc show
        for m in "${machines[@]}"; do tc -n "$(ns_of "$m")" -s -j qdisc show dev eth0; done
    } | python3 -c '
import json, sys
print(sum(q.get("drops", 0) for line in sys.stdin if line.strip()
          for q in json.loads(line) if q.get("kind") == "tbf"))'
}
counters() { ip -n "$bridge_ns" -s -j link show >"$1"; }
# CPU seconds the cluster's processes (the only ones running between runs) have used.
cluster_cpu() {
    local pid ticks=0 stat
    for pid in "${pids[@]}"; do
        read -ra stat <"/proc/$pid/stat"
        ticks=$((ticks + stat[13] + stat[14]))
    done
    python3 -c "import os, sys; print(int(sys.argv[1]) / os.sysconf('SC_CLK_TCK'))" "$ticks"
}

# Starts a process in machine $1's namespace, its output in $dir/$1.log, and
# waits until the log says it listens.
serve() {
    local m=$1 log=$dir/$1.log
    shift
    : >"$log" # not the last configuration's "listening"
    ip netns exec "$(ns_of "$m")" "$bin" "$@" >"$log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    for _ in $(seq 600); do
        grep -qs "listening on" "$log" && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "$m stopped before it listened"; }
        sleep 0.1
    done
    cat "$log" >&2
    fail "$m did not listen within 60 s"
}
# A fresh cluster: the slaves, then the master over them.
start_cluster() {
    rm -rf "$dir/cluster"
    mkdir -p "$dir/cluster"
    {
        echo "replicas = $replicas"
        if [ "$group" = all ]; then echo 'group = "all"'; else echo "group = $group"; fi
        [ -z "$piece" ] || echo "piece = $piece"
        local i
        for i in $(seq 0 $((slaves - 1))); do
            printf '[[slaves]]\nname = "s%d"\naddr = "%s:7101"\n' "$i" "${addr[s$i]}"
        done
    } >"$dir/cluster/cluster.toml"
    for i in $(seq 0 $((slaves - 1))); do
        serve "s$i" slave --listen "${addr[s$i]}:7101" --data-dir "$dir/cluster/s$i"
    done
    local flags=()
    [ -z "$policy" ] || flags+=(--policy "$policy")
    [ -z "$plan" ] || flags+=(--plan "$plan")
    serve master master --listen "${addr[master]}:7100" --cluster "$dir/cluster/cluster.toml" \
        --data-dir "$dir/cluster/master" "${flags[@]}"
}
# `bitfold bench` from the client's namespace with the data flags of
# configuration $1 and more flags; its JSON line to $dir/bench.json.
bench() {
    local bits=${1%%:*} density=${1#*:}
    shift
    ip netns exec "$(ns_of client)" "$bin" bench --master "${addr[master]}:7100" \
        --vectors "$vectors" --bits "$bits" --density "$density" --terms "$terms" \
        --vids-per-term "$vids" --form "$form" --concurrency "$concurrency" --json "$@" \
        >"$dir/bench.json" 2>"$dir/bench.log" &
    local pid=$!
    pids+=("$pid")
    if ! wait "$pid"; then
        cat "$dir/bench.log" >&2
        fail "bitfold bench failed"
    fi
    local kept=() p
    for p in "${pids[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
    pids=("${kept[@]}")
}

# One measured run: prints it, and appends it to $dir/runs.jsonl.
measure() { # measure CONFIG MODE ROUND
    local drops=0
    if [ "$2" = shaped ]; then shape; else unshape; fi
    counters "$dir/before.json"
    local cpu_before cpu_after
    cpu_before=$(cluster_cpu)
    bench "$1" --skip-load --warmup "$warmup" --duration "${seconds}s"
    cpu_after=$(cluster_cpu)
    counters "$dir/after.json"
    [ "$2" = unshaped ] || drops=$(tbf_drops)
    python3 - "$dir" "$1" "$2" "$3" "$warmup" "$rate_bits" "$rate" "$drops" \
        "$(python3 -c "print($cpu_after - $cpu_before)")" "${machines[@]}" <<'PY'
import json, sys
dir, config, mode, rnd, warmup, rate_bits, rate, drops, cpu, *machines = sys.argv[1:]
bench = json.load(open(f"{dir}/bench.json"))
def stats(path):
    return {l["ifname"]: l["stats64"] for l in json.load(open(path))}
before, after = stats(f"{dir}/before.json"), stats(f"{dir}/after.json")
asked = bench["queries"] + int(warmup)
qps = bench["queries_per_second"]
# A bridge port receives what its machine sends and sends what it receives.
links = {m: {"out": (after[m]["rx"]["bytes"] - before[m]["rx"]["bytes"]) / asked,
             "in": (after[m]["tx"]["bytes"] - before[m]["tx"]["bytes"]) / asked}
         for m in machines}
total = sum(l["out"] for l in links.values())
busiest = max(((m, d) for m in machines for d in ("in", "out")), key=lambda k: links[k[0]][k[1]])
load = links[busiest[0]][busiest[1]] * qps * 8 / int(rate_bits)
run = dict(config=config, mode=mode, round=int(rnd), qps=qps, p50_ms=bench["p50_ms"],
           queries=bench["queries"], asked=asked, links=links, total=total,
           busiest=f"{busiest[0]} {busiest[1]}", load=load, drops=int(drops),
           slaves_sent=bench["sent_bytes_per_query"], cpu_ms=float(cpu) * 1e3 / asked)
with open(f"{dir}/runs.jsonl", "a") as f:
    f.write(json.dumps(run) + "\n")
def size(b):
    return f"{b / 2**20:.2f} MiB" if b >= 2**20 else f"{b / 2**10:.1f} KiB"
print(f"{config} round {rnd} {mode}: {qps:.1f} queries/s (p50 {bench['p50_ms']:.1f} ms, "
      f"{bench['queries']} queries), {size(total)} on the links per query, busiest link "
      f"{run['busiest']} {load:.0%} of {rate}" + (f", {drops} packets dropped by tbf" if mode == "shaped" else "")
      + f"; the cluster's CPU {run['cpu_ms']:.2f} ms per query ({run['cpu_ms'] * qps / 1e3:.2f} cores)")
print("    per query out/in: " + ", ".join(f"{m} {size(l['out'])}/{size(l['in'])}" for m, l in links.items())
      + f"; bitfold's count of what the slaves sent: {size(run['slaves_sent'])}")
PY
}

echo "# ${command_line% }"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $bin"
echo "# $slaves slaves, replicas $replicas, group $group, piece ${piece:-default}, $vectors vectors, $terms terms x $vids vids," \
    "$form, concurrency $concurrency; links $rate (tbf burst ${burst} KiB, latency ${latency} ms);" \
    "$rounds rounds of ${seconds} s unshaped and shaped"
for config in "${configs[@]}"; do
    unshape
    start_cluster
    start=$(date +%s)
    bench "$config" --queries 1 --warmup 0
    echo "$config: loaded in $(($(date +%s) - start)) s (unshaped); load average $(cut -d' ' -f1-3 /proc/loadavg)"
    for round in $(seq "$rounds"); do
        if [ $((round % 2)) -eq 1 ]; then order=(unshaped shaped); else order=(shaped unshaped); fi
        for mode in "${order[@]}"; do measure "$config" "$mode" "$round"; done
    done
    stop_pids
done

python3 - "$dir/runs.jsonl" "$rate" "${configs[@]}" <<'PY'
import json, statistics, sys
path, rate, *configs = sys.argv[1:]
runs = [json.loads(line) for line in open(path)]
def size(b):
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"
def span(values):
    m = statistics.median(values)
    if len(values) == 1:
        return f"{m:.0%}"
    return f"{m:.0%} ({min(values) * 100:.0f}–{max(values):.0%})"
def rate_text(q):
    return f"{q:.1f}" if q < 100 else f"{q:.0f}"
print()
print(f"| vectors | unshaped q/s | {rate} q/s | ratio | bytes on the links per query "
      f"| busiest link, {rate} | unshaped busiest link, of {rate} |")
print("|---|---:|---:|---:|---:|---:|---:|")
for config in configs:
    mine = [r for r in runs if r["config"] == config]
    un = {r["round"]: r for r in mine if r["mode"] == "unshaped"}
    sh = {r["round"]: r for r in mine if r["mode"] == "shaped"}
    ratios = [sh[k]["qps"] / un[k]["qps"] for k in un if k in sh]
    bits, density = config.split(":", 1)
    print(f"| {bits} bits, {density} "
          f"| {rate_text(statistics.median(r['qps'] for r in un.values()))} "
          f"| {rate_text(statistics.median(r['qps'] for r in sh.values()))} "
          f"| {statistics.median(ratios):.2f} "
          f"| {size(statistics.median(r['total'] for r in mine))} "
          f"| {span([r['load'] for r in sh.values()])} "
          f"| {span([r['load'] for r in un.values()])} |")
PY
