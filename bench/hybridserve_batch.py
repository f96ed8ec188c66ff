"""HybridServe's mini-batched executor against FlexGen-style `layer` offload with the same weight budget
(docs/hybridserve.md "Mini-batches", docs/benchmarks.md): decode tokens/s of B sequences per pass, every
decoder layer streamed through the two staging slots (the same --weights-mem for both policies), the KV
home link paced by --link-gbps (weights paced at the same rate on their own pacer), or a disk home.

One `kvtier bench --kv-policy layer,hybridserve` per ACT:KV ratio: the two policies run interleaved in
one process, `rounds` rounds each; the ratio is hybridserve's decode tokens/s over layer's in the same
round, median over rounds. Also checks that both policies generated the same tokens for every sequence.

    .venv/bin/python bench/hybridserve_batch.py KVTIER_BIN PRESET LAYERS LINK_GBPS PROMPT BATCH GEN ROUNDS \\
        [RATIOS=1,inf,auto] [--disk DIR]

LINK_GBPS 0: unpaced. Prefill passes carry $CHUNK tokens (default 2048: fewer weight passes in prefill). --disk DIR: the KV home on disk in DIR and the weights read from the GGUF file.
"""
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

args = sys.argv[1:]
disk = None
if "--disk" in args:
    i = args.index("--disk")
    disk = args[i + 1]
    del args[i:i + 2]
kvtier, preset, layers, link, n_prompt, batch, gen, rounds = args[:8]
ratios = (args[8] if len(args) > 8 else "1,inf,auto").split(",")
tmp = pathlib.Path(tempfile.mkdtemp())
model = tmp / f"{preset}-{layers}.gguf"
ctx = int(n_prompt) + int(gen) + 16
subprocess.run([kvtier, "synth", "--preset", preset, "--type", "q8_0", "--layers", layers, "--ctx", str(ctx),
                "-o", str(model)], check=True, capture_output=True)
source = ["--weights-from", "file"] if disk else []
base = [kvtier, "bench", "-m", str(model), "--prompt-tokens", n_prompt, "--gen", gen, "--batch", batch,
        "--repeat", rounds, "--warmup", "0", "-t", "2", "--chunk", os.environ.get("CHUNK", "2048"), "--ctx", str(ctx), "--json", *source]
if float(link) > 0:
    base += ["--link-gbps", link]
if disk:
    base += ["--kv-disk", disk]
p = subprocess.run(base + ["--kv-policy", "layer", "--weights-mem", "1"], capture_output=True, text=True)
slots = int(re.search(r"(\d+) bytes are needed", p.stderr).group(1))
base += ["--weights-mem", str(slots)]
env = dict(os.environ, KVTIER_PROFILE_CACHE=str(tmp / "profile.json"))

print(f"{preset} ({layers} layers, q8_0), batch {batch}, {n_prompt}-token prompts, {gen} decoded tokens each, "
      f"--link-gbps {link}, {'disk home + weights from the file' if disk else 'host home + weights from host'}, "
      f"--weights-mem {slots} ({slots / 2**20:.1f} MiB: fixed weights + two slots), 2 threads, {rounds} rounds")
hdr = (f"{'policy':<22} {'R':>5} {'tok/s':>7} {'vs layer':>8} {'KV+ACT MiB/round':>16} {'weight MiB/round':>16} "
       f"{'stall s':>7} {'mini-batches':>12}")
print(hdr)
same = True
for ratio in ratios:
    p = subprocess.run(base + ["--kv-policy", "layer,hybridserve", "--act-ratio", ratio], capture_output=True,
                       text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    j = json.loads(p.stdout)
    lay, hyb = j["results"]
    per_round = [h / l for h, l in zip(hyb["decode_runs"], lay["decode_runs"])]
    same &= [s["tokens"] for s in lay["sequences"]] == [s["tokens"] for s in hyb["sequences"]]
    for name, r, ratio_s in (("layer", lay, 1.0), (f"hybridserve R={ratio}", hyb, statistics.median(per_round))):
        used = r["kv"].get("act_ratio", "-")
        used = f"{used:.2f}" if isinstance(used, float) else str(used)
        mb = r["kv"].get("mini_batches")
        mbs = f"{mb['last']} of {mb['last_seqs']}" if mb else "-"
        print(f"{name:<22} {used:>5} {r['decode_tokens_per_s']:>7.2f} {ratio_s:>8.2f} "
              f"{r['bytes_loaded_per_run'] / 2**20:>16.1f} {r['weight_bytes_loaded_per_run'] / 2**20:>16.1f} "
              f"{r['stall_s']:>7.2f} {mbs:>12}")
    print(f"  per-round ratios: {', '.join(f'{x:.2f}' for x in per_round)}; isa {j['isa']}")
print("tokens identical (layer vs hybridserve, every sequence, every ratio):", same)
model.unlink()
for f in tmp.iterdir():
    f.unlink()
tmp.rmdir()
