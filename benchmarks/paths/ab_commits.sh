#!/usr/bin/env bash
# The shared-memory allreduce of two commits side by side: OLD (a worktree) against this tree,
# alternating run by run, with OMP_NUM_THREADS=1 and with torch's default threads.
#   bash benchmarks/paths/ab_commits.sh OLD_COMMIT [ROUNDS] [OUT_DIR]
# Each run is `scaledl bench collectives` (shm and torch, 4 KiB..64 MiB, 2 ranks; MAX_BYTES and
# STEP_FACTOR in the environment change the sizes); compare the medians of the JSON files it
# leaves in OUT_DIR (benchmarks/paths/ab_table.py prints them side by side).
set -euo pipefail
old=${1:?usage: ab_commits.sh OLD_COMMIT [ROUNDS] [OUT_DIR]}
rounds=${2:-3}
out=${3:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/../.." && pwd)
tree=$(mktemp -d)/old
git -C "$here" worktree add -q "$tree" "$old"
trap 'git -C "$here" worktree remove --force "$tree"' EXIT
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for threads in 1 default; do
    for side in old new; do
      if [ "$side" = old ]; then src=$tree/src; else src=$here/src; fi
      if [ "$threads" = 1 ]; then t=1; else t=$(nproc); fi
      (cd "$out" && PYTHONPATH=$src OMP_NUM_THREADS=$t python -m scaledl.cli.main bench \
        collectives --ranks 2 --collectives allreduce --algorithms shm,torch --min-bytes 4K \
        --max-bytes "${MAX_BYTES:-64M}" --step-factor "${STEP_FACTOR:-16}" --json "ab-$side-$threads-$round.json" >/dev/null)
    done
  done
done
uptime > "$out/load.txt"
echo "wrote $out"
