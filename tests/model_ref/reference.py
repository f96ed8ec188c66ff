"""A small NumPy reference of the llama / qwen2 / gemma3 / opt forward pass, independent of kvtier's C++.

Weights come from the `gguf` package's dequantisation (gguf.quants.dequantize; the file is parsed by
read_gguf below). The arithmetic follows the published model definitions (HF transformers /
llama.cpp graphs):

  x = embed(tokens) [* sqrt(n_embd) for gemma3]
  per layer: h = rmsnorm(x) * w; q,k,v = h W (+ b); [gemma3: rmsnorm per head of q, k];
             rope(q, k) (pairs (2i, 2i+1) for llama, (i, i + d/2) for qwen2/gemma3);
             o = softmax(q k^T * scale + causal/sliding mask) v; a = o Wo; [gemma3: post-norm]; x += a
             h = rmsnorm(x) * w; f = (act(h Wg) * (h Wu)) Wd; [gemma3: post-norm]; x += f
  logits = rmsnorm(x) * w  Wout

OPT (HF OPTDecoderLayer, do_layer_norm_before): x = embed(tokens) + pos_embed(positions) (row p of
position_embd is position p); per layer: h = layernorm(x) * w + b; q,k,v = h W + b (no RoPE);
o = softmax(q k^T / sqrt(d) + causal mask) v; x += o Wo + bo; h = layernorm(x) * w + b;
x += relu(h Wu + bu) Wd + bd; logits = (layernorm(x) * w + b) token_embd^T (tied).

Two switches reproduce the storage choices an engine makes, so a tight tolerance can be used:
  act_quant: activations entering a quantised matmul are rounded to 8-bit blocks first, as GGML-style
             kernels do (blocks of 32 for legacy quant weights, 256 for K-quants; d = max|x|/127,
             q = round(x/d));
  kv_f16:    K and V are rounded to float16, as stored by an f16 KV cache.
"""
from __future__ import annotations

import math
import struct
from types import SimpleNamespace

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

LEGACY = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}
KQUANT = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_PLAIN = {T.F32: np.float32, T.F16: np.float16}


