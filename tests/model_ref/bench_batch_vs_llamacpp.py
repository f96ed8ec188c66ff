"""Aggregate decode throughput with B sequences per pass: kvtier (`kvtier bench --batch`) against
llama.cpp's own multi-sequence batching (what llama-server does: one llama_decode per step carrying one
token of each of B sequences, a unified KV cache with n_seq_max = B), through llama-cpp-python's
low-level API on the same GGUF file, the same prompt ids, threads and greedy decoding.

    .venv/bin/python tests/model_ref/bench_batch_vs_llamacpp.py --models smollm2,gemma3 --batch 1,4,16 \
        --prompt-tokens 128 --gen 32 --threads 2 --repeat 3

Prints a Markdown table (medians of `repeat` rounds after one warm-up; kvtier's rounds come from its
own bench with the same settings) and the batch-16/batch-1 ratios. Needs llama-cpp-python
(scripts/setup.sh --with-llama-cpp). Not a CTest: it measures, it does not check."""
import argparse
import ctypes
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import MODELS, SOURCE_DIR  # noqa: E402


def kvtier_bench(path, batches, prompt_tokens, gen, threads, repeat):
    kv = os.environ.get("KVTIER_BIN", str(SOURCE_DIR / "build" / "cpu" / "bin" / "kvtier"))
    out = subprocess.run([kv, "bench", "-m", str(path), "--prompt-tokens", str(prompt_tokens), "--gen", str(gen),
                          "--batch", ",".join(map(str, batches)), "-t", str(threads), "--repeat", str(repeat),
                          "--json"], check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)["results"]
    return {r["batch"]: (r["decode_tokens_per_s"], [s["prompt_ids"] for s in r["sequences"]]) for r in rows}


def llamacpp_bench(path, prompts, gen, threads, repeat):
    import llama_cpp as L
    B = len(prompts)
    n_prompt = len(prompts[0])
    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(quiet, ctypes.c_void_p())
    llamacpp_bench.keep = quiet  # the callback must outlive the library's use of it
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx = B * (n_prompt + gen) + 256
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_seq_max = B
    cp.n_threads = threads
    cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(512, 0, B)

    def submit(items):  # items: (token, pos, seq, want_logits)
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, want) in enumerate(items):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if want else 0
        rc = L.llama_decode(ctx, batch)
        assert rc == 0, f"llama_decode returned {rc}"

    def argmax(i):
        p = L.llama_get_logits_ith(ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), (n_vocab,))))

    rates = []
    for r in range(repeat + 1):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        # Prefill: each sequence in 512-token passes (prefill speed is not what is compared here).
        nxt = []
        for b, p in enumerate(prompts):
            for i in range(0, n_prompt, 512):
                part = p[i:i + 512]
                submit([(t, i + j, b, i + j == n_prompt - 1) for j, t in enumerate(part)])
            nxt.append(argmax(len(part) - 1))
        t0 = time.perf_counter()
        for g in range(gen):
            submit([(nxt[b], n_prompt + g, b, True) for b in range(B)])
            nxt = [argmax(b) for b in range(B)]
        dt = time.perf_counter() - t0
        if r > 0:
            rates.append(B * gen / dt)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    batches = [int(b) for b in a.batch.split(",")]
    print("| model | batch | kvtier decode tok/s (aggregate) | llama.cpp decode tok/s (aggregate) | ratio |")
    print("|---|---|---|---|---|")
    for name in a.models.split(","):
        path = MODELS[name]
        kv = kvtier_bench(path, batches, a.prompt_tokens, a.gen, a.threads, a.repeat)
        print(f"# kvtier {name}: " + ", ".join(f"batch {b}: {kv[b][0]:.1f} tok/s" for b in batches), flush=True)
        ll = {}
        for b in batches:
            ll[b] = llamacpp_bench(path, kv[b][1], a.gen, a.threads, a.repeat)
            print(f"# llama.cpp {name} batch {b}: {ll[b]:.1f} tok/s", flush=True)
        for b in batches:
            print(f"| {name} | {b} | {kv[b][0]:.1f} | {ll[b]:.1f} | {kv[b][0] / ll[b]:.2f} |", flush=True)
        print(f"| {name} | {batches[-1]}/{batches[0]} | x{kv[batches[-1]][0] / kv[batches[0]][0]:.2f} | "
              f"x{ll[batches[-1]] / ll[batches[0]]:.2f} | |", flush=True)


if __name__ == "__main__":
    main()
