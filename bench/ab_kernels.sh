#!/usr/bin/env bash
# Interleaved A/B of bench_cpu_kernels binaries: ROUNDS rounds, each running every binary once on the
# benchmarks FILTER selects (--benchmark_repetitions=1), in turn, so that the machine's drift falls on
# all of them alike. Prints per benchmark and binary the median GFLOP/s and % of the int8 peak, and for
# each binary after the first the median over rounds of its GFLOP/s divided by the first binary's.
# Usage: bench/ab_kernels.sh FILTER ROUNDS BASE_BIN NEW_BIN [MORE_BINS...]
#   e.g. bench/ab_kernels.sh 'matmul_lanes/q8_0/512x640->2048/avx512/threads:1' 7 /tmp/base/bench_cpu_kernels build/cpu/bench/bench_cpu_kernels
# (a base binary: `git worktree add /tmp/base REV && cmake -S /tmp/base -B /tmp/base/b -G Ninja
# -DCMAKE_BUILD_TYPE=Release && ninja -C /tmp/base/b bench/bench_cpu_kernels`)
set -euo pipefail
usage="usage: $0 FILTER ROUNDS BASE_BIN NEW_BIN [MORE_BINS...]"
filter=${1:?$usage}
rounds=${2:?$usage}
shift 2
(($# >= 2)) || { echo "$usage" >&2; exit 2; }
for b in "$@"; do [[ -x $b ]] || { echo "$0: $b is not an executable" >&2; exit 2; }; done
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for r in $(seq "$rounds"); do
  i=0
  for b in "$@"; do
    "$b" --benchmark_filter="$filter" --benchmark_repetitions=1 2>/dev/null | grep -E '^mat' |
      awk -v bin="$i" -v r="$r" '{ g = ""; p = "nan"
        for (f = 1; f <= NF; f++) {
          if ($f ~ /^GFLOPs=/) { split($f, a, "="); sub("/s", "", a[2]); g = a[2] }
          if ($f ~ /^pct_int8_peak=/) { split($f, a, "="); sub("/s", "", a[2]); p = a[2] }
        }
        if (g != "") print r, bin, $1, g, p }' >>"$raw"
    i=$((i + 1))
  done
  echo "round $r of $rounds done" >&2
done
python3 - "$raw" "$@" <<'PY'
import collections, statistics, sys
raw, bins = sys.argv[1], sys.argv[2:]
gf = collections.defaultdict(dict)
pct = collections.defaultdict(list)
for line in open(raw):
    r, b, name, g, p = line.split()
    gf[(name, r)][int(b)] = float(g)
    pct[(name, int(b))].append(float(p))
if not gf:
    sys.exit("no benchmark matched the filter")
for name in sorted({n for n, _ in gf}):
    rounds = [v for (n, _), v in gf.items() if n == name]
    print(name.replace("/real_time", ""))
    for i, b in enumerate(bins):
        vals = [v[i] for v in rounds if i in v]
        line = f"  [{i}] {b}: {statistics.median(vals):.1f} GFLOP/s, {statistics.median(pct[(name, i)]):.1f} % of int8 peak"
        if i > 0:
            ratios = [v[i] / v[0] for v in rounds if i in v and 0 in v]
            line += f", {statistics.median(ratios):.3f}x [0] (rounds {min(ratios):.2f}-{max(ratios):.2f})"
        print(line)
PY
