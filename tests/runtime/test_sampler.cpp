// Sampler: greedy, reproducible seeds, the support of top-k / top-p / min-p, and the penalties.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"

namespace kvtier::runtime {
namespace {

std::vector<float> logits() {
  // Token i has logit -0.5 i: probabilities fall geometrically.
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = -0.5f * static_cast<float>(i);
  l[7] = 3.0f;  // the maximum
  return l;
}

// Out-of-range and NaN parameters are refused when the sampler is made, naming the flag; the documented
// spellings of "off" and "greedy" (temperature <= 0, top_k <= 0, penalty window -1 or 0) are not.
TEST(Sampler, RefusesParametersOutOfRangeOrNaN) {
  auto refused = [](SamplerParams p, const char* flag) {
    try {
      Sampler s(p, 50);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << flag << " accepted";
  };
  const std::vector<std::pair<void (*)(SamplerParams&), const char*>> cases = {
      {[](SamplerParams& q) { q.top_p = 1.5f; }, "--top-p"},
      {[](SamplerParams& q) { q.top_p = 0.0f; }, "--top-p"},
      {[](SamplerParams& q) { q.top_p = std::numeric_limits<float>::quiet_NaN(); }, "--top-p"},
      {[](SamplerParams& q) { q.min_p = std::numeric_limits<float>::quiet_NaN(); }, "--min-p"},
      {[](SamplerParams& q) { q.repeat_penalty = std::numeric_limits<float>::quiet_NaN(); },
       "--repeat-penalty"},
      {[](SamplerParams& q) { q.temperature = std::numeric_limits<float>::quiet_NaN(); }, "--temp"},
      {[](SamplerParams& q) { q.frequency_penalty = std::numeric_limits<float>::quiet_NaN(); },
       "--frequency-penalty"},
      {[](SamplerParams& q) { q.penalty_last_n = -2; }, "--repeat-last-n"},
  };
  for (const auto& [set, flag] : cases) {
    SamplerParams q;
    set(q);
    refused(q, flag);
  }
  SamplerParams p;
  p.temperature = -1.0f;
  p.top_k = -1;
  p.penalty_last_n = -1;
  Sampler greedy(p, 50);
  EXPECT_EQ(greedy.sample(logits(), {}), 7);
}

TEST(Sampler, GreedyTakesTheArgmax) {
  Sampler s({}, 50);
  EXPECT_EQ(s.sample(logits(), {}), 7);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  SamplerParams p;
  p.temperature = 1.5f;
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p, 50);
    std::vector<TokenId> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits(), {}));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

std::set<TokenId> support(SamplerParams p, int n = 2000) {
  p.temperature = p.temperature > 0 ? p.temperature : 1.0f;
  Sampler s(p, 50);
  std::set<TokenId> seen;
  for (int i = 0; i < n; ++i) seen.insert(s.sample(logits(), {}));
  return seen;
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  SamplerParams p;
  p.top_k = 3;
  EXPECT_EQ(support(p), (std::set<TokenId>{7, 0, 1}));
  p = {};
  p.top_k = 1;
  EXPECT_EQ(support(p, 50), (std::set<TokenId>{7}));
  p = {};
  p.min_p = 0.5f;  // p_i >= 0.5 p_max <=> logit >= 3 + ln 0.5: only token 7
  EXPECT_EQ(support(p, 200), (std::set<TokenId>{7}));
  p = {};
  p.min_p = 0.02f;  // logit >= 3 + ln 0.02 = -0.91: tokens 7, 0, 1
  EXPECT_EQ(support(p), (std::set<TokenId>{7, 0, 1}));
  p = {};
  p.top_p = 0.5f;  // token 7 alone holds more than half the mass
  EXPECT_EQ(support(p, 200), (std::set<TokenId>{7}));
  p = {};
  p.temperature = 3.0f;
  EXPECT_GT(support(p).size(), 10u);
}

TEST(Sampler, PenaltiesDemoteSeenTokens) {
  SamplerParams p;
  p.repeat_penalty = 100.0f;  // logit 3 / 100 = 0.03 < logit of token 0 (0)? no: 0.03 > 0
  Sampler s(p, 50);
  const std::vector<TokenId> hist{7};
  EXPECT_EQ(s.sample(logits(), hist), 7);
  p = {};
  p.presence_penalty = 3.5f;
  Sampler s2(p, 50);
  EXPECT_EQ(s2.sample(logits(), hist), 0);
  p = {};
  p.frequency_penalty = 1.0f;
  Sampler s3(p, 50);
  EXPECT_EQ(s3.sample(logits(), std::vector<TokenId>{7, 7}), 7);        // 3 - 2 = 1 > 0
  EXPECT_EQ(s3.sample(logits(), std::vector<TokenId>{7, 7, 7, 7}), 0);  // 3 - 4 < 0
  p = {};
  p.repeat_penalty = 2.0f;
  p.penalty_last_n = 1;  // only the last token counts
  Sampler s4(p, 50);
  EXPECT_EQ(s4.sample(logits(), std::vector<TokenId>{7, 0}), 7);
}

}  // namespace
}  // namespace kvtier::runtime
