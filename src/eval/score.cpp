#include "eval/score.h"

#include <cctype>

namespace kvtier::eval {
namespace {

char lower(char c) {
  return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}
bool is_word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0;
}

bool equal_at(std::string_view s, size_t pos, std::string_view w) {
  for (size_t i = 0; i < w.size(); ++i) {
    if (lower(s[pos + i]) != lower(w[i])) return false;
  }
  return true;
}

}  // namespace

bool contains_word(std::string_view answer, std::string_view word) {
  if (word.empty() || word.size() > answer.size()) return false;
  for (size_t pos = 0; pos + word.size() <= answer.size(); ++pos) {
    if (!equal_at(answer, pos, word)) continue;
    const bool left_ok = pos == 0 || !is_word_char(answer[pos - 1]) || !is_word_char(word.front());
    const size_t end = pos + word.size();
    const bool right_ok = end == answer.size() || !is_word_char(answer[end]) || !is_word_char(word.back());
    if (left_ok && right_ok) return true;
  }
  return false;
}

double score_answer(std::string_view answer, std::span<const std::string> expected) {
  if (expected.empty()) return 1.0;
  size_t found = 0;
  for (const auto& e : expected) found += contains_word(answer, e) ? 1 : 0;
  return static_cast<double>(found) / static_cast<double>(expected.size());
}

}  // namespace kvtier::eval
