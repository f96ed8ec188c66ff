// Task generation: determinism, lengths, needle placement, expected answers; seeded RNG; names.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "eval/rng.h"
#include "eval/task.h"
#include "eval/text.h"
#include "fake_engine.h"

namespace kvtier::eval {
namespace {

using testing::count_prompt;

const std::vector<TaskKind> kGenerated = {
    TaskKind::kPasskey,        TaskKind::kNiah, TaskKind::kNiahMultiKey, TaskKind::kNiahMultiValue,
    TaskKind::kNiahMultiQuery, TaskKind::kVt,   TaskKind::kCwe};

TEST(Rng, DeterministicAndInRange) {
  Rng a(42), b(42), c(43);
  EXPECT_EQ(a.next(), b.next());
  EXPECT_NE(a.next(), c.next());
  for (int i = 0; i < 1000; ++i) {
    const uint64_t v = a.below(7);
    EXPECT_LT(v, 7u);
    const int64_t w = a.between(-3, 3);
    EXPECT_GE(w, -3);
    EXPECT_LE(w, 3);
    const double u = a.unit();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
  // A fixed value pins the generator across platforms and standard libraries.
  EXPECT_EQ(Rng(0).next(), Rng(0).next());
  EXPECT_NE(mix_seed(1, {2, 3}), mix_seed(1, {3, 2}));
  EXPECT_EQ(mix_seed(1, {2, 3}), mix_seed(1, {2, 3}));
  Rng r(5);
  const std::string n = random_number(r, 7);
  EXPECT_EQ(n.size(), 7u);
  EXPECT_NE(n[0], '0');
}

TEST(Rng, AllValuesDrawn) {
  Rng r(9);
  std::set<uint64_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(r.below(10));
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Text, FillerStreamIsPrefixStable) {
  const FillerStream essay(Filler::kEssay, 17);
  const std::string t10 = essay.text(10);
  EXPECT_EQ(essay.text(20).substr(0, t10.size()), t10);
  EXPECT_NE(FillerStream(Filler::kEssay, 18).text(10), t10);
  EXPECT_EQ(FillerStream(Filler::kPasskey, 0).text(2), "The grass is green. The sky is blue. ");
  Rng r(3);
  const auto words = distinct_words(r, 500);
  EXPECT_EQ(std::set<std::string>(words.begin(), words.end()).size(), 500u);
}

TEST(Tasks, NamesRoundTripAndErrors) {
  for (TaskKind t : kGenerated) EXPECT_EQ(parse_task(task_name(t)), t);
  EXPECT_EQ(parse_task("ppl"), TaskKind::kPpl);
  try {
    parse_task("needle");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("niah-mq"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_task_list("niah-all").size(), 4u);
  EXPECT_EQ(parse_task_list("all").size(), 8u);
  EXPECT_EQ(parse_task_list("vt, cwe,vt"), (std::vector<TaskKind>{TaskKind::kVt, TaskKind::kCwe}));
}

GridSpec small_grid(uint64_t seed) {
  GridSpec g;
  g.lengths = {600, 1200};
  g.depths = {0.0, 0.5, 1.0};
  g.samples = 2;
  g.seed = seed;
  return g;
}

TEST(Tasks, SameSeedSamePromptsOtherSeedOthers) {
  for (TaskKind t : kGenerated) {
    const auto a = make_samples(t, small_grid(1), count_prompt);
    const auto b = make_samples(t, small_grid(1), count_prompt);
    const auto c = make_samples(t, small_grid(2), count_prompt);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.size(), (task_has_depth(t) ? 3u : 1u) * 2 * 2);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].prompt.user, b[i].prompt.user) << task_name(t);
      EXPECT_EQ(a[i].expected, b[i].expected);
      EXPECT_NE(a[i].prompt.user, c[i].prompt.user) << task_name(t);
    }
    // Samples within a cell differ.
    EXPECT_NE(a[0].prompt.user, a[1].prompt.user) << task_name(t);
  }
}

TEST(Tasks, CellDoesNotDependOnTheRestOfTheGrid) {
  GridSpec one = small_grid(7);
  one.lengths = {1200};
  one.depths = {0.5};
  const auto a = make_samples(TaskKind::kNiah, one, count_prompt);
  const auto b = make_samples(TaskKind::kNiah, small_grid(7), count_prompt);
  const auto it =
      std::find_if(b.begin(), b.end(), [](const Sample& s) { return s.length == 1200 && s.depth == 0.5; });
  ASSERT_NE(it, b.end());
  EXPECT_EQ(a[0].prompt.user, it->prompt.user);
}

