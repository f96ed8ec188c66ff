"""The approximate baselines on real models, measured where they trade accuracy (their degenerate
settings are rows of the exactness matrix, test_exactness.py):

* streaming (StreamingLLM): with 4 attention sinks, perplexity stays close to full attention although
  the cache keeps 128 of 1,024 positions; the same window without sinks degrades sharply (the paper's
  headline), so the sinks are attended, and attended at the right positions;
* its memory is bounded on every tier (Gemma-3: the global layers keep sinks + window + chunk);
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


def test_streaming_knob_errors():
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "streaming", check=False)
    assert p.returncode != 0 and "--window N, or --kv-budget N" in p.stderr, p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "streaming", "--kv-budget", 3,
            check=False)
    assert p.returncode != 0 and "--sinks" in p.stderr, p.stderr
    p = run("run", "-m", model("smollm2"), "-p", "x", "-n", 1, "--kv-policy", "streaming+sliding", "--window", 8,
            check=False)
    assert p.returncode != 0 and "two retention values" in p.stderr, p.stderr
