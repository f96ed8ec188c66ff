#!/usr/bin/env python3
"""A/B speed comparison of two kvtier binaries (e.g. a build of the previous commit and of this one) on
the same machine, rounds interleaved (A, B, A, B, ...) so that machine noise hits both alike.

    python3 bench/ab_compare.py --base /path/old/kvtier --new build/cpu/bin/kvtier \
        --models models/SmolLM2-135M-Instruct.Q4_1.gguf,models/gemma-3-270m-q4_k_m.gguf \
        --policies resident,layer,headinfer --prompt-tokens 512 --gen 64 --rounds 3

Each round runs `kvtier bench --json` once per binary (which itself takes the median of --repeat
runs after a warm-up). Prints, per model, policy and prompt length, the median over rounds of
prefill and decode tok/s for each binary and the ratio new/base, plus the CPU model and flags."""
import argparse
import json
import statistics
import subprocess


def cpu_info():
    model, flags = "?", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = [x for x in line.split(":", 1)[1].split() if x.startswith(("avx", "fma", "f16c", "amx"))]
    return model, flags


def bench(binary, model, args):
    cmd = [binary, "bench", "-m", model, "--kv-policy", args.policies, "--prompt-tokens", args.prompt_tokens,
           "--gen", str(args.gen), "--repeat", str(args.repeat), "-t", str(args.threads), "--json"]
    if args.group:
        cmd += ["--group", str(args.group)]
    if args.isa:
        cmd += ["--isa", args.isa]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--policies", default="resident,layer,headinfer")
    ap.add_argument("--prompt-tokens", default="512")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--group", type=int, default=0)
    ap.add_argument("--isa", default="", help="kernel path for both binaries (avx2, avx512); default: the best")
    args = ap.parse_args()
    model_name, flags = cpu_info()
    print(f"CPU: {model_name}; flags: {' '.join(flags)}; threads {args.threads}")
    for model in args.models.split(","):
        runs = {"base": [], "new": []}
        isa = "?"
        for _ in range(args.rounds):
            for tag in ("base", "new"):
                j = bench(args.base if tag == "base" else args.new, model, args)
                isa = (j.get("isa", isa) + (" + AMX-INT8 tiles" if j.get("amx") else "")
                       + (" + output matrix in rows-in-lanes" if j.get("output_lanes") else ""))
                runs[tag].append(j)
        print(f"\n{model} (ISA path {isa}; medians of {args.rounds} interleaved rounds)")
        print(f"{'policy':<12} {'prompt':>6} {'prefill base':>13} {'new':>8} {'ratio':>6} "
              f"{'decode base':>12} {'new':>8} {'ratio':>6}")
        rows = {}
        for tag in ("base", "new"):
            for j in runs[tag]:
                for r in j["results"]:
                    key = (r["policy"], r["prompt_tokens"])
                    rows.setdefault(key, {"base": ([], []), "new": ([], [])})
                    rows[key][tag][0].append(r["prefill_tokens_per_s"])
                    rows[key][tag][1].append(r["decode_tokens_per_s"])
        for (policy, p), v in rows.items():
            pb, pn = statistics.median(v["base"][0]), statistics.median(v["new"][0])
            db, dn = statistics.median(v["base"][1]), statistics.median(v["new"][1])
            print(f"{policy:<12} {p:>6} {pb:>13.1f} {pn:>8.1f} {pn / pb:>6.3f} {db:>12.1f} {dn:>8.1f} {dn / db:>6.3f}")


if __name__ == "__main__":
    main()
