"""Batched passes are exact: `kvtier bench --batch B` runs B sequences together (their prefill chunks
mixed in passes of at most --chunk tokens, then one pass per decode step carrying all B), and each
sequence's greedy tokens must equal `kvtier run --ids <its prompt> --kv-policy resident` run alone
with the same chunk. Rows: every exact KV policy of the exactness matrix (test_exactness.configs, built
from `kvtier policies --json`), unlimited budget, plus the smallest budget with a disk home for the
offloaded ones (SmolLM2's exact and kvpr rows both; the degenerate rows, and Gemma-3's exact and
kvpr/hybridserve rows, one of the two each, shared out so that each kind runs both: SWEEP). On Gemma-3 the prompts are longer than the 512-token sliding window, so +sliding frees
blocks during the batch."""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kvtier_testlib import model, run  # noqa: E402
from test_exactness import configs, pick, row_kind, with_model_files  # noqa: E402
from test_locret_offloaded import heads  # noqa: E402,F401  (fixture: untrained SmolLM2 retaining heads)
import re  # noqa: E402

N_GEN = 6
BATCH = 3
BUDGETS = ["unlimited", "smallest+disk"]  # of an offloaded row; resident rows: unlimited only
# How many budgets each kind of row (test_exactness.row_kind) runs, None: both. The k-th row of a kind
# with n budgets runs budgets k*n .. k*n+n-1 (wrapping), so the rows of a kind share them out and
# together run both (test_batch_sweeps_cover_both_budgets). CI time: a degenerate row proves one hook
# of an approximate value batched on one placement, and Gemma-3's batch (3 x 560 tokens) costs ~4x
# SmolLM2's (its batch test was the longest CTest, 350 s on a loaded 2-vCPU machine); the exact rows
# keep both budgets on SmolLM2, and on Gemma-3 share them out like the others.
SWEEP = {
    "smollm2": {"exact": None, "kvpr": None, "degenerate": 1},
    "gemma3": {"exact": 1, "kvpr": 1, "degenerate": 1},
}


def batched(mdl, prompt_tokens, chunk, extra):
    p = run("bench", "-m", mdl, "--prompt-tokens", prompt_tokens, "--gen", N_GEN, "--batch", BATCH,
            "--repeat", 1, "--warmup", 0, "--chunk", chunk, "-t", 2, "--json", *extra)
    rows = json.loads(p.stdout)["results"]
    assert len(rows) == 1 and rows[0]["batch"] == BATCH
    return [(s["prompt_ids"], s["tokens"]) for s in rows[0]["sequences"]]


def smallest_kv_mem(mdl, prompt_tokens, chunk, extra):
    """The smallest compute-local budget the batched bench itself accepts (from its budget error)."""
    p = run("bench", "-m", mdl, "--prompt-tokens", prompt_tokens, "--gen", N_GEN, "--batch", BATCH, "--repeat", 1,
            "--warmup", 0, "--chunk", chunk, "--kv-mem", 1, *extra, check=False)
    assert p.returncode == 1, p.stderr
    m = re.search(r"(\d+) bytes are needed", p.stderr)
    assert m, p.stderr
    return int(m.group(1))


def alone(mdl, ids, chunk):
    p = run("run", "-m", mdl, "--ids", ",".join(map(str, ids)), "-n", N_GEN, "--ignore-eos", "--chunk", chunk,
            "-t", 2, "--json", "--kv-policy", "resident")
    return json.loads(p.stdout)["tokens"]


def batch_plan(n_kv_heads, sweep):
    """[(flags, offloaded, budgets)]: resident, then every row of test_exactness.configs with the
    budgets SWEEP gives it."""
    index = {}
    out = [(["--kv-policy", "resident"], False, ["unlimited"])]
    for flags, offloaded in configs(n_kv_heads):
        kind = row_kind(flags, n_kv_heads)
        k = index[kind] = index.get(kind, -1) + 1
        out.append((flags, offloaded, pick(BUDGETS if offloaded else BUDGETS[:1], k, sweep[kind])))
    return out


def check(tmp_path, mdl, n_kv_heads, prompt_tokens, chunk, sweep):
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    ref = None
    n = 0
    for cfg, offloaded, budgets in batch_plan(n_kv_heads, sweep):
        cfg = with_model_files(cfg, mdl, tmp_path)
        for budget in budgets:
            extra = []
            if budget == "smallest+disk":
                extra = ["--kv-mem", str(smallest_kv_mem(mdl, prompt_tokens, chunk, cfg)), "--kv-disk", str(disk)]
            got = batched(mdl, prompt_tokens, chunk, cfg + extra)
            if ref is None:  # the reference: each prompt run alone with resident
                ref = [alone(mdl, ids, chunk) for ids, _ in got]
                assert len({tuple(r) for r in ref}) > 1, "the sequences should differ"
            for b, (ids, tokens) in enumerate(got):
                assert len(ids) == prompt_tokens
                assert tokens == ref[b], f"{mdl.name} {' '.join(cfg + extra)}: sequence {b} differs from alone"
            n += 1
    assert list(disk.iterdir()) == [], "the disk tier left files behind"
    return n


