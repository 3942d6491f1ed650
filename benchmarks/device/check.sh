#!/usr/bin/env bash
# Checks that need a GPU machine (the `device` tool lends one to some sessions), as one script
# with a deadline: every phase gets what is left, and results.tgz is rewritten after each.
#   bash benchmarks/device/check.sh [probe] [smoke] [cli] [train] [rates] [ops] [netns] [mpi]
#                                   [tests]
#   (default: probe smoke cli rates netns; ops times every aten operation, tests runs the whole
#   suite on the machine's torch with a CUDA device present)
# Needs only the machine's python3 with torch; scaledl runs from src/ (PYTHONPATH).
# DEADLINE (seconds, default 420) bounds the whole script; OUT is where results go.
set -uo pipefail
out=${OUT:-/tmp/scaledl-device}; work=$out/work; mkdir -p "$work"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m scaledl.cli.main "$@"\n' > /tmp/bin/scaledl
chmod +x /tmp/bin/scaledl && export PATH=/tmp/bin:$PATH
end=$(( $(date +%s) + ${DEADLINE:-420} ))
left() { echo $(( end - $(date +%s) - 10 )); }
pack() { tar -C "$out" -czf "$out/results.tgz" work; }
step() {  # step NAME MAXSECONDS COMMAND...: bounded by the deadline, logged
  local name=$1 max=$2; shift 2
  local t; t=$(left); [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -le 5 ]; then echo "== $name: skipped, deadline"; return; fi
  echo "== $name (up to ${t}s) $(date -u +%T)"
  timeout -k 5 "$t" "$@" > "$work/$name.txt" 2>&1; echo "== $name: rc $? $(date -u +%T)"
  grep -E "FAILED|ERROR" "$work/$name.txt" | head -n 40; tail -n 40 "$work/$name.txt"; pack
}

probe() {
  step probe 60 bash -c 'nvidia-smi -L; python3 -c "import sys, torch; print(sys.version);
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))";
nproc; uname -r; python3 -c "import rich, matplotlib, sklearn, scipy, numpy; print(\"deps ok\")";
ip -V; tc -V; ip netns add sdlprobe && echo "netns ok" && ip netns del sdlprobe'
}
smoke() { step cuda-smoke 150 python3 benchmarks/device/cuda_smoke.py; }
cli() {  # what a user of one GPU host gets from the CLI as it is
  step cli-train-1 60 scaledl train --workers 1 --model mlp --dataset synthetic:1x28x28:10 \
    --synthetic-size 512 --epochs 1 --batch-size 64 --no-progress --out "$(mktemp -d)/run"
  step cli-train-2 60 scaledl train --workers 2 --model mlp --dataset synthetic:1x28x28:10 \
    --synthetic-size 512 --epochs 1 --batch-size 64 --no-progress --out "$(mktemp -d)/run"
  step cli-bench 60 scaledl bench collectives --ranks 2 --algorithms ring --max-bytes 1M \
    --iters 3
  step cli-profile 90 scaledl simulate profile --model resnet50 --batches 32,64 \
    -o "$work/profile-resnet50-cli.json"
}
train() {  # scaledl train --device cuda: precisions, options, strategies, torchrun, refusals
  step train-cuda 360 env OUT="$work" bash benchmarks/device/train_cuda.sh
}
rates() { step rates 240 python3 benchmarks/device/rates.py "$work/rates"; }
ops() { step ops 180 python3 benchmarks/device/op_times.py "$work/ops"; }  # per aten operation
netns() {  # the emulated cluster at 10 Gbit/s with a core per rank (sim_validation/run.sh);
  # iproute2 from .device-carry where the machine has none (iproute2.sh; carry .device-carry)
  [ -d .device-carry/iproute2 ] && source benchmarks/device/iproute2.sh use
  step netns 200 env OUT="$work/sim_validation" RATES=10gbit RUNS="1 2" ITERS=10 \
    bash benchmarks/sim_validation/run.sh collectives tcp
}
mpi() {  # why Open MPI jobs on one host failed on the H200's host while those with -H host:slots
  # passed: the slots Open MPI counts, /dev/shm (its shared-memory transport, used on one host
  # only), whether the host name resolves, and 2- and 3-rank jobs on one host with their
  # bindings and their own error messages
  step mpi 60 bash -c 'nproc; df -h /dev/shm; hostname; getent hosts "$(hostname)";
mpirun.openmpi --version | head -n 1; mpirun.openmpi --allow-run-as-root --display-allocation -np 1 true;
for n in 2 3; do mpirun.openmpi --allow-run-as-root --report-bindings -np $n python3 -c "print(\"rank ok\")";
echo "rc $? for $n ranks"; done'
}
tests() {  # the suite on the machine's own torch (another release than CI's) beside a GPU
  # the suite's own dependencies the machine lacks (sybil, pure Python) come as wheels in .whl,
  # carried, and are imported from the wheels themselves:
  # python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl sybil
  local wheels; wheels=$(ls .whl/*.whl 2>/dev/null | paste -sd: -)
  [ -n "$wheels" ] && export PYTHONPATH=$wheels:$PYTHONPATH
  python3 -c "import sybil" > "$work/tests-deps.txt" 2>&1 ||
    echo "== tests: sybil is missing; carry .whl (see check.sh)" | tee -a "$work/tests-deps.txt"
  # -v: every failure is named as it happens, so a run the deadline stops still says which;
  # TESTS names a part of the suite (default: all of it)
  # SCALEDL_FAILURE_LOG: each failure's traceback as it happens (tests/conftest.py), which a
  # run the deadline stops would otherwise never print
  # shellcheck disable=SC2086  # TESTS is a list of paths
  step tests 600 env SCALEDL_FAILURE_LOG="$work/failures.txt" python3 -m pytest -v -rfE -n 14 \
    --timeout 120 -p no:cacheprovider ${TESTS:-tests}
}
for phase in ${*:-probe smoke cli rates netns}; do "$phase"; done
pack
