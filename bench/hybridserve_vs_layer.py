"""HybridServe vs layer offload with the same weight budget (docs/hybridserve.md, docs/benchmarks.md):
decode tokens/s of a synthetic OPT model (byte-level vocabulary: one token per prompt byte) at a long
context with the home link paced by --link-gbps, the weights either all resident or streamed through
the two staging slots only (FlexGen-style), for `layer` and `hybridserve` at forced ACT:KV ratios.
Rounds are interleaved; medians and the ratio to `layer` of the same round are printed.

    .venv/bin/python bench/hybridserve_vs_layer.py KVTIER_BIN [preset] [link_gbps] [prompt_tokens] [rounds]
"""
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

kvtier = sys.argv[1]
preset = sys.argv[2] if len(sys.argv) > 2 else "opt-125m"
link = sys.argv[3] if len(sys.argv) > 3 else "0.05"
n_prompt = int(sys.argv[4]) if len(sys.argv) > 4 else 1500
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 2
tmp = pathlib.Path(tempfile.mkdtemp())
model = tmp / f"{preset}.gguf"
subprocess.run([kvtier, "synth", "--preset", preset, "--type", "q8_0", "-o", str(model)], check=True,
               capture_output=True)
prompt = ("The river bends twice before the old mill, and the miller counts the sacks each morning. " * 40)[:n_prompt]
base = [kvtier, "run", "-m", str(model), "-p", prompt, "-n", "6", "--ignore-eos", "--json", "-t", "2",
        "--ctx", "2048", "--chunk", "512", "--link-gbps", link]


def run(extra, check=True):
    p = subprocess.run(base + extra, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SystemExit(p.stderr)
    return p


slots = int(re.search(r"(\d+) bytes are needed",
                      run(["--kv-policy", "layer", "--weights-mem", "1"], check=False).stderr).group(1))
weights = {"resident": [], f"streamed ({slots / 2**20:.1f} MiB: slots only)": ["--weights-mem", str(slots)]}
policies = {
    "layer": ["--kv-policy", "layer"],
    "hybridserve R=1": ["--kv-policy", "hybridserve", "--act-ratio", "1"],
    "hybridserve R=inf": ["--kv-policy", "hybridserve", "--act-ratio", "inf"],
    "hybridserve auto": ["--kv-policy", "hybridserve", "--act-ratio", "auto"],
}
res = {}
for r in range(rounds):
    for wname, wextra in weights.items():
        base_tps = None
        for pname, pextra in policies.items():
            j = json.loads(run(pextra + wextra).stdout)
            t = j["decode_tokens_per_s"]
            base_tps = base_tps or t
            e = res.setdefault((wname, pname), {"tps": [], "ratio": [], "tokens": None})
            e["tps"].append(t)
            e["ratio"].append(t / base_tps)
            e["kv_loaded"] = j["kv"]["bytes_loaded"]
            e["w_loaded"] = j["weights"]["bytes_loaded"]
            e["tokens"] = j["tokens"]
            e["ratio_used"] = j["kv"].get("act_ratio", "-")
print(f"{preset} q8_0, {len(prompt)}-token prompt, 6 decoded tokens, --link-gbps {link}, 2 threads, "
      f"{rounds} interleaved rounds")
print(f"{'weights':<34} {'policy':<18} {'R used':>6} {'tok/s':>7} {'vs layer':>8} {'KV+ACT MiB loaded':>17} {'weight MiB loaded':>17}")
for (wname, pname), e in res.items():
    r = e["ratio_used"]
    r = f"{r:.2f}" if isinstance(r, float) else str(r)
    print(f"{wname:<34} {pname:<18} {r:>6} {statistics.median(e['tps']):>7.2f} {statistics.median(e['ratio']):>8.2f} "
          f"{e['kv_loaded'] / 2**20:>17.1f} {e['w_loaded'] / 2**20:>17.1f}")
same = len({tuple(e["tokens"]) for e in res.values()}) == 1
print("tokens identical across all rows:", same)
model.unlink()
tmp.rmdir()
