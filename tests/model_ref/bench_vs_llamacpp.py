"""kvtier bench against llama.cpp (llama-cpp-python) on the same GGUF files, thread count and
lengths, in one run: prefill and decode tokens/s (medians) and the ratios kvtier / llama.cpp.

    .venv/bin/python tests/model_ref/bench_vs_llamacpp.py [--prompt-tokens 512,4096] [--gen 128]
        [--threads 2] [--repeat 3] [--models smollm2,gemma3] [--kvtier build/cpu/bin/kvtier] [--json]

llama.cpp settings: n_batch = n_ubatch = 512 (kvtier's default chunk is at most 512), f16 KV cache,
no flash attention (llama-cpp-python's default), the same threads for prefill and decode. Decode
feeds one token per llama_decode through Llama.eval (Python overhead per token is a few us).
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "python"))
import kvtier_testlib as kt  # noqa: E402


def bench_llama_cpp(path, prompt_tokens, gen, threads, repeat):
    import llama_cpp

    n_ctx = max(prompt_tokens) + gen
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=False, verbose=False)
    rng = np.random.default_rng(1)
    n_vocab = llm.n_vocab()
    rows = []
    for p in prompt_tokens:
        prompt = rng.integers(1000, min(n_vocab, 30000), size=p).tolist()
        pre, dec = [], []
        for _ in range(repeat):
            llm.reset()
            llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
            t0 = time.perf_counter()
            llm.eval(prompt)
            t1 = time.perf_counter()
            tok = prompt[-1]
            for _ in range(gen):
                llm.eval([tok])
            t2 = time.perf_counter()
            pre.append(p / (t1 - t0))
            dec.append(gen / (t2 - t1))
        rows.append({"prompt_tokens": p, "prefill_tokens_per_s": statistics.median(pre),
                     "decode_tokens_per_s": statistics.median(dec), "prefill_runs": pre, "decode_runs": dec})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", default="512,4096")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--kvtier", default=str(kt.SOURCE_DIR / "build" / "cpu" / "bin" / "kvtier"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    lengths = [int(x) for x in a.prompt_tokens.split(",")]
    table = []
    for name in a.models.split(","):
        path = kt.model(name)
        ours = json.loads(subprocess.run(
            [a.kvtier, "bench", "-m", str(path), "--prompt-tokens", a.prompt_tokens, "--gen", str(a.gen), "--threads",
             str(a.threads), "--repeat", str(a.repeat), "--json"], check=True, capture_output=True, text=True).stdout)
        ref = bench_llama_cpp(path, lengths, a.gen, a.threads, a.repeat)
        for o, r in zip(ours["results"], ref):
            table.append({"model": name, "prompt_tokens": o["prompt_tokens"], "gen": a.gen, "threads": a.threads,
                          "kvtier_prefill": o["prefill_tokens_per_s"], "llamacpp_prefill": r["prefill_tokens_per_s"],
                          "prefill_ratio": o["prefill_tokens_per_s"] / r["prefill_tokens_per_s"],
                          "kvtier_decode": o["decode_tokens_per_s"], "llamacpp_decode": r["decode_tokens_per_s"],
                          "decode_ratio": o["decode_tokens_per_s"] / r["decode_tokens_per_s"]})
    if a.json:
        print(json.dumps(table))
        return
    print("| model | prompt | kvtier prefill tok/s | llama.cpp prefill tok/s | ratio | kvtier decode tok/s "
          "| llama.cpp decode tok/s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in table:
        print(f"| {t['model']} | {t['prompt_tokens']} | {t['kvtier_prefill']:.1f} | {t['llamacpp_prefill']:.1f} | "
              f"{t['prefill_ratio']:.2f} | {t['kvtier_decode']:.1f} | {t['llamacpp_decode']:.1f} | "
              f"{t['decode_ratio']:.2f} |")


if __name__ == "__main__":
    main()
