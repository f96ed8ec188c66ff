"""The real default models (SmolLM2-135M Q4_1, Gemma-3-270M Q4_K_M) against independent references
on the same GGUF file: the NumPy reference of reference.py (always) and llama.cpp through
llama-cpp-python (when installed: scripts/setup.sh --with-llama-cpp).

Tolerance. Quantised-weight kernels (ours, llama.cpp's, and the reference's act_quant mode) round
every activation entering a matmul to 8-bit blocks; a last-bit difference upstream flips a rounding,
and the flips compound over the layers and positions. Measured on these files: the NumPy reference
with f32 vs f64 matmuls differs from itself by up to 8 logits on the 85-token prompt (per-position
KL up to 0.44, mean 0.03), llama.cpp vs the reference similarly, kvtier vs the reference by up to
7.7 (KL up to 0.41, mean 0.032); on the short prompts about 10x less. So max |dlogit| <=
1e-2 is out of reach for any two correct engines on these files. The tolerance is therefore set
against the reference's own noise floor, measured at test time on the same tokens (f32 vs f64 run):
  * mean KL(ref || ours) <= 2 x mean KL(ref32 || ref64) + 0.002,
  * max KL <= 3 x max KL(ref32 || ref64) + 0.02,
  * same top-1 wherever the reference's top-2 margin is >= max(1, 1.5 x the f32-f64 logit spread).
A subtle bug is far outside it: Gemma-3's sliding layers with the global RoPE base give mean KL
0.09 where the floor is 0.003. The exact (1e-3) structural check of every architecture is
test_reference_tiny.py (f32 weights). Perplexity (llama-perplexity's method, windows of 256 over
tests/model_ref/data/declaration.txt) must be within 4 % of llama.cpp's (762 scored tokens carry a
sampling noise of about 1 % between correct engines: test_llamacpp_golden.py), and within 3 % of the
NumPy reference's (which itself is 2.7 % from llama.cpp's on Gemma-3, 0.6 % on SmolLM2).
Greedy continuations of 64 tokens may part from llama.cpp's own greedy generation only at a near-tie
(every prompt: another summation order, another ISA path, flips one), checked to be a position where
llama.cpp's own logits put our token less than 1 logit below its choice (the noise floor's logit
spread there is 2-8 logits; observed gaps 0.05-0.49).
"""
import json
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "python"))
import kvtier_testlib as kt  # noqa: E402
import reference  # noqa: E402
import llamacpp_golden  # noqa: E402
from llamacpp_golden import log_softmax  # noqa: E402

try:
    import llama_cpp  # noqa: F401

    HAVE_LLAMA_CPP = True
except ImportError:  # optional reference
    HAVE_LLAMA_CPP = False

DATA = pathlib.Path(__file__).parent / "data"
TEXT = (DATA / "declaration.txt").read_text()
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    TEXT[:420],  # about 85 tokens: longer than the chunk below
]
CHUNK = 32
N_LOGITS = 16  # generated tokens whose logits are compared too
N_GEN = 64  # greedy continuation compared with llama.cpp
MODELS = ["smollm2", "gemma3"]
# Against llama.cpp (live here, recorded in test_llamacpp_golden.py; the figures behind both are there):
NEAR_TIE = 1.0  # a greedy continuation may part from llama.cpp's where its token is < this below llama.cpp's
PPL_TOL_LLAMA_CPP = 0.04  # perplexity over declaration.txt (762 tokens): relative, sampling noise included

_ref_cache = {}


def numpy_ref(name):
    if name not in _ref_cache:
        _ref_cache[name] = reference.Model(str(kt.model(name)))
    return _ref_cache[name]


_fwd_cache = {}


def numpy_forward(name, ids):
    """(f32, f64-matmul) reference logits of a sequence; cached (tests share sequences)."""
    key = (name, tuple(ids))
    if key not in _fwd_cache:
        m = numpy_ref(name)
        r32 = m.forward(ids)
        m.matmul_f64 = True
        try:
            r64 = m.forward(ids)
        finally:
            m.matmul_f64 = False
        _fwd_cache[key] = (r32, r64)
    return _fwd_cache[key]


