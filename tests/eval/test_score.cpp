// Exact-match scoring and perplexity arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "eval/ppl.h"
#include "eval/score.h"

namespace kvtier::eval {
namespace {

TEST(Score, WholeWordMatch) {
  EXPECT_TRUE(contains_word(" The pass key is 71432.", "71432"));
  EXPECT_TRUE(contains_word("71432", "71432"));
  EXPECT_FALSE(contains_word(" 714321", "71432"));
  EXPECT_FALSE(contains_word(" 171432", "71432"));
  EXPECT_FALSE(contains_word(" 7143", "71432"));
  EXPECT_TRUE(contains_word("are: 1234567, 7654321 and", "7654321"));
  EXPECT_TRUE(contains_word("1. Bramoli 2. teaste", "bramoli"));  // case ignored
  EXPECT_FALSE(contains_word("bramolis", "bramoli"));
  EXPECT_FALSE(contains_word("", "x"));
  EXPECT_FALSE(contains_word("abc", ""));
}

TEST(Score, FractionFound) {
  const std::vector<std::string> exp = {"1111111", "2222222", "3333333", "4444444"};
  EXPECT_DOUBLE_EQ(score_answer("1111111 and 3333333", exp), 0.5);
  EXPECT_DOUBLE_EQ(score_answer("1111111, 2222222, 3333333, 4444444", exp), 1.0);
  EXPECT_DOUBLE_EQ(score_answer("nothing", exp), 0.0);
}

TEST(Ppl, WindowsHalfOverlap) {
  const auto w = plan_windows(1000, 400, 10);
  ASSERT_EQ(w.size(), 4u);  // begins 0, 200, 400, 600
  EXPECT_EQ(w[3].begin, 600);
  EXPECT_EQ(w[0].first_scored, 199);
  EXPECT_EQ(plan_windows(1000, 400, 2).size(), 2u);
  EXPECT_TRUE(plan_windows(100, 400, 2).empty());
  EXPECT_THROW(plan_windows(100, 1, 2), Error);
}

TEST(Ppl, NllAndAccumulator) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(token_nll(logits, 2), lse - 3.0, 1e-12);
  EXPECT_NEAR(token_nll(logits, 0), lse - 1.0, 1e-12);
  const std::vector<int32_t> toks = {0, 1, 2, 0, 1, 2};
  const PplWindow w{6, 0, 0, 2};
  NllAccumulator acc(w, toks);
  for (int64_t p = 0; p < 6; ++p) acc.add(p, logits);
  // Positions 2, 3, 4 predict tokens 0, 1, 2; position 5 has no next token.
  EXPECT_EQ(acc.count(), 3);
  EXPECT_NEAR(acc.nll_sum(), 3 * lse - 6.0, 1e-12);
}

}  // namespace
}  // namespace kvtier::eval
