#!/usr/bin/env bash
# Builds Locret training data for a model and trains its retaining heads (docs/locret.md).
# Usage: scripts/train_locret_heads.sh [--data-samples N] [--data-lengths L] MODEL.gguf OUT_DIR [STEPS] [D_M]
#          [TRAIN-LOCRET FLAGS...]
# (flags after D_M go to `kvtier train-locret`, e.g. --labels centered --lr 5e-3 --warmup 3 for
# Gemma-3, whose labels carry a large offset: docs/locret.md, "Gemma-3")
# Writes OUT_DIR/locret-data[-N-L].jsonl, OUT_DIR/<model>.locret.gguf (the heads) and OUT_DIR/train.log.
# The data: 160 prompts of 1K tokens (--data-samples, --data-lengths: `kvtier locret-data`'s
# --samples and --lengths), half eval-harness tasks, half QA over the licence texts in
# /usr/share/common-licenses (Debian base-files); 10 held out. Defaults: 60 steps, d_m 64, which take
# minutes on 2 cores (docs/locret.md, "Heads for the default models"). The head file is tied to the
# model's hash; it is not kept in git (7.4 MB for SmolLM2 at d_m 64). A run stopped with Ctrl-C
# continues where it stopped when the same command is run again (--resume).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
samples=160
lengths=1k
while [[ ${1:-} == --data-* ]]; do
  case $1 in
  --data-samples) samples=${2:?--data-samples needs a number}; shift 2 ;;
  --data-lengths) lengths=${2:?--data-lengths needs lengths such as 1k,2k}; shift 2 ;;
  *) echo "$0: unknown option $1 (the script takes --data-samples and --data-lengths before MODEL)" >&2; exit 2 ;;
  esac
done
usage="usage: $0 [--data-samples N] [--data-lengths L] MODEL.gguf OUT_DIR [STEPS] [D_M] [TRAIN-LOCRET FLAGS...]"
model=${1:?$usage}
out=${2:?$usage}
steps=${3:-60}
d_m=${4:-64}
mkdir -p "$out"
kvtier=build/cpu/bin/kvtier
[[ -x $kvtier ]] || { cmake --preset cpu >/dev/null && cmake --build --preset cpu -j "$(nproc)" --target kvtier; }
data=$out/locret-data.jsonl  # the defaults' name, as before
[[ $samples == 160 && $lengths == 1k ]] || data=$out/locret-data-$samples-${lengths//,/_}.jsonl
[[ -s $data ]] ||
  "$kvtier" locret-data -m "$model" -o "$data" --samples "$samples" --lengths "$lengths"
name=$(basename "$model" .gguf)
"$kvtier" train-locret -m "$model" -o "$out/$name.locret.gguf" --data "$data" \
  --steps "$steps" --d-m "$d_m" --held-out 10 --eval-every 0 --log-every 10 --resume "${@:5}" 2>&1 |
  tee "$out/train.log"
