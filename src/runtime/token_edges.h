// The token edges of a vocabulary (kv::TokenEdge bits per id, kv/token_spans.h): which tokens begin
// or end inside a word or a number, so that locret --locret-span keeps a word or a number whole.
#pragma once

#include <cstdint>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvtier::runtime {

// [n_vocab] bits of each token's text as decoded (control tokens: none). A word byte is an ASCII
// letter or digit, or any byte of a non-ASCII character; spaces and ASCII punctuation end a span.
std::vector<uint8_t> token_edges(const tokenizer::Tokenizer& tok);

}  // namespace kvtier::runtime
