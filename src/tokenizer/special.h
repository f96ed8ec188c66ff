// Added tokens (control and user-defined) found whole in the input before the encoder runs:
// leftmost-longest matching over a byte trie, as HF tokenizers' added vocabulary does.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/types.h"

namespace kvtier::tokenizer {

struct Vocab;

// A run of the input: an added token, or text for the encoder.
struct Fragment {
  size_t begin = 0;
  size_t end = 0;
  TokenId token = kNoToken;  // kNoToken: plain text
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const Vocab& vocab);

  // Splits `text` into fragments. Control tokens count only when `parse_special`; otherwise a
  // control token's text is plain text (and is not searched for other tokens inside it).
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

 private:
  struct Node {
    TokenId token = kNoToken;  // token ending here
    bool control = false;
  };
  int32_t child(int32_t node, uint8_t byte) const {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | byte);
    return it == edges_.end() ? -1 : it->second;
  }
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> node
  std::array<bool, 256> first_{};                // bytes that start some added token
};

}  // namespace kvtier::tokenizer
