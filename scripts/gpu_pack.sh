#!/usr/bin/env bash
# Run HERE (no GPU needed), after `cmake --build --preset cuda`: packs what scripts/gpu_check.sh needs
# on a bare GPU machine into .gpu_carry/ (ignored by git through .git/info/exclude), in pieces that
# each fit one device call's 64 MiB carry limit:
#   .gpu_carry/bin      the CUDA build's kvtier, test_cuda and test_cuda_model, the shared libraries
#                       they need that a CUDA image may lack (libfmt, gtest), and the model directory
#                       the tests were compiled to read (model_dir.txt)
#   .gpu_carry/mN       the GGUF test models cut into parts of at most 60 MiB, with their sha256
# Usage: scripts/gpu_pack.sh [MODEL.gguf ...]   (default: the two test models in models/)
# It prints the device calls to make, in order.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
build=build/cuda
carry=.gpu_carry
part_bytes=$((60 * 1024 * 1024))
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu_carry/' "$exclude" 2>/dev/null || echo '/.gpu_carry/' >>"$exclude"

for t in bin/kvtier tests/cuda/test_cuda tests/cuda/test_cuda_model; do
  [[ -x $build/$t ]] || { echo "missing $build/$t: run cmake --preset cuda && cmake --build --preset cuda" >&2; exit 1; }
done
rm -rf "$carry"
mkdir -p "$carry/bin"
cp "$build/bin/kvtier" "$build/tests/cuda/test_cuda" "$build/tests/cuda/test_cuda_model" "$carry/bin/"
strip --strip-debug "$carry/bin/"* 2>/dev/null || true
# Shared libraries outside glibc/libstdc++ and CUDA's (cuBLAS is too big to carry; the image has it).
for b in "$carry/bin/"*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux)[.-]|libcu|libnv' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$carry/bin/"; done
# The CUDA runtime the binaries were built with (small); cuBLAS comes from the machine.
for b in "$carry/bin/"*; do ldd "$b" | awk '/libcudart/{print $3}'; done | sort -u | while read -r lib; do
  [[ -n $lib ]] && cp -L "$lib" "$carry/bin/"
done
grep '^KVTIER_MODEL_DIR:' "$build/CMakeCache.txt" | cut -d= -f2- >"$carry/bin/model_dir.txt"
echo "bin: $(du -sh "$carry/bin" | cut -f1) ($(ls "$carry/bin" | tr '\n' ' '))"

models=("$@")
if [[ ${#models[@]} -eq 0 ]]; then
  models=(models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf)
fi
set_no=1
for m in "${models[@]}"; do
  [[ -f $m ]] || { echo "no model file $m" >&2; exit 1; }
  name=$(basename "$m")
  tmp=$(mktemp -d)
  split -b "$part_bytes" -d -a 2 "$m" "$tmp/$name.part"
  n=$(ls "$tmp" | wc -l)
  sum=$(sha256sum "$m" | cut -d' ' -f1)
  for p in "$tmp"/*; do
    d="$carry/m$set_no"
    mkdir -p "$d"
    mv "$p" "$d/$(basename "$p")of$n"
    echo "$sum" >"$d/$name.sha256"
    set_no=$((set_no + 1))
  done
  rmdir "$tmp"
done
echo
echo "Device calls, back to back (a machine goes back 30 s after a call; the state lives in its /tmp):"
echo "  run carry=[\".gpu_carry/bin\"] command='bash scripts/gpu_check.sh --receive .gpu_carry/bin'"
for ((i = 1; i < set_no; i++)); do
  echo "  run carry=[\".gpu_carry/m$i\"] command='bash scripts/gpu_check.sh --receive .gpu_carry/m$i'"
done
echo "  run timeout_s=600 command='bash scripts/gpu_check.sh --run'"
