#!/usr/bin/env bash
# Training across an emulated 2-host x 2-rank cluster at 1gbit (see README.md here).
# Usage (root, repository root, venv active): bash benchmarks/cluster/run_train.sh
set -euo pipefail
out=benchmarks/cluster
name=train1g
scaledl cluster down "$name" 2>/dev/null || true
scaledl cluster up --hosts 2 --rate 1gbit --name "$name"
trap 'scaledl cluster down "$name"' EXIT
for algorithm in ring hierarchical torus; do
  dir=/tmp/scaledl-cluster-train-$algorithm
  scaledl cluster run --name "$name" --ranks-per-host 2 --timeout 600 \
    --counters "$out/train-2h2r-1gbit-$algorithm.bytes.json" \
    -- scaledl train --model mlp --dataset fashion-mnist --epochs 1 --batch-size 64 \
       --algorithm "$algorithm" --seed 0 --out "$dir" --no-progress
  cp "$dir/summary.json" "$out/train-2h2r-1gbit-$algorithm.summary.json"
done
