// Long-prompt QA over real prose for training retaining heads (the data builder `kvtier
// locret-data`): the answer is a span of the prompt, so the answer's attention marks the tokens
// that matter, as in the paper's QA data. Two kinds:
//   recall: a window of consecutive sentences; the question quotes the first words of one of them
//           and asks for the whole sentence (the answer is that sentence).
//   needle: a window of prose with one made-up fact ("The access code of the <adjective> <noun>
//           is <7 digits>.") at a seeded depth; the question asks for the code.
// Deterministic in (sentences, chars, seed). No tokenizer here: the caller fits `chars` to a token
// length with its model's tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::locret {

struct QaText {
  std::string prompt;
  std::string answer;
};

// Sentences of a text: split after '.', '?' or '!' followed by white space, and at blank lines;
// white space runs collapsed to one space; sentences of fewer than 6 words or more than 80 are
// dropped (headings, list items, legal run-ons).
std::vector<std::string> split_sentences(std::string_view text);

// Needs at least 8 sentences (Error(kInvalidArgument) otherwise).
QaText sentence_recall(const std::vector<std::string>& sentences, int64_t chars, uint64_t seed);
QaText prose_needle(const std::vector<std::string>& sentences, int64_t chars, uint64_t seed);

}  // namespace kvtier::locret
