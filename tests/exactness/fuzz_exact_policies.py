#!/usr/bin/env python3
"""Randomised exactness: exact KV policies under configurations the matrix does not list (odd chunk
sizes, budgets between the smallest and unlimited, prefetch depths, head groups, static heads, kvpr
splits, thread counts, prompt and generation lengths), each held bit-identical to `resident` with the
same representation and chunk (tokens and a hash of every position's state or logits, `run --state-digest`).

  tests/exactness/fuzz_exact_policies.py [--n N] [--seed S] [--models smollm2,gemma3,tiny-mha,tiny-opt]

Needs KVTIER_BIN (and KVTIER_SOURCE_DIR outside the source tree). Prints one line per case and, for
each failure, the whole command line to reproduce it; exits 1 if any case failed. CTest runs a few
fixed seeds (exactness.fuzz); run it longer by hand after changing a KV policy."""
import argparse
import json
import pathlib
import random
import re
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import model, run  # noqa: E402

TEXT = ("The tiered cache keeps the keys and values of every layer where they fit. Chapter one: the river "
        "bends twice before the old mill, and the miller counts the sacks each morning. In the evening the "
        "lamps are lit one by one along the quay, and the ferry waits for the last of the carts. ") * 12
GEOMETRY = {"smollm2": 3, "gemma3": 1, "tiny-mha": 4, "tiny-opt": 4}  # KV heads per layer


def digests(mdl, prompt, n_gen, chunk, ctx, threads, flags):
    p = run("run", "-m", mdl, "-p", prompt, "-n", n_gen, "--chunk", chunk, "--ctx", ctx, "-t", threads,
            "--ignore-eos", "--json", "--state-digest", *flags, check=False)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"
    j = json.loads(p.stdout)
    return (j["tokens"], j["state_digest"] + j["logits_digest"]), None


def smallest(mdl, chunk, ctx, flags):
    p = run("run", "-m", mdl, "-p", "x", "-n", 1, "--chunk", chunk, "--ctx", ctx, "--kv-mem", 1, *flags,
            check=False)
    m = re.search(r"(\d+) bytes are needed", p.stderr)
    assert p.returncode == 1 and m, p.stderr
    return int(m.group(1))


def sample(rng, name, n_kv):
    """One random exact configuration: (placement flags, representation, extra knobs)."""
    placement = rng.choice(["layer", "headinfer"])
    rep = rng.choice(["f16", "f16", "f32", "kvpr", "kvpr"])
    retention = rng.choice(["", "", "+sliding"]) if name == "gemma3" else rng.choice(["", "+sliding"])
    spec = placement + ("" if rep == "f16" else "+" + rep) + retention
    flags = ["--kv-policy", spec]
    if placement == "headinfer":
        groups = [g for g in range(1, n_kv + 1) if n_kv % g == 0] + [0]
        flags += ["--group", rng.choice(groups)]
        if rng.random() < 0.4:
            flags += ["--static-heads", rng.randint(1, 3)]
    if rng.random() < 0.5:
        flags += ["--prefetch-depth", rng.randint(1, 4)]
    if rep == "kvpr":
        flags += ["--recompute", rng.choice(["random", str(rng.randint(0, 400)), "1000000"])]
    return [str(f) for f in flags], rep


