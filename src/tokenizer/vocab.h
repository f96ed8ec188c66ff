// A tokenizer vocabulary read from GGUF metadata (tokenizer.ggml.*): token texts, types, scores,
// merges and special ids, in the form the encoders use.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/types.h"

namespace kvtier::gguf {
class File;
}

namespace kvtier::tokenizer {

struct SpecialIds {
  TokenId bos = kNoToken;
  TokenId eos = kNoToken;
  TokenId eot = kNoToken;  // end of turn (<|eot_id|>, <end_of_turn>, <|im_end|>)
  TokenId eom = kNoToken;
  TokenId pad = kNoToken;
  TokenId unk = kNoToken;
};

// A BPE merge of the pair (left, right): its priority (lower first) and the merged token.
struct Merge {
  uint32_t rank = 0;
  TokenId id = kNoToken;
};

struct Vocab {
  TokenizerKind kind = TokenizerKind::kByteLevelBpe;
  PreTokenizer pre = PreTokenizer::kGpt2;
  MergeOrder merge_order = MergeOrder::kScore;

  // Text of each token as it appears in the text the encoder works on: raw bytes for a byte-level
  // vocabulary (GPT-2's byte alphabet undone), the SentencePiece spelling (U+2581 for a space) else.
  std::vector<std::string> text;  // [n_vocab]
  std::vector<TokenType> type;    // [n_vocab]
  std::vector<float> score;       // [n_vocab] (0 where the file has none)
  // text -> id; where two tokens share a text the later one wins (as a Python dict would).
  std::unordered_map<std::string_view, TokenId> id_of;  // views into `text`
  // Byte-level BPE: (left, right) -> merge, keyed by pair_key().
  std::unordered_map<uint64_t, Merge> merges;
  // Byte-level: the token of each byte. SentencePiece: the byte-fallback token <0xAB>. kNoToken: none.
  std::array<TokenId, 256> byte_token{};
  // Tokens matched whole in the text before the encoder runs (user-defined always, control ones
  // only when special parsing is asked), with the spelling they are matched by: the file's.
  struct Added {
    TokenId id = kNoToken;
    std::string match;
  };
  std::vector<Added> added;

  SpecialIds special;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  std::string architecture;
  std::optional<std::string> chat_template;

  size_t size() const { return text.size(); }
  TokenId find(std::string_view s) const {
    auto it = id_of.find(s);
    return it == id_of.end() ? kNoToken : it->second;
  }
  static uint64_t pair_key(TokenId a, TokenId b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
};

// Reads the vocabulary; throws Error(kInvalidFile / kUnsupported) naming the key at fault.
Vocab load_vocab(const gguf::File& file);

// Byte-level BPE's byte alphabet (GPT-2's bytes_to_unicode): the code point standing for byte b.
uint32_t byte_to_unicode(uint8_t b);

}  // namespace kvtier::tokenizer
