#!/usr/bin/env bash
# Measurements that validate `scaledl simulate` on the emulated cluster (docs/simulation.md,
# "Validation on the emulated cluster").  Root, repository root, venv active:
#   bash benchmarks/sim_validation/run.sh [collectives] [profile] [train] [tcp] [timeshare]
#                                         [tcp_timeshare] [one_host] [host_queue]
#   (default: all but host_queue, an A/B of the emulator's old host queue)
# Raw JSON goes to $OUT (default benchmarks/sim_validation/raw); load.txt records the load
# average before and after every run, because other users' processes on the same cores
# distort every timing.  Each emulated-cluster run is short (a few seconds to a minute).
# RUNS (default "1 2") names the collective runs, RATES (default "100mbit 1gbit 10gbit") the
# link rates and ITERS the timed iterations per point (default per rate: 3, 5, 10); the host CPU
# constants were fitted on the 2x2 run 6 files, every other is held out.  TRAIN_RUN (default 1)
# numbers the train phase's files: analyze.py reports every repeat and their median.
# SCALEDL_SRC=DIR/src measures another source tree (e.g. a clean `git archive HEAD src`) while
# this checkout's working tree is being edited.
set -euo pipefail
out=${OUT:-benchmarks/sim_validation/raw}
mkdir -p "$out"
if [ -n "${SCALEDL_SRC:-}" ]; then export PYTHONPATH="$SCALEDL_SRC${PYTHONPATH:+:$PYTHONPATH}"; fi
echo "$(date -u +%FT%TZ) start: phases '${*:-all}', commit $(git rev-parse --short HEAD), source ${SCALEDL_SRC:-working tree}, $(nproc) cores" >> "$out/load.txt"
phases=${*:-collectives profile train tcp timeshare tcp_timeshare one_host}
note() { echo "$(date -u +%FT%TZ) $1: load average $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/load.txt"; }
clusters=()
teardown() { for c in "${clusters[@]}"; do scaledl cluster down "$c" >/dev/null 2>&1 || true; done; }
trap teardown EXIT
up() {  # up NAME RATE HOSTS
  scaledl cluster down "$1" >/dev/null 2>&1 || true
  scaledl cluster up --hosts "$3" --rate "$2" --name "$1" >/dev/null
  clusters+=("$1")
}
sizes() {  # per link rate: smallest, largest message, timed iterations
  case $1 in
    100mbit) echo "256K 8M 3" ;;
    1gbit) echo "256K 32M 5" ;;
    *) echo "256K 32M 10" ;;
  esac
}

collectives() {
  for rate in ${RATES:-100mbit 1gbit 10gbit}; do up "sv${rate%bit}" "$rate" 2; done
  for run in ${RUNS:-1 2}; do
    for rate in ${RATES:-100mbit 1gbit 10gbit}; do
      read -r lo hi iters <<< "$(sizes "$rate")"
      iters=${ITERS:-$iters}
      for layout in 2x2 3x2; do
        file="$out/allreduce-$layout-$rate-run$run.json"
        note "before $(basename "$file")"
        scaledl cluster run --name "sv${rate%bit}" --ranks-per-host "${layout%x*}" --timeout 300 \
          -- scaledl bench collectives --algorithms ring,hierarchical,torus --topology "$layout" \
             --min-bytes "$lo" --max-bytes "$hi" --step-factor 2 --warmup 1 --iters "$iters" \
             --p2p-bytes 1M --json "$file" > /dev/null
        note "after $(basename "$file")"
      done
    done
  done
}

train_one() {  # train_one TAG RATE LAYOUT MODEL ALGORITHM BATCH SAMPLES DATASET
  local tag=$1 rate=$2 layout=$3 model=$4 algorithm=$5 batch=$6 samples=$7 dataset=$8
  local dir=/tmp/scaledl-simv-train-$tag
  rm -rf "$dir"
  up "st${rate%bit}" "$rate" 2
  note "before train-$tag"
  scaledl cluster run --name "st${rate%bit}" --ranks-per-host "${layout%x*}" --timeout 300 \
    -- scaledl train --model "$model" --dataset "$dataset" --synthetic-size "$samples" \
       --epochs 1 --batch-size "$batch" --algorithm "$algorithm" --topology "$layout" \
       --seed 0 --out "$dir" --no-progress --eval-every 100000 > /dev/null
  note "after train-$tag"
  cp "$dir/metrics.jsonl" "$out/train-$tag-run${TRAIN_RUN:-1}.metrics.jsonl"
  rm -rf "$dir"
}

train_single() {  # the trainer's own per-step cost: one worker, no communication, one core
  local model=$1 batch=$2 dataset=$3 dir=/tmp/scaledl-simv-single-$1
  rm -rf "$dir"
  note "before train-single-$model"
  OMP_NUM_THREADS=1 scaledl train --workers 1 --model "$model" --dataset "$dataset" \
    --synthetic-size 2048 --epochs 1 --batch-size "$batch" --seed 0 --out "$dir" --no-progress \
    --eval-every 100000 > /dev/null
  note "after train-single-$model"
  cp "$dir/metrics.jsonl" "$out/train-single-$model-run${TRAIN_RUN:-1}.metrics.jsonl"
  rm -rf "$dir"
}

