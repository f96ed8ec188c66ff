// What a retention needs to know of the tokens to keep a span (a word, a number) whole: per vocabulary
// id, whether the token's text begins and ends inside a word or a number (TokenEdge bits, built from
// the tokenizer by runtime::token_edges), and whether a token continues the span of the one before it.
// The KV caches see token ids through PassInfo::tokens.
#pragma once

#include <cstdint>

#include "policy/kv_policy.h"

namespace kvtier::kv {

enum TokenEdge : uint8_t {
  kEdgeNone = 0,
  kStartsInWord = 1u << 0,   // the first byte is a letter, a digit or a non-ASCII byte
  kEndsInWord = 1u << 1,     // the last byte is one
  kStartsInDigit = 1u << 2,  // the first byte is an ASCII digit
  kEndsInDigit = 1u << 3,    // the last byte is one
};

// Whether a token with edges `cur` continues the span of the token before it (edges `prev`).
inline bool continues_span(policy::LocretSpan span, uint8_t prev, uint8_t cur) {
  switch (span) {
    case policy::LocretSpan::kToken:
      return false;
    case policy::LocretSpan::kWord:
      return (prev & kEndsInWord) != 0 && (cur & kStartsInWord) != 0;
    case policy::LocretSpan::kNumber:
      return (prev & kEndsInDigit) != 0 && (cur & kStartsInDigit) != 0;
  }
  return false;
}

}  // namespace kvtier::kv
