"""Locret on the offloaded placements (layer+locret, headinfer+locret; host and disk homes) on SmolLM2:
with a budget far below the prompt (evictions after every prefill chunk, and decode steps past the
b + n_loc + B reserved rows, which evict before the step), every placement gives the bits of
`resident+locret` with the same flags and heads file (every prompt position's output-normed state, the decode steps' logits, the tokens). The
heads are untrained (`train-locret --steps 0`): their scores decide evictions as trained ones would.
A decode step of layer+locret moves the rows held (b + n_loc + steps so far per layer and KV head),
not the context: checked from `run --json`'s bytes between two generation lengths.
The degenerate rows (a budget covering the context is the placement without locret) are rows of the
exactness matrix (test_exactness.py, DEGENERATE["locret"])."""
import json
import sys
import pathlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import model, run  # noqa: E402

PROMPT = (
    "The tiered cache keeps the keys and values of every layer where they fit. Chapter one: the river "
    "bends twice before the old mill, and the miller counts the sacks each morning. " * 14
)
BUDGET, TAIL, CHUNK = 64, 16, 37
LOCRET = ["--kv-budget", BUDGET, "--local-tail", TAIL, "--chunk", CHUNK]
# b + n_loc + B = 117 rows; the prefill leaves b + n_loc = 80: the 38th decode step evicts first.
N_GEN = 44


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    h = tmp_path_factory.mktemp("locret") / "smollm2.locret.gguf"
    run("train-locret", "-m", model("smollm2"), "-o", h, "--steps", 0, "--d-m", 16)
    return h


def generate(policy, heads, n_gen=N_GEN, extra=()):
    p = run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", n_gen, "--ctx", 1024, "-t", 2, "--ignore-eos",
            "--json", "--state-digest", "--kv-policy", policy, *LOCRET, "--locret-heads", heads, *extra)
    return json.loads(p.stdout)


def test_offloaded_placements_give_resident_locret_bits(heads, tmp_path):
    ref = generate("resident+locret", heads)
    assert ref["n_prompt"] > 4 * BUDGET
    plain = run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", N_GEN, "--ctx", 1024, "-t", 2, "--ignore-eos",
                "--json", "--state-digest", "--kv-policy", "resident", "--chunk", CHUNK)
    # the budget evicts (or the rows below could not fail)
    assert json.loads(plain.stdout)["state_digest"] != ref["state_digest"]
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    rows = [
        ["--kv-policy", "layer+locret"],
        ["--kv-policy", "layer+locret", "--kv-disk", disk],
        ["--kv-policy", "headinfer+locret", "--group", 1],
        ["--kv-policy", "headinfer+locret", "--group", 1, "--static-heads", 2, "--prefetch-depth", 2, "--kv-disk", disk],
        ["--kv-policy", "headinfer+locret", "--group", 3, "--kv-disk", disk],
    ]
    for r in rows:
        got = generate(r[1], heads, extra=r[2:])
        what = " ".join(map(str, r))
        assert got["tokens"] == ref["tokens"], what
        assert got["state_digest"] == ref["state_digest"], what
        assert got["logits_digest"] == ref["logits_digest"], what
        assert got["kv"]["bytes_loaded"] > 0, what
    assert list(disk.iterdir()) == [], "the disk tier left files behind"


def test_decode_steps_move_the_rows_held(heads):
    """payload_kv_bytes counts the K/V rows of past positions each unit visit used: between -n 4 and
    -n 12 exactly the rows held per step (b + n_loc, then one more per step) of 30 layers x 3 KV heads,
    64-dim f16 K and V; the loads moved them in pages, a fraction of what `layer` moves."""
    n1, n2 = 4, 12
    a, b = generate("layer+locret", heads, n1), generate("layer+locret", heads, n2)
    row = 30 * 3 * (64 + 64) * 2
    # -n N runs N - 1 decode passes; pass s (from 0) attends b + n_loc + s rows held
    held = [BUDGET + TAIL + s for s in range(n1 - 1, n2 - 1)]
    assert b["kv"]["payload_kv_bytes"] - a["kv"]["payload_kv_bytes"] == sum(held) * row
    loaded = b["kv"]["bytes_loaded"] - a["kv"]["bytes_loaded"]
    steps = n2 - n1
    # each plane's rows load as whole 4 KiB pages: at most one page more per plane and step
    assert loaded <= sum(held) * row + steps * 30 * 3 * 2 * 4096
    la = run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", n1, "--ctx", 1024, "-t", 2, "--ignore-eos",
             "--json", "--kv-policy", "layer", "--chunk", CHUNK)
    lb = run("run", "-m", model("smollm2"), "-p", PROMPT, "-n", n2, "--ctx", 1024, "-t", 2, "--ignore-eos",
             "--json", "--kv-policy", "layer", "--chunk", CHUNK)
    plain = json.loads(lb.stdout)["kv"]["bytes_loaded"] - json.loads(la.stdout)["kv"]["bytes_loaded"]
    assert loaded * 3 < plain, (loaded, plain)


