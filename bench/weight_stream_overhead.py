"""Weight streaming overhead (HybridServe's weight placement, docs/hybridserve.md): decode tokens/s of
a model with every weight resident, about half the layers resident, and only the two staging slots
(every layer streamed), from host memory and from the GGUF file. Rounds are interleaved; the median of
each configuration is reported with its ratio to the resident run of the same round.

    .venv/bin/python bench/weight_stream_overhead.py KVTIER_BIN MODEL.gguf [rounds]
"""
import json
import re
import statistics
import subprocess
import sys

kvtier, model = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
base = [kvtier, "run", "-m", model, "-p", "The river bends twice before the old mill, and the miller", "-n", "48",
        "--ignore-eos", "--json", "-t", "2", "--ctx", "1024"]


def run(extra, check=True):
    p = subprocess.run(base + extra, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SystemExit(p.stderr)
    return p


j = json.loads(run([]).stdout)
everything = j["weights"]["resident_bytes"]
two = int(re.search(r"(\d+) bytes are needed", run(["--weights-mem", "1"], check=False).stderr).group(1))
two_file = int(re.search(r"(\d+) bytes are needed",
                         run(["--weights-mem", "1", "--weights-from", "file"], check=False).stderr).group(1))
half = (everything + two) // 2
configs = {
    "resident": [],
    "half, host": ["--weights-mem", str(half)],
    "half, file": ["--weights-mem", str(half), "--weights-from", "file"],
    "slots only, host": ["--weights-mem", str(two)],
    "slots only, file": ["--weights-mem", str(two_file), "--weights-from", "file"],
}
tps = {k: [] for k in configs}
ratio = {k: [] for k in configs}
info = {}
for r in range(rounds):
    base_tps = None
    for name, extra in configs.items():
        j = json.loads(run(extra).stdout)
        t = j["decode_tokens_per_s"]
        tps[name].append(t)
        if base_tps is None:
            base_tps = t
        ratio[name].append(t / base_tps)
        info[name] = j["weights"]
print(f"model {model}, {rounds} interleaved rounds, 48 decoded tokens, 2 threads")
print(f"{'weights':<18} {'resident MiB':>12} {'staging MiB':>11} {'streamed layers':>15} {'tok/s':>8} {'vs resident':>11} {'stall s':>8}")
for name in configs:
    w = info[name]
    print(f"{name:<18} {w['resident_bytes'] / 2**20:>12.1f} {w['staging_bytes'] / 2**20:>11.1f} "
          f"{w['streamed_layers']:>15} {statistics.median(tps[name]):>8.1f} {statistics.median(ratio[name]):>11.2f} "
          f"{w['stall_s']:>8.3f}")