def read_gguf(path: str):
    """(metadata, tensors) of a GGUF file: metadata maps keys to scalars, strings and lists; tensors maps
    names to SimpleNamespace(name, tensor_type, shape (GGUF order: shape[0] = row length), data) with
    data laid out as gguf.GGUFReader gives it (rows of quant blocks as bytes, or plain floats).

    A small parser of the GGUF layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md)
    rather than gguf.GGUFReader, which takes one to two minutes over Gemma-3's 262k-entry tokenizer
    arrays; dequantisation stays gguf-py's."""
    buf = np.memmap(path, mode="r")
    mv = memoryview(buf)
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, mv, off)[0]
        off += struct.calcsize(fmt)
        return v

    def string():
        nonlocal off
        n = take("<Q")
        v = bytes(mv[off:off + n]).decode("utf-8", errors="replace")
        off += n
        return v

    def value(vt):
        nonlocal off
        if vt == _STRING:
            return string()
        if vt == _ARRAY:
            et, n = take("<I"), take("<Q")
            if et == _STRING:
                return [string() for _ in range(n)]
            if et == _ARRAY:
                return [value(_ARRAY) for _ in range(n)]
            dt = np.dtype(_SCALARS[et])
            arr = np.frombuffer(mv, dtype=dt, count=n, offset=off)
            off += n * dt.itemsize
            return arr.tolist()
        return take(_SCALARS[vt])

    if bytes(mv[0:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    off = 4
    version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, dims, T(take("<I")), take("<Q")))
    align = int(meta.get("general.alignment", 32))
    start = (off + align - 1) // align * align
    tensors = {}
    for name, dims, qt, rel in infos:
        n_el = int(np.prod(dims))
        rows = tuple(reversed(dims))  # numpy order: the row length last
        if qt in _PLAIN:
            data = np.frombuffer(mv, dtype=_PLAIN[qt], count=n_el, offset=start + rel).reshape(rows)
        else:
            bs, ts = GGML_QUANT_SIZES[qt]
            data = np.frombuffer(mv, dtype=np.uint8, count=n_el // bs * ts, offset=start + rel)
            data = data.reshape(rows[:-1] + (rows[-1] // bs * ts,))
        tensors[name] = SimpleNamespace(name=name, tensor_type=qt, shape=dims, n_elements=n_el, data=data)
    return meta, tensors


def _field(meta: dict, key: str, default=None):
    return meta.get(key, default)


class Matrix:
    """A weight matrix [n_rows, k] dequantised to f32, with its activation block size."""

    def __init__(self, t):
        self.w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        self.w = self.w.reshape(int(t.shape[1]) if len(t.shape) > 1 else 1, int(t.shape[0]))
        qt = t.tensor_type
        self.block = 32 if qt in LEGACY else 256 if qt in KQUANT else 0


def quantize_act(x: np.ndarray, block: int) -> np.ndarray:
    """Rounds rows of x to 8-bit blocks (scale max|x|/127, round half to even), returns the f32 values."""
    if block == 0:
        return x
    n, k = x.shape
    xb = x.reshape(n, k // block, block).astype(np.float32)
    d = (np.abs(xb).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv), -127, 127)
    return (q * d).reshape(n, k).astype(np.float32)


class Model:
    def __init__(self, path: str, act_quant: bool = True, kv_f16: bool = True):
        r, tensors = read_gguf(path)
        self.act_quant, self.kv_f16 = act_quant, kv_f16
        arch = _field(r, "general.architecture")
        if arch not in ("llama", "qwen2", "gemma3", "opt"):
            raise ValueError(f"unsupported architecture {arch}")
        self.arch = arch
        g = lambda k, d=None: _field(r, f"{arch}.{k}", d)  # noqa: E731
        self.n_layer = int(g("block_count"))
        self.n_embd = int(g("embedding_length"))
        self.n_head = int(g("attention.head_count"))
        self.n_head_kv = int(g("attention.head_count_kv", self.n_head))
        self.dk = int(g("attention.key_length", self.n_embd // self.n_head))
        self.dv = int(g("attention.value_length", self.dk))
        self.n_rot = int(g("rope.dimension_count", self.dk))
        self.eps = float(g("attention.layer_norm_epsilon", 1e-5) if arch == "opt" else
                         g("attention.layer_norm_rms_epsilon", 1e-6 if arch == "gemma3" else 1e-5))
        self.base = float(g("rope.freq_base", 10000.0))
        self.window = int(g("attention.sliding_window", 0) or 0)
        self.final_softcap = float(g("final_logit_softcapping", 0.0) or 0.0)
        self.t = tensors
        vec = lambda n: np.asarray(dequantize(tensors[n].data, tensors[n].tensor_type), np.float32).reshape(-1)  # noqa
        self.tok_embd = Matrix(tensors["token_embd.weight"])
        self.output = Matrix(tensors["output.weight"]) if "output.weight" in tensors else self.tok_embd
        self.output_norm = vec("output_norm.weight")
        self.output_norm_b = vec("output_norm.bias") if "output_norm.bias" in tensors else None
        self.pos_embd = Matrix(tensors["position_embd.weight"]) if arch == "opt" else None
        self.rope_freqs = vec("rope_freqs.weight") if "rope_freqs.weight" in tensors else None
        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            mats = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down") + (
                () if arch == "opt" else ("ffn_gate",))
            L = {n: Matrix(tensors[p + n + ".weight"]) for n in mats}
            for n in ("attn_norm", "ffn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm"):
                if p + n + ".weight" in tensors:
                    L[n] = vec(p + n + ".weight")
            for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down", "attn_norm", "ffn_norm"):
                if p + n + ".bias" in tensors:
                    L[n + ".bias"] = vec(p + n + ".bias")
            self.layers.append(L)

    # -- pieces --------------------------------------------------------------------------------
    matmul_f64 = False  # accumulate matmuls in f64 (a second opinion, to measure the noise floor)

    def mm(self, m: Matrix, x: np.ndarray) -> np.ndarray:
        xa = quantize_act(x, m.block) if self.act_quant else x
        if self.matmul_f64:
            return (xa.astype(np.float64) @ m.w.T.astype(np.float64)).astype(np.float32)
        return (xa.astype(np.float32) @ m.w.T).astype(np.float32)

    def rmsnorm(self, x, w):
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + self.eps)
        return (y * w).astype(np.float32)

    def layernorm(self, x, w, b):
        x64 = x.astype(np.float64)
        mu = x64.mean(axis=-1, keepdims=True)
        var = ((x64 - mu) ** 2).mean(axis=-1, keepdims=True)
        return ((x64 - mu) / np.sqrt(var + self.eps) * w + b).astype(np.float32)

    def norm(self, x, w, b):
        return self.layernorm(x, w, b) if self.arch == "opt" else self.rmsnorm(x, w)

    def rope(self, x, pos, base):  # x: [n, heads, d]
        half = self.n_rot // 2
        inv = base ** (-2.0 * np.arange(half) / self.n_rot)
        if self.rope_freqs is not None and self.arch == "llama":
            inv = inv / self.rope_freqs.astype(np.float64)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        y = x.copy()
        if self.arch == "llama":  # pairs (2i, 2i + 1)
            a, b = x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2]
            y[..., 0:self.n_rot:2] = a * c - b * s
            y[..., 1:self.n_rot:2] = a * s + b * c
        else:  # NeoX pairs (i, i + half)
            a, b = x[..., :half], x[..., half:self.n_rot]
            y[..., :half] = a * c - b * s
            y[..., half:self.n_rot] = a * s + b * c
        return y

    def layer_is_sliding(self, i):
        return self.arch == "gemma3" and self.window > 0 and (i + 1) % 6 != 0 or (
            self.arch != "gemma3" and self.window > 0)

    # -- forward -------------------------------------------------------------------------------
    def forward(self, tokens, last_only: bool = False) -> np.ndarray:
        """Logits [n, n_vocab] (or [1, n_vocab]) of a whole sequence starting at position 0."""
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        pos = np.arange(n)
        x = self.tok_embd.w[tokens].astype(np.float32)
        if self.arch == "gemma3":
            x = (x * np.float32(math.sqrt(self.n_embd))).astype(np.float32)
        if self.arch == "opt":
            x = (x + self.pos_embd.w[pos]).astype(np.float32)
        H, Hk, dk, dv = self.n_head, self.n_head_kv, self.dk, self.dv
        G = H // Hk
        scale = 1.0 / math.sqrt(dk)
        qp, kp = pos[:, None], pos[None, :]
        causal = kp <= qp
        for i, L in enumerate(self.layers):
            h = self.norm(x, L["attn_norm"], L.get("attn_norm.bias"))
            q = self.mm(L["attn_q"], h)
            k = self.mm(L["attn_k"], h)
            v = self.mm(L["attn_v"], h)
            if "attn_q.bias" in L:
                q, k, v = q + L["attn_q.bias"], k + L["attn_k.bias"], v + L["attn_v.bias"]
            q, k, v = q.reshape(n, H, dk), k.reshape(n, Hk, dk), v.reshape(n, Hk, dv)
            if "attn_q_norm" in L:
                q, k = self.rmsnorm(q, L["attn_q_norm"]), self.rmsnorm(k, L["attn_k_norm"])
            sliding = self.layer_is_sliding(i)
            base = 10000.0 if (self.arch == "gemma3" and sliding) else self.base
            if self.arch != "opt":  # OPT: learned positions, no RoPE
                q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            if self.kv_f16:
                k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
            mask = causal & ((qp - kp) < self.window) if sliding else causal
            o = np.empty((n, H, dv), np.float32)
            for hh in range(H):
                s = (q[:, hh, :].astype(np.float64) @ k[:, hh // G, :].T.astype(np.float64)) * scale
                s = np.where(mask, s, -np.inf)
                s = s - s.max(axis=1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=1, keepdims=True)
                o[:, hh, :] = (p @ v[:, hh // G, :].astype(np.float64)).astype(np.float32)
            a = self.mm(L["attn_output"], o.reshape(n, H * dv))
            if "attn_output.bias" in L:
                a = (a + L["attn_output.bias"]).astype(np.float32)
            if "post_attention_norm" in L:
                a = self.rmsnorm(a, L["post_attention_norm"])
            x = (x + a).astype(np.float32)
            h = self.norm(x, L["ffn_norm"], L.get("ffn_norm.bias"))
            if self.arch == "opt":
                u = (self.mm(L["ffn_up"], h) + L["ffn_up.bias"]).astype(np.float32)
                f = (self.mm(L["ffn_down"], np.maximum(u, 0)) + L["ffn_down.bias"]).astype(np.float32)
                x = (x + f).astype(np.float32)
                continue
            gt = self.mm(L["ffn_gate"], h).astype(np.float64)
            up = self.mm(L["ffn_up"], h).astype(np.float64)
            if self.arch == "gemma3":
                act = 0.5 * gt * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (gt + 0.044715 * gt ** 3)))
            else:
                act = gt / (1.0 + np.exp(-gt))
            f = self.mm(L["ffn_down"], (act * up).astype(np.float32))
            if "post_ffw_norm" in L:
                f = self.rmsnorm(f, L["post_ffw_norm"])
            x = (x + f).astype(np.float32)
        if last_only:
            x = x[-1:]
        logits = self.mm(self.output, self.norm(x, self.output_norm, self.output_norm_b))
        if self.final_softcap > 0:
            logits = (self.final_softcap * np.tanh(logits / self.final_softcap)).astype(np.float32)
        return logits


if __name__ == "__main__":  # python reference.py MODEL ID,ID,... -> top-1 per position
    import sys

    m = Model(sys.argv[1])
    ids = [int(t) for t in sys.argv[2].split(",")]
    lg = m.forward(ids)
    print(lg.argmax(axis=1).tolist())
