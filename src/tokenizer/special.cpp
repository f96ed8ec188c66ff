#include "tokenizer/special.h"

#include "tokenizer/vocab.h"

namespace kvtier::tokenizer {

AddedTokenMatcher::AddedTokenMatcher(const Vocab& v) {
  nodes_.emplace_back();
  for (const auto& [id, s] : v.added) {
    // Matched by the spelling in the file (transformers' AddedToken content).
    if (s.empty()) continue;
    int32_t node = 0;
    for (unsigned char c : s) {
      int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        edges_.emplace((static_cast<uint64_t>(node) << 8) | c, next);
      }
      node = next;
    }
    // Later tokens with the same text win, as in the vocabulary.
    nodes_[node].token = id;
    nodes_[node].control = v.type[id] != TokenType::kUserDefined;
    first_[static_cast<unsigned char>(s[0])] = true;
  }
}

void AddedTokenMatcher::partition(std::string_view text, bool parse_special,
                                  std::vector<Fragment>& out) const {
  size_t text_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!first_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest added token starting at i.
    int32_t node = 0;
    size_t best_end = 0;
    const Node* best = nullptr;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (nodes_[node].token != kNoToken) {
        best = &nodes_[node];
        best_end = j + 1;
      }
    }
    if (!best) {
      ++i;
      continue;
    }
    if (best->control && !parse_special) {  // stays text, as HF's encode_special_tokens does
      i = best_end;
      continue;
    }
    if (i > text_start) out.push_back({text_start, i, kNoToken});
    out.push_back({i, best_end, best->token});
    i = text_start = best_end;
  }
  if (text_start < text.size()) out.push_back({text_start, text.size(), kNoToken});
}

}  // namespace kvtier::tokenizer
