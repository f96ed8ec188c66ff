"""kvtier bench against llama.cpp (llama-cpp-python) on the same GGUF files, thread count and
lengths: prefill and decode tokens/s, medians over interleaved rounds, and the ratios kvtier / llama.cpp.

    .venv/bin/python tests/model_ref/bench_vs_llamacpp.py [--prompt-tokens 512,4096] [--gen 64]
        [--threads 2] [--rounds 3] [--models smollm2,gemma3] [--kvtier build/cpu/bin/kvtier]
        [--isa avx2|avx512] [--llama-python /path/to/venv/bin/python] [--copy-bench PATH] [--json]

Each round runs, per model, one `kvtier bench --repeat 1` over all prompt lengths and one llama.cpp
pass over the same lengths (in a fresh process of --llama-python, default this interpreter, so a
llama-cpp-python built for another ISA can be compared: e.g. one built with -DGGML_AVX512=OFF
against `--isa avx2`); which of the two goes first alternates between rounds, so a machine that
gets busier or quieter during the run does not favour one side. Reported: the median of the rounds
for each side, the ratio of the medians, and the smallest and largest per-round ratio (how noisy the
machine was). With --copy-bench (default: build/cpu/bench/bench_cpu_kernels when it exists) every
round also measures the copy bandwidth at the same thread count (`copy/threads:T`, bytes read +
written) and the read-only sweep (`read/threads:T`, bytes read), and each decode row gets kvtier's
bytes read per token (all weights, the tied output matrix included, plus the f16 KV of prompt +
gen / 2 positions: exact for full-attention layers, an upper bound for sliding-window ones) times
its decode rate, as a fraction of the median copy bandwidth (how close decode runs to the
memory-bandwidth bound), of the median read sweep (what one stream of reading reaches on this
machine; on some CPUs well below the copy figure) and of the median 4-stream read (`read4/threads:T`:
each thread reads 4 far-apart parts in turn, which the prefetchers take further than one stream) and,
on AVX-512 CPUs, of the median 64-byte-load read (`read512/threads:T`, the loads of that path's
one-token kernels; on an Intel Xeon guest 1.4x the 32-byte sweep). The header names the CPU (model, the SIMD flags), kvtier's kernel path and llama.cpp's
version and system info line, and the load average before and after.

Both sides warm up before timing: kvtier bench runs one unrecorded round, the llama.cpp pass first
runs its shortest prompt and the decode steps once unrecorded.

llama.cpp settings: n_batch = n_ubatch = 512 (kvtier's default chunk is at most 512), f16 KV cache,
no flash attention (llama-cpp-python's default), the same threads for prefill and decode; timed
around its `eval` calls (prefill: the prompt; decode: one token per eval, a few us of Python each).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "python"))
import kvtier_testlib as kt  # noqa: E402

SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "amx_int8")


def llama_worker(a):
    """Runs inside --llama-python: times one pass over the prompt lengths, prints JSON."""
    import numpy as np
    import llama_cpp

    lengths = [int(x) for x in a.prompt_tokens.split(",")]
    llm = llama_cpp.Llama(model_path=a.llama_worker, n_ctx=max(lengths) + a.gen, n_batch=512, n_ubatch=512,
                          n_threads=a.threads, n_threads_batch=a.threads, logits_all=False, verbose=False)
    rng = np.random.default_rng(1)
    n_vocab = llm.n_vocab()
    rows = []
    for i, p in enumerate([min(lengths)] + lengths):  # the first pass warms up (page tables, buffers)
        prompt = rng.integers(1000, min(n_vocab, 30000), size=p).tolist()
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        tok = prompt[-1]
        for _ in range(a.gen):
            llm.eval([tok])
        t2 = time.perf_counter()
        if i > 0:
            rows.append({"prompt_tokens": p, "prefill_tokens_per_s": p / (t1 - t0),
                         "decode_tokens_per_s": a.gen / (t2 - t1)})
    info = llama_cpp.llama_print_system_info()
    print(json.dumps({"version": llama_cpp.__version__, "system_info": info.decode() if isinstance(info, bytes) else info,
                      "results": rows}))


def cpu_description():
    model, flags = "unknown", set()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "cpus": os.cpu_count(), "simd_flags": [f for f in SIMD_FLAGS if f in flags]}


def run_measured(cmd):
    """cmd's stdout and its own peak resident set in bytes (getrusage of that child, from wait4)."""
    with tempfile.TemporaryFile(mode="w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        out = p.stdout.read()
        p.stdout.close()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise subprocess.CalledProcessError(p.returncode, cmd, out, err.read())
    return out, usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux


def run_kvtier(a, path):
    cmd = [a.kvtier, "bench", "-m", str(path), "--prompt-tokens", a.prompt_tokens, "--gen", str(a.gen), "--threads",
           str(a.threads), "--repeat", "1", "--json"]
    if a.isa:
        cmd += ["--isa", a.isa]
    out, rss = run_measured(cmd)
    return {**json.loads(out), "peak_rss_bytes": rss}


def memory_bandwidth(a):
    """GB/s of bench_cpu_kernels' STREAM-like copy (bytes read + written), read-only sweep and 4-stream
    read at the benchmark's thread count: {"copy": .., "read": .., "read4": .., "read512": ..} ("read4"
    only on CPUs with AVX2, "read512" only with AVX-512), or None without the binary."""
    if not a.copy_bench or not pathlib.Path(a.copy_bench).exists():
        return None
    out = subprocess.run([a.copy_bench, f"--benchmark_filter=^(copy|read|read4|read512)/threads:{a.threads}/",
                          "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    return {b["name"].split("/")[0]: b["bytes_per_second"] / 1e9 for b in json.loads(out)["benchmarks"]}


def run_llama(a, path):
    cmd = [a.llama_python, str(pathlib.Path(__file__).resolve()), "--llama-worker", str(path), "--prompt-tokens",
           a.prompt_tokens, "--gen", str(a.gen), "--threads", str(a.threads)]
    out, rss = run_measured(cmd)  # the Python interpreter and NumPy included (about 30-40 MB)
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss_bytes": rss}


def main():
    ap = argparse.ArgumentParser(description="kvtier bench against llama.cpp (llama-cpp-python) on the same GGUF "
                                 "files: prefill and decode tok/s, medians of interleaved rounds, ratios.")
    ap.add_argument("--prompt-tokens", default="512,4096", help="comma-separated prompt lengths (default 512,4096)")
    ap.add_argument("--gen", type=int, default=64, help="decode steps timed per prompt (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    ap.add_argument("--rounds", "--repeat", type=int, default=3, dest="rounds",
                    help="interleaved rounds; medians are over them (default 3)")
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated default models (default smollm2,gemma3)")
    ap.add_argument("--kvtier", default=str(kt.SOURCE_DIR / "build" / "cpu" / "bin" / "kvtier"),
                    help="kvtier binary (default build/cpu/bin/kvtier)")
    ap.add_argument("--isa", default="", help="kvtier's kernel path (default: the best the CPU has)")
    ap.add_argument("--llama-python", default=sys.executable,
                    help="python interpreter whose llama_cpp is compared (default: this one)")
    ap.add_argument("--copy-bench", default=str(kt.SOURCE_DIR / "build" / "cpu" / "bench" / "bench_cpu_kernels"),
                    help="bench_cpu_kernels binary for the copy bandwidth ('' to skip)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object instead of tables")
    ap.add_argument("--llama-worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.llama_worker:
        llama_worker(a)
        return

    lengths = [int(x) for x in a.prompt_tokens.split(",")]
    header = {"cpu": cpu_description(), "load_before": os.getloadavg(), "threads": a.threads, "gen": a.gen,
              "rounds": a.rounds, "llama_python": a.llama_python}
    samples = {}  # (model, prompt, side, phase) -> [tokens/s per round]
    bw_runs = {"copy": [], "read": [], "read4": [], "read512": []}  # GB/s, one per round and model
    bytes_per_token = {}  # (model, prompt) -> kvtier's weight + KV bytes read per decoded token
    peak_rss = {}  # (model, side) -> [peak resident bytes of the process per round]
    for name in a.models.split(","):
        path = kt.model(name)
        for rnd in range(a.rounds):
            bw = memory_bandwidth(a)
            for kind, gbps in (bw or {}).items():
                bw_runs[kind].append(gbps)
            sides = [("kvtier", run_kvtier), ("llama.cpp", run_llama)]
            if rnd % 2 == 1:
                sides.reverse()
            for side, fn in sides:
                out = fn(a, path)
                if side == "kvtier":
                    header["kvtier_isa"] = (out["isa"] + (" + AMX-INT8 tiles" if out.get("amx") else "")
                                            + (" + output matrix in rows-in-lanes" if out.get("output_lanes") else ""))
                    for r in out["results"]:
                        mem = r["peak_memory_bytes"]["device"]
                        kv_per_position = mem["kv"] / out["ctx"]
                        # decode reads the layers' rows-in-lanes copies, not their GGUF rows too
                        bytes_per_token[(name, r["prompt_tokens"])] = (
                            mem["weights"] - out.get("layer_lanes_bytes", 0)
                            + kv_per_position * (r["prompt_tokens"] + a.gen / 2))
                else:
                    header["llama_cpp_version"] = out["version"]
                    header["llama_cpp_system_info"] = out["system_info"]
                print(f"# round {rnd + 1} {name} {side}: " + ", ".join(
                    f"{r['prompt_tokens']}: {r['prefill_tokens_per_s']:.1f} / {r['decode_tokens_per_s']:.1f} tok/s"
                    for r in out["results"]) + f" (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
                peak_rss.setdefault((name, side), []).append(out["peak_rss_bytes"])
                for r in out["results"]:
                    for phase in ("prefill", "decode"):
                        samples.setdefault((name, r["prompt_tokens"], side, phase), []).append(
                            r[f"{phase}_tokens_per_s"])
    header["load_after"] = os.getloadavg()
    for kind, runs in bw_runs.items():
        header[f"{kind}_GBps_runs"] = runs
    medians = {kind: statistics.median(runs) for kind, runs in bw_runs.items() if runs}

    table = []
    for name in a.models.split(","):
        for p in lengths:
            row = {"model": name, "prompt_tokens": p}
            for phase in ("prefill", "decode"):
                ours, ref = samples[(name, p, "kvtier", phase)], samples[(name, p, "llama.cpp", phase)]
                per_round = [o / r for o, r in zip(ours, ref)]
                row.update({f"kvtier_{phase}": statistics.median(ours), f"llamacpp_{phase}": statistics.median(ref),
                            f"{phase}_ratio": statistics.median(ours) / statistics.median(ref),
                            f"{phase}_ratio_min": min(per_round), f"{phase}_ratio_max": max(per_round),
                            f"kvtier_{phase}_runs": ours, f"llamacpp_{phase}_runs": ref})
            if medians:
                row["decode_bytes_per_token"] = bytes_per_token[(name, p)]
                decode_gbps = bytes_per_token[(name, p)] * row["kvtier_decode"] / 1e9
                for kind, median in medians.items():
                    row[f"decode_pct_of_{kind}"] = 100 * decode_gbps / median
            table.append(row)
    header["peak_rss_bytes_runs"] = {f"{name} {side}": runs for (name, side), runs in peak_rss.items()}
    if a.json:
        print(json.dumps({**header, "results": table}))
        return
    cpu = header["cpu"]
    print(f"CPU: {cpu['model']} ({cpu['cpus']} CPUs); SIMD flags: {' '.join(cpu['simd_flags'])}")
    print(f"kvtier: {a.kvtier}, kernel path {header.get('kvtier_isa')}")
    print(f"llama.cpp: llama-cpp-python {header.get('llama_cpp_version')} ({a.llama_python}); "
          f"system info: {header.get('llama_cpp_system_info', '').strip()}")
    print(f"threads {a.threads}, {a.gen} decode steps, {a.rounds} interleaved rounds; load average before "
          f"{header['load_before'][0]:.1f}, after {header['load_after'][0]:.1f}")
    labels = {"copy": f"copy bandwidth ({a.threads} threads, bytes read + written)", "read": "read-only sweep",
              "read4": "4-stream read", "read512": "64-byte-load read"}
    if medians:
        print("; ".join(f"{labels[kind]}: median {median:.1f} GB/s of {', '.join(f'{r:.1f}' for r in bw_runs[kind])}"
                        for kind, median in medians.items()))
    print("peak RSS of each process (model, KV for the longest prompt, buffers; medians over rounds): " + "; ".join(
        f"{name} kvtier {statistics.median(peak_rss[(name, 'kvtier')]) / 1e6:.0f} MB / llama.cpp "
        f"{statistics.median(peak_rss[(name, 'llama.cpp')]) / 1e6:.0f} MB" for name in a.models.split(",")))
    print()
    print("| model | prompt | prefill tok/s kvtier / llama.cpp | prefill ratio (range) | decode tok/s kvtier / llama.cpp "
          "| decode ratio (range) | kvtier decode MB/token, % of copy, % of read, % of 4-stream read, % of 64-byte read |")
    print("|---|---:|---|---|---|---|---|")
    for t in table:
        bw = ", ".join([f"{t['decode_bytes_per_token'] / 1e6:.0f}"] +
                       [f"{t[f'decode_pct_of_{kind}']:.0f} %" if f"decode_pct_of_{kind}" in t else "-"
                        for kind in labels]) if "decode_bytes_per_token" in t else "-"
        print(f"| {t['model']} | {t['prompt_tokens']} | {t['kvtier_prefill']:.1f} / {t['llamacpp_prefill']:.1f} | "
              f"**{t['prefill_ratio']:.2f}** ({t['prefill_ratio_min']:.2f}-{t['prefill_ratio_max']:.2f}) | "
              f"{t['kvtier_decode']:.1f} / {t['llamacpp_decode']:.1f} | "
              f"**{t['decode_ratio']:.2f}** ({t['decode_ratio_min']:.2f}-{t['decode_ratio_max']:.2f}) | {bw} |")


if __name__ == "__main__":
    main()
