// Byte-level BPE (tokenizer.ggml.model = "gpt2").
#include "tokenizer/encoders.h"

namespace kvtier::tokenizer {

void encode_byte_level(const Vocab& v, const PreTokenizerRegex& pre, std::string_view text,
                       std::vector<TokenId>& out) {
  std::vector<Span> pieces;
  pre.split(text, pieces);
  std::vector<Symbol> syms;
  auto rank = [&v](const Symbol& l, const Symbol& r, uint32_t& key, TokenId& id) {
    const auto it = v.merges.find(Vocab::pair_key(l.id, r.id));
    if (it == v.merges.end()) return false;
    key = it->second.rank;
    id = it->second.id;
    return true;
  };
  for (const Span& p : pieces) {
    syms.clear();
    for (size_t i = p.begin; i < p.end; ++i) {
      const TokenId id = v.byte_token[static_cast<unsigned char>(text[i])];
      if (id == kNoToken) continue;  // no token for this byte: dropped (HF BPE without <unk>)
      const auto k = static_cast<int32_t>(syms.size());
      syms.push_back({id, k - 1, k + 1, static_cast<uint32_t>(i), 1, 1, true});
    }
    if (syms.empty()) continue;
    syms.back().next = -1;
    if (syms.size() == 1) {
      out.push_back(syms[0].id);
      continue;
    }
    if (!v.merges.empty()) bpe_merge<uint32_t>(syms, rank);
    for (const Symbol& s : syms) {
      if (s.len) out.push_back(s.id);
    }
  }
}

}  // namespace kvtier::tokenizer
