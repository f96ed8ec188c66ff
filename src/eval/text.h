// Haystack text, generated (no external corpus, so no licence question): the standard passkey
// filler, and "essay" prose built by a seeded grammar from a built-in English vocabulary. Plus
// the random keys and words the tasks hide in it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "eval/rng.h"

namespace kvtier::eval {

enum class Filler : uint8_t {
  kPasskey,  // "The grass is green. The sky is blue. ..." repeated (Landmark-attention / Locret passkey)
  kEssay,    // varied English sentences from a seeded grammar
};

std::string_view filler_name(Filler f);

// Sentence `i` of a filler stream (each ends with ". " or a paragraph break). Deterministic in
// (f, stream_seed, i): the first n sentences of a stream never change with n.
class FillerStream {
 public:
  FillerStream(Filler f, uint64_t stream_seed) : filler_(f), seed_(stream_seed) {}
  std::string sentence(int64_t i) const;
  // Sentences [0, n) concatenated.
  std::string text(int64_t n) const;

 private:
  Filler filler_;
  uint64_t seed_;
};

// "adjective-noun" (e.g. "quiet-harbor"): a needle key.
std::string random_key(Rng& rng);
// An English-looking lower-case pseudo word of 2-3 syllables (e.g. "bramoli"), for word lists.
std::string random_word(Rng& rng);
// `n` distinct pseudo words, none in `avoid`.
std::vector<std::string> distinct_words(Rng& rng, size_t n, const std::vector<std::string>& avoid = {});
// Five upper-case letters: a variable name for variable tracking.
std::string random_variable(Rng& rng);

}  // namespace kvtier::eval
