// Prose tasks for training data: the answer is a span of the prompt.
#include <gtest/gtest.h>

#include "core/error.h"
#include "locret/prose_tasks.h"

namespace kvtier::locret {
namespace {

const char* kText =
    "The first sentence of this text has enough words in it. A second sentence follows it here and now!\n"
    "Is the third sentence a question that has six words?  Short one.\n\n"
    "A short heading\n\n"
    "The fifth sentence continues over\na line break and has many words. "
    "Sentence six is here with seven words. Sentence seven is also long enough to count. "
    "Sentence eight keeps the text going for the test. Sentence nine is the penultimate one of all. "
    "Sentence ten closes the text with a final period.";

TEST(LocretProse, SplitsSentencesAndDropsFragments) {
  const auto s = split_sentences(kText);
  ASSERT_EQ(s.size(), 9u);
  EXPECT_EQ(s[0], "The first sentence of this text has enough words in it.");
  EXPECT_EQ(s[1], "A second sentence follows it here and now!");
  EXPECT_EQ(s[2], "Is the third sentence a question that has six words?");
  EXPECT_EQ(s[3],
            "The fifth sentence continues over a line break and has many words.");  // joined, no heading
}

TEST(LocretProse, AnswersAreSpansOfThePromptAndSeeded) {
  const auto s = split_sentences(kText);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const QaText r = sentence_recall(s, 300, seed);
    EXPECT_NE(r.prompt.find(r.answer), std::string::npos);
    EXPECT_NE(r.prompt.find("begins with \"" + r.answer.substr(0, r.answer.find(' '))), std::string::npos);
    EXPECT_GE(r.prompt.size(), 300u);
    const QaText n = prose_needle(s, 500, seed);
    EXPECT_NE(n.prompt.find(n.answer), std::string::npos);  // the fact sentence is the answer
    EXPECT_EQ(sentence_recall(s, 300, seed).prompt, r.prompt);
  }
  EXPECT_NE(prose_needle(s, 500, 1).answer, prose_needle(s, 500, 2).answer);
  EXPECT_THROW(sentence_recall({"one two three four five six."}, 100, 0), Error);
}

}  // namespace
}  // namespace kvtier::locret
