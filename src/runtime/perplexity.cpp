#include "runtime/perplexity.h"

#include <chrono>
#include <cmath>

#include "core/error.h"

namespace kvtier::runtime {

PerplexityResult perplexity(Session& s, std::span<const TokenId> tokens, int64_t n_ctx, int64_t max_windows,
                            const ProgressFn& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  if (n_ctx < 4 || n_ctx > s.n_ctx()) {
    fail(ErrorKind::kInvalidArgument, "perplexity window of {} tokens (the session holds {})", n_ctx,
         s.n_ctx());
  }
  int64_t n_windows = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (max_windows > 0) n_windows = std::min(n_windows, max_windows);
  if (n_windows == 0) {
    fail(ErrorKind::kInvalidArgument, "the text has {} tokens; perplexity needs at least --ctx = {}",
         tokens.size(), n_ctx);
  }
  const auto& vocab = s.model().tokenizer->vocab();
  const bool add_bos = vocab.add_bos && vocab.special.bos != tokenizer::kNoToken;
  const int64_t first = n_ctx / 2;
  PerplexityResult r;
  r.n_windows = n_windows;
  std::vector<TokenId> window(static_cast<size_t>(n_ctx));
  double total = 0.0;
  for (int64_t w = 0; w < n_windows; ++w) {
    const auto start = static_cast<size_t>(w * n_ctx);
    std::copy(tokens.begin() + static_cast<int64_t>(start),
              tokens.begin() + static_cast<int64_t>(start) + n_ctx, window.begin());
    if (add_bos) window[0] = vocab.special.bos;
    s.truncate(0);
    double nll = 0.0;
    s.evaluate(
        window,
        [&](int64_t pos, std::span<const float> logits) {
          if (pos < first || pos >= n_ctx - 1) return;
          double mx = logits[0];
          for (float x : logits) mx = std::max(mx, static_cast<double>(x));
          double z = 0.0;
          for (float x : logits) z += std::exp(static_cast<double>(x) - mx);
          const TokenId target = tokens[start + static_cast<size_t>(pos) + 1];
          nll -= static_cast<double>(logits[static_cast<size_t>(target)]) - mx - std::log(z);
        },
        [&](int64_t done, int64_t total_w) {
          if (progress) progress(w * n_ctx + done, n_windows * total_w);
        });
    const int64_t scored = n_ctx - 1 - first;
    r.window_ppl.push_back(std::exp(nll / static_cast<double>(scored)));
    total += nll;
    r.n_scored += scored;
  }
  r.nll = total / static_cast<double>(r.n_scored);
  r.perplexity = std::exp(r.nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvtier::runtime
