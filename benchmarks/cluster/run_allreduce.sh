#!/usr/bin/env bash
# Allreduce on an emulated 2-host x 2-rank cluster at 1gbit and 10gbit (see README.md here).
# Usage (root, repository root, venv active): bash benchmarks/cluster/run_allreduce.sh [REPEATS]
# RATES, PLACEMENTS and FIRST (index of the first run file) narrow or extend a series.
set -euo pipefail
out=benchmarks/cluster
repeats=${1:-3}
first=${FIRST:-1}
algorithms=native,ring,hierarchical,torus
for rate in ${RATES:-1gbit 10gbit}; do
  name=bench${rate%bit}
  scaledl cluster down "$name" 2>/dev/null || true
  scaledl cluster up --hosts 2 --rate "$rate" --name "$name"
  trap 'scaledl cluster down "$name"' EXIT
  for run in $(seq "$first" $((first + repeats - 1))); do
    for placement in ${PLACEMENTS:-block cyclic}; do
      scaledl cluster run --name "$name" --ranks-per-host 2 --placement "$placement" --timeout 600 \
        -- scaledl bench collectives --algorithms "$algorithms" --topology 2x2 \
           --min-bytes 1M --max-bytes 64M --step-factor 2 --warmup 2 --p2p-bytes 16M \
           --json "$out/allreduce-2h2r-$rate-$placement-run$run.json"
      echo "run $run $rate $placement: load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"
    done
  done
  scaledl cluster down "$name"
  trap - EXIT
done
