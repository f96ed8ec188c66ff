#!/usr/bin/env bash
# Every GPU check of the CUDA backend in one script, for a bare GPU machine (the device tool's run):
#   bash scripts/gpu_check.sh --receive DIR   keep a piece carried by scripts/gpu_pack.sh (binaries or
#                                             model parts) in /tmp/kvtier_gpu; complete models are
#                                             reassembled and their sha256 checked
#   bash scripts/gpu_check.sh --run           run the checks (the default without --receive)
#   bash scripts/gpu_check.sh --build --run   build the cuda preset here first instead of using carried
#                                             binaries (needs fmt, CLI11, nlohmann_json, GTest there)
#   ... --budget S                            finish within S seconds: each check's timeout is cut to
#                                             what is left, and checks with no time left are listed as
#                                             NOT RUN (the device call's timeout_s must exceed S)
#   ... --steps LIST                          which steps to run, in this order (default
#                                             tests,cli,bench,sanitizers; also: measure)
# Steps: tests (the gpu-labelled tests), cli (run and bench on the real models present), bench (the
# synthetic 8B, 24 GiB arena, prompts 1K and 4K), sanitizers (compute-sanitizer on a tiny model),
# measure (the 8B at a 16K prompt, where offloaded decode is copy-bound, and the largest context
# each placement can be built with in a 24 GiB arena), infinigen (SmolLM2 with its skew file: layer,
# the degenerate infinigen that must give layer's tokens, the default, and the CPU's infinigen; then a
# synthetic Llama-2-7B at 1K-16K: resident, layer, infinigen decode speed, and the full-gather cost),
# gather (bench_gather_cuda: the selective load's transfer paths, GiB/s).
# Checks, logs under $OUT (at most 8 files come back):
#   env.txt            nvidia-smi, tool versions, where libcublas was found
#   test_cuda.log      backend tests: ops, GEMM, attention, memory, synth (label gpu)
#   test_cuda_model.log forward pass vs CPU (SmolLM2, Gemma-3, synthetic), layer/headinfer exactness
#   sanitizer.log      compute-sanitizer racecheck + memcheck on a small headinfer run
#   cli.log            kvtier run --backend cuda vs --backend cpu (greedy) on SmolLM2 if present
#   bench.log          the synthetic Llama-3-8B bench (24 GiB arena): prefill, decode vs the H2D bound
#   summary.txt        one line per check; the script exits non-zero if any failed
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
state=/tmp/kvtier_gpu
OUT=${OUT:-$root/gpu_check_out}
mkdir -p "$state/bin" "$state/parts" "$state/models" "$OUT"

