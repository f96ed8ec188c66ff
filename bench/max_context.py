#!/usr/bin/env python3
"""Largest context each KV policy reaches under a compute-local KV budget, found by the engine
itself: binary search on --ctx for the largest value at which `kvtier run` starts (all KV
structures allocated up front: resident blocks, staging buffers, the host/disk home tier) and
completes a short generation. A full prefill to that length is not run (too slow on a CPU).

usage: bench/max_context.py KVTIER MODEL --kv-mem 1GiB [--kv-disk DIR] [--policies resident,layer,headinfer]
"""
import argparse
import json
import subprocess
import sys
import time


def starts(kvtier, model, ctx, policy, extra):
    cmd = [kvtier, "run", "-m", model, "-p", "Hello", "-n", "2", "--ctx", str(ctx), "-t", "2", "--json",
           "--kv-policy", policy, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode == 0:
        return True, json.loads(p.stdout)
    if "bytes" in p.stderr or "cannot" in p.stderr or "budget" in p.stderr:
        return False, p.stderr.strip()
    sys.exit(f"unexpected failure at ctx={ctx}: {p.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvtier")
    ap.add_argument("model")
    ap.add_argument("--kv-mem", default="1GiB")
    ap.add_argument("--kv-disk", default="")
    ap.add_argument("--policies", default="resident,layer,headinfer")
    ap.add_argument("--max", type=int, default=1 << 24)
    a = ap.parse_args()
    rows = []
    for policy in a.policies.split(","):
        extra = ["--kv-mem", a.kv_mem]
        if policy == "headinfer":
            extra += ["--group", "1"]
        if policy != "resident" and a.kv_disk:
            extra += ["--kv-disk", a.kv_disk]
        lo, hi = 256, a.max  # lo starts, hi does not (or is the cap)
        ok, _ = starts(a.kvtier, a.model, lo, policy, extra)
        if not ok:
            rows.append((policy, 0, "does not start at 256"))
            continue
        t0 = time.time()
        while hi - lo > 256:
            mid = (lo + hi) // 2 // 256 * 256
            ok, info = starts(a.kvtier, a.model, mid, policy, extra)
            lo, hi = (mid, hi) if ok else (lo, mid)
        ok, info = starts(a.kvtier, a.model, lo, policy, extra)
        mem = info["peak_memory_bytes"]
        home = info["kv"].get("home", "compute-local")
        rows.append((policy, lo, f"device KV {mem['device']['kv'] + mem['device']['staging']} B; home: {home}; "
                                 f"search {time.time() - t0:.0f} s"))
    print(f"| policy | largest --ctx that starts under --kv-mem {a.kv_mem} | notes |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
