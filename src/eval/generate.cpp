// Task generators: each task is a builder from a haystack size (sentences, or words for cwe) to a
// prompt; make_sample() finds the largest size that fits the target length.
#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "eval/rng.h"
#include "eval/task.h"
#include "eval/text.h"

namespace kvtier::eval {
namespace {

struct Built {
  Prompt prompt;
  std::vector<std::string> expected;
};

// Draws everything a sample needs up front (independent of the haystack size), then builds the
// prompt for any size.
class Builder {
 public:
  virtual ~Builder() = default;
  virtual Built build(int64_t units) const = 0;
  virtual int64_t initial_units(int64_t budget) const { return std::max<int64_t>(1, budget / 16); }
};

// A haystack of `n` filler sentences with text items inserted before sentence round(f * n).
std::string haystack(const FillerStream& filler, int64_t n,
                     const std::vector<std::pair<double, std::string>>& items) {
  std::multimap<int64_t, const std::string*> at;
  for (const auto& [f, text] : items) at.emplace(std::llround(f * static_cast<double>(n)), &text);
  std::string out;
  for (int64_t i = 0; i <= n; ++i) {
    auto [b, e] = at.equal_range(i);
    for (auto it = b; it != e; ++it) {
      out += *it->second;
      out += ' ';
    }
    if (i < n) out += filler.sentence(i);
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == '\n')) out.pop_back();
  return out;
}

std::string join_and(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += v.size() > 2 ? ", " : " ";
    if (i + 1 == v.size() && v.size() > 1) s += "and ";
    s += v[i];
  }
  return s;
}

class PasskeyBuilder final : public Builder {
 public:
  PasskeyBuilder(Rng& rng, double depth)
      : depth_(depth), key_(random_number(rng, 5)), filler_(Filler::kPasskey, 0) {}
  Built build(int64_t n) const override {
    const std::string needle = "The pass key is " + key_ + ". Remember it. " + key_ + " is the pass key.";
    Built b;
    b.prompt.user =
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will "
        "quiz you about the important information there.\n\n" +
        haystack(filler_, n, {{depth_, needle}}) + "\n\nWhat is the pass key?";
    b.prompt.answer_prefix = "The pass key is";
    b.expected = {key_};
    return b;
  }

 private:
  double depth_;
  std::string key_;
  FillerStream filler_;
};

// RULER's four niah variants: `n_keys` keys with `n_values` values each, needle 0 at the depth and
// the others at random depths; `n_query` keys asked for.
class NiahBuilder final : public Builder {
 public:
  NiahBuilder(Rng& rng, double depth, int n_keys, int n_values, int n_query)
      : filler_(Filler::kEssay, rng.next()), n_query_(n_query) {
    while (static_cast<int>(keys_.size()) < n_keys) {
      std::string k = random_key(rng);
      if (std::find(keys_.begin(), keys_.end(), k) == keys_.end()) keys_.push_back(std::move(k));
    }
    for (int k = 0; k < n_keys; ++k) {
      for (int v = 0; v < n_values; ++v) {
        const double f = (k == 0 && v == 0) ? depth : rng.unit();
        needles_.push_back({keys_[k], random_number(rng, 7), f});
      }
    }
  }
  Built build(int64_t n) const override {
    std::vector<std::pair<double, std::string>> items;
    Built b;
    for (const Needle& nd : needles_) {
      items.push_back(
          {nd.depth, "One of the special magic numbers for " + nd.key + " is: " + nd.value + "."});
      for (int q = 0; q < n_query_; ++q) {
        if (nd.key == keys_[q]) b.expected.push_back(nd.value);
      }
    }
    const std::vector<std::string> asked(keys_.begin(), keys_.begin() + n_query_);
    const bool many = b.expected.size() > 1;
    const std::string what = many ? "all the special magic numbers" : "the special magic number";
    b.prompt.user =
        "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will "
        "quiz you about the numbers afterwards.\n\n" +
        haystack(filler_, n, items) + "\n\nWhat " + (many ? "are " : "is ") + what + " for " +
        join_and(asked) + " mentioned in the provided text?";
    b.prompt.answer_prefix = std::string("The special magic ") + (many ? "numbers" : "number") + " for " +
                             join_and(asked) + " mentioned in the provided text " + (many ? "are" : "is");
    return b;
  }

