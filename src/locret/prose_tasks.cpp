#include "locret/prose_tasks.h"

#include <algorithm>

#include "core/error.h"

namespace kvtier::locret {
namespace {

uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t s;
  uint64_t below(uint64_t n) { return (s = mix64(s)) % n; }
};

bool space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int64_t words(const std::string& s) {
  return static_cast<int64_t>(std::count(s.begin(), s.end(), ' ')) + (s.empty() ? 0 : 1);
}

// Sentences [first, first + k) with about `chars` characters in all (at least 2 sentences).
struct Window {
  size_t first = 0, count = 0;
};

Window pick_window(const std::vector<std::string>& s, int64_t chars, Rng& rng) {
  if (s.size() < 8)
    fail(ErrorKind::kInvalidArgument, "a prose task needs at least 8 sentences, not {}", s.size());
  int64_t total = 0;
  for (const auto& x : s) total += static_cast<int64_t>(x.size()) + 1;
  // Texts shorter than the window repeat (the window wraps around).
  Window w;
  w.first = rng.below(s.size());
  int64_t have = 0;
  while (have < chars || w.count < 2) {
    have += static_cast<int64_t>(s[(w.first + w.count) % s.size()].size()) + 1;
    ++w.count;
    if (have >= total && w.count >= s.size() && have >= chars) break;
  }
  return w;
}

std::string join(const std::vector<std::string>& s, const Window& w, size_t insert_at = SIZE_MAX,
                 const std::string& insert = {}) {
  std::string out;
  for (size_t i = 0; i < w.count; ++i) {
    if (i == insert_at) out += insert + " ";
    out += s[(w.first + i) % s.size()];
    out += (i % 7 == 6) ? "\n\n" : " ";
  }
  if (insert_at == w.count) out += insert + " ";
  return out;
}

const char* const kAdjectives[] = {"amber",   "silent",  "northern", "hidden", "golden", "quiet",
                                   "crimson", "distant", "frozen",   "gentle", "hollow", "silver",
                                   "ancient", "bright",  "narrow",   "wild"};
const char* const kNouns[] = {"harbor", "lantern", "orchard",  "bridge", "meadow", "tower",
                              "river",  "garden",  "valley",   "forest", "island", "canyon",
                              "castle", "market",  "mountain", "library"};

}  // namespace

std::vector<std::string> split_sentences(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    while (!cur.empty() && cur.back() == ' ') cur.pop_back();
    const int64_t n = words(cur);
    if (n >= 6 && n <= 80) out.push_back(cur);
    cur.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (space(c)) {
      const bool blank_line = c == '\n' && i + 1 < text.size() &&
                              text.find_first_not_of(" \t\r", i + 1) != std::string_view::npos &&
                              text[text.find_first_not_of(" \t\r", i + 1)] == '\n';
      if (blank_line) {
        flush();
        continue;
      }
      if (!cur.empty() && cur.back() != ' ') cur += ' ';
      continue;
    }
    cur += c;
    if ((c == '.' || c == '?' || c == '!') && (i + 1 == text.size() || space(text[i + 1]))) flush();
  }
  flush();
  return out;
}

QaText sentence_recall(const std::vector<std::string>& s, int64_t chars, uint64_t seed) {
  Rng rng{mix64(mix64(seed) ^ 0x726563616c6cull)};
  const Window w = pick_window(s, chars, rng);
  const size_t asked = rng.below(w.count);
  const std::string& target = s[(w.first + asked) % s.size()];
  // The first five words identify the sentence.
  size_t cut = 0;
  for (int k = 0; k < 5 && cut != std::string::npos; ++k) cut = target.find(' ', cut + (k > 0 ? 1 : 0));
  const std::string opening = target.substr(0, cut);
  QaText q;
  q.prompt = "Read the following text carefully. I will ask you to quote one of its sentences.\n\n" +
             join(s, w) + "\n\nQuote, word for word, the sentence of the text above that begins with \"" +
             opening + "\".";
  q.answer = target;
  return q;
}

QaText prose_needle(const std::vector<std::string>& s, int64_t chars, uint64_t seed) {
  Rng rng{mix64(mix64(seed) ^ 0x6e6565646c65ull)};
  const Window w = pick_window(s, chars, rng);
  const std::string key = std::string(kAdjectives[rng.below(std::size(kAdjectives))]) + " " +
                          kNouns[rng.below(std::size(kNouns))];
  std::string code;
  for (int i = 0; i < 7; ++i) code += static_cast<char>('0' + (i == 0 ? 1 + rng.below(9) : rng.below(10)));
  const std::string fact = "The access code of the " + key + " is " + code + ".";
  QaText q;
  q.prompt = "A secret access code is hidden in the following text. Find it and remember it.\n\n" +
             join(s, w, rng.below(w.count + 1), fact) + "\n\nWhat is the access code of the " + key + "?";
  q.answer = "The access code of the " + key + " is " + code + ".";
  return q;
}

}  // namespace kvtier::locret
