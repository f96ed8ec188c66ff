// Generated text as it may be shown: tokens decoded in whole UTF-8 characters, stop strings cut out,
// and text that may be the start of a stop string held back until it is not. Used by generate() and
// by the server, token by token.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/forward.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"

namespace kvtier::runtime {

class TextStream {
 public:
  TextStream(const tokenizer::Tokenizer& tok, std::vector<std::string> stop);

  // Adds a generated token (not an end-of-generation one); returns the text that can be released now.
  // After a stop string matched, stopped() is true and the text up to it has been released.
  std::string push(model::TokenId id);
  // Ends the stream: returns what was held back (nothing after a stop string).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  tokenizer::StreamDecoder dec_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded but not yet released (may start a stop string)
  bool stopped_ = false;
};

}  // namespace kvtier::runtime
