#!/usr/bin/env bash
# Sets up (packages, .venv, models), builds the CPU preset and runs the main job on the default
# model. Today the engine reads and describes models; generation arrives with the forward pass.
# Usage: scripts/demo.sh [--no-setup]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ "${1:-}" == "--no-setup" ]] || scripts/setup.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target kvtier
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== kvtier inspect $model"
build/cpu/bin/kvtier inspect "$model"
