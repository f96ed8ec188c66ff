// Perplexity as llama.cpp's llama-perplexity computes it: the token sequence is cut into windows of
// n_ctx tokens (the first token of each replaced by BOS when the model adds one), each window is
// evaluated from an empty cache, and the second half of each window is scored:
//   nll = -sum log p(tok[j + 1] | tok[..j]) for j in [n_ctx / 2, n_ctx - 1),  ppl = exp(nll / count)
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/session.h"

namespace kvtier::runtime {

struct PerplexityResult {
  double perplexity = 0.0;
  double nll = 0.0;  // mean negative log-likelihood (nats)
  int64_t n_windows = 0;
  int64_t n_scored = 0;
  std::vector<double> window_ppl;  // perplexity of each window alone
  double seconds = 0.0;
};

// `n_ctx` <= s.n_ctx(); at most `max_windows` windows (0: all). Throws if the text is shorter than
// two windows' worth of scoring (fewer than n_ctx tokens).
PerplexityResult perplexity(Session& s, std::span<const TokenId> tokens, int64_t n_ctx,
                            int64_t max_windows = 0, const ProgressFn& progress = {});

}  // namespace kvtier::runtime
