#!/usr/bin/env bash
# Where decode time goes on the GPU (a device-machine call after scripts/gpu_check.sh --receive of the
# set holding bin.tar.xz; no model file needed: synthetic weights are made on the device).
#   bash scripts/gpu_profile.sh            writes $OUT/profile.log
# 1. decode speed against the context length (resident, synthetic SmolLM2 and Llama-3-8B shapes);
# 2. Nsight Compute's per-kernel summary (gpu__time_duration) of about two decode steps of the
#    SmolLM2 shape at a 1024-token context, taken from the bench's warm-up round.
set -uo pipefail
state=/tmp/kvtier_gpu
OUT=${OUT:-$PWD/gpu_profile_out}
mkdir -p "$OUT"
log=$OUT/profile.log
for d in /usr/local/cuda/bin /opt/nvidia/nsight-compute/*/; do [[ -d $d ]] && PATH=$PATH:$d; done
libdirs=$(find /usr /opt \( -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$state/bin:${libdirs}${LD_LIBRARY_PATH:-}"
kv=$state/bin/kvtier
{
  echo "=== decode vs context (resident)"
  timeout 60 "$kv" bench -m synthetic:smollm2-135m --backend cuda --kv-policy resident --ctx 2048 \
    --prompt-tokens 1,64,256,1024 --gen 32 --repeat 3
  timeout 90 "$kv" bench -m synthetic:llama3-8b --backend cuda --device-mem 24GiB --ctx 2048 --kv-policy resident \
    --prompt-tokens 1,64,256,1024 --gen 16 --repeat 1
  echo "=== ncu: SmolLM2 shape, prompt 1024, kernels 8000-9399 (decode steps of the warm-up round)"
  timeout 180 ncu --metrics gpu__time_duration.sum --launch-skip 8000 --launch-count 1400 --print-summary per-kernel \
    "$kv" bench -m synthetic:smollm2-135m --backend cuda --kv-policy resident --ctx 2048 --prompt-tokens 1024 \
    --gen 40 --repeat 1
} >"$log" 2>&1
echo "exit $?" >>"$log"
tail -c 6000 "$log"
