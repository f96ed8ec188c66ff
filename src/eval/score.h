// Scoring by exact match: an expected string counts as found when it occurs in the answer as a
// whole word (no letter or digit directly before or after it), so "71432" is not found in
// "714321". Case is ignored for letters.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace kvtier::eval {

bool contains_word(std::string_view answer, std::string_view word);
// Fraction of `expected` found in `answer` (1 when `expected` is empty).
double score_answer(std::string_view answer, std::span<const std::string> expected);

}  // namespace kvtier::eval
