"""Whole-model comparison of kvtier's CPU kernel paths (--isa scalar / avx2 / avx512) with each other
and, optionally, with llama.cpp (llama-cpp-python) and the NumPy reference in f64 (reference.py with
matmul_f64: the same algorithm with exact-ish arithmetic, so the best anchor for "which path is more
precise").

Teacher-forced on the perplexity windows of data/declaration.txt (windows of 256 tokens, BOS in the
first slot, as llama-perplexity and `kvtier perplexity` do): every position of every window is scored,
so the KL figures use 6 x 256 positions, the perplexity the usual 6 x 127 (second half of each window).

    KVTIER_BIN=build/cpu/bin/kvtier .venv/bin/python tests/model_ref/isa_compare.py [--llama-cpp] [--numpy]

prints, per model, each path's perplexity and, per pair of paths, the per-position KL (mean, max) and
top-1 agreement. It is a measurement for docs/benchmarks.md, not a test.
"""
import argparse
import itertools
import pathlib
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "python"))
import kvtier_testlib as kt  # noqa: E402
from llamacpp_golden import log_softmax  # noqa: E402

N_CTX = 256


def windows(name, text_path):
    """The perplexity windows (llama.cpp's method) of a text, as lists of token ids, and the text's ids."""
    ids = kt.run_json("tokenize", "-m", kt.model(name), "-f", text_path, "--json")["ids"]
    from gguf import GGUFReader
    r = GGUFReader(str(kt.model(name)))
    f = r.fields
    add_bos = bool(f["tokenizer.ggml.add_bos_token"].contents()) if "tokenizer.ggml.add_bos_token" in f else False
    bos = int(f["tokenizer.ggml.bos_token_id"].contents()) if add_bos else None
    out = []
    for w in range(len(ids) // N_CTX):
        seq = list(ids[w * N_CTX:(w + 1) * N_CTX])
        if bos is not None:
            seq[0] = bos
        out.append(seq)
    return out, ids


def kvtier_logits(name, seq, isa, tmp):
    """kvtier's logits [len(seq), n_vocab] of a token sequence (teacher-forced, one prefill)."""
    dump = pathlib.Path(tmp) / "logits.npy"
    kt.run("run", "-m", kt.model(name), "--ids", ",".join(map(str, seq)), "-n", 0, "--json", "--threads", 2,
           "--isa", isa, "--dump-logits", dump)
    lg = np.load(dump)
    assert lg.shape[0] == len(seq)
    return lg


def kl(lp, lq):
    """Per-position KL(p || q) of log-probabilities [n, vocab]."""
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--isas", default="scalar,avx2,avx512")
    ap.add_argument("--text", default=str(HERE / "data" / "declaration.txt"))
    ap.add_argument("--llama-cpp", action="store_true", help="add llama.cpp (llama-cpp-python) as a path")
    ap.add_argument("--numpy", action="store_true", help="add the NumPy reference with f64 matmuls as a path")
    args = ap.parse_args()
    for name in args.models.split(","):
        wins, ids = windows(name, args.text)
        paths = args.isas.split(",")
        if args.llama_cpp:
            import llama_cpp
            llm = llama_cpp.Llama(model_path=str(kt.model(name)), n_ctx=N_CTX, n_batch=N_CTX, logits_all=True,
                                  n_threads=2, verbose=False)
            paths.append("llama.cpp")
        if args.numpy:
            import reference
            ref = reference.Model(str(kt.model(name)))
            ref.matmul_f64 = True
            paths.append("numpy-f64")
        nll = {p: [] for p in paths}  # per scored token
        kls = {pair: [] for pair in itertools.combinations(paths, 2)}
        agree = {pair: [] for pair in kls}
        n_scored = 0
        with tempfile.TemporaryDirectory() as tmp:
            for w, seq in enumerate(wins):
                lp = {}
                for p in paths:
                    if p == "llama.cpp":
                        llm.reset()
                        llm.eval(seq)
                        lg = np.array(llm.scores[:N_CTX], dtype=np.float32)
                    elif p == "numpy-f64":
                        lg = ref.forward(seq)
                    else:
                        lg = kvtier_logits(name, seq, p, tmp)
                    lp[p] = log_softmax(lg)
                    targets = ids[w * N_CTX + N_CTX // 2 + 1:(w + 1) * N_CTX]
                    nll[p].append(-lp[p][np.arange(N_CTX // 2, N_CTX - 1), targets])
                n_scored += N_CTX // 2 - 1
                for a, b in kls:
                    kls[(a, b)].append(kl(lp[a], lp[b]))
                    agree[(a, b)].append(lp[a].argmax(1) == lp[b].argmax(1))
                print(f"[{name}] window {w + 1}/{len(wins)}", file=sys.stderr)
        print(f"\n{name}: {len(wins)} windows of {N_CTX}, {n_scored} scored for perplexity, "
              f"{len(wins) * N_CTX} positions for KL")
        for p in paths:
            print(f"  perplexity {p:10s} {np.exp(np.concatenate(nll[p]).mean()):.4f}")
        # ln(ppl_a / ppl_b) is the mean per-token NLL difference; its standard error from the tokens'
        # spread (se_tok) and from the windows' means (se_win: allows for correlation within a window).
        print(f"  {'pair':24s} {'ppl ratio':>9s} {'sd dNLL':>8s} {'se_tok':>7s} {'se_win':>7s}")
        for a, b in itertools.combinations(paths, 2):
            d = [x - y for x, y in zip(nll[a], nll[b])]
            dd = np.concatenate(d)
            wm = np.array([x.mean() for x in d])
            print(f"  {a + ' | ' + b:24s} {np.exp(dd.mean()) - 1:+9.2%} {dd.std():8.4f} "
                  f"{dd.std() / np.sqrt(len(dd)):7.2%} {wm.std(ddof=1) / np.sqrt(len(wm)):7.2%}")
        print(f"  {'pair':24s} {'KL mean':>9s} {'KL p99':>9s} {'KL max':>9s} {'top-1':>7s}")
        for (a, b), v in kls.items():
            v = np.concatenate(v)
            t = np.concatenate(agree[(a, b)])
            print(f"  {a + ' | ' + b:24s} {v.mean():9.5f} {np.quantile(v, 0.99):9.5f} {v.max():9.5f} {t.mean():7.4f}")


if __name__ == "__main__":
    main()
