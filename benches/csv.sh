#!/usr/bin/env bash
# `bitfold index` on a 10M-row, 6-column CSV
# (benches/runs/2026-12-01-csv-index.md): the table is
# `bitfold sample --rows 10000000 --seed 7` (age, region, last_purchase,
# income, signup_year, basket; about 340 MB), written to a temporary
# directory, indexed twice (the second run is reported, with
# the file in the page cache), then removed.
#
#   benches/csv.sh [ROWS] [index flags...]     e.g. benches/csv.sh 1000000 --binning quantile
set -euo pipefail
cd "$(dirname "$0")/.."
rows="${1:-10000000}"
shift || true

cargo build --release --quiet -p bitfold --bin bitfold
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
target/release/bitfold sample --rows "$rows" --seed 7 --out "$work/table.csv"
ls -l "$work/table.csv" | awk '{ printf "table: %.0f MB\n", $5 / 1e6 }'
for run in 1 2; do
    rm -rf "$work/index"
    /usr/bin/time -f "run $run: %e s wall, %U s user CPU, %M KB peak memory" \
        target/release/bitfold index "$work/table.csv" --out "$work/index" "$@"
done
