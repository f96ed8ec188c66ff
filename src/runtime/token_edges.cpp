#include "runtime/token_edges.h"

#include <string>

#include "kv/token_spans.h"

namespace kvtier::runtime {

namespace {

bool word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

bool digit_byte(unsigned char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

std::vector<uint8_t> token_edges(const tokenizer::Tokenizer& tok) {
  std::vector<uint8_t> edges(tok.n_vocab(), kv::kEdgeNone);
  for (size_t i = 0; i < edges.size(); ++i) {
    const auto id = static_cast<tokenizer::TokenId>(i);
    if (tok.is_control(id)) continue;
    const std::string p = tok.piece(id, /*first=*/false, {.render_special = false});
    if (p.empty()) continue;
    const auto a = static_cast<unsigned char>(p.front()), z = static_cast<unsigned char>(p.back());
    uint8_t e = kv::kEdgeNone;
    if (word_byte(a)) e |= kv::kStartsInWord;
    if (word_byte(z)) e |= kv::kEndsInWord;
    if (digit_byte(a)) e |= kv::kStartsInDigit;
    if (digit_byte(z)) e |= kv::kEndsInDigit;
    edges[i] = e;
  }
  return edges;
}

}  // namespace kvtier::runtime
