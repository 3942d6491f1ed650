#!/usr/bin/env bash
# The README's job (`scaledl train`: digits MLP, 2 workers on this 2-core VM, 10 epochs) at
# --precision fp32 and bf16, seeds 0 and 1, alternating; each run's test accuracy to
# results.jsonl.  docs/training.md ("Mixed precision") reports it.
#   bash benchmarks/precision/run.sh [OUT]   (about 2 minutes)
set -euo pipefail
out=${1:-benchmarks/precision}
export OMP_NUM_THREADS=1
: > "$out/results.jsonl"
for seed in 0 1; do
  for precision in fp32 bf16; do
    run=$(mktemp -d)
    start=$(date +%s.%N)
    scaledl train --workers 2 --seed "$seed" --precision "$precision" --no-progress \
      --out "$run" > "$run.log" 2>&1
    end=$(date +%s.%N)
    python3 - "$run" "$precision" "$seed" "$start" "$end" >> "$out/results.jsonl" <<'PY'
import json, sys
run, precision, seed, start, end = sys.argv[1:]
result = json.load(open(f"{run}/summary.json"))["result"]
print(json.dumps({"precision": precision, "seed": int(seed),
                  "test_accuracy": result["test_accuracy"], "steps": result["steps"],
                  "train_s": round(result["wall_s"], 3),
                  "command_s": round(float(end) - float(start), 2)}))
PY
    rm -rf "$run" "$run.log"
  done
done
cat "$out/results.jsonl"
