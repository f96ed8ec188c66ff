// The two encoders over plain text (added tokens already split off). Internal to the module.
#pragma once

#include <string_view>
#include <vector>

#include "tokenizer/bpe_merge.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/vocab.h"

namespace kvtier::tokenizer {

// Byte-level BPE: pre-tokenise, then merge each piece's bytes by the file's merge ranks.
void encode_byte_level(const Vocab& v, const PreTokenizerRegex& pre, std::string_view text,
                       std::vector<TokenId>& out);

// SentencePiece-style BPE: spaces become U+2581 (and one is prefixed where add_space_prefix asks and
// the text is at the start of the input), code points not in the vocabulary fall back to byte
// tokens, merges follow the vocabulary's scores (or order).
void encode_sentencepiece(const Vocab& v, std::string_view text, bool at_input_start,
                          std::vector<TokenId>& out);

}  // namespace kvtier::tokenizer