def test_unsupported_combinations_name_themselves(heads):
    for spec, word in [("layer+locret+kivi4", "kivi4"), ("layer+locret+quest", "quest")]:
        p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", spec, *LOCRET,
                "--locret-heads", heads, check=False)
        assert p.returncode != 0
        assert word in p.stderr, p.stderr


def test_pooled_scores_evict_alike_on_every_placement(heads, tmp_path):
    """--locret-pool 5 (a unit ranks by the best score of 5 neighbours): the offloaded placements share
    the eviction rule with resident+locret, so they give its bits; and pooling changes what is kept."""
    ref = generate("resident+locret", heads, extra=["--locret-pool", 5])
    assert ref["state_digest"] != generate("resident+locret", heads)["state_digest"]
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    for r in (["layer+locret"], ["headinfer+locret", "--group", 1, "--kv-disk", disk]):
        got = generate(r[0], heads, extra=[*r[1:], "--locret-pool", 5])
        assert got["state_digest"] == ref["state_digest"], r
        assert got["tokens"] == ref["tokens"], r
    for bad in (0, 2):
        p = run("run", "-m", model("smollm2"), "-p", "hi", "-n", 1, "--kv-policy", "locret", "--kv-budget", 64,
                "--locret-heads", heads, "--locret-pool", bad, check=False)
        assert p.returncode == 1 and "--locret-pool" in p.stderr, p.stderr


def test_spans_evict_alike_on_every_placement(heads, tmp_path):
    """--locret-span word and number (a word or a number ranks by the best score of its tokens, so it is
    kept or evicted whole): each changes what is kept (the prompt below has words of several tokens
    and numbers split into digits), and the offloaded placements give resident+locret's bits under
    each, a decode step past the reserved rows included."""
    prompt = PROMPT + "The mill's ledger reads 4466196 sacks in 1872, 2644146 in 1873. " * 3
    def gen(policy, extra=()):
        p = run("run", "-m", model("smollm2"), "-p", prompt, "-n", N_GEN, "--ctx", 1024, "-t", 2, "--ignore-eos",
                "--json", "--state-digest", "--kv-policy", policy, *LOCRET, "--locret-heads", heads, *extra)
        return json.loads(p.stdout)

    token = gen("resident+locret")
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    digests = {json.dumps(token["state_digest"])}
    for span in ("word", "number"):
        ref = gen("resident+locret", ["--locret-span", span])
        digests.add(json.dumps(ref["state_digest"]))
        for r in (["layer+locret"], ["headinfer+locret", "--group", 1, "--static-heads", 1, "--kv-disk", disk]):
            got = gen(r[0], [*r[1:], "--locret-span", span])
            what = " ".join(map(str, [*r, span]))
            assert got["tokens"] == ref["tokens"], what
            assert got["state_digest"] == ref["state_digest"], what
            assert got["logits_digest"] == ref["logits_digest"], what
    assert len(digests) == 3, "each span rule keeps other rows"
    p = run("run", "-m", model("smollm2"), "-p", "hi", "-n", 1, "--kv-policy", "locret", "--kv-budget", 64,
            "--locret-heads", heads, "--locret-span", "sentence", check=False)
    assert p.returncode == 2 and "--locret-span sentence: expected token, word or number" in p.stderr, p.stderr


