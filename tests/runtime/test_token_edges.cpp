// runtime::token_edges on the default models' own tokenizers (skipped loudly when the files are
// absent): under --locret-span word the tokens of a text group into exactly its words (the maximal
// runs of letters, digits and non-ASCII bytes), and under number into exactly its numbers, though both
// tokenizers split numbers into single digits and long words into pieces.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include "gguf/reader.h"
#include "kv/token_spans.h"
#include "runtime/token_edges.h"
#include "tokenizer/tokenizer.h"

namespace kvtier::runtime {
namespace {

bool word_byte(unsigned char c) {
  return std::isalnum(c) != 0 || c >= 0x80;
}

// The maximal runs of bytes for which in(c) holds.
template <class In>
std::vector<std::string> runs(const std::string& text, In in) {
  std::vector<std::string> out;
  std::string cur;
  for (const char ch : text) {
    if (in(static_cast<unsigned char>(ch))) {
      cur += ch;
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

void check_model(const std::string& name) {
  const auto path = std::filesystem::path(KVTIER_SOURCE_DIR) / "models" / name;
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "SKIPPED: " << path << " is absent (scripts/setup.sh fetches it)";
  const gguf::File file(path.string());
  const tokenizer::Tokenizer tok(file);
  const std::vector<uint8_t> edges = token_edges(tok);
  ASSERT_EQ(edges.size(), tok.n_vocab());
  const std::string text =
      "The special magic number for the understanding of Zürich is: 4466196. Remember it; 37 and "
      "2644146 are not it (unbelievably, 1,000,000 of them were tried).";
  const std::vector<tokenizer::TokenId> ids = tok.encode(text, {.add_special = false});
  int digit_tokens = 0;
  for (const auto id : ids) digit_tokens += tok.piece(id) == "4" ? 1 : 0;
  EXPECT_GE(digit_tokens, 3) << "the tokenizer keeps 4466196's 4s as tokens of their own";
  for (const policy::LocretSpan span : {policy::LocretSpan::kWord, policy::LocretSpan::kNumber}) {
    const auto in = [span](unsigned char c) {
      return span == policy::LocretSpan::kWord ? word_byte(c) : std::isdigit(c) != 0;
    };
    // The tokens grouped into spans: the words (numbers) of the spans' texts, span after span, are the
    // text's (none is split between spans), and a span of several tokens holds exactly one (none joins
    // two).
    std::vector<std::string> spans;
    std::vector<int> tokens_in;
    for (size_t i = 0; i < ids.size(); ++i) {
      const bool joins = i > 0 && kv::continues_span(span, edges[static_cast<size_t>(ids[i - 1])],
                                                     edges[static_cast<size_t>(ids[i])]);
      if (!joins) spans.emplace_back(), tokens_in.push_back(0);
      spans.back() += tok.piece(ids[i]);
      ++tokens_in.back();
    }
    std::vector<std::string> got;
    int joined = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      const std::vector<std::string> w = runs(spans[i], in);
      got.insert(got.end(), w.begin(), w.end());
      if (tokens_in[i] > 1) {
        EXPECT_EQ(w.size(), 1u) << name << ": span '" << spans[i] << "'";
        ++joined;
      }
    }
    EXPECT_EQ(got, runs(text, in)) << name << " span " << policy::locret_span_name(span);
    EXPECT_GE(joined, 2) << name << ": the numbers' digits are joined";
  }
  // Control tokens are no part of a word.
  for (size_t id = 0; id < edges.size(); ++id) {
    if (tok.is_control(static_cast<tokenizer::TokenId>(id))) {
      EXPECT_EQ(edges[id], kv::kEdgeNone) << id;
    }
  }
}

TEST(TokenEdges, GroupTheTokensOfSmolLM2IntoWordsAndNumbers) {
  check_model("SmolLM2-135M-Instruct.Q4_1.gguf");
}
TEST(TokenEdges, GroupTheTokensOfGemma3IntoWordsAndNumbers) {
  check_model("gemma-3-270m-q4_k_m.gguf");
}

}  // namespace
}  // namespace kvtier::runtime
