// Training labels of Locret (spec locret.md §3.3): the causal importance score of prompt token k in
// KV head j of a layer is the largest pre-softmax attention logit any answer token sends to it,
// over the query heads of j's group (query head i reads KV head floor(i / g)):
//
//   Y[j][k] = max over answer p, i in group j of  logit(scale * q_i[p] . k_j[k])
//
// with post-RoPE q and k at their true positions, logit(s) = s, or c tanh(s / c) for a model with
// attention soft-capping c. Computed in f32 with double accumulation.
#pragma once

#include <cstdint>

namespace kvtier::locret {

struct LabelInputs {
  const float* q_answer = nullptr;  // [n_answer, n_head, dk] f32, post-RoPE
  const float* k_prompt = nullptr;  // [n_prompt, n_head_kv, dk] f32, post-RoPE
  int64_t n_answer = 0;
  int64_t n_prompt = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;    // multiplies q.k (1/sqrt(d) for most models)
  float softcap = 0.0f;  // > 0: the model's attention soft-capping
};

// Y: [n_head_kv, n_prompt] f32
void cis_labels(const LabelInputs& in, float* Y);

}  // namespace kvtier::locret
