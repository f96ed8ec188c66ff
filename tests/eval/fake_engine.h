// Stand-ins for the model in the harness tests: a token counter (whitespace-separated words) and
// an engine that answers by reading the needles out of the prompt (an oracle), optionally failing
// for some policy, and returns fixed logits for ppl.
#pragma once

#include <regex>
#include <span>
#include <string>
#include <vector>

#include "eval/runner.h"

namespace kvtier::eval::testing {

inline int64_t count_words(std::string_view s) {
  int64_t n = 0;
  bool in = false;
  for (char c : s) {
    const bool sp = c == ' ' || c == '\n';
    if (!sp && !in) ++n;
    in = !sp;
  }
  return n;
}

inline int64_t count_prompt(const Prompt& p) {
  return count_words(p.user) + count_words(p.answer_prefix) + 4;
}

class FakeEngine : public Engine {
 public:
  // `blind_policy`: under this policy the engine answers "I do not know".
  explicit FakeEngine(std::string blind_policy = "") : blind_(std::move(blind_policy)) {}
  int64_t count_tokens(const Prompt& p) override { return count_prompt(p); }
  std::vector<int32_t> tokenize(std::string_view text) override {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < count_words(text); ++i) ids.push_back(static_cast<int32_t>(i % 7));
    return ids;
  }
  void use_policy(const std::string& policy) override { policy_ = policy; }
  std::string generate(const Prompt& p, int) override {
    ++generated;
    if (policy_ == blind_) return " I do not know.";
    // Oracle: every number after "is: ", the pass key, and every VAR name.
    std::string out;
    static const std::regex re(R"(is: (\d+)\.|pass key is (\d+)|VAR ([A-Z]{5}) =)");
    for (std::sregex_iterator it(p.user.begin(), p.user.end(), re), end; it != end; ++it) {
      for (size_t g = 1; g < it->size(); ++g) {
        if ((*it)[g].matched) out += " " + (*it)[g].str();
      }
    }
    return out;
  }
  void evaluate(std::span<const int32_t> tokens,
                const std::function<void(int64_t, std::span<const float>)>& fn) override {
    std::vector<float> logits(7, 0.0f);  // uniform: perplexity 7
    for (size_t i = 0; i < tokens.size(); ++i) fn(static_cast<int64_t>(i), logits);
  }
  int generated = 0;

 private:
  std::string blind_;
  std::string policy_;
};

}  // namespace kvtier::eval::testing
