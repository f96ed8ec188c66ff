// SentencePiece-style BPE with byte fallback (tokenizer.ggml.model = "llama": Llama-2, Gemma).
//
// transformers turns such a vocabulary into HF BPE merges (tokenization_utils_base.generate_merges):
// every split (l, r) of a token t with both halves in the vocabulary is a merge, ordered by t's
// score (Gemma: t's position in the vocabulary) best first, then by the length of l, then of r (in
// code points, longest first), then by t's position and the ids of l and r. We rank pairs the same
// way on the fly instead of building the merge list, which keeps loading fast.
#include <tuple>

#include "core/error.h"
#include "tokenizer/encoders.h"
#include "tokenizer/utf8.h"

namespace kvtier::tokenizer {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

// Lexicographic; smaller merges first.
struct SpmKey {
  float neg_score = 0;
  uint32_t neg_len_l = 0;  // ~chars
  uint32_t neg_len_r = 0;
  TokenId t = 0;
  TokenId l = 0;
  TokenId r = 0;
  bool operator<(const SpmKey& o) const {
    return std::tie(neg_score, neg_len_l, neg_len_r, t, l, r) <
           std::tie(o.neg_score, o.neg_len_l, o.neg_len_r, o.t, o.l, o.r);
  }
};

}  // namespace

void encode_sentencepiece(const Vocab& v, std::string_view text, bool at_input_start,
                          std::vector<TokenId>& out) {
  std::string buf;
  buf.reserve(text.size() + text.size() / 4 + 3);
  if (v.add_space_prefix && at_input_start) buf += kSpace;
  for (char c : text) {
    if (c == ' ') {
      buf += kSpace;
    } else {
      buf += c;
    }
  }
  if (buf.empty()) return;

  std::vector<Symbol> syms;
  syms.reserve(buf.size());
  auto add = [&syms](TokenId id, size_t begin, size_t len, uint32_t chars, bool mergeable) {
    const auto i = static_cast<int32_t>(syms.size());
    syms.push_back(
        {id, i - 1, -1, static_cast<uint32_t>(begin), static_cast<uint32_t>(len), chars, mergeable});
    if (i > 0) syms[i - 1].next = i;
  };
  for (size_t i = 0; i < buf.size();) {
    size_t n = utf8_valid_len(buf, i);
    const bool valid = n > 0;
    if (!valid) n = 1;  // an ill-formed byte stands alone and falls back to its byte token
    const TokenId id = valid ? v.find(std::string_view(buf).substr(i, n)) : kNoToken;
    if (id != kNoToken) {
      add(id, i, n, 1, true);
    } else {
      bool all_bytes = true;
      for (size_t k = 0; k < n; ++k)
        all_bytes &= v.byte_token[static_cast<unsigned char>(buf[i + k])] != kNoToken;
      if (all_bytes) {
        for (size_t k = 0; k < n; ++k)
          add(v.byte_token[static_cast<unsigned char>(buf[i + k])], i + k, 1, 0, false);
      } else if (!syms.empty() && syms.back().id == v.special.unk && !syms.back().mergeable) {
        syms.back().len += static_cast<uint32_t>(n);  // fuse_unk: a run of unknowns is one <unk>
      } else {
        if (v.special.unk == kNoToken)
          fail(ErrorKind::kInvalidArgument,
               "text has a character the vocabulary cannot spell and it has no <unk>");
        add(v.special.unk, i, n, 1, false);
      }
    }
    i += n;
  }

  const bool by_order = v.merge_order == MergeOrder::kVocabOrder;
  auto rank = [&](const Symbol& l, const Symbol& r, SpmKey& key, TokenId& id) {
    const TokenId t = v.find(std::string_view(buf).substr(l.begin, l.len + r.len));
    if (t == kNoToken) return false;
    key.neg_score = by_order ? static_cast<float>(t) : -v.score[t];
    key.neg_len_l = ~l.chars;
    key.neg_len_r = ~r.chars;
    key.t = t;
    key.l = l.id;
    key.r = r.id;
    id = t;
    return true;
  };
  bpe_merge<SpmKey>(syms, rank);
  for (const Symbol& s : syms) {
    if (s.len) out.push_back(s.id);
  }
}

}  // namespace kvtier::tokenizer
