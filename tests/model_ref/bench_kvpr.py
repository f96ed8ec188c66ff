#!/usr/bin/env python3
"""KVPR decode benchmark (issue 14): `kvpr` (--recompute auto) against `layer`, the same model, budget and
link, as ratios taken within one `kvtier bench` run (interleaved rounds, medians), over a sweep of link
rates paced with --link-gbps (a measurement aid) and an unpaced disk home; then the scheduler's split
against a sweep of forced splits (spec P6: within 5 % of the best step time), interleaved rounds of
`kvtier run`. Models: synthetic MHA shapes (llama2-7b, opt-6.7b; a few layers, quantised weights) and
the GQA default model. Prints a Markdown table; every figure is a median of --rounds rounds.

  python3 tests/model_ref/bench_kvpr.py --kvtier build/cpu/bin/kvtier --out /tmp/kvpr_bench
  python3 tests/model_ref/bench_kvpr.py --skip-table --p6-links 0.005,0.02,0.1,1,unpaced --p6-gen 8
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
    ap.add_argument("--p6-links", default="0.02",
                    help="comma-separated --link-gbps values for the P6 sweep ('unpaced': no throttle)")
    ap.add_argument("--p6-gen", type=int, default=None, help="generated tokens of the P6 runs (default: --gen)")
    ap.add_argument("--p6-splits", default=None,
                    help="forced splits of the P6 sweep, comma-separated (default: 0, s/8, ..., s)")
    ap.add_argument("--skip-table", action="store_true", help="no table of decode rates")
    ap.add_argument("--skip-p6", action="store_true", help="no P6 sweep")
    ap.add_argument("--overhead-rounds", type=int, default=0,
                    help="also: kvpr against layer where the scheduler picks l = 0 (fast links), this many "
                         "interleaved rounds of --overhead-gen generated tokens, wall and CPU time")
    ap.add_argument("--overhead-gen", type=int, default=16, help="generated tokens of the l = 0 overhead runs")
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
    if not a.skip_table:
        print()
        print("| model | home, link | layer decode tok/s | kvpr decode tok/s | kvpr / layer (same run) |")
        print("|---|---|---|---|---|")
    for name, path in ([] if a.skip_table else models):
        for label, extra in (("host, 5 MB/s", ["--link-gbps", "0.005"]), ("host, 20 MB/s", ["--link-gbps", "0.02"]),
                             ("host, 100 MB/s", ["--link-gbps", "0.1"]), ("host, 1 GB/s", ["--link-gbps", "1"]),
                             ("host, unpaced", []), ("disk, unpaced", ["--kv-disk", disk])):
            r = bench(a.kvtier, path, a.prompt, a.gen, a.rounds, extra, cache)
            lay, kv = r["layer"], r["layer+kvpr"]
            print(f"| {name} | {label} | {lay['decode_tokens_per_s']:.2f} | {kv['decode_tokens_per_s']:.2f} | "
                  f"{kv['decode_ratio_to_first']:.2f}x |", flush=True)
    if a.overhead_rounds:
        print(f"\nkvpr (auto) against layer at fast links: medians of {a.overhead_rounds} interleaved rounds, "
              f"{a.prompt}-token prompt, {a.overhead_gen} generated")
        print("| model | home, link | kvpr - layer, bytes loaded / stored per run | kvpr / layer, wall | "
              "kvpr / layer, CPU time | per-round wall ratios: median [min, max] |")
        print("|---|---|---|---|---|---|")
        for name, path in (models[2], models[0]):
            for label, extra in (("host, unpaced", []), ("host, 1 GB/s", ["--link-gbps", "1"]),
                                 ("disk, unpaced", ["--kv-disk", disk])):
                r = bench(a.kvtier, path, a.prompt, a.overhead_gen, a.overhead_rounds, extra, cache)
                lay, kv = r["layer"], r["layer+kvpr"]
                cpu_ratio = kv["decode_tokens_per_cpu_s"] / lay["decode_tokens_per_cpu_s"]
                dl = kv["bytes_loaded_per_run"] - lay["bytes_loaded_per_run"]
                ds = kv["bytes_stored_per_run"] - lay["bytes_stored_per_run"]
                paired = sorted(k / l for k, l in zip(kv["decode_runs"], lay["decode_runs"]))  # same round
                print(f"| {name} | {label} | {dl} / {ds} | "
                      f"{kv['decode_ratio_to_first']:.3f}x | {cpu_ratio:.3f}x | "
                      f"{statistics.median(paired):.3f} [{paired[0]:.3f}, {paired[-1]:.3f}] |", flush=True)
    # P6: the scheduler's split against forced splits, interleaved rounds of run, per link rate.
    name, path = models[0]
    ids = ",".join(str(10 + i % 300) for i in range(a.prompt))
    gen = a.p6_gen or a.gen
    forced = a.p6_splits.split(",") if a.p6_splits else [str(a.prompt * k // 8) for k in range(9)]
    splits = ["auto"] + forced
    for link in ([] if a.skip_p6 else a.p6_links.split(",")):
        extra = [] if link == "unpaced" else ["--link-gbps", link]
        label = "unpaced" if link == "unpaced" else f"{float(link) * 1000:g} MB/s"
        rates = {s: [] for s in splits}
        chosen = []
        for _ in range(a.rounds):
            for s in splits:
                j = json.loads(sh(a.kvtier, "run", "-m", path, "--ids", ids, "-n", gen, "--ignore-eos", "--json",
                                  "-t", 2, "--kv-policy", "kvpr", "--recompute", s, "--profile-cache", cache, *extra))
                rates[s].append(j["decode_tokens_per_s"])
                if s == "auto":
                    chosen.append(j["kv"]["splits"][-(gen - 1):])
        med = {s: statistics.median(v) for s, v in rates.items()}
        best_s = max((s for s in splits if s != "auto"), key=lambda s: med[s])
        print(f"\nP6 on {name}, host link {label}, {a.prompt}-token prompt, {gen} generated: decode tok/s "
              f"by forced split (medians of {a.rounds} interleaved rounds)")
        print("| split | " + " | ".join(splits) + " |")
        print("|---|" + "---|" * len(splits))
        print("| tok/s | " + " | ".join(f"{med[s]:.2f}" for s in splits) + " |")
        print(f"\nscheduler (auto, decode splits per round {chosen}): {med['auto']:.2f} tok/s = "
              f"{med['auto'] / med[best_s]:.3f} of the best forced split ({best_s}: {med[best_s]:.2f})", flush=True)

if __name__ == "__main__":
    main()
