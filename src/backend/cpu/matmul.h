// Weight x activation products on the CPU: y[t, r] = dot(W[r, :], x[t, :]).
//   W: [n_rows, k] of a GGML weight type (rows contiguous, row_bytes = ggml_row_bytes(type, k))
//   x: [n_tokens, k] f32      y: [n_tokens, n_rows] f32
// Activations are quantised once per call into caller-provided scratch (act_row_bytes per token),
// then output rows are split over the pool's threads (split_range, aligned to kRowAlign). Outputs
// come from register-blocked tiles (several rows x several tokens, kernels.h TileFn) or single
// vec_dots on the edges; a tile's outputs are bit-identical to the vec_dot of the chosen ISA, so y
// does not depend on the thread count, on n_tokens, or on the tiling: every output equals
// vec_dot(isa, ...) of its row and token, and row t of matmul equals matvec of token t exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cpu/cpu_features.h"
#include "core/ggml_type.h"
#include "core/thread_pool.h"

namespace kvtier::cpu {

constexpr int64_t kRowAlign = 16;

struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;  // [n_rows, k] type
  int64_t n_rows = 0;
  int64_t k = 0;
  // Optional: the same values in the rows-in-lanes layout (weight_lanes.h), owned elsewhere. matmul
  // reads it instead of data where the ISA's table has a lanes kernel for the type (same bits).
  const uint8_t* lanes = nullptr;
};

// Scratch bytes matmul needs for n_tokens tokens of W's inner size.
size_t matmul_scratch_bytes(GgmlType type, int64_t k, int64_t n_tokens);

// Prefill (many tokens) and decode (one or a few) share this entry point.
void matmul(ThreadPool& pool, Isa isa, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
            std::span<uint8_t> scratch);

// Several matrices over the same x (a layer's Q, K and V projections; its FFN gate and up):
//   x: [n_tokens, k] f32 -> outs[i].y: [n_tokens, outs[i].w->n_rows] f32, each with matmul's bits.
// When the matrices quantise x alike, x is quantised once, and without panel tiles (decode) every
// matrix's rows go to the pool in one run: fewer hand-offs per token than one matmul each. `scratch`
// as matmul's for the largest of them.
struct MatmulOut {
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
};
void matmul_same_input(ThreadPool& pool, Isa isa, std::span<const MatmulOut> outs, const float* x,
                       int64_t n_tokens, std::span<uint8_t> scratch);

// The activation rows matmul computes from x, stored apart (KVPR keeps a layer's K/V-projection inputs
// in this form, so that a later matmul_rows over them gives matmul's bits):
//   x: [n_tokens, k] f32 -> out: [n_tokens, act_row_bytes_for(type, k)] bytes (f32 rows for float weights)
size_t act_row_bytes_for(GgmlType type, int64_t k);
void quantize_rows(ThreadPool& pool, Isa isa, GgmlType type, const float* x, int64_t n_tokens, int64_t k,
                   uint8_t* out);
// matmul over activation rows already in W's format (quantize_rows): the same bits as matmul of their x.
//   act: [n_tokens, act_row_bytes_for(w.type, w.k)]     y: [n_tokens, n_rows] f32
void matmul_rows(ThreadPool& pool, Isa isa, const WeightMatrix& w, const uint8_t* act, int64_t n_tokens,
                 float* y);

// One dot product of a weight row with an activation row already in the type's ActFormat (tests).
float vec_dot(Isa isa, GgmlType type, const uint8_t* w_row, const uint8_t* act_row, int64_t k);

}  // namespace kvtier::cpu
