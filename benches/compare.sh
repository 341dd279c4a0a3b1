#!/usr/bin/env bash
# The side-by-side comparison (benches/README.md, "Where bitfold stands"),
# in one run: bitfold, Redis, roaring-rs and the memory roof on the same
# vectors and queries (default workload: 4 slaves, 2000 vectors of 2^20
# bits, 3 terms x 64 vids, 50% and 1% density, concurrency 2), the chart
# of queries/s against vids per term, then the words-form throughput of a
# 2^26-bit answer.
#
#   benches/compare.sh [compare flags...]     e.g. --rounds 5, --densities 0.5
#
# Writes benches/compare.json and .svg, and benches/compare-width.json and .svg; needs redis-server
# (scripts/setup installs it). The comparison starts and stops its own
# Redis and bitfold cluster on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --quiet -p bitfold -p bitfold-benches --bin bitfold --bin compare
target/release/compare --json benches/compare.json --chart benches/compare.svg "$@"

# The width sweep: the same 3-term queries with 16 to 4,096 vids per term over
# 8,192 vectors, 50% density (benches/compare-width.svg): one round of its
# table, three of each point (compare's --chart-rounds default), as in the
# main run's chart.
target/release/compare --vectors 8192 --densities 0.5 --rounds 1 --queries 100 \
    --chart-vids 16,64,256,1024,4096 --chart-queries 150 \
    --json benches/compare-width.json --chart benches/compare-width.svg "$@"

# A 2^26-bit answer (8 MiB of words): a range of one vid of 16 vectors of
# 2^26 bits, the coordinator picked round-robin (most often not the slave
# holding the vector), then by bandwidth (the slave holding it).
for policy in round-robin bandwidth; do
    echo
    echo "words form of a 2^26-bit answer, $policy coordinators:"
    target/release/bitfold bench --vectors 16 --bits 2^26 --terms 1 --vids-per-term 1 \
        --form words --queries 200 --concurrency 2 --policy "$policy"
done
