#include "runtime/text_stream.h"

#include <algorithm>
#include <utility>

namespace kvtier::runtime {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t held_suffix(std::string_view text, const std::vector<std::string>& stop) {
  size_t best = 0;
  for (const auto& s : stop) {
    for (size_t n = std::min(text.size(), s.size() - 1); n > best; --n) {
      if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
        best = n;
        break;
      }
    }
  }
  return best;
}

}  // namespace

TextStream::TextStream(const tokenizer::Tokenizer& tok, std::vector<std::string> stop)
    : dec_(tok, {.render_special = false}), stop_(std::move(stop)) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

std::string TextStream::push(model::TokenId id) {
  if (stopped_) return {};
  pending_ += dec_.push(id);
  // Stop strings: cut at the first match; otherwise release all but a possible stop prefix.
  size_t cut = std::string::npos;
  for (const auto& st : stop_) cut = std::min(cut, pending_.find(st));
  if (cut != std::string::npos) {
    pending_.resize(cut);
    stopped_ = true;
    return std::exchange(pending_, {});
  }
  const size_t hold = held_suffix(pending_, stop_);
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  pending_ += dec_.flush();
  return std::exchange(pending_, {});
}

}  // namespace kvtier::runtime
