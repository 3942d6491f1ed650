#!/usr/bin/env bash
# The allreduce-step benchmark on an emulated 2 hosts x 2 ranks cluster at 1 Gbit/s (needs
# root): RUNS runs for each torch thread setting (1 thread per rank, scaledl cluster's default,
# and 2), each on a fresh cluster; load averages before and after each run go to load.txt.
# Usage: benchmarks/compression/run_steps.sh [RUNS] [TAG]
set -euo pipefail
runs=${1:-3}
tag=${2:-final}
here=$(cd "$(dirname "$0")" && pwd)
python=$(command -v python)
for run in $(seq 1 "$runs"); do
  for threads in 1 2; do
    out="$here/step-2h2r-1gbit-$tag-threads$threads-run$run.json"
    echo "$(date -u +%H:%M:%S) before $(basename "$out"): $(cut -d' ' -f1-3 /proc/loadavg)" \
      >> "$here/load.txt"
    OMP_NUM_THREADS=$threads scaledl cluster run --hosts 2 --rate 1gbit --ranks-per-host 2 \
      --timeout 900 -- "$python" "$here/allreduce_step.py" --repeats 5 --json "$out" \
      > "$out.log" 2>&1
    echo "$(date -u +%H:%M:%S) after $(basename "$out"): $(cut -d' ' -f1-3 /proc/loadavg)" \
      >> "$here/load.txt"
  done
done
