"""kvtier against llama.cpp's recorded results on the same GGUF files (data/llamacpp_golden.json, made by
llamacpp_golden.py with llama-cpp-python; see there). Runs in CI, where llama.cpp is not built:
  * perplexity over data/declaration.txt (windows of 256) within 1 % of llama.cpp's, same scored count;
  * greedy continuations of 64 tokens: the prompt tokenises to the same ids, and the continuation equals
    llama.cpp's token for token on the first prompt of each model; on the others the two engines may part
    only at a near-tie: a step where our token is among llama.cpp's top 8 and less than 1 logit below its
    choice (test_reference_models.py explains the noise floor: 2-8 logits of spread on these files).
The golden file names the model files' SHA-256; a different file is an error, not a pass. With
llama-cpp-python installed, test_golden_file_is_current re-runs llama.cpp and checks the recorded values.
"""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "python"))
import kvtier_testlib as kt  # noqa: E402
import llamacpp_golden as lg  # noqa: E402
from test_reference_models import MODELS, PROMPTS, DATA, CHUNK  # noqa: E402

GOLDEN = json.loads(lg.GOLDEN.read_text())
NEAR_TIE = 1.0  # logits

try:
    import llama_cpp  # noqa: F401

    HAVE_LLAMA_CPP = True
except ImportError:
    HAVE_LLAMA_CPP = False

_checked = set()


def golden(name):
    g = GOLDEN["models"][name]
    if name not in _checked:
        path = pathlib.Path(kt.model(name))
        assert path.stat().st_size == g["size"] and lg.sha256(path) == g["sha256"], (
            f"{path} is not the file data/llamacpp_golden.json was made from; re-run llamacpp_golden.py")
        _checked.add(name)
    return g


@pytest.mark.parametrize("name", MODELS)
def test_perplexity_within_one_percent_of_llama_cpp(name):
    ref = golden(name)["perplexity"]
    ours = kt.run_json("perplexity", "-m", kt.model(name), "-f", DATA / "declaration.txt", "--ctx", ref["n_ctx"],
                       "--threads", 2, "--json")
    print(f"{name}: perplexity ours {ours['perplexity']:.4f} llama.cpp {ref['perplexity']:.4f} "
          f"({ours['perplexity'] / ref['perplexity'] - 1:+.2%})")
    assert ours["n_windows"] == ref["n_windows"] and ours["n_scored"] == ref["n_scored"]
    assert abs(ours["perplexity"] / ref["perplexity"] - 1) <= 0.01


def parting(ours_tokens, ref):
    """None if the continuations are equal, else (step, gap): the first step where they differ and how
    far below llama.cpp's choice our token is in llama.cpp's own logits there (inf if not in its top 8)."""
    j = next((j for j, (a, b) in enumerate(zip(ref["tokens"], ours_tokens)) if a != b), None)
    if j is None:
        return None
    top = ref["top"][j]
    logit = dict(zip(top["ids"], top["logits"]))
    gap = top["logits"][0] - logit[ours_tokens[j]] if ours_tokens[j] in logit else float("inf")
    return j, gap


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_greedy_continuation_matches_llama_cpp(name, prompt):
    ref = golden(name)["greedy"][prompt]
    out = kt.run_json("run", "-m", kt.model(name), "-p", PROMPTS[prompt], "-n", lg.N_GEN, "--temp", 0,
                      "--ignore-eos", "--json", "--chunk", CHUNK, "--threads", 2)
    assert out["prompt_tokens"] == ref["prompt_tokens"]
    assert len(out["tokens"]) == lg.N_GEN
    part = parting(out["tokens"], ref)
    if part is None:
        print(f"{name} prompt {prompt}: 64 greedy tokens identical to llama.cpp's")
        return
    j, gap = part
    print(f"{name} prompt {prompt}: parts from llama.cpp at token {j}, {gap:.3f} logits below its choice")
    assert prompt != 0, f"{name}: greedy continuation differs from llama.cpp at token {j} (gap {gap:.3f})"
    assert gap < NEAR_TIE, f"{name} prompt {prompt}: token {j} is {gap:.3f} logits below llama.cpp's choice"


def test_parting_rule_can_fail():
    ref = {"tokens": [1, 2, 3], "top": [{}, {}, {"ids": [3, 7, 9], "logits": [5.0, 4.5, 1.0]}]}
    assert parting([1, 2, 3], ref) is None
    assert parting([1, 2, 7], ref) == (2, 0.5)
    assert parting([1, 2, 9], ref) == (2, 4.0)
    assert parting([1, 2, 8], ref) == (2, float("inf"))


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python not installed (scripts/setup.sh --with-llama-cpp)")
def test_golden_file_is_current():
    import llama_cpp
    assert GOLDEN["llama_cpp_python"] == llama_cpp.__version__
    for name in MODELS:
        g = golden(name)
        path = kt.model(name)
        ppl = lg.perplexity(path, (DATA / "declaration.txt").read_text())
        assert ppl["n_scored"] == g["perplexity"]["n_scored"]
        assert abs(ppl["perplexity"] / g["perplexity"]["perplexity"] - 1) <= 1e-4
        assert lg.greedy(path, PROMPTS[0])["tokens"] == g["greedy"][0]["tokens"]
