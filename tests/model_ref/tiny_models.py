"""Tiny random-weight models in GGUF for exact structural checks of the forward pass (f32 weights,
so no activation quantisation enters): a tiny llama from `kvtier synth`, a tiny qwen2 and a tiny
gemma3 written here with the gguf package (tokenizer copied from the synthetic llama's byte vocab)."""
from __future__ import annotations

import subprocess

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType


def synth_llama(kvtier: str, path: str, preset: str = "tiny-llama") -> str:
    subprocess.run([kvtier, "synth", "--preset", preset, "-o", path, "--type", "f32", "--seed", "3"], check=True,
                   capture_output=True)
    return path


def _copy_tokenizer(src: GGUFReader, w: GGUFWriter) -> int:
    tokens = src.fields["tokenizer.ggml.tokens"].contents()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(src.fields["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens)
    w.add_token_types(src.fields["tokenizer.ggml.token_type"].contents())
    w.add_bos_token_id(int(src.fields["tokenizer.ggml.bos_token_id"].contents()))
    w.add_eos_token_id(int(src.fields["tokenizer.ggml.eos_token_id"].contents()))
    w.add_add_bos_token(True)
    return len(tokens)


def write_tiny(path: str, tokenizer_src: str, arch: str, seed: int = 5, variant: str = "") -> str:
    """A 6-layer gemma3 (5 sliding-window layers of window 8, then a global one), a 2-layer qwen2,
    a 2-layer opt (MHA, LayerNorm weights and biases, learned positions, ReLU FFN, all biases, tied output),
    or a 2-layer llama variant: "llama3" (rope_freqs frequency factors), "mistral" (window 8)."""
    rng = np.random.default_rng(seed)
    src = GGUFReader(tokenizer_src)
    w = GGUFWriter(path, arch)
    n_vocab = _copy_tokenizer(src, w)
    E, H, Hk, D, F = 32, 4, 2, 16, 64
    L = 6 if arch == "gemma3" else 2
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    if arch == "opt":
        Hk = H
    w.add_head_count_kv(Hk)
    w.add_key_length(D)
    w.add_value_length(D)
    if arch == "opt":
        w.add_layer_norm_eps(1e-5)
    else:
        w.add_rope_dimension_count(D)
        w.add_layer_norm_rms_eps(1e-6)
    if arch == "opt":
        pass
    elif arch == "gemma3":
        w.add_rope_freq_base(1e6)
        w.add_sliding_window(8)
    else:
        w.add_rope_freq_base(5e5 if variant == "llama3" else 1e4)
    if variant == "mistral":
        w.add_sliding_window(8)

    def t(name, *shape, scale=None, ones=False):  # numpy shape [rows, k]
        if ones:
            a = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            s = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
            a = (s * rng.standard_normal(shape)).astype(np.float32)
        w.add_tensor(name, a, raw_dtype=GGMLQuantizationType.F32)

    t("token_embd.weight", n_vocab, E, scale=0.5)
    t("output_norm.weight", E, ones=True)
    if arch == "opt":
        t("position_embd.weight", 256, E, scale=0.5)
        t("output_norm.bias", E, scale=0.3)
    if variant == "llama3":  # Llama-3 style factors: high frequencies 1, low ones up to 8
        w.add_tensor("rope_freqs.weight", np.geomspace(1.0, 8.0, D // 2).astype(np.float32),
                     raw_dtype=GGMLQuantizationType.F32)
    for i in range(L):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", E, ones=True)
        t(p + "attn_q.weight", H * D, E)
        t(p + "attn_k.weight", Hk * D, E)
        t(p + "attn_v.weight", Hk * D, E)
        t(p + "attn_output.weight", E, H * D)
        t(p + "ffn_norm.weight", E, ones=True)
        if arch != "opt":
            t(p + "ffn_gate.weight", F, E)
        t(p + "ffn_up.weight", F, E)
        t(p + "ffn_down.weight", E, F)
        if arch == "gemma3":
            t(p + "attn_q_norm.weight", D, ones=True)
            t(p + "attn_k_norm.weight", D, ones=True)
            t(p + "post_attention_norm.weight", E, ones=True)
            t(p + "post_ffw_norm.weight", E, ones=True)
        if arch == "opt":
            for n, size in (("attn_norm", E), ("ffn_norm", E), ("attn_q", H * D), ("attn_k", H * D),
                            ("attn_v", H * D), ("attn_output", E), ("ffn_up", F), ("ffn_down", E)):
                t(p + n + ".bias", size, scale=0.3)
        if arch == "qwen2":
            t(p + "attn_q.bias", H * D, scale=0.3)
            t(p + "attn_k.bias", Hk * D, scale=0.3)
            t(p + "attn_v.bias", Hk * D, scale=0.3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
