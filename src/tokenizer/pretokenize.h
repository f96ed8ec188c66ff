// Pre-tokenisation of byte-level BPE: splitting text into the pieces BPE runs on, with the
// Unicode-class regular expressions of each model family (PCRE2, JIT-compiled).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "tokenizer/types.h"

namespace kvtier::tokenizer {

struct Span {
  size_t begin = 0;
  size_t end = 0;
};

class PreTokenizerRegex {
 public:
  explicit PreTokenizerRegex(PreTokenizer kind);
  ~PreTokenizerRegex();
  PreTokenizerRegex(const PreTokenizerRegex&) = delete;
  PreTokenizerRegex& operator=(const PreTokenizerRegex&) = delete;

  // Appends the pieces of `text` (byte ranges, relative to text, covering it in order) to `out`.
  // Text that no rule matches (invalid UTF-8, say) becomes pieces of its own. Thread-safe.
  void split(std::string_view text, std::vector<Span>& out) const;

  PreTokenizer kind() const { return kind_; }

 private:
  struct Impl;
  PreTokenizer kind_;
  std::unique_ptr<Impl> impl_;
};

// The regular expression (PCRE2 syntax) of a pre-tokeniser.
std::string_view pre_tokenizer_regex(PreTokenizer kind);

}  // namespace kvtier::tokenizer
