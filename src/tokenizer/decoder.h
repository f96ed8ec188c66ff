// Streaming detokenisation: text is released only in whole UTF-8 characters. A token that ends in
// the middle of a character is held back until the character completes; bytes that can never form
// a character are released as U+FFFD.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace kvtier::tokenizer {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, DecodeOptions opt = {}) : tok_(tok), opt_(opt) {}

  // Adds one token; returns the text that is now complete (possibly empty).
  std::string push(TokenId id);
  // Ends the stream: whatever is held back, an incomplete character as U+FFFD.
  std::string flush();

 private:
  const Tokenizer& tok_;
  DecodeOptions opt_;
  std::string pending_;  // bytes of an incomplete trailing character
  bool first_ = true;
};

}  // namespace kvtier::tokenizer
