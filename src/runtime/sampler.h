// Token sampling: penalties, then greedy (temperature <= 0) or top-k -> top-p -> min-p ->
// temperature -> a draw from the softmax. Reproducible: the draw uses a seeded 64-bit Mersenne
// twister and a portable uniform from its top 53 bits. Buffers are sized once for the vocabulary.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "model/forward.h"

namespace kvtier::runtime {

using model::TokenId;

struct SamplerParams {
  float temperature = 0.0f;        // <= 0: greedy (argmax after penalties)
  int top_k = 0;                   // <= 0: off
  float top_p = 1.0f;              // >= 1: off
  float min_p = 0.0f;              // <= 0: off (keep p >= min_p * p_max)
  float repeat_penalty = 1.0f;     // 1: off (logit / penalty if > 0, else * penalty)
  float presence_penalty = 0.0f;   // minus this once for a token seen in the window
  float frequency_penalty = 0.0f;  // minus this per occurrence in the window
  int penalty_last_n = 64;         // window of history the penalties look at (0: none, -1: all)
  uint64_t seed = 0;
};

// Throws Error(kInvalidArgument), naming the CLI flag, for parameters out of range or NaN (the
// Sampler's constructor checks them too; a server checks a request's before it queues it).
void check_sampler_params(const SamplerParams& p);

class Sampler {
 public:
  Sampler(const SamplerParams& p, uint32_t n_vocab);

  // history: the tokens so far (prompt and generated), for the penalties.
  TokenId sample(std::span<const float> logits, std::span<const TokenId> history);
  const SamplerParams& params() const { return p_; }

 private:
  struct Cand {
    float logit;
    TokenId id;
  };
  double uniform();

  SamplerParams p_;
  std::vector<float> work_;       // [n_vocab] logits after penalties
  std::vector<Cand> cand_;        // [n_vocab] candidates
  std::vector<uint32_t> counts_;  // [n_vocab] occurrences in the penalty window
  std::vector<TokenId> touched_;  // ids with non-zero counts (to reset them)
  std::mt19937_64 rng_;
};

}  // namespace kvtier::runtime
