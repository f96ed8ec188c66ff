"""Exact structural check of the forward pass: tiny f32 models (llama GQA and MHA, Llama-3 RoPE
frequency factors, Mistral sliding window, qwen2 biases, gemma3 with sliding windows and a global
layer, OPT with LayerNorm biases, learned positions and a ReLU FFN, written here and by `kvtier synth`)
against the NumPy reference. With f32 weights no activation
quantisation enters, and the reference rounds K/V to f16 as the engine's KV cache does, so the
remaining differences are float summation order: max |logit difference| <= 1e-3."""
import json
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "python"))
import kvtier_testlib as kt  # noqa: E402
import reference  # noqa: E402
import tiny_models  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog; 0123456789 times, again and again!"
TOL = 1e-3


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    llama = tiny_models.synth_llama(kt.kvtier_bin(), str(d / "llama.gguf"))
    return {
        "llama": llama,
        "llama-mha": tiny_models.synth_llama(kt.kvtier_bin(), str(d / "mha.gguf"), "tiny-mha"),
        "qwen2": tiny_models.write_tiny(str(d / "qwen2.gguf"), llama, "qwen2"),
        "gemma3": tiny_models.write_tiny(str(d / "gemma3.gguf"), llama, "gemma3"),
        "llama3": tiny_models.write_tiny(str(d / "llama3.gguf"), llama, "llama", variant="llama3"),
        "mistral": tiny_models.write_tiny(str(d / "mistral.gguf"), llama, "llama", variant="mistral"),
        "opt": tiny_models.write_tiny(str(d / "opt.gguf"), llama, "opt"),
        "opt-synth": tiny_models.synth_llama(kt.kvtier_bin(), str(d / "opt-synth.gguf"), "tiny-opt"),
    }


@pytest.mark.parametrize("arch", ["llama", "llama-mha", "qwen2", "gemma3", "llama3", "mistral", "opt", "opt-synth"])
@pytest.mark.parametrize("chunk", [5, 512])
def test_tiny_logits_match_reference(models, arch, chunk, tmp_path):
    path = models[arch]
    dump = tmp_path / "logits.npy"
    out = kt.run_json("run", "-m", path, "-p", PROMPT, "-n", 8, "--temp", 0, "--ignore-eos", "--json", "--chunk",
                      chunk, "--threads", 2, "--dump-logits", dump)
    ours = np.load(dump)
    ids = out["prompt_tokens"] + out["tokens"][:-1]
    assert ours.shape[0] == len(ids)
    ref = reference.Model(path).forward(ids)
    diff = np.abs(ours - ref).max()
    print(f"{arch} chunk {chunk}: max |dlogit| {diff:.2e}")
    assert diff <= TOL, f"{arch}: max |dlogit| {diff:.2e}"
    # Greedy continuation: each generated token is the reference's argmax at its position.
    n_p = len(out["prompt_tokens"])
    assert out["tokens"] == ref[n_p - 1:].argmax(axis=1).tolist()[:len(out["tokens"])]


def test_unsupported_architecture_is_named(tmp_path, models):
    from gguf import GGUFReader, GGUFWriter  # a file of an architecture without a forward pass
    path = tmp_path / "gpt2.gguf"
    w = GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(1)
    w.add_context_length(8)
    tiny_models._copy_tokenizer(GGUFReader(models["llama"]), w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    proc = kt.run("run", "-m", path, "-p", "hi", check=False)
    assert proc.returncode != 0 and "architecture 'gpt2' is not supported" in proc.stderr, proc.stderr


def test_missing_tensor_is_named(tmp_path, models):
    from gguf import GGUFReader, GGUFWriter
    src = GGUFReader(models["llama"])
    path = tmp_path / "broken.gguf"
    w = GGUFWriter(str(path), "llama")
    for k, f in src.fields.items():
        if k.startswith("llama."):
            v = f.contents()
            name = k[len("llama."):]
            if isinstance(v, int):
                w.add_uint32(k, v)
            elif isinstance(v, float):
                w.add_float32(k, v)
    tiny_models._copy_tokenizer(src, w)
    for t in src.tensors:
        if t.name != "blk.1.ffn_up.weight":
            w.add_tensor(t.name, np.asarray(t.data).reshape([int(x) for x in reversed(t.shape)]), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    proc = kt.run("run", "-m", path, "-p", "hi", check=False)
    assert proc.returncode != 0 and "'blk.1.ffn_up.weight' is missing" in proc.stderr, proc.stderr
