"""Recorded llama.cpp results on the default models, so that CI (which does not build llama.cpp: that
takes 7-11 minutes on 2 cores) still compares kvtier with llama.cpp on the same GGUF files.

    .venv/bin/python tests/model_ref/llamacpp_golden.py        # rewrites data/llamacpp_golden.json

needs llama-cpp-python (scripts/setup.sh --with-llama-cpp). The file records llama.cpp's version and
system-info line (its CPU paths), and per model:
  * the model file's size and SHA-256 (a test refuses a golden file made from another file);
  * llama.cpp's perplexity over data/declaration.txt (llama-perplexity's method: windows of 256 tokens,
    BOS in the first slot, the second half of each window scored);
  * for each prompt of test_reference_models.PROMPTS: the prompt's token ids, llama.cpp's own greedy
    continuation of 64 tokens, and llama.cpp's log-probabilities (log_softmax over the full vocabulary)
    at every position of its own sequence (prompt + continuation, teacher-forced: row j predicts token
    j + 1), kept as the TOP most likely ids with their log-probabilities. The mass outside them is
    1 - sum(exp(lp)), so a test can compute a KL divergence with a tail bucket (a lower bound of the
    full KL, by the data-processing inequality), top-1 agreement, and at the step where two greedy
    continuations part, how far below llama.cpp's choice the other token is.
test_llamacpp_golden.py checks kvtier against it; when llama-cpp-python is installed, the same test
also re-runs llama.cpp and checks the file is current.
"""
import hashlib
import json
import pathlib
import re
import sys

import numpy as np

HERE = pathlib.Path(__file__).parent
DATA = HERE / "data"
GOLDEN = DATA / "llamacpp_golden.json"
N_CTX_PPL = 256
N_GEN = 64
TOP = 16  # ids (with log-probabilities) kept per position
LP_DECIMALS = 4


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def llama(path, n_ctx):
    import llama_cpp
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=2,
                           verbose=False)


def perplexity(path, text):
    llm = llama(path, N_CTX_PPL)
    tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
    add_bos = tokens[0] == llm.token_bos()
    nll, count = 0.0, 0
    for w in range(len(tokens) // N_CTX_PPL):
        seq = tokens[w * N_CTX_PPL:(w + 1) * N_CTX_PPL]
        if add_bos:
            seq[0] = llm.token_bos()
        llm.reset()
        llm.eval(seq)
        lp = log_softmax(np.array(llm.scores[:N_CTX_PPL], dtype=np.float32))
        for j in range(N_CTX_PPL // 2, N_CTX_PPL - 1):
            nll -= lp[j, tokens[w * N_CTX_PPL + j + 1]]
            count += 1
    return {"n_ctx": N_CTX_PPL, "n_windows": len(tokens) // N_CTX_PPL, "n_scored": count,
            "perplexity": float(np.exp(nll / count))}


def top_logprobs(lp):
    """[n, vocab] log-probabilities -> per row {"ids": TOP ids, most likely first, "lp": their values}."""
    out = []
    for row in lp:
        top = np.argsort(-row, kind="stable")[:TOP]
        out.append({"ids": [int(i) for i in top], "lp": [round(float(row[i]), LP_DECIMALS) for i in top]})
    return out


def greedy(path, prompt):
    """llama.cpp's greedy continuation of a prompt, and its top log-probabilities at every position of
    its own sequence (prompt + continuation[:-1]), from one teacher-forced evaluation of that sequence."""
    llm = llama(path, 512)
    ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
    gen = []
    for t in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
        gen.append(int(t))
        if len(gen) == N_GEN:
            break
    seq = ids + gen[:-1]
    llm.reset()
    llm.eval(seq)
    lp = log_softmax(np.array(llm.scores[:len(seq)], dtype=np.float32))
    # The teacher-forced pass must agree with the generation it came from (same engine, same sequence).
    forced = [int(i) for i in lp[len(ids) - 1:].argmax(axis=1)]
    agree = sum(a == b for a, b in zip(forced, gen))
    return {"prompt_tokens": [int(i) for i in ids], "tokens": gen, "forced_agree": agree,
            "top": top_logprobs(lp)}


def make(models, prompts, text):
    import llama_cpp
    out = {"llama_cpp_python": llama_cpp.__version__,
           "system_info": llama_cpp.llama_print_system_info().decode().strip(),
           "top_k": TOP, "models": {}}
    for name, path in models.items():
        path = pathlib.Path(path)
        print(f"[golden] {name}: {path.name}", file=sys.stderr)
        out["models"][name] = {
            "file": path.name, "size": path.stat().st_size, "sha256": sha256(path),
            "perplexity": perplexity(path, text),
            "greedy": [greedy(path, p) for p in prompts],
        }
    return out


def dump(golden):
    """JSON text with one position of "top" per line (compact, and diffs stay readable)."""
    rows = []

    def mark(obj):
        if isinstance(obj, dict):
            return {k: ([mark_row(r) for r in v] if k == "top" else mark(v)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [mark(v) for v in obj]
        return obj

    def mark_row(row):
        rows.append(json.dumps(row, separators=(",", ":")))
        return f"@row{len(rows) - 1}@"

    text = json.dumps(mark(golden), indent=1)
    return re.sub(r'"@row(\d+)@"', lambda m: rows[int(m.group(1))], text) + "\n"


def main():
    sys.path.insert(0, str(HERE.parent / "python"))
    import kvtier_testlib as kt
    import test_reference_models as trm
    golden = make({name: kt.model(name) for name in trm.MODELS}, trm.PROMPTS, trm.TEXT)
    GOLDEN.write_text(dump(golden))
    print(f"[golden] wrote {GOLDEN}", file=sys.stderr)


if __name__ == "__main__":
    main()
