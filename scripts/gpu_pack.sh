#!/usr/bin/env bash
# Run HERE (no GPU needed), after `cmake --build --preset cuda`: packs what scripts/gpu_check.sh needs
# on a bare GPU machine into .gpu_carry/ (ignored by git through .git/info/exclude), in pieces that
# each fit one device call's 64 MiB carry limit:
#   bin/     (packed as bin.tar.xz) the CUDA build's kvtier, test_cuda, test_cuda_model and bench_gather_cuda, the shared libraries they need
#            that a CUDA image may lack (libfmt, pcre2, the CUDA runtime; not cuBLAS, which is too big),
#            and the model directory the tests were compiled to read (model_dir.txt)
#   parts    the GGUF test models cut into parts of at most 56 MiB, with their sha256
# packed into sets .gpu_carry/m1, m2, ... of at most 58 MiB each (one device call each).
# Usage: scripts/gpu_pack.sh [MODEL.gguf ...]   (default: the two test models in models/)
# It prints the device calls to make, in order.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
build=build/cuda
carry=.gpu_carry
part_bytes=$((56 * 1024 * 1024))  # a set plus the working tree (~5 MiB) stays under 64 MiB
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.gpu_carry/' "$exclude" 2>/dev/null || echo '/.gpu_carry/' >>"$exclude"

for t in bin/kvtier tests/cuda/test_cuda tests/cuda/test_cuda_model; do
  [[ -x $build/$t ]] || { echo "missing $build/$t: run cmake --preset cuda && cmake --build --preset cuda" >&2; exit 1; }
done
rm -rf "$carry"
mkdir -p "$carry/bin"
cp "$build/bin/kvtier" "$build/tests/cuda/test_cuda" "$build/tests/cuda/test_cuda_model" "$carry/bin/"
[[ -x $build/bench/bench_gather_cuda ]] && cp "$build/bench/bench_gather_cuda" "$carry/bin/"
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
# Compressed (openblas alone is 36 MB): about 14 MB, so it shares a set with a model part.
tar -C "$carry" -cf - bin | xz -T0 -6 >"$carry/bin.tar.xz"
rm -rf "$carry/bin"
echo "bin.tar.xz: $(du -sh "$carry/bin.tar.xz" | cut -f1)"

models=("$@")
if [[ ${#models[@]} -eq 0 ]]; then
  models=(models/SmolLM2-135M-Instruct.Q4_1.gguf models/gemma-3-270m-q4_k_m.gguf)
fi
# Cut the models into parts, then pack the parts and the binaries into as few sets of at most 60 MiB
# as first-fit decreasing finds: one device call per set.
parts=$carry/parts
mkdir -p "$parts"
for m in "${models[@]}"; do
  [[ -f $m ]] || { echo "no model file $m" >&2; exit 1; }
  name=$(basename "$m")
  split -b "$part_bytes" -d -a 2 "$m" "$parts/$name.part"
  n=$(ls "$parts/$name".part* | wc -l)
  for p in "$parts/$name".part*; do mv "$p" "${p}of$n"; done
  sha256sum "$m" | cut -d' ' -f1 >"$parts/$name.sha256"
done
python3 - "$carry" $((58 * 1024 * 1024)) <<'PY'
import os, shutil, sys
carry, cap = sys.argv[1], int(sys.argv[2])
parts = os.path.join(carry, "parts")
items = [(os.path.getsize(os.path.join(parts, f)), os.path.join(parts, f)) for f in os.listdir(parts) if ".part" in f]
items.append((os.path.getsize(os.path.join(carry, "bin.tar.xz")), os.path.join(carry, "bin.tar.xz")))
sets = []  # [used bytes, [paths]]
for size, path in sorted(items, reverse=True):
    for s in sets:
        if s[0] + size <= cap:
            s[0] += size; s[1].append(path); break
    else:
        sets.append([size, [path]])
for i, (_, paths) in enumerate(sets, 1):
    d = os.path.join(carry, f"m{i}")
    os.makedirs(d)
    for p in paths:
        shutil.move(p, os.path.join(d, os.path.basename(p)))
    for f in os.listdir(parts):  # every set carries the checksums (tiny)
        if f.endswith(".sha256"):
            shutil.copy(os.path.join(parts, f), d)
shutil.rmtree(parts)
print(len(sets))
PY
echo
echo "Device calls, back to back (a machine goes back 30 s after a call; the state lives in its /tmp);"
echo "the last set's call also runs the checks (--budget: seconds for all of them, under timeout_s):"
sets=("$carry"/m*)
last=${sets[-1]}
for d in "${sets[@]}"; do
  if [[ $d == "$last" ]]; then
    echo "  run timeout_s=560 carry=[\"$d\"] command='bash scripts/gpu_check.sh --receive $d --run --budget 520'"
  else
    echo "  run carry=[\"$d\"] command='bash scripts/gpu_check.sh --receive $d'"
  fi
done