receive() {
  local dir=$1
  if [[ -f $dir/bin.tar.xz ]]; then
    tar -C "$state" -xJf "$dir/bin.tar.xz"
    echo "received binaries: $(ls "$state/bin" | tr '\n' ' ')"
  elif [[ -d $dir/bin ]]; then
    cp -a "$dir/bin/." "$state/bin/"
    echo "received binaries: $(ls "$state/bin" | tr '\n' ' ')"
  fi
  find "$dir" -maxdepth 1 -type f \( -name '*.part*' -o -name '*.sha256' \) -exec cp {} "$state/parts/" \;
  # InfiniGen skew files (small, whole): next to the models, under the models' names.
  find "$dir" -maxdepth 1 -type f -name '*.skew.gguf' -exec cp {} "$state/models/" \;
  # Reassemble every model whose parts are all here.
  for sumf in "$state/parts"/*.sha256; do
    [[ -e $sumf ]] || continue
    local name total have
    name=$(basename "$sumf" .sha256)
    [[ -f $state/models/$name ]] && continue
    total=$(ls "$state/parts/$name".part* 2>/dev/null | head -1 | sed 's/.*of//')
    have=$(ls "$state/parts/$name".part* 2>/dev/null | wc -l)
    if [[ -n $total && $have -eq $total ]]; then
      cat $(ls "$state/parts/$name".part* | sort) >"$state/models/$name.tmp"
      if [[ $(sha256sum "$state/models/$name.tmp" | cut -d' ' -f1) == $(cat "$sumf") ]]; then
        mv "$state/models/$name.tmp" "$state/models/$name"
        rm -f "$state/parts/$name".part*
        echo "model complete: $name"
      else
        rm -f "$state/models/$name.tmp"
        echo "model $name: sha256 mismatch after reassembly" >&2
      fi
    else
      echo "model $name: $have of ${total:-?} parts here"
    fi
  done
}

do_build=0
do_run=0
budget=0
steps=tests,cli,bench,sanitizers
received=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --receive) receive "$2"; received=1; shift 2 ;;
    --run) do_run=1; shift ;;
    --build) do_build=1; shift ;;
    --budget) budget=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ $received -eq 1 && $do_run -eq 0 && $do_build -eq 0 ]]; then exit 0; fi

summary=$OUT/summary.txt
: >"$summary"
status=0
note() { echo "$*" | tee -a "$summary"; }
deadline=$((SECONDS + budget))
left() {  # seconds a check may take: LIMIT, cut to the budget left (0: none left)
  local limit=$1
  if [[ $budget -le 0 ]]; then echo "$limit"; return; fi
  local rest=$((deadline - SECONDS - 5))
  if [[ $rest -lt 10 ]]; then echo 0; elif [[ $rest -lt $limit ]]; then echo "$rest"; else echo "$limit"; fi
}
check() {  # check NAME LOG LIMIT COMMAND...: runs the command under timeout, logs it, records PASS/FAIL
  local name=$1 log=$2 t
  t=$(left "$3")
  shift 3
  if [[ $t -eq 0 ]]; then note "NOT RUN $name (budget of ${budget} s spent)"; status=1; return; fi
  echo "=== $name (timeout ${t} s): $*" >>"$log"
  local t0=$SECONDS
  if timeout "$t" "$@" >>"$log" 2>&1; then note "PASS $name ($((SECONDS - t0)) s)"; else
    local rc=$?
    note "FAIL $name (exit $rc$([[ $rc -eq 124 ]] && echo ": timed out after ${t} s"); see $(basename "$log"))"
    status=1
  fi
}

# --- environment
{
  date -u
  nvidia-smi || echo "nvidia-smi failed"
  nvcc --version 2>&1 | tail -1
  command -v compute-sanitizer || echo "no compute-sanitizer on PATH"
} >"$OUT/env.txt" 2>&1
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /opt/nvidia/compute-sanitizer; do
  [[ -d $d ]] && PATH=$PATH:$d
done
# cuBLAS (500+ MB) cannot be carried: use the machine's (CUDA toolkit or PyTorch's nvidia wheels).
libdirs=$(find /usr /opt /lib /lib64 /root /home \( -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' \) 2>/dev/null |
  xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$state/bin:${libdirs}${LD_LIBRARY_PATH:-}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$OUT/env.txt"

# --- binaries: carried, or built here
bin=$state/bin
if [[ $do_build -eq 1 ]]; then
  check build "$OUT/build.log" 600 bash -c "cmake --preset cuda -DKVTIER_MODEL_DIR=$state/models && cmake --build --preset cuda -j16 --target kvtier test_cuda test_cuda_model"
  mkdir -p "$state/built"
  cp build/cuda/bin/kvtier build/cuda/tests/cuda/test_cuda build/cuda/tests/cuda/test_cuda_model "$state/built/" 2>/dev/null
  echo "$state/models" >"$state/built/model_dir.txt"
  bin=$state/built
fi
if [[ ! -x $bin/test_cuda_model ]]; then
  note "FAIL no binaries: send .gpu_carry/bin with --receive first, or use --build"
  exit 1
fi
echo "binaries from $bin: $(ldd "$bin/test_cuda_model" | grep -c 'not found') libraries not found" >>"$OUT/env.txt"
ldd "$bin/test_cuda_model" | grep 'not found' >>"$OUT/env.txt"

# --- the test models where the tests were compiled to look for them
model_dir=$(cat "$bin/model_dir.txt" 2>/dev/null || echo "$state/models")
mkdir -p "$model_dir"
for m in "$state/models"/*.gguf; do
  # Never replaces a file that is there (a checkout's own models/).
  [[ -e $m && ! -e $model_dir/$(basename "$m") ]] && ln -s "$m" "$model_dir/$(basename "$m")"
done
note "models in $model_dir: $(ls "$model_dir" 2>/dev/null | tr '\n' ' ')"

want() { [[ ,$steps, == *,$1,* ]]; }

# --- the tests labelled gpu (what `ctest --preset cuda -L gpu` runs: these two binaries)
if want tests; then
  check test_cuda "$OUT/test_cuda.log" 200 "$bin/test_cuda"
  check test_cuda_model "$OUT/test_cuda_model.log" 300 "$bin/test_cuda_model"
  skips=$(cat "$OUT/test_cuda.log" "$OUT/test_cuda_model.log" | grep -c '\*\*\* SKIPPED')
  note "skipped tests: $skips (on a GPU only tests whose model file is missing may skip)"
  grep -h '\*\*\* SKIPPED' "$OUT/test_cuda.log" "$OUT/test_cuda_model.log" | sort -u | tee -a "$summary"
  grep -h 'greedy tokens\|bit-identical\|NMSE\|GiB/s' "$OUT/test_cuda.log" "$OUT/test_cuda_model.log" >>"$summary"
  if nvidia-smi -L >/dev/null 2>&1 && grep -q 'no CUDA device' "$OUT/test_cuda.log" "$OUT/test_cuda_model.log"; then
    note "FAIL the tests found no CUDA device although nvidia-smi sees one (libraries? see env.txt)"
    status=1
  fi
fi

# --- the CLI end to end on each real model present: CUDA placements vs the CPU backend, greedy with
# --ignore-eos so that every run makes 48 tokens. The CUDA placements must agree among themselves
# (they are bit-identical); CPU vs CUDA may part at a near-tie (bf16 weights vs quantised).
if want cli; then
  for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
    f=$model_dir/$m
    [[ -e $f ]] || continue
    : >"$state/cli_tokens.txt"
    for args in "--backend cpu" "--backend cuda --kv-policy resident" "--backend cuda --kv-policy headinfer --group 1" "--backend cuda --kv-policy layer --debug-copy-delay-us 200" "--backend cuda --kv-policy headinfer --group 1 --static-heads 40"; do
      # shellcheck disable=SC2086
      check "cli run $m $args" "$OUT/cli.log" 60 "$bin/kvtier" run -m "$f" $args --temp 0 -n 48 --ignore-eos --json -p "Once upon a time, in a small village by the sea,"
      tail -1 "$OUT/cli.log" | grep -o '"tokens":\[[0-9,]*\]' | sed "s/^/$args /" >>"$state/cli_tokens.txt"
    done
    n_cuda=$(grep -- '--backend cuda' "$state/cli_tokens.txt" | awk '{print $NF}' | sort -u | wc -l)
    cpu=$(grep -- '--backend cpu' "$state/cli_tokens.txt" | awk '{print $NF}')
    cuda=$(grep -- '--backend cuda' "$state/cli_tokens.txt" | head -1 | awk '{print $NF}')
    same=$(python3 -c "import sys,json; a=json.loads(sys.argv[1].split(':',1)[1]); b=json.loads(sys.argv[2].split(':',1)[1]); n=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), min(len(a),len(b))); print(f'{n} of {len(a)}')" "$cpu" "$cuda" 2>/dev/null || echo "?")
    if [[ $n_cuda -eq 1 ]]; then note "PASS cli $m: the 4 CUDA placements give one token sequence; CPU and CUDA agree on the first $same tokens"; else
      note "FAIL cli $m: the CUDA placements give $n_cuda different token sequences"; status=1; fi
    check "cli bench $m" "$OUT/cli.log" 90 "$bin/kvtier" bench -m "$f" --backend cuda --kv-policy resident,layer,headinfer --prompt-tokens 1024 --gen 32 --repeat 3
  done
fi

# --- 8B scale, no file: a synthetic Llama-3-8B made on the device in a 24 GiB arena (smoke + first
# figures: prefill of each placement, decode against the pinned H2D bound the bench probes)
if want bench; then
  check "synthetic llama3-8b bench" "$OUT/bench.log" 150 "$bin/kvtier" bench -m synthetic:llama3-8b --backend cuda \
    --device-mem 24GiB --ctx 8192 --kv-policy resident,layer,headinfer --prompt-tokens 1024,4096 --gen 16 --repeat 1
fi
if want measure; then
  check "synthetic llama3-8b bench 16K" "$OUT/bench.log" 200 "$bin/kvtier" bench -m synthetic:llama3-8b --backend cuda \
    --device-mem 24GiB --ctx 16640 --kv-policy resident,layer,headinfer --prompt-tokens 16384 --gen 16 --repeat 1
  # The largest context each placement is built with in 24 GiB (KV in the arena for resident, in
  # pinned host memory for layer/headinfer): construct a session and run one token.
  for pc in resident:49152 resident:57344 resident:65536 layer:262144 layer:524288 headinfer:524288; do
    check "context ${pc#*:} with ${pc%%:*} in 24 GiB" "$OUT/bench.log" 60 "$bin/kvtier" bench -m synthetic:llama3-8b \
      --backend cuda --device-mem 24GiB --ctx "${pc#*:}" --kv-policy "${pc%%:*}" --prompt-tokens 1 --gen 1 --repeat 1
  done
fi

# --- the selective load's transfer: gather kernels and copy-engine batches against a contiguous copy
if want gather; then
  if [[ -x $bin/bench_gather_cuda ]]; then
    check "bench_gather_cuda" "$OUT/gather.log" 120 "$bin/bench_gather_cuda"
    grep -E 'GiB/s|failed' "$OUT/gather.log" >>"$summary"
  else
    note "FAIL no bench_gather_cuda among the binaries"
    status=1
  fi
fi

# --- InfiniGen on the GPU (docs/infinigen.md "On the GPU")
if want infinigen; then
  f=$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf
  skew=$state/models/SmolLM2-135M-Instruct.Q4_1.skew.gguf
  if [[ -e $f && -e $skew ]]; then
    head -c 6000 docs/infinigen.md >"$state/ig_prompt.txt"
    : >"$state/ig_tokens.txt"
    for args in "--backend cuda --kv-policy layer" "--backend cuda --kv-policy infinigen --infinigen-alpha inf --infinigen-budget 1" "--backend cuda --kv-policy infinigen" "--backend cuda --kv-policy infinigen --debug-copy-delay-us 200" "--backend cpu --kv-policy infinigen"; do
      # shellcheck disable=SC2086
      check "infinigen cli $args" "$OUT/infinigen.log" 90 "$bin/kvtier" run -m "$f" --skew "$skew" $args --temp 0 -n 64 --ignore-eos --json -f "$state/ig_prompt.txt"
      tail -1 "$OUT/infinigen.log" | grep -o '"tokens":\[[0-9,]*\]' | sed "s/^/$args|/" >>"$state/ig_tokens.txt"
      tail -1 "$OUT/infinigen.log" | python3 -c "import sys,json; j=json.loads(sys.stdin.read()); print('$args:', j.get('n_prompt'), 'prompt tokens;', 'decode', round(j.get('decode_tokens_per_s',0),1), 'tok/s;', json.dumps((j.get('cuda') or {}).get('infinigen') or (j.get('kv') or {}).get('infinigen')))" >>"$summary" 2>/dev/null
    done
    python3 - "$state/ig_tokens.txt" <<'PY' | tee -a "$summary"
import json, sys
rows = {}
for line in open(sys.argv[1]):
    args, toks = line.rstrip("\n").split("|", 1)
    rows[args] = json.loads(toks.split(":", 1)[1])
ref = rows.get("--backend cuda --kv-policy layer")
def agree(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
for args, t in rows.items():
    if ref is not None:
        print(f"infinigen tokens: {args}: the first {agree(t, ref)} of {len(t)} equal to cuda layer's")
cpu = rows.get("--backend cpu --kv-policy infinigen")
gpu = rows.get("--backend cuda --kv-policy infinigen")
if cpu is not None and gpu is not None:
    print(f"infinigen tokens: cuda infinigen and cpu infinigen: the first {agree(gpu, cpu)} of {len(gpu)} equal")
deg = rows.get("--backend cuda --kv-policy infinigen --infinigen-alpha inf --infinigen-budget 1")
print(("PASS" if deg is not None and deg == ref else "FAIL") + " infinigen degenerate (alpha inf, budget 1) gives cuda layer's tokens")
PY
  else
    note "infinigen cli: SmolLM2 or its skew file missing, not run"
  fi
  # The speculation kernels (column scores, scores, selection) and the gather under the sanitizers: a tiny
  # model of 4 layers (2 speculate) with a skew made from a sample of this checkout's text, a 600-token
  # prompt (its own columns).
  if command -v compute-sanitizer >/dev/null; then
    tiny4=$state/tiny-llama4.gguf
    "$bin/kvtier" synth --preset tiny-llama --layers 4 --type f16 --ctx 4096 -o "$tiny4" >/dev/null 2>&1
    "$bin/kvtier" skew -m "$tiny4" -o "$state/tiny-llama4.skew.gguf" --text docs/infinigen.md --tokens 256 >/dev/null 2>&1
    head -c 600 docs/cuda.md >"$state/tiny_prompt.txt"
    small=("$bin/kvtier" run -m "$tiny4" --backend cuda --device-mem 1GiB --ctx 1024 --chunk 64 -n 24 --temp 0 -f "$state/tiny_prompt.txt" --skew "$state/tiny-llama4.skew.gguf" --kv-policy infinigen)
    check memcheck_infinigen "$OUT/sanitizer.log" 90 compute-sanitizer --tool memcheck --error-exitcode 3 "${small[@]}"
    check racecheck_infinigen "$OUT/sanitizer.log" 90 compute-sanitizer --tool racecheck --error-exitcode 3 "${small[@]}"
  fi
  check "synthetic llama2-7b infinigen bench" "$OUT/bench.log" 300 "$bin/kvtier" bench -m synthetic:llama2-7b --backend cuda \
    --device-mem 40GiB --ctx 16448 --kv-policy resident,layer,infinigen --prompt-tokens ${IG_PROMPTS:-1024,4096,16384} --gen 32 --repeat 1
  check "synthetic llama2-7b infinigen full gather" "$OUT/bench.log" 60 "$bin/kvtier" bench -m synthetic:llama2-7b --backend cuda \
    --device-mem 40GiB --ctx 4160 --kv-policy layer,infinigen --infinigen-alpha inf --infinigen-budget 1 --prompt-tokens 4096 --gen 32 --repeat 1
  check "synthetic llama2-7b infinigen flat gather" "$OUT/bench.log" 90 "$bin/kvtier" bench -m synthetic:llama2-7b --backend cuda \
    --device-mem 40GiB --ctx 16448 --kv-policy infinigen --kv-gather flat --prompt-tokens 16384 --gen 32 --repeat 1
  grep -h '^cuda ' "$OUT/bench.log" >>"$summary"
fi

# --- compute-sanitizer on a small offloaded run (kernels' shared memory races, out-of-bounds accesses)
if want sanitizers; then
  tiny=$state/tiny-llama.gguf
  "$bin/kvtier" synth --preset tiny-llama --type f16 --ctx 4096 -o "$tiny" >/dev/null 2>&1
  prompt="The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. The five boxing wizards jump quickly."
  run_small=("$bin/kvtier" run -m "$tiny" --backend cuda --device-mem 1GiB --ctx 512 --chunk 64 -n 24 --temp 0 -p "$prompt")
  if command -v compute-sanitizer >/dev/null; then
    check racecheck_headinfer "$OUT/sanitizer.log" 90 compute-sanitizer --tool racecheck --error-exitcode 3 "${run_small[@]}" --kv-policy headinfer --group 1
    check racecheck_resident "$OUT/sanitizer.log" 90 compute-sanitizer --tool racecheck --error-exitcode 3 "${run_small[@]}" --kv-policy resident
    check memcheck_headinfer "$OUT/sanitizer.log" 90 compute-sanitizer --tool memcheck --error-exitcode 3 "${run_small[@]}" --kv-policy headinfer --group 1
    check synccheck_layer "$OUT/sanitizer.log" 90 compute-sanitizer --tool synccheck --error-exitcode 3 "${run_small[@]}" --kv-policy layer
  else
    note "FAIL compute-sanitizer not found"
    status=1
  fi
fi
note "overall: $([[ $status -eq 0 ]] && echo PASS || echo FAIL)"
exit $status