def kl_div(p_logits, q_logits):
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def tie_tolerance(spread):
    """Top-1 margin below which the reference cannot tell its top tokens apart (spread: its f32-f64
    max |dlogit| at that position)."""
    return np.maximum(1.0, 1.5 * spread)


def check_close(ours, ref, floor, spread, what):
    """floor: per-position KL of the reference against a second opinion (its own f64 run);
    spread: per-position max |dlogit| between the two."""
    kl = kl_div(ref, ours)
    s = np.sort(ref, axis=1)
    sure = s[:, -1] - s[:, -2] >= tie_tolerance(spread)
    top1 = ours.argmax(axis=1) == ref.argmax(axis=1)
    print(f"{what}: max|d| {np.abs(ours - ref).max():.3f} KL max {kl.max():.4f} mean {kl.mean():.5f} "
          f"(floor max {floor.max():.4f} mean {floor.mean():.5f}), top-1 agree {top1.mean():.3f}")
    assert kl.mean() <= 2 * floor.mean() + 0.002, f"{what}: mean KL {kl.mean():.5f}"
    assert kl.max() <= 3 * floor.max() + 0.02, f"{what}: KL {kl.max():.4f} at position {kl.argmax()}"
    assert top1[sure].all(), f"{what}: top-1 differs at positions {np.nonzero(sure & ~top1)[0].tolist()}"


def run_greedy(name, prompt, tmp_path, chunk=CHUNK, n=N_GEN):
    dump = tmp_path / "logits.npy"
    out = kt.run_json("run", "-m", kt.model(name), "-p", prompt, "-n", n, "--temp", 0, "--ignore-eos", "--json",
                      "--chunk", chunk, "--threads", 2, "--dump-logits", dump)
    ours = np.load(dump)
    ids = out["prompt_tokens"] + out["tokens"][:-1]
    assert ours.shape == (len(ids), ours.shape[1])
    return out, ids, ours


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_logits_vs_numpy_reference(name, prompt, tmp_path):
    out, ids, ours = run_greedy(name, PROMPTS[prompt], tmp_path, n=N_LOGITS)
    if prompt == 2:
        assert len(out["prompt_tokens"]) > CHUNK
    ref, ref64 = numpy_forward(name, ids)
    check_close(ours, ref, kl_div(ref, ref64), np.abs(ref - ref64).max(axis=1), f"{name} prompt {prompt} vs numpy")


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python not installed (scripts/setup.sh --with-llama-cpp)")
@pytest.mark.parametrize("name", MODELS)
def test_logits_and_greedy_vs_llama_cpp(name, tmp_path):
    llm = llama_cpp.Llama(model_path=str(kt.model(name)), n_ctx=512, n_batch=512, logits_all=True, n_threads=2,
                          verbose=False)
    for i, prompt in enumerate(PROMPTS):
        out, ids, ours = run_greedy(name, prompt, tmp_path, n=N_LOGITS)
        assert llm.tokenize(prompt.encode(), add_bos=True, special=False) == out["prompt_tokens"]
        llm.reset()
        llm.eval(ids)
        ref = np.array(llm.scores[:len(ids)], dtype=np.float32)
        r32, r64 = numpy_forward(name, ids)
        floor = np.maximum(kl_div(r32, r64), kl_div(r32, ref))
        spread = np.maximum(np.abs(r32 - r64).max(axis=1), np.abs(r32 - ref).max(axis=1))
        check_close(ours, ref, floor, spread, f"{name} prompt {i} vs llama.cpp")
        out, _, _ = run_greedy(name, prompt, tmp_path, n=N_GEN)
        llm.reset()
        gen = []
        for t in llm.generate(out["prompt_tokens"], top_k=1, temp=0.0, repeat_penalty=1.0):
            gen.append(t)
            if len(gen) == N_GEN:
                break
        part = next((j for j, (a, b) in enumerate(zip(gen, out["tokens"])) if a != b), None)
        if part is not None:  # parted at a near-tie of llama.cpp's own logits (of its own sequence)
            n_p = len(out["prompt_tokens"])
            lc = np.array(llm.scores[n_p - 1 + part], dtype=np.float32)
            gap = lc.max() - lc[out["tokens"][part]]
            print(f"{name} prompt {i}: greedy parts from llama.cpp at token {part}, logit gap {gap:.3f}")
            assert gap < NEAR_TIE, f"{name} prompt {i}: greedy token {part} is {gap:.3f} below llama.cpp's choice"


