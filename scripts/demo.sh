#!/usr/bin/env bash
# Sets up (packages, .venv, models), builds the CPU preset and runs the main job on the default
# model: a chat generation over a long document whose KV cache is offloaded head group by head
# group (HeadInfer placement) with only a small compute-local KV budget.
# Usage: scripts/demo.sh [--no-setup]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "${1:-}" == "--no-setup" ]] || scripts/setup.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target kvtier
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
doc=tests/model_ref/data/declaration.txt
prompt="$(cat "$doc")

In two sentences, what does the document above declare?"
echo "== kvtier run (SmolLM2-135M, HeadInfer placement, 8 MiB compute-local KV budget)"
build/cpu/bin/kvtier run -m "$model" --chat -p "$prompt" -n 96 --ctx 4096 \
  --kv-policy headinfer --kv-mem 8MiB
