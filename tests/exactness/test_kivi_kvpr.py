"""KIVI with KVPR's recomputed part (representation kivi4+kvpr / kivi2+kvpr, docs/policies.md): a visit
recomputes the K/V of a prefix of whole key groups from the stored inputs and quantises them as the home
copy was quantised, so the attention reads the same bits as the KIVI representation alone. Every row
here is held to `<placement>+kivi4` (kivi2) without kvpr, bit for bit (digests of every prompt position's output-normed state, each decode step's logits,
and the tokens): forced splits of none, one that is not group-aligned (100 -> 96), one that crosses a
256-token block (300 -> 288), all, and a pseudo-random one per visit; layer and headinfer; host and
--kv-disk homes; the smallest --kv-mem; +sliding on Gemma-3. The prompts outgrow the residual window many times over, so most
positions are quantised. Without the re-quantisation the recomputed groups' quantised bytes are not
what the home holds and these rows differ (checked once by hand, docs/policies.md)."""
import json
import pathlib
import re
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import model, run  # noqa: E402

GROUP, RESIDUAL = 32, 64
N_GEN = 6
CHUNK = 96
KIVI = ["--kivi-group", str(GROUP), "--kivi-residual", str(RESIDUAL)]


def ids(n):
    return ",".join(str(10 + (7 * i) % 250) for i in range(n))  # within a small synthetic vocabulary


def generate(mdl, n_prompt, flags):
    p = run("run", "-m", mdl, "--ids", ids(n_prompt), "-n", N_GEN, "--chunk", CHUNK, "--ctx", 1024, "-t", 2,
            "--ignore-eos", "--json", "--state-digest", *KIVI, *flags)
    j = json.loads(p.stdout)
    assert len(j["state_digest"]) == n_prompt and len(j["logits_digest"]) == N_GEN - 1
    j["digests"] = j["state_digest"] + j["logits_digest"]  # every position: prompt states, decode logits
    return j


def smallest_kv_mem(mdl, flags):
    """The engine's own smallest --kv-mem for these flags (from its budget error)."""
    p = run("run", "-m", mdl, "-p", "x", "-n", 1, "--chunk", CHUNK, "--ctx", 1024, "--kv-mem", 1, *KIVI, *flags,
            check=False)
    assert p.returncode == 1, p.stderr
    m = re.search(r"(\d+) bytes are needed", p.stderr)
    assert m, p.stderr
    return int(m.group(1))


def quantised_end(length):
    out = length - RESIDUAL
    return out // GROUP * GROUP if out > 0 else 0


def check(mdl, n_prompt, rows, tmp_path):
    """rows: (reference representation, flags of the kivi+kvpr row, forced split or None)."""
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    refs = {}
    for ref, flags, forced in rows:
        if ref not in refs:
            refs[ref] = generate(mdl, n_prompt, ["--kv-policy", f"layer+{ref}"])
        want = refs[ref]
        flags = [str(disk) if f == "@DISK" else f for f in flags]
        if "@SMALLEST" in flags:
            flags = [f for f in flags if f != "@SMALLEST"]
            flags += ["--kv-mem", str(smallest_kv_mem(mdl, flags))]
        j = generate(mdl, n_prompt, flags)
        what = f"{mdl.name} {' '.join(flags)}"
        assert j["tokens"] == want["tokens"], what
        diff = next((i for i, (a, b) in enumerate(zip(j["digests"], want["digests"])) if a != b), None)
        assert diff is None, f"{what}: logits differ from position {diff}"
        kv = j["kv"]
        # whole key groups, never past the quantised rows (the residual window's f16 rows are loaded)
        assert all(s % GROUP == 0 for s in kv["splits"]), (what, kv["splits"])
        last_past = n_prompt + N_GEN - 2  # positions before the last decode step
        if forced is not None:
            assert kv["split"] == min(forced // GROUP * GROUP, quantised_end(last_past)), (what, kv["split"])
        if forced != 0:  # the row really recomputed (and re-quantised) something
            assert kv["recomputed_rows"] > 0 and kv["payload_x_bytes"] > 0, (what, kv)
        else:
            assert kv["recomputed_rows"] == 0 and kv["payload_x_bytes"] == 0, (what, kv)
    assert list(disk.iterdir()) == [], "the disk tier left files behind"


def test_smollm2(tmp_path):
    """SmolLM2 (GQA 9/3, Q4_1: Q8 input rows), a 700-token prompt: quantised rows in three blocks."""
    rows = [
        ("kivi4", ["--kv-policy", "layer+kivi4+kvpr", "--recompute", "0"], 0),
        ("kivi4", ["--kv-policy", "layer+kivi4+kvpr", "--recompute", "100"], 100),
        ("kivi4", ["--kv-policy", "layer+kivi4+kvpr", "--recompute", "1000000"], 1000000),
        ("kivi4", ["--kv-policy", "layer+kivi4+kvpr", "--recompute", "300", "--kv-disk", "@DISK", "@SMALLEST"], 300),
        ("kivi4", ["--kv-policy", "headinfer+kivi4+kvpr", "--group", "1", "--recompute", "random", "--kv-disk",
                   "@DISK"], None),
        ("kivi2", ["--kv-policy", "headinfer+kivi2+kvpr", "--group", "1", "--recompute", "300"], 300),
    ]
    check(model("smollm2"), 700, rows, tmp_path)


def test_synthetic_mha(tmp_path):
    """The synthetic MHA model (4/4 heads, Q8_0): input rows smaller than the K/V they replace."""
    mha = tmp_path / "mha.gguf"
    run("synth", "--preset", "tiny-mha", "--type", "q8_0", "-o", mha)
    rows = [
        ("kivi4", ["--kv-policy", "layer+kivi4+kvpr", "--recompute", "0", "--kv-disk", "@DISK"], 0),
        ("kivi4", ["--kv-policy", "layer+kivi4+kvpr", "--recompute", "100", "--kv-disk", "@DISK"], 100),
        ("kivi4", ["--kv-policy", "headinfer+kivi4+kvpr", "--group", "1", "--recompute", "1000000"], 1000000),
        ("kivi2", ["--kv-policy", "layer+kivi2+kvpr", "--recompute", "random", "@SMALLEST"], None),
        ("kivi2", ["--kv-policy", "headinfer+kivi2+kvpr", "--group", "2", "--recompute", "300", "--kv-disk",
                   "@DISK"], 300),
    ]
    check(mha, 600, rows, tmp_path)


def test_gemma3_sliding(tmp_path):
    """Gemma-3 (1 KV head, Q4_K: Q8_K input rows, 512-token sliding windows): an 800-token prompt, so
    +sliding frees the local layers' first blocks and their split counts from the first visible row."""
    rows = [
        ("kivi4+sliding", ["--kv-policy", "layer+kivi4+kvpr+sliding", "--recompute", "300", "--kv-disk", "@DISK"],
         300),
    ]
    check(model("gemma3"), 800, rows, tmp_path)


@pytest.mark.parametrize("spec,error", [
    ("resident+kivi4+kvpr", "not resident+kivi4+kvpr"),
    ("layer+kivi4+hybrid", "the one pair that composes is kivi4 or kivi2 with kvpr"),
    ("layer+kivi4+kvpr+kivi2", "'kivi4+kvpr' and 'kivi2'"),
    ("headinfer+kivi2+kvpr+quest", "kvpr combines with selection all, not quest"),
])
def test_refused(spec, error):
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", spec, "--kv-budget", 64, check=False)
    assert p.returncode != 0 and error in p.stderr, p.stderr
