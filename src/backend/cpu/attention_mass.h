// The attention mass each key receives (H2O's accumulated attention score): for every query token t
// and query head of KV head h, the probability softmax gave key j, exp(score(t, j) - lse(t)), added to
// mass[h][j]. Computed after attend() from its log-sum-exp with the same scores (scale, soft-cap,
// causal mask, window), so policies that do not ask for it pay nothing.
#pragma once

#include <cstdint>

#include "backend/cpu/attention.h"
#include "core/thread_pool.h"

namespace kvtier::cpu {

// Largest head size and GQA group key_mass handles (its per-thread buffers are on the stack).
constexpr int64_t kMassMaxHeadDim = 512;
constexpr int64_t kMassMaxGroup = 32;

// mass[h * mass_stride + j] += sum over the queries' tokens t and the q_per_kv query heads g of KV head
// h (query head h * q_per_kv + g) of exp(s(t, g, j) - lse[t * lse_stride + h * q_per_kv + g]), for the
// span's keys j = 0 .. span.n_tokens - 1 (key j at position span.pos0 + j). q.n_heads = q_per_kv * (KV
// heads of the span); work is split over the KV heads.
void accumulate_key_mass(ThreadPool& pool, Isa isa, const AttnParams& p, const AttnQueries& q,
                         const KvSpan& span, const float* lse, int64_t lse_stride, float* mass,
                         int64_t mass_stride);

}  // namespace kvtier::cpu