@pytest.mark.parametrize("name", MODELS)
def test_chunk_size_invariance(name, tmp_path):
    """Chunks of 1, 7, 64 and the whole prompt: same tokens, logits within 1e-4 (in fact identical)."""
    prompt = TEXT[:500]
    base_out, _, base = run_greedy(name, prompt, tmp_path, chunk=4096, n=16)
    for chunk in (1, 7, 64):
        out, _, lg = run_greedy(name, prompt, tmp_path, chunk=chunk, n=16)
        assert out["tokens"] == base_out["tokens"], f"chunk {chunk}"
        d = np.abs(lg - base).max()
        assert d <= 1e-4, f"chunk {chunk}: max |dlogit| {d}"


def perplexity_numpy(m, tokens, n_ctx, n_windows, bos):
    nll, count = 0.0, 0
    for w in range(n_windows):
        seq = list(tokens[w * n_ctx:(w + 1) * n_ctx])
        if bos is not None:
            seq[0] = bos
        lp = log_softmax(m.forward(seq))
        first = n_ctx // 2
        for j in range(first, n_ctx - 1):
            nll -= lp[j, tokens[w * n_ctx + j + 1]]
            count += 1
    return float(np.exp(nll / count))


@pytest.mark.parametrize("name", ["smollm2"])  # Gemma-3's 262k-row LM head makes this slow in NumPy
def test_perplexity_vs_numpy_reference(name):
    ours = kt.run_json("perplexity", "-m", kt.model(name), "-f", DATA / "declaration.txt", "--ctx", 256,
                       "--threads", 2, "--json")
    toks = kt.run_json("tokenize", "-m", kt.model(name), "-f", DATA / "declaration.txt", "--json")["ids"]
    m = numpy_ref(name)
    from gguf import GGUFReader
    r = GGUFReader(str(kt.model(name)))
    add_bos = bool(r.fields["tokenizer.ggml.add_bos_token"].contents()) if "tokenizer.ggml.add_bos_token" in r.fields else False
    bos = int(r.fields["tokenizer.ggml.bos_token_id"].contents()) if add_bos else None
    ref = perplexity_numpy(m, toks, 256, ours["n_windows"], bos)
    print(f"{name}: perplexity ours {ours['perplexity']:.4f} numpy {ref:.4f}")
    assert abs(ours["perplexity"] / ref - 1) <= 0.03


@pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama-cpp-python not installed (scripts/setup.sh --with-llama-cpp)")
@pytest.mark.parametrize("name", MODELS)
def test_perplexity_vs_llama_cpp(name):
    ours = kt.run_json("perplexity", "-m", kt.model(name), "-f", DATA / "declaration.txt", "--ctx",
                       llamacpp_golden.N_CTX_PPL, "--threads", 2, "--json")
    ref = llamacpp_golden.perplexity(kt.model(name), TEXT)  # the same method as the recorded file's
    print(f"{name}: perplexity ours {ours['perplexity']:.4f} llama.cpp {ref['perplexity']:.4f} "
          f"({ours['n_windows']} windows)")
    assert ours["n_scored"] == ref["n_scored"]
    assert abs(ours["perplexity"] / ref["perplexity"] - 1) <= PPL_TOL_LLAMA_CPP