 private:
  struct Needle {
    std::string key, value;
    double depth;
  };
  FillerStream filler_;
  int n_query_;
  std::vector<std::string> keys_;
  std::vector<Needle> needles_;
};

// RULER variable tracking: VAR X1 = value, VAR X2 = VAR X1, ... at sorted random depths.
class VtBuilder final : public Builder {
 public:
  explicit VtBuilder(Rng& rng) : filler_(Filler::kEssay, rng.next()), value_(random_number(rng, 5)) {
    while (vars_.size() < 5) {
      std::string v = random_variable(rng);
      if (std::find(vars_.begin(), vars_.end(), v) == vars_.end()) vars_.push_back(std::move(v));
    }
    for (size_t i = 0; i < vars_.size(); ++i) depths_.push_back(rng.unit());
    std::sort(depths_.begin(), depths_.end());
  }
  Built build(int64_t n) const override {
    std::vector<std::pair<double, std::string>> items;
    for (size_t i = 0; i < vars_.size(); ++i) {
      items.push_back(
          {depths_[i], "VAR " + vars_[i] + " = " + (i == 0 ? value_ : "VAR " + vars_[i - 1]) + "."});
    }
    Built b;
    b.prompt.user =
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n" +
        haystack(filler_, n, items) + "\n\nQuestion: Find all variables that are assigned the value " +
        value_ + " in the text above.";
    b.prompt.answer_prefix =
        "Answer: According to the chain(s) of variable assignment in the text above, 5 "
        "variables are assigned the value " +
        value_ + ", they are:";
    b.expected = vars_;
    return b;
  }

 private:
  FillerStream filler_;
  std::string value_;
  std::vector<std::string> vars_;
  std::vector<double> depths_;
};

// RULER common words extraction: 10 common words `freq_common` times each among `n` uncommon words
// `freq_common / 10` (at least 1) times each, numbered, in a seeded order.
class CweBuilder final : public Builder {
 public:
  CweBuilder(Rng& rng, int freq_common) : seed_(rng.next()), freq_common_(freq_common) {
    common_ = distinct_words(rng, 10);
    pool_seed_ = rng.next();
  }
  Built build(int64_t n) const override {
    Rng pool_rng(pool_seed_);
    const std::vector<std::string> uncommon = distinct_words(pool_rng, static_cast<size_t>(n), common_);
    std::vector<const std::string*> list;
    for (const auto& w : common_) list.insert(list.end(), static_cast<size_t>(freq_common_), &w);
    const int freq_uncommon = std::max(1, freq_common_ / 10);
    for (const auto& w : uncommon) list.insert(list.end(), static_cast<size_t>(freq_uncommon), &w);
    Rng order(mix_seed(seed_, {static_cast<uint64_t>(n)}));
    order.shuffle(list);
    std::string words;
    for (size_t i = 0; i < list.size(); ++i) words += std::to_string(i + 1) + ". " + *list[i] + " ";
    if (!words.empty()) words.pop_back();
    Built b;
    b.prompt.user =
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
        "ones that appear most often.\n\n" +
        words +
        "\n\nQuestion: What are the 10 most common words in the "
        "above list?";
    b.prompt.answer_prefix = "Answer: The top 10 words that appear most often in the list are:";
    b.expected = common_;
    return b;
  }
  int64_t initial_units(int64_t budget) const override { return std::max<int64_t>(1, budget / 20); }

 private:
  uint64_t seed_, pool_seed_;
  int freq_common_;
  std::vector<std::string> common_;
};

