"""The approximate baselines on real models, measured where they trade accuracy (their degenerate
settings are rows of the exactness matrix, test_exactness.py):

* streaming (StreamingLLM): with 4 attention sinks, perplexity stays close to full attention although
  the cache keeps 128 of 1,024 positions; the same window without sinks degrades sharply (the paper's
  headline), so the sinks are attended, and attended at the right positions;
* its memory is bounded on every tier (Gemma-3: the global layers keep sinks + window + chunk);
* h2o (heavy hitters + recent rows per KV head): perplexity degrades gracefully as the budget shrinks
  and its KV stays within the budget;
* bad knobs are clear errors."""
import json
import sys
import pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from kvtier_testlib import SOURCE_DIR, model, run  # noqa: E402

TEXT = SOURCE_DIR / "tests" / "model_ref" / "data" / "declaration.txt"


def ppl(*policy):
    p = run("perplexity", "-m", model("smollm2"), "-f", TEXT, "--ctx", 1024, "--chunk", 64, "-t", 2, "--json",
            "--kv-policy", *policy)
    return json.loads(p.stdout)["perplexity"]


def test_streaming_sinks_keep_perplexity_and_a_bare_window_does_not():
    full = ppl("resident")
    sinks = ppl("streaming", "--sinks", 4, "--window", 124)
    bare = ppl("streaming", "--sinks", 0, "--window", 128)
    budget = ppl("layer+streaming", "--kv-budget", 128)  # sinks 4 (default) + window 124, offloaded
    assert sinks < full * 1.03, (full, sinks)
    assert bare > full * 1.5, (full, bare)
    assert budget == sinks, (budget, sinks)  # same policy, another placement: the same bits


def test_streaming_bounds_the_kv_on_every_tier(tmp_path):
    prompt = "The river bends twice before the old mill, and the miller counts the sacks. " * 150

    def kv(policy, *extra):
        p = run("run", "-m", model("gemma3"), "-p", prompt, "-n", 2, "--ctx", 4096, "-t", 2, "--json",
                "--kv-policy", policy, *extra)
        j = json.loads(p.stdout)
        assert j["kv"]["policy"] == policy
        return j["peak_memory_bytes"]

    full, stream = kv("resident"), kv("resident+streaming", "--window", 252)
    assert stream["device"]["kv"] < full["device"]["kv"] / 2, (full["device"], stream["device"])
    full, stream = kv("layer", "--kv-disk", tmp_path), kv("layer+streaming", "--window", 252, "--kv-disk", tmp_path)
    assert stream["disk"]["kv"] < full["disk"]["kv"] / 2, (full["disk"], stream["disk"])


def test_h2o_degrades_gracefully_with_the_budget():
    full = ppl("resident")
    b256, b128 = ppl("h2o", "--kv-budget", 256), ppl("h2o", "--kv-budget", 128)
    assert b256 < full * 1.05, (full, b256)
    assert full < b256 < b128 < full * 1.3, (full, b256, b128)


def test_h2o_holds_its_budget_and_refuses_offloading():
    prompt = "The river bends twice before the old mill, and the miller counts the sacks. " * 60

    def kv(*policy):
        p = run("run", "-m", model("smollm2"), "-p", prompt, "-n", 2, "--ctx", 2048, "-t", 2, "--json",
                "--kv-policy", *policy)
        return json.loads(p.stdout)["peak_memory_bytes"]["device"]["kv"]

    assert kv("h2o", "--kv-budget", 128) < kv("resident") / 3
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "layer+h2o", "--kv-budget", 64,
            check=False)
    assert p.returncode != 0 and "resident placement" in p.stderr, p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "h2o", check=False)
    assert p.returncode != 0 and "needs --kv-budget" in p.stderr, p.stderr


def test_streaming_knob_errors():
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "streaming", check=False)
    assert p.returncode != 0 and "--window N, or --kv-budget N" in p.stderr, p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "streaming", "--kv-budget", 3,
            check=False)
    assert p.returncode != 0 and "--sinks" in p.stderr, p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "streaming+sliding", "--window", 8,
            check=False)
    assert p.returncode != 0 and "two retention values" in p.stderr, p.stderr


def test_quest_decode_and_knob_errors():
    prompt = "The river bends twice before the old mill, and the miller counts the sacks each morning. " * 8

    def tokens(*policy):
        p = run("run", "-m", model("smollm2"), "-p", prompt, "-n", 8, "--ctx", 1024, "-t", 2, "--ignore-eos", "--json",
                "--kv-policy", *policy)
        return json.loads(p.stdout)["tokens"]

    full = tokens("resident")
    assert tokens("quest", "--kv-budget", 1024) == full  # every page: the resident tokens
    assert tokens("quest", "--kv-budget", 16, "--quest-page", 16) != full  # one page per step: it shows

    def kv(*policy):
        p = run("run", "-m", model("smollm2"), "-p", prompt, "-n", 8, "--ctx", 1024, "-t", 2, "--ignore-eos", "--json",
                "--kv-policy", *policy)
        return json.loads(p.stdout)["kv"]

    # Offloaded: the decode steps load the selected pages only (the prefill's loads are the placement's).
    lay, q = kv("layer"), kv("layer+quest", "--kv-budget", 64)
    assert 0 < q["quest"]["rows_fetched"] < q["quest"]["rows_total"] / 2, q["quest"]
    assert q["quest"]["selective_loads"] > 0 and q["bytes_loaded"] < lay["bytes_loaded"], (q, lay)
    for flags, words in ((["--kv-policy", "quest"], "needs --kv-budget"),
                         (["--kv-policy", "layer+kivi4+quest", "--kv-budget", 64], "does not combine"),
                         (["--kv-policy", "quest", "--kv-budget", 64, "--quest-page", 24], "must divide")):
        p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, *flags, check=False)
        assert p.returncode != 0 and words in p.stderr, (flags, p.stderr)

