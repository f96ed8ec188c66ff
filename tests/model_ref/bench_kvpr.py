#!/usr/bin/env python3
"""KVPR decode benchmark (issue 14): `kvpr` (--recompute auto) against `layer`, the same model, budget and
link, as ratios taken within one `kvtier bench` run (interleaved rounds, medians), over a sweep of link
rates paced with --link-gbps (a measurement aid) and an unpaced disk home; then the scheduler's split
against a sweep of forced splits (spec P6: within 5 % of the best step time), interleaved rounds of
`kvtier run`. Models: synthetic MHA shapes (llama2-7b, opt-6.7b; a few layers, quantised weights) and
the GQA default model. Prints a Markdown table; every figure is a median of --rounds rounds.

  python3 tests/model_ref/bench_kvpr.py --kvtier build/cpu/bin/kvtier --out /tmp/kvpr_bench
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile


def sh(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))} failed:\n{p.stderr}")
    return p.stdout


def bench(kvtier, model, prompt, gen, rounds, extra, cache):
    out = json.loads(sh(kvtier, "bench", "-m", model, "--kv-policy", "layer,kvpr", "--prompt-tokens", prompt,
                        "--gen", gen, "--repeat", rounds, "-t", 2, "--json", "--profile-cache", cache, *extra))
    return {r["policy"]: r for r in out["results"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvtier", default="build/cpu/bin/kvtier")
    ap.add_argument("--smollm2", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default=None, help="directory for the synthetic models and the disk home")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=6)
    a = ap.parse_args()
    out = pathlib.Path(a.out or tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "profile.json"
    disk = out / "disk"
    disk.mkdir(exist_ok=True)
    models = []
    for preset, typ in (("llama2-7b", "q4_0"), ("opt-6.7b", "q8_0")):
        path = out / f"{preset}-1l-{typ}.gguf"
        if not path.exists():
            sh(a.kvtier, "synth", "--preset", preset, "--layers", 1, "--type", typ, "--ctx", 4096, "-o", path)
        models.append((f"{preset} (1 layer, {typ})", path))
    models.append(("SmolLM2-135M (GQA 9/3, Q4_1)", pathlib.Path(a.smollm2)))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    isa = "avx512" if "avx512f" in flags else "avx2"
    print(f"cpu: {cpu} ({isa} path); 2 threads; prompt {a.prompt}, {a.gen} generated; medians of {a.rounds} rounds")
    print()
    print("| model | home, link | layer decode tok/s | kvpr decode tok/s | kvpr / layer (same run) |")
    print("|---|---|---|---|---|")
    for name, path in models:
        for label, extra in (("host, 5 MB/s", ["--link-gbps", "0.005"]), ("host, 20 MB/s", ["--link-gbps", "0.02"]),
                             ("host, 100 MB/s", ["--link-gbps", "0.1"]), ("host, 1 GB/s", ["--link-gbps", "1"]),
                             ("host, unpaced", []), ("disk, unpaced", ["--kv-disk", disk])):
            r = bench(a.kvtier, path, a.prompt, a.gen, a.rounds, extra, cache)
            lay, kv = r["layer"], r["layer+kvpr"]
            print(f"| {name} | {label} | {lay['decode_tokens_per_s']:.2f} | {kv['decode_tokens_per_s']:.2f} | "
                  f"{kv['decode_ratio_to_first']:.2f}x |", flush=True)
    # P6: the scheduler's split against forced splits, interleaved rounds of run.
    name, path = models[0]
    ids = ",".join(str(10 + i % 300) for i in range(a.prompt))
    link = ["--link-gbps", "0.02"]
    splits = ["auto"] + [str(a.prompt * k // 8) for k in range(9)]
    rates = {s: [] for s in splits}
    chosen = None
    for _ in range(a.rounds):
        for s in splits:
            j = json.loads(sh(a.kvtier, "run", "-m", path, "--ids", ids, "-n", a.gen, "--ignore-eos", "--json", "-t", 2,
                              "--kv-policy", "kvpr", "--recompute", s, "--profile-cache", cache, *link))
            rates[s].append(j["decode_tokens_per_s"])
            if s == "auto":
                chosen = j["kv"]["split"]
    med = {s: statistics.median(v) for s, v in rates.items()}
    best = max(v for s, v in med.items() if s != "auto")
    print(f"\nP6 on {name}, host link 20 MB/s, {a.prompt}-token prompt: decode tok/s by forced split")
    print("| split | " + " | ".join(splits) + " |")
    print("|---|" + "---|" * len(splits))
    print("| tok/s | " + " | ".join(f"{med[s]:.2f}" for s in splits) + " |")
    print(f"\nscheduler (auto, last split {chosen}): {med['auto']:.2f} tok/s = {med['auto'] / best:.3f} of the best "
          f"forced split ({best:.2f})")


if __name__ == "__main__":
    main()