std::unique_ptr<Builder> make_builder(TaskKind t, Rng& rng, double depth, int freq_common) {
  switch (t) {
    case TaskKind::kPasskey:
      return std::make_unique<PasskeyBuilder>(rng, depth);
    case TaskKind::kNiah:
      return std::make_unique<NiahBuilder>(rng, depth, 1, 1, 1);
    case TaskKind::kNiahMultiKey:
      return std::make_unique<NiahBuilder>(rng, depth, 4, 1, 1);
    case TaskKind::kNiahMultiValue:
      return std::make_unique<NiahBuilder>(rng, depth, 1, 4, 1);
    case TaskKind::kNiahMultiQuery:
      return std::make_unique<NiahBuilder>(rng, depth, 4, 1, 4);
    case TaskKind::kVt:
      return std::make_unique<VtBuilder>(rng);
    case TaskKind::kCwe:
      return std::make_unique<CweBuilder>(rng, freq_common);
    case TaskKind::kPpl:
      break;
  }
  fail(ErrorKind::kInvalidArgument, "task '{}' has no prompts (it is evaluated by ppl)", task_name(t));
}

// The largest units whose prompt fits `budget` tokens (units >= 0), by doubling then bisection.
int64_t fit_units(const Builder& b, int64_t budget, const TokenCounter& count) {
  const auto fits = [&](int64_t n) { return count(b.build(n).prompt) <= budget; };
  int64_t lo = 0;  // fits (checked by the caller)
  int64_t hi = b.initial_units(budget);
  while (fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

Sample make_sample(TaskKind t, int64_t length, int depth_index, double depth, int index, uint64_t seed,
                   const TokenCounter& count) {
  const int max_new = task_max_new_tokens(t);
  const int64_t budget = length - max_new;
  Sample s;
  s.task = t;
  s.length = length;
  s.depth_index = task_has_depth(t) ? depth_index : -1;
  s.depth = task_has_depth(t) ? depth : -1.0;
  s.index = index;
  s.seed = seed;
  s.max_new_tokens = max_new;
  // cwe: the most frequent common-word count whose list without uncommon words takes at most half.
  std::unique_ptr<Builder> b;
  for (int freq : {30, 20, 10, 6, 4, 2}) {
    Rng rng(seed);
    b = make_builder(t, rng, s.depth, freq);
    const int64_t need = count(b->build(0).prompt);
    if (t != TaskKind::kCwe) {
      if (need > budget)
        fail(ErrorKind::kInvalidArgument,
             "{}: length {} is too short: the prompt alone takes {} tokens + {} to answer", task_name(t),
             length, need, max_new);
      break;
    }
    if (need <= budget / 2) break;
    if (freq == 2)
      fail(ErrorKind::kInvalidArgument, "cwe: length {} is too short for the word list ({} tokens)", length,
           need);
  }
  const Built built = b->build(fit_units(*b, budget, count));
  s.prompt = built.prompt;
  s.expected = built.expected;
  s.prompt_tokens = count(s.prompt);
  return s;
}

std::vector<Sample> make_samples(TaskKind t, const GridSpec& grid, const TokenCounter& count) {
  std::vector<Sample> out;
  const std::vector<double> no_depth = {-1.0};
  const auto& depths = task_has_depth(t) ? grid.depths : no_depth;
  for (int64_t len : grid.lengths) {
    for (size_t d = 0; d < depths.size(); ++d) {
      const double depth = depths[d];
      if (task_has_depth(t) && !(depth >= 0.0 && depth <= 1.0))
        fail(ErrorKind::kInvalidArgument, "needle depth {} is outside [0, 1]", depth);
      for (int i = 0; i < grid.samples; ++i) {
        // The seed names the cell by its values, not its position in the grid.
        const uint64_t seed =
            mix_seed(grid.seed, {static_cast<uint64_t>(t), static_cast<uint64_t>(len),
                                 static_cast<uint64_t>(std::llround(depth * 1e6)), static_cast<uint64_t>(i)});
        out.push_back(make_sample(t, len, static_cast<int>(d), depth, i, seed, count));
      }
    }
  }
  return out;
}

}  // namespace kvtier::eval
