#!/usr/bin/env bash
# scaledl against MPI, DeepSpeed and Gloo inside one host: `scaledl bench collectives --peers`
# under mpiexec, 2 and 4 ranks, with OMP_NUM_THREADS=1 and with it unset (torch's default
# threads), REPEATS times each; then the table of medians (benchmarks/peers/table.py).
#   bash benchmarks/peers/run.sh [OUT_DIR] [REPEATS] [extra bench options...]
# Needs the peers: pip install torch==2.13.0 -e '.[peers]' (mpi4py, Open MPI, DeepSpeed; the
# first run builds DeepSpeed's CPU op, about a minute).  docs/benchmarks.md, "Against the peers".
set -euo pipefail
out=${1:-benchmarks/peers/raw}
repeats=${2:-2}
shift $(( $# > 2 ? 2 : $# ))
mkdir -p "$out"
here=$(cd "$(dirname "$0")/../.." && pwd)
mpiexec=$(dirname "$(command -v python)")/mpiexec
[ -x "$mpiexec" ] || mpiexec=mpiexec
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # containers run as root
for repeat in $(seq "$repeats"); do
  for ranks in 2 4; do
    for threads in 1 unset; do
      name="$out/peers-${ranks}ranks-threads-$threads-$repeat"
      if [ "$threads" = 1 ]; then export OMP_NUM_THREADS=1; else unset OMP_NUM_THREADS; fi
      "$mpiexec" -n "$ranks" --oversubscribe python -m scaledl.cli.main bench collectives \
        --peers mpi,deepspeed,gloo --min-bytes 4K --max-bytes 256M --step-factor 4 \
        --json "$name.json" "$@" > "$name.txt" 2>&1 || { tail -20 "$name.txt"; exit 1; }
      uptime >> "$out/load.txt"
    done
  done
done
python "$here/benchmarks/peers/table.py" "$out"/peers-*.json
