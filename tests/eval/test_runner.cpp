// The runner with a stand-in engine: every policy sees the same prompts, an oracle scores 1, a
// blind policy 0, ppl of uniform logits is the vocabulary size, progress counts up, and exact
// comparison finds the samples where two policies differ.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "eval/runner.h"
#include "fake_engine.h"

namespace kvtier::eval {
namespace {

EvalPlan plan(std::vector<std::string> policies) {
  EvalPlan p;
  p.tasks = {TaskKind::kPasskey, TaskKind::kNiah, TaskKind::kNiahMultiQuery, TaskKind::kVt, TaskKind::kPpl};
  p.grid.lengths = {500, 1000};
  p.grid.depths = {0.0, 1.0};
  p.grid.samples = 2;
  p.grid.seed = 3;
  p.policies = std::move(policies);
  return p;
}

TEST(Runner, OracleScoresOneBlindScoresZero) {
  testing::FakeEngine e("blind");
  const Results r = run_eval(e, plan({"resident", "blind"}));
  // passkey, niah, niah-mq: 2 lengths x 2 depths x 2; vt: 2 x 2; ppl: 2 x 2 windows. Per policy.
  EXPECT_EQ(r.samples().size(), 2u * (3 * 8 + 4 + 4));
  EXPECT_EQ(e.generated, 2 * (3 * 8 + 4));
  for (const Cell& c : r.overall()) {
    if (c.task == TaskKind::kPpl) {
      EXPECT_NEAR(c.value, 7.0, 1e-9);
    } else {
      EXPECT_DOUBLE_EQ(c.value, c.policy == "resident" ? 1.0 : 0.0) << task_name(c.task) << " " << c.policy;
    }
  }
  const auto depth_cells = r.depth_cells();
  EXPECT_EQ(depth_cells.size(), 2u * 3 * 2 * 2);  // policies x depth tasks x lengths x depths
  for (const Cell& c : depth_cells) EXPECT_EQ(c.n, 2);
  const auto mism = compare_policies(r, "resident", "blind");
  EXPECT_EQ(mism.size(), 3u * 8 + 4);  // every answered sample; ppl windows agree
  EXPECT_TRUE(compare_policies(r, "resident", "resident").empty());
}

TEST(Runner, DeterministicAcrossRuns) {
  testing::FakeEngine a, b;
  const Results ra = run_eval(a, plan({"resident"}));
  const Results rb = run_eval(b, plan({"resident"}));
  ASSERT_EQ(ra.samples().size(), rb.samples().size());
  for (size_t i = 0; i < ra.samples().size(); ++i) {
    EXPECT_EQ(ra.samples()[i].answer, rb.samples()[i].answer);
    EXPECT_EQ(ra.samples()[i].prompt_tokens, rb.samples()[i].prompt_tokens);
    EXPECT_EQ(ra.samples()[i].seed, rb.samples()[i].seed);
  }
}

TEST(Runner, ProgressCountsUpToTotal) {
  testing::FakeEngine e;
  std::vector<Progress> seen;
  run_eval(e, plan({"resident"}), [&](const Progress& p) { seen.push_back(p); });
  ASSERT_GE(seen.size(), 2u);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_EQ(seen[i].done, seen[i - 1].done + 1);
  EXPECT_EQ(seen.back().done, seen.back().total);
  EXPECT_EQ(seen.front().eta_s, -1.0);
  EXPECT_GE(seen[1].eta_s, 0.0);
}

TEST(Runner, BadPlansAreErrors) {
  testing::FakeEngine e;
  EXPECT_THROW(run_eval(e, plan({})), Error);
  EvalPlan p = plan({"resident"});
  p.grid.samples = 0;
  EXPECT_THROW(run_eval(e, p), Error);
  p = plan({"resident"});
  p.tasks = {TaskKind::kPpl};
  p.ppl_text = "too short";
  EXPECT_THROW(run_eval(e, p), Error);
}

}  // namespace
}  // namespace kvtier::eval