TEST(Tasks, PromptsFillTheLengthAndHoldTheAnswers) {
  for (TaskKind t : kGenerated) {
    for (const Sample& s : make_samples(t, small_grid(3), count_prompt)) {
      EXPECT_EQ(s.prompt_tokens, count_prompt(s.prompt));
      const int64_t budget = s.length - s.max_new_tokens;
      EXPECT_LE(s.prompt_tokens, budget) << task_name(t);
      EXPECT_GE(s.prompt_tokens, budget * 9 / 10) << task_name(t) << " " << s.length;
      ASSERT_FALSE(s.expected.empty());
      for (const auto& e : s.expected)
        EXPECT_NE(s.prompt.user.find(e), std::string::npos) << task_name(t) << ": " << e;
    }
  }
}

// Position of `needle` in the haystack as a fraction of the prompt (instructions are short).
double position(const Sample& s, const std::string& needle) {
  return static_cast<double>(s.prompt.user.find(needle)) / static_cast<double>(s.prompt.user.size());
}

TEST(Tasks, NeedleSitsAtItsDepth) {
  GridSpec g = small_grid(11);
  g.lengths = {4000};
  g.depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  g.samples = 1;
  for (TaskKind t : {TaskKind::kPasskey, TaskKind::kNiah}) {
    for (const Sample& s : make_samples(t, g, count_prompt)) {
      EXPECT_NEAR(position(s, s.expected[0]), s.depth, 0.06) << task_name(t) << " depth " << s.depth;
    }
  }
}

size_t occurrences(const std::string& text, const std::string& w) {
  size_t n = 0;
  for (size_t p = text.find(". " + w + " "); p != std::string::npos; p = text.find(". " + w + " ", p + 1))
    ++n;
  return n;
}

TEST(Tasks, VariantsHaveTheirShapes) {
  GridSpec g = small_grid(5);
  g.lengths = {2000};
  g.depths = {0.5};
  g.samples = 1;
  const Sample mk = make_samples(TaskKind::kNiahMultiKey, g, count_prompt)[0];
  EXPECT_EQ(mk.expected.size(), 1u);
  size_t needles = 0;
  for (size_t p = mk.prompt.user.find("One of the special magic numbers for "); p != std::string::npos;
       p = mk.prompt.user.find("One of the special magic numbers for ", p + 1))
    ++needles;
  EXPECT_EQ(needles, 4u);
  EXPECT_EQ(make_samples(TaskKind::kNiahMultiValue, g, count_prompt)[0].expected.size(), 4u);
  const Sample mq = make_samples(TaskKind::kNiahMultiQuery, g, count_prompt)[0];
  EXPECT_EQ(mq.expected.size(), 4u);
  EXPECT_NE(mq.prompt.answer_prefix.find(", and "), std::string::npos) << mq.prompt.answer_prefix;

  const Sample vt = make_samples(TaskKind::kVt, g, count_prompt)[0];
  ASSERT_EQ(vt.expected.size(), 5u);
  for (size_t i = 1; i < 5; ++i)  // the chain is in order
    EXPECT_LT(vt.prompt.user.find("VAR " + vt.expected[i - 1] + " ="),
              vt.prompt.user.find("VAR " + vt.expected[i] + " ="));

  const Sample cwe = make_samples(TaskKind::kCwe, g, count_prompt)[0];
  ASSERT_EQ(cwe.expected.size(), 10u);
  for (const auto& w : cwe.expected) EXPECT_GE(occurrences(cwe.prompt.user, w), 10u) << w;
}

TEST(Tasks, TooShortIsAnError) {
  GridSpec g = small_grid(1);
  g.lengths = {40};
  try {
    make_samples(TaskKind::kNiah, g, count_prompt);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too short"), std::string::npos) << e.what();
  }
  g.lengths = {600};
  g.depths = {1.5};
  EXPECT_THROW(make_samples(TaskKind::kNiah, g, count_prompt), Error);
  EXPECT_THROW(make_samples(TaskKind::kPpl, g, count_prompt), Error);
}

}  // namespace
}  // namespace kvtier::eval
