// Float ops of the forward pass on the GPU: host functions taking device pointers and the stream to
// launch on. They only enqueue work (no synchronisation, no allocation). The maths is that of the
// CPU backend (backend/cpu/float_ops.h); each op's CUDA result is tested against the CPU reference
// with a stated tolerance (tests/cuda). Every result depends on its own row only: never on the
// number of rows in the call or on the device, and it is bit-identical from run to run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// ---- embedding, conversion (embedding.cu)

// out[t, :] = scale * f32(table[ids[t], :]). table: [n_vocab, dim] bf16 bits; ids: [n_tokens] i32
// (device); out: [n_tokens, dim] f32. Ids are not checked here (the tokenizer's are in range).
void embedding_bf16(const uint16_t* table, const int32_t* ids, int64_t n_tokens, int64_t dim, float scale,
                    float* out, cudaStream_t stream);

// y = bf16(x) rounded to nearest even (GEMM inputs): x [n] f32, y [n] bf16 bits.
void cast_f32_to_bf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream);
// y = f32(x): x [n] bf16 bits, y [n] f32 (exact).
void cast_bf16_to_f32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream);

// ---- norms (norm.cu): x, y [n_rows, n] f32 contiguous; y may alias x

// y = x / sqrt(mean(x^2) + eps) * w   (w: [n] f32, may be null)
void rms_norm(const float* x, const float* w, float eps, int64_t n_rows, int64_t n, float* y,
              cudaStream_t stream);
// y = (x - mean) / sqrt(var + eps) * w + b   (w, b: [n] f32, may be null)
void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n_rows, int64_t n,
                float* y, cudaStream_t stream);

// ---- elementwise (elementwise.cu): [n] f32, y may alias an input

void silu(const float* x, int64_t n, float* y, cudaStream_t stream);       // x / (1 + exp(-x))
void gelu_tanh(const float* x, int64_t n, float* y, cudaStream_t stream);  // 0.5x(1+tanh(...))
void relu(const float* x, int64_t n, float* y, cudaStream_t stream);       // max(x, 0)
void add(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream);
void mul(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream);
void scale(const float* x, float c, int64_t n, float* y, cudaStream_t stream);  // y = c x
// Bias over rows: y[r * y_stride + i] = x[r * x_stride + i] + b[i], i < n (y may alias x).
void add_rows(const float* x, int64_t x_stride, const float* b, int64_t n_rows, int64_t n, float* y,
              int64_t y_stride, cudaStream_t stream);
// y = cap * tanh(x / cap), cap > 0 (Gemma-2 logit / attention soft-capping)
void softcap(const float* x, float cap, int64_t n, float* y, cudaStream_t stream);

// Gated products over rows: y[r, i] = act(gate[r, i]) * up[r, i] for i < n_cols.
// gate, up, y: row r at ptr + r * stride (elements), so a fused [n_rows, 2 * n_cols] projection can be
// passed as two views. SwiGLU uses silu, GeGLU gelu_tanh.
enum class GluAct { kSilu, kGeluTanh };
void glu(GluAct act, const float* gate, int64_t gate_stride, const float* up, int64_t up_stride,
         int64_t n_rows, int64_t n_cols, float* y, int64_t y_stride, cudaStream_t stream);

// ---- RoPE (rope.cu)

enum class RopeMode {
  kNormal,  // pairs (2p, 2p + 1): Llama as stored in GGUF
  kNeox,    // pairs (p, p + n_rot / 2): NeoX, Gemma, Qwen
};

// Rotation of one RoPE setting. For pair p of a token at position pos:
//   theta = pos * freq_scale * base^(-2p / n_rot) / freq_factors[p]
// computed in double and rounded to f32 cos/sin (as backend/cpu and model/rope.cpp), then
//   (a, b) <- (a cos - b sin, a sin + b cos) with single roundings (no FMA), as the CPU reference.
struct RopeParams {
  int64_t head_dim = 0;
  int64_t n_rot = 0;  // rotated dims per head (even, <= head_dim); the rest pass through
  float base = 10000.0f;
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // [n_rot / 2] f32 device (Llama-3 rope_freqs), or null
  RopeMode mode = RopeMode::kNormal;
};

// x: token t, head h at x + t * token_stride + h * head_dim, rotated in place.
// positions: [n_tokens] i32 device.
void rope(const RopeParams& p, float* x, int64_t token_stride, int64_t n_tokens, int64_t n_heads,
          const int32_t* positions, cudaStream_t stream);

}  // namespace kvtier::cuda
