#!/usr/bin/env bash
# `scaledl train --device cuda` on a GPU machine (one GPU: one rank per run, since NCCL gives
# each rank its own GPU): the CUDA path CI cannot run.  Each check prints "== NAME: ok" or
# "== NAME: FAILED (...)" and keeps its log in $OUT/train-cuda/NAME.txt; the script exits 1 if
# any failed.  DEVICE=cpu runs the same checks on the CPU (a dry run of the script itself; the
# fp16 check then expects its refusal; MODEL=mlp SIZE=512 EPOCHS=2 make it quick).
#   bash benchmarks/device/train_cuda.sh          (about 5 minutes on an H200)
# Needs scaledl importable (PYTHONPATH=src) and a `scaledl` command (check.sh provides both).
set -uo pipefail
device=${DEVICE:-cuda}
out=${OUT:-/tmp/scaledl-device}/train-cuda; mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
model=${MODEL:-resnet20}
data=(--dataset synthetic:3x32x32:10 --synthetic-size "${SIZE:-4096}" --batch-size 128
      --no-progress)
failed=0

check() {  # check NAME EXPECT COMMAND...: EXPECT is "ok" (exit 0) or text the error must hold
  local name=$1 expect=$2; shift 2
  timeout -k 5 150 "$@" > "$out/$name.txt" 2>&1; local rc=$?
  if [ "$expect" = ok ] && [ $rc -eq 0 ]; then echo "== $name: ok"
  elif [ "$expect" != ok ] && [ $rc -eq 2 ] && grep -qF "$expect" "$out/$name.txt"; then
    echo "== $name: ok (refused: $expect)"
  else
    echo "== $name: FAILED (rc $rc)"; tail -n 15 "$out/$name.txt"; failed=1
  fi
}

verify() {  # verify NAME RUNDIR MIN_ACCURACY: the run used the device and load_model works
  python3 - "$2" "$3" "$device" > "$out/$1-verify.txt" 2>&1 <<'PY' || { echo "== $1 verify: FAILED"; cat "$out/$1-verify.txt"; failed=1; }
import json, sys
import torch
import scaledl
run, least, device = sys.argv[1], float(sys.argv[2]), sys.argv[3]
result = json.load(open(f"{run}/summary.json"))["result"]
assert result["test_accuracy"] >= least, result["test_accuracy"]
model = scaledl.load_model(run, map_location=device)
assert all(p.device.type == device for p in model.parameters())
x = torch.randn(2, 3, 32, 32, device=device)
print("ok", result["test_accuracy"], result["steps"], model(x).shape)
PY
  grep -q '^ok' "$out/$1-verify.txt" && echo "== $1 verify: ok $(cat "$out/$1-verify.txt")"
}

# 1. the plain path: fp32, DataParallel (allreduce) on the GPU over NCCL
check fp32 ok scaledl train --workers 1 --device "$device" --model "$model" "${data[@]}" \
  --epochs "${EPOCHS:-6}" --out "$out/fp32"
grep -q "backend=$([ "$device" = cuda ] && echo nccl || echo gloo)" "$out/fp32.txt" \
  || { echo "== fp32: the process group was not the device's"; failed=1; }
verify fp32 "$out/fp32" "${LEAST:-0.9}"
# 2. bf16 with accumulation, schedule, warm-up, clipping, max steps and bf16 compression
check bf16-options ok scaledl train --workers 1 --device "$device" --model "$model" \
  "${data[@]}" --epochs "${EPOCHS:-6}" --precision bf16 --grad-accum 2 --lr-schedule cosine \
  --warmup-epochs 0.5 --clip-grad-norm 5 --max-steps 80 --compression bf16 \
  --out "$out/bf16-options"
verify bf16-options "$out/bf16-options" "${LEAST:-0.5}"
# 2b. PowerSGD's P and Q on the device (rank 4, one epoch)
check powersgd ok scaledl train --workers 1 --device "$device" --model "$model" "${data[@]}" \
  --epochs 1 --compression powersgd:4 --out "$out/powersgd"
# 3. fp16 with its gradient scaler and AdamW (on the CPU: refused, as designed)
if [ "$device" = cuda ]; then
  check fp16-adamw ok scaledl train --workers 1 --device cuda --model "$model" "${data[@]}" \
    --epochs 2 --precision fp16 --optimizer adamw --lr 0.002 --out "$out/fp16-adamw"
  verify fp16-adamw "$out/fp16-adamw" 0.5
else
  check fp16-adamw "precision 'fp16' is not done on the CPU" scaledl train --workers 1 \
    --device cpu --precision fp16 "${data[@]}" --out "$out/fp16-adamw"
fi
# 4. the other collective strategies on the device
check local-sgd ok scaledl train --workers 1 --device "$device" --model "$model" "${data[@]}" \
  --epochs 1 --strategy local-sgd --tau 4 --precision bf16 --out "$out/local-sgd"
check reduce-broadcast ok scaledl train --workers 1 --device "$device" --model "$model" \
  "${data[@]}" --epochs 1 --strategy reduce-broadcast --algorithm tree --out "$out/rb"
# 5. under torchrun, as one of a launcher's ranks
check torchrun ok torchrun --standalone --nproc-per-node 1 -m scaledl.cli.main train \
  --device "$device" --model lenet --dataset synthetic:1x28x28:10 --synthetic-size 2048 \
  --epochs 1 --no-progress --out "$out/torchrun"
# 6. a resume on the device continues from the checkpoint
check resume ok scaledl train --workers 1 --device "$device" --model "$model" "${data[@]}" \
  --epochs "$(( ${EPOCHS:-6} + 1 ))" --resume auto --out "$out/fp32"
# 7. refusals before any worker: more workers than GPUs, a server strategy
if [ "$device" = cuda ]; then
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
  check too-many-workers "workers on this host but it has $gpus GPU" scaledl train \
    --workers $((gpus + 1)) --device cuda "${data[@]}" --out "$out/refused"
  check server-strategy "does not run with --device cuda" scaledl train --workers 1 \
    --device cuda --strategy async-sgd --momentum 0 "${data[@]}" --out "$out/refused"
fi
exit $failed
