"""KVPR (kvpr representation) beyond bit-exactness (the exactness matrix holds its outputs to resident's):
the bytes each decode step uses follow the spec's C4 formula per layer, X rows for the recomputed prefix
and K/V rows for the rest, with the stored input row size derived independently from the GGUF's K/V
projection types (the `gguf` package): the quantised activation rows cpu::matmul consumes."""
import json
import pathlib
import sys

import gguf
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import model, run  # noqa: E402

LEGACY = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}  # activations in blocks of 32: f32 d, i32 sum, 32 x i8
KQUANT = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}  # blocks of 256: f32 d, 16 x i16 sums, 256 x i8


def act_format(t):
    return "q8_32" if t in LEGACY else "q8_k" if t in KQUANT else "f32"


def geometry(path):
    r = gguf.GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def field(key):
        return int(r.fields[f"{arch}.{key}"].parts[-1][0])

    n_layer, n_embd = field("block_count"), field("embedding_length")
    n_head, n_kv = field("attention.head_count"), field("attention.head_count_kv")
    types = {t.name: t.tensor_type.name for t in r.tensors}
    x_row = []
    for layer in range(n_layer):
        fk, fv = act_format(types[f"blk.{layer}.attn_k.weight"]), act_format(types[f"blk.{layer}.attn_v.weight"])
        if fk != fv or fk == "f32":
            x_row.append(4 * n_embd)
        elif fk == "q8_32":
            x_row.append(n_embd // 32 * 40)
        else:
            x_row.append(n_embd // 256 * 292)
    head_dim = n_embd // n_head
    return x_row, n_kv * head_dim * 2 * 2  # K and V rows of all KV heads, f16


def run_kvpr(mdl, recompute, n_prompt, n_gen, extra=()):
    ids = ",".join(str(10 + (7 * i) % 250) for i in range(n_prompt))  # within a small synthetic vocabulary
    p = run("run", "-m", mdl, "--ids", ids, "-n", n_gen, "--ignore-eos", "--chunk", 64, "-t", 2, "--json",
            "--kv-policy", "kvpr", "--recompute", recompute, *extra)
    return json.loads(p.stdout)


@pytest.mark.parametrize("recompute", [0, 5, 41, 1000000])
def test_decode_bytes_follow_the_c4_formula(recompute):
    mdl = model("smollm2")
    x_row, kv_row = geometry(mdl)
    n_prompt, n_gen = 40, 8
    j = run_kvpr(mdl, recompute, n_prompt, n_gen)
    kv = j["kv"]
    n_steps = len(j["tokens"]) - 1  # the prefill pass has no past; each later token is one decode pass
    want_x = want_kv = 0
    for i in range(n_steps):
        s = n_prompt + i  # past positions of decode pass i
        l_i = min(recompute, s)
        want_x += sum(l_i * xr for xr in x_row)
        want_kv += len(x_row) * (s - l_i) * kv_row
    assert kv["payload_x_bytes"] == want_x, kv
    assert kv["payload_kv_bytes"] == want_kv, kv
    assert kv["split"] == min(recompute, n_prompt + n_steps - 1)
    # the split of every pass: the prefill (no past) and each decode step
    assert kv["splits"] == [0] + [min(recompute, n_prompt + i) for i in range(n_steps)], kv["splits"]
    assert kv["recomputed_rows"] == sum(len(x_row) * min(recompute, n_prompt + i) for i in range(n_steps))


@pytest.mark.parametrize("preset", ["tiny-mha", "tiny-opt"])
def test_mha_inputs_are_smaller_than_their_kv(tmp_path, preset):
    """On an MHA model with quantised weights (llama-style, and OPT: the paper's family) the stored
    inputs (1.25 bytes per element) are less than half of the K/V they replace (4 bytes per element of
    n_embd): recomputing everything moves less."""
    mha = tmp_path / "mha.gguf"
    run("synth", "--preset", preset, "--type", "q8_0", "-o", mha)
    x_row, kv_row = geometry(mha)
    assert all(2 * xr < kv_row for xr in x_row), (x_row, kv_row)
    none = run_kvpr(mha, 0, 40, 4, ["--kv-disk", str(tmp_path)])["kv"]
    full = run_kvpr(mha, 1000000, 40, 4, ["--kv-disk", str(tmp_path)])["kv"]
    assert none["payload_x_bytes"] == 0 and full["payload_kv_bytes"] == 0
    assert 2 * full["payload_x_bytes"] < none["payload_kv_bytes"]
    assert full["bytes_loaded"] < none["bytes_loaded"]  # the I/O itself (page-rounded) too


def test_split_zero_moves_no_inputs_while_decoding(tmp_path):
    """A decode step of kvpr at l = 0 moves exactly the bytes `layer` moves: it neither stores the new
    row's inputs nor loads the direct-I/O page of inputs around it (the inputs of the prompt, stored at
    prefill, are what a later split may use). `--recompute 0` takes the very path of `auto` choosing
    l = 0 (which auto does from the first measured step on at fast links; its first step, before the
    visit's other compute is measured, may recompute a few rows). Measured as the difference between
    runs of 10 and 2 generated tokens on a disk home, so that the prefill (one pass that stores the
    prompt's inputs) cancels."""
    mdl = model("smollm2")
    ids = ",".join(str(10 + (7 * i) % 250) for i in range(100))

    def kv(policy, n_gen):
        extra = ["--recompute", 0] if "kvpr" in policy else []
        p = run("run", "-m", mdl, "--ids", ids, "-n", n_gen, "--ignore-eos", "--chunk", 128, "-t", 2, "--json",
                "--kv-policy", policy, "--kv-disk", str(tmp_path), *extra)
        return json.loads(p.stdout)["kv"]

    short, long = kv("kvpr", 2), kv("kvpr", 10)
    lay_short, lay_long = kv("layer", 2), kv("layer", 10)
    assert long["recomputed_rows"] == 0 and long["payload_x_bytes"] == 0, long
    # The counters count executed jobs; the loads prefetched for a pass that never comes may or may not
    # have run when a run reports (one visit's load, < 30 pages here). Moving the inputs would add
    # 8 steps x 30 layers x a 4 KiB page each way (983,040 bytes); the bound is a quarter of that.
    slack = 2 * 30 * 4096
    for key in ("bytes_loaded", "bytes_stored"):
        extra = (long[key] - short[key]) - (lay_long[key] - lay_short[key])
        assert abs(extra) < slack, (key, extra, short, long, lay_short, lay_long)
    # the prompt's inputs were stored (so a later split could use them): more bytes than layer's prefill
    assert short["bytes_stored"] > lay_short["bytes_stored"]
