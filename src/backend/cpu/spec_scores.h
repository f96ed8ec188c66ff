// InfiniGen's estimated attention scores, the inner loop of policy::speculate: for T rows of partial
// keys (IEEE half, as the spec's partial key cache) and the G partial queries (f32) of one KV head,
//
//   out[t] = max over j ascending of scale · (sum over c ascending of q[j][c] · f32(pk[t][c]))
//
// with every product and sum rounded to f32 (no FMA), the dot starting at 0 and the max taken as
// std::max(best, v) from -inf. f16 -> f32 is exact, so every ISA path gives exactly these bits (the SIMD
// paths run 8 or 16 rows per vector, each lane in the scalar order), and the selection does not depend on the
// CPU.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"

namespace kvtier::cpu {

// q: [G, K] f32, pk: [T, K] f16 bits (rows contiguous), out: [T] f32.
using SpecScoresFn = void (*)(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T,
                              float scale, float* out);

// The kernel of an ISA (the scalar loop for Isa::kScalar, 8 rows per vector for kAvx2, 16 for kAvx512).
SpecScoresFn spec_scores_kernel(Isa isa);

void spec_scores_ref(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                     float* out);

// Each query head's scores kept apart (the relative group rule of policy::speculate needs every head's
// own maximum): out[j * ld + t] = scale · (sum over c ascending of q[j][c] · f32(pk[t][c])), the same
// rounding as above, for j < G and t < T; ld >= T.
using SpecHeadScoresFn = void (*)(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T,
                                  float scale, float* out, int64_t ld);
SpecHeadScoresFn spec_head_scores_kernel(Isa isa);
void spec_head_scores_ref(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                          float* out, int64_t ld);
void spec_head_scores_avx2(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                           float* out, int64_t ld);
void spec_scores_avx2(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                      float* out);
void spec_head_scores_avx512(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                             float* out, int64_t ld);
void spec_scores_avx512(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                        float* out);

}  // namespace kvtier::cpu
