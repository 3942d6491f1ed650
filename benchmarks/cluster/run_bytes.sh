#!/usr/bin/env bash
# Bytes over each host's shaped link per allreduce (see README.md here).
# Usage (root, repository root, venv active): bash benchmarks/cluster/run_bytes.sh
set -euo pipefail
out=benchmarks/cluster
name=bytes1g
scaledl cluster down "$name" 2>/dev/null || true
scaledl cluster up --hosts 2 --rate 1gbit --name "$name"
trap 'scaledl cluster down "$name"' EXIT
for placement in block cyclic; do
  for algorithm in native ring hierarchical torus; do
    # 16 MiB, 1 verification + 1 warm-up + 5 timed calls = 7 allreduces
    scaledl cluster run --name "$name" --ranks-per-host 2 --placement "$placement" --timeout 300 \
      --counters "$out/bytes-2h2r-1gbit-$placement-$algorithm.json" \
      -- scaledl bench collectives --algorithms "$algorithm" --topology 2x2 \
         --min-bytes 16M --max-bytes 16M --iters 5 --warmup 1 --p2p-bytes 4K \
         --json "$out/bytes-2h2r-1gbit-$placement-$algorithm.bench.json"
  done
done