def batched_case(mdl, rng, chunk, threads, flags):
    """`bench --batch B`: each sequence's greedy tokens equal its prompt run alone with resident."""
    batch, n_prompt, n_gen = rng.randint(2, min(4, chunk)), rng.randint(8, 300), rng.randint(1, 6)
    cmd = (f"kvtier bench -m {mdl} --prompt-tokens {n_prompt} --gen {n_gen} --batch {batch} --repeat 1 "
           f"--warmup 0 --chunk {chunk} -t {threads} {' '.join(flags)}")
    def bench(flags):
        return run("bench", "-m", mdl, "--prompt-tokens", n_prompt, "--gen", n_gen, "--batch", batch, "--repeat",
                   1, "--warmup", 0, "--chunk", chunk, "-t", threads, "--json", *flags, check=False)
    p = bench(flags)
    needed = re.search(r"(\d+) bytes are needed", p.stderr)
    if p.returncode == 1 and needed and "--kv-mem" in flags:  # B sequences need more than one: the smallest
        flags = list(flags)
        flags[flags.index("--kv-mem") + 1] = needed.group(1)
        cmd = cmd.split(" --kv-policy")[0] + " " + " ".join(flags)
        p = bench(flags)
    if p.returncode != 0:
        return "ERROR " + (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1], cmd
    for b, seq in enumerate(json.loads(p.stdout)["results"][0]["sequences"]):
        a = run("run", "-m", mdl, "--ids", ",".join(map(str, seq["prompt_ids"])), "-n", n_gen, "--ignore-eos",
                "--chunk", chunk, "-t", 2, "--json", "--kv-policy", "resident")
        if json.loads(a.stdout)["tokens"] != seq["tokens"]:
            return f"sequence {b} differs from running alone", cmd
    return "ok", cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--models", default="smollm2,gemma3,tiny-mha,tiny-opt")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        models = {}
        for name in args.models.split(","):
            if name in ("smollm2", "gemma3"):
                models[name] = model(name)
            else:
                models[name] = tmp / f"{name}.gguf"
                run("synth", "--preset", name, "--type", rng.choice(["q8_0", "f16"]), "-o", models[name])
        disk = tmp / "kvdisk"
        disk.mkdir()
        for i in range(args.n):
            name = rng.choice(sorted(models))
            mdl = models[name]
            n_chars = rng.randint(20, 1600 if name == "gemma3" else 500)
            start = rng.randint(0, 200)
            prompt = TEXT[start:start + n_chars]
            n_gen = rng.randint(1, 8)
            chunk = rng.choice([1, 2, 7, 16, 33, 64, 100, 129, 256, 512])
            ctx = rng.choice([1024, 2048])
            threads = rng.choice([1, 2])
            flags, rep = sample(rng, name, GEOMETRY[name])
            ref_flags = ["--kv-policy", "resident" if rep != "f32" else "resident+f32"]
            budget = rng.choice(["unlimited", "smallest", "between", "smallest+disk", "between+disk"])
            if budget != "unlimited":
                small = smallest(mdl, chunk, ctx, flags)
                mem = small if budget.startswith("smallest") else int(small * rng.uniform(1.0, 3.0))
                flags += ["--kv-mem", str(mem)]
                if budget.endswith("+disk"):
                    flags += ["--kv-disk", str(disk)]
            if rng.random() < 0.25 and rep != "f32" and chunk >= 2:  # a pass carries at most --chunk sequences
                verdict, cmd = batched_case(mdl, rng, chunk, threads, flags)
                print(f"[{i}] {name} {budget} batched: {verdict}: {cmd}", flush=True)
                if verdict != "ok":
                    failures.append(cmd)
                continue
            ref, err = digests(mdl, prompt, n_gen, chunk, ctx, rng.choice([1, 2]), ref_flags)
            assert ref, f"resident failed: {err}"
            got, err = digests(mdl, prompt, n_gen, chunk, ctx, threads, flags)
            cmd = (f"kvtier run -m {mdl} -p <{n_chars} chars from {start}> -n {n_gen} --chunk {chunk} --ctx {ctx} "
                   f"-t {threads} {' '.join(flags)}")
            if got is None:
                verdict = f"ERROR {err}"
            elif got[0] != ref[0]:
                verdict = "tokens differ"
            elif got[1] != ref[1]:
                first = next(k for k, (a, b) in enumerate(zip(got[1], ref[1])) if a != b)
                verdict = f"logits differ from position {first}"
            else:
                verdict = "ok"
            print(f"[{i}] {name} {budget}: {verdict}: {cmd}", flush=True)
            if verdict != "ok":
                failures.append(cmd)
            if list(disk.iterdir()):
                failures.append(f"{cmd}: the disk tier left files behind")
                for f in disk.iterdir():
                    f.unlink()
    print(f"{args.n - len(failures)} of {args.n} cases bit-identical to resident")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
