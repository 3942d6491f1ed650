#!/usr/bin/env bash
# benchmarks/peers/small_message.py of two commits side by side: OLD (a worktree) against this
# tree, alternating run by run, OMP_NUM_THREADS=1 and unset, at each size in SIZES (bytes).
#   bash benchmarks/paths/ab_small_message.sh OLD_COMMIT [ROUNDS] [OUT_DIR]
# Each run prints per depth the wall time per call (slowest rank) and the CPU time per call with
# the waits for peers taken out ("busy"): the latter holds on a loaded machine, where a wait
# costs whatever the scheduler makes it cost.  Compare the "api" rows of OLD and new.
set -euo pipefail
old=${1:?usage: ab_small_message.sh OLD_COMMIT [ROUNDS] [OUT_DIR]}
rounds=${2:-3}
out=${3:-$(mktemp -d)}
sizes=${SIZES:-4096 262144}
here=$(cd "$(dirname "$0")/../.." && pwd)
tree=$(mktemp -d)/old
git -C "$here" worktree add -q "$tree" "$old"
trap 'git -C "$here" worktree remove --force "$tree"' EXIT
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for bytes in $sizes; do
    for threads in 1 default; do
      for side in old new; do
        if [ "$side" = old ]; then root=$tree; else root=$here; fi
        if [ "$threads" = 1 ]; then export OMP_NUM_THREADS=1; else unset OMP_NUM_THREADS; fi
        port=$((20000 + RANDOM % 20000))
        (cd "$out" && PYTHONPATH=$root/src torchrun --nproc-per-node 2 --master-port "$port" \
          "$root/benchmarks/peers/small_message.py" --bytes "$bytes" --calls 300 --rounds 5 \
          2>/dev/null | grep -v "INFO" > "sm-$side-$threads-$bytes-$round.txt") || true
      done
    done
  done
done
uptime > "$out/load.txt"
echo "wrote $out"
