#include "tokenizer/utf8.h"

namespace kvtier::tokenizer {
namespace {

uint8_t at(std::string_view s, size_t i) {
  return static_cast<uint8_t>(s[i]);
}

// Expected length from the lead byte, and the allowed range of the second byte (Unicode table 3-7).
struct Lead {
  size_t len;
  uint8_t lo, hi;
};

Lead lead_of(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes from i that form a valid prefix of a sequence (the maximal subpart), and the
// sequence's full length.
size_t valid_prefix(std::string_view s, size_t i, size_t* full) {
  const Lead l = lead_of(at(s, i));
  *full = l.len;
  if (l.len <= 1) return l.len;
  size_t n = 1;
  for (; n < l.len && i + n < s.size(); ++n) {
    const uint8_t c = at(s, i + n);
    const uint8_t lo = n == 1 ? l.lo : 0x80, hi = n == 1 ? l.hi : 0xBF;
    if (c < lo || c > hi) break;
  }
  return n;
}

}  // namespace

size_t utf8_valid_len(std::string_view s, size_t i) {
  size_t full = 0;
  const size_t n = valid_prefix(s, i, &full);
  return n == full ? n : 0;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // A truncated sequence has at most 3 bytes; look back for its lead byte.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t i = s.size() - back;
    const uint8_t b = at(s, i);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t full = 0;
    const size_t n = valid_prefix(s, i, &full);
    return (full > back && n == back) ? back : 0;
  }
  return 0;
}

uint32_t utf8_decode(std::string_view s, size_t i, size_t n) {
  const uint8_t b0 = at(s, i);
  if (n == 1) return b0;
  uint32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (at(s, i + k) & 0x3F);
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t full = 0;
    const size_t n = valid_prefix(s, i, &full);
    if (n == full && n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += n > 0 ? n : 1;
    }
  }
  return out;
}

}  // namespace kvtier::tokenizer
