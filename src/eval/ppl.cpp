#include "eval/ppl.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kvtier::eval {

std::vector<PplWindow> plan_windows(int64_t n_tokens, int64_t length, int max_windows) {
  if (length < 2) fail(ErrorKind::kInvalidArgument, "ppl: window length {} is too short", length);
  std::vector<PplWindow> out;
  const int64_t stride = length / 2;
  for (int64_t begin = 0; begin + length <= n_tokens && static_cast<int>(out.size()) < max_windows;
       begin += stride) {
    out.push_back({length, static_cast<int>(out.size()), begin, length / 2 - 1});
  }
  return out;
}

double token_nll(std::span<const float> logits, int32_t target) {
  KVTIER_ASSERT(target >= 0 && static_cast<size_t>(target) < logits.size(), "target {}", target);
  double mx = logits[0];
  for (float v : logits) mx = std::max<double>(mx, v);
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return std::log(sum) + mx - static_cast<double>(logits[static_cast<size_t>(target)]);
}

NllAccumulator::NllAccumulator(const PplWindow& w, std::span<const int32_t> window_tokens)
    : w_(w), tokens_(window_tokens) {
  KVTIER_ASSERT(static_cast<int64_t>(tokens_.size()) == w.length, "window tokens {}", tokens_.size());
}

void NllAccumulator::add(int64_t pos, std::span<const float> logits) {
  if (pos < w_.first_scored || pos + 1 >= w_.length) return;
  sum_ += token_nll(logits, tokens_[static_cast<size_t>(pos + 1)]);
  ++count_;
}

}  // namespace kvtier::eval
