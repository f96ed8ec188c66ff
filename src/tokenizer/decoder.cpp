#include "tokenizer/decoder.h"

#include "tokenizer/utf8.h"

namespace kvtier::tokenizer {

std::string StreamDecoder::push(TokenId id) {
  const std::string p = tok_.piece(id, first_, opt_);
  if (!p.empty()) first_ = false;
  pending_ += p;
  const size_t hold = utf8_incomplete_tail(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace kvtier::tokenizer
