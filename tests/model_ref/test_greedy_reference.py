"""Greedy continuations of 64 tokens of both default models against the NumPy reference (issue #5),
without llama.cpp.

kvtier generates 64 greedy tokens (`kvtier run --temp 0 --ignore-eos --json`); the reference
(reference.py, on the same GGUF file) then runs teacher-forced over prompt + generated tokens in one
pass, and at each of the 64 generated positions its argmax must be kvtier's token. Teacher forcing
keeps both on the same sequence, so every position is checked even after a near-tie.

A position where the two differ is accepted only as a genuine near-tie, with the noise-floor
tolerance of test_reference_models.py's check_close: the reference's own logit of kvtier's token
is less than max(1, 1.5 x spread) below its top-1, where spread is the position's max |dlogit|
between the reference's f32 and f64-matmul runs (so its top-1/top-2 gap there is below that
tolerance too). The output gives, per prompt, the number of such tie-divergences and of the
positions that are near-ties at all (top-1/top-2 gap below the tolerance).

Cost: the reference models are dequantised once per process (most of the run time); two short
prompts per model, two reference passes (f32, f64) of about 75 tokens each.
"""
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "python"))
import kvtier_testlib as kt  # noqa: E402
from test_reference_models import CHUNK, MODELS, PROMPTS, numpy_forward, tie_tolerance  # noqa: E402

N_GEN = 64
GREEDY_PROMPTS = PROMPTS[:2]  # the short ones; the 85-token prompt is covered by the logits test


tolerance = tie_tolerance  # check_close's rule for a position the reference is sure of


def compare_greedy(ref32, ref64, n_prompt, generated):
    """Checks reference argmax against kvtier's greedy tokens at the generated positions.

    ref32, ref64: reference logits over prompt + generated[:-1] (f32 and f64 matmuls).
    Returns (tie_divergences, near_ties, failures): (position, logit gap, tolerance) where the tokens
    differ at a near-tie (positions 0-based in the continuation), the positions that are near-ties at
    all, and (position, message) for differences that are not near-ties.
    """
    gen = np.asarray(generated)
    ref = ref32[n_prompt - 1:]
    spread = np.abs(ref32 - ref64).max(axis=1)[n_prompt - 1:]
    assert ref.shape[0] == len(gen), (ref.shape, len(gen))
    tol = tolerance(spread)
    top = ref.argmax(axis=1)
    s = np.sort(ref, axis=1)
    margin = s[:, -1] - s[:, -2]
    below = ref[np.arange(len(gen)), top] - ref[np.arange(len(gen)), gen]  # how far kvtier's token is down
    ties, near, failures = [], np.nonzero(margin < tol)[0].tolist(), []
    for j in np.nonzero(top != gen)[0].tolist():
        if below[j] < tol[j]:
            ties.append((j, float(below[j]), float(tol[j])))
        else:
            failures.append((j, f"token {j}: kvtier {gen[j]}, reference {top[j]} "
                                f"({below[j]:.3f} logits above kvtier's; tolerance {tol[j]:.3f})"))
    return ties, near, failures


def test_compare_greedy_catches_a_wrong_token():
    """The check itself: a clear winner replaced by another token fails; a near-tie swap is accepted."""
    rng = np.random.default_rng(0)
    n_prompt, n = 3, 6
    ref = rng.normal(size=(n_prompt - 1 + n, 50)).astype(np.float32)
    ref[n_prompt - 1:, 7] = 10.0  # token 7 wins every generated position by far
    gen = [7] * n
    assert compare_greedy(ref, ref, n_prompt, gen) == ([], [], [])
    gen[2] = 8
    ties, _, failures = compare_greedy(ref, ref, n_prompt, gen)
    assert ties == [] and [j for j, _ in failures] == [2]
    ref[n_prompt - 1 + 4, 9] = 9.5  # a near-tie at position 4: either token is acceptable
    gen[4] = 9
    ties, near, failures = compare_greedy(ref, ref, n_prompt, gen)
    assert [j for j, _, _ in ties] == [4] and near == [4] and [j for j, _ in failures] == [2]


@pytest.mark.parametrize("name", MODELS)
def test_greedy_64_vs_numpy_reference(name, capsys):
    lines, bad = [], []
    for i, prompt in enumerate(GREEDY_PROMPTS):
        out = kt.run_json("run", "-m", kt.model(name), "-p", prompt, "-n", N_GEN, "--temp", 0, "--ignore-eos",
                          "--json", "--chunk", CHUNK, "--threads", 2)
        gen, n_prompt = out["tokens"], len(out["prompt_tokens"])
        assert len(gen) == N_GEN, f"{name} prompt {i}: {len(gen)} tokens generated"
        r32, r64 = numpy_forward(name, out["prompt_tokens"] + gen[:-1])
        ties, near, failures = compare_greedy(r32, r64, n_prompt, gen)
        at = ", ".join(f"{j} (gap {g:.2f} < {t:.2f})" for j, g, t in ties)
        lines.append(f"{name} prompt {i} ({n_prompt} tokens): {N_GEN - len(ties) - len(failures)}/{N_GEN} "
                     f"greedy tokens equal the reference's argmax; {len(ties)} differ at near-ties [{at}]; "
                     f"{len(near)} of the {N_GEN} positions are near-ties")
        bad += [f"{name} prompt {i}: {m}" for _, m in failures]
    with capsys.disabled():  # shown in ctest's output even when the test passes
        print("\n" + "\n".join(lines))
    assert not bad, "greedy token is not the reference's argmax (and no near-tie):\n" + "\n".join(bad)
