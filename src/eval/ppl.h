// Perplexity in sliding windows: the text's tokens are cut into windows of `length` tokens with a
// stride of `length / 2`; each window is evaluated from an empty context and the second half of
// its positions is scored (so every scored token sees at least length/2 tokens of context), as
// llama.cpp's perplexity does. Model-free: the caller evaluates windows and hands over logits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::eval {

struct PplWindow {
  int64_t length = 0;        // window size (the grid length)
  int index = 0;             // window number
  int64_t begin = 0;         // first token of the window in the text
  int64_t first_scored = 0;  // offset within the window of the first position whose next token is scored
};

// Up to `max_windows` windows of `length` tokens over `n_tokens` (a shorter text gives fewer).
std::vector<PplWindow> plan_windows(int64_t n_tokens, int64_t length, int max_windows);

// -log softmax(logits)[target], computed in double.
double token_nll(std::span<const float> logits, int32_t target);

// Accumulates the NLL of a window: add(pos, logits) with the logits after window position `pos`;
// positions before first_scored and the last position (no next token) are ignored.
class NllAccumulator {
 public:
  NllAccumulator(const PplWindow& w, std::span<const int32_t> window_tokens);
  void add(int64_t pos, std::span<const float> logits);
  double nll_sum() const { return sum_; }
  int64_t count() const { return count_; }

 private:
  PplWindow w_;
  std::span<const int32_t> tokens_;
  double sum_ = 0.0;
  int64_t count_ = 0;
};

}  // namespace kvtier::eval