def test_smollm2_batched_equals_alone(tmp_path):
    assert check(tmp_path, model("smollm2"), 3, 150, 64, SWEEP["smollm2"]) >= 8


def test_gemma3_batched_equals_alone(tmp_path):
    # 560 > the 512-token window: the sliding layers free blocks while the batch runs.
    assert check(tmp_path, model("gemma3"), 1, 560, 96, SWEEP["gemma3"]) >= 6


def test_batch_sweeps_cover_both_budgets():
    """Every row runs; the offloaded rows of each kind together run both budgets; exact rows run both."""
    for name, n_kv_heads in (("smollm2", 3), ("gemma3", 1)):
        plan = batch_plan(n_kv_heads, SWEEP[name])
        for kind in ("exact", "kvpr", "degenerate"):
            rows = [(f, b) for f, o, b in plan[1:] if o and row_kind(f, n_kv_heads) == kind]
            assert {x for _, b in rows for x in b} == set(BUDGETS), (name, kind)
            if SWEEP[name][kind] is None:
                assert all(b == BUDGETS for _, b in rows), (name, kind)
        assert all(b for _, _, b in plan), name


# Approximate policies are deterministic per sequence too: batched, each sequence's tokens equal the
# same policy run alone. The knobs are small enough that each policy drops, selects or quantises
# positions of the 150-token prompts (sinks + window < prompt, budget < prompt, residual < prompt).
# h2o evicts and kivi quantises at the end of each pass, and locret evicts after each pass of its
# prefill plan, so their output depends on where a prompt's passes end: the batched prefill feeds each
# prompt in the pieces the policy plans for it alone (Session::plan_prefill; 150 = 64 + 64 + 22, so a
# pass that had room for part of the next prompt would cut it elsewhere).
APPROX = [
    ["--kv-policy", "resident+streaming", "--sinks", "4", "--window", "60"],
    ["--kv-policy", "layer+streaming", "--sinks", "4", "--window", "60"],
    ["--kv-policy", "resident+h2o", "--kv-budget", "64"],
    ["--kv-policy", "resident+quest", "--kv-budget", "64"],
    ["--kv-policy", "layer+quest", "--kv-budget", "64"],
    ["--kv-policy", "headinfer+quest", "--kv-budget", "64", "--group", "1"],
    ["--kv-policy", "resident+kivi4", "--kivi-residual", "32"],
    ["--kv-policy", "layer+kivi2", "--kivi-residual", "32"],
    ["--kv-policy", "headinfer+kivi4", "--kivi-residual", "32"],
    # kivi with kvpr's recomputed part: several sequences' inputs and quantised pages in one home
    ["--kv-policy", "layer+kivi4+kvpr", "--kivi-residual", "32", "--recompute", "random"],
    # locret (untrained heads: the scores still decide): evictions after each planned prefill pass
    ["--kv-policy", "resident+locret", "--kv-budget", "48", "--local-tail", "16", "--locret-heads", "@HEADS"],
    ["--kv-policy", "layer+locret", "--kv-budget", "48", "--local-tail", "16", "--locret-heads", "@HEADS"],
]
APPROX_PROMPT = 150


def alone_with(mdl, ids, chunk, cfg):
    p = run("run", "-m", mdl, "--ids", ",".join(map(str, ids)), "-n", N_GEN, "--ignore-eos", "--chunk", chunk,
            "-t", 2, "--json", *cfg)
    return json.loads(p.stdout)["tokens"]


@pytest.mark.parametrize("cfg", APPROX, ids=[c[1] for c in APPROX])
def test_smollm2_approximate_batched_equals_alone(tmp_path, cfg, heads):
    mdl = model("smollm2")
    cfg = [str(heads) if c == "@HEADS" else c for c in cfg]
    extras = [[]]
    if not cfg[1].startswith("resident"):
        disk = tmp_path / "kvdisk"
        disk.mkdir()
        extras.append(["--kv-mem", str(smallest_kv_mem(mdl, APPROX_PROMPT, 64, cfg)), "--kv-disk", str(disk)])
    for extra in extras:
        got = batched(mdl, APPROX_PROMPT, 64, cfg + extra)
        assert len({tuple(t) for _, t in got}) > 1, "the sequences should differ"
        for b, (ids, tokens) in enumerate(got):
            assert tokens == alone_with(mdl, ids, 64, cfg + extra), f"{' '.join(cfg + extra)}: sequence {b}"
