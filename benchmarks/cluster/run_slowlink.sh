#!/usr/bin/env bash
# Control experiment: the same 2x2 allreduce at 100mbit, where the intra-host phases are
# negligible next to the link (see README.md here).
set -euo pipefail
out=benchmarks/cluster
name=slow100m
scaledl cluster down "$name" 2>/dev/null || true
scaledl cluster up --hosts 2 --rate 100mbit --name "$name"
trap 'scaledl cluster down "$name"' EXIT
scaledl cluster run --name "$name" --ranks-per-host 2 --timeout 600 \
  -- scaledl bench collectives --algorithms native,ring,hierarchical,torus --topology 2x2 \
     --min-bytes 4M --max-bytes 16M --iters 3 --warmup 1 --p2p-bytes 4K \
     --json "$out/allreduce-2h2r-100mbit-block-run1.json"
