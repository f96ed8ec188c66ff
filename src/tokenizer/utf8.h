// Small UTF-8 helpers shared by the encoders and the decoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvtier::tokenizer {

// Length of the well-formed UTF-8 sequence starting at s[i] (1..4), or 0 if the bytes there are
// not a complete well-formed sequence (invalid lead, bad continuation, overlong, surrogate, > U+10FFFF).
size_t utf8_valid_len(std::string_view s, size_t i);

// Like utf8_valid_len, but tells an incomplete (truncated, possibly valid once more bytes arrive)
// sequence at the end of `s` apart: returns the number of bytes present that could still begin a
// valid character, or 0 if the bytes can never become valid.
size_t utf8_incomplete_tail(std::string_view s);

// Decodes the code point of a well-formed sequence of length n at s[i].
uint32_t utf8_decode(std::string_view s, size_t i, size_t n);

void utf8_append(std::string& out, uint32_t cp);

// Replaces every ill-formed byte sequence with U+FFFD (one per maximal ill-formed subpart).
std::string utf8_sanitize(std::string_view s);

}  // namespace kvtier::tokenizer
