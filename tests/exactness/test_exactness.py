"""Exactness matrix: every exact KV policy (layer, headinfer with each group size) under each KV
budget (unlimited; the smallest that fits, found from the engine's own budget error; the smallest
with the KV master copy on disk) and each chunk size produces bit-identical logits at every
position and identical tokens to `resident` with the same chunk size. Prompts span several chunks.
Models: SmolLM2 (GQA 9/3), Gemma-3 (1 KV head, sliding-window layers, soft-capping off) and a
synthetic MHA model (4/4 heads)."""
import re
import subprocess
import sys
import pathlib

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import model, run  # noqa: E402

PROMPT = (
    "The tiered cache keeps the keys and values of every layer where they fit. Chapter one: the river "
    "bends twice before the old mill, and the miller counts the sacks each morning. " * 6
)
N_GEN = 6
CHUNKS = [37, 96]


def generate(tmp, mdl, chunk, extra, tag, prompt):
    npy = tmp / f"{tag}.npy"
    p = run("run", "-m", mdl, "-p", prompt, "-n", N_GEN, "--chunk", chunk, "--ctx", 1024, "-t", 2,
            "--ignore-eos", "--json", "--dump-logits", npy, *extra)
    import json
    j = json.loads(p.stdout)
    return j["tokens"], np.load(npy)


def smallest_kv_mem(mdl, chunk, extra):
    """The engine's own answer to 'how much compute memory does this placement need': run with a
    budget of 1 byte and read the needed bytes from the error."""
    p = run("run", "-m", mdl, "-p", "x", "-n", 1, "--chunk", chunk, "--ctx", 1024, "--kv-mem", 1, *extra,
            check=False)
    assert p.returncode == 1, p.stderr
    m = re.search(r"(\d+) bytes are needed", p.stderr)
    assert m, p.stderr
    return int(m.group(1))


def configs(n_kv_heads):
    out = [["--kv-policy", "layer"]]
    for g in sorted({n_kv_heads, 4, 2, 1}, reverse=True):
        if g <= n_kv_heads and n_kv_heads % g == 0:
            out.append(["--kv-policy", "headinfer", "--group", str(g)])
    out.append(["--kv-policy", "headinfer", "--group", "1", "--static-heads", "2", "--prefetch-depth", "2"])
    return out


@pytest.fixture(scope="module")
def synthetic_mha(tmp_path_factory):
    path = tmp_path_factory.mktemp("syn") / "mha.gguf"
    run("synth", "--preset", "tiny-mha", "--type", "q8_0", "-o", path)
    return path


def check_model(tmp_path, mdl, n_kv_heads, prompt=PROMPT):
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    n_checked = 0
    for chunk in CHUNKS:
        ref_tokens, ref_logits = generate(tmp_path, mdl, chunk, ["--kv-policy", "resident"], f"res{chunk}", prompt)
        assert ref_logits.shape[0] > 2 * chunk  # logits at every position of a prompt of several chunks
        for cfg in configs(n_kv_heads):
            small = smallest_kv_mem(mdl, chunk, cfg)
            for budget, extra in (("unlimited", []), ("smallest", ["--kv-mem", str(small)]),
                                  ("smallest+disk", ["--kv-mem", str(small), "--kv-disk", str(disk)])):
                tag = f"{'_'.join(cfg)}_{budget}_{chunk}".replace("-", "")
                tokens, logits = generate(tmp_path, mdl, chunk, cfg + extra, tag, prompt)
                what = f"{mdl.name} chunk={chunk} {' '.join(cfg)} budget={budget}"
                assert tokens == ref_tokens, what
                assert logits.shape == ref_logits.shape, what
                assert logits.tobytes() == ref_logits.tobytes(), f"{what}: logits differ"
                n_checked += 1
    assert list(disk.iterdir()) == [], "the disk tier left files behind"
    return n_checked


def test_smollm2(tmp_path):
    assert check_model(tmp_path, model("smollm2"), 3) >= 2 * 4 * 3


def test_gemma3(tmp_path):
    assert check_model(tmp_path, model("gemma3"), 1) >= 2 * 3 * 3


def test_synthetic_mha(tmp_path, synthetic_mha):
    # Byte-level vocabulary: one token per byte, so a shorter text spans the same chunks.
    assert check_model(tmp_path, synthetic_mha, 4, PROMPT[:400]) >= 2 * 5 * 3


def test_budget_errors(tmp_path):
    p = run("run", "-m", model("smollm2"), "-p", "hello", "-n", 1, "--ctx", 1024, "--kv-mem", "1MiB", check=False)
    assert p.returncode == 1
    assert "--kv-policy layer or headinfer" in p.stderr and "bytes" in p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "hello", "-n", 1, "--kv-disk", tmp_path, check=False)
    assert p.returncode == 1 and "offloaded policies" in p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "hello", "-n", 1, "--kv-policy", "headinfer", "--kv-disk",
            tmp_path / "missing", check=False)
    assert p.returncode == 1 and "not a directory" in p.stderr