train() {
  train_single mlp 64 synthetic:1x28x28:10
  train_single resnet20 32 synthetic:3x32x32:10
  # three configurations: communication-bound, mixed, compute-bound
  train_one mlp-ring-2x2-1gbit 1gbit 2x2 mlp ring 64 16384 synthetic:1x28x28:10
  train_one mlp-hierarchical-3x2-100mbit 100mbit 3x2 mlp hierarchical 64 8192 synthetic:1x28x28:10
  train_one resnet20-torus-2x2-10gbit 10gbit 2x2 resnet20 torus 32 4096 synthetic:3x32x32:10
}

profile() {
  # the same models measured on one core (what every rank of the runs above has: OMP=1)
  note "before profiles"
  # batches: the training runs' (64 and 32) and one more, and a held-out batch for the check
  # that a profile predicts a batch it did not measure (analyze.py)
  # repeats: the MLP's sub-millisecond iterations need many for a stable median
  for spec in "mlp 1x28x28 16,64 32 41" "resnet20 3x32x32 8,32 16 21"; do
    read -r model shape batches held repeats <<< "$spec"
    OMP_NUM_THREADS=1 scaledl simulate profile --model "$model" --input-shape "$shape" \
      --classes 10 --batches "$batches" --threads 1 --repeats "$repeats" \
      -o "$out/profile-$model.json"
    OMP_NUM_THREADS=1 scaledl simulate profile --model "$model" --input-shape "$shape" \
      --classes 10 --batches "$held" --threads 1 --repeats "$repeats" \
      -o "$out/profile-$model-b$held.json"
  done
  note "after profiles"
}

tcp() {  # raw TCP cost per byte: loopback, and across an emulated link unshaped and at 10gbit
  note "before tcp"
  for _ in 1 2 3; do python benchmarks/sim_validation/tcp_stream.py --loopback; done \
    >> "$out/tcp-stream.jsonl"
  for rate in none 10gbit; do
    up "tcp${rate%bit}" "$rate" 2
    scaledl cluster run --name "tcp${rate%bit}" --ranks-per-host 1 --timeout 60 \
      -- python benchmarks/sim_validation/tcp_stream.py 2>/dev/null \
      | sed "s/}\$/, \"rate\": \"$rate\"}/" >> "$out/tcp-stream.jsonl"
  done
  note "after tcp"
}

timeshare() {  # compute lost when ranks time-share the cores (presets.py CPU_TIMESHARE)
  note "before timeshare"
  for _ in 1 2 3; do python benchmarks/sim_validation/timeshare.py --ranks 4,6; done \
    >> "$out/timeshare.jsonl"
  note "after timeshare"
}

tcp_timeshare() {  # TCP's cost per byte when ranks time-share the cores (CPU_TCP_TIMESHARE)
  note "before tcp_timeshare"
  python benchmarks/sim_validation/tcp_timeshare.py measure --ranks 2,3,4,5,6 --repeats 3 \
    --out "$out"
  python benchmarks/sim_validation/tcp_timeshare.py fit "$out"
  note "after tcp_timeshare"
}

one_host() {  # the ring and shared memory among 2-6 ranks of one host, from 4 KiB (not modelled
  # for shm beyond a core per rank: docs/simulation.md, "Validation here")
  for n in 2 3 4 5 6; do
    note "before one-host-ring-shm-$n"
    OMP_NUM_THREADS=1 scaledl bench collectives --ranks "$n" --algorithms ring,shm \
      --collectives allreduce --min-bytes 4K --max-bytes 4M --step-factor 4 --warmup 3 \
      --iters 40 --p2p-bytes 1M --timeout 300 --json "$out/one-host-ring-shm-$n.json" > /dev/null
    note "after one-host-ring-shm-$n"
  done
}

host_queue() {  # the emulated hosts' queue: 5 ms (before 242dd22) against a NIC's 1000 frames,
  # three alternating runs of each on one 100mbit cluster (docs/cluster.md, "The host's queue")
  up sq100m 100mbit 2
  local k queue h
  for k in ${HQ_RUNS:-1 2 3}; do
    for queue in shallow deep; do
      for h in 0 1; do
        if [ "$queue" = shallow ]; then set -- latency 5ms; else set -- limit 1514000b; fi
        tc -n "scaledl-sq100m-h$h" qdisc change dev eth0 root tbf rate 100mbit burst 32768b "$@"
      done
      note "before host-queue-$queue-$k.json"
      scaledl cluster run --name sq100m --ranks-per-host 3 --timeout 300 \
        -- scaledl bench collectives --algorithms ring,hierarchical,torus --topology 3x2 \
           --min-bytes 1M --max-bytes 8M --step-factor 2 --warmup 1 --iters 12 \
           --p2p-bytes 1M --json "$out/host-queue-$queue-$k.json" > /dev/null
      note "after host-queue-$queue-$k.json, host 0 $(tc -n scaledl-sq100m-h0 -s qdisc show \
        dev eth0 | grep -o 'dropped [0-9]*') packets so far"
    done
  done
}

for phase in $phases; do "$phase"; done
