// The reference of the batching tests: one sequence alone in a session of its own, its prompt
// prefilled and then n_gen - 1 greedy decode steps. A batched run must give each sequence these bits.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "runtime/session.h"

namespace kvtier::runtime::test {

inline TokenId greedy_argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// The logits each of the n_gen generated tokens is chosen from: [n_gen, n_vocab] f32, concatenated.
inline std::vector<float> greedy_logits_alone(const LoadedModel& model, const SessionOptions& o,
                                              std::span<const TokenId> prompt, int n_gen) {
  Session s(model, o);
  std::vector<float> out;
  std::span<const float> l = s.prefill(prompt);
  for (int g = 0; g < n_gen; ++g) {
    out.insert(out.end(), l.begin(), l.end());
    if (g + 1 < n_gen) l = s.decode(greedy_argmax(l));
  }
  return out;
}

}  // namespace kvtier::runtime::test
