// The retaining head's arithmetic, written once as templates over the scalar type: float is what
// inference and training run (the GEMMs go through cpu::matmul on F32 weights), double is the same
// code with reference GEMM loops, used by the fp64 acceptance tests (spec §7 A2, A4). Nothing here
// allocates except the backward scratch, which grows to the largest sample seen.
//
//   forward:  Z = X fc1^T,  A = act(Z),  P = A fc2^T
//   backward: dfc2 = dP^T A,  dA = dP fc2,  dZ = dA * act'(Z),  dfc1 = dZ^T X
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "core/thread_pool.h"
#include "locret/head_shape.h"

namespace kvtier::locret {

// Where the float GEMMs run.
struct Compute {
  ThreadPool* pool = nullptr;
  cpu::Isa isa = cpu::Isa::kScalar;
};

// y[n, rows] = x[n, k] . w[rows, k]^T (every output a dot product of a row of w and a row of x).
template <typename T>
void gemm_nt(const Compute& c, const T* w, int64_t rows, int64_t k, const T* x, int64_t n, T* y);

// dst[cols, rows] = src[rows, cols]^T
template <typename T>
void transpose(const T* src, int64_t rows, int64_t cols, T* dst);

template <typename T>
T activate(HeadActivation act, T z);
// d act(z) / dz; silu'(z) = s(z) (1 + z (1 - s(z))) with s the logistic function.
template <typename T>
T activate_grad(HeadActivation act, T z);

// One layer's head.
template <typename T>
struct LayerParams {
  std::vector<T> fc1;  // [d_m, d_in] T
  std::vector<T> fc2;  // [h_kv, d_m] T
};

// The head's input rows of n tokens from the rows the forward pass hands the KV cache:
//   q_pre: [n, h, dk] f32    k_pre: [n, h_kv, dk] f32    v: [n, h_kv, dv] f32    X: [n, d_in] T
template <typename T>
void assemble_features(const LayerShape& s, const float* q_pre, const float* k_pre, const float* v, int64_t n,
                       T* X);

// X: [n, d_in]   z: [n, d_m] (pre-activation; may be the same buffer as a when Z is not needed)
// a: [n, d_m]    p: [n, h_kv] (the predicted scores)
template <typename T>
void head_forward(const Compute& c, const LayerShape& s, int64_t d_m, HeadActivation act,
                  const LayerParams<T>& w, const T* X, int64_t n, T* z, T* a, T* p);

template <typename T>
struct BackwardScratch {
  std::vector<T> xt, dz, dzt, at, dpt;
};

// Gradients of the layer's loss with respect to fc1 and fc2 (overwritten) from dP = dLoss/dP:
//   X, z, a: as head_forward left them    dp: [n, h_kv]
template <typename T>
void head_backward(const Compute& c, const LayerShape& s, int64_t d_m, HeadActivation act,
                   const LayerParams<T>& w, const T* X, int64_t n, const T* z, const T* a, const T* dp,
                   LayerParams<T>& grad, BackwardScratch<T>& scratch);

}  // namespace kvtier::locret