def test_rerotated_keys_evict_alike_on_every_placement(heads, tmp_path):
    """--locret-keys rerotate keeps no key before RoPE: a kept key that an eviction moves from row r to
    row w is its stored key turned by w - r. Every placement gives resident+locret's bits in that mode;
    the mode changes the bits (one more rounding of a moved key) but not the prompt's tokens kept; and the
    KV memory shrinks by exactly the pre-RoPE copies: b + n_loc + B = 117 rows x 30 layers x 3 KV heads
    x 64 f16."""
    rr = ["--locret-keys", "rerotate"]
    ref = generate("resident+locret", heads, extra=rr)
    pre = generate("resident+locret", heads)
    assert ref["state_digest"] != pre["state_digest"]
    copies = (BUDGET + TAIL + CHUNK) * 30 * 3 * 64 * 2
    assert pre["kv"]["kv_bytes_peak"] - ref["kv"]["kv_bytes_peak"] == copies
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    for r in (["layer+locret"], ["layer+locret", "--kv-disk", disk],
              ["headinfer+locret", "--group", 1, "--static-heads", 1, "--kv-disk", disk]):
        got = generate(r[0], heads, extra=[*r[1:], *rr])
        what = " ".join(map(str, r))
        assert got["tokens"] == ref["tokens"], what
        assert got["state_digest"] == ref["state_digest"], what
        assert got["logits_digest"] == ref["logits_digest"], what
        # the offloaded placements keep the copies (or none) beside the home tier, in host memory
        assert generate(r[0], heads, n_gen=1, extra=r[1:])["kv"]["kv_bytes_peak"] - \
            generate(r[0], heads, n_gen=1, extra=[*r[1:], *rr])["kv"]["kv_bytes_peak"] == copies, what
    p = run("run", "-m", model("smollm2"), "-p", "hi", "-n", 1, "--kv-policy", "locret", "--kv-budget", 64,
            "--locret-heads", heads, "--locret-keys", "postrope", check=False)
    assert p.returncode == 2 and "--locret-keys postrope: expected prerope or rerotate" in p.stderr, p.stderr  # usage


def test_sinks_and_sliding_layers_evict_alike_on_every_placement(tmp_path):
    """Gemma-3 (15 of its 18 layers have a sliding window of their own): --locret-sliding recent (the
    default; those layers keep their most recent rows) and scored (the heads' best, as a global layer)
    give different bits, and --locret-sinks 8 (the prompt's first 8 tokens never evicted) changes them
    again; the offloaded placements give resident+locret's bits under each rule."""
    heads = tmp_path / "gemma3.locret.gguf"
    run("train-locret", "-m", model("gemma3"), "-o", heads, "--steps", 0, "--d-m", 16)

    def gen(policy, extra=()):
        p = run("run", "-m", model("gemma3"), "-p", PROMPT, "-n", 24, "--ctx", 1024, "-t", 2, "--ignore-eos",
                "--json", "--state-digest", "--kv-policy", policy, *LOCRET, "--locret-heads", heads, *extra)
        return json.loads(p.stdout)

    recent = gen("resident+locret")
    assert recent["n_prompt"] > 4 * BUDGET
    scored = gen("resident+locret", ["--locret-sliding", "scored"])
    sinks = gen("resident+locret", ["--locret-sinks", 8])
    assert len({json.dumps(d["state_digest"]) for d in (recent, scored, sinks)}) == 3
    disk = tmp_path / "kvdisk"
    disk.mkdir()
    for ref, extra in ((scored, ["--locret-sliding", "scored"]), (sinks, ["--locret-sinks", 8])):
        for r in (["layer+locret"], ["headinfer+locret", "--group", 1, "--kv-disk", disk]):
            got = gen(r[0], [*r[1:], *extra])
            what = " ".join(map(str, [*r, *extra]))
            assert got["state_digest"] == ref["state_digest"], what
            assert got["tokens"] == ref["tokens"], what
    p = run("run", "-m", model("gemma3"), "-p", "hi", "-n", 1, "--kv-policy", "locret", "--kv-budget", 64,
            "--locret-heads", heads, "--locret-sliding", "window", check=False)
    assert p.returncode == 2 and "--locret-sliding window: expected recent or scored" in p.stderr, p.stderr
    p = run("run", "-m", model("gemma3"), "-p", "hi", "-n", 1, "--kv-policy", "locret", "--kv-budget", 64,
            "--locret-heads", heads, "--locret-sinks", 60, check=False)
    assert p.returncode == 1 and "--locret-sinks 60 and --stabilizers 16" in p.stderr, p.stderr
